//! The adapter through which a hook module serves `reconcile` and `finalize`
//! ([`HookAdapter`]): one hook call each, in a fresh sandbox under the reconciler's limits.

use std::sync::Arc;

use crate::contract::{FinalizeResponse, ModuleMetadata, ReconcileRequest, ReconcileResponse};
use crate::crd::{HookSpec, WasmReconcilerSpec};
use crate::engine::{
    CallError, CallStats, HookAdapter, HookKind, HookRequest, Limits, LoadError, Module, Outcome,
};
use crate::text::short_hex;

use super::answer::{self, Answer};
use super::document::{Observed, sync_document};

/// Serves a controller's sync and finalize hooks from one hook module.
#[derive(Debug, Clone)]
pub struct Adapter {
    spec: HookSpec,
}

impl Adapter {
    /// An adapter for `spec`.
    pub fn new(spec: HookSpec) -> Self {
        Adapter { spec }
    }

    /// Runs the sync (or finalize) hook on `request`: its parsed answer, or the failure.
    fn call(
        &self,
        module: &Module,
        request: &ReconcileRequest,
        limits: &Limits,
        finalizing: bool,
    ) -> Outcome<(Observed, Answer)> {
        let observed = match Observed::of(request, &self.spec) {
            Ok(o) => o,
            Err(detail) => return failed(CallError::Sandbox { detail }),
        };
        let (kind, path) = match (&self.spec.finalize, finalizing) {
            (Some(path), true) => (HookKind::Finalize, path.clone()),
            _ => (HookKind::Sync, self.spec.sync.clone()),
        };
        let body = sync_document(&self.spec, &observed, finalizing).to_string();
        let call = HookRequest {
            kind,
            path,
            body,
            now_unix_ms: request.context.now_unix_ms,
        };
        let Outcome { result, stats } = module.hook(call, &request.context.reconciler, limits);
        let result = result.and_then(|text| {
            answer::parse(&self.spec, &text)
                .map(|a| (observed, a))
                .map_err(|detail| CallError::Malformed { detail })
        });
        Outcome { result, stats }
    }
}

fn failed<T>(e: CallError) -> Outcome<T> {
    Outcome {
        result: Err(e),
        stats: CallStats::default(),
    }
}

fn map<T, U>(out: Outcome<T>, f: impl FnOnce(T) -> U) -> Outcome<U> {
    Outcome {
        result: out.result.map(f),
        stats: out.stats,
    }
}

impl HookAdapter for Adapter {
    fn reconcile(
        &self,
        module: &Module,
        request: ReconcileRequest,
        limits: &Limits,
    ) -> Outcome<ReconcileResponse> {
        map(self.call(module, &request, limits, false), |(o, a)| {
            answer::reconcile_response(&self.spec, &o, a)
        })
    }

    fn finalize(
        &self,
        module: &Module,
        request: ReconcileRequest,
        limits: &Limits,
    ) -> Outcome<FinalizeResponse> {
        map(self.call(module, &request, limits, true), |(o, a)| {
            answer::finalize_response(&o, a)
        })
    }
}

/// What a hook module serving `spec` says about itself: the controller's kinds, and whether
/// it finalizes (a finalize hook).
pub fn metadata(module: &Module, spec: &WasmReconcilerSpec, hook: &HookSpec) -> ModuleMetadata {
    let name = hook
        .controller
        .pointer("/metadata/name")
        .and_then(|n| n.as_str())
        .unwrap_or("hook");
    ModuleMetadata {
        name: name.to_string(),
        version: short_hex(module.sha256()).to_string(),
        primary: spec.primary.gvk(),
        owns: spec.owns.iter().map(|k| k.gvk()).collect(),
        related: Vec::new(),
        finalizes: hook.finalize.is_some(),
        validates: false,
    }
}

/// `module` as the reconciler `spec` serves it: a hook module gets its metadata and adapter
/// from `spec.hook`; a module of the `module` world is served as it is.
///
/// # Errors
/// [`LoadError::Metadata`] when the module's world and the spec disagree: a hook module for a
/// WasmReconciler without `spec.hook` (it says nothing about itself), or a `module`-world
/// module for a Metacontroller controller.
pub fn serve(module: Module, spec: &WasmReconcilerSpec) -> Result<Module, LoadError> {
    match (&spec.hook, module.is_hook()) {
        (Some(hook), _) => {
            let metadata = metadata(&module, spec, hook);
            module.adapted(metadata, Arc::new(Adapter::new(hook.clone())))
        }
        (None, true) => Err(LoadError::Metadata(
            "is a Metacontroller hook (world `hook`): it serves only a CompositeController whose spec.wasmop names it, not a WasmReconciler".into(),
        )),
        (None, false) => Ok(module),
    }
}
