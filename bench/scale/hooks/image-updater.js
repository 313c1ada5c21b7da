// image-updater as a Metacontroller CompositeController hook: the logic of the native module
// (examples/image-updater/src/lib.rs) written as a fission-style JavaScript function, for the
// `wasmop-metacontroller` row of `make bench-scale` (bench/scale/src/contenders/metacontroller.rs),
// which builds it with `scripts/js-module.sh hook` and serves it through a CompositeController
// with `spec.wasmop`. The same file runs under Metacontroller's nodejs-server.
//
// `context.request.body` is what Metacontroller POSTs: the App as `parent`, the observed
// children grouped as `Deployment.apps/v1` and `Service.v1`, keyed by name, and `finalizing`
// (sync and finalize share this handler, on one URL). The answer is `{status: 200, body}`.
//
// Same answers as the native module, field for field:
// - children: the Deployment and the Service of `app.kubernetes.io/name=<app>`,
//   `example.wasmop.dev/track=<track>` (the native module's `deployment` and `service`);
// - status: `replicas`, `readyReplicas`, `updatedReplicas`, `image`, `selector` and the
//   conditions `Available` and `Progressing`, with the same reasons and messages;
// - `resyncAfterSeconds: 5` while `Progressing` is True (the native module's 5 s requeue);
// - finalize: delete the Services first (by leaving them out), `finalized` once none is left,
//   and look again in 0.5 s meanwhile (the native module's `finalize`).
// What a hook cannot say, and the native module does: Events (`Creating`, `RollingOut`,
// `Draining`, `Drained`) and admission (`validate`). Metacontroller hooks have neither.

'use strict';

// The App's defaults, as its CRD (and the native module's serde defaults) set them.
function spec(app) {
  const s = app.spec || {};
  return {
    image: s.image,
    replicas: s.replicas === undefined ? 1 : s.replicas,
    port: s.port === undefined ? 8080 : s.port,
    track: s.track === undefined ? 'stable' : s.track,
  };
}

// The labels every child and pod of the App carries (sorted by key, as the native BTreeMap).
function labels(app) {
  return {
    'app.kubernetes.io/managed-by': 'wasmop',
    'app.kubernetes.io/name': app.metadata.name,
    'example.wasmop.dev/track': spec(app).track,
  };
}

function selector(app) {
  return {
    'app.kubernetes.io/name': app.metadata.name,
    'example.wasmop.dev/track': spec(app).track,
  };
}

function deployment(app) {
  const s = spec(app);
  return {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: {name: app.metadata.name, labels: labels(app)},
    spec: {
      replicas: s.replicas,
      selector: {matchLabels: selector(app)},
      template: {
        metadata: {labels: labels(app)},
        spec: {
          containers: [{
            name: 'app',
            image: s.image,
            ports: [{containerPort: s.port, name: 'http'}],
          }],
        },
      },
    },
  };
}

function service(app) {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {name: app.metadata.name, labels: labels(app)},
    spec: {
      selector: selector(app),
      ports: [{name: 'http', port: 80, targetPort: 'http'}],
    },
  };
}

function conditionOf(deployment, type) {
  const conditions = (deployment.status && deployment.status.conditions) || [];
  const found = conditions.find((c) => c && c.type === type);
  return found ? found.status : undefined;
}

function runningImage(deployment) {
  const pod = deployment.spec && deployment.spec.template && deployment.spec.template.spec;
  const first = pod && pod.containers && pod.containers[0];
  return (first && first.image) || '';
}

function condition(type, value, reason, message) {
  return {type, status: value ? 'True' : 'False', reason, message};
}

// The status and its conditions, from the observed Deployment (the native module's `status`).
function status(app, observed) {
  const s = spec(app);
  const ds = (observed && observed.status) || {};
  const fields = {
    replicas: s.replicas,
    readyReplicas: ds.readyReplicas || 0,
    updatedReplicas: ds.updatedReplicas || 0,
    image: s.image,
    selector: Object.entries(selector(app)).map(([k, v]) => `${k}=${v}`).join(','),
  };
  let available;
  let progressing;
  if (!observed) {
    available = condition('Available', false, 'DeploymentCreating', 'the Deployment is being created');
    progressing = condition('Progressing', true, 'DeploymentCreating', 'the Deployment is being created');
  } else {
    const generation = (observed.metadata && observed.metadata.generation) || 0;
    const seen = ds.observedGeneration || 0;
    const rolledOut = runningImage(observed) === s.image &&
      seen >= generation &&
      fields.updatedReplicas >= s.replicas &&
      fields.readyReplicas >= s.replicas &&
      (ds.replicas || 0) === s.replicas;
    const ready = `${fields.readyReplicas}/${s.replicas} replicas ready`;
    available = conditionOf(observed, 'Available') === 'True' ?
      condition('Available', true, 'MinimumReplicasAvailable', ready) :
      condition('Available', false, 'MinimumReplicasUnavailable', ready);
    progressing = rolledOut ?
      condition('Progressing', false, 'RolloutComplete', `all replicas run ${s.image}`) :
      condition('Progressing', true, 'RollingOut',
        `${fields.updatedReplicas}/${s.replicas} replicas updated to ${s.image}`);
  }
  fields.conditions = [available, progressing];
  return fields;
}

function sync(request) {
  const app = request.parent;
  const deployments = Object.values((request.children || {})['Deployment.apps/v1'] || {});
  const observed = deployments[0];
  const st = status(app, observed);
  const answer = {status: st, children: [deployment(app), service(app)]};
  // While a rollout is in progress, look again soon even if no event arrives.
  if (st.conditions[1].status === 'True') answer.resyncAfterSeconds = 5;
  return answer;
}

// Deleting an App drains it first: the Services go (left out of the answer), the App is
// finalized once none is left, and the Deployment goes with the App (garbage collector).
function finalize(request) {
  const app = request.parent;
  const services = Object.values((request.children || {})['Service.v1'] || {});
  if (services.length === 0) return {finalized: true, children: [deployment(app)]};
  return {finalized: false, children: [deployment(app)], resyncAfterSeconds: 0.5};
}

module.exports = async function (context) {
  const request = context.request.body;
  try {
    return {status: 200, body: request.finalizing ? finalize(request) : sync(request)};
  } catch (err) {
    return {status: 500, body: String((err && err.stack) || err)};
  }
};
