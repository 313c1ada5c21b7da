// feature-flags natively, with the SDK's harness (no Wasm, no cluster): `make js-test`.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { k8s } from 'wasmop-sdk';
import { Harness } from 'wasmop-sdk/testing';
import flags, { effective, problems } from '../flags.js';
import { fnv1a } from '../hash.js';

// fixtures/cr.yaml
const SHOP = {
  apiVersion: 'example.wasmop.dev/v1',
  kind: 'FeatureFlags',
  metadata: { name: 'shop', namespace: 'default', uid: 'u', generation: 2 },
  spec: { flags: { 'new-checkout': { enabled: true, rollout: 25 }, 'dark-mode': { enabled: false }, 'search-v2': { enabled: true } } },
};

test('the flags become one ConfigMap with their effective rollouts, in name order', async () => {
  const out = await new Harness(flags).primary(SHOP).reconcile();
  const [cm, ...more] = out.children(k8s.CONFIG_MAP);
  assert.equal(more.length, 0);
  assert.equal(cm.metadata.name, 'shop-flags');
  assert.equal(cm.data['flags.json'], '{"dark-mode":0,"new-checkout":25,"search-v2":100}');
  assert.deepEqual({ ...cm.data, 'flags.json': undefined }, { 'flags.json': undefined, 'dark-mode': '0', 'new-checkout': '25', 'search-v2': '100' });
  const revision = fnv1a(cm.data['flags.json']);
  assert.equal(cm.metadata.annotations['example.wasmop.dev/revision'], revision);
  assert.deepEqual(out.status.fields, { configMap: 'shop-flags', revision, flags: 3, enabled: 2 });
  assert.equal(out.conditionOf('Ready').reason, 'Rendered');
  assert.deepEqual(out.events, [], 'no Event without an earlier revision');
});

test('a changed revision is an Event; the same one is not', async () => {
  const previous = (revision) => ({
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name: 'shop-flags', annotations: { 'example.wasmop.dev/revision': revision }, ownerReferences: [{ controller: true }] },
  });
  const h = new Harness(flags).primary(SHOP).observed(previous('0a1b2c3d'));
  const out = await h.reconcile();
  const revision = out.status.fields.revision;
  assert.deepEqual(out.events.map((e) => [e.reason, e.message]), [['FlagsChanged', `revision 0a1b2c3d -> ${revision}`]]);
  assert.deepEqual(h.logs, [['info', `shop: revision 0a1b2c3d -> ${revision}`]]);
  const same = await new Harness(flags).primary(SHOP).observed(previous(revision)).reconcile();
  assert.deepEqual(same.events, []);
});

test('validate names the offending field and warns about ignored rollouts', async () => {
  const h = new Harness(flags);
  const bad = await h.validate({ ...SHOP, spec: { flags: { 'new-checkout': { enabled: true, rollout: 250 } } } });
  assert.equal(bad.allowed, false);
  assert.equal(bad.field, 'spec.flags.new-checkout.rollout');
  assert.match(bad.message, /rollout of new-checkout is 250/);
  const name = await h.validate({ ...SHOP, spec: { flags: { NewCheckout: { enabled: true } } } });
  assert.equal(name.field, 'spec.flags.NewCheckout');
  const ok = await h.validate({ ...SHOP, spec: { flags: { a: { enabled: false, rollout: 5 } } } });
  assert.deepEqual(ok.warnings, ['a is disabled: its rollout 5 is ignored']);
});

test('an invalid spec that got past admission fails the reconcile with the reasons', async () => {
  await assert.rejects(new Harness(flags).primary({ ...SHOP, spec: { flags: { x: { enabled: true, rollout: 1.5 } } } }).reconcile(), /rollout of x is 1.5/);
  assert.deepEqual(problems({ flags: [] }), [['spec.flags', 'spec.flags must map flag names to {enabled, rollout}']]);
  assert.deepEqual(effective({}), []);
});
