// The SDK natively: the response builder, requests, the harness, logging.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  Condition,
  ConditionStatus,
  Event,
  Finalized,
  Gvk,
  Mapping,
  Metadata,
  ObjectRef,
  Propagation,
  ReconcileError,
  RelatedKind,
  Response,
  Selector,
  SelectorOperator,
  Validation,
  k8s,
  log,
} from 'wasmop-sdk';
import { Harness } from 'wasmop-sdk/testing';

const GREETING = new Gvk('example.wasmop.dev/v1', 'Greeting');
const PRIMARY = {
  apiVersion: 'example.wasmop.dev/v1',
  kind: 'Greeting',
  metadata: { name: 'hi', namespace: 'default' },
  spec: { message: 'hello' },
};
const ns = (name) => ({ apiVersion: 'v1', kind: 'Namespace', metadata: { name } });

export const greeter = {
  metadata() {
    return new Metadata('greeter', '0.1.0')
      .primary(GREETING)
      .owns(k8s.CONFIG_MAP, k8s.SECRET)
      .related(new RelatedKind(k8s.NAMESPACE).mapped(Mapping.ALL_PRIMARIES));
  },
  reconcile(request) {
    const greeting = request.primary;
    log.info(`greeting ${greeting.metadata.name}`);
    return Response.complete(request)
      .child({
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name: `${greeting.metadata.name}-greeting` },
        data: {
          message: greeting.spec.message,
          namespaces: request.related(k8s.NAMESPACE).map((n) => n.metadata.name).join(','),
        },
      })
      .condition(Condition.of('Ready', false))
      .condition(Condition.of('Ready', true).withReason('Greeted'))
      .event(Event.normal('Greeted', 'said hello'))
      .requeueAfter(30);
  },
};

test('the harness runs a reconciler and collects its logs', async () => {
  const h = new Harness(greeter).primary(PRIMARY).observed(ns('a')).observed(ns('b'));
  const out = await h.reconcile();
  const [cm, ...rest] = out.children(k8s.CONFIG_MAP);
  assert.equal(rest.length, 0);
  assert.equal(cm.metadata.name, 'hi-greeting');
  assert.deepEqual(cm.data, { message: 'hello', namespaces: 'a,b' });
  // complete: the Secret set is declared (empty: every existing Secret child is pruned).
  assert.deepEqual(out.childSets.map(([k]) => String(k)), ['v1/ConfigMap', 'v1/Secret']);
  assert.deepEqual(out.children(k8s.SECRET), []);
  assert.deepEqual(out.conditionOf('Ready'), new Condition('Ready', ConditionStatus.TRUE, 'Greeted', ''));
  assert.equal(out.status.conditions.length, 1);
  assert.equal(out.requeueMs, 30_000);
  assert.deepEqual(h.logs, [['info', 'greeting hi']]);
});

test('an observed kind the module neither owns nor relates is a fixture error', () => {
  const h = new Harness(greeter).primary(PRIMARY);
  assert.throws(() => h.observed({ apiVersion: 'v1', kind: 'Pod', metadata: { name: 'p' } }), /neither owned nor related/);
  assert.throws(() => h.primary(ns('x')), /reconciles example.wasmop.dev\/v1\/Greeting/);
});

test('an observed object of a kind both owned and related is owned only when controlled', async () => {
  const both = {
    metadata: () => new Metadata('both', '0.1.0').primary(GREETING).owns(k8s.CONFIG_MAP).related(k8s.CONFIG_MAP),
    reconcile: (request) => {
      const names = (objs) => objs.map((o) => o.metadata.name).join(',');
      return new Response().withStatus({ owned: names(request.owned(k8s.CONFIG_MAP)), related: names(request.related(k8s.CONFIG_MAP)) });
    },
  };
  const mine = { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'mine', ownerReferences: [{ controller: true }] } };
  const other = { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'other' } };
  const out = await new Harness(both).primary(PRIMARY).observed(mine).observed(other).reconcile();
  assert.deepEqual(out.status.fields, { owned: 'mine', related: 'other' });
});

test('the harness refuses a child the module does not own or that has no name', async () => {
  const bad = (child) => ({
    metadata: greeter.metadata,
    reconcile: () => new Response().child(child),
  });
  await assert.rejects(new Harness(bad({ apiVersion: 'v1', kind: 'Pod', metadata: { name: 'p' } })).primary(PRIMARY).reconcile(), /does not own/);
  await assert.rejects(new Harness(bad({ apiVersion: 'v1', kind: 'ConfigMap', metadata: {} })).primary(PRIMARY).reconcile(), /no metadata.name/);
  assert.throws(() => new Response().child({ metadata: { name: 'x' } }), ReconcileError);
});

test('a child is copied: later edits of the object do not change the response', () => {
  const cm = { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'c' }, data: { a: '1' } };
  const r = new Response().child(cm);
  cm.data.a = '2';
  assert.equal(r.children(k8s.CONFIG_MAP)[0].data.a, '1');
  assert.throws(() => new Response().withStatus([1]), /must be an object/);
  const cyclic = { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'c' } };
  cyclic.self = cyclic;
  assert.throws(() => new Response().child(cyclic), /not JSON/);
});

