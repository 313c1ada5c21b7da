//! The finalizer webhook: a mutating webhook that adds a reconciler's finalizer to its primaries
//! as the API server creates them, so that the host does not spend a request of its own on it
//! (one write per primary less: issue 27's request budget).
//!
//! One `MutatingWebhookConfiguration` `wasmop-<name>` per WasmReconciler whose active module
//! finalizes, with one webhook `<name>.finalizer.wasmop.dev`: CREATE of the primary kind's
//! resource, served on `POST /finalize/<name>`, `failurePolicy: Ignore`, `timeoutSeconds: 2`,
//! `sideEffects: None`, `reinvocationPolicy: Never`, and the validating webhook's namespace
//! selector and kinds ([`super::config`]).
//!
//! # Guarantees
//! - It never refuses a create and never holds one longer than its timeout: when the host does
//!   not answer, the API server creates the object as it is (`Ignore`) and the first reconcile
//!   adds the finalizer with a write of its own, as it does without the webhook.
//! - It adds the finalizer only to an object the reconciler serves ([`finalizer_patch`]): the
//!   WasmReconciler exists and is not being deleted, loses no conflict
//!   ([`crate::conflict`]), covers the object's namespace, and the module serving it on this
//!   replica finalizes. Otherwise the object passes unchanged.
//! - A reconciler whose ServiceAccount may not `patch` its primaries gets no finalizer webhook
//!   ([`may_patch_primaries`], asked of the API server as that ServiceAccount): a finalizer the
//!   module could not remove would keep a deleted primary for ever.
//! - The module is never called: the answer is the host's, from the object's `metadata`.
//!
//! # Caveats
//! - RBAC is asked when the WasmReconciler or its module changes, not at every create. A
//!   ServiceAccount that loses `patch` later cannot remove the finalizer, whoever added it.

use std::sync::Arc;

use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};

use super::config::{
    WebhookConfigError, WebhookConfigs, apply_as, client_config, config_name, configuration,
    delete_as, namespace_selector, rule,
};
use crate::conflict;
use crate::crd::{WasmReconciler, finalizer_for, is_finalizer_of};
use crate::discovery::Resolved;

/// How long the API server waits for the finalizer webhook before it creates the object as it
/// is.
pub const TIMEOUT_SECONDS: i32 = 2;

/// The URL path the host serves WasmReconciler `name`'s finalizer webhook on.
pub fn path(name: &str) -> String {
    format!("/finalize/{name}")
}

/// The finalizer webhook's configuration for `wr` (pure).
///
/// # Errors
/// [`WebhookConfigError::Refused`] for Leases and built-in kinds not allowed.
pub fn build(
    wr: &WasmReconciler,
    resolved: &Resolved,
    scope: super::config::Scope<'_>,
) -> Result<Value, WebhookConfigError> {
    let name = wr.name_any();
    let webhook = json!({
        "name": format!("{name}.finalizer.wasmop.dev"),
        "clientConfig": client_config(scope.target, scope.ca_bundle_pem, &path(&name)),
        "rules": [rule(wr, resolved, scope.builtin, &["CREATE"])?],
        "failurePolicy": "Ignore",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": TIMEOUT_SECONDS,
        "matchPolicy": "Equivalent",
        "reinvocationPolicy": "Never",
        "namespaceSelector": namespace_selector(wr, resolved, scope.host_namespace),
    });
    Ok(configuration(wr, "MutatingWebhookConfiguration", webhook))
}

/// The part of a created object the finalizer webhook reads.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    finalizers: Option<Vec<String>>,
    #[serde(default)]
    deletion_timestamp: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct Object {
    #[serde(default)]
    metadata: Meta,
}

/// The JSON patch that adds `wr`'s finalizer to `object` (the created object's JSON text, in
/// `namespace`), or None when the object passes unchanged: see the module's guarantees.
/// `all` are the WasmReconcilers this replica knows; `finalizes` whether the module serving `wr`
/// here finalizes (None: no module serves it here).
pub fn finalizer_patch<'a>(
    wr: &WasmReconciler,
    all: impl IntoIterator<Item = &'a WasmReconciler>,
    namespace: Option<&str>,
    object: &str,
    finalizes: Option<bool>,
) -> Option<json_patch::Patch> {
    let name = wr.name_any();
    let covered = match namespace {
        Some(ns) => wr.spec.namespaces.is_empty() || wr.spec.namespaces.iter().any(|n| n == ns),
        None => true,
    };
    if finalizes != Some(true)
        || wr.metadata.deletion_timestamp.is_some()
        || !covered
        || conflict::winner_over(wr, all).is_some()
    {
        return None;
    }
    let meta = serde_json::from_str::<Object>(object).ok()?.metadata;
    if meta.deletion_timestamp.is_some() {
        return None;
    }
    let op = match &meta.finalizers {
        Some(list) if list.iter().any(|f| is_finalizer_of(f, &name)) => return None,
        Some(_) => {
            json!({"op": "add", "path": "/metadata/finalizers/-", "value": finalizer_for(&name)})
        }
        None => {
            json!({"op": "add", "path": "/metadata/finalizers", "value": [finalizer_for(&name)]})
        }
    };
    serde_json::from_value(json!([op])).ok()
}

