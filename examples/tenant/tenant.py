"""tenant: namespace onboarding. A cluster-scoped ``Tenant`` gets a Namespace with a
ResourceQuota, a LimitRange (default requests, so every pod counts against the quota), a
NetworkPolicy (ingress only from the tenant's own namespace and the namespaces it names) and a
RoleBinding giving the tenant's admins the ``admin`` ClusterRole there. The status reports the
quota's current usage; ``validate`` refuses at admission a quota shrink below that usage.

The Tenant is cluster-scoped because it creates a Namespace: a namespaced primary may not
create cluster-scoped objects (docs/operating.md, "What a module may touch").
"""

from wasmop_sdk import (
    Condition,
    Error,
    Event,
    Gvk,
    Metadata,
    Reconciler,
    Request,
    Response,
    Validation,
    ValidateRequest,
    export,
    k8s,
    log,
)

from quantity import parse_quantity

TENANT = Gvk("example.wasmop.dev/v1", "Tenant")
# The label every object of a tenant carries (besides the host's `wasmop.dev/reconciler`).
TENANT_LABEL = "example.wasmop.dev/tenant"
# spec.quota key -> ResourceQuota `hard` key.
QUOTA_KEYS = {"cpu": "requests.cpu", "memory": "requests.memory", "pods": "pods", "storage": "requests.storage"}
DEFAULT_REQUESTS = {"cpu": "100m", "memory": "128Mi"}


def _labels(tenant: str) -> dict:
    return {"app.kubernetes.io/managed-by": "wasmop", TENANT_LABEL: tenant}


def _quota_spec(tenant) -> dict:
    quota = tenant.spec.get("quota") or {}
    unknown = sorted(set(quota) - set(QUOTA_KEYS))
    if unknown:
        raise Error(f"spec.quota has unknown keys {unknown}; known: {sorted(QUOTA_KEYS)}")
    return {QUOTA_KEYS[k]: str(v) for k, v in sorted(quota.items())}


def _subjects(tenant) -> list:
    subjects = []
    for admin in tenant.spec.get("admins") or []:
        kind = admin.get("kind", "Group")
        subject = {"kind": kind, "name": admin["name"]}
        if kind in ("User", "Group"):
            subject["apiGroup"] = "rbac.authorization.k8s.io"
        else:
            subject["namespace"] = admin.get("namespace", tenant.name)
        subjects.append(subject)
    return subjects


def desired_children(tenant) -> list:
    """The Namespace and the four namespaced objects in it."""
    ns, labels = tenant.name, _labels(tenant.name)
    defaults = {**DEFAULT_REQUESTS, **(tenant.spec.get("defaultRequests") or {})}
    allow_from = [ns] + [n for n in tenant.spec.get("allowFrom") or [] if n != ns]
    meta = {"name": ns, "namespace": ns, "labels": labels}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}},
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {**meta, "name": "tenant-quota"},
         "spec": {"hard": _quota_spec(tenant)}},
        {"apiVersion": "v1", "kind": "LimitRange", "metadata": {**meta, "name": "tenant-defaults"},
         "spec": {"limits": [{"type": "Container", "defaultRequest": defaults}]}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": {**meta, "name": "tenant-isolation"},
         "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": [
             {"namespaceSelector": {"matchExpressions": [
                 {"key": "kubernetes.io/metadata.name", "operator": "In", "values": allow_from}]}}]}]}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {**meta, "name": "tenant-admins"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
         "subjects": _subjects(tenant)},
    ]


def _usage(request: Request, namespace: str) -> dict:
    """The observed quota's usage, by spec.quota key."""
    for quota in request.owned(k8s.RESOURCE_QUOTA):
        if quota.namespace == namespace and quota.name == "tenant-quota":
            used = quota.status.get("used") or {}
            return {k: str(used[hard]) for k, hard in sorted(QUOTA_KEYS.items()) if hard in used}
    return {}


class Tenants(Reconciler):
    def metadata(self) -> Metadata:
        return (
            Metadata("tenant", "0.1.0")
            .primary(TENANT)
            .owns(k8s.NAMESPACE, k8s.RESOURCE_QUOTA, k8s.LIMIT_RANGE, k8s.NETWORK_POLICY, k8s.ROLE_BINDING)
            .validates()
        )

    def reconcile(self, request: Request) -> Response:
        tenant = request.primary
        ns = tenant.name
        response = Response.complete(request)
        for child in desired_children(tenant):
            response.child(child)
        namespaces = [n for n in request.owned(k8s.NAMESPACE) if n.name == ns]
        phase = namespaces[0].status.get("phase", "Pending") if namespaces else "Pending"
        used = _usage(request, ns)
        response.with_status({"namespace": ns, "phase": phase, "used": used})
        if phase == "Active":
            response.condition(Condition.new("Ready", True).with_reason("Provisioned")
                               .with_message(f"namespace {ns} is active with its quota, defaults, isolation and admins"))
        else:
            response.condition(Condition.new("Ready", False).with_reason("Provisioning")
                               .with_message(f"waiting for namespace {ns} to be active (phase {phase})"))
        if not namespaces:
            response.event(Event.normal("Provisioning", f"creating namespace {ns}").with_action("Provision"))
        log.info(f"tenant {ns}: namespace {phase}, usage {used}")
        return response

    def validate(self, request: ValidateRequest) -> Validation:
        new = request.new
        if len(new.name) > 63:
            return Validation.deny("a Tenant's name is its namespace's name: at most 63 characters", "metadata.name")
        quota = new.spec.get("quota") or {}
        for key, value in sorted(quota.items()):
            if key not in QUOTA_KEYS:
                return Validation.deny(f"unknown quota key {key!r}; known: {sorted(QUOTA_KEYS)}", f"spec.quota.{key}")
            try:
                parse_quantity(value)
            except ValueError as e:
                return Validation.deny(str(e), f"spec.quota.{key}")
        old = request.old
        if old is None:
            return Validation.allow()
        used = old.status.get("used") or {}
        for key, value in sorted(quota.items()):
            if key in used and parse_quantity(value) < parse_quantity(used[key]):
                return Validation.deny(
                    f"quota {key} {value} is below the current usage {used[key]} of namespace "
                    f"{new.name}; free resources there first, or choose at least {used[key]}",
                    f"spec.quota.{key}",
                )
        return Validation.allow()


Guest = export(Tenants)
