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
//! - Only what the module owns is touched ([`Grant`], RBAC cannot say "only my children"): a
//!   patch, delete or Event of an owned kind targets an observed child of this primary; of the
//!   primary kind, the primary itself; of a related kind, only when the WasmReconciler grants
//!   writes (`spec.related[].write`). No patch touches `metadata.finalizers`,
//!   `metadata.ownerReferences` or the whole metadata (merge and JSON patches alike).
//! - Namespaces follow the scope rules: a namespaced primary's intents stay in its namespace
//!   and never target (or own) cluster-scoped objects; a cluster-scoped primary names the
//!   namespace of every namespaced target.
//! - Counts are capped before anything is examined or costs a request ([`Counts`], from
//!   `spec.limits`): an over-limit response is refused whole.
//! - Text from the module is inert ([`crate::text::inert`]): control characters, line
//!   separators and bidirectional marks and overrides in Event notes and condition messages are
//!   escaped (`\n`, `\u{1b}`); in Event actions and condition types they are refused; reasons
//!   are CamelCase. Violations quote module text escaped.
//!
//! # Errors
//! [`Rejected`] with one [`Violation`] per problem.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::contract::{
    Action, ChildKey, ChildSet, Event, Gvk, ObjectRef, ReconcileResponse, Status,
};
use crate::text::{cut, inert, is_unsafe_char};

pub use crate::grant::{
    Counts, DEFAULT_MAX_ACTIONS, DEFAULT_MAX_CHILDREN, DEFAULT_MAX_EVENTS, Grant, Scopes,
    WellKnownScopes,
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

/// Status conditions per response (fixed: a status is one object, at most [`MAX_OBJECT_BYTES`]).
pub const MAX_CONDITIONS: usize = 64;
/// Longest condition message kept (the API's limit).
pub const MAX_CONDITION_MESSAGE: usize = 32768;
/// The bytes a condition takes besides its type, reason and message (field names, status,
/// the transition time and observed generation the host adds).
const CONDITION_OVERHEAD: usize = 128;

/// The observed children of one primary (objects of owned kinds whose controller
/// ownerReference is the primary): what patches and deletes of owned kinds may target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObservedChildren(BTreeSet<(Gvk, Option<String>, String)>);

impl ObservedChildren {
    /// Whether `kind` `namespace/name` is an observed child.
    pub fn contains(&self, kind: &Gvk, namespace: Option<&str>, name: &str) -> bool {
        self.0.contains(&(
            kind.clone(),
            namespace.map(str::to_string),
            name.to_string(),
        ))
    }
}

impl FromIterator<(Gvk, Option<String>, String)> for ObservedChildren {
    fn from_iter<I: IntoIterator<Item = (Gvk, Option<String>, String)>>(iter: I) -> Self {
        ObservedChildren(iter.into_iter().collect())
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

/// The most bytes of each of a violation's intent and problem (module text quoted in them is
/// cut to fit).
pub const MAX_QUOTED: usize = 512;

/// The most violations a refusal's text lists (it says how many more there are).
pub const MAX_LISTED: usize = 10;

/// A refused response.
///
/// # Guarantees
/// Its text (which reaches the log line, the trace and the Warning Event) lists at most
/// [`MAX_LISTED`] violations of at most 2 x [`MAX_QUOTED`] bytes each, whatever the module sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Rejected {
    /// Every problem found.
    pub violations: Vec<Violation>,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.violations.len();
        let plural = if n == 1 { "" } else { "s" };
        write!(
            f,
            "the module's response was refused ({n} problem{plural}): "
        )?;
        for (i, v) in self.violations.iter().take(MAX_LISTED).enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{v}")?;
        }
        if n > MAX_LISTED {
            write!(f, "; ... and {} more", n - MAX_LISTED)?;
        }
        Ok(())
    }
}

/// `text` made inert and cut to [`MAX_QUOTED`] bytes, for a violation.
fn quoted(text: &str) -> String {
    cut(inert(text).into_owned(), MAX_QUOTED)
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
    /// Observed children left as they are (see [`ChildSet::keep`]): not pruned.
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    pub keep: BTreeSet<ChildKey>,
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
    observed: &'a ObservedChildren,
    violations: Vec<Violation>,
}

