// Unit tests of hooks/image-updater.js without Wasm: call the exported function with the
// requests Metacontroller sends (hook v1: children grouped by `<Kind>.<apiVersion>`, keyed by
// name) and compare with what the native module answers for the same App and Deployment
// (examples/image-updater: src/lib.rs, fixtures/ and tests/reconcile.rs). The exact parity over
// more cases, against the native module itself, is the Rust test
// `contenders::metacontroller::tests::the_hook_answers_as_the_native_module`.
//
//   node --test bench/scale/hooks/tests/

'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');

const hook = require(path.join(__dirname, '..', 'image-updater.js'));

// examples/image-updater/fixtures/cr.yaml
function app(spec = {}) {
  return {
    apiVersion: 'example.wasmop.dev/v1', kind: 'App',
    metadata: {name: 'web', namespace: 'demo', uid: '5b2f6c1e-3d4a-4f7b-9a8e-1c2d3e4f5a6b', generation: 2},
    spec: Object.assign({image: 'nginx:1.28', replicas: 3, port: 8080, track: 'stable'}, spec),
  };
}

// examples/image-updater/fixtures/observed/deployment.yaml: mid-rollout from nginx:1.27.
function deployment(image = 'nginx:1.27', available = 'True') {
  return {
    apiVersion: 'apps/v1', kind: 'Deployment',
    metadata: {name: 'web', namespace: 'demo', generation: 4, labels: {'app.kubernetes.io/name': 'web'}},
    spec: {
      replicas: 3,
      selector: {matchLabels: {'app.kubernetes.io/name': 'web', 'example.wasmop.dev/track': 'stable'}},
      template: {
        metadata: {labels: {'app.kubernetes.io/name': 'web', 'example.wasmop.dev/track': 'stable'}},
        spec: {containers: [{name: 'app', image}]},
      },
    },
    status: {
      observedGeneration: 4, replicas: 3, readyReplicas: 3, updatedReplicas: 3, availableReplicas: 3,
      conditions: [{type: 'Available', status: available, reason: 'MinimumReplicasAvailable'}],
    },
  };
}

const SERVICE = {apiVersion: 'v1', kind: 'Service', metadata: {name: 'web', namespace: 'demo'}, spec: {}};

function request(parent, {deployments = [], services = [], finalizing = false} = {}) {
  const byName = (objects) => Object.fromEntries(objects.map((o) => [o.metadata.name, o]));
  return {
    controller: {apiVersion: 'metacontroller.k8s.io/v1alpha1', kind: 'CompositeController', metadata: {name: 'image-updater'}},
    parent,
    children: {'Deployment.apps/v1': byName(deployments), 'Service.v1': byName(services)},
    related: {},
    finalizing,
  };
}

async function call(req) {
  const answer = await hook({request: {body: req}});
  assert.equal(answer.status, 200, `the hook failed: ${answer.body}`);
  return answer.body;
}

const LABELS = {
  'app.kubernetes.io/managed-by': 'wasmop',
  'app.kubernetes.io/name': 'web',
  'example.wasmop.dev/track': 'stable',
};
const SELECTOR = {'app.kubernetes.io/name': 'web', 'example.wasmop.dev/track': 'stable'};

test('children: the Deployment and Service of fixtures/expected.yaml', async () => {
  const answer = await call(request(app(), {deployments: [deployment()], services: [SERVICE]}));
  assert.deepEqual(answer.children, [
    {
      apiVersion: 'apps/v1', kind: 'Deployment',
      metadata: {name: 'web', labels: LABELS},
      spec: {
        replicas: 3,
        selector: {matchLabels: SELECTOR},
        template: {
          metadata: {labels: LABELS},
          spec: {containers: [{name: 'app', image: 'nginx:1.28', ports: [{containerPort: 8080, name: 'http'}]}]},
        },
      },
    },
    {
      apiVersion: 'v1', kind: 'Service',
      metadata: {name: 'web', labels: LABELS},
      spec: {selector: SELECTOR, ports: [{name: 'http', port: 80, targetPort: 'http'}]},
    },
  ]);
});

test('mid-rollout: the status of fixtures/expected.yaml, and a look again in 5 s', async () => {
  const answer = await call(request(app(), {deployments: [deployment()]}));
  assert.deepEqual(answer.status, {
    replicas: 3, readyReplicas: 3, updatedReplicas: 3, image: 'nginx:1.28',
    selector: 'app.kubernetes.io/name=web,example.wasmop.dev/track=stable',
    conditions: [
      {type: 'Available', status: 'True', reason: 'MinimumReplicasAvailable', message: '3/3 replicas ready'},
      {type: 'Progressing', status: 'True', reason: 'RollingOut', message: '3/3 replicas updated to nginx:1.28'},
    ],
  });
  assert.equal(answer.resyncAfterSeconds, 5);
});

test('a new App: DeploymentCreating, and a look again in 5 s', async () => {
  const answer = await call(request(app({replicas: undefined, port: undefined, track: undefined})));
  assert.equal(answer.children[0].spec.replicas, 1, 'the CRD default');
  assert.equal(answer.children[0].spec.template.spec.containers[0].ports[0].containerPort, 8080);
  assert.deepEqual(answer.status.conditions, [
    {type: 'Available', status: 'False', reason: 'DeploymentCreating', message: 'the Deployment is being created'},
    {type: 'Progressing', status: 'True', reason: 'DeploymentCreating', message: 'the Deployment is being created'},
  ]);
  assert.equal(answer.status.readyReplicas, 0);
  assert.equal(answer.resyncAfterSeconds, 5);
});

test('a finished rollout: Available, RolloutComplete, no resync asked for', async () => {
  const answer = await call(request(app(), {deployments: [deployment('nginx:1.28')]}));
  assert.deepEqual(answer.status.conditions, [
    {type: 'Available', status: 'True', reason: 'MinimumReplicasAvailable', message: '3/3 replicas ready'},
    {type: 'Progressing', status: 'False', reason: 'RolloutComplete', message: 'all replicas run nginx:1.28'},
  ]);
  assert.equal('resyncAfterSeconds' in answer, false);
});

test('not available: MinimumReplicasUnavailable', async () => {
  const answer = await call(request(app(), {deployments: [deployment('nginx:1.28', 'False')]}));
  assert.deepEqual(answer.status.conditions[0],
    {type: 'Available', status: 'False', reason: 'MinimumReplicasUnavailable', message: '3/3 replicas ready'});
});

test('finalize drains the Service first, then is done; the Deployment goes with the App', async () => {
  const pending = await call(request(app(), {deployments: [deployment()], services: [SERVICE], finalizing: true}));
  assert.equal(pending.finalized, false);
  assert.deepEqual(pending.children.map((c) => c.kind), ['Deployment'], 'the Service is left out: deleted');
  assert.equal(pending.resyncAfterSeconds, 0.5);
  const done = await call(request(app(), {deployments: [deployment()], finalizing: true}));
  assert.equal(done.finalized, true);
  assert.equal('status' in done, false, 'finalize leaves the status as it is');
});

test('a throw is a 500 with the error', async () => {
  const answer = await hook({request: {body: {children: {}}}});
  assert.equal(answer.status, 500);
  assert.match(answer.body, /TypeError/);
});
