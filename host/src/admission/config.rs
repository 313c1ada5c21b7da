//! The `ValidatingWebhookConfiguration` of each WasmReconciler whose module validates: built from
//! the WasmReconciler and the host's webhook address, applied and removed by the leader.
//!
//! One configuration per WasmReconciler, named `wasmop-<name>`, with one webhook
//! `<name>.validate.wasmop.dev`: CREATE and UPDATE of the primary kind's resource, the admission
//! policy of `spec.admission` (timeout, failure policy), `sideEffects: None`,
//! `admissionReviewVersions: [v1]`, and a namespace selector that leaves out the host's own
//! namespace (so a broken module cannot lock the host out), `kube-system` and `kube-node-lease`
//! (node heartbeats, leader elections), and keeps only `spec.namespaces` when set.
//!
//! # Guarantees
//! - No webhook covers Leases (`coordination.k8s.io`), whatever the WasmReconciler asks: a slow
//!   module must not stall heartbeats and leader elections.
//! - No webhook covers a Kubernetes built-in kind (the core group, groups without a dot such as
//!   `apps`, and `*.k8s.io`) unless the cluster administrator allowed that kind
//!   (`--webhook-builtin-kinds`); a refused configuration is removed if it existed.
//! - The configuration is owned by its WasmReconciler (ownerReference), so Kubernetes' garbage
//!   collector deletes it with the WasmReconciler even when no host runs.
//! - Writes are server-side applies with the host's field manager: re-applying is idempotent.
//!
//! # Errors
//! [`WebhookConfigError`] when the kind cannot be resolved or the API refuses a write.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::crd::{FIELD_MANAGER, WasmReconciler};
use crate::discovery::{Discovery, Resolved};

/// Where the API server reaches the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookTarget {
    /// A base URL (`https://127.0.0.1:9443`); the path `/validate/<name>` is appended.
    Url(String),
    /// A Service in the cluster.
    Service {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Its port.
        port: i32,
    },
}

/// Namespaces no webhook of the host covers: the cluster's own machinery.
pub const EXCLUDED_NAMESPACES: [&str; 2] = ["kube-system", "kube-node-lease"];

/// The Kubernetes built-in kinds the cluster administrator lets modules validate
/// (`--webhook-builtin-kinds`); every other built-in kind gets no webhook.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuiltinKinds {
    /// (group, kind), the core group as "".
    allowed: Vec<(String, String)>,
}

impl BuiltinKinds {
    /// Parses a comma-separated list of `Kind` (core group) or `group/Kind`, e.g.
    /// `ConfigMap,apps/Deployment`.
    ///
    /// # Errors
    /// An entry that is empty or names no kind.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut allowed = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (group, kind) = entry.rsplit_once('/').unwrap_or(("", entry));
            if kind.is_empty() || group.contains('/') {
                return Err(format!(
                    "{entry:?} is not `Kind` or `group/Kind` (e.g. ConfigMap, apps/Deployment)"
                ));
            }
            allowed.push((group.to_string(), kind.to_string()));
        }
        Ok(BuiltinKinds { allowed })
    }

    fn allows(&self, group: &str, kind: &str) -> bool {
        self.allowed.iter().any(|(g, k)| g == group && k == kind)
    }
}

/// Whether `group` is Kubernetes' own: the core group, a group without a dot (`apps`, `batch`,
/// `policy`), or one under `k8s.io`.
fn builtin_group(group: &str) -> bool {
    group.is_empty() || !group.contains('.') || group == "k8s.io" || group.ends_with(".k8s.io")
}

/// Why `group`/`kind` gets no webhook, if it does not.
fn refusal(group: &str, kind: &str, builtin: &BuiltinKinds) -> Option<String> {
    if group == "wasmop.dev" || group == "metacontroller.k8s.io" {
        return Some(format!(
            "{group}/{kind} never gets a webhook: a module must not stand in the way of the WasmReconcilers and controllers that configure wasmop (nor of their deletion)"
        ));
    }
    if group == "coordination.k8s.io" && kind == "Lease" {
        return Some(
            "Leases never get a webhook: node heartbeats and leader elections must not wait for a module".into(),
        );
    }
    (builtin_group(group) && !builtin.allows(group, kind)).then(|| {
        let name = if group.is_empty() { kind.to_string() } else { format!("{group}/{kind}") };
        format!("{name} is a Kubernetes built-in kind: it gets a webhook only if the cluster administrator lists it in --webhook-builtin-kinds")
    })
}

