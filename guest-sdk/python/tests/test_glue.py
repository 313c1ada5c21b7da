"""The conversions to and from componentize-py's generated bindings, run natively: the bindings
are plain Python, generated here from wit/reconciler.wit by the pinned componentize-py."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WIT = Path(__file__).resolve().parents[3] / "wit" / "reconciler.wit"


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    tool = shutil.which("componentize-py") or str(Path(sys.executable).parent / "componentize-py")
    out = tmp_path_factory.mktemp("bindings")
    subprocess.run([tool, "-d", str(WIT), "-w", "module", "bindings", str(out)], check=True)
    sys.path.insert(0, str(out))
    from wasmop_sdk import log

    # The generated `host.log` is a stub outside a component.
    log.set_sink(lambda level, message: None)
    try:
        from wasmop_sdk import _glue
        from wit_world.imports import types as wit

        yield _glue, wit
    finally:
        log.set_sink(None)
        sys.path.remove(str(out))
        for name in [m for m in sys.modules if m.split(".")[0] in ("wit_world", "componentize_py_types")]:
            del sys.modules[name]


def request(wit, primary: dict):
    return wit.ReconcileRequest(
        primary=json.dumps(primary),
        owned=[wit.OwnedObjects(kind=wit.Gvk("v1", "ConfigMap"), objects=[])],
        related=[],
        context=wit.Context(
            reconciler="r", trigger=wit.Trigger_ChildChanged(wit.ObjectRef("v1", "ConfigMap", "n", "x")),
            attempt=2, config='{"a": 1}', now_unix_ms=5,
        ),
    )


def test_a_reconciler_is_exported_with_metadata_and_typed_responses(glue):
    _glue, wit = glue
    from test_sdk import Greeter

    from wasmop_sdk import TriggerKind

    guest = _glue.export(Greeter)()
    meta = guest.metadata()
    assert meta.primary == wit.Gvk("example.wasmop.dev/v1", "Greeting")
    assert isinstance(meta.related[0].maps_to, wit.RelatedMapping_AllPrimaries)
    req = request(wit, {"apiVersion": "example.wasmop.dev/v1", "kind": "Greeting",
                        "metadata": {"name": "hi"}, "spec": {"message": "m"}})
    converted = _glue.request_from(req)
    assert converted.context.trigger.kind is TriggerKind.CHILD_CHANGED
    assert converted.context.trigger.object.name == "x" and converted.config() == {"a": 1}
    out = guest.reconcile(req)
    assert [c.kind.kind for c in out.children] == ["ConfigMap"]  # the owned kinds of the request
    assert json.loads(out.children[0].objects[0])["metadata"]["name"] == "hi-greeting"
    assert out.status.conditions[0].status == wit.ConditionStatus.TRUE
    assert out.requeue_after_ms == 30000
    assert out.events[0].type == wit.EventType.NORMAL


def test_a_failing_reconcile_is_a_reconcile_error_not_a_trap(glue):
    _glue, wit = glue
    from componentize_py_types import Err
    from test_sdk import Greeter

    guest = _glue.export(Greeter)()
    with pytest.raises(Err) as failure:
        guest.reconcile(request(wit, {"apiVersion": "example.wasmop.dev/v1", "kind": "Greeting",
                                      "metadata": {"name": "hi"}, "spec": {}}))
    message = failure.value.value.message
    assert message.startswith("KeyError at test_sdk.py:"), message
    assert "'message'" not in message, message


def test_an_exceptions_text_does_not_reach_the_host_it_may_carry_values(glue):
    _glue, wit = glue
    from componentize_py_types import Err
    from wasmop_sdk import Reconciler

    class Leaky(Reconciler):
        def reconcile(self, request):
            password = request.primary.spec["password"]
            return int(password)  # ValueError: invalid literal for int() ...: 'hunter2'

    guest = _glue.export(Leaky)()
    with pytest.raises(Err) as failure:
        guest.reconcile(request(wit, {"apiVersion": "example.wasmop.dev/v1", "kind": "Greeting",
                                      "metadata": {"name": "hi"}, "spec": {"password": "hunter2"}}))
    message = failure.value.value.message
    assert "hunter2" not in message, message
    assert message.startswith("ValueError at test_glue.py:"), message


def test_validate_verdicts_cross_as_variants(glue):
    _glue, wit = glue
    from wasmop_sdk import Metadata, Reconciler, Validation

    class Strict(Reconciler):
        def metadata(self):
            return Metadata("strict", "1").validates()

        def validate(self, request):
            if request.old is None:
                return Validation.allow().warn("new")
            return Validation.deny("no changes", "spec")

    guest = _glue.export(Strict)()
    created = guest.validate(wit.ValidateRequest(wit.Operation.CREATE, None, "{}", "{}"))
    assert created == wit.ValidateResponse_Allowed(["new"])
    changed = guest.validate(wit.ValidateRequest(wit.Operation.UPDATE, "{}", "{}", "{}"))
    assert changed == wit.ValidateResponse_Denied(wit.Denial("no changes", "spec"))
