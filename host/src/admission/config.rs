//! The `ValidatingWebhookConfiguration` of each WasmReconciler whose module validates: built from
//! the WasmReconciler and the host's webhook address, applied and removed by the leader.
//!
//! One configuration per WasmReconciler, named `wasmop-<name>`, with one webhook
//! `<name>.validate.wasmop.dev`: CREATE and UPDATE of the primary kind's resource, the admission
//! policy of `spec.admission` (timeout, failure policy), `sideEffects: None`,
//! `admissionReviewVersions: [v1]`, and a namespace selector that leaves out the host's own
//! namespace (so a broken module cannot lock the host out) and keeps only `spec.namespaces` when
//! set.
//!
//! # Guarantees
//! - The configuration is owned by its WasmReconciler (ownerReference), so Kubernetes' garbage
//!   collector deletes it with the WasmReconciler even when no host runs.
//! - Writes are server-side applies with the host's field manager: re-applying is idempotent.
//!
//! # Errors
//! [`WebhookConfigError`] when the kind cannot be resolved or the API refuses a write.

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
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

/// A failure to keep a configuration in sync.
#[derive(Debug, thiserror::Error)]
pub enum WebhookConfigError {
    /// The primary kind is not served.
    #[error("{0}")]
    Kind(#[from] crate::discovery::DiscoveryError),
    /// The API server refused.
    #[error("ValidatingWebhookConfiguration {name}: {source}")]
    Api {
        /// The configuration.
        name: String,
        /// The error.
        source: kube::Error,
    },
    /// The built configuration does not deserialize (a bug).
    #[error("building ValidatingWebhookConfiguration {name}: {source}")]
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

/// Builds the configuration (pure).
pub fn build(
    wr: &WasmReconciler,
    resolved: &Resolved,
    target: &WebhookTarget,
    ca_bundle_pem: &str,
    host_namespace: Option<&str>,
) -> Value {
    use base64::Engine as _;
    let name = wr.name_any();
    let gvk = wr.spec.primary.gvk();
    let (group, version) = match gvk.api_version.split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), gvk.api_version.clone()),
    };
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_bundle_pem.as_bytes());
    let client_config = match target {
        WebhookTarget::Url(base) => json!({
            "url": format!("{}{}", base.trim_end_matches('/'), path(&name)),
            "caBundle": ca,
        }),
        WebhookTarget::Service {
            namespace,
            name: svc,
            port,
        } => json!({
            "service": {"namespace": namespace, "name": svc, "port": port, "path": path(&name)},
            "caBundle": ca,
        }),
    };
    let mut webhook = json!({
        "name": format!("{name}.validate.wasmop.dev"),
        "clientConfig": client_config,
        "rules": [{
            "apiGroups": [group],
            "apiVersions": [version],
            "resources": [resolved.resource.plural],
            "operations": ["CREATE", "UPDATE"],
            "scope": if resolved.namespaced { "Namespaced" } else { "Cluster" },
        }],
        "failurePolicy": wr.spec.admission.failure_policy.as_str(),
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": wr.spec.admission.timeout_seconds.clamp(1, 30),
        "matchPolicy": "Equivalent",
    });
    if resolved.namespaced {
        let mut expressions = Vec::new();
        if let Some(ns) = host_namespace {
            expressions.push(
                json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [ns]}),
            );
        }
        if !wr.spec.namespaces.is_empty() {
            expressions.push(json!({"key": "kubernetes.io/metadata.name", "operator": "In", "values": wr.spec.namespaces}));
        }
        webhook["namespaceSelector"] = json!({"matchExpressions": expressions});
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {
            "name": config_name(&name),
            "labels": {crate::controller::intents::RECONCILER_LABEL: name, "app.kubernetes.io/managed-by": "wasmop"},
            "ownerReferences": [{
                "apiVersion": "wasmop.dev/v1alpha1", "kind": "WasmReconciler",
                "name": name, "uid": wr.uid().unwrap_or_default(),
            }],
        },
        "webhooks": [webhook],
    })
}

/// Applies and removes configurations.
#[derive(Clone)]
pub struct WebhookConfigs {
    api: Api<ValidatingWebhookConfiguration>,
    discovery: Discovery,
    target: WebhookTarget,
    ca_bundle_pem: String,
    host_namespace: Option<String>,
}

impl std::fmt::Debug for WebhookConfigs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfigs")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl WebhookConfigs {
    /// Writes with `client`.
    pub fn new(
        client: Client,
        discovery: Discovery,
        target: WebhookTarget,
        ca_bundle_pem: String,
        host_namespace: Option<String>,
    ) -> Self {
        WebhookConfigs {
            api: Api::all(client),
            discovery,
            target,
            ca_bundle_pem,
            host_namespace,
        }
    }

    /// Applies `wr`'s configuration (its module validates).
    ///
    /// # Errors
    /// [`WebhookConfigError`].
    pub async fn apply(&self, wr: &WasmReconciler) -> Result<(), WebhookConfigError> {
        let resolved = self.discovery.resolve(&wr.spec.primary.gvk()).await?;
        let name = config_name(&wr.name_any());
        let value = build(
            wr,
            &resolved,
            &self.target,
            &self.ca_bundle_pem,
            self.host_namespace.as_deref(),
        );
        let vwc: ValidatingWebhookConfiguration =
            serde_json::from_value(value).map_err(|source| WebhookConfigError::Build {
                name: name.clone(),
                source,
            })?;
        self.api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&vwc),
            )
            .await
            .map_err(|source| WebhookConfigError::Api {
                name: name.clone(),
                source,
            })?;
        Ok(())
    }

    /// Removes WasmReconciler `name`'s configuration, if any.
    ///
    /// # Errors
    /// [`WebhookConfigError::Api`].
    pub async fn remove(&self, name: &str) -> Result<(), WebhookConfigError> {
        let name = config_name(name);
        match self.api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(source) => Err(WebhookConfigError::Api { name, source }),
        }
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
        let v = build(
            &wr(),
            &resolved,
            &WebhookTarget::Url("https://127.0.0.1:9443/".into()),
            "PEM",
            Some("wasmop-system"),
        );
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
        assert_eq!(exprs[0]["values"], json!(["wasmop-system"]));
        assert_eq!(exprs[1]["values"], json!(["team-a"]));
        assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "u-1");
        let typed: Result<ValidatingWebhookConfiguration, _> = serde_json::from_value(v);
        assert!(typed.is_ok(), "{typed:?}");
    }
}
