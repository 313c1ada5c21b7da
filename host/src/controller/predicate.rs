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

use std::hash::{DefaultHasher, Hasher};

use crate::lean::Lean;

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
    pub fn fingerprint(self, o: &Lean) -> Option<u64> {
        match self {
            Changes::OutsideStatus => outside_status(o),
            Changes::WithStatus => with_status(o),
        }
    }
}

/// A fingerprint of everything in `o` but its status, resourceVersion and managedFields.
pub fn outside_status(o: &Lean) -> Option<u64> {
    fingerprint(o, false)
}

/// A fingerprint of everything in `o` but its resourceVersion and managedFields.
pub fn with_status(o: &Lean) -> Option<u64> {
    fingerprint(o, true)
}

/// The text of every field but `apiVersion`, `kind` (and `status` unless `status`), and of
/// every metadata field but `resourceVersion` and `managedFields`, as the API server sent it:
/// the server writes an object's fields in one order (Go's encoding, map keys sorted), so
/// equal objects give equal texts.
fn fingerprint(o: &Lean, status: bool) -> Option<u64> {
    let skip: &[&str] = if status {
        &["apiVersion", "kind"]
    } else {
        &["apiVersion", "kind", "status"]
    };
    let mut h = DefaultHasher::new();
    o.hash_fields((skip, &["resourceVersion", "managedFields"]), &mut h)
        .ok()?;
    Some(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::DynamicObject;
    use serde_json::json;

    fn lean(o: &DynamicObject) -> Lean {
        Lean::of(o).unwrap_or_else(|e| panic!("lean: {e}"))
    }

    fn outside(o: &DynamicObject) -> Option<u64> {
        outside_status(&lean(o))
    }

    fn fingerprint(changes: Changes, o: &DynamicObject) -> Option<u64> {
        changes.fingerprint(&lean(o))
    }

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
        assert_eq!(outside(&a), outside(&b));
    }

    #[test]
    fn spec_labels_and_deletion_are_changes() {
        let a = app("1", json!({"image": "a"}), json!({}));
        let spec = app("2", json!({"image": "b"}), json!({}));
        assert_ne!(outside(&a), outside(&spec));
        let mut labelled = a.clone();
        labelled
            .metadata
            .labels
            .get_or_insert_default()
            .insert("x".into(), "y".into());
        assert_ne!(outside(&a), outside(&labelled));
        let mut deleting = a.clone();
        deleting.metadata.finalizers = Some(vec!["wasmop.dev/x".into()]);
        assert_ne!(outside(&a), outside(&deleting));
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
        assert_ne!(
            fingerprint(changes, &before),
            fingerprint(changes, &written)
        );
        assert_eq!(
            fingerprint(changes, &written),
            fingerprint(changes, &rewritten)
        );
        let spec = app("4", json!({"image": "b"}), json!({"readyReplicas": 1}));
        assert_ne!(fingerprint(changes, &written), fingerprint(changes, &spec));
        // Every other reconciler's stays blind to the status.
        let changes = Changes::default();
        assert_eq!(
            fingerprint(changes, &before),
            fingerprint(changes, &written)
        );
        assert_eq!(fingerprint(changes, &before), outside(&before));
    }
}
