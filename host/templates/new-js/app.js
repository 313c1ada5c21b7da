// {{name}}: a `{{Kind}}` ({{group}}/v1) becomes a ConfigMap holding its `spec.message`.
//
// Start here: change the spec, the children and the status to what your operator manages. The
// host hands `reconcile` the primary (desired state) and the children it observes (actual
// state); the module answers with intents. `Response.complete` makes every owned kind a complete
// set: children not added again are pruned.
import { Condition, Gvk, Metadata, Response, k8s } from 'wasmop-sdk';

export const PRIMARY = new Gvk('{{group}}/v1', '{{Kind}}');

/** The ConfigMap of a {{Kind}}: named after it, carrying its `spec.message`. */
export function configMap(primary) {
  return {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name: primary.metadata.name },
    data: { message: primary.spec.message },
  };
}

// The module's default export is the reconciler (the build makes it the component's export).
export default {
  metadata() {
    return new Metadata('{{name}}', '0.1.0').primary(PRIMARY).owns(k8s.CONFIG_MAP);
  },

  reconcile(request) {
    const primary = request.primary;
    return Response.complete(request)
      .child(configMap(primary))
      .withStatus({ configMap: primary.metadata.name })
      .condition(Condition.of('Ready', true).withReason('Rendered'));
  },
};