/// Whether `wr`'s ServiceAccount may `patch` its primaries (in each of `spec.namespaces`, or in
/// every namespace), asked of the API server as that ServiceAccount (a SelfSubjectAccessReview
/// under impersonation: the host needs no right to review access).
///
/// # Errors
/// The API's error.
pub async fn may_patch_primaries(
    config: &kube::Config,
    wr: &WasmReconciler,
    resolved: &Resolved,
) -> Result<bool, kube::Error> {
    let mut config = config.clone();
    config.auth_info.impersonate = Some(wr.spec.service_account.username());
    let api: Api<SelfSubjectAccessReview> = Api::all(Client::try_from(config)?);
    let namespaces: Vec<Option<&str>> = if resolved.namespaced && !wr.spec.namespaces.is_empty() {
        wr.spec
            .namespaces
            .iter()
            .map(|n| Some(n.as_str()))
            .collect()
    } else {
        vec![None]
    };
    for namespace in namespaces {
        let review: SelfSubjectAccessReview = serde_json::from_value(json!({
            "spec": {"resourceAttributes": {
                "group": resolved.resource.group,
                "resource": resolved.resource.plural,
                "verb": "patch",
                "namespace": namespace.unwrap_or_default(),
            }}
        }))
        .map_err(kube::Error::SerdeError)?;
        let answer = api.create(&PostParams::default(), &review).await?;
        if !answer.status.is_some_and(|s| s.allowed) {
            return Ok(false);
        }
    }
    Ok(true)
}

impl WebhookConfigs {
    /// Applies `wr`'s finalizer webhook when it may have one (it wins its conflicts among
    /// `all`, its kind may have webhooks, its ServiceAccount may patch its primaries); removes
    /// it otherwise. Returns whether it is applied.
    ///
    /// # Errors
    /// [`WebhookConfigError`].
    pub async fn apply_finalizer(
        &self,
        wr: &WasmReconciler,
        all: &[Arc<WasmReconciler>],
    ) -> Result<bool, WebhookConfigError> {
        let name = config_name(&wr.name_any());
        let resolved = self.discovery.resolve(&wr.spec.primary.gvk()).await?;
        let wins = conflict::winner_over(wr, all.iter().map(|w| &**w)).is_none();
        let value = match build(wr, &resolved, self.scope()) {
            Ok(v) if wins && wr.metadata.deletion_timestamp.is_none() => v,
            _ => {
                self.remove_finalizer(&wr.name_any()).await?;
                return Ok(false);
            }
        };
        let allowed = may_patch_primaries(&self.config, wr, &resolved)
            .await
            .map_err(|source| WebhookConfigError::Api {
                name: name.clone(),
                source,
            })?;
        if !allowed {
            self.remove_finalizer(&wr.name_any()).await?;
            return Ok(false);
        }
        apply_as(&self.mutating, &name, value).await?;
        Ok(true)
    }

