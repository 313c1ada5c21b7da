//! One WasmReconciler's controller: watches its primary, owned and related kinds, and runs the
//! module for every primary that needs it.
//!
//! Built on kube-runtime's [`Controller`]: an informer cache per watched kind, a work queue that
//! deduplicates and never runs two reconciles of one object at once, a concurrency limit, and
//! requeues. On top of it: per-object exponential backoff (5 ms doubling to 5 min, reset on
//! success), a periodic resync, the module's requeue-after, trigger tracking, the finalizer, and
//! writes under the module's own identity.
//!
//! # Guarantees
//! - Per-object serialization: one reconcile of an object at a time (kube-runtime's runner).
//! - Level-triggered: every reconcile reads the whole current state from the caches; a missed
//!   or coalesced event only delays, never loses, work (the resync bounds the delay).
//! - A module failure, an invalid response or a failed write affects only that object: it gets a
//!   Warning Event and a backoff; other objects and other reconcilers go on.
//! - Stale writes (409) are retried on fresh state; nothing is silently dropped.
//! - No reconcile and no finalize runs before every watch (primary, owned, related) has
//!   finished its first list: a module never prunes against an empty cache. A watch that cannot
//!   list is reported through [`Health`] (the manager sets `Ready=False`, reason `WatchFailed`).
//! - Requests for primaries that do not exist (deleted, named by a child being garbage-collected
//!   or by a label mapping, out of scope) finish: the work-queue entry and the per-object state
//!   are freed ([`tracked_objects`] counts what is left).
//! - A panic of the controller (a host bug) is reported through [`Health`], never silent.
//! - At most `spec.limits.concurrency` reconciles of the reconciler run at once (its
//!   [`priority`] gate), and at most `--max-concurrent-reconciles` over the host ([`limit`]).
//! - Work that reacts to a change (first sight or change of the primary, a child or related
//!   change, a new module, a retry) runs before timed work (the module's requeue-after, the
//!   resync) whenever both wait; a timed reconcile that has waited [`priority::PROMOTE_AFTER`]
//!   is no longer passed by reactive work that arrived after it (see [`priority`]).
//! - A reconcile takes its permit before it is admitted by sharding (a range being drained
//!   never waits for queued work, only for running reconciles) and before the host-wide bound;
//!   once admitted it reads its primary again from the cache (one deleted meanwhile is
//!   forgotten). Waiting reconciles give up when the controller stops. A timed reconcile that
//!   finds every permit taken is parked (only its key is kept) and scheduled again when a
//!   permit is free for it.
//!
//! # Errors
//! [`ReconcileError`] is what one reconcile can fail with; the controller itself only stops
//! when told to.
//!
//! Its parts, in the order a primary meets them: [`streams`] (the watches and their caches),
//! [`triggers`] (which primaries a child or related change calls for), [`state`] (what is kept
//! per primary), [`reconcile`] (one reconcile, step by step), [`finalizer`] (the finalizer and
//! the deletion steps), [`call`] (request, module call, validation: the path `wasmop test`,
//! `wasmop diff` and the manager's self-check share), [`health`] (what the controller reports).
//! Below them: [`cache`] (the compact caches of owned and related kinds, and indexes),
//! [`compact`] (a primary as its store holds it), [`scope`] (the namespaces watched),
//! [`crate::manager::access`] (what the module's identity may read), [`intents`] (the checks of a
//! response), [`apply`] (the writes), [`noop`] (writes that would change nothing), [`expect`]
//! (children just created and not yet in the caches),
//! [`predicate`] (which primary changes call for a reconcile), [`resync`] (jittered resyncs),
//! [`priority`] (reactive work before timed work), [`limit`] (the host-wide bound),
//! [`crate::manager::status`], [`crate::conflict`] and [`crate::manager::release`] (one
//! reconciler per primary, and letting go).
//!
//! # Scale
//! What one reconcile costs depends on its own primary, not on the cluster: children are found
//! through an index by controller uid, related objects through an index by namespace, and a
//! related change with `AllPrimaries` enqueues only the primaries of its namespace (for a
//! namespaced primary). Cached objects carry no `managedFields` and are kept as their JSON text
//! (a `serde_json::Value` costs several times that): owned and related objects in a
//! [`cache::Cache`], primaries as [`compact::Compact`]s (metadata plus text) in the reflector
//! store kube-runtime's `Controller` reads. A reconcile parses only its own primary and its
//! children, and sends the module the cached texts of the children and related objects as
//! they are.
//! A converged reconciler writes
//! nothing: unchanged applies and status writes are skipped ([`noop`]), the host's own status
//! writes do not trigger reconciles (a Metacontroller hook's trigger one, which writes nothing:
//! [`predicate`]), and resyncs are spread out ([`resync`]).
//! Timed requeues of thousands of slow primaries cannot starve primaries that were just created
//! or changed: the [`priority`] gate parks timed work while every permit is taken (a key each)
//! and lets reactive work run first; kube-runtime's runner holds at most
//! [`priority::runner_bound`] entries (twice the concurrency). A reactive entry waiting in it
//! costs its future (its size is logged once at debug, "the future of a reconcile") plus
//! kube-runtime's request and span.

