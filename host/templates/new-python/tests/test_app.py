"""{{name}}, tested natively with the SDK's harness (no Wasm, no cluster) on the fixture that
``wasmop test`` reads."""

from pathlib import Path

from {{crate}} import {{Kind}}Reconciler
from wasmop_sdk import ConditionStatus, k8s
from wasmop_sdk.testing import Harness

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_a_{{singular}}_becomes_a_config_map_with_its_message():
    out = Harness({{Kind}}Reconciler).primary_file(FIXTURES / "cr.yaml").reconcile()
    (cm,) = out.children(k8s.CONFIG_MAP)
    assert cm.name == "hello"
    assert cm["data"] == {"message": "hello, world"}
    assert out.status.fields == {"configMap": "hello"}
    ready = out.condition_of("Ready")
    assert ready.status is ConditionStatus.TRUE and ready.reason == "Rendered"
