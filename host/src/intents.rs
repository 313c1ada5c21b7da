//! Checks a module's response before anything reaches a cluster, and prepares the children as
//! the host will apply them (namespace defaulted, controller ownerReference and reconciler label
//! added).
//!
//! # Guarantees
//! - All or nothing: a response with any invalid intent is refused whole (a partly valid child
//!   set applied with pruning could delete what the module meant to keep).
//! - Every violation is reported, each naming the offending intent (`children[apps/v1/Deployment][1]
//!   (web)`, `actions[0] (merge-patch v1/ConfigMap default/x)`, `status.conditions[Ready]`...).
//! - Only kinds the module declared (and the administrator granted) are written: children of
//!   owned kinds; patches, deletes and Event subjects of owned or related kinds or the primary.
//! - Namespaces follow the scope rules: a namespaced primary's intents stay in its namespace
//!   and it cannot own cluster-scoped objects; a cluster-scoped primary names the namespace of
//!   every namespaced target.
//!
//! # Errors
//! [`Rejected`] with one [`Violation`] per problem.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::contract::{
    Action, ChildSet, Event, Gvk, ModuleMetadata, ObjectRef, ReconcileResponse, Status,
};

/// The label the host puts on every child: `wasmop.dev/reconciler=<WasmReconciler name>`.
pub const RECONCILER_LABEL: &str = "wasmop.dev/reconciler";
/// Largest object, patch or status the host sends (the API server's limit is ~1.5 MB).
pub const MAX_OBJECT_BYTES: usize = 1 << 20;
/// Longest Event note the API accepts; longer messages are cut.
pub const MAX_EVENT_NOTE: usize = 1024;
/// Requeue delays are kept between these bounds.
pub const REQUEUE_MIN: Duration = Duration::from_millis(100);
/// Requeue delays are kept between these bounds.
pub const REQUEUE_MAX: Duration = Duration::from_secs(24 * 3600);

/// Whether kinds are namespaced. Online the host asks discovery; offline a table of well-known
/// cluster-scoped kinds is used and any other kind is taken as namespaced.
pub trait Scopes {
    /// `Some(true)` if `kind` is namespaced, `Some(false)` if cluster-scoped, None if unknown.
    fn namespaced(&self, kind: &Gvk) -> Option<bool>;
}

/// The offline table of well-known cluster-scoped kinds.
#[derive(Debug, Clone, Copy, Default)]
pub struct WellKnownScopes;

const CLUSTER_SCOPED: &[(&str, &str)] = &[
    ("v1", "Namespace"),
    ("v1", "Node"),
    ("v1", "PersistentVolume"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
    ("storage.k8s.io/v1", "StorageClass"),
    ("storage.k8s.io/v1", "CSIDriver"),
    ("scheduling.k8s.io/v1", "PriorityClass"),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
    ),
    (
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
    ),
    ("networking.k8s.io/v1", "IngressClass"),
    ("wasmop.dev/v1alpha1", "WasmReconciler"),
];

impl Scopes for WellKnownScopes {
    fn namespaced(&self, kind: &Gvk) -> Option<bool> {
        Some(
            !CLUSTER_SCOPED
                .iter()
                .any(|(v, k)| *v == kind.api_version && *k == kind.kind),
        )
    }
}

/// What the administrator allows a reconciler (the WasmReconciler's grant, intersected with the
/// module's metadata by the caller; offline, the metadata itself).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// Kinds whose objects may be children.
    pub owned: BTreeSet<Gvk>,
    /// Kinds that may be patched, deleted or be Event subjects besides the owned ones.
    pub related: BTreeSet<Gvk>,
}

impl Grant {
    /// Everything the metadata asks for.
    pub fn from_metadata(m: &ModuleMetadata) -> Self {
        Grant {
            owned: m.owns.iter().cloned().collect(),
            related: m.related.iter().map(|r| r.kind.clone()).collect(),
        }
    }
}

