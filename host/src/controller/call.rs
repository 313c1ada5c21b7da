//! The one call path: a request -> the module's `reconcile` or `finalize`, off the async
//! workers -> its response validated as the host validates it.
//!
//! The controller (each reconcile), `wasmop test`, `wasmop diff` and the manager's pre-swap
//! self-check all go through here, so what the tools check is what production runs.
//!
//! # Guarantees
//! - A module call never blocks an async worker: [`call`] awaits the engine's async call (the
//!   guest yields to the runtime every epoch tick; a hook module's adapter runs on a blocking
//!   thread); [`call_blocking`] is for callers on a thread of their own.
//! - A panic in a call (a host or engine bug, never the guest's code: a guest traps) fails that
//!   call only ([`Failure::Join`]), as it did on a thread of its own.
//! - Validation is [`intents::validate`] with the caller's grant, scopes and observed
//!   children: no caller has its own checks.
//!
//! # Errors
//! [`Failure`]: the module failed, its response was refused, or the call's thread did not
//! complete.

use kube::ResourceExt;

use super::apply::Observed;
use super::intents::{self, Grant, ObservedChildren, Primary, Rejected, Scopes, Validated};
use crate::contract::{
    Context, FinalizeResponse, Gvk, KindObjects, ReconcileRequest, ReconcileResponse, Trigger,
};
use crate::engine::{CallError, CallStats, Limits, Module, Outcome};
use crate::modules::slot::Fit;

/// The module export a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Export {
    /// `reconcile`.
    Reconcile,
    /// `finalize` (the primary is being deleted).
    Finalize,
}

impl Export {
    /// `finalize` for a primary being deleted, else `reconcile`.
    pub fn of(deleting: bool) -> Self {
        if deleting {
            Export::Finalize
        } else {
            Export::Reconcile
        }
    }

    /// `reconcile` or `finalize` (the metrics' and spans' label).
    pub fn name(self) -> &'static str {
        match self {
            Export::Reconcile => "reconcile",
            Export::Finalize => "finalize",
        }
    }
}

/// What the module answered.
#[derive(Debug)]
pub struct Response {
    /// For `finalize`: whether the module is done (None for `reconcile`).
    pub done: Option<bool>,
    /// Its intents.
    pub response: ReconcileResponse,
}

/// A module call's result and its cost.
#[derive(Debug)]
pub struct Called {
    /// The answer, or why there is none.
    pub result: Result<Response, CallError>,
    /// The cost.
    pub stats: CallStats,
}

/// Calls `export` of `module` on this thread, which must not be an async worker.
pub fn call_blocking(
    module: &Module,
    export: Export,
    request: ReconcileRequest,
    limits: &Limits,
) -> Called {
    match export {
        Export::Finalize => finalized(module.finalize(request, limits)),
        Export::Reconcile => reconciled(module.reconcile(request, limits)),
    }
}

/// Calls `export` of `module` as part of this task (see the module's guarantees).
///
/// # Errors
/// [`Failure::Join`] when the call panicked.
pub async fn call(
    module: &Module,
    export: Export,
    request: ReconcileRequest,
    limits: Limits,
) -> Result<Called, Failure> {
    use futures::FutureExt;
    let called = async {
        match export {
            Export::Finalize => finalized(module.finalize_async(request, &limits).await),
            Export::Reconcile => reconciled(module.reconcile_async(request, &limits).await),
        }
    };
    std::panic::AssertUnwindSafe(called)
        .catch_unwind()
        .await
        .map_err(|panic| Failure::Join(format!("the module call panicked: {}", panic_text(&panic))))
}

/// What a caught panic said.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message")
}

/// A `finalize` call's outcome as the host reads it.
fn finalized(o: Outcome<FinalizeResponse>) -> Called {
    let result = o.result.map(|r| {
        let (done, response) = r.into_response();
        Response {
            done: Some(done),
            response,
        }
    });
    Called {
        result,
        stats: o.stats,
    }
}

/// A `reconcile` call's outcome as the host reads it.
fn reconciled(o: Outcome<ReconcileResponse>) -> Called {
    let result = o.result.map(|response| Response {
        done: None,
        response,
    });
    Called {
        result,
        stats: o.stats,
    }
}

/// What a response is validated against.
#[derive(Clone, Copy)]
pub struct Check<'a> {
    /// The reconciler's name (the label its children carry).
    pub reconciler: &'a str,
    /// The primary the request was for.
    pub primary: &'a Primary,
    /// What the module may own and write.
    pub grant: &'a Grant,
    /// Which kinds are namespaced.
    pub scopes: &'a (dyn Scopes + Sync),
    /// The primary's children the request listed (the only ones it may patch or delete).
    pub children: &'a ObservedChildren,
}

impl std::fmt::Debug for Check<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check")
            .field("reconciler", &self.reconciler)
            .field("primary", &self.primary.name)
            .finish_non_exhaustive()
    }
}

impl Check<'_> {
    /// Validates `response` as the host does before it writes anything.
    ///
    /// # Errors
    /// [`Rejected`] when the host would refuse the response.
    pub fn validate(&self, response: ReconcileResponse) -> Result<Validated, Rejected> {
        intents::validate(
            self.reconciler,
            self.primary,
            self.grant,
            self.scopes,
            self.children,
            response,
        )
    }
}

