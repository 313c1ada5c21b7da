// The conversions to and from the shapes componentize-js gives the WIT types (what the
// component's export sees), natively: records with camelCase fields, variants as {tag, val},
// enums by their WIT names, u64 as BigInt, results as {tag: 'ok' | 'err'}.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Finalized, Gvk, Mapping, Metadata, ObjectRef, ReconcileError, RelatedKind, Response, Selector, SelectorOperator, Condition, Event, Validation, k8s } from 'wasmop-sdk';
import { failureMessage, thrownAt, toGuest } from '../src/glue.js';

const APP = new Gvk('example.com/v1', 'App');
const primary = JSON.stringify({ apiVersion: 'example.com/v1', kind: 'App', metadata: { name: 'a', namespace: 'n' }, spec: {} });
const wireRequest = (trigger = { tag: 'primary-changed' }) => ({
  primary,
  owned: [{ kind: { apiVersion: 'v1', kind: 'ConfigMap' }, objects: [JSON.stringify({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'old' } })] }],
  related: [],
  context: { reconciler: 'apps', trigger, attempt: 2, config: '{"x":1}', nowUnixMs: 1_700_000_000_123n },
});

const app = {
  metadata: () =>
    new Metadata('app', '1.2.0')
      .primary(APP)
      .owns(k8s.CONFIG_MAP)
      .related(new RelatedKind(k8s.SECRET, Selector.everything().label('a', 'b').requirement('t', SelectorOperator.NOT_IN, ['x']), Mapping.primaryNamedByLabel('app')))
      .related(new RelatedKind(k8s.NAMESPACE).mapped(Mapping.SAME_NAME))
      .finalizes(),
  reconcile(request) {
    const c = request.context;
    return Response.complete(request)
      .child({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: `${request.primary.metadata.name}-${c.attempt}` }, data: { now: String(c.nowUnixMs), trigger: c.trigger.kind, child: c.trigger.object?.name ?? '', x: String(request.config.x), seen: request.owned(k8s.CONFIG_MAP)[0].metadata.name } })
      .mergePatch(ObjectRef.to(k8s.SECRET, 's'), { metadata: { labels: { seen: 'yes' } } })
      .delete(ObjectRef.to(k8s.SECRET, 'gone', 'other'))
      .condition(Condition.unknown('Ready').withReason('Waiting'))
      .event(Event.warning('Slow', 'slow').withAction('Wait').about(ObjectRef.to(k8s.SECRET, 's')))
      .requeueAfter(1.5);
  },
};

test('metadata crosses as the WIT module-metadata', () => {
  assert.deepEqual(toGuest(app).metadata(), {
    name: 'app',
    version: '1.2.0',
    primary: { apiVersion: 'example.com/v1', kind: 'App' },
    owns: [{ apiVersion: 'v1', kind: 'ConfigMap' }],
    related: [
      {
        kind: { apiVersion: 'v1', kind: 'Secret' },
        selector: { matchLabels: [['a', 'b']], matchExpressions: [{ key: 't', operator: 'not-in', values: ['x'] }] },
        mapsTo: { tag: 'primary-named-by-label', val: 'app' },
      },
      { kind: { apiVersion: 'v1', kind: 'Namespace' }, selector: { matchLabels: [], matchExpressions: [] }, mapsTo: { tag: 'same-name' } },
    ],
    finalizes: true,
    validates: false,
  });
  assert.throws(() => toGuest({ metadata: () => new Metadata('x', '1'), reconcile() {} }).metadata(), /names no primary kind/);
  assert.throws(() => toGuest({ metadata() {} }), /no reconcile\(\) method/);
});