/// The primary object a response is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Primary {
    /// Its kind.
    pub kind: Gvk,
    /// Its namespace (None: cluster-scoped).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// Its uid (for ownerReferences).
    pub uid: String,
}

impl Primary {
    /// Reads kind, namespace, name and uid from an object.
    ///
    /// # Errors
    /// A message if apiVersion, kind or name is missing.
    pub fn from_object(object: &Value) -> Result<Self, String> {
        let s = |p: &str| {
            object
                .pointer(p)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let api_version = s("/apiVersion").ok_or("the primary object has no apiVersion")?;
        let kind = s("/kind").ok_or("the primary object has no kind")?;
        let name = s("/metadata/name").ok_or("the primary object has no metadata.name")?;
        Ok(Primary {
            kind: Gvk::new(api_version, kind),
            namespace: s("/metadata/namespace").filter(|n| !n.is_empty()),
            name,
            uid: s("/metadata/uid")
                .unwrap_or_else(|| "00000000-0000-0000-0000-000000000000".into()),
        })
    }

    /// A reference to the primary.
    pub fn object_ref(&self) -> ObjectRef {
        ObjectRef {
            api_version: self.kind.api_version.clone(),
            kind: self.kind.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// One problem with one intent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which intent (`children[apps/v1/Deployment][0] (web)`).
    pub intent: String,
    /// What is wrong with it.
    pub problem: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.intent, self.problem)
    }
}

/// A refused response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the module's response was refused ({} problem{}): {}", .violations.len(), if .violations.len() == 1 { "" } else { "s" }, .violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct Rejected {
    /// Every problem found.
    pub violations: Vec<Violation>,
}

/// A child ready to be applied.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreparedChild {
    /// Its namespace (None: cluster-scoped).
    #[serde(skip)]
    pub namespace: Option<String>,
    /// Its name.
    #[serde(skip)]
    pub name: String,
    /// The object as it will be applied.
    #[serde(flatten)]
    pub object: Value,
}

/// A complete child set, prepared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreparedSet {
    /// The kind.
    pub kind: Gvk,
    /// Whether the kind is namespaced.
    #[serde(skip)]
    pub namespaced: bool,
    /// The children.
    pub objects: Vec<PreparedChild>,
}

/// A validated response, ready to apply.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Validated {
    /// Complete child sets.
    pub children: Vec<PreparedSet>,
    /// Actions, with namespaces resolved.
    pub actions: Vec<Action>,
    /// The status fields and conditions (observedGeneration is added when writing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Events, with the subject resolved.
    pub events: Vec<Event>,
    /// The requeue delay, clamped.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser_duration"
    )]
    pub requeue_after: Option<Duration>,
}

fn ser_duration<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&format!("{}ms", d.as_millis())),
        None => s.serialize_none(),
    }
}

struct Checker<'a> {
    reconciler: &'a str,
    primary: &'a Primary,
    grant: &'a Grant,
    scopes: &'a dyn Scopes,
    violations: Vec<Violation>,
}

