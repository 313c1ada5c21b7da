//! The host's view of the `wasmop:reconciler@0.1.0` contract: plain Rust types, independent of
//! wasmtime, that the engine converts to and from the WIT bindings.
//!
//! Requests carry objects as JSON text (serialized once by the caller); responses carry parsed
//! JSON values (the engine parses and rejects malformed output).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The WIT package this host implements.
pub const WIT_PACKAGE: &str = "wasmop:reconciler";
/// The WIT package version this host implements.
pub const WIT_VERSION: &str = "0.1.0";

/// A group/version/kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gvk {
    /// `v1`, `apps/v1`.
    pub api_version: String,
    /// `Deployment`.
    pub kind: String,
}

impl Gvk {
    /// A kind from `apiVersion` and `kind`.
    pub fn new(api_version: impl Into<String>, kind: impl Into<String>) -> Self {
        Gvk {
            api_version: api_version.into(),
            kind: kind.into(),
        }
    }

    /// The API group (`""` for the core group).
    pub fn group(&self) -> &str {
        self.api_version
            .rsplit_once('/')
            .map(|(g, _)| g)
            .unwrap_or("")
    }

    /// The version (`v1`).
    pub fn version(&self) -> &str {
        self.api_version
            .rsplit_once('/')
            .map(|(_, v)| v)
            .unwrap_or(&self.api_version)
    }

    /// The kind of a k8s-openapi type.
    pub fn of<K: k8s_openapi::Resource>() -> Self {
        Gvk::new(K::API_VERSION, K::KIND)
    }
}

impl fmt::Display for Gvk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.api_version, self.kind)
    }
}

/// A reference to one object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// The namespace (None: cluster-scoped, or the primary's namespace for intents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The name.
    pub name: String,
}

impl ObjectRef {
    /// The referenced kind.
    pub fn gvk(&self) -> Gvk {
        Gvk::new(self.api_version.clone(), self.kind.clone())
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.gvk(), ns, self.name),
            None => write!(f, "{} {}", self.gvk(), self.name),
        }
    }
}

/// A label-selector operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SelectorOperator {
    /// `In`.
    In,
    /// `NotIn`.
    NotIn,
    /// `Exists`.
    Exists,
    /// `DoesNotExist`.
    DoesNotExist,
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SelectorRequirement {
    /// The label key.
    pub key: String,
    /// The operator.
    pub operator: SelectorOperator,
    /// The values.
    #[serde(default)]
    pub values: Vec<String>,
}

/// A label selector; the default selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Selector {
    /// Exact matches.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Further requirements.
    #[serde(default)]
    pub match_expressions: Vec<SelectorRequirement>,
}

impl Selector {
    /// The selector in the API server's query syntax (`a=b,c in (d,e),!f`); empty for everything.
    pub fn to_query(&self) -> String {
        let mut parts: Vec<String> = self
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        for r in &self.match_expressions {
            parts.push(match r.operator {
                SelectorOperator::In => format!("{} in ({})", r.key, r.values.join(",")),
                SelectorOperator::NotIn => format!("{} notin ({})", r.key, r.values.join(",")),
                SelectorOperator::Exists => r.key.clone(),
                SelectorOperator::DoesNotExist => format!("!{}", r.key),
            });
        }
        parts.join(",")
    }

    /// Whether `labels` match.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let got = labels.get(&r.key);
                match r.operator {
                    SelectorOperator::In => got.is_some_and(|v| r.values.contains(v)),
                    SelectorOperator::NotIn => got.is_none_or(|v| !r.values.contains(v)),
                    SelectorOperator::Exists => got.is_some(),
                    SelectorOperator::DoesNotExist => got.is_none(),
                }
            })
    }
}

/// Which primaries a change of a related object re-reconciles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Mapping {
    /// Every primary.
    AllPrimaries,
    /// The primary named by this label's value.
    PrimaryNamedByLabel(String),
    /// The primary with the same namespace and name.
    SameName,
}

/// A kind a module reads but does not own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RelatedKind {
    /// The kind.
    pub kind: Gvk,
    /// Which objects.
    pub selector: Selector,
    /// Which primaries a change concerns.
    pub maps_to: Mapping,
}

/// What a module says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModuleMetadata {
    /// The module's name.
    pub name: String,
    /// The module's version.
    pub version: String,
    /// The primary kind.
    pub primary: Gvk,
    /// Owned kinds.
    pub owns: Vec<Gvk>,
    /// Related kinds.
    pub related: Vec<RelatedKind>,
    /// Whether finalize does work.
    pub finalizes: bool,
    /// Whether validate does work.
    pub validates: bool,
}

/// Why a reconcile runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Trigger {
    /// The primary changed or was first seen.
    PrimaryChanged,
    /// An owned child changed.
    ChildChanged(ObjectRef),
    /// A related object changed.
    RelatedChanged(ObjectRef),
    /// The periodic resync.
    Resync,
    /// The module's requeue-after.
    Requeue,
    /// A retry after a failure.
    Retry,
    /// A new module was activated.
    ModuleChanged,
    /// An offline run or a self-check.
    DryRun,
}

impl Trigger {
    /// A short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Trigger::PrimaryChanged => "primary-changed",
            Trigger::ChildChanged(_) => "child-changed",
            Trigger::RelatedChanged(_) => "related-changed",
            Trigger::Resync => "resync",
            Trigger::Requeue => "requeue",
            Trigger::Retry => "retry",
            Trigger::ModuleChanged => "module-changed",
            Trigger::DryRun => "dry-run",
        }
    }
}

