// Unit tests of hook.js without Wasm: call the exported function with the requests
// Metacontroller sends (hook version v1: children grouped by `<Kind>.<apiVersion>`, keyed by name)
// and check the answer, through a whole blue -> green -> blue rollout.
//
//   node --test examples/metacontroller/bluegreen/tests/

'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');

const hook = require(path.join(__dirname, '..', 'hook.js'));

const ANNOTATION = 'bluegreendeployments.ctl.enisoc.com/pod-template-json';

function template(extraLabels = {}) {
  return {
    metadata: {labels: Object.assign({app: 'nginx', component: 'frontend'}, extraLabels)},
    spec: {containers: [{name: 'nginx', image: 'nginx:1.26.2', ports: [{containerPort: 80}]}]},
  };
}

// The BlueGreenDeployment of example.yaml, as the API server returns it.
function bgd(podTemplate = template()) {
  return {
    apiVersion: 'ctl.enisoc.com/v1',
    kind: 'BlueGreenDeployment',
    metadata: {name: 'nginx', namespace: 'default', labels: {app: 'nginx'}, uid: 'b1u3', generation: 1},
    spec: {
      replicas: 3,
      minReadySeconds: 5,
      selector: {matchLabels: {app: 'nginx', component: 'frontend'}},
      template: podTemplate,
      service: {
        metadata: {name: 'nginx-frontend', labels: {app: 'nginx', component: 'frontend'}},
        spec: {selector: {app: 'nginx', component: 'frontend'}, ports: [{port: 80}]},
      },
    },
  };
}

// An observed ReplicaSet of color `color` made from `podTemplate`, with `replicas` wanted and
// `available` of them available (and as many existing and Ready).
function rs(color, podTemplate, replicas, available = replicas) {
  return {
    apiVersion: 'apps/v1', kind: 'ReplicaSet',
    metadata: {
      name: `nginx-${color}`, namespace: 'default',
      labels: Object.assign({}, podTemplate.metadata.labels, {color}),
      annotations: {[ANNOTATION]: JSON.stringify(podTemplate)},
    },
    spec: {replicas, minReadySeconds: 5, selector: {matchLabels: {app: 'nginx', component: 'frontend', color}}, template: podTemplate},
    status: {replicas: available, readyReplicas: available, availableReplicas: available, observedGeneration: 1},
  };
}

function svc(color) {
  return {
    apiVersion: 'v1', kind: 'Service',
    metadata: {name: 'nginx-frontend', namespace: 'default', labels: {app: 'nginx', component: 'frontend'}},
    spec: {selector: {app: 'nginx', component: 'frontend', color}, ports: [{port: 80, protocol: 'TCP', targetPort: 80}], clusterIP: '10.0.0.7'},
  };
}

function byName(objects) {
  return Object.fromEntries(objects.map((o) => [o.metadata.name, o]));
}

function request(parent, {services = [], sets = []} = {}) {
  return {
    controller: {apiVersion: 'metacontroller.k8s.io/v1alpha1', kind: 'CompositeController', metadata: {name: 'bluegreen-controller'}},
    parent,
    children: {'Service.v1': byName(services), 'ReplicaSet.apps/v1': byName(sets)},
    related: {},
    finalizing: false,
  };
}

async function call(req) {
  const answer = await hook({request: {body: req}});
  assert.equal(answer.status, 200, `the hook failed: ${answer.body}`);
  return answer.body;
}

// The desired children, summarised: the Service's color and each ReplicaSet's replicas and the
// template it records.
function summary(desired) {
  const [service, ...sets] = desired.children;
  assert.equal(service.kind, 'Service');
  assert.equal(sets.length, 2);
  return {
    serviceColor: service.spec.selector.color,
    sets: Object.fromEntries(sets.map((s) => [s.metadata.name, {replicas: s.spec.replicas, template: JSON.parse(s.metadata.annotations[ANNOTATION])}])),
  };
}

const OLD = template();
const NEW = template({new: 'label'});
const NEWER = template({new: 'label', new2: 'label2'});

