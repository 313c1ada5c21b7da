// Unit tests of hook.js without Wasm: call the exported function with the requests
// Metacontroller sends (hook version v1: children grouped by `<Kind>.<apiVersion>`, keyed by name)
// and check the answer.
//
//   node --test examples/metacontroller/catset/tests/

'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');

const hook = require(path.join(__dirname, '..', 'hook.js'));

// The CatSet of example.yaml, as the API server returns it.
function catset(replicas = 3) {
  return {
    apiVersion: 'ctl.enisoc.com/v1',
    kind: 'CatSet',
    metadata: {name: 'nginx-backend', namespace: 'default', uid: 'c0ffee', generation: 1},
    spec: {
      serviceName: 'nginx-backend',
      replicas,
      selector: {matchLabels: {app: 'nginx'}},
      template: {
        metadata: {labels: {app: 'nginx', component: 'backend'}},
        spec: {
          terminationGracePeriodSeconds: 1,
          volumes: [{name: 'pod-info', downwardAPI: {items: [{path: 'pod_name', fieldRef: {fieldPath: 'metadata.name'}}]}}],
          containers: [{
            name: 'nginx', image: 'nginx:1.26.2', ports: [{name: 'web', containerPort: 80}],
            volumeMounts: [{name: 'www', mountPath: '/usr/share/nginx/html'}],
          }],
        },
      },
      volumeClaimTemplates: [{
        metadata: {name: 'www', labels: {app: 'nginx', component: 'backend'}},
        spec: {accessModes: ['ReadWriteOnce'], resources: {requests: {storage: '1Gi'}}},
      }],
    },
  };
}

// An observed Pod: 'ready' (Running, Ready=True), 'pending', 'unready' (Running, Ready=False),
// 'unknown' (Running, no Ready condition yet) or 'deleting' (Running and Ready but with a
// deletionTimestamp).
function pod(name, state = 'ready') {
  const p = {
    apiVersion: 'v1', kind: 'Pod',
    metadata: {name, namespace: 'default', labels: {app: 'nginx', component: 'backend'}},
    spec: {containers: [{name: 'nginx', image: 'nginx:1.26.2'}]},
    status: {phase: 'Pending'},
  };
  if (state === 'unknown') {
    p.status = {phase: 'Running', conditions: [{type: 'PodScheduled', status: 'True'}]};
  } else if (state !== 'pending') {
    p.status = {phase: 'Running', conditions: [{type: 'Ready', status: state === 'unready' ? 'False' : 'True'}]};
  }
  if (state === 'deleting') p.metadata.deletionTimestamp = '2026-01-01T00:00:00Z';
  return p;
}

function claim(name) {
  return {apiVersion: 'v1', kind: 'PersistentVolumeClaim', metadata: {name, namespace: 'default'},
    spec: {accessModes: ['ReadWriteOnce'], resources: {requests: {storage: '1Gi'}}}, status: {phase: 'Bound'}};
}

function byName(objects) {
  return Object.fromEntries(objects.map((o) => [o.metadata.name, o]));
}

function request({parent = catset(), pods = [], claims = [], finalizing = false} = {}) {
  return {
    controller: {apiVersion: 'metacontroller.k8s.io/v1alpha1', kind: 'CompositeController', metadata: {name: 'catset-controller'}},
    parent,
    children: {'Pod.v1': byName(pods), 'PersistentVolumeClaim.v1': byName(claims)},
    related: {},
    finalizing,
  };
}

async function call(req) {
  const answer = await hook({request: {body: req}});
  assert.equal(answer.status, 200, `the hook failed: ${answer.body}`);
  return answer.body;
}

const names = (objects, kind) => objects.filter((o) => o.kind === kind).map((o) => o.metadata.name);

