//! The Python example (`examples/tenant`) end to end on the real local control plane, shipped the
//! way a Python module ships: built with the pinned componentize-py (scripts/python-module.sh,
//! skipped when up to date), pushed to a real OCI registry (TLS, basic auth) and named by digest
//! in the example's own wasmreconciler.yaml.
//!
//! One test, in order: a Tenant converges (its Namespace, ResourceQuota, LimitRange,
//! NetworkPolicy and RoleBinding, and its status with the quota's usage); a quota shrink below
//! the usage of a pod in the tenant's namespace is refused at admission by the module's
//! `validate`, through the API server's webhook call, while a shrink above the usage passes; a
//! second build pushed and pinned hot-swaps, and the Tenant is reconciled by it.
//!
//! One test because Tenants are cluster-scoped: a second tenant reconciler would serve the first
//! one's Tenants too.

use std::time::Duration;

use crate::support::*;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{LimitRange, Namespace, Pod, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use wasmop::crd::{ActiveModule, WasmReconciler};
use wasmop::host::WebhookOptions;
use wasmop_testenv::{Registry, TestEnv, eventually};

/// Loading a never-seen 18 MB component (pull, check, compile) on a loaded machine takes tens of
/// seconds; wait for it longer than for an object.
const LOAD: Duration = Duration::from_secs(300);

async fn active(client: &Client, wr: &str) -> anyhow::Result<Option<ActiveModule>> {
    let api: Api<WasmReconciler> = Api::all(client.clone());
    Ok(api.get(wr).await?.status.and_then(|s| s.active_module))
}

/// The `Ready` condition of a Tenant: (status, reason).
fn ready(tenant: &DynamicObject) -> Option<(String, String)> {
    tenant.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
}

/// The default memory request of the tenant's LimitRange, once it exists.
async fn default_memory(limits: &Api<LimitRange>) -> anyhow::Result<Option<String>> {
    let Some(lr) = limits.get_opt("tenant-defaults").await? else {
        return Ok(None);
    };
    Ok(lr
        .spec
        .and_then(|s| s.limits.into_iter().next())
        .and_then(|l| l.default_request)
        .and_then(|d| d.get("memory").map(|q| q.0.clone())))
}

/// Patches the Tenant's quota; Err(status) when the API server refuses.
async fn set_quota(
    tenants: &Api<DynamicObject>,
    name: &str,
    quota: Value,
    dry_run: bool,
) -> anyhow::Result<Result<(), kube::core::Status>> {
    let params = PatchParams {
        dry_run,
        ..PatchParams::default()
    };
    match tenants
        .patch(
            name,
            &params,
            &Patch::Merge(json!({"spec": {"quota": quota}})),
        )
        .await
    {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(s)) => Ok(Err(*s)),
        Err(e) => Err(e.into()),
    }
}