pub mod apply;
pub mod cache;
pub mod call;
pub mod compact;
pub mod emit;
pub mod expect;
pub mod finalizer;
pub mod health;
pub mod hold;
pub mod inputs;
pub mod intents;
pub mod limit;
pub mod noop;
pub mod predicate;
pub mod priority;
mod reconcile;
pub mod record;
pub mod resync;
pub mod scope;
pub mod state;
mod streams;
mod triggers;

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use kube::Client;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{Store, store::Writer};
use tracing::{Instrument, info_span};

use self::cache::{Cache, Index};
use self::compact::Compact;
use self::intents::Rejected;
use self::reconcile::{Cached, Caches, Gate, Shared};
use self::state::States;
use crate::contract::Gvk;
use crate::discovery::{Discovery, Resolved};
use crate::engine::{CallError, Limits};
use crate::modules::slot::ModuleSlot;
use crate::object::ObjectKey;
use crate::operations::metrics::{self, Queue};
use crate::operations::readiness;
use crate::sharding::hash::Key;
use crate::sharding::{Listed, Ranges};

pub use self::health::{Health, panic_message};
pub use self::state::tracked_objects;

/// Backoff after failures: 5 ms doubling to 5 minutes.
pub const BACKOFF_START: Duration = Duration::from_millis(5);
/// Backoff after failures: 5 ms doubling to 5 minutes.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The backoff before attempt `failures + 1`.
pub fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(30);
    BACKOFF_START.saturating_mul(1u32 << exp).min(BACKOFF_MAX)
}

