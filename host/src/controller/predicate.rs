//! Which changes of a primary call for a reconcile.
//!
//! The host's own status write changes the primary (a new resourceVersion); reconciling again
//! for it would only confirm the status just written, and with thousands of primaries every
//! status write would cost a second module call. So a primary's event triggers a reconcile
//! only when something outside `.status` changed: [`outside_status`] fingerprints the object
//! without its status, resourceVersion and managedFields, and kube-runtime's predicate filter
//! drops events whose fingerprint did not change.
//!
//! # Guarantees
//! - Any change of the spec, labels, annotations, finalizers, owner references, deletion
//!   timestamp or generation triggers a reconcile; a status-only change does not (the module's
//!   resync and its children's events still bring the primary back).
//! - The first event of every primary (after a start, and after kube-runtime's one-hour
//!   fingerprint expiry) triggers a reconcile. This holds because the primaries' stream passes
//!   a primary on only while the controller's store holds it (`streams::once_cached`): one
//!   passed on earlier would be dropped by the controller as not found, and its fingerprint,
//!   already seen, would let none of its next unchanged events through.
//!
//! # Errors
//! Nothing here fails.

use std::hash::{DefaultHasher, Hash, Hasher};

use kube::api::DynamicObject;

/// A fingerprint of everything in `o` but its status, resourceVersion and managedFields.
pub fn outside_status(o: &DynamicObject) -> Option<u64> {
    let mut meta = o.metadata.clone();
    meta.resource_version = None;
    meta.managed_fields = None;
    let mut h = DefaultHasher::new();
    serde_json::to_string(&meta).ok()?.hash(&mut h);
    match &o.data {
        serde_json::Value::Object(m) => {
            for (k, v) in m.iter().filter(|(k, _)| k.as_str() != "status") {
                k.hash(&mut h);
                super::noop::fingerprint(v).hash(&mut h);
            }
        }
        other => super::noop::fingerprint(other).hash(&mut h),
    }
    Some(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn app(rv: &str, spec: serde_json::Value, status: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "example.wasmop.dev/v1", "kind": "App",
            "metadata": {"name": "web", "namespace": "demo", "resourceVersion": rv, "generation": 1},
            "spec": spec, "status": status
        }))
        .unwrap_or_else(|e| panic!("literal: {e}"))
    }

    #[test]
    fn a_status_only_change_is_not_a_change() {
        let a = app("1", json!({"image": "a"}), json!({}));
        let b = app("2", json!({"image": "a"}), json!({"readyReplicas": 1}));
        assert_eq!(outside_status(&a), outside_status(&b));
    }

    #[test]
    fn spec_labels_and_deletion_are_changes() {
        let a = app("1", json!({"image": "a"}), json!({}));
        let spec = app("2", json!({"image": "b"}), json!({}));
        assert_ne!(outside_status(&a), outside_status(&spec));
        let mut labelled = a.clone();
        labelled
            .metadata
            .labels
            .get_or_insert_default()
            .insert("x".into(), "y".into());
        assert_ne!(outside_status(&a), outside_status(&labelled));
        let mut deleting = a.clone();
        deleting.metadata.finalizers = Some(vec!["wasmop.dev/x".into()]);
        assert_ne!(outside_status(&a), outside_status(&deleting));
    }
}