test('a new CatSet gets its first Pod and every claim', async () => {
  const desired = await call(request());
  assert.deepEqual(desired.status, {replicas: 0, readyReplicas: 0});
  assert.equal('finalized' in desired, false, 'finalized is only for the finalize hook');
  assert.deepEqual(names(desired.children, 'Pod'), ['nginx-backend-0']);
  assert.deepEqual(names(desired.children, 'PersistentVolumeClaim'),
    ['www-nginx-backend-0', 'www-nginx-backend-1', 'www-nginx-backend-2']);

  const first = desired.children[0];
  assert.equal(first.apiVersion, 'v1');
  assert.deepEqual(first.metadata, {name: 'nginx-backend-0', labels: {app: 'nginx', component: 'backend'}});
  assert.equal(first.spec.hostname, 'nginx-backend-0');
  assert.equal(first.spec.subdomain, 'nginx-backend');
  assert.equal(first.spec.terminationGracePeriodSeconds, 1);
  assert.deepEqual(first.spec.containers, catset().spec.template.spec.containers);
  assert.deepEqual(first.spec.volumes, [
    catset().spec.template.spec.volumes[0],
    {name: 'www', persistentVolumeClaim: {claimName: 'www-nginx-backend-0'}},
  ]);

  const pvc = desired.children.find((o) => o.metadata.name === 'www-nginx-backend-2');
  assert.deepEqual(pvc, {
    apiVersion: 'v1', kind: 'PersistentVolumeClaim',
    metadata: {name: 'www-nginx-backend-2', labels: {app: 'nginx', component: 'backend'}},
    spec: {accessModes: ['ReadWriteOnce'], resources: {requests: {storage: '1Gi'}}},
  });
});

test('the next ordinal waits until every lower one is Running and Ready', async () => {
  for (const state of ['pending', 'unready', 'unknown', 'deleting']) {
    const desired = await call(request({pods: [pod('nginx-backend-0'), pod('nginx-backend-1', state)]}));
    assert.deepEqual(names(desired.children, 'Pod'), ['nginx-backend-1', 'nginx-backend-0'], state);
    assert.deepEqual(desired.status, {replicas: 2, readyReplicas: 1}, state);
  }
});

test('scale-up adds one Pod, and the Pods are listed highest ordinal first', async () => {
  const desired = await call(request({pods: [pod('nginx-backend-0'), pod('nginx-backend-1')]}));
  assert.deepEqual(names(desired.children, 'Pod'), ['nginx-backend-2', 'nginx-backend-1', 'nginx-backend-0']);
  assert.deepEqual(desired.status, {replicas: 2, readyReplicas: 2});
  // Each Pod is built from its own copy of the template: one claim volume each.
  for (const p of desired.children.filter((o) => o.kind === 'Pod')) {
    assert.deepEqual(p.spec.volumes.map((v) => v.name), ['pod-info', 'www'], p.metadata.name);
    assert.equal(p.spec.volumes[1].persistentVolumeClaim.claimName, `www-${p.metadata.name}`);
  }
});

test('a missing middle ordinal is recreated before anything above it changes', async () => {
  const desired = await call(request({pods: [pod('nginx-backend-0'), pod('nginx-backend-2')]}));
  assert.deepEqual(names(desired.children, 'Pod'), ['nginx-backend-2', 'nginx-backend-1', 'nginx-backend-0']);
  assert.deepEqual(desired.status, {replicas: 2, readyReplicas: 1});
});

test('all Ready: nothing to add', async () => {
  const pods = [0, 1, 2].map((i) => pod(`nginx-backend-${i}`));
  const desired = await call(request({pods}));
  assert.deepEqual(names(desired.children, 'Pod'), ['nginx-backend-2', 'nginx-backend-1', 'nginx-backend-0']);
  assert.deepEqual(desired.status, {replicas: 3, readyReplicas: 3});
});

