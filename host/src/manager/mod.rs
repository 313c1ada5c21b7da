//! The host's top level: watches WasmReconcilers and keeps one supervised controller running per
//! WasmReconciler, with its module loaded from a ConfigMap and hot-swapped when it changes.
//!
//! Per WasmReconciler, a supervisor task:
//! 1. resolves the kinds, reads and loads the module (compiled off the async threads, from the
//!    disk cache when possible), checks it fits the registration, and starts the controller;
//! 2. watches the module's ConfigMap: a new module is read, checked (pin, contract version,
//!    metadata against the grant), compiled, dry-run over cached primaries, then swapped in
//!    atomically and every primary is reconciled again; a bad one is refused and the old one
//!    keeps serving;
//! 3. watches a new module's first reconciles and rolls back to the previous module when its
//!    failure rate passes the threshold;
//! 4. keeps the WasmReconciler's status (conditions Ready / ModuleLoaded / Degraded,
//!    activeModule, ungranted, observedGeneration).
//!
//! Adding, changing (a new generation) or deleting a WasmReconciler starts, restarts or stops
//! its supervisor; other reconcilers are untouched, except those that overlap it
//! ([`conflict`]): they are restarted so that the winner is decided again.
//!
//! # Lifecycle guarantees
//! - Every served WasmReconciler carries [`crate::crd::RECONCILER_FINALIZER`]. When it is deleted, its
//!   controller keeps running for up to [`RELEASE_GRACE`] while primaries that are being deleted
//!   still hold its finalizer (so the module's finalize runs while the module is loaded); then
//!   the controller stops, the finalizer is removed from every remaining primary with a
//!   `FinalizerReleased` Event ([`release`]), the module copy is deleted, and the
//!   WasmReconciler's own finalizer goes last. A release that cannot finish is retried with
//!   backoff and reported as a Warning Event on the WasmReconciler.
//! - Narrowing `spec.namespaces` releases the primaries left outside, the same way.
//! - A rolled-back module stays rolled back across restarts, failovers and edits: setup honours
//!   `status.rejectedSha256` and loads the last good module from the host's copy
//!   ([`crate::modules::copy`]).
//! - Only a module's own failures in the pre-swap self-check (a failed call, invalid intents)
//!   refuse it; a failure of the cluster (API errors, timeouts) or of the host (no sandbox
//!   free) defers the swap, retried with backoff.
//!
//! # Errors
//! [`ManagerError`] only when the WasmReconciler watch itself cannot run; everything about one
//!
//! # Layout
//! - `supervisor`: one reconciler's supervisor (set-up, serve loop);
//! - `swap`: reading and checking a module, the hot swap, the self-check and the rollback;
//! - `rekey`: the serving module's signatures checked again when its policy's key changes;
//! - [`status`]: the WasmReconciler's conditions, status writes and Events;
//! - [`release`]: the WasmReconciler's finalizer and the release of its primaries;
//! - [`access`], [`conflict`]: the set-up checks (read access, overlapping reconcilers).

pub mod access;
pub use crate::conflict;
mod rekey;
pub mod release;
pub mod status;
mod supervisor;
mod swap;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::oneshot;

use crate::admission::Slots;
use crate::controller;
use crate::crd::WasmReconciler;
use crate::discovery::Discovery;
use crate::engine::Engine;
use crate::{operations::metrics, operations::readiness};
use release::{ensure_finalizer, release_deleted};
use supervisor::Supervisor;

/// How long a deleted WasmReconciler's controller keeps running so that the module's finalize
/// can finish primaries already being deleted, before their finalizers are released anyway.
pub const RELEASE_GRACE: Duration = Duration::from_secs(20);

/// What the manager needs.
#[derive(Clone)]
pub struct HostContext {
    /// The Wasm engine.
    pub engine: Engine,
    /// The host's client.
    pub client: Client,
    /// The host's client configuration (cloned, with impersonation, per reconciler).
    pub config: kube::Config,
    /// Kind resolution.
    pub discovery: Discovery,
    /// The reporting instance for Events (pod or host name).
    pub instance: String,
    /// The resync period when a WasmReconciler does not set one.
    pub default_resync: Duration,
    /// How long a status in flux may be held back (`--status-debounce`).
    pub status_debounce: Duration,
    /// Serve only WasmReconcilers matching this label selector.
    pub selector: Option<String>,
    /// Where failed requests are recorded (`--record-failures`), if anywhere.
    pub failures: Option<Arc<crate::controller::record::FailureRecorder>>,
    /// OCI module sources.
    pub oci: crate::modules::oci::OciOptions,
    /// With `--shards auto`: the ranges of primaries this replica reconciles.
    pub shards: Option<Arc<crate::sharding::Shards>>,
    /// The bound on reconciles at once over every reconciler (`--max-concurrent-reconciles`).
    pub reconcile_limit: crate::controller::limit::ReconcileLimit,
    /// The request budget every client of the host shares (`--kube-qps`; None: unlimited).
    pub rate_limit: Option<crate::operations::ratelimit::RateLimit>,
    /// The modules serving reconcilers in this process, published for the admission webhook.
    pub slots: Slots,
}

