// {{name}}, tested natively with the SDK's harness (no Wasm, no cluster): `./build.sh test`.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ConditionStatus, k8s } from 'wasmop-sdk';
import { Harness } from 'wasmop-sdk/testing';
import reconciler from '../{{crate}}.js';

// The object of fixtures/cr.yaml (which `wasmop test` reads).
const HELLO = {
  apiVersion: '{{group}}/v1',
  kind: '{{Kind}}',
  metadata: { name: 'hello', namespace: 'default', uid: '6f1c2d3e-4b5a-4c6d-8e7f-9a0b1c2d3e4f', generation: 1 },
  spec: { message: 'hello, world' },
};

test('a {{singular}} becomes a ConfigMap with its message', async () => {
  const out = await new Harness(reconciler).primary(HELLO).reconcile();
  const [cm, ...more] = out.children(k8s.CONFIG_MAP);
  assert.equal(more.length, 0);
  assert.equal(cm.metadata.name, 'hello');
  assert.deepEqual(cm.data, { message: 'hello, world' });
  assert.deepEqual(out.status.fields, { configMap: 'hello' });
  const ready = out.conditionOf('Ready');
  assert.equal(ready.status, ConditionStatus.TRUE);
  assert.equal(ready.reason, 'Rendered');
});