test('selectors match labels as Kubernetes does', () => {
  const s = Selector.everything()
    .label('app', 'web')
    .requirement('tier', SelectorOperator.IN, ['a', 'b'])
    .requirement('legacy', SelectorOperator.DOES_NOT_EXIST);
  assert.ok(s.matches({ app: 'web', tier: 'a' }));
  assert.ok(!s.matches({ app: 'web', tier: 'c' }));
  assert.ok(!s.matches({ app: 'web', tier: 'a', legacy: '' }));
  assert.ok(!s.matches({ tier: 'a' }));
  assert.ok(Selector.everything().matches({}));
  assert.ok(new Selector().requirement('x', SelectorOperator.NOT_IN, ['1']).matches({}));
  assert.ok(new Selector().requirement('x', SelectorOperator.EXISTS).matches({ x: '' }));
  assert.throws(() => Selector.everything().requirement('x', 'In'), /unknown selector operator/);
});

test('references, kinds and intents', () => {
  const ref = ObjectRef.of({ apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'd', namespace: 'n' } });
  assert.deepEqual({ ...ref }, { apiVersion: 'apps/v1', kind: 'Deployment', name: 'd', namespace: 'n' });
  assert.ok(ref.gvk().equals(k8s.DEPLOYMENT));
  assert.equal(ObjectRef.to(k8s.SECRET, 's').inNamespace('x').namespace, 'x');
  assert.throws(() => Gvk.of({ kind: 'X' }), /no apiVersion or kind/);
  const r = new Response()
    .mergePatch(ref, { metadata: { labels: { a: 'b' } } })
    .jsonPatch(ref, [{ op: 'remove', path: '/spec/paused' }])
    .delete(ref, Propagation.FOREGROUND);
  assert.deepEqual(r.actions.map((a) => a.kind), ['merge-patch', 'json-patch', 'delete']);
  assert.throws(() => r.delete(ref, 'Foreground'), /unknown propagation/);
  assert.throws(() => r.requeueAfter(-1), ReconcileError);
  assert.throws(() => new Condition('Ready', 'true'), /True, False or Unknown/);
  assert.equal(Event.warning('R', 'm').withAction('Scale').about(ref).regarding, ref);
});

test('validate and finalize through the harness', async () => {
  const guarded = {
    metadata: () => new Metadata('guarded', '0.1.0').primary(GREETING).validates().finalizes(),
    reconcile: (request) => Response.complete(request),
    validate(request) {
      if (request.old && request.new.spec.message !== request.old.spec.message) {
        return Validation.deny('the message is immutable', 'spec.message');
      }
      return Validation.allow().warn(`config ${JSON.stringify(request.config)}`);
    },
    finalize: (request) => Finalized.pending().withEffects(new Response().event(Event.normal('Waiting', request.primary.metadata.name)).requeueAfter(5)),
  };
  const h = new Harness(guarded).config({ strict: true });
  assert.deepEqual((await h.validate(PRIMARY)).warnings, ['config {"strict":true}']);
  const denied = await h.validate({ ...PRIMARY, spec: { message: 'bye' } }, PRIMARY);
  assert.equal(denied.allowed, false);
  assert.equal(denied.field, 'spec.message');
  const f = await h.primary(PRIMARY).finalize();
  assert.equal(f.done, false);
  assert.equal(f.effects.requeueMs, 5000);
  const withChildren = { ...guarded, finalize: () => Finalized.finished().withEffects(new Response().child(ns('x'))) };
  await assert.rejects(new Harness(withChildren).primary(PRIMARY).finalize(), /finalize returned children/);
});

test('the context: config, trigger, time', async () => {
  const echo = {
    metadata: () => new Metadata('echo', '0.1.0').primary(GREETING),
    reconcile: (request) => new Response().withStatus({ config: request.config, trigger: request.context.trigger.kind, now: request.context.nowUnixMs }),
  };
  const out = await new Harness(echo).primary(PRIMARY).config({ a: 1 }).nowUnixMs(1_700_000_000_000).reconcile();
  assert.deepEqual(out.status.fields, { config: { a: 1 }, trigger: 'dry-run', now: 1_700_000_000_000 });
});

test('log levels are checked and the sink can be replaced', () => {
  const lines = [];
  log.setSink((level, message) => lines.push(`${level}:${message}`));
  try {
    log.warn('w');
    log.log(log.Level.ERROR, 42);
    assert.throws(() => log.log('fatal', 'x'), /unknown log level/);
  } finally {
    log.setSink(null);
  }
  assert.deepEqual(lines, ['warn:w', 'error:42']);
});

test('a reconciler without finalize finishes at once', async () => {
  const f = await new Harness(greeter).primary(PRIMARY).finalize();
  assert.equal(f.done, true);
});