impl std::fmt::Debug for HostContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostContext")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl HostContext {
    /// The client impersonating `wr`'s ServiceAccount: the modules' writes and finalizer
    /// releases go through it (HTTP/1.1, the host's shared request budget).
    fn module_client(&self, wr: &WasmReconciler) -> Result<Client, kube::Error> {
        let mut config = self.config.clone();
        config.auth_info.impersonate = Some(wr.spec.service_account.username());
        crate::operations::ratelimit::client(
            config,
            crate::operations::transport::Traffic::Writes,
            self.rate_limit.as_ref(),
        )
    }

    fn host_events(&self) -> Recorder {
        Recorder::new(
            self.client.clone(),
            Reporter {
                controller: "wasmop".into(),
                instance: Some(self.instance.clone()),
            },
        )
    }
}

/// The manager's own failure.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// The WasmReconciler watch failed for good.
    #[error(
        "watching WasmReconcilers failed: {0} (is the CRD installed? `kubectl apply -f deploy/crds/`)"
    )]
    Watch(#[from] watcher::Error),
}

struct Supervised {
    wr: WasmReconciler,
    generation: Option<i64>,
    stop: Option<oneshot::Sender<()>>,
    /// New generations that change only the OCI module reference: handed to the running
    /// supervisor, which hot-swaps (the old module keeps serving if the new one cannot load).
    updates: Updates,
    /// What the group decided about the module (`status.activeModule`, `rejectedSha256`,
    /// `moduleCopy`, written by the replica that decided): handed to the running supervisor,
    /// which follows it (see [`Decided`]).
    decisions: futures::channel::mpsc::UnboundedSender<Decided>,
    /// The last decision handed over.
    decided: Decided,
    task: tokio::task::JoinHandle<()>,
}

/// The part of a WasmReconciler's status that the group shares: which module serves, which
/// was rejected, and where the host's copy is. With sharding one replica decides each
/// reconciler's module ([`crate::sharding::Serving::decides`]) and records it; the others
/// follow what they observe here (see [`swap::follow`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Decided {
    pub active: Option<crate::crd::ActiveModule>,
    pub rejected: Option<String>,
    pub copy: Option<crate::crd::ConfigMapKey>,
}

impl Decided {
    /// What `wr`'s status records.
    fn of(wr: &WasmReconciler) -> Decided {
        let status = wr.status.clone().unwrap_or_default();
        Decided {
            active: status.active_module,
            rejected: status.rejected_sha256,
            copy: status.module_copy,
        }
    }

    /// The serving module's digest.
    pub fn active_sha(&self) -> Option<&str> {
        self.active.as_ref().map(|a| a.sha256.as_str())
    }

    /// Whether `other` records another module or rejection than this.
    fn differs(&self, other: &Decided) -> bool {
        self.active_sha() != other.active_sha()
            || self.rejected != other.rejected
            || self.copy != other.copy
    }
}

impl Supervised {
    /// Hands the supervisor a decision newly recorded in `wr`'s status (its own come back too:
    /// they find it taken already).
    fn follow_status(&mut self, wr: &WasmReconciler) {
        let decided = Decided::of(wr);
        if decided.differs(&self.decided) {
            let _ = self.decisions.unbounded_send(decided.clone());
        }
        self.decided = decided;
    }
}

type Updates = futures::channel::mpsc::UnboundedSender<WasmReconciler>;
type UpdatesRx = futures::channel::mpsc::UnboundedReceiver<WasmReconciler>;
/// Decisions handed to a supervisor (see [`Supervised::follow_status`]).
type DecisionsRx = futures::channel::mpsc::UnboundedReceiver<Decided>;

/// Whether `new` differs from `old` only in its OCI module reference, so that the running
/// supervisor can swap the module instead of restarting.
fn only_oci_module_changed(old: &WasmReconciler, new: &WasmReconciler) -> bool {
    if old.spec.module.oci.is_none() || new.spec.module.oci.is_none() {
        return false;
    }
    let mut same = new.spec.clone();
    same.module = old.spec.module.clone();
    same == old.spec
}

