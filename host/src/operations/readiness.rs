//! Whether this process is ready (`/readyz`): it finished starting and every component it runs
//! has synced its caches.
//!
//! Components register as *pending* when they start ([`Readiness::pending`]) and report
//! [`Readiness::ready`] once their informer caches have their first full list; a stopped
//! component is [`Readiness::forget`]-ten. The process is ready when at least the `startup`
//! component is ready and nothing is pending.
//!
//! What registers (see `docs/operating.md`): `startup` (the host's servers are up and its
//! components spawned), `admission` (the WasmReconciler cache admission reads), and, on the
//! replica that runs reconcilers (the leader), `manager` (the first WasmReconciler list) and one
//! `reconciler/<name>` per WasmReconciler (its module loaded and its controller's caches synced,
//! or its setup failed: a reconciler that cannot start is reported in its status and does not
//! hold the whole process back).
//!
//! # Guarantees
//! - Process-wide, like the `/readyz` it feeds; a poisoned lock reads as not ready.
//! - Every change is mirrored in `wasmop_component_ready{component}` (1 ready, 0 pending; the
//!   series goes with a forgotten component), so alerts see a cache that does not sync.
//! - Not ready before anything registers.
//!
//! # Errors
//! None: every operation is infallible.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use crate::operations::metrics;

/// The process's readiness.
#[derive(Debug, Default)]
pub struct Readiness {
    components: Mutex<BTreeMap<String, bool>>,
}

/// The process's readiness.
pub fn global() -> &'static Readiness {
    static READY: OnceLock<Readiness> = OnceLock::new();
    READY.get_or_init(Readiness::default)
}

impl Readiness {
    /// `component` started and is not ready yet.
    pub fn pending(&self, component: &str) {
        if let Ok(mut c) = self.components.lock() {
            c.insert(component.to_string(), false);
        }
        metrics::global().component_ready(component, Some(false));
    }

    /// `component` is ready.
    pub fn ready(&self, component: &str) {
        if let Ok(mut c) = self.components.lock() {
            c.insert(component.to_string(), true);
        }
        metrics::global().component_ready(component, Some(true));
    }

    /// `component` stopped; it no longer counts.
    pub fn forget(&self, component: &str) {
        if let Ok(mut c) = self.components.lock() {
            c.remove(component);
        }
        metrics::global().component_ready(component, None);
    }

    /// Ok when ready, else the pending components.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let Ok(c) = self.components.lock() else {
            return Err(vec!["(lock poisoned)".into()]);
        };
        let pending: Vec<String> = c
            .iter()
            .filter(|(_, ready)| !**ready)
            .map(|(k, _)| k.clone())
            .collect();
        if c.get("startup") != Some(&true) && !pending.contains(&"startup".to_string()) {
            return Err(vec!["startup".into()]);
        }
        if pending.is_empty() {
            Ok(())
        } else {
            Err(pending)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_after_startup_with_nothing_pending() {
        let r = Readiness::default();
        assert!(r.check().is_err());
        r.pending("startup");
        r.pending("reconciler/a");
        assert_eq!(
            r.check(),
            Err(vec!["reconciler/a".to_string(), "startup".to_string()])
        );
        r.ready("startup");
        assert!(r.check().is_err());
        r.ready("reconciler/a");
        assert_eq!(r.check(), Ok(()));
        r.pending("reconciler/b");
        r.forget("reconciler/b");
        assert_eq!(r.check(), Ok(()));
    }
}
