//! The finalizer policy and the finalizer webhook: they make the API server add a reconciler's
//! finalizer to its primaries as it creates them, so that the host does not spend a request of
//! its own on it (one write per primary less: issue 27's request budget). Where the API server
//! serves MutatingAdmissionPolicies (Kubernetes 1.36 and later) it is a policy the API server
//! evaluates itself ([`build_policy`]: no call to the host in a create, and a primary created
//! while no host runs gets it too); elsewhere, the mutating webhook below.
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
//! - With the policy, conflicts and the module's `finalizes` are checked when the leader applies
//!   it (at a change of a WasmReconciler or of its module), not at every create as the webhook
//!   does: until the leader has synced after such a change, primaries may still be given the
//!   finalizer of a reconciler that just lost a conflict, which it releases as a loser does.

use std::sync::Arc;

use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};

use super::config::{
    WebhookConfigError, WebhookConfigs, apply_as, client_config, config_name, configuration,
    delete_as, namespace_selector, owned, rule,
};
use crate::conflict;
use crate::contract::Gvk;
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

/// The finalizer policy for `wr` (pure): a `MutatingAdmissionPolicy` and its binding, both
/// named `wasmop-<name>`, owned by `wr`, with which the API server itself adds `wr`'s finalizer
/// to a created primary, as the finalizer webhook does, without calling the host.
///
/// # Guarantees
/// - As the webhook's configuration: CREATE of the primary kind's resource, the same namespace
///   selector, `failurePolicy: Ignore`, `reinvocationPolicy: Never`; a created object that holds
///   the finalizer (or the legacy one) passes unchanged, and the others keep theirs.
/// - The WasmReconciler is the binding's parameter: while it is being deleted, or once it is
///   gone (`parameterNotFoundAction: Allow`), nothing is added, which the webhook checked at
///   every review.
///
/// # Errors
/// [`WebhookConfigError::Refused`] for Leases and built-in kinds not allowed.
pub fn build_policy(
    wr: &WasmReconciler,
    resolved: &Resolved,
    scope: super::config::Scope<'_>,
) -> Result<(Value, Value), WebhookConfigError> {
    let name = wr.name_any();
    // JSON string literals are CEL string literals.
    let quoted = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let finalizer = quoted(&finalizer_for(&name));
    let held = format!(
        "!has(object.metadata.finalizers) || !object.metadata.finalizers.exists(f, f == {finalizer} || f == {})",
        quoted(crate::crd::FINALIZER)
    );
    let add = format!(
        "has(params.metadata.deletionTimestamp) ? [] : has(object.metadata.finalizers) ? \
         [JSONPatch{{op: \"add\", path: \"/metadata/finalizers/-\", value: {finalizer}}}] : \
         [JSONPatch{{op: \"add\", path: \"/metadata/finalizers\", value: [{finalizer}]}}]"
    );
    let mut policy = owned(wr, "MutatingAdmissionPolicy");
    policy["spec"] = json!({
        "failurePolicy": "Ignore",
        "reinvocationPolicy": "Never",
        "paramKind": {"apiVersion": "wasmop.dev/v1alpha1", "kind": "WasmReconciler"},
        "matchConstraints": {
            "resourceRules": [rule(wr, resolved, scope.builtin, &["CREATE"])?],
            "namespaceSelector": namespace_selector(wr, resolved, scope.host_namespace),
            "matchPolicy": "Equivalent",
        },
        "matchConditions": [{"name": "not-finalized-yet", "expression": held}],
        "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": add}}],
    });
    let mut binding = owned(wr, "MutatingAdmissionPolicyBinding");
    binding["spec"] = json!({
        "policyName": config_name(&name),
        "paramRef": {"name": name, "parameterNotFoundAction": "Allow"},
    });
    Ok((policy, binding))
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
    /// Makes the API server add `wr`'s finalizer to its created primaries when it may (it wins
    /// its conflicts among `all`, its kind may have webhooks, its ServiceAccount may patch its
    /// primaries), with the finalizer policy where the API server serves
    /// MutatingAdmissionPolicies ([`build_policy`]) and the finalizer webhook elsewhere
    /// ([`build`]); removes them otherwise. Returns whether one is applied.
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
        let policies = self.serves_policies().await;
        let built = if policies {
            build_policy(wr, &resolved, self.scope()).map(|(p, b)| Built::Policy(p, b))
        } else {
            build(wr, &resolved, self.scope()).map(Built::Webhook)
        };
        let built = match built {
            Ok(b) if wins && wr.metadata.deletion_timestamp.is_none() => b,
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
        match built {
            Built::Policy(policy, binding) => {
                apply_as(&self.policies, &name, policy).await?;
                apply_as(&self.bindings, &name, binding).await?;
                // The webhook of a host from before the policy, or of a server upgraded since.
                delete_as(&self.mutating, name).await?;
            }
            Built::Webhook(webhook) => apply_as(&self.mutating, &name, webhook).await?,
        }
        Ok(true)
    }

    /// Removes WasmReconciler `name`'s finalizer webhook and finalizer policy, if any.
    ///
    /// # Errors
    /// [`WebhookConfigError::Api`].
    pub async fn remove_finalizer(&self, name: &str) -> Result<(), WebhookConfigError> {
        delete_as(&self.mutating, config_name(name)).await?;
        if self.serves_policies().await {
            // The binding first: a policy is never left bound to a reconciler going away.
            delete_as(&self.bindings, config_name(name)).await?;
            delete_as(&self.policies, config_name(name)).await?;
        }
        Ok(())
    }

    /// Whether the API server serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicies
    /// (Kubernetes 1.36 and later). A positive answer is kept ([`Discovery`] keeps what it
    /// resolved); a negative one is asked again at the next change.
    async fn serves_policies(&self) -> bool {
        let kind = Gvk::new("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy");
        self.discovery.resolve(&kind).await.is_ok()
    }
}

