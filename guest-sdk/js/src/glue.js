// Conversions between the SDK's types and the component's bindings (the shapes componentize-js
// gives the WIT types: records as objects with camelCase fields, variants as `{tag, val}`, enums
// as their WIT names, `option` as undefined, `u64` as BigInt, a `result` as `{tag: 'ok' | 'err'}`).
//
// Pure JavaScript: the component's entry (written by the build, see tools/build.mjs) imports it
// and hands it the host's `log`; the SDK's tests call it natively on the same shapes.
import { ReconcileError } from './errors.js';
import { Gvk, ObjectRef } from './kinds.js';
import { setSink } from './log.js';
import { Context, Operation, Request, ValidateRequest } from './request.js';
import { ActionKind, ConditionStatus, EventType, Finalized, Response, Validation } from './response.js';

const wgvk = (g) => ({ apiVersion: g.apiVersion, kind: g.kind });
const wref = (r) => ({ apiVersion: r.apiVersion, kind: r.kind, namespace: r.namespace ?? undefined, name: r.name });

const CONDITION_STATUS = {
  [ConditionStatus.TRUE]: 'true',
  [ConditionStatus.FALSE]: 'false',
  [ConditionStatus.UNKNOWN]: 'unknown',
};

/** The WIT `module-metadata` of a reconciler. */
export function metadataOut(reconciler) {
  const m = reconciler.metadata();
  if (!m?.primaryKind) throw new ReconcileError(`module ${m?.name}: the metadata names no primary kind`);
  return {
    name: m.name,
    version: m.version,
    primary: wgvk(m.primaryKind),
    owns: m.ownedKinds.map(wgvk),
    related: m.relatedKinds.map((rk) => ({
      kind: wgvk(rk.kind),
      selector: {
        matchLabels: rk.selector.matchLabels.map(([k, v]) => [k, v]),
        matchExpressions: rk.selector.matchExpressions.map((e) => ({
          key: e.key,
          operator: e.operator,
          values: [...e.values],
        })),
      },
      mapsTo: rk.mapsTo.tag === 'primary-named-by-label' ? { tag: rk.mapsTo.tag, val: rk.mapsTo.val } : { tag: rk.mapsTo.tag },
    })),
    finalizes: m.finalizesWork,
    validates: m.validatesWork,
  };
}

const refIn = (r) => new ObjectRef(r.apiVersion, r.kind, r.name, r.namespace);
const groupsIn = (groups) => groups.map((g) => [new Gvk(g.kind.apiVersion, g.kind.kind), [...g.objects]]);

/** The SDK's Request for a WIT `reconcile-request`. */
export function requestIn(r) {
  const c = r.context;
  const trigger = { kind: c.trigger.tag, object: c.trigger.val === undefined ? undefined : refIn(c.trigger.val) };
  return new Request(
    r.primary,
    groupsIn(r.owned),
    groupsIn(r.related),
    new Context({
      reconciler: c.reconciler,
      trigger,
      attempt: c.attempt,
      configJson: c.config,
      nowUnixMs: Number(c.nowUnixMs),
    }),
  );
}

function actionsOut(response) {
  return response.actions.map((a) => {
    const target = wref(a.target);
    if (a.kind === ActionKind.DELETE) return { tag: 'delete', val: { target, propagation: a.propagation } };
    return { tag: a.kind, val: { target, body: JSON.stringify(a.patch) } };
  });
}

function statusOut(s) {
  if (s === undefined) return undefined;
  return {
    fields: JSON.stringify(s.fields),
    conditions: s.conditions.map((c) => ({
      type: c.type,
      status: CONDITION_STATUS[c.status],
      reason: c.reason,
      message: c.message,
    })),
  };
}

function eventsOut(response) {
  return response.events.map((e) => ({
    type: e.type === EventType.WARNING ? 'warning' : 'normal',
    reason: e.reason,
    message: e.message,
    action: e.action,
    regarding: e.regarding === undefined ? undefined : wref(e.regarding),
  }));
}

const msOut = (ms) => (ms === undefined ? undefined : BigInt(ms));

/** The WIT `reconcile-response` of a Response. */
export function responseOut(response) {
  if (!(response instanceof Response)) {
    throw new ReconcileError(`reconcile returned ${describeValue(response)}, not a Response`);
  }
  return {
    children: response.childSets.map(([kind, objects]) => ({
      kind: wgvk(kind),
      objects: objects.map((o) => JSON.stringify(o)),
    })),
    actions: actionsOut(response),
    status: statusOut(response.status),
    events: eventsOut(response),
    requeueAfterMs: msOut(response.requeueMs),
  };
}

