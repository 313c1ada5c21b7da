//! What a module is called with.

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::{Error, Gvk, ObjectRef, Result};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Why a reconcile runs (see the WIT `trigger`). Triggers coalesce; the most specific is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// The primary changed or was first seen.
    PrimaryChanged,
    /// An owned child changed or disappeared.
    ChildChanged(ObjectRef),
    /// A related object changed or disappeared.
    RelatedChanged(ObjectRef),
    /// The periodic resync.
    Resync,
    /// The module asked for it with requeue-after.
    Requeue,
    /// A retry after a failure.
    Retry,
    /// A new module version was activated.
    ModuleChanged,
    /// An offline run or a self-check.
    DryRun,
}

/// Facts about this call.
#[derive(Debug, Clone)]
pub struct Context {
    /// The WasmReconciler running the module.
    pub reconciler: String,
    /// Why this reconcile runs.
    pub trigger: Trigger,
    /// 1 for a first attempt, n for the n-th consecutive attempt after failures.
    pub attempt: u32,
    /// The config JSON from the WasmReconciler (`{}` when none).
    pub config: String,
    /// The host's wall-clock time, milliseconds since the Unix epoch.
    pub now_unix_ms: u64,
}

impl Default for Context {
    fn default() -> Self {
        Context {
            reconciler: "test".into(),
            trigger: Trigger::PrimaryChanged,
            attempt: 1,
            config: "{}".into(),
            now_unix_ms: 0,
        }
    }
}

impl Context {
    /// The config, deserialized into `T`.
    ///
    /// # Errors
    /// If the config does not have the shape of `T`.
    pub fn config<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_str(&self.config).map_err(|e| Error::msg(e).context("reading the config"))
    }
}

/// A reconcile (or finalize) request: the primary, its observed children, related objects.
///
/// Objects are kept as JSON text and parsed when asked for, into whatever type the module wants.
#[derive(Debug, Clone)]
pub struct Request {
    pub(crate) primary: String,
    pub(crate) owned: Vec<(Gvk, Vec<String>)>,
    pub(crate) related: Vec<(Gvk, Vec<String>)>,
    pub(crate) context: Context,
}

#[derive(Deserialize)]
struct MetaOnly {
    #[serde(default)]
    metadata: ObjectMeta,
}

impl Request {
    /// A request from JSON text (what the host sends; the testing harness builds these too).
    pub fn from_parts(
        primary: String,
        owned: Vec<(Gvk, Vec<String>)>,
        related: Vec<(Gvk, Vec<String>)>,
        context: Context,
    ) -> Self {
        Request {
            primary,
            owned,
            related,
            context,
        }
    }

    /// The primary object, deserialized into `T` (an [`crate::Object`] or a k8s-openapi type).
    ///
    /// # Errors
    /// If the primary does not have the shape of `T` (the message names the field).
    pub fn primary<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_str(&self.primary)
            .map_err(|e| Error::msg(e).context("reading the primary object"))
    }

    /// The primary's metadata only (cheap).
    ///
    /// # Errors
    /// If the primary is not a JSON object.
    pub fn primary_meta(&self) -> Result<ObjectMeta> {
        let m: MetaOnly = serde_json::from_str(&self.primary)
            .map_err(|e| Error::msg(e).context("reading the primary's metadata"))?;
        Ok(m.metadata)
    }

    /// The primary as JSON text.
    pub fn primary_json(&self) -> &str {
        &self.primary
    }

    /// The observed children of the k8s-openapi kind `K`.
    ///
    /// # Errors
    /// If a child does not have the shape of `K`.
    pub fn owned<K: k8s_openapi::Resource + DeserializeOwned>(&self) -> Result<Vec<K>> {
        self.owned_as(&Gvk::of::<K>())
    }

    /// The observed children of `kind`, deserialized into `T`.
    ///
    /// # Errors
    /// If a child does not have the shape of `T`.
    pub fn owned_as<T: DeserializeOwned>(&self, kind: &Gvk) -> Result<Vec<T>> {
        parse_group(&self.owned, kind, "owned")
    }

    /// The related objects of the k8s-openapi kind `K`.
    ///
    /// # Errors
    /// If an object does not have the shape of `K`.
    pub fn related<K: k8s_openapi::Resource + DeserializeOwned>(&self) -> Result<Vec<K>> {
        self.related_as(&Gvk::of::<K>())
    }

    /// The related objects of `kind`, deserialized into `T`.
    ///
    /// # Errors
    /// If an object does not have the shape of `T`.
    pub fn related_as<T: DeserializeOwned>(&self, kind: &Gvk) -> Result<Vec<T>> {
        parse_group(&self.related, kind, "related")
    }

    /// The owned kinds (each with its observed objects as JSON text).
    pub fn owned_json(&self) -> &[(Gvk, Vec<String>)] {
        &self.owned
    }

    /// The related kinds (each with its objects as JSON text).
    pub fn related_json(&self) -> &[(Gvk, Vec<String>)] {
        &self.related
    }

    /// Facts about this call.
    pub fn context(&self) -> &Context {
        &self.context
    }
}

fn parse_group<T: DeserializeOwned>(
    groups: &[(Gvk, Vec<String>)],
    kind: &Gvk,
    what: &str,
) -> Result<Vec<T>> {
    groups
        .iter()
        .filter(|(g, _)| g == kind)
        .flat_map(|(_, objects)| objects.iter())
        .enumerate()
        .map(|(i, json)| {
            serde_json::from_str(json)
                .map_err(|e| Error::msg(e).context(format!("reading {what} {kind} #{i}")))
        })
        .collect()
}

/// Whether a validation is of a new object or of a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// The object is being created.
    Create,
    /// The object is being changed.
    Update,
}

/// A proposed change of a primary.
#[derive(Debug, Clone)]
pub struct ValidateRequest {
    pub(crate) operation: Operation,
    pub(crate) old: Option<String>,
    pub(crate) new: String,
    pub(crate) config: String,
}

impl ValidateRequest {
    /// A request from JSON text.
    pub fn from_parts(
        operation: Operation,
        old: Option<String>,
        new: String,
        config: String,
    ) -> Self {
        ValidateRequest {
            operation,
            old,
            new,
            config,
        }
    }

    /// Create or update.
    pub fn operation(&self) -> Operation {
        self.operation
    }

    /// The object before the change (None on create).
    ///
    /// # Errors
    /// If it does not have the shape of `T`.
    pub fn old<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        self.old
            .as_deref()
            .map(|s| {
                serde_json::from_str(s).map_err(|e| Error::msg(e).context("reading the old object"))
            })
            .transpose()
    }

    /// The object after the change.
    ///
    /// # Errors
    /// If it does not have the shape of `T`.
    pub fn new_object<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_str(&self.new).map_err(|e| Error::msg(e).context("reading the new object"))
    }

    /// The config, deserialized into `T`.
    ///
    /// # Errors
    /// If the config does not have the shape of `T`.
    pub fn config<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_str(&self.config).map_err(|e| Error::msg(e).context("reading the config"))
    }
}