/// Why one reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The module failed.
    #[error("{0}")]
    Module(#[from] CallError),
    /// The module's response was refused.
    #[error("{0}")]
    Rejected(#[from] Rejected),
    /// An object changed under us (409); retried on fresh state.
    #[error("conflict, retrying on fresh state: {0}")]
    Conflict(String),
    /// Writes failed.
    #[error("{0}")]
    Apply(String),
    /// The API server could not be reached or refused a host request.
    #[error("{0}")]
    Api(#[from] kube::Error),
    /// The module call task failed.
    #[error("the module call did not complete: {0}")]
    Join(String),
    /// The inputs could not fit in the module's memory: the module was not called (not its
    /// failure).
    #[error("{0}")]
    InputsTooLarge(String),
}

impl ReconcileError {
    /// Whether this failure is the module's (counted for rollback), not the cluster's or the
    /// host's (a call that found no free sandbox slot is not the module's failure).
    pub fn is_module_failure(&self) -> bool {
        match self {
            ReconcileError::Module(e) => e.is_module_fault(),
            ReconcileError::Rejected(_) => true,
            _ => false,
        }
    }
}

/// A watched kind and its API resource.
#[derive(Debug, Clone)]
pub struct Watched {
    /// The kind.
    pub kind: Gvk,
    /// Its resource.
    pub resolved: Resolved,
}

impl From<(Gvk, Resolved)> for Watched {
    fn from((kind, resolved): (Gvk, Resolved)) -> Self {
        Watched { kind, resolved }
    }
}

/// A related kind: watched with the administrator's label selector.
#[derive(Debug, Clone)]
pub struct Related {
    /// The kind and its resource.
    pub watched: Watched,
    /// The administrator's label selector (`spec.related[].selector`).
    pub selector: Option<String>,
}

impl From<(Gvk, Resolved, Option<String>)> for Related {
    fn from((kind, resolved, selector): (Gvk, Resolved, Option<String>)) -> Self {
        Related {
            watched: Watched { kind, resolved },
            selector,
        }
    }
}

/// Everything a reconciler's controller is configured with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The WasmReconciler's name.
    pub name: String,
    /// The primary kind and its resource.
    pub primary: Watched,
    /// Owned kinds (granted and requested) and their resources.
    pub owned: Vec<Watched>,
    /// Related kinds (granted) and their resources, with the administrator's label selector.
    pub related: Vec<Related>,
    /// Namespaces in scope (empty: all).
    pub namespaces: Vec<String>,
    /// Per-call limits.
    pub limits: Limits,
    /// Reconciles at once.
    pub concurrency: u16,
    /// The host's bound on reconciles at once over every reconciler (shared).
    pub reconcile_limit: limit::ReconcileLimit,
    /// Resync period.
    pub resync: Duration,
    /// Which changes of a primary call for a reconcile: outside its status, or (a Metacontroller
    /// hook with `spec.hook.syncOnStatus`) its status's too.
    pub primary_changes: predicate::Changes,
    /// How long a status in flux may be held back (`--status-debounce`; zero: never, see
    /// [`hold`]).
    pub status_debounce: Duration,
    /// The config JSON handed to the module.
    pub config: String,
    /// The impersonated user (`system:serviceaccount:<ns>:<name>`).
    pub service_account: String,
    /// Where failed requests are recorded (`--record-failures`), if anywhere.
    pub recorder: Option<Arc<record::FailureRecorder>>,
    /// With `--shards auto`: the ranges this replica reconciles (None: every primary).
    pub shards: Option<Arc<crate::sharding::Shards>>,
}

impl Settings {
    /// The primary's API resource.
    fn primary_resource(&self) -> &ApiResource {
        &self.primary.resolved.resource
    }
}

/// The reconciler's connections: reads with the host's identity, writes with the module's.
#[derive(Clone)]
pub struct Clients {
    /// The host's client (watches, reads, diagnostics).
    pub host: Client,
    /// The client impersonating the module's ServiceAccount (every write of the module).
    pub module: Client,
    /// Kind resolution.
    pub discovery: Discovery,
    /// Events about the module's failures, with the host's identity.
    pub host_events: Recorder,
    /// Events the module asks for, published with the module's identity off the reconcile's
    /// path (see [`emit`]).
    pub module_events: emit::EventLane,
}

impl std::fmt::Debug for Clients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clients").finish_non_exhaustive()
    }
}

/// Handles to a running controller.
#[derive(Debug)]
pub struct Running {
    task: tokio::task::JoinHandle<()>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Running {
    /// Stops taking new work, lets running reconciles finish, and waits for the task.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.shutdown.is_some() {
            self.task.abort();
        }
    }
}

/// The readiness component of reconciler `name` (see [`crate::operations::readiness`]).
pub fn readiness_component(name: &str) -> String {
    format!("reconciler/{name}")
}