/// Why a call and its validation came to nothing.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The module failed.
    #[error("{0}")]
    Call(#[from] CallError),
    /// The host refused the module's response.
    #[error("{0}")]
    Rejected(#[from] Rejected),
    /// The call's thread did not complete.
    #[error("the module call did not complete: {0}")]
    Join(String),
}

/// A validated answer.
#[derive(Debug)]
pub struct Checked {
    /// For `finalize`: whether the module is done (None for `reconcile`).
    pub done: Option<bool>,
    /// The validated intents.
    pub validated: Validated,
    /// What the call cost.
    pub stats: CallStats,
}

/// Calls `export` of `module` with `request` on this (blocking) thread and validates the
/// response against `check`.
///
/// # Errors
/// [`Failure::Call`] or [`Failure::Rejected`].
pub fn run_blocking(
    module: &Module,
    export: Export,
    request: ReconcileRequest,
    limits: &Limits,
    check: &Check<'_>,
) -> Result<Checked, Failure> {
    checked(call_blocking(module, export, request, limits), check)
}

/// Calls `export` of `module` with `request` off the async workers and validates the
/// response against `check`.
///
/// # Errors
/// See [`Failure`].
pub async fn run(
    module: &Module,
    export: Export,
    request: ReconcileRequest,
    limits: Limits,
    check: &Check<'_>,
) -> Result<Checked, Failure> {
    checked(call(module, export, request, limits).await?, check)
}

fn checked(called: Called, check: &Check<'_>) -> Result<Checked, Failure> {
    let Response { done, response } = called.result?;
    Ok(Checked {
        done,
        validated: check.validate(response)?,
        stats: called.stats,
    })
}

/// A request with no children and no related objects (`kinds` owned, `related` read), for a
/// dry run: trigger `DryRun`, attempt 1.
pub fn dry_run_request(
    primary: String,
    fit: &Fit,
    reconciler: &str,
    config: &str,
    now_unix_ms: u64,
) -> ReconcileRequest {
    let empty = |kind: &Gvk| KindObjects {
        kind: kind.clone(),
        objects: Vec::new(),
    };
    ReconcileRequest {
        primary,
        owned: fit.grant.owned.iter().map(empty).collect(),
        related: fit.related.iter().map(|r| empty(&r.kind)).collect(),
        context: dry_run_context(reconciler, config, now_unix_ms),
    }
}

/// The context of a dry run (`wasmop test`, `wasmop diff`, the self-check): trigger
/// `DryRun`, attempt 1.
pub fn dry_run_context(reconciler: &str, config: &str, now_unix_ms: u64) -> Context {
    Context {
        reconciler: reconciler.to_string(),
        trigger: Trigger::DryRun,
        attempt: 1,
        config: config.to_string(),
        now_unix_ms,
    }
}

/// The children a request lists, as the controller sees them (parsed from its cache).
pub fn observed_children(observed: &[Observed]) -> ObservedChildren {
    observed
        .iter()
        .flat_map(|o| {
            o.objects
                .iter()
                .map(|x| (o.kind.clone(), x.namespace(), x.name_any()))
        })
        .collect()
}

/// The children a request lists, read from its JSON texts (`owned`). An object without a
/// namespace of a kind `scopes` knows as namespaced is taken as in `namespace` (the
/// primary's): a fixture may leave it out.
pub fn children_in(
    owned: &[KindObjects],
    namespace: Option<&str>,
    scopes: &dyn Scopes,
) -> ObservedChildren {
    owned
        .iter()
        .flat_map(|g| g.objects.iter().map(move |o| (&g.kind, o)))
        .filter_map(|(kind, o)| {
            let o: serde_json::Value = serde_json::from_str(o).ok()?;
            let name = o.pointer("/metadata/name")?.as_str()?.to_string();
            let namespace = match o.pointer("/metadata/namespace").and_then(|n| n.as_str()) {
                Some(ns) => Some(ns.to_string()),
                None if scopes.namespaced(kind) == Some(true) => namespace.map(str::to_string),
                None => None,
            };
            Some((kind.clone(), namespace, name))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::intents::WellKnownScopes;

    #[test]
    fn a_fixture_child_without_a_namespace_is_in_the_primarys() {
        let owned = [KindObjects {
            kind: Gvk::new("v1", "ConfigMap"),
            objects: vec![
                r#"{"metadata":{"name":"a"}}"#.into(),
                r#"{"metadata":{"name":"b","namespace":"other"}}"#.into(),
                r#"{"metadata":{}}"#.into(),
            ],
        }];
        let children = children_in(&owned, Some("ns"), &WellKnownScopes);
        let want: ObservedChildren = [
            (
                Gvk::new("v1", "ConfigMap"),
                Some("ns".to_string()),
                "a".to_string(),
            ),
            (
                Gvk::new("v1", "ConfigMap"),
                Some("other".to_string()),
                "b".to_string(),
            ),
        ]
        .into_iter()
        .collect();
        assert_eq!(children, want);
    }

    #[test]
    fn a_dry_run_is_attempt_one() {
        let c = dry_run_context("r", "{}", 7);
        assert_eq!(
            (c.trigger, c.attempt, c.now_unix_ms),
            (Trigger::DryRun, 1, 7)
        );
    }
}
