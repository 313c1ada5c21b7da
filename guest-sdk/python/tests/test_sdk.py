"""The SDK natively: the response builder, requests, the harness, logging."""

from datetime import timedelta

import pytest

from wasmop_sdk import (
    Condition,
    ConditionStatus,
    Error,
    Event,
    Gvk,
    Mapping,
    Metadata,
    ObjectRef,
    Reconciler,
    RelatedKind,
    Response,
    Selector,
    SelectorOperator,
    Validation,
    export,
    k8s,
    log,
)
from wasmop_sdk.testing import Harness

GREETING = Gvk("example.wasmop.dev/v1", "Greeting")
PRIMARY = """
apiVersion: example.wasmop.dev/v1
kind: Greeting
metadata: {name: hi, namespace: default}
spec: {message: hello}
"""


class Greeter(Reconciler):
    def metadata(self):
        return (
            Metadata("greeter", "0.1.0")
            .primary(GREETING)
            .owns(k8s.CONFIG_MAP, k8s.SECRET)
            .related(RelatedKind(k8s.NAMESPACE).mapped(Mapping.ALL_PRIMARIES))
        )

    def reconcile(self, request):
        greeting = request.primary
        log.info(f"greeting {greeting.name}")
        return (
            Response.complete(request)
            .child({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": f"{greeting.name}-greeting"},
                    "data": {"message": greeting.spec["message"],
                             "namespaces": ",".join(n.name for n in request.related(k8s.NAMESPACE))}})
            .condition(Condition.new("Ready", False))
            .condition(Condition.new("Ready", True).with_reason("Greeted"))
            .event(Event.normal("Greeted", "said hello"))
            .requeue_after(30)
        )


def test_the_harness_runs_a_reconciler_on_yaml_and_collects_its_logs():
    h = Harness(Greeter).primary_yaml(PRIMARY).observed_yaml(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n"
    )
    out = h.reconcile()
    (cm,) = out.children(k8s.CONFIG_MAP)
    assert cm.name == "hi-greeting" and cm["data"] == {"message": "hello", "namespaces": "a,b"}
    # complete: the Secret set is declared (empty: every existing Secret child is pruned).
    assert [k for k, _ in out.child_sets] == [k8s.CONFIG_MAP, k8s.SECRET]
    assert out.children(k8s.SECRET) == []
    assert out.condition_of("Ready") == Condition(
        "Ready", ConditionStatus.TRUE, "Greeted", ""
    )
    assert len(out.status.conditions) == 1
    assert out.requeue == timedelta(seconds=30)
    assert h.logs == [(log.Level.INFO, "greeting hi")]


def test_an_observed_kind_the_module_neither_owns_nor_relates_is_a_fixture_error():
    with pytest.raises(ValueError, match="neither owned nor related"):
        Harness(Greeter).observed({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}})


def test_a_primary_of_another_kind_is_a_fixture_error():
    with pytest.raises(ValueError, match="reconciles example.wasmop.dev/v1/Greeting"):
        Harness(Greeter).primary({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}})


def test_a_child_of_a_kind_not_owned_or_without_a_name_fails_like_the_host():
    class Bad(Greeter):
        def reconcile(self, request):
            return Response().child({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})

    with pytest.raises(Error, match="does not own"):
        Harness(Bad).primary_yaml(PRIMARY).reconcile()

    class Nameless(Greeter):
        def reconcile(self, request):
            return Response().child({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}})

    with pytest.raises(Error, match="no metadata.name"):
        Harness(Nameless).primary_yaml(PRIMARY).reconcile()


def test_a_child_without_a_kind_is_refused_by_the_builder():
    with pytest.raises(Error, match="no apiVersion or kind"):
        Response().child({"metadata": {"name": "x"}})


def test_a_malformed_primary_is_an_error_naming_it():
    from wasmop_sdk import Context, Request

    with pytest.raises(Error, match="the primary is not JSON"):
        _ = Request("{", [], [], Context()).primary


def test_validation_warnings_and_denials():
    assert Validation.allow().warn("careful").warnings == ["careful"]
    denied = Validation.deny("no", "spec.x").warn("ignored")
    assert (denied.allowed, denied.message, denied.field, denied.warnings) == (False, "no", "spec.x", [])


def test_selectors_match_like_kubernetes():
    s = Selector().label("app", "db").requirement("tier", SelectorOperator.IN, ["a", "b"])
    assert s.matches({"app": "db", "tier": "a"})
    assert not s.matches({"app": "db", "tier": "c"})
    assert not s.matches({"tier": "a"})
    assert Selector().requirement("x", SelectorOperator.DOES_NOT_EXIST).matches({})


def test_export_outside_a_component_returns_the_reconciler():
    assert export(Greeter) is Greeter


def test_object_refs():
    ref = ObjectRef.from_object({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "n"}})
    assert ref == ObjectRef("v1", "ConfigMap", "a", "n") and ref.gvk() == k8s.CONFIG_MAP