/// Starts the controller of one reconciler. `module_changed` yields whenever a new module is
/// activated, which re-reconciles every primary.
pub fn start(
    settings: Settings,
    slot: ModuleSlot,
    clients: Clients,
    health: Arc<Health>,
    module_changed: impl Stream<Item = ()> + Send + 'static,
) -> Running {
    let queue = metrics::global().queue(&settings.name);
    let states = States::new(&settings.name, health.clone(), queue.clone());
    let writer = Writer::new(settings.primary_resource().clone());
    let primaries = writer.as_reader();
    // Primaries by namespace: a related change with `AllPrimaries` enqueues only its namespace's.
    let by_namespace = Index::new(cache::namespace);
    // With sharding, a primary is reconciled once every watch has listed its range, and a
    // range change reconciles only the primaries gained.
    let (listed, gained) = settings.shards.as_ref().map(|_| Listed::new()).unzip();
    if let (Some(shards), Some(listed)) = (&settings.shards, &listed) {
        shards.follow(listed);
    }
    let watches = streams::Watches {
        client: &clients.host,
        settings: &settings,
        health: &health,
        listed: listed.clone(),
    };
    let primary_stream = watches.primaries(streams::Primaries {
        writer,
        by_namespace: by_namespace.clone(),
        states: states.clone(),
    });
    let reconcile_all = requested_all(module_changed, &primaries, &states);
    let controller = controller_for(primary_stream, &primaries, &settings, reconcile_all);
    let gained = gained_primaries(gained, &primaries, &states, &settings);
    let (priority, controller) = with_priority_gate(controller, &settings, &queue, gained);
    let related = triggers::Related {
        resource: settings.primary_resource().clone(),
        namespaced: settings.primary.resolved.namespaced,
        kind: settings.primary.kind.clone(),
        primaries: primaries.clone(),
        by_namespace,
        slot: slot.clone(),
        states: states.clone(),
    };
    let wired = Wired::all(controller, &watches, &states, &related);
    let caches = wired.caches();
    let (controller, owned, related) = (wired.controller, wired.owned, wired.related);
    // Reconciles (and finalizes) wait until every cache has its first full list: a module that
    // saw an empty cache would prune children or let a primary go that it should keep.
    let (gate, synced) = tokio::sync::watch::channel(Gate::Waiting);
    let gate = Arc::new(gate);
    let name = settings.name.clone();
    let waiting = wait_for_caches(&name, primaries.clone(), caches, gate.clone());
    let cache_kinds = cache_kinds(&settings);
    let caches = Caches {
        owned,
        related,
        primaries,
        synced,
        listed,
    };
    let shared = Arc::new(Shared::new(
        settings, slot, &clients, states, caches, priority,
    ));
    let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
    let run = Run {
        controller,
        shared,
        health,
        queue,
        gate,
        waiting,
        cache_kinds,
    };
    let task = tokio::spawn(
        run.run(stop)
            .instrument(info_span!("controller", reconciler = %name)),
    );
    Running {
        task,
        shutdown: Some(shutdown),
    }
}

/// kube-runtime's controller of the primaries `stream` (cached in `primaries`), reconciling
/// every primary when `reconcile_all` yields.
fn controller_for(
    stream: impl Stream<Item = Result<Compact, kube::runtime::watcher::Error>> + Send + 'static,
    primaries: &Store<Compact>,
    settings: &Settings,
    reconcile_all: impl Stream<Item = ()> + Send + 'static,
) -> Controller<Compact> {
    let resource = settings.primary_resource().clone();
    // The priority gate in `reconcile` bounds how many run at once, reactive work first; the
    // runner hands over more, so reactive entries reach the gate.
    let config =
        ControllerConfig::default().concurrency(priority::runner_bound(settings.concurrency));
    Controller::for_stream_with(stream, primaries.clone(), resource)
        .with_config(config)
        .reconcile_all_on(reconcile_all)
}

/// `changed` (a new module), every primary counted as requested: it reconciles every primary.
fn requested_all(
    changed: impl Stream<Item = ()> + Send + 'static,
    primaries: &Store<Compact>,
    states: &States,
) -> impl Stream<Item = ()> + Send + 'static {
    let (primaries, states) = (primaries.clone(), states.clone());
    changed.inspect(move |()| {
        for p in primaries.state() {
            states.requested(&ObjectKey::of(&*p));
        }
    })
}

/// With sharding: the primaries in each range that every watch has newly listed (see
/// [`crate::sharding::listed`]), counted as requested; never those held all along.
fn gained_primaries(
    gained: Option<futures::channel::mpsc::UnboundedReceiver<Ranges>>,
    primaries: &Store<Compact>,
    states: &States,
    settings: &Settings,
) -> impl Stream<Item = ObjectKey> + Send + 'static {
    let (primaries, states) = (primaries.clone(), states.clone());
    let by = Key::of_primary(settings.primary.resolved.namespaced);
    futures::stream::iter(gained)
        .flatten()
        .flat_map(move |ranges| {
            let keys: Vec<ObjectKey> = primaries
                .state()
                .iter()
                .filter(|p| ranges.contains(by.hash(&***p)))
                .map(|p| ObjectKey::of(&**p))
                .collect();
            for key in &keys {
                states.requested(key);
            }
            tracing::debug!(
                primaries = keys.len(),
                "ranges listed by every watch: reconciling the primaries gained"
            );
            futures::stream::iter(keys)
        })
}

