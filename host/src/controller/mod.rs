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
//! Its parts: [`watches`] (the caches and what they report), [`cache`] (the compact caches of
//! owned and related kinds, and indexes), [`compact`] (a primary as its store holds it),
//! [`crate::manager::access`] (what the module's identity may read), [`intents`] (the checks of a
//! response), [`apply`] (the writes), [`noop`] (writes that would change nothing),
//! [`predicate`] (which primary changes call for a reconcile), [`resync`] (jittered resyncs),
//! [`priority`] (reactive work before timed work), [`limit`] (the host-wide bound),
//! [`crate::manager::status`], [`crate::manager::conflict`] and [`crate::manager::release`] (one
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
//! writes do not trigger reconciles ([`predicate`]), and resyncs are spread out ([`resync`]).
//! Timed requeues of thousands of slow primaries cannot starve primaries that were just created
//! or changed: the [`priority`] gate parks timed work while every permit is taken (a key each)
//! and lets reactive work run first; kube-runtime's runner holds at most
//! [`priority::runner_bound`] entries (twice the concurrency). A reactive entry waiting in it
//! costs its future (its size is logged once at debug, "the future of a reconcile") plus
//! kube-runtime's request and span.

pub mod apply;
pub mod cache;
pub mod compact;
pub mod intents;
pub mod limit;
pub mod noop;
pub mod predicate;
pub mod priority;
pub mod record;
pub mod resync;
pub mod scope;
pub mod watches;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{FutureExt, StreamExt};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Recorder};
use kube::runtime::reflector::{ObjectRef as KubeRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, utils::PredicateConfig, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::field::Empty;
use tracing::{Instrument, info_span};

use self::apply::{Applier, FailureKind, Observed, object_reference};
use self::cache::{Cache, Index};
use self::compact::Compact;
use self::intents::{Grant, Primary, RECONCILER_LABEL, Rejected};
use self::watches::WatchErrors;
use crate::contract::{
    Context, Gvk, KindObjects, Mapping, ObjectRef, ReconcileRequest, RelatedKind, Trigger,
};
use crate::crd::{finalizer_for, is_finalizer_of};
use crate::discovery::{Discovery, Resolved};
use crate::engine::{CallError, Limits};
use crate::modules::slot::ModuleSlot;
use crate::operations::metrics::{self, Queue};
use crate::operations::readiness;

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

/// Everything a reconciler's controller is configured with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The WasmReconciler's name.
    pub name: String,
    /// The primary kind and its resource.
    pub primary: (Gvk, Resolved),
    /// Owned kinds (granted and requested) and their resources.
    pub owned: Vec<(Gvk, Resolved)>,
    /// Related kinds (granted) and their resources, with the administrator's label selector.
    pub related: Vec<(Gvk, Resolved, Option<String>)>,
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
    /// The config JSON handed to the module.
    pub config: String,
    /// The impersonated user (`system:serviceaccount:<ns>:<name>`).
    pub service_account: String,
    /// Where failed requests are recorded (`--record-failures`), if anywhere.
    pub recorder: Option<Arc<record::FailureRecorder>>,
    /// With `--shards auto`: the ranges this replica reconciles (None: every primary).
    pub shards: Option<Arc<crate::sharding::Shards>>,
}

#[derive(Debug, Default)]
struct ObjectState {
    failures: u32,
    last_rv: Option<String>,
    last_module: Option<String>,
    pending: Option<Trigger>,
    scheduled: Option<(Instant, Trigger)>,
    /// What this reconciler's field manager last applied for the primary (see [`noop`]).
    applied: noop::Applied,
}

/// What the controller tells the manager (for the WasmReconciler's status).
#[derive(Debug, Default)]
pub struct Health {
    /// Objects whose last reconcile hit a Forbidden write, with the message.
    pub forbidden: Mutex<BTreeMap<String, String>>,
    /// Watched kinds that cannot list or watch, with the API's error.
    pub watches: WatchErrors,
    /// The controller panicked (a host bug), with the panic's message.
    pub crashed: Mutex<Option<String>>,
    /// Bumped whenever `forbidden`, `watches` or `crashed` changes.
    pub changed: tokio::sync::Notify,
}

/// The message of a panic's payload (a `&str` or `String` for `panic!` and `.expect`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

impl Health {
    /// Records what a watcher of `kind` delivered and tells the manager when that changes the
    /// failing watches.
    fn watched<K>(&self, kind: &Gvk, event: &Result<watcher::Event<K>, watcher::Error>) {
        if let Err(e) = event {
            tracing::debug!(kind = %kind.kind, error = %e, "watch failed; retrying");
        }
        if self.watches.record(kind, event) {
            self.changed.notify_one();
        }
    }
}

/// The state shared by all reconciles of one reconciler.
pub struct Shared {
    settings: Settings,
    slot: ModuleSlot,
    applier: Applier,
    host_events: Recorder,
    impersonated: Client,
    discovery: Discovery,
    owned: Vec<Cached>,
    related: Vec<Cached>,
    objects: Arc<Mutex<HashMap<Key, ObjectState>>>,
    health: Arc<Health>,
    queue: Queue,
    primaries: Store<Compact>,
    synced: tokio::sync::watch::Receiver<Gate>,
    /// `spec.limits.concurrency` permits, reactive work first (see [`priority`]).
    priority: priority::PriorityGate<Key>,
}

/// Whether reconciles may run: they wait while `Waiting`, and give up when `Stopping`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Some cache has not finished its first list yet.
    Waiting,
    /// Every cache has its first list.
    Synced,
    /// The controller is stopping: waiting reconciles return.
    Stopping,
}

/// An object's key: namespace (None for cluster-scoped) and name.
type Key = (Option<String>, String);

/// One owned or related kind's compact cache (children grouped by controller uid, related
/// objects by namespace).
struct Cached {
    kind: Gvk,
    cache: Arc<Cache>,
}

/// Keeps `wasmop_cache_objects{reconciler,kind}` at `len()`, the size of the cache the watch
/// events passed to the returned closure were just recorded in.
fn cached<K>(
    reconciler: &str,
    kind: &Gvk,
    len: impl Fn() -> usize + Send + 'static,
) -> impl Fn(&Result<watcher::Event<K>, watcher::Error>) + Send + 'static {
    let (reconciler, kind) = (reconciler.to_string(), cache_kind(kind));
    move |event| {
        if matches!(
            event,
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)
        ) {
            metrics::global().cache_objects(&reconciler, &kind, len());
        }
    }
}