/// What makes the API server add a reconciler's finalizer.
enum Built {
    /// A MutatingAdmissionPolicy and its binding.
    Policy(Value, Value),
    /// A MutatingWebhookConfiguration.
    Webhook(Value),
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

    /// `f` of the App kind's resolution and a scope at a URL, sparing `wasmop-system`.
    fn for_apps<R>(f: impl FnOnce(&Resolved, Scope<'_>) -> R) -> R {
        let resolved = Resolved {
            resource: ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("example.wasmop.dev", "v1", "App"),
                "apps",
            ),
            namespaced: true,
        };
        let target = WebhookTarget::Url("https://127.0.0.1:9443".into());
        let builtin = BuiltinKinds::default();
        let scope = Scope {
            target: &target,
            ca_bundle_pem: "PEM",
            host_namespace: Some("wasmop-system"),
            builtin: &builtin,
        };
        f(&resolved, scope)
    }

    #[test]
    fn the_configuration_adds_on_create_only_never_refuses_and_spares_the_host_namespace() {
        let v = for_apps(|resolved, scope| build(&wr("apps", T1, &["team-a"]), resolved, scope))
            .unwrap_or_else(|e| panic!("{e}"));
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

    #[test]
    fn the_policy_adds_on_create_only_never_refuses_and_nothing_for_a_reconciler_going_away() {
        use k8s_openapi::api::admissionregistration::v1::{
            MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
        };
        let (policy, binding) =
            for_apps(|resolved, scope| build_policy(&wr("apps", T1, &["team-a"]), resolved, scope))
                .unwrap_or_else(|e| panic!("{e}"));
        let spec = &policy["spec"];
        assert_eq!(policy["metadata"]["name"], "wasmop-apps");
        assert_eq!(policy["metadata"]["ownerReferences"][0]["name"], "apps");
        assert_eq!(
            (&spec["failurePolicy"], &spec["reinvocationPolicy"]),
            (&json!("Ignore"), &json!("Never"))
        );
        let rules = &spec["matchConstraints"]["resourceRules"][0];
        assert_eq!(
            (&rules["resources"], &rules["operations"]),
            (&json!(["apps"]), &json!(["CREATE"]))
        );
        let selector = &spec["matchConstraints"]["namespaceSelector"]["matchExpressions"];
        assert_eq!(selector[0]["values"][0], "wasmop-system");
        assert_eq!(selector[1]["values"], json!(["team-a"]));
        // The expressions a kube-apiserver v1.37.2 took and applied (2026-11-30): added, appended
        // to others, not added twice, nothing while the WasmReconciler is deleted or gone.
        assert_eq!(
            spec["matchConditions"][0]["expression"],
            r#"!has(object.metadata.finalizers) || !object.metadata.finalizers.exists(f, f == "wasmop.dev/apps" || f == "wasmop.dev/finalizer")"#
        );
        assert_eq!(
            spec["mutations"][0]["jsonPatch"]["expression"],
            r#"has(params.metadata.deletionTimestamp) ? [] : has(object.metadata.finalizers) ? [JSONPatch{op: "add", path: "/metadata/finalizers/-", value: "wasmop.dev/apps"}] : [JSONPatch{op: "add", path: "/metadata/finalizers", value: ["wasmop.dev/apps"]}]"#
        );
        assert_eq!(spec["paramKind"]["kind"], "WasmReconciler");
        assert_eq!(binding["metadata"]["name"], "wasmop-apps");
        assert_eq!(binding["spec"]["policyName"], "wasmop-apps");
        assert_eq!(
            binding["spec"]["paramRef"],
            json!({"name": "apps", "parameterNotFoundAction": "Allow"})
        );
        let typed: Result<MutatingAdmissionPolicy, _> = serde_json::from_value(policy);
        assert!(typed.is_ok(), "{typed:?}");
        let typed: Result<MutatingAdmissionPolicyBinding, _> = serde_json::from_value(binding);
        assert!(typed.is_ok(), "{typed:?}");
    }
}