test('a reconcile crosses as the WIT request and response', async () => {
  const out = await toGuest(app).reconcile(wireRequest({ tag: 'child-changed', val: { apiVersion: 'v1', kind: 'ConfigMap', namespace: undefined, name: 'old' } }));
  assert.equal(out.tag, 'ok');
  const r = out.val;
  assert.deepEqual(r.children.map((c) => c.kind), [{ apiVersion: 'v1', kind: 'ConfigMap' }]);
  assert.deepEqual(JSON.parse(r.children[0].objects[0]).data, { now: '1700000000123', trigger: 'child-changed', child: 'old', x: '1', seen: 'old' });
  assert.deepEqual(r.actions, [
    { tag: 'merge-patch', val: { target: { apiVersion: 'v1', kind: 'Secret', namespace: undefined, name: 's' }, body: '{"metadata":{"labels":{"seen":"yes"}}}' } },
    { tag: 'delete', val: { target: { apiVersion: 'v1', kind: 'Secret', namespace: 'other', name: 'gone' }, propagation: 'background' } },
  ]);
  assert.deepEqual(r.status, { fields: '{}', conditions: [{ type: 'Ready', status: 'unknown', reason: 'Waiting', message: '' }] });
  assert.deepEqual(r.events, [{ type: 'warning', reason: 'Slow', message: 'slow', action: 'Wait', regarding: { apiVersion: 'v1', kind: 'Secret', namespace: undefined, name: 's' } }]);
  assert.equal(r.requeueAfterMs, 1500n);
});

test('failures become the reconcile-error, and only a ReconcileError shows its text', async () => {
  const failing = (thrown) => toGuest({ metadata: app.metadata, reconcile: () => { throw thrown; } });
  assert.deepEqual(await failing(new ReconcileError('no quota')).reconcile(wireRequest()), { tag: 'err', val: { message: 'no quota' } });
  const hidden = await failing(new TypeError('password=hunter2')).reconcile(wireRequest());
  assert.equal(hidden.tag, 'err');
  assert.match(hidden.val.message, /^TypeError at glue\.test\.js:\d+ \(its text is not shown/);
  assert.doesNotMatch(hidden.val.message, /hunter2/);
  assert.match((await failing('a string').reconcile(wireRequest())).val.message, /^a thrown string/);
  // An async reconcile, and one that answers something else than a Response.
  const asyncOk = await toGuest({ metadata: app.metadata, reconcile: async (rq) => Response.complete(rq) }).reconcile(wireRequest());
  assert.equal(asyncOk.tag, 'ok');
  const wrong = await toGuest({ metadata: app.metadata, reconcile: () => ({ children: [] }) }).reconcile(wireRequest());
  assert.deepEqual(wrong, { tag: 'err', val: { message: 'reconcile returned an Object, not a Response' } });
});

test('the stack frame of a failure, from SpiderMonkey or V8', () => {
  assert.equal(thrownAt('reconcile@app/tenant.js:41:11\n@wasmop-sdk/glue.js:3:1'), 'tenant.js:41');
  assert.equal(thrownAt('TypeError: x\n    at reconcile (file:///w/app.js:7:3)\n'), 'app.js:7');
  assert.equal(thrownAt(undefined), undefined);
  assert.match(failureMessage(null), /^a thrown null/);
});

test('finalize and validate cross as their WIT types', async () => {
  const g = toGuest({
    ...app,
    finalize: () => Finalized.pending().withEffects(new Response().requeueAfter(2)),
    validate: (rq) => (rq.operation === 'create' ? Validation.allow().warn('new') : Validation.deny('no', rq.old.metadata.name)),
  });
  assert.deepEqual(await g.finalize(wireRequest()), { tag: 'ok', val: { done: false, actions: [], status: undefined, events: [], requeueAfterMs: 2000n } });
  assert.deepEqual(await g.validate({ operation: 'create', old: undefined, new: primary, config: '{}' }), { tag: 'allowed', val: ['new'] });
  assert.deepEqual(await g.validate({ operation: 'update', old: primary, new: primary, config: '{}' }), { tag: 'denied', val: { message: 'no', field: 'a' } });
  // Without finalize or validate: finished, allowed.
  const plain = toGuest(app);
  assert.deepEqual((await plain.finalize(wireRequest())).val.done, true);
  assert.deepEqual(await plain.validate({ operation: 'create', old: undefined, new: primary, config: '{}' }), { tag: 'allowed', val: [] });
  const children = toGuest({ ...app, finalize: (rq) => Finalized.finished().withEffects(Response.complete(rq)) });
  assert.match((await children.finalize(wireRequest())).val.message, /finalize returned children/);
});