test('scale-down removes only the highest ordinal, and keeps the claims above the count', async () => {
  const pods = [0, 1, 2, 3].map((i) => pod(`nginx-backend-${i}`));
  const claims = [0, 1, 2, 3].map((i) => claim(`www-nginx-backend-${i}`));
  const desired = await call(request({parent: catset(2), pods, claims}));
  assert.deepEqual(names(desired.children, 'Pod'), ['nginx-backend-2', 'nginx-backend-1', 'nginx-backend-0']);
  assert.deepEqual(desired.status, {replicas: 4, readyReplicas: 2});
  assert.deepEqual(names(desired.children, 'PersistentVolumeClaim'),
    ['www-nginx-backend-0', 'www-nginx-backend-1', 'www-nginx-backend-2', 'www-nginx-backend-3']);
});

test('scale-down waits while a wanted Pod is not Ready', async () => {
  const pods = [pod('nginx-backend-0'), pod('nginx-backend-1', 'unready'), pod('nginx-backend-2'), pod('nginx-backend-3')];
  const desired = await call(request({parent: catset(2), pods}));
  assert.deepEqual(names(desired.children, 'Pod'),
    ['nginx-backend-3', 'nginx-backend-2', 'nginx-backend-1', 'nginx-backend-0']);
  assert.deepEqual(desired.status, {replicas: 4, readyReplicas: 1});
});

test('Pods and claims of other names are not counted, kept or deleted by ordinal', async () => {
  const pods = [pod('nginx-backend-0'), pod('other-1'), pod('nginx-backend-x'), pod('nginx-backend')];
  const claims = [claim('www-other-7'), claim('data-nginx-backend-9')];
  const desired = await call(request({parent: catset(1), pods, claims}));
  assert.deepEqual(names(desired.children, 'Pod'), ['nginx-backend-0']);
  assert.deepEqual(names(desired.children, 'PersistentVolumeClaim'), ['www-nginx-backend-0']);
  assert.deepEqual(desired.status, {replicas: 1, readyReplicas: 1});
});

test('finalize scales down one Pod at a time and is not done while Pods remain', async () => {
  const pods = [0, 1, 2].map((i) => pod(`nginx-backend-${i}`));
  const claims = [0, 1, 2].map((i) => claim(`www-nginx-backend-${i}`));
  const desired = await call(request({pods, claims, finalizing: true}));
  assert.equal(desired.finalized, false);
  assert.deepEqual(names(desired.children, 'Pod'), ['nginx-backend-1', 'nginx-backend-0']);
  assert.deepEqual(desired.status, {replicas: 3, readyReplicas: 0});
  // The claims stay until the CatSet itself is gone (garbage collection removes them).
  assert.deepEqual(names(desired.children, 'PersistentVolumeClaim'),
    ['www-nginx-backend-0', 'www-nginx-backend-1', 'www-nginx-backend-2']);
});

test('finalize is done once no Pod is left', async () => {
  const claims = [claim('www-nginx-backend-0')];
  const desired = await call(request({claims, finalizing: true}));
  assert.equal(desired.finalized, true);
  assert.deepEqual(desired.status, {replicas: 0, readyReplicas: 0});
  assert.deepEqual(names(desired.children, 'Pod'), []);
  assert.deepEqual(names(desired.children, 'PersistentVolumeClaim'), ['www-nginx-backend-0']);
});

test('without claim templates there are no claims and no claim volumes', async () => {
  const parent = catset(1);
  delete parent.spec.volumeClaimTemplates;
  const desired = await call(request({parent, claims: [claim('www-nginx-backend-0')]}));
  assert.deepEqual(names(desired.children, 'PersistentVolumeClaim'), []);
  assert.deepEqual(desired.children[0].spec.volumes.map((v) => v.name), ['pod-info']);
});

test('the answer is JSON with a content type, and a broken request is a 500', async () => {
  const ok = await hook({request: {body: request()}});
  assert.deepEqual(ok.headers, {'Content-Type': 'application/json'});
  assert.deepEqual(JSON.parse(JSON.stringify(ok.body)), ok.body);
  const broken = await hook({request: {body: {children: {}}}});
  assert.equal(broken.status, 500);
  assert.equal(typeof broken.body, 'string');
});
