// CatSet: StatefulSet rebuilt from plain Pods and PersistentVolumeClaims, as a Metacontroller
// CompositeController hook (sync and finalize share this handler: the controller sends both to
// /sync, and the request's `finalizing` says which one it is).
//
// Fission-style function: `context.request.body` is what Metacontroller POSTs (parent, children
// grouped as `Pod.v1` / `PersistentVolumeClaim.v1` and keyed by name); the answer is
// `{status, body}`. No requires: the same file runs under Metacontroller's nodejs-server and as a
// wasmop hook module.
//
// Behaviour (Metacontroller's examples/catset):
// - Pods `<catset>-<ordinal>` from `spec.template`, hostname = the Pod's name, subdomain =
//   `spec.serviceName`, one volume per claim template bound to claim `<template>-<pod>`.
// - Scale up one Pod at a time: the next ordinal only once every lower one is Running and Ready.
// - Scale down one Pod at a time, highest ordinal first, only once the wanted ones are Ready.
// - Claims `<template>-<catset>-<ordinal>` for every ordinal below `spec.replicas`; claims of
//   higher ordinals (left by a scale-down) are kept, and go with the CatSet.
// - Finalize: scale to zero the same way; `finalized` once no Pod of the CatSet is left.
// - Status: `replicas` (Pods observed) and `readyReplicas` (leading Running-and-Ready ordinals).

'use strict';

function clone(value) {
  return value === undefined ? undefined : JSON.parse(JSON.stringify(value));
}

// The status of condition `type` on `obj`, or 'Unknown' when it has none.
function conditionStatus(obj, type) {
  const conditions = (obj && obj.status && obj.status.conditions) || [];
  const found = conditions.find((c) => c && c.type === type);
  return found ? found.status : 'Unknown';
}

function runningAndReady(pod) {
  return Boolean(pod) &&
    Boolean(pod.status) && pod.status.phase === 'Running' &&
    !(pod.metadata && pod.metadata.deletionTimestamp) &&
    conditionStatus(pod, 'Ready') === 'True';
}

// `<base>-<n>` -> n; anything else (another base, no number) -> -1.
function ordinalOf(base, name) {
  const match = /^(.*)-(\d+)$/.exec(name || '');
  if (!match || match[1] !== base) return -1;
  return parseInt(match[2], 10);
}

function podFor(catset, ordinal) {
  const pod = clone(catset.spec.template) || {};
  const name = `${catset.metadata.name}-${ordinal}`;
  pod.apiVersion = 'v1';
  pod.kind = 'Pod';
  pod.metadata = pod.metadata || {};
  pod.metadata.name = name;
  pod.spec = pod.spec || {};
  pod.spec.hostname = name;
  pod.spec.subdomain = catset.spec.serviceName;
  const claimTemplates = catset.spec.volumeClaimTemplates;
  if (claimTemplates) {
    pod.spec.volumes = pod.spec.volumes || [];
    for (const template of claimTemplates) {
      pod.spec.volumes.push({
        name: template.metadata.name,
        persistentVolumeClaim: {claimName: `${template.metadata.name}-${name}`},
      });
    }
  }
  return pod;
}

function claimFor(name, template) {
  const claim = clone(template);
  claim.apiVersion = 'v1';
  claim.kind = 'PersistentVolumeClaim';
  claim.metadata = claim.metadata || {};
  claim.metadata.name = name;
  return claim;
}

function sync(request) {
  const catset = request.parent;
  const name = catset.metadata.name;
  const children = request.children || {};
  // Finalizing: the CatSet is being deleted, so it wants no Pods at all.
  const replicas = request.finalizing ? 0 : (catset.spec.replicas || 0);

  // The CatSet's Pods, by ordinal (Pods of other names are not ours to reason about).
  const observed = new Map();
  for (const pod of Object.values(children['Pod.v1'] || {})) {
    const ordinal = ordinalOf(name, pod.metadata && pod.metadata.name);
    if (ordinal >= 0) observed.set(ordinal, pod);
  }

  // Ordinals 0..ready-1 are all Running and Ready (never counting past the wanted replicas).
  let ready = 0;
  while (ready < replicas && runningAndReady(observed.get(ready))) ready++;

  const desired = {
    status: {replicas: observed.size, readyReplicas: ready},
    children: [],
  };
  if (request.finalizing) desired.finalized = observed.size === 0;

  // Every Pod that exists stays (in its desired form)...
  const wanted = new Set(observed.keys());
  // ...plus the next missing ordinal, once all lower ones are Ready...
  if (ready < replicas) wanted.add(ready);
  // ...minus the highest ordinal above the wanted count, once all wanted ones are Ready.
  if (ready === replicas && wanted.size > 0) {
    const highest = Math.max(...wanted);
    if (highest >= replicas) wanted.delete(highest);
  }
  // Highest ordinal first: Metacontroller's rolling update goes through children in list order.
  for (const ordinal of [...wanted].sort((a, b) => b - a)) {
    desired.children.push(podFor(catset, ordinal));
  }

  const claimTemplates = catset.spec.volumeClaimTemplates;
  if (claimTemplates) {
    const observedClaims = Object.values(children['PersistentVolumeClaim.v1'] || {});
    for (const template of claimTemplates) {
      const base = `${template.metadata.name}-${name}`;
      for (let ordinal = 0; ordinal < replicas; ordinal++) {
        desired.children.push(claimFor(`${base}-${ordinal}`, template));
      }
      // Claims above the wanted count survive a scale-down; they are removed with the CatSet.
      for (const claim of observedClaims) {
        const claimName = claim.metadata && claim.metadata.name;
        if (ordinalOf(base, claimName) >= replicas) {
          desired.children.push(claimFor(claimName, template));
        }
      }
    }
  }
  return desired;
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
