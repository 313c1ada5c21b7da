//! Read-access checks of a module's ServiceAccount, at set-up.
//!
//! The host watches a reconciler's owned and related kinds with its own identity and hands what
//! it sees to the module. Without a check, a module would read whatever the host may read: a
//! `related: v1/Secret` grant works as soon as any other module's install lets the host read
//! Secrets. So before a reconciler starts, the host asks the API server (SubjectAccessReviews,
//! `authorization.k8s.io/v1`) whether the module's ServiceAccount itself may `list` and `watch`
//! the primary kind and every owned and related kind in the reconciler's scope, and refuses the
//! WasmReconciler otherwise (reason [`crate::reasons::READ_NOT_ALLOWED`]).
//!
//! # Guarantees
//! - A reconciler only starts when its ServiceAccount may list and watch the primary kind and
//!   each owned and related kind in every namespace of its scope (cluster-wide when it has none,
//!   or when the primary is cluster-scoped for related kinds, as the host watches them):
//!   `primary: v1/ConfigMap` does not hand a module every ConfigMap the host may read.
//! - The check asks as the ServiceAccount with its groups (`system:serviceaccounts`,
//!   `system:serviceaccounts:<ns>`, `system:authenticated`), so group bindings count as they do
//!   for the real requests.
//!
//! # Errors
//! [`AccessError::NotAllowed`] names the first missing permission and how to grant it;
//! [`AccessError::Review`] when the host cannot ask (it needs `create` on
//! `subjectaccessreviews`).

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

use crate::contract::Gvk;
use crate::crd::ServiceAccountRef;
use crate::discovery::Resolved;

/// The verbs a watch needs.
pub const READ_VERBS: [&str; 2] = ["list", "watch"];

/// Why the reads of a reconciler are not allowed.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// The ServiceAccount lacks a permission.
    #[error(
        "ServiceAccount {service_account} may not {verb} {kind} ({resource}) {scope}{why}: grant it (verbs list and watch on resource {resource} in API group {group:?}) in a {role} bound to the ServiceAccount"
    )]
    NotAllowed {
        /// `ns/name`.
        service_account: String,
        /// The missing verb.
        verb: String,
        /// `apiVersion/kind`.
        kind: String,
        /// The plural resource.
        resource: String,
        /// The API group.
        group: String,
        /// `in namespace x` or `cluster-wide`.
        scope: String,
        /// The authorizer's reason, if any (`: ...`).
        why: String,
        /// `Role` or `ClusterRole`.
        role: &'static str,
    },
    /// The host could not ask.
    #[error(
        "cannot check what ServiceAccount {service_account} may read: {source} (the host needs create on subjectaccessreviews.authorization.k8s.io)"
    )]
    Review {
        /// `ns/name`.
        service_account: String,
        /// The API's error.
        #[source]
        source: kube::Error,
    },
}

/// One kind the module reads, and where: `None` is cluster-wide.
#[derive(Debug, Clone)]
pub struct Read {
    /// The kind.
    pub kind: Gvk,
    /// Its resource.
    pub resolved: Resolved,
    /// The namespace, or None for every namespace (or a cluster-scoped kind).
    pub namespace: Option<String>,
}

/// The reads of a reconciler: the primary and owned kinds in its namespaces (every namespace
/// when it has none), related kinds in its namespaces when the primary is namespaced,
/// cluster-wide otherwise; cluster-scoped kinds cluster-wide.
pub fn reads(
    primary: &(Gvk, Resolved),
    owned: &[(Gvk, Resolved)],
    related: &[(Gvk, Resolved)],
    namespaces: &[String],
) -> Vec<Read> {
    let primary_namespaced = primary.1.namespaced;
    let scoped = |kind: &Gvk, resolved: &Resolved, in_namespaces: bool| -> Vec<Read> {
        if resolved.namespaced && in_namespaces && !namespaces.is_empty() {
            namespaces
                .iter()
                .map(|ns| Read {
                    kind: kind.clone(),
                    resolved: resolved.clone(),
                    namespace: Some(ns.clone()),
                })
                .collect()
        } else {
            vec![Read {
                kind: kind.clone(),
                resolved: resolved.clone(),
                namespace: None,
            }]
        }
    };
    // The primary too: the host hands the module every primary it watches.
    let mut out: Vec<Read> = scoped(&primary.0, &primary.1, true);
    for (k, r) in owned {
        out.extend(scoped(k, r, true));
    }
    for (k, r) in related {
        out.extend(scoped(k, r, primary_namespaced));
    }
    out
}

