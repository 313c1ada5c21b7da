//! configmap-propagator: a cluster-scoped `ConfigMapPropagation` copies one source ConfigMap
//! into every Namespace its `namespaceSelector` matches.
//!
//! - **Namespaces and the source are related kinds.** The host watches them and hands them to
//!   every reconcile; a change of either re-reconciles every propagation. So that the host does
//!   not watch (and hand over) every ConfigMap of the cluster, only ConfigMaps labelled
//!   [`SOURCE_LABEL`]`=true` are sources.
//! - **The copies are declarative children.** Each reconcile sends the complete set of copies
//!   (server-side applied, owned by the propagation); when a Namespace stops matching, its copy
//!   is no longer in the set and the host prunes it. Deleting the propagation deletes the copies
//!   (garbage collection: a cluster-scoped owner may own namespaced dependents).
//! - **A missing source keeps the copies.** If the source ConfigMap is gone (or not labelled),
//!   nothing is pruned: the module sends no child set, sets `SourceFound=False` and records a
//!   Warning Event, so a mistake upstream never wipes configuration out of every namespace.
//! - `spec.data` overrides keys of the source in every copy.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use wasmop_sdk::k8s::api::core::v1::{ConfigMap, Namespace};
use wasmop_sdk::k8s::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use wasmop_sdk::prelude::*;
use wasmop_sdk::{SelectorOperator, SelectorRequirement};

/// The propagation's API version.
pub const API_VERSION: &str = "example.wasmop.dev/v1";
/// The propagation's kind.
pub const KIND: &str = "ConfigMapPropagation";
/// Only ConfigMaps with this label set to `true` can be sources (the host watches only those).
pub const SOURCE_LABEL: &str = "example.wasmop.dev/propagate";
/// The label naming the propagation on every copy.
pub const PROPAGATION_LABEL: &str = "example.wasmop.dev/propagation";
/// The annotation naming the source (`namespace/name`) on every copy.
pub const SOURCE_ANNOTATION: &str = "example.wasmop.dev/source";

/// The ConfigMap to copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// What the user wants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PropagationSpec {
    /// The ConfigMap to copy; it must carry the label `example.wasmop.dev/propagate=true`.
    pub source: SourceRef,
    /// The Namespaces to copy it into (a Kubernetes label selector; empty selects every
    /// Namespace). The source's own Namespace is never a target.
    #[serde(default)]
    pub namespace_selector: LabelSelector,
    /// The name of the copies (default: the source's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_name: Option<String>,
    /// Keys set in every copy, over the source's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
}

/// What the module reports (besides `conditions` and `observedGeneration`, set by the host).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PropagationStatus {
    /// The source, `namespace/name`.
    pub source: String,
    /// How many Namespaces the selector matches.
    pub target_count: i32,
    /// The Namespaces the selector matches, sorted.
    pub target_namespaces: Vec<String>,
    /// How many copies exist with the wanted content.
    pub up_to_date: i32,
}

/// A ConfigMapPropagation.
pub type ConfigMapPropagation = Object<PropagationSpec, PropagationStatus>;

/// The module.
#[derive(Debug)]
pub struct ConfigMapPropagator;

/// The SDK selector for a Kubernetes label selector.
///
/// # Errors
/// A message naming the requirement with an unknown operator or misplaced values.
pub fn selector(s: &LabelSelector) -> std::result::Result<Selector, String> {
    let mut out = Selector::everything();
    for (k, v) in s.match_labels.iter().flatten() {
        out = out.label(k.clone(), v.clone());
    }
    for (i, r) in s.match_expressions.iter().flatten().enumerate() {
        let field = format!("spec.namespaceSelector.matchExpressions[{i}]");
        let values = r.values.clone().unwrap_or_default();
        let operator = match r.operator.as_str() {
            "In" => SelectorOperator::In,
            "NotIn" => SelectorOperator::NotIn,
            "Exists" => SelectorOperator::Exists,
            "DoesNotExist" => SelectorOperator::DoesNotExist,
            other => {
                return Err(format!(
                    "{field}: operator {other:?} is not one of In, NotIn, Exists, DoesNotExist"
                ));
            }
        };
        match operator {
            SelectorOperator::In | SelectorOperator::NotIn if values.is_empty() => {
                return Err(format!("{field}: {} needs values", r.operator));
            }
            SelectorOperator::Exists | SelectorOperator::DoesNotExist if !values.is_empty() => {
                return Err(format!("{field}: {} takes no values", r.operator));
            }
            _ => {}
        }
        out.match_expressions.push(SelectorRequirement {
            key: r.key.clone(),
            operator,
            values,
        });
    }
    Ok(out)
}

