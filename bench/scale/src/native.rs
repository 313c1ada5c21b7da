//! The image-updater logic called natively, as a Rust author without wasmop would: the crate as
//! an rlib, called through `wasmop_sdk::Reconciler`, its response turned into the objects to
//! apply (namespace, the reconciler label and a controller ownerReference added, as the host
//! does) and the status to write (conditions keep their lastTransitionTime while unchanged).
//!
//! # Errors
//! [`Error::Other`] when the App cannot be read or the logic fails.

use image_updater::ImageUpdater;
use k8s_openapi::api::apps::v1::Deployment;
use serde_json::{Value, json};
use wasmop_sdk::Reconciler;

use crate::{Error, Result};

/// The field manager of every write, the one wasmop uses for this reconciler.
pub const FIELD_MANAGER: &str = "wasmop/image-updater";
/// The label the children carry (wasmop's `wasmop.dev/reconciler`).
pub const RECONCILER_LABEL: &str = "wasmop.dev/reconciler";
/// The reconciler's name.
pub const RECONCILER: &str = "image-updater";
/// The finalizer the native operators put on Apps (the module asks for one).
pub const FINALIZER: &str = "wasmop.dev/image-updater";
/// The App's API group.
pub const GROUP: &str = "example.wasmop.dev";

/// What one reconcile wants written.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Children to server-side apply, ready to send.
    pub children: Vec<Value>,
    /// The status to write (without lastTransitionTime handling applied yet; see [`status_object`]).
    pub status: Option<wasmop_sdk::Status>,
    /// Events: (reason, message, action).
    pub events: Vec<(String, String, String)>,
    /// When the logic wants to look again (a rollout in progress).
    pub requeue: Option<std::time::Duration>,
}

/// Runs image-updater's reconcile for `app` (a whole App as JSON) with the observed Deployment.
///
/// # Errors
/// If the App lacks a name or uid, or the logic returns an error.
pub fn reconcile(app: &Value, observed: Option<&Deployment>) -> Result<Outcome> {
    let owned = vec![
        (
            wasmop_sdk::Gvk::new("apps/v1", "Deployment"),
            observed
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| Error::Other(format!("serializing a Deployment: {e}")))?
                .into_iter()
                .collect(),
        ),
        (wasmop_sdk::Gvk::new("v1", "Service"), Vec::new()),
    ];
    let request = wasmop_sdk::Request::from_parts(
        app.to_string(),
        owned,
        Vec::new(),
        wasmop_sdk::Context {
            reconciler: RECONCILER.into(),
            trigger: wasmop_sdk::Trigger::PrimaryChanged,
            attempt: 1,
            config: "{}".into(),
            now_unix_ms: 0,
        },
    );
    let response = ImageUpdater::reconcile(&request)
        .map_err(|e| Error::Other(format!("image-updater: {e:?}")))?;
    let owner = owner_reference(app)?;
    let namespace = app["metadata"]["namespace"].clone();
    let mut children = Vec::new();
    for (_, objects) in response.child_sets() {
        for text in objects {
            let mut child: Value = serde_json::from_str(text)
                .map_err(|e| Error::Other(format!("image-updater returned bad JSON: {e}")))?;
            child["metadata"]["namespace"] = namespace.clone();
            child["metadata"]["labels"][RECONCILER_LABEL] = json!(RECONCILER);
            child["metadata"]["ownerReferences"] = json!([owner.clone()]);
            children.push(child);
        }
    }
    Ok(Outcome {
        children,
        status: response.status_ref().cloned(),
        events: response
            .events()
            .iter()
            .map(|e| (e.reason.clone(), e.message.clone(), e.action.clone()))
            .collect(),
        requeue: response.requeue(),
    })
}

/// The controller ownerReference to `app`.
///
/// # Errors
/// If the App has no name or uid.
pub fn owner_reference(app: &Value) -> Result<Value> {
    let name = app["metadata"]["name"].as_str();
    let uid = app["metadata"]["uid"].as_str();
    let (Some(name), Some(uid)) = (name, uid) else {
        return Err(Error::Other("an App without metadata.name or uid".into()));
    };
    Ok(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App", "name": name, "uid": uid,
        "controller": true, "blockOwnerDeletion": true
    }))
}

/// The status object to write: the module's fields, its conditions (lastTransitionTime kept from
/// `previous` while a condition's status is unchanged, else `now`), and `observedGeneration`.
pub fn status_object(
    status: &wasmop_sdk::Status,
    previous: Option<&Value>,
    generation: i64,
    now: &str,
) -> Value {
    let mut out = status.fields.as_object().cloned().unwrap_or_default();
    let before = |type_: &str, s: &str| {
        previous?
            .get("conditions")?
            .as_array()?
            .iter()
            .find(|c| c["type"] == type_ && c["status"] == s)?
            .get("lastTransitionTime")?
            .as_str()
            .map(str::to_string)
    };
    let conditions: Vec<Value> = status
        .conditions
        .iter()
        .map(|c| {
            let s = match c.status {
                wasmop_sdk::ConditionStatus::True => "True",
                wasmop_sdk::ConditionStatus::False => "False",
                wasmop_sdk::ConditionStatus::Unknown => "Unknown",
            };
            json!({
                "type": c.type_, "status": s, "reason": c.reason, "message": c.message,
                "lastTransitionTime": before(&c.type_, s).unwrap_or_else(|| now.to_string()),
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

/// Whether `wanted` (from [`status_object`]) is already what `current` says.
pub fn status_unchanged(current: Option<&Value>, wanted: &Value) -> bool {
    current.is_some_and(|c| {
        wanted
            .as_object()
            .is_some_and(|w| w.iter().all(|(k, v)| c.get(k) == Some(v)))
    })
}

/// Now, as an RFC 3339 UTC timestamp with seconds (what conditions carry).
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}