    /// Removes WasmReconciler `name`'s finalizer webhook, if any.
    ///
    /// # Errors
    /// [`WebhookConfigError::Api`].
    pub async fn remove_finalizer(&self, name: &str) -> Result<(), WebhookConfigError> {
        delete_as(&self.mutating, config_name(name)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::config::{BuiltinKinds, Scope, WebhookTarget};
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use kube::api::{ApiResource, GroupVersionKind};

    fn wr(name: &str, created: &str, namespaces: &[&str]) -> WasmReconciler {
        serde_json::from_value(json!({
            "apiVersion": "wasmop.dev/v1alpha1", "kind": "WasmReconciler",
            "metadata": {"name": name, "uid": "u-1", "creationTimestamp": created},
            "spec": {
                "module": {"configMap": {"namespace": "ops", "name": "m"}},
                "primary": {"apiVersion": "example.wasmop.dev/v1", "kind": "App"},
                "namespaces": namespaces,
                "serviceAccount": {"namespace": "ops", "name": "sa"},
            }
        }))
        .unwrap_or_else(|e| panic!("literal: {e}"))
    }

    const T1: &str = "2026-01-01T00:00:01Z";
    const T2: &str = "2026-01-01T00:00:02Z";

    /// The patched object's finalizers, or None when `patch` is None.
    fn patched(object: &Value, patch: Option<json_patch::Patch>) -> Option<Value> {
        let mut object = object.clone();
        json_patch::patch(&mut object, &patch?).unwrap_or_else(|e| panic!("{e}"));
        Some(object["metadata"]["finalizers"].clone())
    }

    fn decide(wr: &WasmReconciler, all: &[WasmReconciler], object: &Value) -> Option<Value> {
        let text = object.to_string();
        patched(
            object,
            finalizer_patch(wr, all, Some("team-a"), &text, Some(true)),
        )
    }

    #[test]
    fn a_created_primary_gets_the_reconcilers_finalizer_beside_the_others() {
        let apps = wr("apps", T1, &[]);
        let all = [apps.clone()];
        let bare = json!({"metadata": {"name": "a"}});
        assert_eq!(decide(&apps, &all, &bare), Some(json!(["wasmop.dev/apps"])));
        let others = json!({"metadata": {"name": "a", "finalizers": ["x.dev/keep"]}});
        assert_eq!(
            decide(&apps, &all, &others),
            Some(json!(["x.dev/keep", "wasmop.dev/apps"]))
        );
    }

    #[test]
    fn the_object_passes_unchanged_unless_the_reconciler_serves_it() {
        let apps = wr("apps", T1, &["team-a"]);
        let bare = json!({"metadata": {"name": "a"}});
        let text = bare.to_string();
        let all = [apps.clone()];
        let patch = |wr: &WasmReconciler, all: &[WasmReconciler], ns: &str, f: Option<bool>| {
            finalizer_patch(wr, all, Some(ns), &text, f).is_some()
        };
        assert!(patch(&apps, &all, "team-a", Some(true)), "served: patched");
        assert!(
            !patch(&apps, &all, "team-a", Some(false)),
            "the module does not finalize"
        );
        assert!(
            !patch(&apps, &all, "team-a", None),
            "no module serves it here"
        );
        assert!(
            !patch(&apps, &all, "team-b", Some(true)),
            "outside spec.namespaces"
        );
        // Loses a conflict to an earlier reconciler of the same kind.
        let earlier = wr("earlier", T1, &[]);
        let later = wr("later", T2, &["team-a"]);
        let all = [earlier.clone(), later.clone()];
        assert!(
            !patch(&later, &all, "team-a", Some(true)),
            "loses the conflict"
        );
        assert!(patch(&earlier, &all, "team-a", Some(true)), "wins it");
        let mut deleting = apps.clone();
        deleting.metadata.deletion_timestamp =
            Some(serde_json::from_value(json!(T2)).unwrap_or_else(|e| panic!("{e}")));
        assert!(
            !patch(&deleting, &[deleting.clone()], "team-a", Some(true)),
            "the WasmReconciler is being deleted"
        );
    }

    #[test]
    fn an_object_holding_the_finalizer_or_the_legacy_one_or_not_json_passes_unchanged() {
        let apps = wr("apps", T1, &[]);
        let all = [apps.clone()];
        for object in [
            json!({"metadata": {"finalizers": ["wasmop.dev/apps"]}}),
            json!({"metadata": {"finalizers": [crate::crd::FINALIZER]}}),
            json!({"metadata": {"deletionTimestamp": T2}}),
        ] {
            assert_eq!(decide(&apps, &all, &object), None, "{object}");
        }
        assert!(finalizer_patch(&apps, &all, None, "not json", Some(true)).is_none());
    }

    #[test]
    fn the_configuration_adds_on_create_only_never_refuses_and_spares_the_host_namespace() {
        let resolved = Resolved {
            resource: ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("example.wasmop.dev", "v1", "App"),
                "apps",
            ),
            namespaced: true,
        };
        let target = WebhookTarget::Url("https://127.0.0.1:9443".into());
        let scope = Scope {
            target: &target,
            ca_bundle_pem: "PEM",
            host_namespace: Some("wasmop-system"),
            builtin: &BuiltinKinds::default(),
        };
        let v =
            build(&wr("apps", T1, &["team-a"]), &resolved, scope).unwrap_or_else(|e| panic!("{e}"));
        let w = &v["webhooks"][0];
        assert_eq!(v["kind"], "MutatingWebhookConfiguration");
        assert_eq!(v["metadata"]["name"], "wasmop-apps");
        assert_eq!(
            w["clientConfig"]["url"],
            "https://127.0.0.1:9443/finalize/apps"
        );
        assert_eq!(w["rules"][0]["operations"], json!(["CREATE"]));
        assert_eq!(w["failurePolicy"], "Ignore");
        assert_eq!(w["timeoutSeconds"], TIMEOUT_SECONDS);
        assert_eq!(w["reinvocationPolicy"], "Never");
        let spared = &w["namespaceSelector"]["matchExpressions"][0]["values"];
        assert_eq!(spared[0], "wasmop-system");
        assert_eq!(
            w["namespaceSelector"]["matchExpressions"][1]["values"],
            json!(["team-a"])
        );
        let typed: Result<MutatingWebhookConfiguration, _> = serde_json::from_value(v);
        assert!(typed.is_ok(), "{typed:?}");
    }
}