test('a new BlueGreenDeployment: Service on blue, blue at full size, green empty', async () => {
  const desired = await call(request(bgd()));
  assert.deepEqual(desired.status, {activeColor: 'blue', active: {}, inactive: {}});
  assert.equal('finalized' in desired, false);

  const [service, blue, green] = desired.children;
  assert.deepEqual(service, {
    apiVersion: 'v1', kind: 'Service',
    metadata: {name: 'nginx-frontend', labels: {app: 'nginx', component: 'frontend'}},
    spec: {selector: {app: 'nginx', component: 'frontend', color: 'blue'}, ports: [{port: 80}]},
  });
  assert.deepEqual(blue, {
    apiVersion: 'apps/v1', kind: 'ReplicaSet',
    metadata: {
      name: 'nginx-blue',
      labels: {app: 'nginx', component: 'frontend', color: 'blue'},
      annotations: {[ANNOTATION]: JSON.stringify(OLD)},
    },
    spec: {
      replicas: 3,
      minReadySeconds: 5,
      selector: {matchLabels: {app: 'nginx', component: 'frontend', color: 'blue'}},
      template: {metadata: {labels: {app: 'nginx', component: 'frontend', color: 'blue'}}, spec: OLD.spec},
    },
  });
  assert.equal(green.metadata.name, 'nginx-green');
  assert.equal(green.spec.replicas, 0);
  assert.deepEqual(green.spec.selector.matchLabels, {app: 'nginx', component: 'frontend', color: 'green'});
  assert.equal(green.spec.template.metadata.labels.color, 'green');
  // The recorded template is the parent's, without the color label.
  assert.deepEqual(JSON.parse(green.metadata.annotations[ANNOTATION]), OLD);
});

test('steady state: nothing moves, status reports the observed ReplicaSets', async () => {
  const blue = rs('blue', OLD, 3);
  const green = rs('green', OLD, 0);
  const desired = await call(request(bgd(OLD), {services: [svc('blue')], sets: [blue, green]}));
  assert.deepEqual(desired.status, {activeColor: 'blue', active: blue.status, inactive: green.status});
  assert.deepEqual(summary(desired), {
    serviceColor: 'blue',
    sets: {'nginx-blue': {replicas: 3, template: OLD}, 'nginx-green': {replicas: 0, template: OLD}},
  });
});

test('a new template starts the rollout on the idle inactive color', async () => {
  const desired = await call(request(bgd(NEW), {services: [svc('blue')], sets: [rs('blue', OLD, 3), rs('green', OLD, 0)]}));
  assert.deepEqual(summary(desired), {
    serviceColor: 'blue',
    sets: {'nginx-blue': {replicas: 3, template: OLD}, 'nginx-green': {replicas: 3, template: NEW}},
  });
  const green = desired.children[2];
  assert.deepEqual(green.spec.template.metadata.labels, {app: 'nginx', component: 'frontend', new: 'label', color: 'green'});
});

test('the rollout waits until every new replica is available', async () => {
  const desired = await call(request(bgd(NEW), {services: [svc('blue')], sets: [rs('blue', OLD, 3), rs('green', NEW, 3, 2)]}));
  assert.deepEqual(summary(desired), {
    serviceColor: 'blue',
    sets: {'nginx-blue': {replicas: 3, template: OLD}, 'nginx-green': {replicas: 3, template: NEW}},
  });
  assert.equal(desired.status.activeColor, 'blue');
  // Ready is not enough: minReadySeconds has not passed for every replica yet.
  const green = rs('green', NEW, 3, 2);
  green.status.readyReplicas = 3;
  green.status.replicas = 3;
  const ready = await call(request(bgd(NEW), {services: [svc('blue')], sets: [rs('blue', OLD, 3), green]}));
  assert.equal(summary(ready).serviceColor, 'blue');
});

test('all new replicas available: the Service swaps to green, blue keeps its size until the next sync', async () => {
  const desired = await call(request(bgd(NEW), {services: [svc('blue')], sets: [rs('blue', OLD, 3), rs('green', NEW, 3)]}));
  assert.deepEqual(summary(desired), {
    serviceColor: 'green',
    sets: {'nginx-green': {replicas: 3, template: NEW}, 'nginx-blue': {replicas: 3, template: OLD}},
  });
  // The status still reports what was observed: blue was active.
  assert.equal(desired.status.activeColor, 'blue');
  assert.deepEqual([desired.children[1].metadata.name, desired.children[2].metadata.name], ['nginx-green', 'nginx-blue']);
});