/// The SubjectAccessReview asking whether `sa` may `verb` what `read` names.
pub fn review(sa: &ServiceAccountRef, read: &Read, verb: &str) -> SubjectAccessReview {
    let ar = &read.resolved.resource;
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(sa.username()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{}", sa.namespace),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                group: Some(ar.group.clone()),
                version: Some(ar.version.clone()),
                resource: Some(ar.plural.clone()),
                namespace: read.namespace.clone(),
                verb: Some(verb.to_string()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

/// Checks that `sa` may list and watch every read.
///
/// # Errors
/// [`AccessError`]: the first read not allowed, or the review failed.
pub async fn check_reads(
    client: &Client,
    sa: &ServiceAccountRef,
    reads: &[Read],
) -> Result<(), AccessError> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let who = format!("{}/{}", sa.namespace, sa.name);
    for read in reads {
        for verb in READ_VERBS {
            let answer = api
                .create(&PostParams::default(), &review(sa, read, verb))
                .await
                .map_err(|source| AccessError::Review {
                    service_account: who.clone(),
                    source,
                })?;
            let status = answer.status.unwrap_or_default();
            if !status.allowed {
                let ar = &read.resolved.resource;
                let why = status
                    .reason
                    .filter(|r| !r.is_empty())
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default();
                return Err(AccessError::NotAllowed {
                    service_account: who,
                    verb: verb.to_string(),
                    kind: format!("{}/{}", read.kind.api_version, read.kind.kind),
                    resource: ar.plural.clone(),
                    group: ar.group.clone(),
                    scope: match &read.namespace {
                        Some(ns) => format!("in namespace {ns}"),
                        None => "cluster-wide".to_string(),
                    },
                    why,
                    role: if read.namespace.is_some() {
                        "Role"
                    } else {
                        "ClusterRole"
                    },
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::{ApiResource, GroupVersionKind};

    fn resolved(group: &str, kind: &str, plural: &str, namespaced: bool) -> Resolved {
        Resolved {
            resource: ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(group, "v1", kind),
                plural,
            ),
            namespaced,
        }
    }

    #[test]
    fn reads_follow_what_the_host_watches() {
        let cm = (
            Gvk::new("v1", "ConfigMap"),
            resolved("", "ConfigMap", "configmaps", true),
        );
        let ns = (
            Gvk::new("v1", "Namespace"),
            resolved("", "Namespace", "namespaces", false),
        );
        let app = (
            Gvk::new("example.com/v1", "App"),
            resolved("example.com", "App", "apps", true),
        );
        let scope = vec!["a".to_string(), "b".to_string()];
        let r = reads(
            &app,
            std::slice::from_ref(&cm),
            &[cm.clone(), ns.clone()],
            &scope,
        );
        let places: Vec<(String, Option<String>)> = r
            .iter()
            .map(|r| (r.kind.kind.clone(), r.namespace.clone()))
            .collect();
        assert_eq!(
            places,
            [
                ("App".into(), Some("a".into())),
                ("App".into(), Some("b".into())),
                ("ConfigMap".into(), Some("a".into())),
                ("ConfigMap".into(), Some("b".into())),
                ("ConfigMap".into(), Some("a".into())),
                ("ConfigMap".into(), Some("b".into())),
                ("Namespace".into(), None),
            ]
        );
        // A cluster-scoped primary's related kinds are watched cluster-wide.
        let r = reads(&ns, &[], std::slice::from_ref(&cm), &[]);
        let places: Vec<(String, Option<String>)> = r
            .iter()
            .map(|r| (r.kind.kind.clone(), r.namespace.clone()))
            .collect();
        assert_eq!(
            places,
            [("Namespace".into(), None), ("ConfigMap".into(), None)]
        );
    }

    /// `primary: v1/ConfigMap` must not hand the module every ConfigMap the host may read.
    #[test]
    fn the_primary_kind_is_checked_like_the_others() {
        let cm = (
            Gvk::new("v1", "ConfigMap"),
            resolved("", "ConfigMap", "configmaps", true),
        );
        let r = reads(&cm, &[], &[], &[]);
        assert_eq!(r.len(), 1, "the primary is not checked: {r:?}");
        assert_eq!(r[0].kind, cm.0);
        assert_eq!(r[0].namespace, None, "every namespace");
    }

    #[test]
    fn a_review_asks_as_the_service_account_with_its_groups() {
        let sa = ServiceAccountRef {
            namespace: "team".into(),
            name: "mod".into(),
        };
        let read = Read {
            kind: Gvk::new("apps/v1", "Deployment"),
            resolved: resolved("apps", "Deployment", "deployments", true),
            namespace: Some("team".into()),
        };
        let r = review(&sa, &read, "watch");
        assert_eq!(
            r.spec.user.as_deref(),
            Some("system:serviceaccount:team:mod")
        );
        let groups = r.spec.groups.unwrap_or_default();
        assert!(groups.contains(&"system:serviceaccounts:team".to_string()));
        let a = r.spec.resource_attributes.unwrap_or_default();
        assert_eq!(a.group.as_deref(), Some("apps"));
        assert_eq!(a.resource.as_deref(), Some("deployments"));
        assert_eq!(a.verb.as_deref(), Some("watch"));
        assert_eq!(a.namespace.as_deref(), Some("team"));
    }

    #[test]
    fn a_refusal_names_the_permission_and_how_to_grant_it() {
        let e = AccessError::NotAllowed {
            service_account: "team/mod".into(),
            verb: "list".into(),
            kind: "v1/Secret".into(),
            resource: "secrets".into(),
            group: String::new(),
            scope: "cluster-wide".into(),
            why: String::new(),
            role: "ClusterRole",
        };
        let m = e.to_string();
        assert!(
            m.contains("team/mod may not list v1/Secret (secrets) cluster-wide")
                && m.contains("ClusterRole"),
            "{m}"
        );
    }
}