/// The name of the copies.
pub fn target_name(p: &ConfigMapPropagation) -> &str {
    p.spec
        .target_name
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or(&p.spec.source.name)
}

/// The Namespaces `p` copies into: matching, not being deleted, not the source's; sorted.
pub fn targets(
    p: &ConfigMapPropagation,
    selector: &Selector,
    namespaces: &[Namespace],
) -> Vec<String> {
    let mut out: Vec<String> = namespaces
        .iter()
        .filter(|ns| ns.metadata.deletion_timestamp.is_none())
        .filter(|ns| ns.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Terminating"))
        .filter(|ns| {
            selector.matches(
                ns.metadata
                    .labels
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.as_str(), v.as_str())),
            )
        })
        .filter_map(|ns| ns.metadata.name.clone())
        .filter(|name| *name != p.spec.source.namespace)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The copy of `source` for `namespace`.
pub fn copy(p: &ConfigMapPropagation, source: &ConfigMap, namespace: &str) -> ConfigMap {
    let mut data = source.data.clone().unwrap_or_default();
    data.extend(p.spec.data.clone());
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(target_name(p).to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(
                [
                    (PROPAGATION_LABEL.to_string(), p.name().to_string()),
                    (
                        "app.kubernetes.io/managed-by".to_string(),
                        "wasmop".to_string(),
                    ),
                ]
                .into(),
            ),
            annotations: Some(
                [(
                    SOURCE_ANNOTATION.to_string(),
                    format!("{}/{}", p.spec.source.namespace, p.spec.source.name),
                )]
                .into(),
            ),
            ..Default::default()
        },
        data: Some(data),
        binary_data: source.binary_data.clone(),
        ..Default::default()
    }
}

fn same_content(a: &ConfigMap, b: &ConfigMap) -> bool {
    a.data.clone().unwrap_or_default() == b.data.clone().unwrap_or_default()
        && a.binary_data.clone().unwrap_or_default() == b.binary_data.clone().unwrap_or_default()
}

impl Reconciler for ConfigMapPropagator {
    fn metadata() -> Metadata {
        Metadata::new("configmap-propagator", env!("CARGO_PKG_VERSION"))
            .primary(Gvk::new(API_VERSION, KIND))
            .owns::<ConfigMap>()
            // Any Namespace may start or stop matching some propagation's selector.
            .related(RelatedKind::new(Gvk::of::<Namespace>()).maps_to(Mapping::AllPrimaries))
            // Sources only: the copies do not carry the label, so they are not related objects.
            .related(
                RelatedKind::new(Gvk::of::<ConfigMap>())
                    .selector(Selector::everything().label(SOURCE_LABEL, "true"))
                    .maps_to(Mapping::AllPrimaries),
            )
            .validates()
    }