/// A failure to keep a configuration in sync.
#[derive(Debug, thiserror::Error)]
pub enum WebhookConfigError {
    /// The primary kind is not served.
    #[error("{0}")]
    Kind(#[from] crate::discovery::DiscoveryError),
    /// The API server refused.
    #[error("webhook configuration {name}: {source}")]
    Api {
        /// The configuration.
        name: String,
        /// The error.
        source: kube::Error,
    },
    /// The primary kind may not get a webhook (see [`BuiltinKinds`]).
    #[error("no webhook for WasmReconciler {name}: {reason}")]
    Refused {
        /// The WasmReconciler.
        name: String,
        /// Why.
        reason: String,
    },
    /// The built configuration does not deserialize (a bug).
    #[error("building webhook configuration {name}: {source}")]
    Build {
        /// The configuration.
        name: String,
        /// The error.
        source: serde_json::Error,
    },
}

/// The configuration's name for WasmReconciler `name`.
pub fn config_name(name: &str) -> String {
    format!("wasmop-{name}")
}

/// The URL path the host serves WasmReconciler `name`'s reviews on.
pub fn path(name: &str) -> String {
    format!("/validate/{name}")
}

/// Where the host's webhooks point and what they spare.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// Where the API server reaches the host.
    pub target: &'a WebhookTarget,
    /// The serving certificate's CA.
    pub ca_bundle_pem: &'a str,
    /// The host's own namespace.
    pub host_namespace: Option<&'a str>,
    /// The built-in kinds the administrator allowed.
    pub builtin: &'a BuiltinKinds,
}

/// Builds the configuration (pure).
///
/// # Errors
/// [`WebhookConfigError::Refused`] for Leases and built-in kinds not allowed.
pub fn build(
    wr: &WasmReconciler,
    resolved: &Resolved,
    scope: Scope<'_>,
) -> Result<Value, WebhookConfigError> {
    let Scope {
        target,
        ca_bundle_pem,
        host_namespace,
        builtin,
    } = scope;
    let name = wr.name_any();
    let rule = rule(wr, resolved, builtin, &["CREATE", "UPDATE"])?;
    let mut webhook = json!({
        "name": format!("{name}.validate.wasmop.dev"),
        "clientConfig": client_config(target, ca_bundle_pem, &path(&name)),
        "rules": [rule],
        "failurePolicy": wr.spec.admission.failure_policy.as_str(),
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": wr.spec.admission.timeout_seconds.clamp(1, 30),
        "matchPolicy": "Equivalent",
    });
    webhook["namespaceSelector"] = namespace_selector(wr, resolved, host_namespace);
    Ok(configuration(wr, "ValidatingWebhookConfiguration", webhook))
}

/// The rule a webhook of `wr` matches: `operations` on its primary kind's resource.
///
/// # Errors
/// [`WebhookConfigError::Refused`] for Leases and built-in kinds not allowed.
pub(super) fn rule(
    wr: &WasmReconciler,
    resolved: &Resolved,
    builtin: &BuiltinKinds,
    operations: &[&str],
) -> Result<Value, WebhookConfigError> {
    let gvk = wr.spec.primary.gvk();
    let (group, version) = gvk
        .api_version
        .split_once('/')
        .unwrap_or(("", &gvk.api_version));
    if let Some(reason) = refusal(group, &gvk.kind, builtin) {
        return Err(WebhookConfigError::Refused {
            name: wr.name_any(),
            reason,
        });
    }
    Ok(json!({
        "apiGroups": [group],
        "apiVersions": [version],
        "resources": [resolved.resource.plural],
        "operations": operations,
        "scope": if resolved.namespaced { "Namespaced" } else { "Cluster" },
    }))
}

