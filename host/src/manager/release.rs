//! Releasing the finalizers a reconciler holds on primaries it no longer serves.
//!
//! A reconciler's finalizer ([`crate::crd::finalizer_for`]) keeps a primary until the module's
//! finalize says it is done. When the reconciler stops serving a primary for good, nothing would
//! ever remove it, and the primary (and its namespace) could never be deleted. So the host
//! removes it, with an Event on the primary saying why, when:
//! - the WasmReconciler is deleted (every primary; see [`crate::manager`] for how finalize gets
//!   a chance to run first): `release_deleted`;
//! - its `spec.namespaces` no longer includes the primary's namespace: `outside_namespaces`.
//!
//! The WasmReconciler itself carries [`RECONCILER_FINALIZER`] (`ensure_finalizer`) so that
//! its deletion waits for the release; that finalizer goes last.
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

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use super::status::{Subject, truncate};
use super::{HostContext, RELEASE_GRACE, conflict};
use crate::contract::{Gvk, ObjectRef};
use crate::controller::apply::object_reference;
use crate::crd::{FINALIZER, RECONCILER_FINALIZER, WasmReconciler, finalizer_for};
use crate::discovery::Resolved;
use crate::modules::copy;
use crate::reasons;

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
    /// Primaries in these namespaces.
    InsideOf(Vec<String>),
}