impl Checker<'_> {
    /// Records a violation; module text quoted in it is made inert and cut ([`quoted`]).
    fn bad(&mut self, intent: impl AsRef<str>, problem: impl AsRef<str>) {
        self.violations.push(Violation {
            intent: quoted(intent.as_ref()),
            problem: quoted(problem.as_ref()),
        });
    }

    /// Whether `kind` is namespaced; None (recorded as a violation of `intent`) when the host
    /// does not know: taking it as namespaced would let a namespaced primary's intents reach a
    /// cluster-scoped kind.
    fn namespaced(&mut self, intent: &str, kind: &Gvk) -> Option<bool> {
        if *kind == self.primary.kind {
            return Some(self.primary.namespace.is_some());
        }
        let known = self.scopes.namespaced(kind);
        if known.is_none() {
            self.bad(
                intent,
                format!("the host does not know whether {kind} is namespaced (discovery has not answered for it); nothing of this response is written"),
            );
        }
        known
    }

    /// Resolves the namespace of a target per the scope rules.
    fn resolve_namespace(
        &mut self,
        intent: &str,
        kind: &Gvk,
        namespace: Option<&str>,
    ) -> Option<Option<String>> {
        let namespace = namespace.filter(|n| !n.is_empty());
        if !self.namespaced(intent, kind)? {
            if let Some(primary) = &self.primary.namespace {
                self.bad(
                    intent,
                    format!("{kind} is cluster-scoped: the intents of a primary in namespace {primary} never target cluster-scoped objects"),
                );
                return None;
            }
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
            let Some(namespaced) = self.namespaced(&base, &kind) else {
                continue;
            };
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
                keep: set.keep.into_iter().collect(),
            });
        }
        out
    }

    fn child(&mut self, intent: &str, kind: &Gvk, mut object: Value) -> Option<PreparedChild> {
        let size = json_len(&object);
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
        if !self.child_kind(intent, kind, map) {
            return None;
        }
        let meta = map.entry("metadata").or_insert_with(|| json!({}));
        let Some(meta) = meta.as_object_mut() else {
            self.bad(intent, "metadata is not an object");
            return None;
        };
        let (namespace, name) = self.child_identity(intent, kind, meta)?;
        self.stamp_child(intent, meta)?;
        Some(PreparedChild {
            namespace,
            name,
            object,
        })
    }

    /// Whether a child's `apiVersion` and `kind` are set and those of its child set.
    fn child_kind(&mut self, intent: &str, kind: &Gvk, map: &Map<String, Value>) -> bool {
        let field = |m: &Map<String, Value>, k: &str| {
            m.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (api_version, k) = (field(map, "apiVersion"), field(map, "kind"));
        if api_version.is_empty() || k.is_empty() {
            self.bad(intent, "apiVersion and kind are required");
            return false;
        }
        if api_version != kind.api_version || k != kind.kind {
            self.bad(
                intent,
                format!("the object is a {api_version}/{k} in the set of {kind}"),
            );
            return false;
        }
        true
    }

    /// A child's namespace and name: the name required and valid, no field the host or the API
    /// server sets, the namespace resolved by the scope rules and written back into `meta`.
    fn child_identity(
        &mut self,
        intent: &str,
        kind: &Gvk,
        meta: &mut Map<String, Value>,
    ) -> Option<(Option<String>, String)> {
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
            "finalizers",
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
        Some((namespace, name))
    }

    /// Puts the host's marks on a child: the reconciler label (refused if it names another
    /// reconciler) and the primary as its controller ownerReference.
    fn stamp_child(&mut self, intent: &str, meta: &mut Map<String, Value>) -> Option<()> {
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
        Some(())
    }

    /// Checks the target of an action or Event: a granted kind, a valid name, the scope rules,
    /// and that the object is the module's to touch (see [`Checker::owns_target`]).
    fn target(&mut self, intent: &str, target: &ObjectRef) -> Option<ObjectRef> {
        let kind = target.gvk();
        if !self.may_target(&kind) {
            self.bad(intent, format!("{kind} is neither the primary kind nor an owned or related kind of this reconciler"));
            return None;
        }
        self.check_name(intent, &target.name);
        let namespace = self.resolve_namespace(intent, &kind, target.namespace.as_deref())?;
        let resolved = ObjectRef {
            namespace,
            ..target.clone()
        };
        match self.owns_target(&kind, &resolved) {
            Ok(()) => Some(resolved),
            Err(rule) => {
                self.bad(intent, rule);
                None
            }
        }
    }

    /// The ownership rule: the primary itself, an observed child of this primary, or an object
    /// of a related kind the WasmReconciler grants writes to.
    ///
    /// # Errors
    /// The rule the target breaks.
    fn owns_target(&self, kind: &Gvk, target: &ObjectRef) -> Result<(), String> {
        let primary = &self.primary;
        if *kind == primary.kind
            && target.namespace == primary.namespace
            && target.name == primary.name
        {
            return Ok(());
        }
        if self.grant.owned.contains(kind)
            && self
                .observed
                .contains(kind, target.namespace.as_deref(), &target.name)
        {
            return Ok(());
        }
        if self.grant.writable.contains(kind) {
            return Ok(());
        }
        Err(if self.grant.owned.contains(kind) {
            "not an observed child of this primary: of an owned kind, intents may target only the primary's own children".to_string()
        } else if *kind == primary.kind {
            format!(
                "not this primary: of the primary kind, intents may target only the primary itself ({})",
                primary.object_ref()
            )
        } else {
            format!(
                "{kind} is a related kind, read-only here: set `write: true` on it in the WasmReconciler's spec.related to let the module patch, delete or report Events on it"
            )
        })
    }

    /// Refuses patches of what the host and other controllers own in every object:
    /// `metadata.finalizers`, `metadata.ownerReferences`, the whole metadata or the whole object.
    fn protected_fields(&mut self, intent: &str, action: &Action) -> bool {
        let touched: Vec<String> = match action {
            Action::MergePatch { patch, .. } => match patch.get("metadata") {
                None => Vec::new(),
                Some(Value::Object(meta)) => PROTECTED
                    .iter()
                    .filter(|f| meta.contains_key(**f))
                    .map(|f| format!("metadata.{f}"))
                    .collect(),
                Some(_) => vec!["metadata".into()],
            },
            Action::JsonPatch { patch, .. } => patch
                .as_array()
                .into_iter()
                .flatten()
                .filter(|op| op.get("op").and_then(Value::as_str) != Some("test"))
                .flat_map(|op| {
                    // A move removes its source; a copy or a test only reads it.
                    let from = match op.get("op").and_then(Value::as_str) {
                        Some("move") => op.get("from"),
                        _ => None,
                    };
                    [op.get("path"), from]
                })
                .flatten()
                .filter_map(Value::as_str)
                .filter(|p| is_protected_pointer(p))
                .map(|p| format!("{p:?}"))
                .collect(),
            Action::Delete { .. } => Vec::new(),
        };
        if touched.is_empty() {
            return true;
        }
        self.bad(intent, format!("the patch touches {}: metadata.finalizers and metadata.ownerReferences belong to the host and other controllers", touched.join(", ")));
        false
    }

    fn actions(&mut self, actions: Vec<Action>) -> Vec<Action> {
        let mut out = Vec::new();
        for (i, action) in actions.into_iter().enumerate() {
            let intent = format!("actions[{i}] ({} {})", action.name(), action.target());
            let Some(target) = self.target(&intent, action.target()) else {
                continue;
            };
            if !self.protected_fields(&intent, &action) {
                continue;
            }
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
                let size = json_len(patch);
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
        let mut status = status?;
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
        let size = json_len(&status.fields);
        if size > MAX_OBJECT_BYTES {
            self.bad(
                "status.fields",
                format!("{size} bytes, over the {MAX_OBJECT_BYTES}-byte limit"),
            );
            ok = false;
        }
        let mut types = BTreeSet::new();
        for c in &mut status.conditions {
            let intent = format!("status.conditions[{}]", c.type_);
            if c.type_.is_empty() || c.type_.len() > 316 {
                self.bad(&intent, "type must be 1 to 316 characters");
                ok = false;
            }
            if c.type_.chars().any(is_unsafe_char) {
                self.bad(&intent, "type must not contain control characters");
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
            if c.message.len() > MAX_CONDITION_MESSAGE {
                self.bad(
                    &intent,
                    format!("message is over {MAX_CONDITION_MESSAGE} characters"),
                );
                ok = false;
            }
            if let std::borrow::Cow::Owned(escaped) = inert(&c.message) {
                c.message = cut(escaped, MAX_CONDITION_MESSAGE);
            }
        }
        // The whole status is written as one object: each part within its bound is not
        // enough (64 conditions of 32 KiB messages are 2 MiB).
        let conditions: usize = status
            .conditions
            .iter()
            .map(|c| c.type_.len() + c.reason.len() + c.message.len() + CONDITION_OVERHEAD)
            .sum();
        let total = size.saturating_add(conditions);
        if ok && total > MAX_OBJECT_BYTES {
            self.bad(
                "status",
                format!("{total} bytes with its conditions, over the {MAX_OBJECT_BYTES}-byte limit of an object"),
            );
            ok = false;
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
            } else if e.action.chars().any(is_unsafe_char) {
                self.bad(
                    &intent,
                    format!("action {:?} must not contain control characters", e.action),
                );
                continue;
            }
            e.message = cut(inert(&e.message).into_owned(), MAX_EVENT_NOTE);
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

/// Metadata fields no module patches.
const PROTECTED: [&str; 2] = ["finalizers", "ownerReferences"];

/// Whether a JSON pointer (RFC 6901) reaches the whole object, the whole metadata or a
/// [`PROTECTED`] field.
fn is_protected_pointer(pointer: &str) -> bool {
    let tokens: Vec<String> = pointer
        .split('/')
        .skip(1)
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    match tokens.as_slice() {
        [] => true,
        [meta] => meta == "metadata",
        [meta, field, ..] => meta == "metadata" && PROTECTED.contains(&field.as_str()),
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

/// Refuses a response that carries more than the grant's [`Counts`] (or more child sets than
/// owned kinds, or more than [`MAX_CONDITIONS`] conditions), before any intent is examined.
///
/// # Errors
/// [`Rejected`] with one violation per count over its limit.
pub fn check_counts(grant: &Grant, response: &ReconcileResponse) -> Result<(), Rejected> {
    let limits = grant.counts;
    let children: usize = response.children.iter().map(|s| s.objects.len()).sum();
    let conditions = response.status.as_ref().map_or(0, |s| s.conditions.len());
    let over = |n: usize, max: u32| n > max as usize;
    let mut violations = Vec::new();
    let mut bad = |intent: &str, problem: String| {
        violations.push(Violation {
            intent: intent.into(),
            problem: quoted(&problem),
        })
    };
    if response.children.len() > grant.owned.len() {
        bad(
            "children",
            format!(
                "{} child sets, but this reconciler owns {} kinds (send one complete set per owned kind)",
                response.children.len(),
                grant.owned.len()
            ),
        );
    }
    if over(children, limits.children) {
        let per_set: Vec<String> = response
            .children
            .iter()
            .map(|s| format!("{} {}", s.objects.len(), inert(&s.kind.to_string())))
            .collect();
        bad(
            "children",
            format!(
                "{children} objects ({}), over the limit of {} per response (spec.limits.children)",
                per_set.join(", "),
                limits.children
            ),
        );
    }
    if over(response.actions.len(), limits.actions) {
        bad(
            "actions",
            format!(
                "{} actions, over the limit of {} per response (spec.limits.actions)",
                response.actions.len(),
                limits.actions
            ),
        );
    }
    if over(response.events.len(), limits.events) {
        bad(
            "events",
            format!(
                "{} Events, over the limit of {} per response (spec.limits.events)",
                response.events.len(),
                limits.events
            ),
        );
    }
    if conditions > MAX_CONDITIONS {
        bad(
            "status.conditions",
            format!("{conditions} conditions, over the limit of {MAX_CONDITIONS}"),
        );
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(Rejected { violations })
    }
}

/// Validates `response` for `primary` under `grant`, preparing the children. Patches, deletes
/// and Events of owned kinds may target only `observed` children of `primary`.
///
/// # Errors
/// [`Rejected`] listing every violation.
pub fn validate(
    reconciler: &str,
    primary: &Primary,
    grant: &Grant,
    scopes: &dyn Scopes,
    observed: &ObservedChildren,
    response: ReconcileResponse,
) -> Result<Validated, Rejected> {
    check_counts(grant, &response)?;
    let mut checker = Checker {
        reconciler,
        primary,
        grant,
        scopes,
        observed,
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

/// The length of `value` as compact JSON (`value.to_string().len()`), counted as it is written
/// instead of building the string (once per child, patch and status of every reconcile).
fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // A Value always serializes, and this writer never fails.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{Condition, ConditionStatus, EventType, Propagation};

    #[test]
    fn json_len_is_the_length_of_the_compact_json() {
        for value in [
            json!({"a": [1, 2.5, null, true], "b": {"c": "d\"e\\f\u{1}é"}}),
            json!("x"),
            json!({}),
        ] {
            assert_eq!(json_len(&value), value.to_string().len(), "{value}");
        }
    }

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
            ..Grant::default()
        }
    }

    fn deployment(name: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": {}})
    }

    /// The observed children of `primary()`: Service `demo/s` and Deployment `demo/web`.
    fn observed() -> ObservedChildren {
        [
            (Gvk::new("v1", "Service"), Some("demo".into()), "s".into()),
            (
                Gvk::new("apps/v1", "Deployment"),
                Some("demo".into()),
                "web".into(),
            ),
        ]
        .into_iter()
        .collect()
    }

    fn check(response: ReconcileResponse) -> Result<Validated, Rejected> {
        validate(
            "r1",
            &primary(),
            &grant(),
            &WellKnownScopes,
            &observed(),
            response,
        )
    }

    fn problems(r: Result<Validated, Rejected>) -> Vec<String> {
        r.err()
            .map(|e| e.violations.iter().map(ToString::to_string).collect())
            .unwrap_or_default()
    }

    /// Knows the scope of no kind (discovery has not answered for them).
    struct NoScopes;

    impl Scopes for NoScopes {
        fn namespaced(&self, _: &Gvk) -> Option<bool> {
            None
        }
    }

    #[test]
    fn a_kind_of_unknown_scope_is_refused_not_taken_as_namespaced() {
        let role = Gvk::new("rbac.authorization.k8s.io/v1", "ClusterRole");
        let grant = Grant {
            owned: [role.clone()].into(),
            ..Grant::default()
        };
        let object = json!({"apiVersion": role.api_version, "kind": role.kind, "metadata": {"name": "admin-2"}});
        let r = validate(
            "r1",
            &primary(),
            &grant,
            &NoScopes,
            &observed(),
            ReconcileResponse {
                children: vec![ChildSet {
                    keep: Vec::new(),
                    kind: role.clone(),
                    objects: vec![object],
                }],
                ..Default::default()
            },
        );
        let p = problems(r);
        assert!(
            p.iter().any(|p| p.contains("does not know whether")),
            "a ClusterRole of unknown scope was accepted as namespaced: {p:?}"
        );
    }

    /// A child carrying finalizers: nothing could ever remove them (patches of
    /// `metadata.finalizers` are refused, finalize applies no children, and nothing reconciles
    /// once the primary is gone), so the child, and its namespace's deletion, would hang.
    #[test]
    fn a_child_with_finalizers_is_refused() {
        let mut child = deployment("web");
        child["metadata"]["finalizers"] = json!(["x.io/hold"]);
        let p = problems(check(ReconcileResponse {
            children: vec![ChildSet {
                keep: Vec::new(),
                kind: Gvk::new("apps/v1", "Deployment"),
                objects: vec![child],
            }],
            ..Default::default()
        }));
        assert!(p.iter().any(|p| p.contains("metadata.finalizers")), "{p:?}");
    }

    /// The whole status must fit an object: 64 conditions of 32 KiB messages beside 1 MiB of
    /// fields passed each check alone, then the API server refused the write at every retry
    /// (a transient error, for ever) instead of the module's answer being refused.
    #[test]
    fn a_status_larger_than_an_object_is_refused() {
        let conditions = (0..64)
            .map(|i| Condition {
                type_: format!("C{i}"),
                status: ConditionStatus::True,
                reason: "Big".into(),
                message: "x".repeat(MAX_CONDITION_MESSAGE),
            })
            .collect();
        let p = problems(check(ReconcileResponse {
            status: Some(Status {
                fields: json!({}),
                conditions,
            }),
            ..Default::default()
        }));
        assert!(p.iter().any(|p| p.contains("status")), "{p:?}");
    }

    #[test]
    fn children_are_prepared_with_namespace_label_and_controller_owner() {
        let v = check(ReconcileResponse {
            children: vec![ChildSet {
                keep: Vec::new(),
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
                    keep: Vec::new(),
                    kind: Gvk::new("apps/v1", "Deployment"),
                    objects: vec![
                        deployment("a"),
                        other_ns,
                        deployment("Bad_Name"),
                        json!({"kind": "Deployment"}),
                    ],
                },
                ChildSet {
                    keep: Vec::new(),
                    kind: Gvk::new("v1", "Secret"),
                    objects: vec![],
                },
            ],
            actions: vec![
                merge(target("v1", "Service", "s"), json!([1])),
                Action::JsonPatch {
                    target: target("v1", "Service", "s"),
                    patch: json!([{"op": "frobnicate"}]),
                },
                delete(target("v1", "ConfigMap", "c")),
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
                reason: "".into(),
                ..event_on(None)
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
            &ObservedChildren::default(),
            ReconcileResponse {
                children: vec![ChildSet {
                    keep: Vec::new(),
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
            &ObservedChildren::default(),
            ReconcileResponse {
                children: vec![ChildSet {
                    keep: Vec::new(),
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

    fn target(api_version: &str, kind: &str, name: &str) -> ObjectRef {
        ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: None,
            name: name.into(),
        }
    }

    fn merge(target: ObjectRef, patch: Value) -> Action {
        Action::MergePatch { target, patch }
    }

    fn delete(target: ObjectRef) -> Action {
        Action::Delete {
            target,
            propagation: Propagation::Background,
        }
    }

    fn event_on(regarding: Option<ObjectRef>) -> Event {
        Event {
            type_: EventType::Normal,
            reason: "Noted".into(),
            message: "m".into(),
            action: String::new(),
            regarding,
        }
    }

    fn actions(actions: Vec<Action>) -> Vec<String> {
        problems(check(ReconcileResponse {
            actions,
            ..Default::default()
        }))
    }

    #[test]
    fn owned_kinds_are_touched_only_in_observed_children() {
        let p = actions(vec![
            merge(target("v1", "Service", "s"), json!({"spec": {}})),
            delete(target("apps/v1", "Deployment", "web")),
            merge(target("v1", "Service", "kube-dns"), json!({"spec": {}})),
            delete(target("apps/v1", "Deployment", "someone-elses")),
        ]);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p[0].starts_with("actions[2] (merge-patch v1/Service kube-dns): not an observed child of this primary"),
            "{p:?}"
        );
        assert!(
            p[1].starts_with(
                "actions[3] (delete apps/v1/Deployment someone-elses): not an observed child"
            ),
            "{p:?}"
        );
        let p = problems(check(ReconcileResponse {
            events: vec![
                event_on(Some(target("v1", "Service", "s"))),
                event_on(Some(target("v1", "Service", "other"))),
            ],
            ..Default::default()
        }));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("events[1] (Noted): not an observed child"),
            "{p:?}"
        );
    }

    #[test]
    fn of_the_primary_kind_only_the_primary_itself_is_touched() {
        let app = |name: &str| target("example.wasmop.dev/v1", "App", name);
        let p = actions(vec![
            merge(app("web"), json!({"metadata": {"labels": {"seen": "yes"}}})),
            delete(app("web")),
            delete(app("another-tenant")),
            merge(app("another-tenant"), json!({"spec": {}})),
        ]);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].starts_with("actions[2] (delete example.wasmop.dev/v1/App another-tenant): not this primary: of the primary kind, intents may target only the primary itself (example.wasmop.dev/v1/App demo/web)"), "{p:?}");
        assert!(p[1].starts_with("actions[3] (merge-patch"), "{p:?}");
        let p = problems(check(ReconcileResponse {
            events: vec![event_on(Some(app("another-tenant")))],
            ..Default::default()
        }));
        assert!(p[0].contains("not this primary"), "{p:?}");
    }

    #[test]
    fn finalizers_owner_references_and_whole_metadata_are_never_patched() {
        let app = target("example.wasmop.dev/v1", "App", "web");
        let child = target("v1", "Service", "s");
        let json_patch = |ops: Value| Action::JsonPatch {
            target: app.clone(),
            patch: ops,
        };
        let refused = [
            merge(app.clone(), json!({"metadata": {"finalizers": null}})),
            merge(app.clone(), json!({"metadata": {"finalizers": []}})),
            merge(child.clone(), json!({"metadata": {"ownerReferences": []}})),
            merge(app.clone(), json!({"metadata": null})),
            json_patch(json!([{"op": "remove", "path": "/metadata/finalizers"}])),
            json_patch(json!([{"op": "remove", "path": "/metadata/finalizers/0"}])),
            json_patch(
                json!([{"op": "replace", "path": "/metadata/ownerReferences", "value": []}]),
            ),
            json_patch(json!([{"op": "replace", "path": "/metadata", "value": {}}])),
            json_patch(json!([{"op": "replace", "path": "", "value": {}}])),
            json_patch(
                json!([{"op": "move", "from": "/metadata/finalizers", "path": "/spec/kept"}]),
            ),
            json_patch(json!([
                {"op": "test", "path": "/spec", "value": {}},
                {"op": "add", "path": "/metadata/ownerReferences/-", "value": {}}
            ])),
        ];
        let n = refused.len();
        let p = actions(refused.to_vec());
        assert_eq!(p.len(), n, "{p:#?}");
        for (i, problem) in p.iter().enumerate() {
            assert!(
                problem.starts_with(&format!("actions[{i}] ("))
                    && problem.contains("the patch touches"),
                "{problem}"
            );
        }
        assert!(p[0].contains("touches metadata.finalizers:"), "{}", p[0]);
        assert!(
            p[4].contains("touches \"/metadata/finalizers\":"),
            "{}",
            p[4]
        );
        let allowed = actions(vec![
            merge(app.clone(), json!({"metadata": {"labels": {"a": "b"}}})),
            merge(child, json!({"metadata": {"annotations": {"a": "b"}}})),
            json_patch(json!([
                {"op": "test", "path": "/metadata/finalizers", "value": ["x"]},
                {"op": "add", "path": "/metadata/labels/a", "value": "b"},
                {"op": "copy", "from": "/metadata/finalizers", "path": "/metadata/annotations/f"},
                {"op": "add", "path": "/metadata/annotations/finalizers~1x", "value": "y"}
            ])),
        ]);
        assert!(allowed.is_empty(), "{allowed:#?}");
    }

    #[test]
    fn related_kinds_are_read_only_unless_the_reconciler_grants_writes() {
        let pod = target("v1", "Pod", "p");
        let response = || ReconcileResponse {
            actions: vec![
                delete(pod.clone()),
                merge(pod.clone(), json!({"metadata": {"labels": {"a": "b"}}})),
            ],
            events: vec![event_on(Some(pod.clone()))],
            ..Default::default()
        };
        let p = problems(check(response()));
        assert_eq!(p.len(), 3, "{p:#?}");
        for problem in &p {
            assert!(
                problem.contains("v1/Pod is a related kind, read-only here: set `write: true`"),
                "{problem}"
            );
        }
        let writable = grant().with_spec([Gvk::new("v1", "Pod")], Counts::default());
        let r = validate(
            "r1",
            &primary(),
            &writable,
            &WellKnownScopes,
            &observed(),
            response(),
        );
        assert!(r.is_ok(), "{:?}", problems(r));
        // A write grant of a kind that is not related grants nothing.
        let stray = grant().with_spec([Gvk::new("v1", "Secret")], Counts::default());
        assert!(stray.writable.is_empty());
    }

    #[test]
    fn a_namespaced_primary_never_targets_cluster_scoped_objects() {
        let ns = Gvk::new("v1", "Namespace");
        let mut g = grant();
        g.related.insert(ns.clone());
        let g = g.with_spec([ns], Counts::default());
        let response = || ReconcileResponse {
            actions: vec![merge(
                target("v1", "Namespace", "kube-system"),
                json!({"metadata": {"labels": {"a": "b"}}}),
            )],
            events: vec![event_on(Some(target("v1", "Namespace", "kube-system")))],
            ..Default::default()
        };
        let p = problems(validate(
            "r1",
            &primary(),
            &g,
            &WellKnownScopes,
            &observed(),
            response(),
        ));
        assert_eq!(p.len(), 2, "{p:#?}");
        assert!(p[0].contains("v1/Namespace is cluster-scoped: the intents of a primary in namespace demo never target"), "{p:#?}");
        let cluster_primary = Primary {
            namespace: None,
            ..primary()
        };
        let r = validate(
            "r1",
            &cluster_primary,
            &g,
            &WellKnownScopes,
            &observed(),
            response(),
        );
        assert!(r.is_ok(), "{:?}", problems(r));
    }

    #[test]
    fn counts_are_capped_before_any_intent_is_examined() {
        let small = Counts {
            children: 2,
            actions: 1,
            events: 1,
        };
        let g = grant().with_spec([], small);
        let over = ReconcileResponse {
            // Invalid objects: were they examined, each would be a violation of its own.
            children: vec![ChildSet {
                keep: Vec::new(),
                kind: Gvk::new("apps/v1", "Deployment"),
                objects: vec![json!("x"), json!("y"), json!("z")],
            }],
            actions: vec![
                delete(target("v1", "Secret", "a")),
                delete(target("v1", "Secret", "b")),
            ],
            events: vec![event_on(None), event_on(None)],
            status: Some(Status {
                fields: json!({}),
                conditions: (0..=MAX_CONDITIONS)
                    .map(|i| Condition {
                        type_: format!("C{i}"),
                        status: ConditionStatus::True,
                        reason: "Ok".into(),
                        message: String::new(),
                    })
                    .collect(),
            }),
            requeue_after: None,
        };
        let p = problems(validate(
            "r1",
            &primary(),
            &g,
            &WellKnownScopes,
            &observed(),
            over,
        ));
        assert_eq!(
            p,
            vec![
                "children: 3 objects (3 apps/v1/Deployment), over the limit of 2 per response (spec.limits.children)",
                "actions: 2 actions, over the limit of 1 per response (spec.limits.actions)",
                "events: 2 Events, over the limit of 1 per response (spec.limits.events)",
                "status.conditions: 65 conditions, over the limit of 64",
            ]
        );
        let sets = ReconcileResponse {
            children: (0..3)
                .map(|i| ChildSet {
                    keep: Vec::new(),
                    kind: Gvk::new("v1", format!("K{i}")),
                    objects: vec![],
                })
                .collect(),
            ..Default::default()
        };
        let p = problems(check(sets));
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(p[0].starts_with("children: 3 child sets, but this reconciler owns 2 kinds"));
        // At the limit is fine, and the defaults are the documented ones.
        let at = ReconcileResponse {
            children: vec![ChildSet {
                keep: Vec::new(),
                kind: Gvk::new("apps/v1", "Deployment"),
                objects: vec![deployment("a"), deployment("b")],
            }],
            ..Default::default()
        };
        assert!(validate("r1", &primary(), &g, &WellKnownScopes, &observed(), at).is_ok());
        assert_eq!(
            Counts::default(),
            Counts {
                children: 500,
                actions: 100,
                events: 20
            }
        );
    }

    /// A refusal's text reaches the log line, the trace and the Warning Event: whatever the
    /// module sent (within its 4 MiB output), it stays small. Each violation quotes at most
    /// `MAX_QUOTED` of the module's text, and the refusal lists at most `MAX_LISTED`.
    #[test]
    fn a_refusal_stays_small_whatever_the_module_sent() {
        let huge = "\u{1}".repeat(1 << 20);
        let rejected = check(ReconcileResponse {
            status: Some(Status {
                fields: json!({}),
                conditions: vec![Condition {
                    type_: huge.clone(),
                    status: ConditionStatus::True,
                    reason: huge.clone(),
                    message: String::new(),
                }],
            }),
            events: (0..10)
                .map(|_| Event {
                    reason: huge[..1000].to_string(),
                    ..event_on(None)
                })
                .collect(),
            ..Default::default()
        })
        .err()
        .map(|r| r.to_string())
        .unwrap_or_default();
        assert!(
            rejected.contains("refused"),
            "{}",
            &rejected[..rejected.len().min(500)]
        );
        assert!(rejected.len() < 16 << 10, "{} bytes", rejected.len());
    }

    #[test]
    fn text_from_the_module_is_inert() {
        let v = check(ReconcileResponse {
            status: Some(Status {
                fields: json!({}),
                conditions: vec![Condition {
                    type_: "Ready".into(),
                    status: ConditionStatus::True,
                    reason: "Ok".into(),
                    message: "line\nforged\u{1b}[31mred\u{0}\u{202e}".into(),
                }],
            }),
            events: vec![Event {
                message: "note\r\nlevel=error msg=forged\u{7f}".into(),
                ..event_on(None)
            }],
            ..Default::default()
        })
        .expect("valid");
        let message = &v.status.as_ref().expect("status").conditions[0].message;
        assert_eq!(message, "line\\nforged\\u{1b}[31mred\\u{0}\\u{202e}");
        assert_eq!(
            v.events[0].message,
            "note\\r\\nlevel=error msg=forged\\u{7f}"
        );
        let p = problems(check(ReconcileResponse {
            children: vec![ChildSet {
                keep: Vec::new(),
                kind: Gvk::new("apps/v1", "Deployment"),
                objects: vec![deployment("a\nINFO forged")],
            }],
            status: Some(Status {
                fields: json!({}),
                conditions: vec![Condition {
                    type_: "Ready\n".into(),
                    status: ConditionStatus::True,
                    reason: "Ok\u{1b}".into(),
                    message: String::new(),
                }],
            }),
            events: vec![Event {
                action: "Scale\u{0}".into(),
                ..event_on(None)
            }],
            ..Default::default()
        }));
        let all = p.join("\n");
        assert_eq!(p.len(), 4, "{all}");
        assert!(
            all.contains("type must not contain control characters"),
            "{all}"
        );
        assert!(
            all.contains("reason \"Ok\\u{1b}\" must be CamelCase"),
            "{all}"
        );
        assert!(
            all.contains("action \"Scale\\0\" must not contain control characters"),
            "{all}"
        );
        assert!(all.contains("(a\\nINFO forged)"), "{all}");
        assert!(!p.iter().any(|v| v.chars().any(char::is_control)), "{p:?}");
        // Long notes are escaped, then cut at the API's limit.
        let v = check(ReconcileResponse {
            events: vec![Event {
                message: "\n".repeat(MAX_EVENT_NOTE),
                ..event_on(None)
            }],
            ..Default::default()
        })
        .expect("valid");
        assert_eq!(v.events[0].message.len(), MAX_EVENT_NOTE);
        assert!(v.events[0].message.ends_with("..."));
        assert_eq!(inert("plain"), std::borrow::Cow::Borrowed("plain"));
    }
}