impl Checker<'_> {
    fn bad(&mut self, intent: impl Into<String>, problem: impl Into<String>) {
        self.violations.push(Violation {
            intent: intent.into(),
            problem: problem.into(),
        });
    }

    fn namespaced(&self, kind: &Gvk) -> bool {
        if *kind == self.primary.kind {
            return self.primary.namespace.is_some();
        }
        self.scopes.namespaced(kind).unwrap_or(true)
    }

    /// Resolves the namespace of a target per the scope rules.
    fn resolve_namespace(
        &mut self,
        intent: &str,
        kind: &Gvk,
        namespace: Option<&str>,
    ) -> Option<Option<String>> {
        let namespace = namespace.filter(|n| !n.is_empty());
        if !self.namespaced(kind) {
            if let Some(ns) = namespace {
                self.bad(
                    intent,
                    format!("{kind} is cluster-scoped but a namespace ({ns}) is set"),
                );
                return None;
            }
            return Some(None);
        }
        match (&self.primary.namespace, namespace) {
            (Some(primary), None) => Some(Some(primary.clone())),
            (Some(primary), Some(ns)) if ns == primary => Some(Some(primary.clone())),
            (Some(primary), Some(ns)) => {
                self.bad(intent, format!("namespace {ns} is outside the primary's namespace {primary}; a namespaced primary's intents stay in its namespace"));
                None
            }
            (None, Some(ns)) => Some(Some(ns.to_string())),
            (None, None) => {
                self.bad(
                    intent,
                    format!(
                        "{kind} is namespaced and the primary is cluster-scoped: set the namespace"
                    ),
                );
                None
            }
        }
    }

    fn check_name(&mut self, intent: &str, name: &str) {
        if let Err(problem) = check_dns_subdomain(name) {
            self.bad(intent, format!("metadata.name {name:?} {problem}"));
        }
    }

    fn may_target(&self, kind: &Gvk) -> bool {
        *kind == self.primary.kind
            || self.grant.owned.contains(kind)
            || self.grant.related.contains(kind)
    }

    fn children(&mut self, sets: Vec<ChildSet>) -> Vec<PreparedSet> {
        let mut seen_kinds = BTreeSet::new();
        let mut out = Vec::new();
        for set in sets {
            let kind = set.kind.clone();
            let base = format!("children[{kind}]");
            if !seen_kinds.insert(kind.clone()) {
                self.bad(
                    &base,
                    "the kind appears in two child sets; send one complete set per kind",
                );
                continue;
            }
            if !self.grant.owned.contains(&kind) {
                self.bad(&base, format!("{kind} is not an owned kind of this reconciler (declare it in the module's metadata.owns and grant it in the WasmReconciler's spec.owns)"));
                continue;
            }
            let namespaced = self.namespaced(&kind);
            if self.primary.namespace.is_some() && !namespaced {
                self.bad(&base, format!("{kind} is cluster-scoped and cannot be owned by the namespaced primary {} (garbage collection forbids it)", self.primary.object_ref()));
                continue;
            }
            let mut names = BTreeSet::new();
            let mut objects = Vec::new();
            for (i, object) in set.objects.into_iter().enumerate() {
                let name = object
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let intent = if name.is_empty() {
                    format!("{base}[{i}]")
                } else {
                    format!("{base}[{i}] ({name})")
                };
                if let Some(child) = self.child(&intent, &kind, object) {
                    if !names.insert((child.namespace.clone(), child.name.clone())) {
                        self.bad(
                            &intent,
                            "two children of this kind have the same namespace and name",
                        );
                        continue;
                    }
                    objects.push(child);
                }
            }
            out.push(PreparedSet {
                kind,
                namespaced,
                objects,
            });
        }
        out
    }

    fn child(&mut self, intent: &str, kind: &Gvk, mut object: Value) -> Option<PreparedChild> {
        let size = object.to_string().len();
        if size > MAX_OBJECT_BYTES {
            self.bad(
                intent,
                format!("the object is {size} bytes, over the {MAX_OBJECT_BYTES}-byte limit"),
            );
            return None;
        }
        let Some(map) = object.as_object_mut() else {
            self.bad(intent, "not a JSON object");
            return None;
        };
        let field = |m: &Map<String, Value>, k: &str| {
            m.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (api_version, k) = (field(map, "apiVersion"), field(map, "kind"));
        if api_version.is_empty() || k.is_empty() {
            self.bad(intent, "apiVersion and kind are required");
            return None;
        }
        if api_version != kind.api_version || k != kind.kind {
            self.bad(
                intent,
                format!("the object is a {api_version}/{k} in the set of {kind}"),
            );
            return None;
        }
        let meta = map.entry("metadata").or_insert_with(|| json!({}));
        let Some(meta) = meta.as_object_mut() else {
            self.bad(intent, "metadata is not an object");
            return None;
        };
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty() {
            self.bad(intent, "metadata.name is required (generateName is not supported: children need stable names to be pruned and updated)");
            return None;
        }
        self.check_name(intent, &name);
        for forbidden in [
            "ownerReferences",
            "uid",
            "resourceVersion",
            "managedFields",
            "creationTimestamp",
            "deletionTimestamp",
        ] {
            if meta.contains_key(forbidden) {
                self.bad(
                    intent,
                    format!("metadata.{forbidden} is set by the host or the API server; remove it"),
                );
            }
        }
        let namespace = meta
            .get("namespace")
            .and_then(Value::as_str)
            .map(str::to_string);
        let namespace = self.resolve_namespace(intent, kind, namespace.as_deref())?;
        match &namespace {
            Some(ns) => {
                meta.insert("namespace".into(), Value::String(ns.clone()));
            }
            None => {
                meta.remove("namespace");
            }
        }
        let labels = meta.entry("labels").or_insert_with(|| json!({}));
        let Some(labels) = labels.as_object_mut() else {
            self.bad(intent, "metadata.labels is not an object");
            return None;
        };
        match labels.get(RECONCILER_LABEL).and_then(Value::as_str) {
            Some(v) if v != self.reconciler => {
                self.bad(intent, format!("label {RECONCILER_LABEL}={v} names another reconciler; the host sets it to {}", self.reconciler));
                return None;
            }
            _ => {
                labels.insert(
                    RECONCILER_LABEL.into(),
                    Value::String(self.reconciler.to_string()),
                );
            }
        }
        meta.insert(
            "ownerReferences".into(),
            json!([{
                "apiVersion": self.primary.kind.api_version,
                "kind": self.primary.kind.kind,
                "name": self.primary.name,
                "uid": self.primary.uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }]),
        );
        Some(PreparedChild {
            namespace,
            name,
            object,
        })
    }

    fn target(&mut self, intent: &str, target: &ObjectRef) -> Option<ObjectRef> {
        let kind = target.gvk();
        if !self.may_target(&kind) {
            self.bad(intent, format!("{kind} is neither the primary kind nor an owned or related kind of this reconciler"));
            return None;
        }
        self.check_name(intent, &target.name);
        let namespace = self.resolve_namespace(intent, &kind, target.namespace.as_deref())?;
        Some(ObjectRef {
            namespace,
            ..target.clone()
        })
    }

    fn actions(&mut self, actions: Vec<Action>) -> Vec<Action> {
        let mut out = Vec::new();
        for (i, action) in actions.into_iter().enumerate() {
            let intent = format!("actions[{i}] ({} {})", action.name(), action.target());
            let Some(target) = self.target(&intent, action.target()) else {
                continue;
            };
            let checked = match action {
                Action::MergePatch { patch, .. } => {
                    if !patch.is_object() {
                        self.bad(&intent, "a merge patch must be a JSON object");
                        continue;
                    }
                    Action::MergePatch { target, patch }
                }
                Action::JsonPatch { patch, .. } => {
                    if let Err(e) = serde_json::from_value::<json_patch::Patch>(patch.clone()) {
                        self.bad(&intent, format!("not a valid RFC 6902 JSON patch: {e}"));
                        continue;
                    }
                    Action::JsonPatch { target, patch }
                }
                Action::Delete { propagation, .. } => Action::Delete {
                    target,
                    propagation,
                },
            };
            if let Action::MergePatch { patch, .. } | Action::JsonPatch { patch, .. } = &checked {
                let size = patch.to_string().len();
                if size > MAX_OBJECT_BYTES {
                    self.bad(
                        &intent,
                        format!(
                            "the patch is {size} bytes, over the {MAX_OBJECT_BYTES}-byte limit"
                        ),
                    );
                    continue;
                }
            }
            out.push(checked);
        }
        out
    }

    fn status(&mut self, status: Option<Status>) -> Option<Status> {
        let status = status?;
        let mut ok = true;
        match status.fields.as_object() {
            None => {
                self.bad("status.fields", "must be a JSON object");
                ok = false;
            }
            Some(m) => {
                for k in ["conditions", "observedGeneration"] {
                    if m.contains_key(k) {
                        self.bad(
                            format!("status.fields.{k}"),
                            "is set by the host; use the conditions list",
                        );
                        ok = false;
                    }
                }
            }
        }
        let size = status.fields.to_string().len();
        if size > MAX_OBJECT_BYTES {
            self.bad(
                "status.fields",
                format!("{size} bytes, over the {MAX_OBJECT_BYTES}-byte limit"),
            );
            ok = false;
        }
        let mut types = BTreeSet::new();
        for c in &status.conditions {
            let intent = format!("status.conditions[{}]", c.type_);
            if c.type_.is_empty() || c.type_.len() > 316 {
                self.bad(&intent, "type must be 1 to 316 characters");
                ok = false;
            }
            if !types.insert(c.type_.clone()) {
                self.bad(&intent, "two conditions have this type");
                ok = false;
            }
            if !is_reason(&c.reason) {
                self.bad(&intent, format!("reason {:?} must be CamelCase (letters, digits, `_`, `,`, `:`), 1 to 1024 characters", c.reason));
                ok = false;
            }
            if c.message.len() > 32768 {
                self.bad(&intent, "message is over 32768 characters");
                ok = false;
            }
        }
        ok.then_some(status)
    }

    fn events(&mut self, events: Vec<Event>) -> Vec<Event> {
        let mut out = Vec::new();
        for (i, mut e) in events.into_iter().enumerate() {
            let intent = format!("events[{i}] ({})", e.reason);
            if !is_reason(&e.reason) || e.reason.len() > 128 {
                self.bad(&intent, "reason must be CamelCase, 1 to 128 characters");
                continue;
            }
            if e.action.is_empty() {
                e.action = "Reconcile".into();
            } else if e.action.len() > 128 {
                self.bad(&intent, "action is over 128 characters");
                continue;
            }
            if e.message.len() > MAX_EVENT_NOTE {
                let mut cut = MAX_EVENT_NOTE - 3;
                while !e.message.is_char_boundary(cut) {
                    cut -= 1;
                }
                e.message.truncate(cut);
                e.message.push_str("...");
            }
            e.regarding = match e.regarding.take() {
                None => Some(self.primary.object_ref()),
                Some(r) => match self.target(&intent, &r) {
                    Some(r) => Some(r),
                    None => continue,
                },
            };
            out.push(e);
        }
        out
    }
}

