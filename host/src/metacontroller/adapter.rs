//! The adapter through which a hook module serves `reconcile` and `finalize`
//! ([`HookAdapter`]): one hook call each, in a fresh sandbox under the reconciler's limits.

use std::sync::Arc;

use crate::contract::{
    FinalizeResponse, Mapping, ModuleMetadata, ReconcileRequest, ReconcileResponse, RelatedKind,
    Selector,
};
use crate::crd::{HookSpec, WasmReconcilerSpec};
use crate::engine::{
    CallError, CallStats, HookAdapter, HookKind, HookRequest, Limits, LoadError, Module, Outcome,
};
use crate::text::short_hex;

use super::answer::{self, Answer};
use super::document::{Observed, Parents, customize_document, related_map, sync_document};

/// Serves a controller's sync and finalize hooks from one hook module.
#[derive(Debug, Clone)]
pub struct Adapter {
    spec: HookSpec,
    parents: Parents,
}

impl Adapter {
    /// An adapter for `spec`.
    pub fn new(spec: HookSpec) -> Self {
        let parents = Parents::of(&spec);
        Adapter { spec, parents }
    }

    /// Runs the customize hook (if any) and the sync (or finalize) hook on `request`: the
    /// parsed answer, None when a parent to sync is not selected (the parent's selectors), or
    /// the failure.
    fn call(
        &self,
        module: &Module,
        request: &ReconcileRequest,
        limits: &Limits,
        finalizing: bool,
    ) -> Outcome<Option<(Observed, Answer)>> {
        let observed = match Observed::of(request, &self.spec) {
            Ok(o) => o,
            Err(detail) => return failed(CallError::Sandbox { detail }),
        };
        // A parent being finalized holds the controller's finalizer, selected or not (one that
        // opted out is finalized too, as under Metacontroller).
        if !finalizing && !observed.selected(&self.parents) {
            return Outcome {
                result: Ok(None),
                stats: CallStats::default(),
            };
        }
        let hook = |kind, path: &str, body: serde_json::Value| {
            let call = HookRequest {
                kind,
                path: path.to_string(),
                body: body.to_string(),
                now_unix_ms: request.context.now_unix_ms,
            };
            module.hook(call, &request.context.reconciler, limits)
        };
        let (related, mut stats) = match &self.spec.customize {
            None => (serde_json::json!({}), CallStats::default()),
            Some(path) => {
                let Outcome { result, stats } = hook(
                    HookKind::Customize,
                    path,
                    customize_document(&self.spec, &observed),
                );
                let related = result.and_then(|body| {
                    related_map(&self.spec, &observed, &body)
                        .map_err(|detail| CallError::Malformed { detail })
                });
                match related {
                    Ok(r) => (r, stats),
                    Err(e) => {
                        return Outcome {
                            result: Err(e),
                            stats,
                        };
                    }
                }
            }
        };
        let (kind, path) = match (&self.spec.finalize, finalizing) {
            (Some(path), true) => (HookKind::Finalize, path.clone()),
            _ => (HookKind::Sync, self.spec.sync.clone()),
        };
        let Outcome {
            result,
            stats: sync,
        } = hook(
            kind,
            &path,
            sync_document(&self.spec, &observed, related, finalizing),
        );
        add(&mut stats, sync);
        let result = result.and_then(|text| {
            answer::parse(&self.spec, &text)
                .map(|a| Some((observed, a)))
                .map_err(|detail| CallError::Malformed { detail })
        });
        Outcome { result, stats }
    }
}

/// `more`'s costs added to `stats` (a reconcile of two hook calls).
fn add(stats: &mut CallStats, more: CallStats) {
    stats.queued += more.queued;
    stats.instantiate += more.instantiate;
    stats.call += more.call;
    stats.memory_peak = stats.memory_peak.max(more.memory_peak);
    stats.logs_dropped += more.logs_dropped;
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
    fn selects(
        &self,
        labels: &std::collections::BTreeMap<String, String>,
        annotations: &std::collections::BTreeMap<String, String>,
    ) -> bool {
        self.parents.selects(labels, annotations)
    }

    fn reconcile(
        &self,
        module: &Module,
        request: ReconcileRequest,
        limits: &Limits,
    ) -> Outcome<ReconcileResponse> {
        map(
            self.call(module, &request, limits, false),
            |called| match called {
                Some((o, a)) => answer::reconcile_response(&self.spec, &o, a),
                // Not selected: left alone (no child set, no status).
                None => ReconcileResponse {
                    children: Vec::new(),
                    actions: Vec::new(),
                    status: None,
                    events: Vec::new(),
                    requeue_after: None,
                },
            },
        )
    }

    fn finalize(
        &self,
        module: &Module,
        request: ReconcileRequest,
        limits: &Limits,
    ) -> Outcome<FinalizeResponse> {
        map(
            self.call(module, &request, limits, true),
            |called| match called {
                Some((o, a)) => answer::finalize_response(&o, a),
                None => FinalizeResponse {
                    done: true,
                    actions: Vec::new(),
                    status: None,
                    events: Vec::new(),
                    requeue_after: None,
                },
            },
        )
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
        // Every related object concerns every parent: which ones a parent reads is the
        // customize hook's answer, known only when it is called.
        related: hook
            .related
            .iter()
            .map(|r| RelatedKind {
                kind: r.gvk(),
                selector: Selector::default(),
                maps_to: Mapping::AllPrimaries,
            })
            .collect(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, EngineConfig};

    fn module_world() -> Module {
        let engine =
            Engine::new(&EngineConfig::default()).unwrap_or_else(|e| panic!("engine: {e}"));
        let bytes = wasmop_test_modules::bytes(wasmop_test_modules::MISBEHAVE);
        engine
            .load(&bytes, &Limits::default())
            .unwrap_or_else(|e| panic!("module: {e}"))
    }

    fn spec(hook: Option<HookSpec>) -> WasmReconcilerSpec {
        let mut spec: WasmReconcilerSpec = serde_json::from_value(serde_json::json!({
            "module": {"configMap": {"namespace": "ns", "name": "m"}},
            "primary": {"apiVersion": "test.wasmop.dev/v1", "kind": "Widget"},
            "owns": [{"apiVersion": "v1", "kind": "ConfigMap"}],
            "serviceAccount": {"namespace": "ns", "name": "sa"}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        spec.hook = hook;
        spec
    }

    #[test]
    fn a_module_of_the_module_world_is_served_as_it_is_and_refused_for_a_controller() {
        let module = module_world();
        assert!(!module.is_hook());
        let served = serve(module.clone(), &spec(None)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(served.metadata(), module.metadata());
        let hook: HookSpec = serde_json::from_value(serde_json::json!({
            "controller": {"metadata": {"name": "c"}}, "sync": "/sync"
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let refused = serve(module, &spec(Some(hook)))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("not the `hook` world"), "{refused}");
    }
}