/// Follows the watch events passed to the returned closure in `cache`.
fn record_in(
    cache: &Arc<Cache>,
) -> impl Fn(&Result<watcher::Event<DynamicObject>, watcher::Error>) + Send + 'static {
    let cache = cache.clone();
    move |event| {
        if let Ok(e) = event {
            cache.record(e);
        }
    }
}

/// The `kind` label of `wasmop_cache_objects`: `apiVersion/kind`.
fn cache_kind(kind: &Gvk) -> String {
    format!("{}/{}", kind.api_version, kind.kind)
}

/// Drops from a cached object what the host never reads: `managedFields` (often several
/// times the size of the rest).
fn strip(o: &mut DynamicObject) {
    o.metadata.managed_fields = None;
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("reconciler", &self.settings.name)
            .finish()
    }
}

fn key_of<K: kube::Resource>(o: &K) -> Key {
    (o.namespace(), o.name_any())
}

/// The primaries' watch event `item` with its objects in their [`Compact`] form (an object that
/// does not serialize is logged and its event dropped; it never happens to one read from JSON).
fn compact_event(
    item: Result<watcher::Event<DynamicObject>, watcher::Error>,
) -> Option<Result<watcher::Event<Compact>, watcher::Error>> {
    let compact = |o: DynamicObject| match Compact::new(&o) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(object = %key_text(&key_of(&o)), error = %e, "cannot cache a primary: it does not serialize");
            None
        }
    };
    Some(item.map(|e| {
        Some(match e {
            watcher::Event::Init => watcher::Event::Init,
            watcher::Event::InitDone => watcher::Event::InitDone,
            watcher::Event::InitApply(o) => watcher::Event::InitApply(compact(o)?),
            watcher::Event::Apply(o) => watcher::Event::Apply(compact(o)?),
            watcher::Event::Delete(o) => watcher::Event::Delete(compact(o)?),
        })
    }))
    .and_then(|r| r.transpose())
}