/** The WIT `finalize-response` of a Finalized. */
export function finalizeOut(finalized) {
  if (!(finalized instanceof Finalized)) {
    throw new ReconcileError(`finalize returned ${describeValue(finalized)}, not a Finalized`);
  }
  const r = finalized.effects;
  if (r.childSets.length > 0) {
    throw new ReconcileError('finalize returned children; only actions, status, Events and requeue are allowed');
  }
  return {
    done: Boolean(finalized.done),
    actions: actionsOut(r),
    status: statusOut(r.status),
    events: eventsOut(r),
    requeueAfterMs: msOut(r.requeueMs),
  };
}

/** The SDK's ValidateRequest for a WIT `validate-request`. */
export function validateIn(r) {
  return new ValidateRequest(
    r.operation === 'create' ? Operation.CREATE : Operation.UPDATE,
    r.old,
    r.new,
    r.config,
  );
}

/** The WIT `validate-response` of a Validation. */
export function validationOut(v) {
  if (!(v instanceof Validation)) throw new ReconcileError(`validate returned ${describeValue(v)}, not a Validation`);
  if (v.allowed) return { tag: 'allowed', val: v.warnings.map(String) };
  return { tag: 'denied', val: { message: String(v.message), field: v.field ?? undefined } };
}

function describeValue(v) {
  if (v === null) return 'null';
  if (typeof v !== 'object') return typeof v;
  const name = v.constructor?.name;
  if (!name) return 'an object';
  return `${/^[AEIOU]/.test(name) ? 'an' : 'a'} ${name}`;
}

/**
 * The message of the reconcile-error for a thrown `e`: a ReconcileError's message; anything
 * else by its name and where it was thrown, not its text, which often carries values (a
 * Secret's data in a TypeError) and would reach Events and logs.
 */
export function failureMessage(e) {
  if (e instanceof ReconcileError) return e.message;
  const name = e instanceof Error ? e.name || 'Error' : `a thrown ${e === null ? 'null' : typeof e}`;
  const where = e instanceof Error ? thrownAt(e.stack) : undefined;
  return (
    `${name}${where ? ` at ${where}` : ''} (its text is not shown, it may carry values: ` +
    'throw a ReconcileError to say more)'
  );
}

/** `file.js:12` of the first frame of a stack (SpiderMonkey's `fn@file:12:3` or V8's `at fn (file:12:3)`). */
export function thrownAt(stack) {
  for (const line of String(stack ?? '').split('\n')) {
    const m = /([^/\\@( ]+\.m?js):(\d+)(?::\d+)?\)?\s*$/.exec(line.trim());
    if (m) return `${m[1]}:${m[2]}`;
  }
  return undefined;
}

/**
 * The object the component exports as `wasmop:reconciler/guest`, for a reconciler (an object,
 * or a class instance, with `metadata()`, `reconcile(request)` and, optionally,
 * `finalize(request)` and `validate(request)`; `reconcile` and `finalize` may be async).
 * `hostLog` is the component's `wasmop:reconciler/host` `log`.
 */
export function toGuest(reconciler, hostLog) {
  if (reconciler === null || typeof reconciler !== 'object') {
    throw new TypeError('the module must export a reconciler object (export default { metadata() {...}, reconcile(request) {...} })');
  }
  for (const method of ['metadata', 'reconcile']) {
    if (typeof reconciler[method] !== 'function') throw new TypeError(`the reconciler has no ${method}() method`);
  }
  if (hostLog) setSink((level, message) => hostLog(level, message));
  const failed = (e) => ({ tag: 'err', val: { message: failureMessage(e) } });
  return {
    metadata: () => metadataOut(reconciler),
    async reconcile(request) {
      try {
        return { tag: 'ok', val: responseOut(await reconciler.reconcile(requestIn(request))) };
      } catch (e) {
        return failed(e);
      }
    },
    async finalize(request) {
      try {
        const finalized = reconciler.finalize
          ? await reconciler.finalize(requestIn(request))
          : Finalized.finished();
        return { tag: 'ok', val: finalizeOut(finalized) };
      } catch (e) {
        return failed(e);
      }
    },
    async validate(request) {
      const verdict = reconciler.validate ? await reconciler.validate(validateIn(request)) : Validation.allow();
      return validationOut(verdict);
    },
  };
}