/// How the API server reaches `path` on the host: `target` and the serving certificate's CA.
pub(super) fn client_config(target: &WebhookTarget, ca_bundle_pem: &str, path: &str) -> Value {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_bundle_pem.as_bytes());
    match target {
        WebhookTarget::Url(base) => json!({
            "url": format!("{}{path}", base.trim_end_matches('/')),
            "caBundle": ca,
        }),
        WebhookTarget::Service {
            namespace,
            name: svc,
            port,
        } => json!({
            "service": {"namespace": namespace, "name": svc, "port": port, "path": path},
            "caBundle": ca,
        }),
    }
}

/// The namespaces a webhook of `wr` covers: not the host's own nor [`EXCLUDED_NAMESPACES`]
/// (also on cluster-scoped kinds: there it spares those Namespace objects themselves), and only
/// `spec.namespaces` when set.
pub(super) fn namespace_selector(
    wr: &WasmReconciler,
    resolved: &Resolved,
    host_namespace: Option<&str>,
) -> Value {
    let spared: Vec<&str> = host_namespace
        .into_iter()
        .chain(EXCLUDED_NAMESPACES)
        .collect();
    let mut expressions =
        vec![json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": spared})];
    if resolved.namespaced && !wr.spec.namespaces.is_empty() {
        expressions.push(json!({"key": "kubernetes.io/metadata.name", "operator": "In", "values": wr.spec.namespaces}));
    }
    json!({"matchExpressions": expressions})
}

/// The webhook configuration of `kind` (validating or mutating) named after `wr`, owned by it,
/// holding `webhook`.
pub(super) fn configuration(wr: &WasmReconciler, kind: &str, webhook: Value) -> Value {
    let mut value = owned(wr, kind);
    value["webhooks"] = json!([webhook]);
    value
}

/// An admissionregistration.k8s.io/v1 object of `kind` named after `wr` and owned by it (the
/// garbage collector deletes it with the WasmReconciler), without its body.
pub(super) fn owned(wr: &WasmReconciler, kind: &str) -> Value {
    let name = wr.name_any();
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {
            "name": config_name(&name),
            "labels": {crate::controller::intents::RECONCILER_LABEL: name, "app.kubernetes.io/managed-by": "wasmop"},
            "ownerReferences": [{
                "apiVersion": "wasmop.dev/v1alpha1", "kind": "WasmReconciler",
                "name": name, "uid": wr.uid().unwrap_or_default(),
            }],
        },
    })
}

/// Applies and removes configurations.
#[derive(Clone)]
pub struct WebhookConfigs {
    api: Api<ValidatingWebhookConfiguration>,
    pub(super) mutating: Api<MutatingWebhookConfiguration>,
    /// The finalizer's policy and binding, where the API server serves them.
    pub(super) policies: Api<MutatingAdmissionPolicy>,
    pub(super) bindings: Api<MutatingAdmissionPolicyBinding>,
    /// The host's configuration, for asking as a module's ServiceAccount.
    pub(super) config: kube::Config,
    pub(super) discovery: Discovery,
    target: WebhookTarget,
    ca_bundle_pem: String,
    host_namespace: Option<String>,
    builtin: BuiltinKinds,
}

