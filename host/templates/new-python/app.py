"""{{name}}: a ``{{Kind}}`` ({{group}}/v1) becomes a ConfigMap holding its ``spec.message``.

Start here: change the spec, the children and the status to what your operator manages. The
host hands ``reconcile`` the primary (desired state) and the children it observes (actual
state); the module answers with intents. ``Response.complete`` makes every owned kind a complete
set: children not added again are pruned.
"""

from wasmop_sdk import Condition, Gvk, Metadata, Reconciler, Request, Response, export, k8s

PRIMARY = Gvk("{{group}}/v1", "{{Kind}}")


def config_map(primary) -> dict:
    """The ConfigMap of a {{Kind}}: named after it, carrying its ``spec.message``."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": primary.name},
        "data": {"message": primary.spec["message"]},
    }


class {{Kind}}Reconciler(Reconciler):
    def metadata(self) -> Metadata:
        return Metadata("{{name}}", "0.1.0").primary(PRIMARY).owns(k8s.CONFIG_MAP)

    def reconcile(self, request: Request) -> Response:
        primary = request.primary
        return (
            Response.complete(request)
            .child(config_map(primary))
            .with_status({"configMap": primary.name})
            .condition(Condition.new("Ready", True).with_reason("Rendered"))
        )


# What componentize-py exports (natively, under pytest, the reconciler class itself).
Guest = export({{Kind}}Reconciler)
