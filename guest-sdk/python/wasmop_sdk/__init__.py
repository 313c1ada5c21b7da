"""The wasmop guest SDK for Python: write a Kubernetes reconciler, ship it as a Wasm component.

The same concepts and names as the Rust SDK (``guest-sdk/src``)::

    from wasmop_sdk import Gvk, Metadata, Reconciler, Response, export, k8s

    GREETING = Gvk("example.wasmop.dev/v1", "Greeting")

    class Greeter(Reconciler):
        def metadata(self):
            return Metadata("greeter", "0.1.0").primary(GREETING).owns(k8s.CONFIG_MAP)

        def reconcile(self, request):
            greeting = request.primary
            return Response.complete(request).child({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"{greeting.name}-greeting"},
                "data": {"message": greeting.spec["message"]},
            })

    Guest = export(Greeter)   # what componentize-py exports

Natively, ``wasmop_sdk.testing.Harness`` runs it under pytest on the fixture files that
``wasmop test`` reads. The contract is the WIT package ``wasmop:reconciler@0.1.0``.
"""

from . import k8s, log
from .errors import Error
from .kinds import (
    Gvk,
    Mapping,
    Metadata,
    ObjectRef,
    RelatedKind,
    Selector,
    SelectorOperator,
    SelectorRequirement,
)
from .reconciler import Reconciler
from .request import Context, Object, Operation, Request, Trigger, TriggerKind, ValidateRequest
from .response import (
    Action,
    ActionKind,
    Condition,
    ConditionStatus,
    Event,
    EventType,
    Finalized,
    Propagation,
    Response,
    Status,
    Validation,
)

WIT_PACKAGE = "wasmop:reconciler@0.1.0"
"""The version of the WIT package this SDK implements."""


def export(reconciler: type) -> type:
    """The ``Guest`` class componentize-py exports for a ``Reconciler`` subclass.

    Write ``Guest = export(MyReconciler)`` at the top level of the module's app file. Natively
    (no ``wit_world`` bindings, as under pytest) it returns the reconciler class unchanged.
    """
    import importlib.util

    if importlib.util.find_spec("wit_world") is None:
        return reconciler
    from ._glue import export as glue_export

    return glue_export(reconciler)


__all__ = [
    "Action", "ActionKind", "Condition", "ConditionStatus", "Context", "Error", "Event", "EventType",
    "Finalized", "Gvk", "Mapping", "Metadata", "Object", "ObjectRef", "Operation", "Propagation",
    "Reconciler", "RelatedKind", "Request", "Response", "Selector", "SelectorOperator",
    "SelectorRequirement", "Status", "Trigger", "TriggerKind", "ValidateRequest", "Validation",
    "WIT_PACKAGE", "export", "k8s", "log",
]
