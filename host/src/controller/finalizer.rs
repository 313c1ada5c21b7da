//! The reconciler's finalizer on its primaries: added when the module finalizes, removed when
//! it does not or when its `finalize` is done, and the deletion steps of a reconcile.
//!
//! The decisions ([`before_call`], [`after_finalize`]) are pure; [`set`] writes.
//!
//! # Guarantees
//! - A primary being deleted that does not hold this reconciler's finalizer is let go
//!   without a module call.
//! - The legacy shared finalizer is replaced by the reconciler's own.
//! - The finalizer is removed only once `finalize` reported done and every write of that
//!   call succeeded; otherwise it stays and `finalize` runs again.
//!
//! # Errors
//! [`set`] fails with [`ReconcileError::Conflict`] on a stale primary (409), else with the
//! API's error.

use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use super::{ReconcileError, Settings};
use crate::crd::{finalizer_for, is_finalizer_of};

/// What to do with the finalizer before the module is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Before {
    /// Being deleted without the reconciler's finalizer: nothing to do, forget the primary.
    LetGo,
    /// Being deleted, and the module does not finalize: remove the finalizer, then forget the
    /// primary.
    Release,
    /// Add (true) or remove (false) the finalizer, then call the module.
    Set(bool),
    /// Call the module (`finalize` when the primary is being deleted).
    Call,
    /// Not being deleted, but no longer selected by the module while it holds the finalizer:
    /// call `finalize`, and take the finalizer off once it is done (a Metacontroller
    /// decorator's opt-out).
    OptOut,
}

/// The finalizer step for a primary holding `finalizers`, being deleted or not, of a module
/// that `finalizes` or not, and that `selected` the primary or not ([`Module::selects`]:
/// only a selected primary gets the finalizer).
///
/// [`Module::selects`]: crate::engine::Module::selects
pub fn before_call(
    reconciler: &str,
    finalizers: &[String],
    deleting: bool,
    finalizes: bool,
    selected: bool,
) -> Before {
    let has_own = finalizers.contains(&finalizer_for(reconciler));
    let has_finalizer = finalizers.iter().any(|f| is_finalizer_of(f, reconciler));
    if deleting && !has_finalizer {
        return Before::LetGo;
    }
    if !deleting && !selected && finalizes && has_finalizer {
        return Before::OptOut;
    }
    let finalizes = finalizes && (selected || deleting);
    // `has_own != has_finalizer`: only the legacy finalizer is there; migrate it.
    if !deleting && (finalizes != has_own || has_own != has_finalizer) {
        return Before::Set(finalizes);
    }
    if deleting && !finalizes {
        return Before::Release;
    }
    Before::Call
}

/// What follows a call whose writes are done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Not a finished `finalize`: schedule the next reconcile.
    Schedule,
    /// `finalize` is done and all its writes succeeded: remove the finalizer.
    Release,
    /// `finalize` reported done, but some of its writes failed: the finalizer stays.
    Incomplete,
}

/// The step after a call that answered `done` (None for `reconcile`) and whose writes had
/// `failures` failures.
pub fn after_finalize(done: Option<bool>, failures: usize) -> After {
    match done {
        Some(true) if failures > 0 => After::Incomplete,
        Some(true) => After::Release,
        _ => After::Schedule,
    }
}

/// The message of [`After::Incomplete`], naming the failed writes.
pub fn incomplete(reconciler: &str, failures: &[String]) -> String {
    format!(
        "finalize reported done, but some of its writes failed: {}; the finalizer {} stays and finalize runs again",
        failures.join("; "),
        finalizer_for(reconciler)
    )
}

/// Adds (`present`) or removes the reconciler's finalizer on `primary` (replacing the legacy
/// shared one), with the module's identity (`impersonated`); returns the primary as written.
pub(super) async fn set(
    settings: &Settings,
    impersonated: &kube::Client,
    primary: &DynamicObject,
    present: bool,
) -> Result<DynamicObject, ReconcileError> {
    let patch = finalizer_patch(primary, &settings.name, present)?;
    let resolved = &settings.primary.resolved;
    let api: Api<DynamicObject> = match (resolved.namespaced, primary.namespace()) {
        (true, Some(ns)) => Api::namespaced_with(impersonated.clone(), &ns, &resolved.resource),
        _ => Api::all_with(impersonated.clone(), &resolved.resource),
    };
    api.patch(&primary.name_any(), &PatchParams::default(), &patch)
        .await
        .map_err(|e| match &e {
            // 409: the resourceVersion moved; 422: the finalizers list is not as read (the
            // JSON patch's test).
            kube::Error::Api(s) if s.code == 409 || s.code == 422 => {
                ReconcileError::Conflict(format!("finalizer of {}", primary.name_any()))
            }
            _ => ReconcileError::Api(e),
        })
}