impl std::fmt::Debug for WebhookConfigs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfigs")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl WebhookConfigs {
    /// Writes with `client`; asks as a module's ServiceAccount with `config` (the host's
    /// configuration, impersonating it).
    pub fn new(
        client: Client,
        config: kube::Config,
        discovery: Discovery,
        target: WebhookTarget,
        ca_bundle_pem: String,
        host_namespace: Option<String>,
        builtin: BuiltinKinds,
    ) -> Self {
        WebhookConfigs {
            api: Api::all(client.clone()),
            mutating: Api::all(client.clone()),
            policies: Api::all(client.clone()),
            bindings: Api::all(client),
            config,
            discovery,
            target,
            ca_bundle_pem,
            host_namespace,
            builtin,
        }
    }

    /// Applies `wr`'s configuration (its module validates); removes it when its kind may not
    /// have one.
    ///
    /// # Errors
    /// [`WebhookConfigError`].
    pub async fn apply(&self, wr: &WasmReconciler) -> Result<(), WebhookConfigError> {
        let resolved = self.discovery.resolve(&wr.spec.primary.gvk()).await?;
        let value = match build(wr, &resolved, self.scope()) {
            Ok(v) => v,
            Err(refused) => {
                self.remove(&wr.name_any()).await?;
                return Err(refused);
            }
        };
        apply_as(&self.api, &config_name(&wr.name_any()), value).await
    }

    /// Where the webhooks point and what they spare.
    pub(super) fn scope(&self) -> Scope<'_> {
        Scope {
            target: &self.target,
            ca_bundle_pem: &self.ca_bundle_pem,
            host_namespace: self.host_namespace.as_deref(),
            builtin: &self.builtin,
        }
    }

    /// Removes WasmReconciler `name`'s configuration, if any.
    ///
    /// # Errors
    /// [`WebhookConfigError::Api`].
    pub async fn remove(&self, name: &str) -> Result<(), WebhookConfigError> {
        delete_as(&self.api, config_name(name)).await
    }
}

/// Applies `value`, a built configuration of kind `K`, as `name` (server-side apply with the
/// host's field manager).
pub(super) async fn apply_as<K>(
    api: &Api<K>,
    name: &str,
    value: Value,
) -> Result<(), WebhookConfigError>
where
    K: Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let typed: K = serde_json::from_value(value).map_err(|source| WebhookConfigError::Build {
        name: name.to_string(),
        source,
    })?;
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&typed),
    )
    .await
    .map_err(|source| WebhookConfigError::Api {
        name: name.to_string(),
        source,
    })?;
    Ok(())
}