impl Supervised {
    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = self.task.await;
    }
}

/// The supervised reconcilers, by WasmReconciler name, and the releases of deleted ones.
struct Reconcilers {
    ctx: Arc<HostContext>,
    running: HashMap<String, Supervised>,
    releasing: HashMap<String, tokio::task::JoinHandle<()>>,
    /// The names listed since the watch (re)started its initial list, until it is done.
    seen_in_init: Option<Vec<String>>,
}

/// Runs until `shutdown` resolves, then stops every controller gracefully (running reconciles
/// finish).
///
/// # Errors
/// [`ManagerError`] if the WasmReconciler watch cannot run.
pub async fn run(
    ctx: Arc<HostContext>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ManagerError> {
    let api: Api<WasmReconciler> = Api::all(ctx.client.clone());
    let wc = match &ctx.selector {
        Some(s) => watcher::Config::default().labels(s),
        None => watcher::Config::default(),
    };
    let mut events = watcher(api, wc).default_backoff().boxed();
    let mut reconcilers = Reconcilers {
        ctx,
        running: HashMap::new(),
        releasing: HashMap::new(),
        seen_in_init: None,
    };
    readiness::global().pending("manager");
    // Metacontroller's Composite- and DecoratorControllers become WasmReconcilers that this
    // loop serves.
    let (compose_stop, stopped) = tokio::sync::watch::channel(false);
    let compose = tokio::spawn(crate::metacontroller::compose::run_all(
        reconcilers.ctx.client.clone(),
        reconcilers.ctx.discovery.clone(),
        reconcilers.ctx.selector.clone(),
        stopped,
    ));
    tokio::pin!(shutdown);
    loop {
        let event = tokio::select! {
            _ = &mut shutdown => break,
            e = events.try_next() => e,
        };
        match event {
            Ok(Some(e)) => reconcilers.handle(e).await,
            Ok(None) => break,
            Err(e) => tracing::warn!(error = %e, "watching WasmReconcilers"),
        }
    }
    let _ = compose_stop.send(true);
    let _ = compose.await;
    reconcilers.stop_all().await;
    readiness::global().forget("manager");
    Ok(())
}

impl Reconcilers {
    async fn handle(&mut self, event: watcher::Event<WasmReconciler>) {
        self.releasing.retain(|_, task| !task.is_finished());
        match event {
            watcher::Event::Init => self.seen_in_init = Some(Vec::new()),
            watcher::Event::InitApply(wr) | watcher::Event::Apply(wr) => {
                if let Some(seen) = &mut self.seen_in_init {
                    seen.push(wr.name_any());
                }
                if wr.metadata.deletion_timestamp.is_some() {
                    self.deleting(&wr);
                    restart_losers_to(&self.ctx, &mut self.running, &wr).await;
                } else {
                    self.applied(wr).await;
                }
            }
            watcher::Event::InitDone => self.init_done().await,
            watcher::Event::Delete(wr) => {
                if let Some(s) = self.running.remove(&wr.name_any()) {
                    tracing::info!(reconciler = %wr.name_any(), "WasmReconciler deleted; stopping its controller");
                    s.stop().await;
                }
                restart_losers_to(&self.ctx, &mut self.running, &wr).await;
            }
        }
    }

    /// `wr` is being deleted: its primaries are released (once) by a task of their own.
    fn deleting(&mut self, wr: &WasmReconciler) {
        let name = wr.name_any();
        if let Entry::Vacant(slot) = self.releasing.entry(name.clone()) {
            tracing::info!(reconciler = %name, "WasmReconciler deleted; releasing its primaries");
            let stop = self.running.remove(&name).map(|s| s.stop().boxed());
            slot.insert(tokio::spawn(release_deleted(
                self.ctx.clone(),
                wr.clone(),
                stop,
            )));
        }
    }

    /// `wr` was added or changed: started, handed a new OCI module, or restarted.
    async fn applied(&mut self, wr: WasmReconciler) {
        let name = wr.name_any();
        ensure_finalizer(&self.ctx, &wr).await;
        if let Some(s) = self.running.get_mut(&name) {
            s.follow_status(&wr);
        }
        let generation = wr.metadata.generation;
        if self
            .running
            .get(&name)
            .is_some_and(|s| s.generation == generation)
        {
            return;
        }
        if let Some(s) = self.running.get_mut(&name)
            && only_oci_module_changed(&s.wr, &wr)
            && s.updates.unbounded_send(wr.clone()).is_ok()
        {
            tracing::info!(reconciler = %name, "the WasmReconciler's OCI module changed; swapping it");
            s.wr = wr;
            s.generation = generation;
            return;
        }
        if let Some(old) = self.running.remove(&name) {
            tracing::info!(reconciler = %name, "WasmReconciler changed; restarting its controller");
            old.stop().await;
        }
        self.running
            .insert(name, spawn_supervisor(self.ctx.clone(), wr.clone()));
        restart_losers_to(&self.ctx, &mut self.running, &wr).await;
    }

    /// The initial list is done: reconcilers it did not list are gone.
    async fn init_done(&mut self) {
        readiness::global().ready("manager");
        if let Some(seen) = self.seen_in_init.take() {
            let gone: Vec<String> = self
                .running
                .keys()
                .filter(|k| !seen.contains(k))
                .cloned()
                .collect();
            for name in gone {
                if let Some(s) = self.running.remove(&name) {
                    s.stop().await;
                }
            }
        }
    }

    async fn stop_all(&mut self) {
        for (_, s) in self.running.drain() {
            s.stop().await;
        }
        // An unfinished release is redone by whichever host serves the WasmReconciler next.
        for (_, task) in self.releasing.drain() {
            task.abort();
        }
    }
}

/// Restarts the running reconcilers that overlap `changed` and come after it: whether they
/// lose to it (or no longer do) is decided again by their setup.
async fn restart_losers_to(
    ctx: &Arc<HostContext>,
    running: &mut HashMap<String, Supervised>,
    changed: &WasmReconciler,
) {
    let losers: Vec<String> = running
        .iter()
        .filter(|(name, s)| {
            **name != changed.name_any()
                && (conflict::overlaps(changed, &s.wr) || conflict::overlaps(&s.wr, changed))
                && conflict::precedes(changed, &s.wr)
        })
        .map(|(name, _)| name.clone())
        .collect();
    for name in losers {
        if let Some(s) = running.remove(&name) {
            tracing::info!(reconciler = %name, other = %changed.name_any(), "an overlapping WasmReconciler changed; restarting");
            let wr = s.wr.clone();
            s.stop().await;
            running.insert(name, spawn_supervisor(ctx.clone(), wr));
        }
    }
}

fn spawn_supervisor(ctx: Arc<HostContext>, wr: WasmReconciler) -> Supervised {
    let (tx, rx) = oneshot::channel();
    let (updates, updates_rx) = futures::channel::mpsc::unbounded();
    let (decisions, decisions_rx) = futures::channel::mpsc::unbounded();
    let decided = Decided::of(&wr);
    let shards = ctx.shards.clone();
    let generation = wr.metadata.generation;
    let name = wr.name_any();
    let component = controller::readiness_component(&name);
    readiness::global().pending(&component);
    let spawned = wr.clone();
    let slots = ctx.slots.clone();
    let task = tokio::spawn(async move {
        let mut sup = Supervisor::new(ctx, wr, decisions_rx);
        // A bug must not stop a reconciler silently: report the panic on the WasmReconciler.
        let outcome = std::panic::AssertUnwindSafe(sup.run(rx, updates_rx))
            .catch_unwind()
            .await;
        if let Err(panic) = outcome {
            // Stopped here: with sharding, its share goes to a member that serves it.
            if let Some(shards) = &shards {
                shards.serving().fails(&sup.name());
            }
            sup.panicked(&controller::panic_message(panic.as_ref()))
                .await;
        }
        readiness::global().forget(&component);
        metrics::global().module_active(&sup.name(), None);
        slots.remove(&sup.name());
    });
    tracing::info!(reconciler = %name, "supervising");
    Supervised {
        wr: spawned,
        generation,
        stop: Some(tx),
        updates,
        decisions,
        decided,
        task,
    }
}

#[cfg(test)]
mod panic_tests {
    use super::*;
    use crate::controller::panic_message;

    #[tokio::test]
    async fn a_panic_in_a_task_is_caught_with_its_message() {
        let caught = std::panic::AssertUnwindSafe(async {
            let d = crate::crd::parse_duration("1s").unwrap_or_default();
            if d == Duration::from_secs(1) {
                panic!("boom {}", 42);
            }
        })
        .catch_unwind()
        .await;
        let message = caught.err().map(|p| panic_message(p.as_ref()));
        assert_eq!(message.as_deref(), Some("boom 42"));
        let static_payload: Box<dyn std::any::Any + Send> = Box::new("static");
        assert_eq!(panic_message(static_payload.as_ref()), "static");
        let other: Box<dyn std::any::Any + Send> = Box::new(7u8);
        assert_eq!(panic_message(other.as_ref()), "a panic without a message");
    }
}