fn is_reason(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 1024
        && b[0].is_ascii_alphabetic()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b',' | b':'))
        && !matches!(b[b.len() - 1], b',' | b':')
}

/// Checks a name against Kubernetes' DNS-subdomain rule.
///
/// # Errors
/// What is wrong with it.
pub fn check_dns_subdomain(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 253 {
        return Err("must be 1 to 253 characters");
    }
    let ok_chars = name
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.');
    let ends_ok = |c: Option<u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !ok_chars || !ends_ok(name.bytes().next()) || !ends_ok(name.bytes().last()) {
        return Err(
            "must be lowercase letters, digits, '-' and '.', starting and ending with a letter or digit",
        );
    }
    Ok(())
}

/// Validates `response` for `primary` under `grant`, preparing the children.
///
/// # Errors
/// [`Rejected`] listing every violation.
pub fn validate(
    reconciler: &str,
    primary: &Primary,
    grant: &Grant,
    scopes: &dyn Scopes,
    response: ReconcileResponse,
) -> Result<Validated, Rejected> {
    let mut checker = Checker {
        reconciler,
        primary,
        grant,
        scopes,
        violations: Vec::new(),
    };
    let children = checker.children(response.children);
    let actions = checker.actions(response.actions);
    let status = checker.status(response.status);
    let events = checker.events(response.events);
    if !checker.violations.is_empty() {
        return Err(Rejected {
            violations: checker.violations,
        });
    }
    Ok(Validated {
        children,
        actions,
        status,
        events,
        requeue_after: response
            .requeue_after
            .map(|d| d.clamp(REQUEUE_MIN, REQUEUE_MAX)),
    })
}