test('after the swap the old color is scaled down', async () => {
  const green = rs('green', NEW, 3);
  const blue = rs('blue', OLD, 3);
  const desired = await call(request(bgd(NEW), {services: [svc('green')], sets: [blue, green]}));
  assert.deepEqual(desired.status, {activeColor: 'green', active: green.status, inactive: blue.status});
  assert.deepEqual(summary(desired), {
    serviceColor: 'green',
    sets: {'nginx-green': {replicas: 3, template: NEW}, 'nginx-blue': {replicas: 0, template: OLD}},
  });
});

test('the next rollout goes back to blue once blue is empty', async () => {
  const sets = [rs('green', NEW, 3), rs('blue', OLD, 0)];
  const desired = await call(request(bgd(NEWER), {services: [svc('green')], sets}));
  assert.deepEqual(summary(desired), {
    serviceColor: 'green',
    sets: {'nginx-green': {replicas: 3, template: NEW}, 'nginx-blue': {replicas: 3, template: NEWER}},
  });
});

test('a new template during another rollout cancels it first', async () => {
  // Green runs NEW but is not active yet; the parent moved on to NEWER.
  const desired = await call(request(bgd(NEWER), {services: [svc('blue')], sets: [rs('blue', OLD, 3), rs('green', NEW, 3, 1)]}));
  assert.deepEqual(summary(desired), {
    serviceColor: 'blue',
    sets: {'nginx-blue': {replicas: 3, template: OLD}, 'nginx-green': {replicas: 0, template: NEW}},
  });
  // Scaled to 0 but Pods still exist: still not idle, keep waiting.
  const waiting = await call(request(bgd(NEWER), {services: [svc('blue')], sets: [rs('blue', OLD, 3), Object.assign(rs('green', NEW, 0), {status: {replicas: 2}})]}));
  assert.deepEqual(summary(waiting).sets['nginx-green'], {replicas: 0, template: NEW});
});

test('a template equal up to key order is current', async () => {
  const reordered = {spec: NEW.spec, metadata: {labels: {new: 'label', component: 'frontend', app: 'nginx'}}};
  const desired = await call(request(bgd(reordered), {services: [svc('blue')], sets: [rs('blue', NEW, 3), rs('green', OLD, 3)]}));
  assert.equal(summary(desired).sets['nginx-green'].replicas, 0);
});

test('a template that lost a label is a new template too', async () => {
  const sets = [rs('blue', NEW, 3), rs('green', NEW, 0)];
  const desired = await call(request(bgd(OLD), {services: [svc('blue')], sets}));
  assert.deepEqual(summary(desired), {
    serviceColor: 'blue',
    sets: {'nginx-blue': {replicas: 3, template: NEW}, 'nginx-green': {replicas: 3, template: OLD}},
  });
});

test('no Service yet but ReplicaSets exist: blue is taken as active', async () => {
  const desired = await call(request(bgd(OLD), {sets: [rs('blue', OLD, 3), rs('green', OLD, 0)]}));
  assert.equal(desired.status.activeColor, 'blue');
  assert.equal(summary(desired).serviceColor, 'blue');
});

test('the answer is JSON with a content type; a ReplicaSet without its annotation is a 500', async () => {
  const ok = await hook({request: {body: request(bgd())}});
  assert.deepEqual(ok.headers, {'Content-Type': 'application/json'});
  const bare = rs('blue', OLD, 3);
  delete bare.metadata.annotations;
  const broken = await hook({request: {body: request(bgd(), {services: [svc('blue')], sets: [bare]})}});
  assert.equal(broken.status, 500);
  assert.equal(typeof broken.body, 'string');
});

test('the parent is not modified', async () => {
  const parent = bgd(NEW);
  const before = JSON.stringify(parent);
  await call(request(parent, {services: [svc('blue')], sets: [rs('blue', OLD, 3), rs('green', NEW, 3)]}));
  assert.equal(JSON.stringify(parent), before);
});