impl Which {
    fn selects(&self, o: &DynamicObject) -> bool {
        match self {
            Which::All => true,
            Which::OutsideOf(keep) => o.namespace().is_some_and(|ns| !keep.contains(&ns)),
            Which::InsideOf(these) => o.namespace().is_some_and(|ns| these.contains(&ns)),
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
            reason: reasons::FINALIZER_RELEASED.into(),
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

/// Adds [`RECONCILER_FINALIZER`] to `wr` if it lacks it. A failure is logged; the next event
/// of the WasmReconciler tries again.
pub(super) async fn ensure_finalizer(ctx: &HostContext, wr: &WasmReconciler) {
    if wr.finalizers().iter().any(|f| f == RECONCILER_FINALIZER) {
        return;
    }
    let mut finalizers = wr.finalizers().to_vec();
    finalizers.push(RECONCILER_FINALIZER.to_string());
    let patch =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": wr.resource_version()}});
    let api: Api<WasmReconciler> = Api::all(ctx.client.clone());
    if let Err(e) = api
        .patch(
            &wr.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        tracing::warn!(reconciler = %wr.name_any(), error = %e, "cannot add the WasmReconciler's finalizer (the host needs patch on wasmreconcilers)");
    }
}

/// The releaser of `wr`'s finalizers, or None when its primary kind is not served (there is
/// then nothing to release).
pub(super) async fn releaser(
    ctx: &HostContext,
    wr: &WasmReconciler,
) -> Result<Option<Releaser>, String> {
    let kind = wr.spec.primary.gvk();
    let Ok(resolved) = ctx.discovery.resolve(&kind).await else {
        return Ok(None);
    };
    let module = ctx.module_client(wr).map_err(|e| e.to_string())?;
    Ok(Some(Releaser {
        reconciler: wr.name_any(),
        primary: (kind, resolved),
        host: ctx.client.clone(),
        module,
        events: ctx.host_events(),
    }))
}

/// Releases everything deleted WasmReconciler `wr` holds, then lets it go; retried until done.
pub(super) async fn release_deleted(
    ctx: Arc<HostContext>,
    wr: WasmReconciler,
    mut stop: Option<BoxFuture<'static, ()>>,
) {
    let mut delay = Duration::from_secs(1);
    loop {
        match release_deleted_once(&ctx, &wr, &mut stop).await {
            Ok(()) => return,
            Err(message) => {
                tracing::warn!(reconciler = %wr.name_any(), error = %message, "cannot release the deleted WasmReconciler yet; retrying");
                let event = KubeEvent {
                    type_: KubeEventType::Warning,
                    reason: reasons::RELEASE_FAILED.into(),
                    note: Some(truncate(&format!(
                        "{message} (retrying; grant the ServiceAccount update on the primaries' finalizers, or remove the finalizers by hand)"
                    ))),
                    action: "Release".into(),
                    secondary: None,
                };
                let _ = ctx.host_events().publish(&event, &wr.object_ref(&())).await;
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(60));
    }
}

async fn release_deleted_once(
    ctx: &HostContext,
    wr: &WasmReconciler,
    stop: &mut Option<BoxFuture<'static, ()>>,
) -> Result<(), String> {
    let api: Api<WasmReconciler> = Api::all(ctx.client.clone());
    let all = api
        .list(&Default::default())
        .await
        .map_err(|e| format!("cannot list WasmReconcilers: {e}"))?;
    // The legacy shared finalizer is this reconciler's only if it did not lose a conflict.
    let legacy = conflict::winner_over(wr, &all.items).is_none();
    let releaser = releaser(ctx, wr).await?;
    if let Some(stop) = stop.take() {
        // Let the running controller finalize primaries already being deleted, bounded.
        let until = tokio::time::Instant::now() + RELEASE_GRACE;
        if let Some(r) = &releaser {
            while tokio::time::Instant::now() < until
                && r.deletions_pending(legacy).await.unwrap_or(false)
            {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        stop.await;
    }
    if let Some(r) = &releaser {
        let out = r
            .release(&Which::All, legacy, "was deleted")
            .await
            .map_err(|e| e.to_string())?;
        if !out.failed.is_empty() {
            return Err(format!(
                "cannot remove the finalizer from {} primaries: {}",
                out.failed.len(),
                out.failed.join("; ")
            ));
        }
        if out.released > 0 {
            tracing::info!(reconciler = %wr.name_any(), released = out.released, "released primaries");
        }
    }
    if let Some(copy) = wr.status.as_ref().and_then(|s| s.module_copy.as_ref())
        && let Err(e) = copy::delete(&ctx.client, copy, &wr.name_any()).await
    {
        tracing::warn!(reconciler = %wr.name_any(), error = %e, "cannot delete the module copy");
    }
    // Drop our finalizer from the current object (others may have changed it meanwhile).
    for _ in 0..5 {
        let Some(current) = api
            .get_opt(&wr.name_any())
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(());
        };
        let keep: Vec<String> = current
            .finalizers()
            .iter()
            .filter(|f| *f != RECONCILER_FINALIZER)
            .cloned()
            .collect();
        let patch = json!({"metadata": {"finalizers": keep, "resourceVersion": current.resource_version()}});
        match api
            .patch(
                &wr.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => continue,
            Err(e) => return Err(format!("cannot remove the WasmReconciler's finalizer: {e}")),
        }
    }
    Err("the WasmReconciler kept changing while its finalizer was removed".into())
}

/// Releases the primaries outside `spec.namespaces`; failures are logged and Events record
/// each release. True once every one is released (the supervisor then does not try again).
pub(super) async fn outside_namespaces(s: &Subject) -> bool {
    if s.wr.spec.namespaces.is_empty() {
        return false;
    }
    let which = Which::OutsideOf(s.wr.spec.namespaces.clone());
    let why = format!(
        "no longer serves this namespace (spec.namespaces: {})",
        s.wr.spec.namespaces.join(", ")
    );
    release_reported(s, &which, true, &why, "outside spec.namespaces").await
}

/// Releases this reconciler's finalizers on the primaries `winner` reconciles now: a reconciler
/// that lost a conflict ([`super::conflict`]) runs nothing, so they would stay on every one of
/// them (and block their deletion). True once every one is released.
pub(super) async fn to_winner(s: &Subject, winner: &WasmReconciler) -> bool {
    let which = if winner.spec.namespaces.is_empty() {
        Which::All
    } else {
        Which::InsideOf(winner.spec.namespaces.clone())
    };
    let why = format!(
        "lost its primaries to WasmReconciler {}, created first",
        winner.name_any()
    );
    release_reported(s, &which, false, &why, "that another reconciler took over").await
}

/// Releases the primaries `which` selects (see [`Releaser::release`]), with a Warning Event on
/// the WasmReconciler naming those that failed (`what` says which primaries); true once every
/// one is released.
async fn release_reported(s: &Subject, which: &Which, legacy: bool, why: &str, what: &str) -> bool {
    let releaser = match releaser(&s.ctx, &s.wr).await {
        Ok(Some(r)) => r,
        Ok(None) => return false,
        Err(e) => {
            tracing::warn!(reconciler = %s.name(), error = %e, "cannot release primaries {what}");
            return false;
        }
    };
    match releaser.release(which, legacy, why).await {
        Ok(out) if out.failed.is_empty() => true,
        Ok(out) => {
            let message = format!(
                "cannot remove the finalizer from primaries {what}: {}",
                out.failed.join("; ")
            );
            s.event_on_wr(KubeEventType::Warning, reasons::RELEASE_FAILED, &message)
                .await;
            false
        }
        Err(e) => {
            tracing::warn!(reconciler = %s.name(), error = %e, "cannot release primaries {what}");
            false
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