/// The reconciler's priority gate (`spec.limits.concurrency` permits, reactive work first),
/// and `controller` also fed by the timed reconciles the gate parked, when it unparks them,
/// and by the `gained` primaries.
fn with_priority_gate(
    controller: Controller<Compact>,
    settings: &Settings,
    queue: &Queue,
    gained: impl Stream<Item = ObjectKey> + Send + 'static,
) -> (priority::PriorityGate<ObjectKey>, Controller<Compact>) {
    let (unpark, unparked) = futures::channel::mpsc::unbounded::<ObjectKey>();
    let waiting = queue.clone();
    let gate = priority::PriorityGate::new(
        usize::from(settings.concurrency),
        Box::new(move |key| {
            let _ = unpark.unbounded_send(key);
        }),
        Some(Box::new(move |lanes| waiting.waiting(lanes))),
    );
    let resource = settings.primary_resource().clone();
    let unparked = futures::stream::select(unparked, gained).map(move |key: ObjectKey| {
        let o = DynamicObject::new(&key.name, &resource);
        Ok(match key.namespace {
            Some(ns) => o.within(&ns),
            None => o,
        })
    });
    let resource = settings.primary_resource().clone();
    let controller = controller.watches_stream_with(
        unparked,
        move |o: DynamicObject| Some(triggers::primary_ref(&resource, &ObjectKey::of(&o))),
        settings.primary_resource().clone(),
    );
    (gate, controller)
}

/// The controller as its owned and related watches are added to it, with their caches.
struct Wired {
    controller: Controller<Compact>,
    owned: Vec<Cached>,
    related: Vec<Cached>,
}

impl Wired {
    /// `controller` with every owned and related kind of the settings watched.
    fn all(
        controller: Controller<Compact>,
        watches: &streams::Watches<'_>,
        states: &States,
        related: &triggers::Related,
    ) -> Self {
        let mut wired = Wired {
            controller,
            owned: Vec::new(),
            related: Vec::new(),
        };
        for owned in &watches.settings.owned {
            wired = wired.owned(watches, owned, states);
        }
        for kind in &watches.settings.related {
            wired = wired.related(watches, kind, related);
        }
        wired
    }

    /// Watches `owned` children: each change triggers the primary that controls it.
    fn owned(mut self, watches: &streams::Watches<'_>, owned: &Watched, states: &States) -> Self {
        let cache = Cache::new(cache::controller_uid);
        let stream = watches.owned(owned, &cache);
        let primary = &watches.settings.primary;
        let owners = triggers::Owners {
            primary: primary.kind.clone(),
            resource: primary.resolved.resource.clone(),
            namespaced: primary.resolved.namespaced,
            kind: owned.kind.clone(),
            states: states.clone(),
        };
        self.controller = self.controller.watches_stream_with(
            stream,
            move |child| owners.map(child),
            owned.resolved.resource.clone(),
        );
        self.owned.push(Cached {
            kind: owned.kind.clone(),
            cache,
        });
        self
    }

    /// Watches the objects of `related`: each change triggers the primaries the active
    /// module maps it to (`mapping`, for this kind).
    fn related(
        mut self,
        watches: &streams::Watches<'_>,
        related: &Related,
        mapping: &triggers::Related,
    ) -> Self {
        let cache = Cache::new(cache::namespace);
        let stream = watches.related(related, &cache);
        let kind = &related.watched.kind;
        let mapping = triggers::Related {
            kind: kind.clone(),
            ..mapping.clone()
        };
        self.controller = self.controller.watches_stream_with(
            stream,
            move |other| mapping.map(other),
            related.watched.resolved.resource.clone(),
        );
        self.related.push(Cached {
            kind: kind.clone(),
            cache,
        });
        self
    }

    /// Every owned and related cache.
    fn caches(&self) -> Vec<Arc<Cache>> {
        self.owned
            .iter()
            .chain(&self.related)
            .map(|c| c.cache.clone())
            .collect()
    }
}

