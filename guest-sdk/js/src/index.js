// The wasmop guest SDK for JavaScript: write a Kubernetes reconciler, ship it as a Wasm
// component (built with componentize-js: scripts/js-module.sh, or a project's build.sh).
//
//   import { Gvk, Metadata, Response, k8s } from 'wasmop-sdk';
//
//   const GREETING = new Gvk('example.wasmop.dev/v1', 'Greeting');
//
//   export default {
//     metadata() {
//       return new Metadata('greeter', '0.1.0').primary(GREETING).owns(k8s.CONFIG_MAP);
//     },
//     reconcile(request) {
//       const greeting = request.primary;
//       return Response.complete(request).child({
//         apiVersion: 'v1', kind: 'ConfigMap',
//         metadata: { name: `${greeting.metadata.name}-greeting` },
//         data: { message: greeting.spec.message },
//       });
//     },
//   };
//
// The module's default export is the reconciler; the build wraps it into the component's
// `wasmop:reconciler/guest` export. Natively, `wasmop-sdk/testing`'s Harness runs it under
// `node --test`. The contract is the WIT package `wasmop:reconciler@0.1.0`.
export * as k8s from './k8s.js';
export * as log from './log.js';
export { ReconcileError } from './errors.js';
export { Gvk, Mapping, Metadata, ObjectRef, RelatedKind, Selector, SelectorOperator } from './kinds.js';
export { Context, Operation, Request, TriggerKind, ValidateRequest } from './request.js';
export {
  ActionKind,
  Condition,
  ConditionStatus,
  Event,
  EventType,
  Finalized,
  Propagation,
  Response,
  Validation,
} from './response.js';

/** The version of the WIT package this SDK implements. */
export const WIT_PACKAGE = 'wasmop:reconciler@0.1.0';
