//! Releasing the finalizers a reconciler holds on primaries it no longer serves.
//!
//! A reconciler's finalizer ([`crate::crd::finalizer_for`]) keeps a primary until the module's
//! finalize says it is done. When the reconciler stops serving a primary for good, nothing would
//! ever remove it, and the primary (and its namespace) could never be deleted. So the host
//! removes it, with an Event on the primary saying why, when:
//! - the WasmReconciler is deleted (every primary; see [`crate::manager`] for how finalize gets
//!   a chance to run first);
//! - its `spec.namespaces` no longer includes the primary's namespace.
//!
//! # Guarantees
//! - Only this reconciler's finalizer is removed, with the primary's resourceVersion as a
//!   precondition (a conflict is retried on a fresh read); other finalizers are untouched.
//! - The legacy shared finalizer ([`crate::crd::FINALIZER`]) is removed only when the caller
//!   says the reconciler is not in conflict (so it is this reconciler's to remove).
//! - Writes use the module's identity (its ServiceAccount may update the primary's finalizers);
//!   a refusal is reported, never fatal.
//!
//! # Errors
//! [`ReleaseError`] when the primaries cannot be listed; per-primary failures are counted in
//! [`Released`].

use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Recorder};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::contract::{Gvk, ObjectRef};
use crate::controller::apply::object_reference;
use crate::crd::{FINALIZER, finalizer_for};
use crate::discovery::Resolved;

/// How often a conflicting finalizer write is retried.
const ATTEMPTS: usize = 5;

/// The primaries could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// Listing failed.
    #[error("cannot list {kind} to release finalizers of WasmReconciler {reconciler}: {source}")]
    List {
        /// The primary kind.
        kind: String,
        /// The reconciler.
        reconciler: String,
        /// The error.
        source: kube::Error,
    },
}

/// Which primaries to release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Which {
    /// Every primary.
    All,
    /// Primaries outside these namespaces.
    OutsideOf(Vec<String>),
}

impl Which {
    fn selects(&self, o: &DynamicObject) -> bool {
        match self {
            Which::All => true,
            Which::OutsideOf(keep) => o.namespace().is_some_and(|ns| !keep.contains(&ns)),
        }
    }
}

/// What a release did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Released {
    /// Primaries whose finalizer was removed.
    pub released: usize,
    /// Primaries whose finalizer could not be removed, with why.
    pub failed: Vec<String>,
}

/// Releases one reconciler's finalizers.
pub struct Releaser {
    /// The reconciler.
    pub reconciler: String,
    /// The primary kind and its resource.
    pub primary: (Gvk, Resolved),
    /// Reads (the host's identity).
    pub host: Client,
    /// Writes (the module's identity).
    pub module: Client,
    /// Events on released primaries (the host's identity).
    pub events: Recorder,
}

impl std::fmt::Debug for Releaser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Releaser")
            .field("reconciler", &self.reconciler)
            .finish_non_exhaustive()
    }
}

impl Releaser {
    fn is_ours(&self, f: &str, legacy: bool) -> bool {
        f == finalizer_for(&self.reconciler) || (legacy && f == FINALIZER)
    }

    fn all(&self) -> Api<DynamicObject> {
        Api::all_with(self.host.clone(), &self.primary.1.resource)
    }

    /// Whether some primary that is being deleted still holds this reconciler's finalizer.
    ///
    /// # Errors
    /// [`ReleaseError::List`].
    pub async fn deletions_pending(&self, legacy: bool) -> Result<bool, ReleaseError> {
        let list = self.list().await?;
        Ok(list.iter().any(|o| {
            o.metadata.deletion_timestamp.is_some()
                && o.finalizers().iter().any(|f| self.is_ours(f, legacy))
        }))
    }

    async fn list(&self) -> Result<Vec<DynamicObject>, ReleaseError> {
        self.all()
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .map_err(|source| ReleaseError::List {
                kind: self.primary.0.kind.clone(),
                reconciler: self.reconciler.clone(),
                source,
            })
    }