/// The status object the host writes: the module's fields, its conditions with
/// `lastTransitionTime` kept from `previous` while a condition's status does not change, and
/// `observedGeneration`.
pub fn status_object(
    status: &Status,
    previous: Option<&Value>,
    generation: i64,
    now_rfc3339: &str,
) -> Value {
    let mut out = status.fields.as_object().cloned().unwrap_or_default();
    let before: BTreeMap<&str, (&str, &str)> = previous
        .and_then(|p| p.get("conditions"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some((
                c.get("type")?.as_str()?,
                (
                    c.get("status")?.as_str()?,
                    c.get("lastTransitionTime")?.as_str()?,
                ),
            ))
        })
        .collect();
    let conditions: Vec<Value> = status
        .conditions
        .iter()
        .map(|c| {
            let since = match before.get(c.type_.as_str()) {
                Some((s, t)) if *s == c.status.as_str() => (*t).to_string(),
                _ => now_rfc3339.to_string(),
            };
            json!({
                "type": c.type_,
                "status": c.status.as_str(),
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": since,
                "observedGeneration": generation,
            })
        })
        .collect();
    if !conditions.is_empty() {
        out.insert("conditions".into(), Value::Array(conditions));
    }
    out.insert("observedGeneration".into(), json!(generation));
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{Condition, ConditionStatus, EventType, Propagation};

    fn primary() -> Primary {
        Primary {
            kind: Gvk::new("example.wasmop.dev/v1", "App"),
            namespace: Some("demo".into()),
            name: "web".into(),
            uid: "u-1".into(),
        }
    }

    fn grant() -> Grant {
        Grant {
            owned: [Gvk::new("apps/v1", "Deployment"), Gvk::new("v1", "Service")].into(),
            related: [Gvk::new("v1", "Pod")].into(),
        }
    }

    fn deployment(name: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": {}})
    }

    fn check(response: ReconcileResponse) -> Result<Validated, Rejected> {
        validate("r1", &primary(), &grant(), &WellKnownScopes, response)
    }

    fn problems(r: Result<Validated, Rejected>) -> Vec<String> {
        r.err()
            .map(|e| e.violations.iter().map(ToString::to_string).collect())
            .unwrap_or_default()
    }

    #[test]
    fn children_are_prepared_with_namespace_label_and_controller_owner() {
        let v = check(ReconcileResponse {
            children: vec![ChildSet {
                kind: Gvk::new("apps/v1", "Deployment"),
                objects: vec![deployment("web")],
            }],
            ..Default::default()
        })
        .expect("valid");
        let o = &v.children[0].objects[0].object;
        assert_eq!(o.pointer("/metadata/namespace"), Some(&json!("demo")));
        assert_eq!(
            o.pointer("/metadata/labels/wasmop.dev~1reconciler"),
            Some(&json!("r1"))
        );
        assert_eq!(
            o.pointer("/metadata/ownerReferences/0/uid"),
            Some(&json!("u-1"))
        );
        assert_eq!(
            o.pointer("/metadata/ownerReferences/0/controller"),
            Some(&json!(true))
        );
    }

    #[test]
    fn every_violation_names_its_intent() {
        let mut other_ns = deployment("b");
        other_ns["metadata"]["namespace"] = json!("kube-system");
        let p = problems(check(ReconcileResponse {
            children: vec![
                ChildSet {
                    kind: Gvk::new("apps/v1", "Deployment"),
                    objects: vec![
                        deployment("a"),
                        other_ns,
                        deployment("Bad_Name"),
                        json!({"kind": "Deployment"}),
                    ],
                },
                ChildSet {
                    kind: Gvk::new("v1", "Secret"),
                    objects: vec![],
                },
            ],
            actions: vec![
                Action::MergePatch {
                    target: ObjectRef {
                        api_version: "v1".into(),
                        kind: "Service".into(),
                        namespace: None,
                        name: "s".into(),
                    },
                    patch: json!([1]),
                },
                Action::JsonPatch {
                    target: ObjectRef {
                        api_version: "v1".into(),
                        kind: "Service".into(),
                        namespace: None,
                        name: "s".into(),
                    },
                    patch: json!([{"op": "frobnicate"}]),
                },
                Action::Delete {
                    target: ObjectRef {
                        api_version: "v1".into(),
                        kind: "ConfigMap".into(),
                        namespace: None,
                        name: "c".into(),
                    },
                    propagation: Propagation::Background,
                },
            ],
            status: Some(Status {
                fields: json!({"observedGeneration": 3}),
                conditions: vec![Condition {
                    type_: "Ready".into(),
                    status: ConditionStatus::True,
                    reason: "not camel".into(),
                    message: String::new(),
                }],
            }),
            events: vec![Event {
                type_: EventType::Normal,
                reason: "".into(),
                message: "m".into(),
                action: String::new(),
                regarding: None,
            }],
            requeue_after: None,
        }));
        let all = p.join("\n");
        for needle in [
            "children[apps/v1/Deployment][1] (b): namespace kube-system is outside",
            "children[apps/v1/Deployment][2] (Bad_Name): metadata.name",
            "children[apps/v1/Deployment][3]: apiVersion and kind are required",
            "children[v1/Secret]: v1/Secret is not an owned kind",
            "actions[0] (merge-patch v1/Service s): a merge patch must be a JSON object",
            "actions[1] (json-patch v1/Service s): not a valid RFC 6902 JSON patch",
            "actions[2] (delete v1/ConfigMap c): v1/ConfigMap is neither",
            "status.fields.observedGeneration: is set by the host",
            "status.conditions[Ready]: reason \"not camel\"",
            "events[0] (): reason must be CamelCase",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
        assert_eq!(p.len(), 10, "{all}");
    }

    #[test]
    fn cluster_scoped_primaries_must_name_namespaces() {
        let cluster_primary = Primary {
            namespace: None,
            ..primary()
        };
        let r = validate(
            "r1",
            &cluster_primary,
            &grant(),
            &WellKnownScopes,
            ReconcileResponse {
                children: vec![ChildSet {
                    kind: Gvk::new("v1", "Service"),
                    objects: vec![
                        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}),
                    ],
                }],
                ..Default::default()
            },
        );
        assert!(problems(r)[0].contains("set the namespace"));
        let r = validate(
            "r1",
            &cluster_primary,
            &grant(),
            &WellKnownScopes,
            ReconcileResponse {
                children: vec![ChildSet {
                    kind: Gvk::new("v1", "Service"),
                    objects: vec![
                        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "a"}}),
                    ],
                }],
                ..Default::default()
            },
        );
        assert!(r.is_ok());
    }

    #[test]
    fn conditions_keep_their_transition_time_while_unchanged() {
        let s = Status {
            fields: json!({"ready": 1}),
            conditions: vec![
                Condition {
                    type_: "Ready".into(),
                    status: ConditionStatus::True,
                    reason: "Ok".into(),
                    message: "m".into(),
                },
                Condition {
                    type_: "Degraded".into(),
                    status: ConditionStatus::False,
                    reason: "Ok".into(),
                    message: "m".into(),
                },
            ],
        };
        let before = json!({"conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Degraded", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ]});
        let out = status_object(&s, Some(&before), 7, "2026-11-23T00:00:00Z");
        assert_eq!(
            out["conditions"][0]["lastTransitionTime"],
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(
            out["conditions"][1]["lastTransitionTime"],
            "2026-11-23T00:00:00Z"
        );
        assert_eq!(out["observedGeneration"], 7);
        assert_eq!(out["ready"], 1);
    }

    #[test]
    fn requeue_delays_are_clamped() {
        let v = check(ReconcileResponse {
            requeue_after: Some(Duration::ZERO),
            ..Default::default()
        })
        .expect("valid");
        assert_eq!(v.requeue_after, Some(REQUEUE_MIN));
    }
}
