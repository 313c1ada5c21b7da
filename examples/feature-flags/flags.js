// feature-flags: a `FeatureFlags` object becomes the ConfigMap its applications read.
//
// spec.flags maps a flag's name to `{enabled, rollout}` (rollout: the percentage of users, 0 to
// 100, default 100). The module renders one ConfigMap, `<name>-flags`, with `flags.json` (every
// flag, in name order, with its effective rollout) and one key per flag (`new-checkout: "25"`),
// and reports the revision of that content (a hash: an application can restart on a change) in
// the status. validate refuses, at admission, a rollout outside 0..100 or a flag name that is not
// a lowercase DNS label, naming the offending field.
import { Condition, Event, Gvk, Metadata, ReconcileError, Response, Validation, k8s, log } from 'wasmop-sdk';
import { fnv1a } from './hash.js';

export const FEATURE_FLAGS = new Gvk('example.wasmop.dev/v1', 'FeatureFlags');
const NAME = /^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$/;

/** The problems of a spec, as `[field, message]`: empty when it is valid. */
export function problems(spec) {
  const found = [];
  const flags = spec?.flags ?? {};
  if (typeof flags !== 'object' || Array.isArray(flags)) return [['spec.flags', 'spec.flags must map flag names to {enabled, rollout}']];
  for (const [name, flag] of Object.entries(flags)) {
    if (!NAME.test(name)) found.push([`spec.flags.${name}`, `flag name ${JSON.stringify(name)} is not a lowercase DNS label`]);
    const rollout = flag?.rollout ?? 100;
    if (!Number.isInteger(rollout) || rollout < 0 || rollout > 100) {
      found.push([`spec.flags.${name}.rollout`, `rollout of ${name} is ${JSON.stringify(rollout)}: a whole percentage from 0 to 100`]);
    }
  }
  return found;
}

/** Every flag with its effective rollout (0 when disabled), in name order. */
export function effective(spec) {
  return Object.keys(spec?.flags ?? {})
    .sort()
    .map((name) => {
      const flag = spec.flags[name] ?? {};
      return { name, rollout: flag.enabled === true ? (flag.rollout ?? 100) : 0 };
    });
}

export default {
  metadata() {
    return new Metadata('feature-flags', '0.1.0').primary(FEATURE_FLAGS).owns(k8s.CONFIG_MAP).validates();
  },

  reconcile(request) {
    const ff = request.primary;
    const wrong = problems(ff.spec);
    if (wrong.length > 0) throw new ReconcileError(wrong.map(([, message]) => message).join('; '));
    const flags = effective(ff.spec);
    const json = JSON.stringify(Object.fromEntries(flags.map((f) => [f.name, f.rollout])));
    const revision = fnv1a(json);
    const name = `${ff.metadata.name}-flags`;
    const previous = request.owned(k8s.CONFIG_MAP).find((cm) => cm.metadata.name === name);
    const response = Response.complete(request)
      .child({
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name, labels: { 'example.wasmop.dev/feature-flags': ff.metadata.name }, annotations: { 'example.wasmop.dev/revision': revision } },
        data: { 'flags.json': json, ...Object.fromEntries(flags.map((f) => [f.name, String(f.rollout)])) },
      })
      .withStatus({ configMap: name, revision, flags: flags.length, enabled: flags.filter((f) => f.rollout > 0).length })
      .condition(Condition.of('Ready', true).withReason('Rendered'));
    const before = previous?.metadata?.annotations?.['example.wasmop.dev/revision'];
    if (before !== undefined && before !== revision) {
      log.info(`${ff.metadata.name}: revision ${before} -> ${revision}`);
      response.event(Event.normal('FlagsChanged', `revision ${before} -> ${revision}`).withAction('Render'));
    }
    return response;
  },

  validate(request) {
    const wrong = problems(request.new.spec);
    if (wrong.length > 0) return Validation.deny(wrong[0][1], wrong[0][0]);
    const verdict = Validation.allow();
    for (const [name, flag] of Object.entries(request.new.spec?.flags ?? {})) {
      if (flag?.enabled !== true && flag?.rollout !== undefined) verdict.warn(`${name} is disabled: its rollout ${flag.rollout} is ignored`);
    }
    return verdict;
  },
};