    /// Removes this reconciler's finalizer from the primaries `which` selects, recording an
    /// Event on each that says `why` (e.g. "was deleted").
    ///
    /// # Errors
    /// [`ReleaseError::List`]; failures on single primaries are in [`Released::failed`].
    pub async fn release(
        &self,
        which: &Which,
        legacy: bool,
        why: &str,
    ) -> Result<Released, ReleaseError> {
        let mut out = Released::default();
        for o in self.list().await? {
            if !which.selects(&o) || !o.finalizers().iter().any(|f| self.is_ours(f, legacy)) {
                continue;
            }
            match self.release_one(o.clone(), legacy).await {
                Ok(()) => {
                    out.released += 1;
                    let note = format!(
                        "WasmReconciler {} {why}: the host removed its finalizer {}{}",
                        self.reconciler,
                        finalizer_for(&self.reconciler),
                        if o.metadata.deletion_timestamp.is_some() {
                            " before the module's finalize finished; clean up what it would have"
                        } else {
                            ""
                        }
                    );
                    self.event(&o, &note).await;
                }
                Err(e) => out.failed.push(format!("{}: {e}", name_of(&o))),
            }
        }
        if !out.failed.is_empty() {
            tracing::warn!(reconciler = %self.reconciler, failed = ?out.failed, "cannot release some finalizers");
        }
        Ok(out)
    }

    async fn release_one(&self, mut o: DynamicObject, legacy: bool) -> Result<(), kube::Error> {
        let api: Api<DynamicObject> = match o.namespace() {
            Some(ns) if self.primary.1.namespaced => {
                Api::namespaced_with(self.module.clone(), &ns, &self.primary.1.resource)
            }
            _ => Api::all_with(self.module.clone(), &self.primary.1.resource),
        };
        let reads: Api<DynamicObject> = match o.namespace() {
            Some(ns) if self.primary.1.namespaced => {
                Api::namespaced_with(self.host.clone(), &ns, &self.primary.1.resource)
            }
            _ => self.all(),
        };
        let name = o.name_any();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let keep: Vec<String> = o
                .finalizers()
                .iter()
                .filter(|f| !self.is_ours(f, legacy))
                .cloned()
                .collect();
            let patch =
                json!({"metadata": {"finalizers": keep, "resourceVersion": o.resource_version()}});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < ATTEMPTS => {
                    match reads.get_opt(&name).await? {
                        Some(fresh) => o = fresh,
                        None => return Ok(()),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn event(&self, o: &DynamicObject, note: &str) {
        let r = ObjectRef {
            api_version: self.primary.0.api_version.clone(),
            kind: self.primary.0.kind.clone(),
            namespace: o.namespace(),
            name: o.name_any(),
        };
        let event = KubeEvent {
            type_: KubeEventType::Warning,
            reason: "FinalizerReleased".into(),
            note: Some(
                note.chars()
                    .take(crate::controller::intents::MAX_EVENT_NOTE)
                    .collect(),
            ),
            action: "Release".into(),
            secondary: None,
        };
        if let Err(e) = self
            .events
            .publish(&event, &object_reference(&r, o.uid()))
            .await
        {
            tracing::warn!(error = %e, "cannot record a FinalizerReleased Event");
        }
    }
}

fn name_of(o: &DynamicObject) -> String {
    match o.namespace() {
        Some(ns) => format!("{ns}/{}", o.name_any()),
        None => o.name_any(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(ns: &str) -> DynamicObject {
        match serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "X", "metadata": {"name": "n", "namespace": ns}
        })) {
            Ok(o) => o,
            Err(e) => panic!("test object: {e}"),
        }
    }

    #[test]
    fn narrowing_selects_only_primaries_outside_the_new_namespaces() {
        let which = Which::OutsideOf(vec!["keep".into()]);
        assert!(!which.selects(&object("keep")));
        assert!(which.selects(&object("gone")));
        assert!(Which::All.selects(&object("keep")));
    }
}