/// The patch adding (`present`) or removing `reconciler`'s finalizer on `primary`.
///
/// *Guarantees:* adding is a merge patch conditioned on the resourceVersion read; removing is a
/// JSON patch that tests the finalizers list as read, then replaces it. The host's own writes
/// since the read (the status a finalize returned, a module's patch of its primary) move the
/// resourceVersion, not the list: conditioned on the version, the removal failed with 409 at
/// every finalize that wrote a status, and a status that differs at every call (a timestamp)
/// held the finalizer, and the namespace's deletion, for ever. Anyone else's change of the list
/// still fails the test.
fn finalizer_patch(
    primary: &DynamicObject,
    reconciler: &str,
    present: bool,
) -> Result<Patch<Value>, ReconcileError> {
    let read: Vec<String> = primary.finalizers().to_vec();
    let mut finalizers = read.clone();
    finalizers.retain(|f| !is_finalizer_of(f, reconciler));
    if present {
        finalizers.push(finalizer_for(reconciler));
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": primary.resource_version()}});
        return Ok(Patch::Merge(patch));
    }
    let ops = json!([
        {"op": "test", "path": "/metadata/finalizers", "value": read},
        {"op": "replace", "path": "/metadata/finalizers", "value": finalizers},
    ]);
    serde_json::from_value(ops)
        .map(Patch::Json)
        .map_err(|e| ReconcileError::Apply(format!("the finalizer patch: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Removing the finalizer does not depend on the resourceVersion read: the host's own
    /// status write of the same finalize moves it.
    #[test]
    fn the_finalizer_is_removed_by_the_list_as_read_not_the_version() {
        let primary: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7",
                "finalizers": ["other.dev/x", finalizer_for("r")]}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let Ok(Patch::Json(patch)) = finalizer_patch(&primary, "r", false) else {
            panic!("a JSON patch")
        };
        let ops = serde_json::to_value(&patch).unwrap_or_default();
        assert!(!ops.to_string().contains("resourceVersion"), "{ops}");
        assert_eq!(ops[0]["op"], "test");
        assert_eq!(ops[0]["value"], json!(["other.dev/x", finalizer_for("r")]));
        assert_eq!(ops[1]["value"], json!(["other.dev/x"]));
        let Ok(Patch::Merge(add)) = finalizer_patch(&primary, "r", true) else {
            panic!("a merge patch")
        };
        assert_eq!(add["metadata"]["resourceVersion"], "7");
    }

    fn own() -> Vec<String> {
        vec![finalizer_for("r")]
    }

    #[test]
    fn a_deleted_primary_without_the_finalizer_is_let_go() {
        assert_eq!(before_call("r", &[], true, true, true), Before::LetGo);
        assert_eq!(
            before_call("r", &["other.dev/x".into()], true, false, true),
            Before::LetGo
        );
    }

    #[test]
    fn the_finalizer_follows_whether_the_module_finalizes() {
        assert_eq!(before_call("r", &[], false, true, true), Before::Set(true));
        assert_eq!(
            before_call("r", &own(), false, false, true),
            Before::Set(false)
        );
        assert_eq!(before_call("r", &own(), false, true, true), Before::Call);
        assert_eq!(before_call("r", &[], false, false, true), Before::Call);
    }

    #[test]
    fn the_legacy_finalizer_is_replaced_or_honoured() {
        let legacy = vec![crate::crd::FINALIZER.to_string()];
        assert_eq!(
            before_call("r", &legacy, false, true, true),
            Before::Set(true)
        );
        assert_eq!(
            before_call("r", &legacy, false, false, true),
            Before::Set(false)
        );
        assert_eq!(before_call("r", &legacy, true, true, true), Before::Call);
        assert_eq!(
            before_call("r", &legacy, true, false, true),
            Before::Release
        );
    }

    #[test]
    fn a_deleted_primary_is_finalized_or_released() {
        assert_eq!(before_call("r", &own(), true, true, true), Before::Call);
        // Selected or not, a primary being deleted that holds the finalizer is finalized.
        assert_eq!(before_call("r", &own(), true, true, false), Before::Call);
        assert_eq!(before_call("r", &own(), true, false, true), Before::Release);
    }

    #[test]
    fn only_selected_primaries_get_the_finalizer_and_one_that_opts_out_is_finalized() {
        // Not selected, without the finalizer: called (the module leaves it alone), no finalizer.
        assert_eq!(before_call("r", &[], false, true, false), Before::Call);
        // Selected: the finalizer is added.
        assert_eq!(before_call("r", &[], false, true, true), Before::Set(true));
        // Selected no more while holding it: finalize, then the finalizer goes.
        assert_eq!(before_call("r", &own(), false, true, false), Before::OptOut);
        // A module that does not finalize takes its finalizer off, selected or not.
        assert_eq!(
            before_call("r", &own(), false, false, false),
            Before::Set(false)
        );
    }

    #[test]
    fn the_finalizer_goes_only_when_finalize_is_done_and_every_write_succeeded() {
        assert_eq!(after_finalize(None, 0), After::Schedule);
        assert_eq!(after_finalize(Some(false), 2), After::Schedule);
        assert_eq!(after_finalize(Some(true), 0), After::Release);
        assert_eq!(after_finalize(Some(true), 1), After::Incomplete);
    }
}