#[tokio::test]
async fn the_python_tenant_from_the_registry_converges_refuses_a_shrink_below_usage_and_hot_swaps()
-> anyhow::Result<()> {
    let env = TestEnv::get("py-tenant").await?;
    let ns = env.namespace.clone();
    let registry = Registry::start().await?;

    // Build (or find up to date), push, pin by digest.
    let first = std::fs::read(tenant_module(TenantBuild::First).await?)?;
    assert!(
        first.len() > 1 << 20,
        "a Python component is larger than a ConfigMap holds ({} bytes)",
        first.len()
    );
    let first_sha = wasmop::engine::sha256_hex(&first);
    let d1 = oci_push(&registry, "mods/tenant:v1", first).await?;
    oci_pull_secret(&env, &registry, "registry").await?;
    let repo = format!("{}/mods/tenant", registry.host);
    let wr = register_tenant(
        &env,
        oci_module(&registry, &format!("{repo}@{d1}"), "registry"),
    )
    .await?;
    // A compiled cache that outlives the run: later runs load both tiers at once.
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("python/e2e-compiled");
    let host = start_host_with(&env, |o| {
        o.oci.namespace = Some(ns.clone());
        o.cache_dir = Some(cache);
        o.webhook = Some(WebhookOptions::new(([127, 0, 0, 1], 0).into()));
    })
    .await?;

    eventually("the tenant module active", LOAD, || async {
        Ok(active(&env.client, &wr)
            .await?
            .filter(|a| a.sha256 == first_sha))
    })
    .await?;
    wait_wr_ready(&env.client, &wr).await?;
    assert_eq!(
        active(&env.client, &wr).await?.and_then(|a| a.origin),
        Some(format!("oci {repo}@{d1}")),
        "the status names the registry the module came from"
    );

    // A Tenant (the example's, named for this test: its name is its namespace's).
    let tenants = tenants(&env.client);
    let name = format!("{ns}-acme");
    let mut tenant = example("tenant", "tenant.yaml")?.remove(0);
    tenant["metadata"]["name"] = json!(name);
    tenants
        .create(&PostParams::default(), &serde_json::from_value(tenant)?)
        .await?;

    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    let quotas: Api<ResourceQuota> = Api::namespaced(env.client.clone(), &name);
    let limits: Api<LimitRange> = Api::namespaced(env.client.clone(), &name);
    let policies: Api<NetworkPolicy> = Api::namespaced(env.client.clone(), &name);
    let bindings: Api<RoleBinding> = Api::namespaced(env.client.clone(), &name);
    let converged = eventually(
        "the Tenant Ready with its namespace Active",
        WAIT,
        || async {
            let t = tenants.get(&name).await?;
            let s = &t.data["status"];
            Ok((ready(&t) == Some(("True".into(), "Provisioned".into()))
                && s["namespace"] == json!(name)
                && s["phase"] == "Active")
                .then_some(t))
        },
    )
    .await?;
    let namespace = namespaces.get(&name).await?;
    let labels = namespace.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("example.wasmop.dev/tenant").map(String::as_str),
        Some(name.as_str())
    );
    let owner = namespace.metadata.owner_references.unwrap_or_default();
    assert_eq!(
        owner.first().map(|o| (o.kind.as_str(), o.uid.as_str())),
        Some((
            "Tenant",
            converged.metadata.uid.as_deref().unwrap_or_default()
        )),
        "the Namespace is the Tenant's child"
    );
    let hard = eventually("the ResourceQuota", WAIT, || async {
        Ok(quotas
            .get_opt("tenant-quota")
            .await?
            .and_then(|q| q.spec)
            .and_then(|s| s.hard))
    })
    .await?;
    let hard: Vec<(String, String)> = hard.into_iter().map(|(k, v)| (k, v.0)).collect();
    assert_eq!(
        hard,
        [
            ("pods".to_string(), "40".to_string()),
            ("requests.cpu".into(), "8".into()),
            ("requests.memory".into(), "16Gi".into())
        ]
    );
    // Each child is written on its own (a failed write does not stop the others): waited for.
    let memory = eventually("the LimitRange", WAIT, || async {
        default_memory(&limits).await
    })
    .await?;
    assert_eq!(memory, "128Mi");
    let policy = eventually("the NetworkPolicy", WAIT, || async {
        Ok(policies.get_opt("tenant-isolation").await?)
    })
    .await?;
    let allowed = serde_json::to_value(&policy.spec)?["ingress"][0]["from"][0]["namespaceSelector"]
        ["matchExpressions"][0]["values"]
        .clone();
    assert_eq!(allowed, json!([name, "ingress-nginx"]));
    let binding = eventually("the RoleBinding", WAIT, || async {
        Ok(bindings.get_opt("tenant-admins").await?)
    })
    .await?;
    assert_eq!(binding.role_ref.name, "admin");
    let subjects: Vec<(String, String)> = binding
        .subjects
        .unwrap_or_default()
        .into_iter()
        .map(|s| (s.kind, s.name))
        .collect();
    assert_eq!(subjects, [("Group".to_string(), "acme-admins".to_string())]);

    // Usage: a pod asking for 6Gi. The quota controller reports it, the module copies it into
    // the Tenant's status. (Pods are refused until the namespace's `default` ServiceAccount
    // exists; retry until then.)
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &name);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "worker"},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.27",
            "resources": {"requests": {"cpu": "3", "memory": "6Gi"}}}]}
    }))?;
    eventually(
        "the pod created in the tenant's namespace",
        WAIT,
        || async { Ok(Some(pods.create(&PostParams::default(), &pod).await?)) },
    )
    .await?;
    eventually("the usage in the Tenant's status", WAIT, || async {
        let t = tenants.get(&name).await?;
        let used = &t.data["status"]["used"];
        Ok((used["memory"] == "6Gi" && used["cpu"] == "3").then_some(()))
    })
    .await?;

    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
    eventually("the ValidatingWebhookConfiguration", WAIT, || async {
        Ok(vwcs.get_opt(&format!("wasmop-{wr}")).await?)
    })
    .await?;
    // The API server takes up a new webhook configuration within a moment: probe with dry runs
    // (no side effects) until the shrink is refused.
    let refusal = eventually("a shrink below usage refused", WAIT, || async {
        Ok(set_quota(&tenants, &name, json!({"memory": "4Gi"}), true)
            .await?
            .err())
    })
    .await?;
    assert!(
        refusal.message.contains("admission webhook")
            && refusal.message.contains(
                "spec.quota.memory: quota memory 4Gi is below the current usage 6Gi of namespace"
            ),
        "the API server relays the module's message with its field: {refusal:?}"
    );
    let real = set_quota(&tenants, &name, json!({"memory": "4Gi"}), false).await?;
    assert!(real.is_err(), "the shrink below usage must be refused");
    assert_eq!(
        tenants.get(&name).await?.data["spec"]["quota"]["memory"],
        "16Gi"
    );
    // A shrink that still covers the usage passes and reaches the ResourceQuota.
    set_quota(&tenants, &name, json!({"memory": "8Gi"}), false)
        .await?
        .map_err(|s| anyhow::anyhow!("a shrink above usage was refused: {s:?}"))?;
    eventually("the ResourceQuota at 8Gi", WAIT, || async {
        let hard = quotas
            .get("tenant-quota")
            .await?
            .spec
            .and_then(|s| s.hard)
            .unwrap_or_default();
        Ok((hard.get("requests.memory").map(|q| q.0.as_str()) == Some("8Gi")).then_some(()))
    })
    .await?;

    // A second build, pushed and pinned: swapped in while the first serves, and the Tenant is
    // reconciled by it (its default memory request is 256Mi).
    let second = std::fs::read(tenant_module(TenantBuild::Second).await?)?;
    let second_sha = wasmop::engine::sha256_hex(&second);
    assert_ne!(second_sha, first_sha);
    let d2 = oci_push(&registry, "mods/tenant:v2", second).await?;
    let wrs: Api<WasmReconciler> = Api::all(env.client.clone());
    wrs.patch(
        &wr,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"module": oci_module(&registry, &format!("{repo}@{d2}"), "registry")}})),
    )
    .await?;
    eventually("the second build active", LOAD, || async {
        Ok(active(&env.client, &wr)
            .await?
            .filter(|a| a.sha256 == second_sha))
    })
    .await?;
    // A hot swap, not a restart.
    wr_event(&env.client, &wr, "ModuleSwapped").await?;
    eventually("the LimitRange from the second build", WAIT, || async {
        Ok((default_memory(&limits).await?.as_deref() == Some("256Mi")).then_some(()))
    })
    .await?;
    let t = tenants.get(&name).await?;
    assert_eq!(
        ready(&t),
        Some(("True".into(), "Provisioned".into())),
        "the Tenant stays Ready across the swap"
    );
    assert_eq!(
        t.data["spec"]["quota"]["memory"], "8Gi",
        "the swap changed no spec"
    );

    tenants.delete(&name, &DeleteParams::default()).await?;
    host.shutdown().await?;
    env.passed()
}
