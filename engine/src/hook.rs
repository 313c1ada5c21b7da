//! Metacontroller hooks as modules: the `hook` world's call, and the adapter through which a
//! hook module serves `reconcile` and `finalize`.
//!
//! A component of the `hook` world says nothing about itself (no `metadata`): what it
//! reconciles comes from the controller that names it. The host gives a loaded hook module
//! that metadata and an adapter ([`Module::adapted`](crate::Module::adapted)); from then on the
//! module answers [`Module::reconcile`](crate::Module::reconcile) and
//! [`Module::finalize`](crate::Module::finalize) like any other, and the adapter turns each
//! into hook calls ([`Module::hook`](crate::Module::hook)) and their answers into intents.

use crate::contract::{FinalizeResponse, ReconcileRequest, ReconcileResponse};
use crate::{Limits, Module, Outcome};

/// Which hook of a controller a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HookKind {
    /// The sync hook (`parent`, `children` in; `children`, `status` out).
    Sync,
    /// The finalize hook (as sync, with `finalizing`; `finalized` out).
    Finalize,
    /// The customize hook (`parent` in; `relatedResources` out).
    Customize,
}

/// One hook call: the document Metacontroller would POST to the hook's webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookRequest {
    /// The hook.
    pub kind: HookKind,
    /// The path of the hook's webhook URL (`/sync`).
    pub path: String,
    /// The request document (JSON).
    pub body: String,
    /// The host's wall-clock time, milliseconds since the Unix epoch: the sandbox's clock
    /// starts there (as for a reconcile).
    pub now_unix_ms: u64,
}

/// How a hook module serves `reconcile` and `finalize`: the host's translation between
/// wasmop's requests and intents and the hook's documents.
///
/// Guarantees (of the engine): the adapter is called only for a module of the `hook` world,
/// on the caller's thread (which may block: each [`Module::hook`] call is a fresh sandbox under
/// `limits`).
pub trait HookAdapter: Send + Sync + 'static {
    /// Serves `reconcile`: one or more hook calls, their answers turned into a response.
    fn reconcile(
        &self,
        module: &Module,
        request: ReconcileRequest,
        limits: &Limits,
    ) -> Outcome<ReconcileResponse>;

    /// Whether the controller serves a primary with these `labels` and `annotations` (its
    /// parents' selectors). The host puts its finalizer only on the primaries selected, and
    /// finalizes one that holds it and is selected no more, as if it were deleted, then takes
    /// the finalizer off (Metacontroller's opt-out). Default: every primary.
    fn selects(
        &self,
        labels: &std::collections::BTreeMap<String, String>,
        annotations: &std::collections::BTreeMap<String, String>,
    ) -> bool {
        let _ = (labels, annotations);
        true
    }

    /// Serves `finalize`.
    fn finalize(
        &self,
        module: &Module,
        request: ReconcileRequest,
        limits: &Limits,
    ) -> Outcome<FinalizeResponse>;
}