/// Deletes configuration `name` of kind `K`; one already gone is fine.
pub(super) async fn delete_as<K>(api: &Api<K>, name: String) -> Result<(), WebhookConfigError>
where
    K: Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(WebhookConfigError::Api { name, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::{ApiResource, GroupVersionKind};

    fn wr() -> WasmReconciler {
        serde_json::from_value(json!({
            "apiVersion": "wasmop.dev/v1alpha1", "kind": "WasmReconciler",
            "metadata": {"name": "apps", "uid": "u-1"},
            "spec": {
                "module": {"configMap": {"namespace": "ops", "name": "m"}},
                "primary": {"apiVersion": "example.wasmop.dev/v1", "kind": "App"},
                "namespaces": ["team-a"],
                "serviceAccount": {"namespace": "ops", "name": "sa"},
                "admission": {"timeoutSeconds": 3, "failurePolicy": "Ignore"}
            }
        }))
        .unwrap_or_else(|e| panic!("literal: {e}"))
    }

    #[test]
    fn the_configuration_targets_the_primary_kind_and_spares_the_host_namespace() {
        let resolved = Resolved {
            resource: ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("example.wasmop.dev", "v1", "App"),
                "apps",
            ),
            namespaced: true,
        };
        let target = WebhookTarget::Url("https://127.0.0.1:9443/".into());
        let scope = Scope {
            target: &target,
            ca_bundle_pem: "PEM",
            host_namespace: Some("wasmop-system"),
            builtin: &BuiltinKinds::default(),
        };
        let v = build(&wr(), &resolved, scope).unwrap_or_else(|e| panic!("{e}"));
        let w = &v["webhooks"][0];
        assert_eq!(v["metadata"]["name"], "wasmop-apps");
        assert_eq!(
            w["clientConfig"]["url"],
            "https://127.0.0.1:9443/validate/apps"
        );
        assert_eq!(w["rules"][0]["resources"], json!(["apps"]));
        assert_eq!(w["rules"][0]["apiGroups"], json!(["example.wasmop.dev"]));
        assert_eq!(w["rules"][0]["operations"], json!(["CREATE", "UPDATE"]));
        assert_eq!(w["failurePolicy"], "Ignore");
        assert_eq!(w["timeoutSeconds"], 3);
        assert_eq!(w["sideEffects"], "None");
        let exprs = &w["namespaceSelector"]["matchExpressions"];
        assert_eq!(exprs[0]["operator"], "NotIn");
        assert_eq!(
            exprs[0]["values"],
            json!(["wasmop-system", "kube-system", "kube-node-lease"])
        );
        assert_eq!(exprs[1]["values"], json!(["team-a"]));
        assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "u-1");
        let typed: Result<ValidatingWebhookConfiguration, _> = serde_json::from_value(v);
        assert!(typed.is_ok(), "{typed:?}");
    }

    /// The configuration built for a primary `api_version`/`kind` when the administrator allowed
    /// the built-in kinds `allowed`; None when refused.
    fn built(
        api_version: &str,
        kind: &str,
        namespaced: bool,
        allowed: &str,
        host_ns: Option<&str>,
    ) -> Option<Value> {
        let mut wr = wr();
        wr.spec.primary = serde_json::from_value(json!({"apiVersion": api_version, "kind": kind}))
            .unwrap_or_else(|e| panic!("{e}"));
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let resolved = Resolved {
            resource: ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(group, version, kind),
                &format!("{}s", kind.to_lowercase()),
            ),
            namespaced,
        };
        let target = WebhookTarget::Url("https://127.0.0.1:9443".into());
        build_with(&wr, &resolved, &target, allowed, host_ns)
    }

    fn spared(v: &Value) -> Vec<String> {
        let exprs = v["webhooks"][0]["namespaceSelector"]["matchExpressions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        exprs
            .iter()
            .filter(|e| e["operator"] == "NotIn")
            .flat_map(|e| e["values"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    }

    #[test]
    fn every_webhook_spares_kube_system_kube_node_lease_and_the_host_namespace() {
        for (namespaced, host_ns) in [(true, Some("wasmop-system")), (true, None), (false, None)] {
            let v = built("example.wasmop.dev/v1", "App", namespaced, "", host_ns)
                .unwrap_or_else(|| panic!("a custom kind gets a webhook"));
            let spared = spared(&v);
            for ns in ["kube-system", "kube-node-lease"]
                .into_iter()
                .chain(host_ns)
            {
                assert!(
                    spared.iter().any(|s| s == ns),
                    "namespaced {namespaced}, host namespace {host_ns:?}: {ns} is not spared: {}",
                    v["webhooks"][0]["namespaceSelector"]
                );
            }
        }
    }

    #[test]
    fn leases_never_get_a_webhook_and_built_in_kinds_only_when_the_administrator_allows_them() {
        let cases = [
            (
                "coordination.k8s.io/v1",
                "Lease",
                "coordination.k8s.io/Lease",
                false,
            ),
            ("wasmop.dev/v1alpha1", "WasmReconciler", "", false),
            (
                "metacontroller.k8s.io/v1alpha1",
                "CompositeController",
                "metacontroller.k8s.io/CompositeController",
                false,
            ),
            ("v1", "ConfigMap", "", false),
            ("v1", "ConfigMap", "apps/Deployment", false),
            ("v1", "ConfigMap", "ConfigMap", true),
            ("apps/v1", "Deployment", "ConfigMap", false),
            ("apps/v1", "Deployment", "ConfigMap, apps/Deployment", true),
            ("networking.k8s.io/v1", "Ingress", "", false),
            ("example.wasmop.dev/v1", "App", "", true),
        ];
        for (api_version, kind, allowed, expected) in cases {
            let got = built(api_version, kind, true, allowed, None).is_some();
            assert_eq!(
                got,
                expected,
                "{api_version} {kind} with --webhook-builtin-kinds={allowed:?}: a webhook {}",
                if got { "was built" } else { "was refused" }
            );
        }
    }

    fn build_with(
        wr: &WasmReconciler,
        resolved: &Resolved,
        target: &WebhookTarget,
        allowed: &str,
        host_ns: Option<&str>,
    ) -> Option<Value> {
        let builtin = BuiltinKinds::parse(allowed).unwrap_or_else(|e| panic!("{e}"));
        let scope = Scope {
            target,
            ca_bundle_pem: "PEM",
            host_namespace: host_ns,
            builtin: &builtin,
        };
        build(wr, resolved, scope).ok()
    }
}
