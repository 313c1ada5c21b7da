// BlueGreenDeployment: a blue-green rollout of a Pod template, as a Metacontroller
// CompositeController sync hook.
//
// Fission-style function: `context.request.body` is what Metacontroller POSTs (parent, children
// grouped as `Service.v1` / `ReplicaSet.apps/v1` and keyed by name); the answer is
// `{status, body}`. No requires: the same file runs under Metacontroller's nodejs-server and as a
// wasmop hook module.
//
// Behaviour (Metacontroller's examples/bluegreen):
// - Two ReplicaSets, `<name>-blue` and `<name>-green`, and the Service of `spec.service`, whose
//   selector gets `color: <active color>`. Each ReplicaSet records the Pod template it runs in
//   an annotation (the JSON of the template), so the hook can tell which one is current.
// - The active color is the one the observed Service selects (blue before there is a Service).
// - Active ReplicaSet current: the inactive one is scaled to 0.
// - Inactive ReplicaSet current: it is scaled to `spec.replicas`; once all of them are
//   available (`minReadySeconds` included), the colors swap: the Service moves over, and the
//   previously active one is scaled to 0 on the next sync.
// - Neither current: if the inactive one is fully scaled down, a rollout starts on it with the
//   new template; otherwise an older rollout is cancelled first (the inactive one goes to 0).
// - Status: `activeColor`, and the `status` of the active and inactive ReplicaSets.

'use strict';

const TEMPLATE_ANNOTATION = 'bluegreendeployments.ctl.enisoc.com/pod-template-json';

function clone(value) {
  return value === undefined || value === null ? value : JSON.parse(JSON.stringify(value));
}

// Structural equality of JSON values (objects compared by keys, arrays by position).
function same(a, b) {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const keys = Object.keys(a);
  if (keys.length !== Object.keys(b).length) return false;
  return keys.every((k) => Object.prototype.hasOwnProperty.call(b, k) && same(a[k], b[k]));
}

// The Pod template a ReplicaSet of ours was made from.
function templateOf(rs) {
  const text = rs.metadata && rs.metadata.annotations && rs.metadata.annotations[TEMPLATE_ANNOTATION];
  if (typeof text !== 'string') {
    throw new Error(`ReplicaSet ${rs.metadata && rs.metadata.name} has no ${TEMPLATE_ANNOTATION} annotation`);
  }
  return JSON.parse(text);
}

function isCurrent(bgd, rs) {
  return Boolean(rs) && same(bgd.spec.template, templateOf(rs));
}

function replicaSet(bgd, color, replicas, template) {
  const podTemplate = clone(template);
  podTemplate.metadata = podTemplate.metadata || {};
  podTemplate.metadata.labels = Object.assign({}, podTemplate.metadata.labels, {color});
  const selector = clone(bgd.spec.selector) || {};
  selector.matchLabels = Object.assign({}, selector.matchLabels, {color});
  return {
    apiVersion: 'apps/v1',
    kind: 'ReplicaSet',
    metadata: {
      name: `${bgd.metadata.name}-${color}`,
      labels: Object.assign({}, template.metadata && template.metadata.labels, {color}),
      annotations: {[TEMPLATE_ANNOTATION]: JSON.stringify(template)},
    },
    spec: {
      replicas,
      minReadySeconds: bgd.spec.minReadySeconds,
      selector,
      template: podTemplate,
    },
  };
}

function service(bgd, color) {
  const svc = clone(bgd.spec.service);
  svc.apiVersion = 'v1';
  svc.kind = 'Service';
  svc.spec = svc.spec || {};
  svc.spec.selector = Object.assign({}, svc.spec.selector, {color});
  return svc;
}

const other = (color) => (color === 'blue' ? 'green' : 'blue');

function sync(request) {
  const bgd = request.parent;
  const name = bgd.metadata.name;
  const children = request.children || {};
  const sets = children['ReplicaSet.apps/v1'] || {};
  const services = children['Service.v1'] || {};

  const observedService = services[bgd.spec.service.metadata.name];
  let activeColor = (observedService && observedService.spec && observedService.spec.selector &&
    observedService.spec.selector.color) || 'blue';
  const active = sets[`${name}-${activeColor}`];
  const inactive = sets[`${name}-${other(activeColor)}`];

  // Status reports what was observed, before any decision.
  const status = {
    activeColor,
    active: active ? active.status : {},
    inactive: inactive ? inactive.status : {},
  };

  // Where each ReplicaSet should be, starting from where it is.
  let activeReplicas = active ? active.spec.replicas : bgd.spec.replicas;
  let activeTemplate = active ? templateOf(active) : bgd.spec.template;
  let inactiveReplicas = inactive ? inactive.spec.replicas : 0;
  let inactiveTemplate = inactive ? templateOf(inactive) : bgd.spec.template;

  if (isCurrent(bgd, active)) {
    // Nothing to roll out: make sure the old color is scaled down.
    inactiveReplicas = 0;
  } else if (isCurrent(bgd, inactive)) {
    // A rollout in progress on the inactive color: bring it to full size...
    inactiveReplicas = bgd.spec.replicas;
    // ...and swap once every replica of it is available.
    if (inactive.status && inactive.status.availableReplicas === bgd.spec.replicas) {
      activeColor = other(activeColor);
      [activeReplicas, inactiveReplicas] = [inactiveReplicas, activeReplicas];
      [activeTemplate, inactiveTemplate] = [inactiveTemplate, activeTemplate];
    }
  } else if (inactive && inactive.spec.replicas === 0 && inactive.status && inactive.status.replicas === 0) {
    // A new template, and the inactive color is idle: start the rollout there.
    inactiveReplicas = bgd.spec.replicas;
    inactiveTemplate = bgd.spec.template;
  } else {
    // A new template while another rollout was under way (or no inactive ReplicaSet yet):
    // scale the inactive color down first; the rollout starts once it is empty.
    inactiveReplicas = 0;
  }

  return {
    status,
    children: [
      service(bgd, activeColor),
      replicaSet(bgd, activeColor, activeReplicas, activeTemplate),
      replicaSet(bgd, other(activeColor), inactiveReplicas, inactiveTemplate),
    ],
  };
}

module.exports = async function (context) {
  const observed = context.request.body;
  let desired;
  try {
    desired = sync(observed);
  } catch (err) {
    return {status: 500, body: String((err && err.stack) || err)};
  }
  return {status: 200, body: desired, headers: {'Content-Type': 'application/json'}};
};