/// Facts about a call.
#[derive(Debug, Clone)]
pub struct Context {
    /// The WasmReconciler's name.
    pub reconciler: String,
    /// Why.
    pub trigger: Trigger,
    /// Attempt number (1 = first).
    pub attempt: u32,
    /// The config JSON (`{}` when none).
    pub config: String,
    /// Milliseconds since the Unix epoch.
    pub now_unix_ms: u64,
}

/// Objects of one kind, as JSON text.
#[derive(Debug, Clone)]
pub struct KindObjects {
    /// The kind.
    pub kind: Gvk,
    /// The objects.
    pub objects: Vec<String>,
}

/// A reconcile or finalize request.
#[derive(Debug, Clone)]
pub struct ReconcileRequest {
    /// The primary, as JSON text.
    pub primary: String,
    /// Observed children per owned kind (every owned kind present).
    pub owned: Vec<KindObjects>,
    /// Related objects per related kind.
    pub related: Vec<KindObjects>,
    /// Facts about the call.
    pub context: Context,
}

/// The complete desired set of children of one kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildSet {
    /// The kind.
    pub kind: Gvk,
    /// The desired objects.
    pub objects: Vec<Value>,
    /// Observed children of this kind left exactly as they are: neither applied nor pruned.
    /// Only the host's own adapters set it (a Metacontroller hook's children that the child's
    /// update strategy does not update now); a module's response never does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keep: Vec<ChildKey>,
}

/// The namespace and name of a child.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ChildKey {
    /// The namespace (None: cluster-scoped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The name.
    pub name: String,
}

/// How a delete propagates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Propagation {
    /// Background.
    Background,
    /// Foreground.
    Foreground,
    /// Orphan.
    Orphan,
}

impl Propagation {
    /// The API's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Propagation::Background => "Background",
            Propagation::Foreground => "Foreground",
            Propagation::Orphan => "Orphan",
        }
    }
}

/// An imperative intent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum Action {
    /// A merge patch.
    MergePatch {
        /// The target.
        target: ObjectRef,
        /// The patch (an object).
        patch: Value,
    },
    /// A JSON patch.
    JsonPatch {
        /// The target.
        target: ObjectRef,
        /// The patch (an array).
        patch: Value,
    },
    /// A delete.
    Delete {
        /// The target.
        target: ObjectRef,
        /// Propagation policy.
        propagation: Propagation,
    },
}

impl Action {
    /// The object the action is about.
    pub fn target(&self) -> &ObjectRef {
        match self {
            Action::MergePatch { target, .. }
            | Action::JsonPatch { target, .. }
            | Action::Delete { target, .. } => target,
        }
    }

    /// `merge-patch`, `json-patch` or `delete`.
    pub fn name(&self) -> &'static str {
        match self {
            Action::MergePatch { .. } => "merge-patch",
            Action::JsonPatch { .. } => "json-patch",
            Action::Delete { .. } => "delete",
        }
    }
}

/// A condition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConditionStatus {
    /// "True".
    True,
    /// "False".
    False,
    /// "Unknown".
    Unknown,
}

impl ConditionStatus {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

/// A status condition as the module states it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    /// Type.
    #[serde(rename = "type")]
    pub type_: String,
    /// Status.
    pub status: ConditionStatus,
    /// Reason.
    pub reason: String,
    /// Message.
    pub message: String,
}

/// The status a module wants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// Status fields (a JSON object) other than conditions and observedGeneration.
    pub fields: Value,
    /// Conditions.
    pub conditions: Vec<Condition>,
}

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

impl EventType {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// An Event a module wants recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Normal or Warning.
    #[serde(rename = "type")]
    pub type_: EventType,
    /// Reason.
    pub reason: String,
    /// Message.
    pub message: String,
    /// Action.
    pub action: String,
    /// The object (None: the primary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regarding: Option<ObjectRef>,
}

/// What a reconcile wants.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReconcileResponse {
    /// Complete child sets.
    pub children: Vec<ChildSet>,
    /// Imperative intents.
    pub actions: Vec<Action>,
    /// The status (None: untouched).
    pub status: Option<Status>,
    /// Events.
    pub events: Vec<Event>,
    /// Requeue delay.
    pub requeue_after: Option<Duration>,
}

/// What a finalize wants.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FinalizeResponse {
    /// Whether clean-up is complete.
    pub done: bool,
    /// Imperative intents.
    pub actions: Vec<Action>,
    /// The status.
    pub status: Option<Status>,
    /// Events.
    pub events: Vec<Event>,
    /// Requeue delay.
    pub requeue_after: Option<Duration>,
}

impl FinalizeResponse {
    /// The same effects as a reconcile response without children (for validation and apply).
    pub fn into_response(self) -> (bool, ReconcileResponse) {
        (
            self.done,
            ReconcileResponse {
                children: Vec::new(),
                actions: self.actions,
                status: self.status,
                events: self.events,
                requeue_after: self.requeue_after,
            },
        )
    }
}

/// Create or update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operation {
    /// Create.
    Create,
    /// Update.
    Update,
}

/// A proposed change of a primary.
#[derive(Debug, Clone)]
pub struct ValidateRequest {
    /// Create or update.
    pub operation: Operation,
    /// The old object (JSON text), on update.
    pub old: Option<String>,
    /// The new object (JSON text).
    pub new: String,
    /// The config JSON.
    pub config: String,
}

/// The verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ValidateResponse {
    /// Allowed, with warnings.
    Allowed {
        /// Warnings for the user.
        warnings: Vec<String>,
    },
    /// Denied.
    Denied {
        /// Why.
        message: String,
        /// The offending field.
        field: Option<String>,
    },
}