    fn reconcile(req: &Request) -> Result<Response> {
        let p: ConfigMapPropagation = req.primary()?;
        let source_name = format!("{}/{}", p.spec.source.namespace, p.spec.source.name);
        let selector = match selector(&p.spec.namespace_selector) {
            Ok(s) => s,
            Err(problem) => {
                // Leave the copies as they are (no complete set: nothing is pruned).
                return Ok(Response::new()
                    .condition(
                        Condition::new("Ready", false)
                            .reason("InvalidSelector")
                            .message(problem.clone()),
                    )
                    .event(Event::warning("InvalidSelector", problem)));
            }
        };
        let namespaces = req.related::<Namespace>()?;
        let targets = targets(&p, &selector, &namespaces);
        let source = req.related::<ConfigMap>()?.into_iter().find(|cm| {
            cm.metadata.namespace.as_deref() == Some(p.spec.source.namespace.as_str())
                && cm.metadata.name.as_deref() == Some(p.spec.source.name.as_str())
        });
        let observed = req.owned::<ConfigMap>()?;
        let mut status = PropagationStatus {
            source: source_name.clone(),
            target_count: i32::try_from(targets.len()).unwrap_or(i32::MAX),
            target_namespaces: targets.clone(),
            up_to_date: 0,
        };
        let Some(source) = source else {
            let message = format!(
                "the source ConfigMap {source_name} does not exist or is not labelled {SOURCE_LABEL}=true; the {} existing copies are kept",
                observed.len()
            );
            return Ok(Response::new()
                .status(&status)
                .condition(
                    Condition::new("SourceFound", false)
                        .reason("SourceMissing")
                        .message(message.clone()),
                )
                .condition(
                    Condition::new("Ready", false)
                        .reason("SourceMissing")
                        .message(message.clone()),
                )
                .event(Event::warning("SourceMissing", message).action("Propagate")));
        };

        let copies: Vec<ConfigMap> = targets.iter().map(|ns| copy(&p, &source, ns)).collect();
        let up_to_date = copies
            .iter()
            .filter(|want| {
                observed.iter().any(|have| {
                    have.metadata.namespace == want.metadata.namespace
                        && have.metadata.name == want.metadata.name
                        && same_content(have, want)
                })
            })
            .count();
        status.up_to_date = i32::try_from(up_to_date).unwrap_or(i32::MAX);
        let stale = observed
            .iter()
            .filter(|have| {
                !copies.iter().any(|want| {
                    have.metadata.namespace == want.metadata.namespace
                        && have.metadata.name == want.metadata.name
                })
            })
            .count();

        let mut response = Response::complete(req);
        for c in &copies {
            response = response.child(c);
        }
        let new: Vec<&str> = targets
            .iter()
            .filter(|ns| {
                !observed
                    .iter()
                    .any(|have| have.metadata.namespace.as_deref() == Some(ns.as_str()))
            })
            .map(String::as_str)
            .collect();
        if !new.is_empty() {
            response = response.event(
                Event::normal(
                    "Propagating",
                    format!("copying {source_name} into {}", new.join(", ")),
                )
                .action("Propagate"),
            );
        }
        if stale > 0 {
            response = response.event(
                Event::normal(
                    "Pruning",
                    format!("{stale} copies are in namespaces that no longer match"),
                )
                .action("Prune"),
            );
        }
        let converged = up_to_date == copies.len() && stale == 0;
        let ready = if converged {
            Condition::new("Ready", true)
                .reason("Propagated")
                .message(format!(
                    "{source_name} is copied into {} namespaces",
                    copies.len()
                ))
        } else {
            Condition::new("Ready", false)
                .reason("Propagating")
                .message(format!(
                    "{up_to_date}/{} copies up to date, {stale} to prune",
                    copies.len()
                ))
        };
        Ok(response
            .status(&status)
            .condition(
                Condition::new("SourceFound", true)
                    .reason("SourceFound")
                    .message(format!("copying {source_name}")),
            )
            .condition(ready))
    }

    fn validate(req: &ValidateRequest) -> Validation {
        let new: ConfigMapPropagation = match req.new_object() {
            Ok(p) => p,
            Err(e) => return Validation::deny(format!("not a ConfigMapPropagation: {e}")),
        };
        for (field, value) in [
            ("spec.source.namespace", &new.spec.source.namespace),
            ("spec.source.name", &new.spec.source.name),
        ] {
            if !is_dns_subdomain(value) {
                return Validation::deny_field(
                    field,
                    format!("{field} {value:?} is not a valid Kubernetes name"),
                );
            }
        }
        if let Some(name) = &new.spec.target_name
            && !is_dns_subdomain(name)
        {
            return Validation::deny_field(
                "spec.targetName",
                format!("spec.targetName {name:?} is not a valid ConfigMap name"),
            );
        }
        if let Some(key) = new.spec.data.keys().find(|k| !is_config_map_key(k)) {
            return Validation::deny_field(
                "spec.data",
                format!(
                    "spec.data key {key:?} is not a valid ConfigMap key (letters, digits, '-', '_', '.')"
                ),
            );
        }
        let selector = match selector(&new.spec.namespace_selector) {
            Ok(s) => s,
            Err(problem) => {
                return Validation::deny_field("spec.namespaceSelector", problem);
            }
        };
        let mut verdict = Validation::allow();
        if selector == Selector::everything() {
            verdict = verdict.warn(
                "spec.namespaceSelector is empty: the ConfigMap is copied into every namespace, kube-system included",
            );
        }
        verdict
    }
}

fn is_dns_subdomain(name: &str) -> bool {
    let ends_ok = |c: Option<u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (1..=253).contains(&name.len())
        && name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
        && ends_ok(name.bytes().next())
        && ends_ok(name.bytes().last())
}

fn is_config_map_key(key: &str) -> bool {
    (1..=253).contains(&key.len())
        && key
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

wasmop_sdk::export!(ConfigMapPropagator);
