//! Which changes of a primary call for a reconcile.
//!
//! The host's own status write changes the primary (a new resourceVersion); reconciling again
//! for it would only confirm the status just written, and with thousands of primaries every
//! status write would cost a second module call. So a primary's event triggers a reconcile
//! only when something outside `.status` changed: [`outside_status`] fingerprints the object
//! without its status, resourceVersion and managedFields, and kube-runtime's predicate filter
//! drops events whose fingerprint did not change.
//!
//! A Metacontroller hook is synced on status changes too, as Metacontroller does unless the
//! controller sets `parentResource.ignoreStatusChanges` (`spec.hook.syncOnStatus`,
//! [`Changes::WithStatus`]): a hook may act on the status it wrote (daemonjob deletes its
//! DaemonSet once its stored status says complete). [`with_status`] then fingerprints the
//! status as well.
//!
//! # Guarantees
//! - Any change of the spec, labels, annotations, finalizers, owner references, deletion
//!   timestamp or generation triggers a reconcile; a status-only change does not (the module's
//!   resync and its children's events still bring the primary back), except with
//!   [`Changes::WithStatus`], where it does.
//! - With [`Changes::WithStatus`], the host's own status write calls for one more reconcile,
//!   and no loop follows when the module answers the same status: that answer is not written
//!   ([`super::noop`]), and were it written, a write that leaves the status as it was changes
//!   only the resourceVersion (and managedFields), which no fingerprint includes. Only a
//!   module whose status differs at every call (a timestamp, a counter) is called again and
//!   again, as under Metacontroller.
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

/// Which changes of a primary call for a reconcile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Changes {
    /// Changes outside its status ([`outside_status`]): every WasmReconciler's.
    #[default]
    OutsideStatus,
    /// Changes of its status too ([`with_status`]): a Metacontroller hook's with
    /// `spec.hook.syncOnStatus`.
    WithStatus,
}

impl Changes {
    /// The fingerprint of `o` whose changes call for a reconcile.
    pub fn fingerprint(self, o: &DynamicObject) -> Option<u64> {
        match self {
            Changes::OutsideStatus => outside_status(o),
            Changes::WithStatus => with_status(o),
        }
    }
}

/// A fingerprint of everything in `o` but its status, resourceVersion and managedFields.
pub fn outside_status(o: &DynamicObject) -> Option<u64> {
    fingerprint(o, false)
}

/// A fingerprint of everything in `o` but its resourceVersion and managedFields.
pub fn with_status(o: &DynamicObject) -> Option<u64> {
    fingerprint(o, true)
}

fn fingerprint(o: &DynamicObject, status: bool) -> Option<u64> {
    let mut meta = o.metadata.clone();
    meta.resource_version = None;
    meta.managed_fields = None;
    let mut h = DefaultHasher::new();
    serde_json::to_string(&meta).ok()?.hash(&mut h);
    match &o.data {
        serde_json::Value::Object(m) => {
            for (k, v) in m.iter().filter(|(k, _)| status || k.as_str() != "status") {
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

    /// A Metacontroller hook's parent (`syncOnStatus`): the host's status write calls for one
    /// more sync; a write that leaves the status as it was (a new resourceVersion, new
    /// managedFields) calls for none, so the sync after the host's own write ends there.
    #[test]
    fn with_status_a_status_change_is_a_change_and_a_rewrite_of_the_same_status_is_not() {
        let before = app("1", json!({"image": "a"}), json!({}));
        let written = app("2", json!({"image": "a"}), json!({"readyReplicas": 1}));
        let mut rewritten = app("3", json!({"image": "a"}), json!({"readyReplicas": 1}));
        rewritten.metadata.managed_fields = Some(vec![Default::default()]);
        let changes = Changes::WithStatus;
        assert_ne!(changes.fingerprint(&before), changes.fingerprint(&written));
        assert_eq!(
            changes.fingerprint(&written),
            changes.fingerprint(&rewritten)
        );
        let spec = app("4", json!({"image": "b"}), json!({"readyReplicas": 1}));
        assert_ne!(changes.fingerprint(&written), changes.fingerprint(&spec));
        // Every other reconciler's stays blind to the status.
        let changes = Changes::default();
        assert_eq!(changes.fingerprint(&before), changes.fingerprint(&written));
        assert_eq!(changes.fingerprint(&before), outside_status(&before));
    }
}