/// `ns/name` or `name`: the work-queue key of the metrics.
fn key_text(key: &Key) -> String {
    match &key.0 {
        Some(ns) => format!("{ns}/{}", key.1),
        None => key.1.clone(),
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

fn object_ref_of<K: kube::Resource>(kind: &Gvk, o: &K) -> ObjectRef {
    ObjectRef {
        api_version: kind.api_version.clone(),
        kind: kind.kind.clone(),
        namespace: o.namespace(),
        name: o.name_any(),
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

/// The readiness component of reconciler `name` (see [`crate::operations::readiness`]).
pub fn readiness_component(name: &str) -> String {
    format!("reconciler/{name}")
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.shutdown.is_some() {
            self.task.abort();
        }
    }
}

fn api_for(client: &Client, resolved: &Resolved, namespaces: &[String]) -> Api<DynamicObject> {
    match (resolved.namespaced, namespaces) {
        (true, [only]) => Api::namespaced_with(client.clone(), only, &resolved.resource),
        _ => Api::all_with(client.clone(), &resolved.resource),
    }
}

type WatchEvents =
    futures::stream::BoxStream<'static, Result<watcher::Event<DynamicObject>, watcher::Error>>;

/// The events of one watched kind (with the watcher's backoff): the namespaces in scope
/// ([`scope::watch`], `held` reads the cache they feed), or with
/// sharding only this replica's slice (`key`: what the kind's objects shard by; None: not
/// sharded). A sharded watch of two or more namespaces is one cluster-wide watch.
fn watch_events(
    client: &Client,
    (kind, resolved): (&Gvk, &Resolved),
    namespaces: &[String],
    (config, held): (watcher::Config, scope::Held),
    sharding: Option<(&Arc<crate::sharding::Shards>, crate::sharding::hash::Key)>,
) -> WatchEvents {
    let Some((shards, key)) = sharding else {
        return scope::watch(client, resolved, namespaces, config, held);
    };
    let (r, ns) = (resolved.clone(), namespaces.to_vec());
    crate::sharding::watch::watch(crate::sharding::watch::Sharded {
        client: client.clone(),
        make_api: Arc::new(move |c: Client| api_for(&c, &r, &ns)),
        config,
        key,
        shards: shards.clone(),
        kind: format!("{}/{}", kind.api_version, kind.kind),
    })
    .default_backoff()
    .boxed()
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
    /// Events the module asks for, with the module's identity.
    pub module_events: Recorder,
}

impl std::fmt::Debug for Clients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clients").finish_non_exhaustive()
    }
}

fn reference<K: kube::Resource<DynamicType = kube::api::ApiResource>>(
    ar: &kube::api::ApiResource,
    namespace: Option<String>,
    name: &str,
) -> KubeRef<K> {
    let r = KubeRef::new_with(name, ar.clone());
    match namespace {
        Some(ns) => r.within(&ns),
        None => r,
    }
}

fn note_trigger(objects: &Mutex<HashMap<Key, ObjectState>>, key: Key, trigger: Trigger) {
    if let Ok(mut objects) = objects.lock() {
        objects
            .entry(key)
            .or_default()
            .pending
            .get_or_insert(trigger);
    }
}

/// Frees everything the host keeps per primary `key`: its state, its pending work-queue entry
/// and its Forbidden report.
fn forget_key(
    objects: &Mutex<HashMap<Key, ObjectState>>,
    health: &Health,
    queue: &Queue,
    key: &Key,
) {
    if let Ok(mut objects) = objects.lock() {
        objects.remove(key);
    }
    queue.started(&key_text(key));
    let changed = health
        .forbidden
        .lock()
        .is_ok_and(|mut f| f.remove(&key_text(key)).is_some());
    if changed {
        health.changed.notify_one();
    }
}

/// Frees the state of primaries that are gone: deleted ones, and after a (re)list, every one
/// the list no longer holds (deleted while the watch was down).
fn forget_gone(
    event: &Result<watcher::Event<Compact>, watcher::Error>,
    objects: &Mutex<HashMap<Key, ObjectState>>,
    primaries: &Store<Compact>,
    health: &Health,
    queue: &Queue,
) {
    match event {
        Ok(watcher::Event::Delete(o)) => forget_key(objects, health, queue, &key_of(o)),
        Ok(watcher::Event::InitDone) => {
            let present: std::collections::HashSet<Key> =
                primaries.state().iter().map(|p| key_of(&**p)).collect();
            let gone: Vec<Key> = objects
                .lock()
                .map(|m| {
                    m.keys()
                        .filter(|k| !present.contains(*k))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            for key in gone {
                forget_key(objects, health, queue, &key);
            }
        }
        _ => {}
    }
}

/// The per-object state of every running controller, by reconciler name (see
/// [`tracked_objects`]).
type Tracked = Mutex<HashMap<String, std::sync::Weak<Mutex<HashMap<Key, ObjectState>>>>>;

fn tracked() -> &'static Tracked {
    static TRACKED: std::sync::OnceLock<Tracked> = std::sync::OnceLock::new();
    TRACKED.get_or_init(Tracked::default)
}

/// How many primaries reconciler `name`'s running controller keeps state for (None when it
/// is not running). For diagnostics and tests: it returns to 0 once every primary is gone.
pub fn tracked_objects(name: &str) -> Option<usize> {
    let map = tracked().lock().ok()?;
    let objects = map.get(name)?.upgrade()?;
    let n = objects.lock().ok()?.len();
    Some(n)
}

/// Starts the controller of one reconciler. `module_changed` yields whenever a new module is
/// activated, which re-reconciles every primary.
pub fn start(
    settings: Settings,
    slot: ModuleSlot,
    clients: Clients,
    health: Arc<Health>,
    module_changed: impl futures::Stream<Item = ()> + Send + 'static,
) -> Running {
    let client = clients.host.clone();
    let (primary_kind, primary_resolved) = settings.primary.clone();
    let primary_ar = primary_resolved.resource.clone();
    let namespaced = primary_resolved.namespaced;
    let shards = settings.shards.clone();
    let by =
        |key: fn(bool) -> crate::sharding::hash::Key| shards.as_ref().map(|s| (s, key(namespaced)));
    let queue = metrics::global().queue(&settings.name);
    // What Controller::new_with builds, with the triggers counted for the queue metrics.
    let objects: Arc<Mutex<HashMap<Key, ObjectState>>> = Arc::default();
    if let Ok(mut t) = tracked().lock() {
        t.retain(|_, w| w.strong_count() > 0);
        t.insert(settings.name.clone(), Arc::downgrade(&objects));
    }
    let primary_writer = Writer::new(primary_ar.clone());
    let primaries = primary_writer.as_reader();
    let (q, h, k) = (queue.clone(), health.clone(), primary_kind.clone());
    let (o, all, q2, h2) = (
        objects.clone(),
        primaries.clone(),
        queue.clone(),
        health.clone(),
    );
    // Primaries by namespace: a related change with `AllPrimaries` enqueues only its namespace's.
    let primary_index = Index::new(cache::namespace);
    let pi = primary_index.clone();
    // With sharding, every relist (the active ranges changed) reconciles the primaries listed:
    // those gained may have been seen before, so the predicate below would drop them.
    let (relisted_tx, relisted_rx) = futures::channel::mpsc::unbounded::<()>();
    let (sharded, owned_store, wr_name) =
        (shards.is_some(), primaries.clone(), settings.name.clone());
    let primary_stream = watch_events(
        &client,
        (&primary_kind, &primary_resolved),
        &settings.namespaces,
        (
            watcher::Config::default(),
            scope::held_in_store(primaries.clone(), |c: &Compact| c.object().ok()),
        ),
        by(crate::sharding::hash::Key::of_primary),
    )
    .modify(strip)
    .inspect(move |e| h.watched(&k, e))
    .inspect(move |e| {
        if let Ok(e) = e {
            pi.record(e);
        }
    })
    .filter_map(|item| std::future::ready(compact_event(item)))
    .reflect(primary_writer)
    .inspect(cached(&settings.name, &primary_kind, {
        let p = primaries.clone();
        move || p.len()
    }))
    .inspect(move |e| {
        if sharded && let Ok(e) = e {
            if matches!(e, watcher::Event::InitDone) {
                let _ = relisted_tx.unbounded_send(());
            }
            metrics::global()
                .shards()
                .primaries(&wr_name, owned_store.len());
        }
    })
    .inspect(move |e| forget_gone(e, &o, &all, &h2, &q2))
    .applied_objects()
    // The host's own status writes (and anyone's status-only changes) call for no reconcile.
    .predicate_filter(|c: &Compact| c.outside_status(), PredicateConfig::default())
    .inspect(move |o| {
        if let Ok(o) = o {
            q.requested(key_text(&key_of(o)));
        }
    });
    let (q, all) = (queue.clone(), primaries.clone());
    let module_changed = futures::stream::select(module_changed, relisted_rx).inspect(move |()| {
        for p in all.state() {
            q.requested(key_text(&key_of(&*p)));
        }
    });
    let mut controller =
        Controller::for_stream_with(primary_stream, primaries.clone(), primary_ar.clone())
            // The priority gate in `reconcile` bounds how many run at once, reactive work first;
            // the runner hands over more, so reactive entries reach the gate.
            .with_config(
                ControllerConfig::default()
                    .concurrency(priority::runner_bound(settings.concurrency)),
            )
            .reconcile_all_on(module_changed);
    // Timed reconciles parked by the priority gate come back through this stream.
    let (unpark_tx, unparked) = futures::channel::mpsc::unbounded::<Key>();
    let waiting = queue.clone();
    let priority = priority::PriorityGate::new(
        usize::from(settings.concurrency),
        Box::new(move |key| {
            let _ = unpark_tx.unbounded_send(key);
        }),
        Some(Box::new(move |lanes| waiting.waiting(lanes))),
    );
    let ar = primary_ar.clone();
    let unparked = unparked.map(move |(ns, name): Key| {
        let o = DynamicObject::new(&name, &ar);
        Ok(match ns {
            Some(ns) => o.within(&ns),
            None => o,
        })
    });
    let ar = primary_ar.clone();
    controller = controller.watches_stream_with(
        unparked,
        move |o: DynamicObject| Some(reference(&ar, o.namespace(), &o.name_any())),
        primary_ar.clone(),
    );
    let mut caches: Vec<Arc<Cache>> = Vec::new();
    let label = format!("{RECONCILER_LABEL}={}", settings.name);

    let mut owned = Vec::new();
    for (kind, resolved) in &settings.owned {
        let cache = Cache::new(cache::controller_uid);
        let (h, k, c) = (health.clone(), kind.clone(), cache.clone());
        let stream = watch_events(
            &client,
            (kind, resolved),
            &settings.namespaces,
            (
                watcher::Config::default().labels(&label),
                scope::held_in_cache(cache.clone()),
            ),
            by(crate::sharding::hash::Key::of_children),
        )
        .modify(strip)
        .inspect(move |e| h.watched(&k, e))
        .inspect(record_in(&cache))
        .inspect(cached(&settings.name, kind, move || c.len()))
        .touched_objects();
        let (primary_kind, primary_ar, objects, child_kind, q) = (
            primary_kind.clone(),
            primary_ar.clone(),
            objects.clone(),
            kind.clone(),
            queue.clone(),
        );
        controller = controller.watches_stream_with(
            stream,
            move |child: DynamicObject| {
                let owner = child.metadata.owner_references.iter().flatten().find(|o| {
                    o.controller == Some(true)
                        && o.kind == primary_kind.kind
                        && o.api_version == primary_kind.api_version
                })?;
                let ns = child.namespace().filter(|_| namespaced);
                let key = (ns.clone(), owner.name.clone());
                q.requested(key_text(&key));
                note_trigger(
                    &objects,
                    key,
                    Trigger::ChildChanged(object_ref_of(&child_kind, &child)),
                );
                Some(reference(&primary_ar, ns, &owner.name))
            },
            resolved.resource.clone(),
        );
        caches.push(cache.clone());
        owned.push(Cached {
            kind: kind.clone(),
            cache,
        });
    }

    let mut related = Vec::new();
    for (kind, resolved, selector) in &settings.related {
        // Related objects of a namespaced primary are looked up in the primary's namespace (see
        // the mappings), so a reconciler scoped to one namespace watches them only there: the
        // host then needs read rights in that namespace, not cluster-wide.
        let in_scope: &[String] = if primary_resolved.namespaced {
            &settings.namespaces
        } else {
            &[]
        };
        let wc = match selector {
            Some(s) if !s.is_empty() => watcher::Config::default().labels(s),
            _ => watcher::Config::default(),
        };
        let cache = Cache::new(cache::namespace);
        let (h, k, c) = (health.clone(), kind.clone(), cache.clone());
        // Related objects of a namespaced primary live in its namespace: they shard with it.
        // Those of a cluster-scoped primary may concern any primary: every replica sees them.
        let related_by = by(crate::sharding::hash::Key::of_primary).filter(|_| namespaced);
        let stream = watch_events(
            &client,
            (kind, resolved),
            in_scope,
            (wc, scope::held_in_cache(cache.clone())),
            related_by,
        )
        .modify(strip)
        .inspect(move |e| h.watched(&k, e))
        .inspect(record_in(&cache))
        .inspect(cached(&settings.name, kind, move || c.len()))
        .touched_objects();
        let (primary_ar, objects, kind2, primaries, slot, q, primary_index) = (
            primary_ar.clone(),
            objects.clone(),
            kind.clone(),
            primaries.clone(),
            slot.clone(),
            queue.clone(),
            primary_index.clone(),
        );
        controller = controller.watches_stream_with(
            stream,
            move |other: DynamicObject| {
                // The active module's selectors and mappings decide which primaries care.
                let active = slot.active();
                let labels = other.labels().clone();
                let mut targets: Vec<Key> = Vec::new();
                for rk in active
                    .fit
                    .related
                    .iter()
                    .filter(|r| r.kind == kind2 && r.selector.matches(&labels))
                {
                    match &rk.maps_to {
                        // A namespaced primary sees related objects of its own namespace only.
                        Mapping::AllPrimaries if namespaced => targets
                            .extend(primary_index.keys(&other.namespace().unwrap_or_default())),
                        Mapping::AllPrimaries => {
                            targets.extend(primaries.state().iter().map(|p| key_of(&**p)))
                        }
                        Mapping::PrimaryNamedByLabel(l) => {
                            if let Some(n) = labels.get(l) {
                                targets.push((other.namespace().filter(|_| namespaced), n.clone()));
                            }
                        }
                        Mapping::SameName => targets
                            .push((other.namespace().filter(|_| namespaced), other.name_any())),
                    }
                }
                targets.sort();
                targets.dedup();
                let trigger = Trigger::RelatedChanged(object_ref_of(&kind2, &other));
                targets
                    .into_iter()
                    .map(|(ns, name)| {
                        q.requested(key_text(&(ns.clone(), name.clone())));
                        note_trigger(&objects, (ns.clone(), name.clone()), trigger.clone());
                        reference(&primary_ar, ns, &name)
                    })
                    .collect::<Vec<_>>()
            },
            resolved.resource.clone(),
        );
        caches.push(cache.clone());
        related.push(Cached {
            kind: kind.clone(),
            cache,
        });
    }

    let applier = Applier::new(
        clients.module.clone(),
        clients.host.clone(),
        &settings.name,
        clients.discovery.clone(),
        clients.module_events.clone(),
    );
    let name = settings.name.clone();
    let cache_kinds: Vec<String> = std::iter::once(&settings.primary.0)
        .chain(settings.owned.iter().map(|(k, _)| k))
        .chain(settings.related.iter().map(|(k, _, _)| k))
        .map(cache_kind)
        .collect();
    // Reconciles (and finalizes) wait until every cache has its first full list: a module that
    // saw an empty cache would prune children or let a primary go that it should keep.
    let (gate_tx, synced_rx) = tokio::sync::watch::channel(Gate::Waiting);
    let gate_tx = Arc::new(gate_tx);
    let (synced_tx, stopping_tx) = (gate_tx.clone(), gate_tx);
    let shared = Arc::new(Shared {
        settings,
        slot,
        applier,
        host_events: clients.host_events.clone(),
        impersonated: clients.module.clone(),
        discovery: clients.discovery.clone(),
        owned,
        related,
        objects,
        health: health.clone(),
        queue: queue.clone(),
        primaries: primaries.clone(),
        synced: synced_rx,
        priority,
    });
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    // Ready once every cache has its first full list (the controller's own watches start
    // when the controller runs below).
    let component = readiness_component(&name);
    let primary_store = primaries.clone();
    let synced = tokio::spawn(async move {
        // A store's readiness wakes only one waiter (kube-runtime's DelayedInit keeps one
        // waker), and the controller waits on the primary store too: poll instead.
        loop {
            match tokio::time::timeout(Duration::from_millis(100), primary_store.wait_until_ready())
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
        synced_tx.send_if_modified(|g| {
            let waiting = *g == Gate::Waiting;
            if waiting {
                *g = Gate::Synced;
            }
            waiting
        });
        readiness::global().ready(&component);
    });
    let crash_report = health.clone();
    let cache_owner = name.clone();
    let task = tokio::spawn(
        async move {
            let run = controller
                .graceful_shutdown_on(async move {
                    let _ = rx.await;
                    // Reconciles still waiting for the caches must not hold the shutdown.
                    stopping_tx.send_replace(Gate::Stopping);
                })
                .run(sized(reconcile), error_policy, shared.clone())
                .for_each(|result| {
                    let shared = shared.clone();
                    async move {
                        match result {
                            // A request for a primary that does not exist (deleted, or named by
                            // a child or a label mapping): the request is done.
                            Err(kube::runtime::controller::Error::ObjectNotFound(r)) => {
                                shared.forget(&(r.namespace.clone(), r.name.clone()));
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
                if let Ok(mut c) = crash_report.crashed.lock() {
                    *c = Some(message);
                }
                crash_report.changed.notify_one();
            }
            synced.abort();
            queue.clear();
            for kind in &cache_kinds {
                metrics::global().forget_cache_objects(&cache_owner, kind);
            }
        }
        .instrument(info_span!("controller", reconciler = %name)),
    );
    Running {
        task,
        shutdown: Some(tx),
    }
}

/// Logs (once per process, at debug) the size of a reconcile's future: what every entry that
/// waits in the priority gate holds, besides kube-runtime's own wrapping.
fn sized<F>(
    reconcile: impl Fn(Arc<Compact>, Arc<Shared>) -> F,
) -> impl Fn(Arc<Compact>, Arc<Shared>) -> F {
    static LOGGED: std::sync::Once = std::sync::Once::new();
    move |primary, shared| {
        let future = reconcile(primary, shared);
        LOGGED.call_once(|| {
            tracing::debug!(
                bytes = std::mem::size_of_val(&future),
                "the future of a reconcile (held while it waits for a permit)"
            );
        });
        future
    }
}

/// The trigger of a reconcile that starts with the object's state `st`, the primary at `rv`
/// and module `module` active.
fn trigger_of(st: &ObjectState, rv: Option<&str>, module: &str) -> Trigger {
    if st.failures > 0 {
        Trigger::Retry
    } else if st.last_rv.as_deref() != rv {
        Trigger::PrimaryChanged
    } else if let Some(p) = &st.pending {
        p.clone()
    } else if st.last_module.as_deref() != Some(module) {
        Trigger::ModuleChanged
    } else if let Some((_, t)) = &st.scheduled {
        t.clone()
    } else {
        Trigger::Resync
    }
}

impl Shared {
    /// The lane a reconcile of `key` waits in: what [`Shared::begin`] would pick now, without
    /// recording anything.
    fn lane(&self, key: &Key) -> priority::Lane {
        let r = reference(&self.settings.primary.1.resource, key.0.clone(), &key.1);
        let rv = self.primaries.get(&r).and_then(|p| p.resource_version());
        let active = self.slot.active();
        let sha = active.module.sha256();
        let default = ObjectState::default();
        let Ok(objects) = self.objects.lock() else {
            return priority::Lane::Reactive;
        };
        let st = objects.get(key).unwrap_or(&default);
        priority::Lane::of(&trigger_of(st, rv.as_deref(), sha))
    }

    /// Picks the trigger and attempt number of a reconcile that starts now, and records that it
    /// started.
    fn begin(&self, key: &Key, rv: Option<&str>, module: &str) -> (Trigger, u32) {
        let Ok(mut objects) = self.objects.lock() else {
            return (Trigger::PrimaryChanged, 1);
        };
        let st = objects.entry(key.clone()).or_default();
        let attempt = st.failures + 1;
        let trigger = trigger_of(st, rv, module);
        st.pending = None;
        st.scheduled = None;
        st.last_rv = rv.map(str::to_string);
        st.last_module = Some(module.to_string());
        (trigger, attempt)
    }

    /// What this reconciler last applied for `key` (empty when nothing is remembered).
    fn applied(&self, key: &Key) -> noop::Applied {
        self.objects
            .lock()
            .ok()
            .and_then(|o| o.get(key).map(|st| st.applied.clone()))
            .unwrap_or_default()
    }

    /// Remembers what is now applied for `key` (not for a primary forgotten meanwhile).
    fn remember(&self, key: &Key, applied: noop::Applied) {
        if let Ok(mut objects) = self.objects.lock()
            && let Some(st) = objects.get_mut(key)
        {
            st.applied = applied;
        }
    }

    fn succeeded(&self, key: &Key, next: Option<(Duration, Trigger)>) {
        // `get_mut`: a primary deleted meanwhile was forgotten and stays so.
        if let Ok(mut objects) = self.objects.lock()
            && let Some(st) = objects.get_mut(key)
        {
            st.failures = 0;
            st.scheduled = next.and_then(|(d, t)| Some((Instant::now().checked_add(d)?, t)));
        }
    }

    fn failed(&self, key: &Key) -> u32 {
        match self.objects.lock() {
            Ok(mut objects) => match objects.get_mut(key) {
                Some(st) => {
                    st.failures = st.failures.saturating_add(1);
                    st.failures
                }
                // Forgotten meanwhile (deleted): a retry finds it gone.
                None => 1,
            },
            Err(_) => 1,
        }
    }

    /// Frees everything kept for `key` (see [`forget_key`]).
    fn forget(&self, key: &Key) {
        forget_key(&self.objects, &self.health, &self.queue, key);
        self.priority.forget(key);
    }

    fn set_forbidden(&self, key: &Key, message: Option<String>) {
        let name = match &key.0 {
            Some(ns) => format!("{ns}/{}", key.1),
            None => key.1.clone(),
        };
        let changed = match self.health.forbidden.lock() {
            Ok(mut f) => match message {
                Some(m) => f.insert(name, m.clone()).as_ref() != Some(&m),
                None => f.remove(&name).is_some(),
            },
            Err(_) => false,
        };
        if changed {
            self.health.changed.notify_one();
        }
    }

    /// The observed children controlled by `uid`, of every owned kind the module may own
    /// (through the index: the cost is the primary's children, not the cache's size): parsed
    /// for the host, and as the JSON text the module receives, both in a stable order.
    fn observed(&self, uid: &str, grant: &Grant) -> (Vec<Observed>, Vec<KindObjects>) {
        self.owned
            .iter()
            .filter(|c| grant.owned.contains(&c.kind))
            .map(|c| {
                let (objects, texts): (Vec<DynamicObject>, Vec<String>) = c
                    .cache
                    .group(uid)
                    .into_iter()
                    .filter_map(|(key, json)| match serde_json::from_str(&json) {
                        Ok(o) => Some((o, json.to_string())),
                        // The cache wrote this text from an object: it parses.
                        Err(e) => {
                            tracing::warn!(kind = %c.kind, object = %key_text(&key), error = %e, "a cached object does not parse");
                            None
                        }
                    })
                    .unzip();
                (
                    Observed {
                        kind: c.kind.clone(),
                        objects,
                    },
                    KindObjects {
                        kind: c.kind.clone(),
                        objects: texts,
                    },
                )
            })
            .unzip()
    }

    /// The related objects the module asked for that the primary may see (in its namespace when
    /// it is namespaced).
    fn related_of(&self, related: &[RelatedKind], namespace: Option<&str>) -> Vec<KindObjects> {
        related
            .iter()
            .map(|rk| KindObjects {
                kind: rk.kind.clone(),
                objects: self
                    .related
                    .iter()
                    .filter(|c| c.kind == rk.kind)
                    .flat_map(|c| match namespace {
                        Some(ns) => c.cache.group(ns),
                        None => c.cache.all(),
                    })
                    .filter(|(_, json)| rk.selector.matches(&cache::labels_of(json)))
                    .map(|(_, json)| json.to_string())
                    .collect(),
            })
            .collect()
    }

    async fn warn(&self, primary: &DynamicObject, reason: &str, message: String) {
        let kind = &self.settings.primary.0;
        let r = object_ref_of(kind, primary);
        let event = KubeEvent {
            type_: KubeEventType::Warning,
            reason: reason.to_string(),
            note: Some(truncate(&message, intents::MAX_EVENT_NOTE)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self
            .host_events
            .publish(&event, &object_reference(&r, primary.uid()))
            .await
        {
            tracing::warn!(error = %e, reason, "cannot record a Warning Event");
        }
    }

    async fn set_finalizer(
        &self,
        primary: &DynamicObject,
        present: bool,
    ) -> Result<DynamicObject, ReconcileError> {
        // The legacy shared finalizer is replaced by this reconciler's own.
        let mut finalizers: Vec<String> = primary.finalizers().to_vec();
        finalizers.retain(|f| !is_finalizer_of(f, &self.settings.name));
        if present {
            finalizers.push(finalizer_for(&self.settings.name));
        }
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": primary.resource_version()}});
        let api = api_for_object(&self.impersonated, &self.settings.primary.1, primary);
        api.patch(
            &primary.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| match &e {
            kube::Error::Api(s) if s.code == 409 => {
                ReconcileError::Conflict(format!("finalizer of {}", primary.name_any()))
            }
            _ => ReconcileError::Api(e),
        })
    }
}

fn api_for_object(client: &Client, resolved: &Resolved, o: &DynamicObject) -> Api<DynamicObject> {
    match (resolved.namespaced, o.namespace()) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), &ns, &resolved.resource),
        _ => Api::all_with(client.clone(), &resolved.resource),
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max.saturating_sub(3);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &s[..cut])
}

async fn reconcile(primary: Arc<Compact>, shared: Arc<Shared>) -> Result<Action, ReconcileError> {
    let key = key_of(&*primary);
    // Read again once admitted: a reconcile that waited works on the current primary.
    drop(primary);
    // No reconcile and no finalize before every watch has its first list.
    let mut gate = shared.synced.clone();
    match gate.wait_for(|g| *g != Gate::Waiting).await.map(|g| *g) {
        Ok(Gate::Synced) => {}
        // The controller is stopping.
        _ => return Ok(Action::await_change()),
    }
    if !shared.settings.namespaces.is_empty()
        && !key
            .0
            .as_ref()
            .is_some_and(|ns| shared.settings.namespaces.contains(ns))
    {
        shared.forget(&key);
        return Ok(Action::await_change());
    }
    // At most `spec.limits.concurrency` at once, work that reacts to a change first.
    let lane = shared.lane(&key);
    let permit = match shared.priority.arrive(&key, lane) {
        priority::Arrival::Run(permit) => permit,
        // Timed work while every permit is taken: the gate hands the key back later.
        priority::Arrival::Parked => return Ok(Action::await_change()),
        priority::Arrival::Wait(waiting) => tokio::select! {
            permit = waiting.permit() => permit,
            // The controller is stopping: waiting reconciles must not hold the shutdown.
            _ = gate.wait_for(|g| *g == Gate::Stopping) => return Ok(Action::await_change()),
        },
    };
    let r = reference(&shared.settings.primary.1.resource, key.0.clone(), &key.1);
    let Some(primary) = shared.primaries.get(&r) else {
        // Deleted while it waited.
        shared.forget(&key);
        return Ok(Action::await_change());
    };
    // The one primary this reconcile reads, parsed from its cached text.
    let primary = Arc::new(primary.object().map_err(|e| {
        ReconcileError::Apply(format!(
            "cannot read the cached primary {}: {e}",
            key_text(&key)
        ))
    })?);
    // Boxed: what waits above stays small (see `sized`).
    Box::pin(admitted(primary, shared, permit)).await
}

/// A reconcile that has its permit of the reconciler's priority gate (held until it returns).
async fn admitted(
    primary: Arc<DynamicObject>,
    shared: Arc<Shared>,
    _slot: priority::Permit,
) -> Result<Action, ReconcileError> {
    let key = key_of(&*primary);
    // With sharding: only primaries in this replica's active ranges, and the drain of a range
    // being released waits for this reconcile (held until it returns).
    let admitted = match &shared.settings.shards {
        None => None,
        Some(shards) => {
            let key = crate::sharding::hash::Key::of_primary(shared.settings.primary.1.namespaced);
            match shards.admit(key.hash(&primary)) {
                Some(a) => Some(a),
                None => {
                    shared.forget(&key_of(&*primary));
                    return Ok(Action::await_change());
                }
            }
        }
    };
    let started_ms = now_unix_ms();
    // The host-wide bound: held until this reconcile's writes are done.
    let _permit = shared.settings.reconcile_limit.admit().await;
    let active = shared.slot.active();
    let sha = active.module.sha256().to_string();
    let (trigger, attempt) = shared.begin(&key, primary.resource_version().as_deref(), &sha);
    // A root span: one trace per reconcile (not a child of kube-runtime's scheduling span).
    // Exported over OTLP when configured (see `crate::operations::tracing`). Counts are recorded
    // as i64: the OpenTelemetry bridge would export unsigned integers as strings.
    let span = info_span!(
        parent: None,
        "reconcile",
        reconciler = %shared.settings.name,
        kind = %shared.settings.primary.0,
        object = %match &key.0 { Some(ns) => format!("{ns}/{}", key.1), None => key.1.clone() },
        trigger = trigger.name(),
        attempt = i64::from(attempt),
        module = %&sha[..12.min(sha.len())],
        module.name = %active.module.metadata().name,
        module.sha256 = %sha,
        intents.children = Empty,
        intents.actions = Empty,
        intents.status = Empty,
        intents.events = Empty,
        apply.applied = Empty,
        apply.unchanged = Empty,
        apply.pruned = Empty,
        apply.failed = Empty,
        outcome = Empty,
        otel.status_code = Empty,
        otel.status_description = Empty,
    );
    let started = Instant::now();
    let m = metrics::global();
    shared.queue.started(&key_text(&key));
    m.active(&shared.settings.name, 1);
    let result = run_once(&primary, &shared, &active, trigger, attempt)
        .instrument(span.clone())
        .await;
    let elapsed = started.elapsed();
    if admitted.is_some() {
        // The record of which replica reconciled which primary when (read by the e2e tests).
        tracing::debug!(target: "wasmop::sharding", reconciler = %shared.settings.name, primary = %key_text(&key), started_ms, finished_ms = now_unix_ms(), "sharded reconcile");
    }
    drop(admitted);
    m.active(&shared.settings.name, -1);
    m.reconciled(&shared.settings.name, result.is_ok(), elapsed);
    if let Ok(action) = &result
        && *action != Action::await_change()
    {
        shared.queue.requeued(false);
    }
    span.record("outcome", outcome(&result));
    match &result {
        Ok(_) => span.record("otel.status_code", "OK"),
        Err(e) => span
            .record("otel.status_code", "ERROR")
            .record("otel.status_description", e.to_string().as_str()),
    };
    let _enter = span.enter();
    match &result {
        Ok(_) => tracing::debug!(elapsed_ms = elapsed.as_millis() as u64, "reconciled"),
        Err(e) => {
            tracing::warn!(elapsed_ms = elapsed.as_millis() as u64, error = %e, "reconcile failed")
        }
    }
    active.record(match &result {
        Ok(_) => true,
        Err(e) => !e.is_module_failure(),
    });
    // Deleted while it ran: nothing more will come for it.
    let r = reference(&shared.settings.primary.1.resource, key.0.clone(), &key.1);
    if shared.primaries.get(&r).is_none() {
        shared.forget(&key);
    }
    result
}

/// What a reconcile came to, for its span: `ok`, or the kind of failure.
fn outcome(result: &Result<Action, ReconcileError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(ReconcileError::Module(_)) => "module_failed",
        Err(ReconcileError::Rejected(_)) => "rejected",
        Err(ReconcileError::Conflict(_)) => "conflict",
        Err(ReconcileError::Apply(_)) => "apply_failed",
        Err(ReconcileError::Api(_)) => "api_error",
        Err(ReconcileError::Join(_)) => "call_failed",
    }
}

async fn run_once(
    primary: &Arc<DynamicObject>,
    shared: &Arc<Shared>,
    active: &crate::modules::slot::Active,
    trigger: Trigger,
    attempt: u32,
) -> Result<Action, ReconcileError> {
    let key = key_of(&**primary);
    let module = &active.module;
    let finalizes = module.metadata().finalizes;
    let own = finalizer_for(&shared.settings.name);
    let has_own = primary.finalizers().contains(&own);
    let has_finalizer = primary
        .finalizers()
        .iter()
        .any(|f| is_finalizer_of(f, &shared.settings.name));
    let deleting = primary.metadata.deletion_timestamp.is_some();
    if deleting && !has_finalizer {
        shared.forget(&key);
        return Ok(Action::await_change());
    }
    let mut current = (**primary).clone();
    // `has_own != has_finalizer`: only the legacy finalizer is there; migrate it.
    if !deleting && (finalizes != has_own || has_own != has_finalizer) {
        current = shared.set_finalizer(primary, finalizes).await?;
    }
    if deleting && !finalizes {
        shared.set_finalizer(primary, false).await?;
        shared.forget(&key);
        return Ok(Action::await_change());
    }
    let uid = current.uid().unwrap_or_default();
    let (observed, owned) = shared.observed(&uid, &active.fit.grant);
    let request = ReconcileRequest {
        primary: serde_json::to_string(&current)
            .map_err(|e| ReconcileError::Apply(format!("cannot serialize the primary: {e}")))?,
        owned,
        related: shared.related_of(
            &active.fit.related,
            if shared.settings.primary.1.namespaced {
                key.0.as_deref()
            } else {
                None
            },
        ),
        context: Context {
            reconciler: shared.settings.name.clone(),
            trigger,
            attempt,
            config: shared.settings.config.clone(),
            now_unix_ms: now_unix_ms(),
        },
    };
    let limits = shared.settings.limits;
    let recorder = shared.settings.recorder.as_deref();
    let recorded = recorder.map(|_| request.clone());
    let call_module = module.clone();
    let call_span = info_span!(
        "module.call",
        call = if deleting { "finalize" } else { "reconcile" },
        instantiate_us = Empty,
        call_us = Empty,
        memory_peak = Empty,
    );
    let outcome = tokio::task::spawn_blocking(move || {
        if deleting {
            let o = call_module.finalize(request, &limits);
            (
                o.result.map(|r| {
                    let (done, response) = r.into_response();
                    (Some(done), response)
                }),
                o.stats,
            )
        } else {
            let o = call_module.reconcile(request, &limits);
            (o.result.map(|r| (None, r)), o.stats)
        }
    })
    .instrument(call_span.clone())
    .await
    .map_err(|e| ReconcileError::Join(e.to_string()))?;
    let (result, stats) = outcome;
    call_span
        .record("instantiate_us", stats.instantiate.as_micros() as i64)
        .record("call_us", stats.call.as_micros() as i64)
        .record("memory_peak", stats.memory_peak as i64);
    drop(call_span);
    metrics::global().module_call(
        &shared.settings.name,
        if deleting { "finalize" } else { "reconcile" },
        &stats,
    );
    tracing::trace!(
        instantiate_us = stats.instantiate.as_micros() as u64,
        call_us = stats.call.as_micros() as u64,
        memory_peak = stats.memory_peak,
        "module call"
    );
    // A failed reconcile's request is recorded (when asked); the Warning names the file.
    let note_failure = |error: &str| {
        record::note(
            recorder,
            recorded.as_ref(),
            module.sha256(),
            error,
            deleting,
        )
    };
    let (done, response) = match result {
        Ok(r) => r,
        Err(e) => {
            let recorded = note_failure(&e.to_string());
            shared
                .warn(
                    primary,
                    e.reason(),
                    format!(
                        "module {} ({}): {e}{recorded}",
                        module.metadata().name,
                        &module.sha256()[..12]
                    ),
                )
                .await;
            return Err(e.into());
        }
    };
    let primary_info = Primary::from_object(&serde_json::to_value(&current).unwrap_or_default())
        .map_err(ReconcileError::Apply)?;
    let children: intents::ObservedChildren = observed
        .iter()
        .flat_map(|o| {
            o.objects
                .iter()
                .map(|x| (o.kind.clone(), x.namespace(), x.name_any()))
        })
        .collect();
    let validated = match intents::validate(
        &shared.settings.name,
        &primary_info,
        &active.fit.grant,
        &shared.discovery,
        &children,
        response,
    ) {
        Ok(v) => v,
        Err(rejected) => {
            let recorded = note_failure(&rejected.to_string());
            shared
                .warn(
                    primary,
                    "InvalidIntents",
                    format!("module {}: {rejected}{recorded}", module.metadata().name),
                )
                .await;
            return Err(rejected.into());
        }
    };
    let requeue = validated.requeue_after;
    let span = tracing::Span::current();
    span.record(
        "intents.children",
        validated
            .children
            .iter()
            .map(|set| set.objects.len() as i64)
            .sum::<i64>(),
    )
    .record("intents.actions", validated.actions.len() as i64)
    .record("intents.status", validated.status.is_some())
    .record("intents.events", validated.events.len() as i64);
    let applied = shared.applied(&key);
    let report = shared
        .applier
        .apply(
            &current,
            &shared.settings.primary.1,
            &observed,
            validated,
            applied,
        )
        .await;
    span.record("apply.applied", report.applied as i64)
        .record("apply.unchanged", report.unchanged as i64)
        .record("apply.pruned", report.pruned as i64)
        .record("apply.failed", report.failures.len() as i64);
    shared.remember(&key, report.remembered.clone());
    let forbidden: Vec<String> = report
        .of(FailureKind::Forbidden)
        .map(ToString::to_string)
        .collect();
    if forbidden.is_empty() {
        shared.set_forbidden(&key, None);
    } else {
        let sa = &shared.settings.service_account;
        let message = format!(
            "{sa} is not allowed to: {} (grant it in the ServiceAccount's Role or ClusterRole)",
            forbidden.join("; ")
        );
        shared.warn(primary, "Forbidden", message.clone()).await;
        shared.set_forbidden(&key, Some(message));
    }
    if let Some(c) = report.of(FailureKind::Conflict).next() {
        return Err(ReconcileError::Conflict(c.to_string()));
    }
    let others: Vec<String> = report
        .failures
        .iter()
        .filter(|f| matches!(f.kind, FailureKind::Invalid | FailureKind::Transient))
        .map(ToString::to_string)
        .collect();
    if !others.is_empty() {
        shared.warn(primary, "ApplyFailed", others.join("; ")).await;
        return Err(ReconcileError::Apply(others.join("; ")));
    }
    if done == Some(true) && !report.failures.is_empty() {
        // The module's cleanup did not all happen: the finalizer keeps protecting what is left.
        let message = format!(
            "finalize reported done, but some of its writes failed: {}; the finalizer {} stays and finalize runs again",
            report
                .failures
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
            finalizer_for(&shared.settings.name)
        );
        shared
            .warn(primary, "FinalizeIncomplete", message.clone())
            .await;
        return Err(ReconcileError::Apply(message));
    }
    if done == Some(true) {
        shared.set_finalizer(&current, false).await?;
        shared.forget(&key);
        return Ok(Action::await_change());
    }
    let resync = resync::jittered(shared.settings.resync);
    let next = match requeue {
        Some(d) if d < resync => (d, Trigger::Requeue),
        _ => (resync, Trigger::Resync),
    };
    let next = if done == Some(false) && requeue.is_none() {
        (Duration::from_secs(1), Trigger::Requeue)
    } else {
        next
    };
    shared.succeeded(&key, Some(next.clone()));
    Ok(Action::requeue(next.0))
}

fn error_policy(primary: Arc<Compact>, error: &ReconcileError, shared: Arc<Shared>) -> Action {
    let failures = shared.failed(&key_of(&*primary));
    let delay = backoff(failures);
    shared.queue.requeued(true);
    tracing::debug!(reconciler = %shared.settings.name, object = %primary.name_any(), failures, delay_ms = delay.as_millis() as u64, error = %error, "backing off");
    Action::requeue(delay)
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
