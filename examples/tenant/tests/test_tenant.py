"""tenant, tested natively with the SDK's harness (no Wasm, no cluster) on the fixture files
`wasmop test` reads: the children, the status, pruning, and the admission check on quotas."""

from pathlib import Path

import pytest

from tenant import TENANT_LABEL, Tenants
from wasmop_sdk import ConditionStatus, Error, EventType, k8s
from wasmop_sdk.testing import Harness, yaml_documents

FIXTURES = Path(__file__).parent.parent / "fixtures"


def cr() -> dict:
    return yaml_documents((FIXTURES / "cr.yaml").read_text())[0]


def observed() -> Harness:
    return (
        Harness(Tenants)
        .primary_file(FIXTURES / "cr.yaml")
        .observed_file(FIXTURES / "observed" / "namespace.yaml")
        .observed_file(FIXTURES / "observed" / "quota.yaml")
    )


def test_a_new_tenant_gets_its_namespace_and_the_four_objects_in_it():
    out = Harness(Tenants).primary_file(FIXTURES / "cr.yaml").reconcile()
    (ns,) = out.children(k8s.NAMESPACE)
    assert ns.name == "acme" and ns.labels[TENANT_LABEL] == "acme"
    for kind in (k8s.RESOURCE_QUOTA, k8s.LIMIT_RANGE, k8s.NETWORK_POLICY, k8s.ROLE_BINDING):
        (child,) = out.children(kind)
        assert child.namespace == "acme", kind
    ready = out.condition_of("Ready")
    assert ready.status is ConditionStatus.FALSE and ready.reason == "Provisioning"
    assert [e.reason for e in out.events] == ["Provisioning"]
    assert out.status.fields["phase"] == "Pending"


def test_the_quota_and_defaults_follow_the_spec():
    out = observed().reconcile()
    (quota,) = out.children(k8s.RESOURCE_QUOTA)
    assert quota.spec["hard"] == {"requests.cpu": "8", "requests.memory": "16Gi", "pods": "40"}
    (limits,) = out.children(k8s.LIMIT_RANGE)
    assert limits.spec["limits"][0]["defaultRequest"] == {"cpu": "250m", "memory": "128Mi"}


def test_admins_are_bound_to_the_admin_cluster_role_in_the_namespace_only():
    (binding,) = observed().reconcile().children(k8s.ROLE_BINDING)
    assert binding["roleRef"]["name"] == "admin" and binding["roleRef"]["kind"] == "ClusterRole"
    assert [(s["kind"], s["name"]) for s in binding["subjects"]] == [
        ("Group", "acme-admins"),
        ("User", "jane@acme.example"),
    ]


def test_ingress_comes_only_from_the_tenant_and_the_namespaces_it_names():
    (policy,) = observed().reconcile().children(k8s.NETWORK_POLICY)
    (rule,) = policy.spec["ingress"]
    (peer,) = rule["from"]
    (expr,) = peer["namespaceSelector"]["matchExpressions"]
    assert expr["values"] == ["acme", "ingress-nginx"]


def test_an_active_namespace_is_ready_and_the_status_reports_the_quota_usage():
    harness = observed()
    out = harness.reconcile()
    assert out.condition_of("Ready").status is ConditionStatus.TRUE
    assert out.status.fields == {
        "namespace": "acme",
        "phase": "Active",
        "used": {"cpu": "3500m", "memory": "6Gi", "pods": "14"},
    }
    assert out.events == []
    assert [line for _, line in harness.logs] == [
        "tenant acme: namespace Active, usage {'cpu': '3500m', 'memory': '6Gi', 'pods': '14'}"
    ]


def test_a_stale_owned_quota_is_pruned_by_the_complete_set():
    out = observed().reconcile()
    assert [q.name for q in out.children(k8s.RESOURCE_QUOTA)] == ["tenant-quota"]


def test_an_unknown_quota_key_fails_the_reconcile_with_a_clear_error():
    tenant = cr()
    tenant["spec"]["quota"]["gpus"] = "2"
    with pytest.raises(Error, match="unknown keys"):
        Harness(Tenants).primary(tenant).reconcile()


def test_a_quota_shrink_below_usage_is_refused_at_admission():
    new = yaml_documents((FIXTURES / "validate" / "shrink.yaml").read_text())[0]
    verdict = Harness(Tenants).validate(new, old=cr())
    assert not verdict.allowed
    assert verdict.field == "spec.quota.memory"
    assert "below the current usage 6Gi" in verdict.message


def test_a_shrink_down_to_usage_and_a_growth_are_allowed():
    new = cr()
    new["spec"]["quota"]["memory"] = "6144Mi"  # exactly the 6Gi in use
    new["spec"]["quota"]["cpu"] = "3000m"
    assert Harness(Tenants).validate(new, old=cr()).allowed
    new["spec"]["quota"]["pods"] = "400"
    assert Harness(Tenants).validate(new, old=cr()).allowed


def test_creation_checks_the_quantities():
    new = cr()
    new["spec"]["quota"]["cpu"] = "lots"
    verdict = Harness(Tenants).validate(new)
    assert not verdict.allowed and verdict.field == "spec.quota.cpu"
    assert Harness(Tenants).validate(cr()).allowed


def test_warning_events_are_not_emitted_in_the_steady_state():
    assert all(e.type is not EventType.WARNING for e in observed().reconcile().events)
