//! The module serving a reconciler, swappable while reconciles run.
//!
//! # Guarantees
//! - A reconcile takes the active module once, at its start ([`ModuleSlot::active`]), and keeps
//!   it to the end: a swap never changes the module under a running call. New reconciles see
//!   the new module as soon as [`ModuleSlot::activate`] returns.
//! - The previous module is kept for rollback until the next swap; a ConfigMap update that
//!   holds the module already serving ([`ModuleSlot::refresh`]) is not a swap and keeps it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use crate::contract::{Gvk, ModuleMetadata, RelatedKind};
use crate::engine::Module;
use crate::grant::Grant;

/// What a module may do: its request (metadata) intersected with the administrator's grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fit {
    /// Kinds it may own and write.
    pub grant: Grant,
    /// Related kinds it reads, with its selectors and mappings (granted ones only).
    pub related: Vec<RelatedKind>,
    /// What it asked for and was not granted, for the status.
    pub ungranted: Vec<String>,
}

impl Fit {
    /// Intersects the module's request with the granted owned and related kinds.
    ///
    /// # Errors
    /// A message when the module reconciles another primary kind than the one registered.
    pub fn compute(
        metadata: &ModuleMetadata,
        primary: &Gvk,
        owned: &[Gvk],
        related: &[Gvk],
    ) -> Result<Fit, String> {
        if metadata.primary != *primary {
            return Err(format!(
                "module {} reconciles {}, but the WasmReconciler registers it for {primary}",
                metadata.name, metadata.primary
            ));
        }
        let mut ungranted = Vec::new();
        let mut grant = Grant::default();
        for k in &metadata.owns {
            if owned.contains(k) {
                grant.owned.insert(k.clone());
            } else {
                ungranted.push(format!("owns {k}"));
            }
        }
        let mut rel = Vec::new();
        for r in &metadata.related {
            if related.contains(&r.kind) {
                grant.related.insert(r.kind.clone());
                rel.push(r.clone());
            } else {
                ungranted.push(format!("related {}", r.kind));
            }
        }
        Ok(Fit {
            grant,
            related: rel,
            ungranted,
        })
    }
}

/// A module in service, with the outcomes of the reconciles it ran.
#[derive(Debug)]
pub struct Active {
    /// The module.
    pub module: Module,
    /// What it may do.
    pub fit: Fit,
    /// When it was activated.
    pub activated_at: SystemTime,
    /// The resourceVersion of the ConfigMap it came from.
    pub source_version: String,
    calls: AtomicU32,
    failures: AtomicU32,
}

impl Active {
    /// A module entering service.
    pub fn new(module: Module, fit: Fit, source_version: String) -> Self {
        Active {
            module,
            fit,
            activated_at: SystemTime::now(),
            source_version,
            calls: AtomicU32::new(0),
            failures: AtomicU32::new(0),
        }
    }

    /// Counts one reconcile's outcome (`false`: the module failed or returned invalid intents).
    pub fn record(&self, ok: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// (reconciles, failures) so far.
    pub fn counts(&self) -> (u32, u32) {
        (
            self.calls.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
        )
    }
}

#[derive(Debug)]
struct State {
    active: Arc<Active>,
    previous: Option<Arc<Active>>,
}

/// The swappable slot. Cheap to clone; clones share the slot.
#[derive(Debug, Clone)]
pub struct ModuleSlot {
    state: Arc<RwLock<State>>,
}

impl ModuleSlot {
    /// A slot serving `active`.
    pub fn new(active: Active) -> Self {
        ModuleSlot {
            state: Arc::new(RwLock::new(State {
                active: Arc::new(active),
                previous: None,
            })),
        }
    }

    /// The module serving now.
    pub fn active(&self) -> Arc<Active> {
        match self.state.read() {
            Ok(s) => s.active.clone(),
            Err(poisoned) => poisoned.into_inner().active.clone(),
        }
    }

    /// The module that served before the last swap, if any.
    pub fn previous(&self) -> Option<Arc<Active>> {
        match self.state.read() {
            Ok(s) => s.previous.clone(),
            Err(poisoned) => poisoned.into_inner().previous.clone(),
        }
    }

    /// Puts `next` in service; the one serving until now becomes the previous.
    pub fn activate(&self, next: Active) {
        let mut s = match self.state.write() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        let old = std::mem::replace(&mut s.active, Arc::new(next));
        s.previous = Some(old);
    }

    /// Records that the module serving now came from ConfigMap version `source_version` (the
    /// ConfigMap changed but holds the same module). The previous module stays the rollback
    /// target; the active module's counters go on.
    pub fn refresh(&self, source_version: String) {
        let mut s = match self.state.write() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        let (calls, failures) = s.active.counts();
        let next = Active::new(
            s.active.module.clone(),
            s.active.fit.clone(),
            source_version,
        );
        next.calls.store(calls, Ordering::Relaxed);
        next.failures.store(failures, Ordering::Relaxed);
        s.active = Arc::new(next);
    }

    /// Puts the previous module back in service (fresh counters); returns false if there is none.
    pub fn roll_back(&self) -> bool {
        let mut s = match self.state.write() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        let Some(previous) = s.previous.take() else {
            return false;
        };
        s.active = Arc::new(Active::new(
            previous.module.clone(),
            previous.fit.clone(),
            previous.source_version.clone(),
        ));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, EngineConfig, Limits};

    fn load(engine: &Engine, path: &str) -> Module {
        let bytes = wasmop_test_modules::bytes(path);
        match engine.load(&bytes, &Limits::default()) {
            Ok(m) => m,
            Err(e) => panic!("test module {path}: {e}"),
        }
    }

    fn active(m: &Module, version: &str) -> Active {
        let fit = Fit {
            grant: Grant::default(),
            related: Vec::new(),
            ungranted: Vec::new(),
        };
        Active::new(m.clone(), fit, version.into())
    }

    #[test]
    fn an_update_with_the_same_module_keeps_the_good_one_as_the_rollback_target() {
        let engine = match Engine::new(&EngineConfig::default()) {
            Ok(e) => e,
            Err(e) => panic!("engine: {e}"),
        };
        let good = load(&engine, wasmop_test_modules::MISBEHAVE);
        let bad = load(&engine, wasmop_test_modules::MISBEHAVE_FRAGILE);
        let slot = ModuleSlot::new(active(&good, "1"));
        slot.activate(active(&bad, "2"));
        slot.active().record(false);
        // The ConfigMap changes (a label, an annotation) but still holds the bad module.
        slot.refresh("3".into());
        assert_eq!(slot.active().source_version, "3");
        assert_eq!(slot.active().counts(), (1, 1), "the rollback watch goes on");
        assert_eq!(
            slot.previous().map(|p| p.module.sha256().to_string()),
            Some(good.sha256().to_string())
        );
        assert!(slot.roll_back());
        assert_eq!(slot.active().module.sha256(), good.sha256());
    }
}