/// The `kind` label of every cache of the reconciler (see [`streams::cache_kind`]).
fn cache_kinds(settings: &Settings) -> Vec<String> {
    std::iter::once(&settings.primary)
        .chain(&settings.owned)
        .chain(settings.related.iter().map(|r| &r.watched))
        .map(|w| streams::cache_kind(&w.kind))
        .collect()
}

/// Opens `gate` (and reports the reconciler ready) once the primaries' store and every
/// cache have their first full list (the controller's own watches start when it runs).
fn wait_for_caches(
    name: &str,
    primaries: Store<Compact>,
    caches: Vec<Arc<Cache>>,
    gate: Arc<tokio::sync::watch::Sender<Gate>>,
) -> tokio::task::JoinHandle<()> {
    let component = readiness_component(name);
    tokio::spawn(async move {
        // A store's readiness wakes only one waiter (kube-runtime's DelayedInit keeps one
        // waker), and the controller waits on the primary store too: poll instead.
        loop {
            match tokio::time::timeout(Duration::from_millis(100), primaries.wait_until_ready())
                .await
            {
                Ok(Ok(())) => break,
                Ok(Err(_)) => return,
                Err(_) => {}
            }
        }
        for cache in caches {
            cache.ready().await;
        }
        tracing::info!(component, "caches synced");
        gate.send_if_modified(|g| {
            let waiting = *g == Gate::Waiting;
            if waiting {
                *g = Gate::Synced;
            }
            waiting
        });
        readiness::global().ready(&component);
    })
}

/// The running controller's task and what it cleans up when it ends.
struct Run {
    controller: Controller<Compact>,
    shared: Arc<Shared>,
    health: Arc<Health>,
    queue: Queue,
    gate: Arc<tokio::sync::watch::Sender<Gate>>,
    /// The task that opens the gate once the caches are synced.
    waiting: tokio::task::JoinHandle<()>,
    cache_kinds: Vec<String>,
}

impl Run {
    /// Runs the controller until `stop`, then cleans up; a panic is reported through
    /// [`Health`].
    async fn run(self, stop: tokio::sync::oneshot::Receiver<()>) {
        let Run {
            controller,
            shared,
            health,
            queue,
            gate,
            waiting,
            cache_kinds,
        } = self;
        let reconciler = shared.settings.name.clone();
        let stopped = shared.clone();
        let run = controller
            .graceful_shutdown_on(async move {
                let _ = stop.await;
                // Reconciles still waiting for the caches must not hold the shutdown.
                gate.send_replace(Gate::Stopping);
            })
            .run(
                reconcile::sized(reconcile::reconcile),
                reconcile::error_policy,
                shared.clone(),
            )
            .for_each(move |result| {
                let shared = shared.clone();
                async move {
                    match result {
                        // A request for a primary that does not exist (deleted, or named by
                        // a child or a label mapping): the request is done.
                        Err(kube::runtime::controller::Error::ObjectNotFound(r)) => {
                            shared.forget(&ObjectKey::new(r.namespace.clone(), r.name.clone()));
                        }
                        Err(e) => tracing::debug!(error = %e, "controller event"),
                        Ok(_) => {}
                    }
                }
            });
        // A bug must not stop reconciling silently: the manager reports it.
        if let Err(panic) = std::panic::AssertUnwindSafe(run).catch_unwind().await {
            let message = panic_message(panic.as_ref());
            tracing::error!(error = %message, "the controller panicked");
            health.report_crash(message);
        }
        waiting.abort();
        // The module's Events still queued are published before the controller is gone.
        stopped.applier.close().await;
        queue.clear();
        for kind in &cache_kinds {
            metrics::global().forget_cache_objects(&reconciler, kind);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_5ms_to_5min() {
        assert_eq!(backoff(1), Duration::from_millis(5));
        assert_eq!(backoff(2), Duration::from_millis(10));
        assert_eq!(backoff(5), Duration::from_millis(80));
        assert_eq!(backoff(17), Duration::from_secs(300));
        assert_eq!(backoff(1000), Duration::from_secs(300));
    }
}
