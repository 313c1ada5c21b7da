//! One reconcile of one primary, step by step: wait for the caches and a permit
//! ([`reconcile`]), admission by sharding and the host-wide bound, the span and the metrics
//! ([`admitted`]), then [`run_once`]: the finalizer, the request, the module call and its
//! validation ([`super::call`]), the writes, their failures, and the next schedule.
//!
//! # Guarantees
//! See the controller's ([`super`]); here: the next reconcile is due at the module's
//! requeue-after when it is shorter than the (jittered) resync, else at the resync; a
//! `finalize` that is not done yet and asked for no requeue runs again after a second
//! ([`next_schedule`]).
//! - The status a reconcile (not a finalize) that created children computed without them is
//!   not written, once in a row at most: the children's creation events call for the next
//!   reconcile, which sees them and writes its own. A status in flux may wait for the
//!   debounce (see [`super::hold`]); the next reconcile is then due by its end at the latest.
//! - A `reconcile` whose inputs are those of the last call, which succeeded, asked for no
//!   requeue, wrote everything and held nothing back, does not call the module
//!   (see [`super::inputs`]); it is counted in `wasmop_reconcile_skipped_total`. Such a
//!   reconcile parses nothing: the request is built from the caches' texts (the primary's as
//!   [`Compact`] holds it), which the host parses only once the module is to be called.
//! - A `reconcile` whose caches do not show yet every child the last one created waits for
//!   them, at most [`super::expect::EXPECT_FOR`] (see [`super::expect`]).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kube::api::DynamicObject;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use tracing::field::Empty;
use tracing::{Instrument, info_span};

use super::apply::{Applier, ApplyReport, FailureKind, Observed, object_reference};
use super::cache::{self, Cache, KindTexts};
use super::call::{self, Check, Export};
use super::compact::Compact;
use super::emit::PUBLISH_TIMEOUT;
use super::expect::Expected;
use super::finalizer::{self, After, Before};
use super::hold::{self, StatusHold};
use super::inputs;
use super::intents::{self, Grant, Primary, Validated};
use super::state::States;
use super::triggers::{object_ref_of, primary_ref};
use super::{ReconcileError, Settings, backoff, priority, record, resync};
use crate::contract::{Context, Gvk, KindObjects, ReconcileRequest, RelatedKind, Trigger};
use crate::discovery::Discovery;
use crate::modules::slot::{Active, ModuleSlot};
use crate::object::{self, ObjectKey};
use crate::operations::{fields, metrics};
use crate::sharding::Listed;
use crate::{reasons, text};

/// Whether reconciles may run: they wait while `Waiting`, and give up when `Stopping`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gate {
    /// Some cache has not finished its first list yet.
    Waiting,
    /// Every cache has its first list.
    Synced,
    /// The controller is stopping: waiting reconciles return.
    Stopping,
}

/// One owned or related kind's compact cache (children grouped by controller uid, related
/// objects by namespace).
pub(super) struct Cached {
    pub kind: Gvk,
    pub cache: Arc<Cache>,
}

/// The state shared by all reconciles of one reconciler.
pub(super) struct Shared {
    pub settings: Settings,
    pub slot: ModuleSlot,
    pub applier: Applier,
    pub host_events: Recorder,
    pub impersonated: kube::Client,
    pub discovery: Discovery,
    pub owned: Vec<Cached>,
    pub related: Vec<Cached>,
    pub states: States,
    pub primaries: Store<Compact>,
    pub synced: tokio::sync::watch::Receiver<Gate>,
    /// With sharding: what every watch has listed (a primary elsewhere waits).
    pub listed: Option<Arc<Listed>>,
    /// `spec.limits.concurrency` permits, reactive work first (see [`priority`]).
    pub priority: priority::PriorityGate<ObjectKey>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("reconciler", &self.settings.name)
            .finish()
    }
}

/// What the reconciles read: the caches, and whether they are synced.
pub(super) struct Caches {
    pub owned: Vec<Cached>,
    pub related: Vec<Cached>,
    pub primaries: Store<Compact>,
    pub synced: tokio::sync::watch::Receiver<Gate>,
    pub listed: Option<Arc<Listed>>,
}

impl Shared {
    /// The state of reconciler `settings.name`, writing with `clients`.
    pub(super) fn new(
        settings: Settings,
        slot: ModuleSlot,
        clients: &super::Clients,
        states: States,
        caches: Caches,
        priority: priority::PriorityGate<ObjectKey>,
    ) -> Self {
        let applier = Applier::new(
            clients.module.clone(),
            clients.host.clone(),
            &settings.name,
            clients.discovery.clone(),
            clients.module_events.clone(),
        );
        Shared {
            settings,
            slot,
            applier,
            host_events: clients.host_events.clone(),
            impersonated: clients.module.clone(),
            discovery: clients.discovery.clone(),
            owned: caches.owned,
            related: caches.related,
            states,
            primaries: caches.primaries,
            synced: caches.synced,
            listed: caches.listed,
            priority,
        }
    }

    /// The primary `key` as the cache holds it now.
    fn cached(&self, key: &ObjectKey) -> Option<Arc<Compact>> {
        self.primaries
            .get(&primary_ref(self.settings.primary_resource(), key))
    }

    /// The lane a reconcile of `key` waits in (see [`States::lane`]).
    fn lane(&self, key: &ObjectKey) -> priority::Lane {
        let rv = self.cached(key).and_then(|p| p.resource_version());
        let active = self.slot.active();
        self.states.lane(key, rv.as_deref(), active.module.sha256())
    }

    /// Frees everything kept for `key` (see [`States::forget`]), its place in the priority
    /// gate too.
    pub(super) fn forget(&self, key: &ObjectKey) {
        self.states.forget(key);
        self.priority.forget(key);
    }

    /// How many children of the primary of uid `uid` the owned caches hold.
    fn cached_children(&self, uid: &str) -> usize {
        self.owned.iter().map(|c| c.cache.group(uid).len()).sum()
    }

    /// The children controlled by `uid`, of every owned kind the module may own, as the caches
    /// hold them (through the index: the cost is the primary's children, not the cache's
    /// size), in a stable order: read once per reconcile, unparsed.
    fn children(&self, uid: &str, grant: &Grant) -> Vec<KindTexts> {
        self.owned
            .iter()
            .filter(|c| grant.owned.contains(&c.kind))
            .map(|c| KindTexts {
                kind: c.kind.clone(),
                objects: c.cache.group(uid),
            })
            .collect()
    }

    /// The related objects the module asked for that the primary may see (in its namespace when
    /// it is namespaced), as the caches hold them (shared, not copied).
    fn related_of(
        &self,
        related: &[RelatedKind],
        namespace: Option<&str>,
    ) -> Vec<(Gvk, Vec<Arc<str>>)> {
        related
            .iter()
            .map(|rk| {
                let objects = self
                    .related
                    .iter()
                    .filter(|c| c.kind == rk.kind)
                    .flat_map(|c| match namespace {
                        Some(ns) => c.cache.group(ns),
                        None => c.cache.all(),
                    })
                    .filter(|(_, json)| rk.selector.matches(&cache::labels_of(json)))
                    .map(|(_, json)| json)
                    .collect();
                (rk.kind.clone(), objects)
            })
            .collect()
    }

    /// Records a Warning Event on `primary`, with the host's identity.
    async fn warn(&self, primary: &DynamicObject, reason: &str, message: String) {
        let r = object_ref_of(&self.settings.primary.kind, primary);
        let event = KubeEvent {
            type_: KubeEventType::Warning,
            reason: reason.to_string(),
            note: Some(text::cut(message, intents::MAX_EVENT_NOTE)),
            action: "Reconcile".into(),
            secondary: None,
        };
        let reference = object_reference(&r, primary.uid());
        publish_warning(&self.host_events, &event, &reference, PUBLISH_TIMEOUT).await;
    }
}

/// Publishes the host's Warning `event` about `reference`, giving up after `within` (a
/// failure or a timeout is logged): the reconcile that reports it holds its concurrency
/// permits meanwhile, and an Events API that does not answer must not hold them.
async fn publish_warning(
    recorder: &Recorder,
    event: &KubeEvent,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    within: Duration,
) {
    match tokio::time::timeout(within, recorder.publish(event, reference)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, reason = %event.reason, "cannot record a Warning Event")
        }
        Err(_) => tracing::warn!(
            reason = %event.reason,
            timeout_s = within.as_secs_f64(),
            "the Events API did not answer a Warning Event in time; it is not recorded"
        ),
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// Logs (once per process, at debug) the size of a reconcile's future: what every entry that
/// waits in the priority gate holds, besides kube-runtime's own wrapping.
pub(super) fn sized<F>(
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

/// One reconcile as kube-runtime's controller runs it: waits for the caches and a permit of
/// the priority gate, reads the primary again, and runs [`admitted`].
pub(super) async fn reconcile(
    primary: Arc<Compact>,
    shared: Arc<Shared>,
) -> Result<Action, ReconcileError> {
    let key = ObjectKey::of(&*primary);
    // Read again once admitted: a reconcile that waited works on the current primary.
    drop(primary);
    // No reconcile and no finalize before every watch has its first list.
    let mut gate = shared.synced.clone();
    match gate.wait_for(|g| *g != Gate::Waiting).await.map(|g| *g) {
        Ok(Gate::Synced) => {}
        // The controller is stopping.
        _ => return Ok(Action::await_change()),
    }
    let namespaces = &shared.settings.namespaces;
    if !namespaces.is_empty()
        && !key
            .namespace
            .as_ref()
            .is_some_and(|ns| namespaces.contains(ns))
    {
        shared.forget(&key);
        return Ok(Action::await_change());
    }
    // At most `spec.limits.concurrency` at once, work that reacts to a change first.
    let permit = match shared.priority.arrive(&key, shared.lane(&key)) {
        priority::Arrival::Run(permit) => permit,
        // Timed work while every permit is taken: the gate hands the key back later.
        priority::Arrival::Parked => return Ok(Action::await_change()),
        priority::Arrival::Wait(waiting) => tokio::select! {
            permit = waiting.permit() => permit,
            // The controller is stopping: waiting reconciles must not hold the shutdown.
            _ = gate.wait_for(|g| *g == Gate::Stopping) => return Ok(Action::await_change()),
        },
    };
    let Some(primary) = shared.cached(&key) else {
        // Deleted while it waited.
        shared.forget(&key);
        return Ok(Action::await_change());
    };
    // Boxed: what waits above stays small (see `sized`).
    Box::pin(admitted(primary, shared, permit)).await
}

/// A root span: one trace per reconcile (not a child of kube-runtime's scheduling span).
/// Exported over OTLP when configured (see `crate::operations::tracing`). Counts are recorded
/// as i64: the OpenTelemetry bridge would export unsigned integers as strings.
fn reconcile_span(
    settings: &Settings,
    key: &ObjectKey,
    active: &Active,
    trigger: &Trigger,
    attempt: u32,
) -> tracing::Span {
    let sha = active.module.sha256();
    info_span!(
        parent: None,
        "reconcile",
        reconciler = %settings.name,
        kind = %settings.primary.kind,
        object = %key,
        trigger = trigger.name(),
        attempt = i64::from(attempt),
        module = %text::short_hex(sha),
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
        apply.status_deferred = Empty,
        inputs.unchanged = Empty,
        outcome = Empty,
        otel.status_code = Empty,
        otel.status_description = Empty,
    )
}

/// A reconcile that has its permit of the reconciler's priority gate (held until it returns).
async fn admitted(
    primary: Arc<Compact>,
    shared: Arc<Shared>,
    _slot: priority::Permit,
) -> Result<Action, ReconcileError> {
    let key = ObjectKey::of(&*primary);
    // With sharding: only primaries in this replica's active ranges, and the drain of a range
    // being released waits for this reconcile (held until it returns).
    let admitted = match &shared.settings.shards {
        None => None,
        Some(shards) => {
            let by =
                crate::sharding::hash::Key::of_primary(shared.settings.primary.resolved.namespaced);
            let hash = by.hash(&*primary);
            match shards.admit(hash) {
                // Gained, and some watch has not listed it yet: reconciled once they all did
                // (the controller's `gained_primaries`).
                Ok(_) if !shared.listed.as_ref().is_some_and(|l| l.covers(hash)) => {
                    tracing::debug!(target: "wasmop::sharding::listed", primary = %key, "in a range not listed by every watch yet: reconciled once they all listed it");
                    return Ok(Action::await_change());
                }
                Ok(a) => Some(a),
                Err(crate::sharding::Refused::NotHere) => {
                    shared.forget(&key);
                    return Ok(Action::await_change());
                }
                // Until the next renewal vouches for the member Lease (every retry period).
                Err(crate::sharding::Refused::Lapsed) => {
                    return Ok(Action::requeue(std::time::Duration::from_secs(2)));
                }
            }
        }
    };
    let started_ms = now_unix_ms();
    // The host-wide bound: held until this reconcile's writes are done.
    let _permit = shared
        .settings
        .reconcile_limit
        .admit(&shared.settings.name)
        .await;
    let active = shared.slot.active();
    let sha = active.module.sha256().to_string();
    let rv = primary.resource_version();
    let (trigger, attempt) = shared.states.begin(&key, rv.as_deref(), &sha);
    let span = reconcile_span(&shared.settings, &key, &active, &trigger, attempt);
    let started = Instant::now();
    // With sharding, the record says how many children the caches held (a gained primary
    // must not be reconciled before its children are listed).
    // Counted only when the record is written (a walk of the owned caches per reconcile).
    let children = admitted
        .as_ref()
        .filter(|_| tracing::enabled!(target: "wasmop::sharding", tracing::Level::DEBUG))
        .map(|_| shared.cached_children(&primary.uid().unwrap_or_default()));
    let m = metrics::global();
    shared.states.queue().started(&key.to_string());
    let active_now = m.active(&shared.settings.name);
    let ran = run_once(&primary, &shared, &active, trigger, attempt)
        .instrument(span.clone())
        .await;
    let unchanged = ran.as_ref().is_ok_and(|r| r.unchanged);
    let result = ran.map(|r| r.action);
    let elapsed = started.elapsed();
    if admitted.is_some() {
        // The record of which replica reconciled which primary when (read by the e2e tests).
        tracing::debug!(target: "wasmop::sharding", reconciler = %shared.settings.name, primary = %key, started_ms, finished_ms = now_unix_ms(), children, "sharded reconcile");
    }
    drop(admitted);
    m.reconciled(&shared.settings.name, result.is_ok(), elapsed);
    drop(active_now);
    finished(&shared, &key, &active, &span, (elapsed, unchanged), &result);
    result
}

/// The most bytes of a failed reconcile's error its span and log line carry.
pub const MAX_ERROR_TEXT: usize = 4096;

/// Reports a finished reconcile: the queue, its span and log line (the error cut to
/// [`MAX_ERROR_TEXT`]), the module's record for rollback; forgets a primary deleted while it
/// ran.
///
/// The span's outcome (and `inputs.unchanged` when the inputs were unchanged) is recorded in
/// one `record_all`: the JSON log re-encodes the span's fields on each (see
/// [`crate::operations::fields`]), and an idle host records one per primary and resync.
fn finished(
    shared: &Shared,
    key: &ObjectKey,
    active: &Active,
    span: &tracing::Span,
    (elapsed, unchanged): (Duration, bool),
    result: &Result<Action, ReconcileError>,
) {
    if let Ok(action) = result
        && *action != Action::await_change()
    {
        shared.states.queue().requeued(false);
    }
    // Cut: a module's error text is inert but as long as its output cap allows.
    let (code, description) = match result {
        Ok(_) => ("OK", None),
        Err(e) => (
            "ERROR",
            Some(crate::text::cut(e.to_string(), MAX_ERROR_TEXT)),
        ),
    };
    fields::record(
        span,
        [
            ("outcome", &outcome(result)),
            ("otel.status_code", &code),
            ("otel.status_description", &description.as_deref()),
            ("inputs.unchanged", &unchanged.then_some(true)),
        ],
    );
    let _enter = span.enter();
    match &description {
        None => tracing::debug!(elapsed_ms = elapsed.as_millis() as u64, "reconciled"),
        Some(e) => {
            tracing::warn!(elapsed_ms = elapsed.as_millis() as u64, error = %e, "reconcile failed")
        }
    }
    active.record(match result {
        Ok(_) => true,
        Err(e) => !e.is_module_failure(),
    });
    // Deleted while it ran: nothing more will come for it.
    if shared.cached(key).is_none() {
        shared.forget(key);
    }
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
        Err(ReconcileError::InputsTooLarge(_)) => "inputs_too_large",
    }
}

/// When the next reconcile is due, and why: the module's requeue-after when shorter than the
/// (jittered) `resync`, else the resync; a `finalize` not `done` yet that asked for no
/// requeue runs again after a second.
pub(super) fn next_schedule(
    requeue: Option<Duration>,
    resync: Duration,
    done: Option<bool>,
) -> (Duration, Trigger) {
    if done == Some(false) && requeue.is_none() {
        return (Duration::from_secs(1), Trigger::Requeue);
    }
    match requeue {
        Some(d) if d < resync => (d, Trigger::Requeue),
        _ => (resync, Trigger::Resync),
    }
}

/// The module's request: the primary's text, its `children` and the related objects from the
/// caches, unparsed (a reconcile whose inputs did not change ends before anything is parsed).
///
/// # Errors
/// [`ReconcileError::InputsTooLarge`] when the texts add up to more than the module's memory
/// cap (they are copied into its memory: they could never fit), found before any is copied.
fn request(
    shared: &Shared,
    active: &Active,
    (primary, children): (String, &[KindTexts]),
    key: &ObjectKey,
    (trigger, attempt): (Trigger, u32),
) -> Result<ReconcileRequest, ReconcileError> {
    let namespace = key
        .namespace
        .as_deref()
        .filter(|_| shared.settings.primary.resolved.namespaced);
    let related = shared.related_of(&active.fit.related, namespace);
    inputs_fit(
        shared.settings.limits.memory_bytes,
        &primary,
        children,
        &related,
    )?;
    let owned = children
        .iter()
        .map(|c| KindObjects {
            kind: c.kind.clone(),
            objects: c.objects.iter().map(|(_, json)| json.to_string()).collect(),
        })
        .collect();
    let related = related
        .into_iter()
        .map(|(kind, objects)| KindObjects {
            kind,
            objects: objects.iter().map(|json| json.to_string()).collect(),
        })
        .collect();
    Ok(ReconcileRequest {
        primary,
        owned,
        related,
        context: Context {
            reconciler: shared.settings.name.clone(),
            trigger,
            attempt,
            config: shared.settings.config.clone(),
            now_unix_ms: now_unix_ms(),
        },
    })
}

/// Whether the texts of a request fit in a module memory of `cap` bytes: the primary, the
/// children and the related objects summed by their lengths (no copy).
///
/// # Errors
/// [`ReconcileError::InputsTooLarge`] naming the sizes.
fn inputs_fit(
    cap: u64,
    primary: &str,
    children: &[KindTexts],
    related: &[(Gvk, Vec<Arc<str>>)],
) -> Result<(), ReconcileError> {
    let owned: usize = children
        .iter()
        .flat_map(|c| c.objects.iter())
        .map(|(_, json)| json.len())
        .sum();
    let related: usize = related
        .iter()
        .flat_map(|(_, objects)| objects.iter())
        .map(|json| json.len())
        .sum();
    let total = primary.len().saturating_add(owned).saturating_add(related);
    if u64::try_from(total).unwrap_or(u64::MAX) <= cap {
        return Ok(());
    }
    Err(ReconcileError::InputsTooLarge(format!(
        "the module's inputs are {total} bytes (primary {}, children {owned}, related objects {related}), more than its memory cap of {cap} bytes can hold: the module is not called (raise spec.limits.memory, or narrow the related kinds' selectors)",
        primary.len()
    )))
}

/// The children parsed for the host (the module is sent their texts). A text that does not
/// parse is left out, with a warning; the cache wrote every text from an object, so it parses.
fn parsed(children: &[KindTexts]) -> Vec<Observed> {
    children
        .iter()
        .map(|c| Observed {
            kind: c.kind.clone(),
            objects: c
                .objects
                .iter()
                .filter_map(|(key, json)| {
                    object::parse(json)
                        .inspect_err(|e| tracing::warn!(kind = %c.kind, object = %key, error = %e, "a cached object does not parse"))
                        .ok()
                })
                .collect(),
        })
        .collect()
}

/// Where a failed call's request is recorded (`--record-failures`), if anywhere.
struct Failures<'a> {
    recorder: Option<&'a record::FailureRecorder>,
    /// With a recorder: the request, or its size when it was too large to copy.
    request: Option<Result<ReconcileRequest, usize>>,
    sha: &'a str,
    export: Export,
}

impl Failures<'_> {
    /// Records the request that failed with `error`; what to add to the Warning about it.
    fn note(&self, error: &str) -> String {
        let finalize = self.export == Export::Finalize;
        if let (Some(recorder), Some(Err(bytes))) = (self.recorder, &self.request) {
            recorder.too_large(*bytes);
            return String::new();
        }
        record::note(
            self.recorder,
            self.request.as_ref().and_then(|r| r.as_ref().ok()),
            self.sha,
            error,
            finalize,
        )
    }
}

/// Calls the module (off the async workers) and records what the call cost.
async fn call_module(
    shared: &Shared,
    active: &Active,
    export: Export,
    request: ReconcileRequest,
) -> Result<call::Called, ReconcileError> {
    let call_span = info_span!(
        "module.call",
        call = export.name(),
        instantiate_us = Empty,
        call_us = Empty,
        memory_peak = Empty,
    );
    let called = call::call(&active.module, export, request, shared.settings.limits)
        .instrument(call_span.clone())
        .await
        .map_err(|failure| match failure {
            call::Failure::Join(message) => ReconcileError::Join(message),
            other => ReconcileError::Join(other.to_string()),
        })?;
    let stats = called.stats;
    fields::record(
        &call_span,
        [
            ("instantiate_us", &(stats.instantiate.as_micros() as i64)),
            ("call_us", &(stats.call.as_micros() as i64)),
            ("memory_peak", &(stats.memory_peak as i64)),
        ],
    );
    drop(call_span);
    metrics::global().module_call(&shared.settings.name, export.name(), &stats);
    tracing::trace!(
        instantiate_us = stats.instantiate.as_micros() as u64,
        call_us = stats.call.as_micros() as u64,
        memory_peak = stats.memory_peak,
        "module call"
    );
    Ok(called)
}

/// The module's answer validated: a failed call or a refused response is reported in a
/// Warning Event (naming the recorded request, if any).
async fn answer(
    shared: &Shared,
    active: &Active,
    (primary, current): (&DynamicObject, &DynamicObject),
    observed: &[Observed],
    called: call::Called,
    failures: &Failures<'_>,
) -> Result<(Option<bool>, Validated), ReconcileError> {
    let module = &active.module;
    let call::Response { done, response } = match called.result {
        Ok(r) => r,
        Err(e) => {
            let recorded = failures.note(&e.to_string());
            let (name, sha) = (&module.metadata().name, text::short_hex(module.sha256()));
            let message = format!("module {name} ({sha}): {e}{recorded}");
            shared.warn(primary, e.reason(), message).await;
            return Err(e.into());
        }
    };
    let info = primary_of(current).map_err(ReconcileError::Apply)?;
    let children = call::observed_children(observed);
    let check = Check {
        reconciler: &shared.settings.name,
        primary: &info,
        grant: &active.fit.grant,
        scopes: &shared.discovery,
        children: &children,
    };
    match check.validate(response) {
        Ok(v) => Ok((done, v)),
        Err(rejected) => {
            let recorded = failures.note(&rejected.to_string());
            let message = format!("module {}: {rejected}{recorded}", module.metadata().name);
            shared
                .warn(primary, reasons::INVALID_INTENTS, message)
                .await;
            Err(rejected.into())
        }
    }
}

/// Applies `validated` for `current` and remembers what is applied; records the counts on
/// the reconcile's span. The status of a reconcile (not a finalize) that created
/// children may wait for the next (see the module docs).
async fn apply(
    shared: &Shared,
    (key, export): (&ObjectKey, Export),
    current: &DynamicObject,
    observed: &[Observed],
    validated: Validated,
) -> ApplyReport {
    let span = tracing::Span::current();
    let children: i64 = validated
        .children
        .iter()
        .map(|set| set.objects.len() as i64)
        .sum();
    let (actions, status, events) = (
        validated.actions.len() as i64,
        validated.status.is_some(),
        validated.events.len() as i64,
    );
    let applied = shared.states.applied(key);
    let hold = match export {
        Export::Reconcile => StatusHold::of(
            shared.states.held_since(key),
            validated.requeue_after,
            (shared.settings.resync, shared.settings.status_debounce),
            Instant::now(),
        ),
        Export::Finalize => StatusHold::NEVER,
    };
    let resolved = &shared.settings.primary.resolved;
    let report = shared
        .applier
        .apply(current, resolved, observed, validated, (applied, hold))
        .await;
    fields::record(
        &span,
        [
            ("intents.children", &children),
            ("intents.actions", &actions),
            ("intents.status", &status),
            ("intents.events", &events),
            ("apply.applied", &(report.applied as i64)),
            ("apply.unchanged", &(report.unchanged as i64)),
            ("apply.pruned", &(report.pruned as i64)),
            ("apply.failed", &(report.failures.len() as i64)),
            ("apply.status_deferred", &report.status_deferred),
        ],
    );
    shared.states.remember(key, report.remembered.clone());
    let created = Expected::new(report.created.clone(), Instant::now());
    shared.states.expect(key, created);
    shared.states.status_held(key, report.status_deferred);
    if report.status_deferred {
        tracing::debug!(
            created = report.created.len(),
            "status held back: children were created or the module is in flux; a later reconcile writes its own"
        );
    }
    report
}

/// Reports the failed writes of `report`: Forbidden ones to the manager and in a Warning;
/// a conflict or another failure fails the reconcile.
async fn write_failures(
    shared: &Shared,
    primary: &DynamicObject,
    key: &ObjectKey,
    report: &ApplyReport,
) -> Result<(), ReconcileError> {
    let forbidden: Vec<String> = report
        .of(FailureKind::Forbidden)
        .map(ToString::to_string)
        .collect();
    if forbidden.is_empty() {
        shared.states.set_forbidden(key, None);
    } else {
        let sa = &shared.settings.service_account;
        let message = format!(
            "{sa} is not allowed to: {} (grant it in the ServiceAccount's Role or ClusterRole)",
            forbidden.join("; ")
        );
        shared
            .warn(primary, reasons::FORBIDDEN, message.clone())
            .await;
        shared.states.set_forbidden(key, Some(message));
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
        shared
            .warn(primary, reasons::APPLY_FAILED, others.join("; "))
            .await;
        return Err(ReconcileError::Apply(others.join("; ")));
    }
    Ok(())
}

/// The finalizer step before the call, read from the cached primary's metadata: whether to
/// call `finalize`, with the primary as the finalizer's write left it when it wrote one
/// (`Some(object)`), or None when the reconcile is over (the primary let go).
async fn finalizer_first(
    shared: &Shared,
    primary: &Compact,
    key: &ObjectKey,
    module: &crate::engine::Module,
) -> Result<Option<(Option<DynamicObject>, Export)>, ReconcileError> {
    let deleting = primary.meta().deletion_timestamp.is_some();
    match finalizer::before_call(
        &shared.settings.name,
        primary.finalizers(),
        deleting,
        module.metadata().finalizes,
        module.selects(primary.labels(), primary.annotations()),
    ) {
        Before::LetGo => {
            shared.forget(key);
            Ok(None)
        }
        Before::Release => {
            finalizer::set(
                &shared.settings,
                &shared.impersonated,
                &parse(primary, key)?,
                false,
            )
            .await?;
            shared.forget(key);
            Ok(None)
        }
        Before::Set(present) => Ok(Some((
            Some(
                finalizer::set(
                    &shared.settings,
                    &shared.impersonated,
                    &parse(primary, key)?,
                    present,
                )
                .await?,
            ),
            Export::of(deleting),
        ))),
        Before::Call => Ok(Some((None, Export::of(deleting)))),
        Before::OptOut => Ok(Some((None, Export::Finalize))),
    }
}

/// The cached primary `key`, parsed from its text.
fn parse(primary: &Compact, key: &ObjectKey) -> Result<DynamicObject, ReconcileError> {
    primary
        .object()
        .map_err(|e| ReconcileError::Apply(format!("cannot read the cached primary {key}: {e}")))
}

/// One reconcile (or finalize) of `primary` with module `active`: the finalizer, the
/// request, the call and its validation, the writes, and the next schedule. Nothing is parsed
/// before the inputs are known to have changed: the module is sent the cached texts.
async fn run_once(
    primary: &Arc<Compact>,
    shared: &Arc<Shared>,
    active: &Active,
    trigger: Trigger,
    attempt: u32,
) -> Result<Ran, ReconcileError> {
    let key = ObjectKey::of(&**primary);
    let Some((written, export)) = finalizer_first(shared, primary, &key, &active.module).await?
    else {
        return Ok(Action::await_change().into());
    };
    let children = shared.children(&primary.uid().unwrap_or_default(), &active.fit.grant);
    if export == Export::Reconcile
        && let Some(wait) = shared.states.awaiting(&key, &children, Instant::now())
    {
        return Ok(awaiting_children(shared, &key, wait).into());
    }
    // The primary the module sees: as cached, or as the finalizer's write left it.
    let text = match &written {
        None => primary.json().to_string(),
        Some(o) => serde_json::to_string(o)
            .map_err(|e| ReconcileError::Apply(format!("cannot serialize the primary: {e}")))?,
    };
    let request = match request(shared, active, (text, &children), &key, (trigger, attempt)) {
        Ok(r) => r,
        Err(e) => {
            let message = e.to_string();
            shared
                .warn(&parse(primary, &key)?, reasons::INPUTS_TOO_LARGE, message)
                .await;
            return Err(e);
        }
    };
    let inputs = (export == Export::Reconcile)
        .then(|| inputs::fingerprint(&request, active.module.sha256()));
    if let Some(fingerprint) = inputs
        && shared.states.settled(&key, fingerprint)
    {
        return Ok(Ran {
            action: unchanged_inputs(shared, &key),
            unchanged: true,
        });
    }
    let cached = parse(primary, &key)?;
    let current = written.as_ref().unwrap_or(&cached);
    let observed = parsed(&children);
    let recorder = shared.settings.recorder.as_deref();
    let failures = Failures {
        recorder,
        // A copy only of a request that may fit a recording (the module takes the request).
        request: recorder.map(|r| match r.fits(&request) {
            true => Ok(request.clone()),
            false => Err(record::request_bytes(&request)),
        }),
        sha: active.module.sha256(),
        export,
    };
    let called = call_module(shared, active, export, request).await?;
    let (done, validated) = answer(
        shared,
        active,
        (&cached, current),
        &observed,
        called,
        &failures,
    )
    .await?;
    let requeue = validated.requeue_after;
    let report = apply(shared, (&key, export), current, &observed, validated).await;
    write_failures(shared, &cached, &key, &report).await?;
    let after = match finalizer::after_finalize(done, report.failures.len()) {
        After::Incomplete => {
            // The module's cleanup did not all happen: the finalizer keeps protecting what is
            // left.
            let failed: Vec<String> = report.failures.iter().map(ToString::to_string).collect();
            let message = finalizer::incomplete(&shared.settings.name, &failed);
            shared
                .warn(&cached, reasons::FINALIZE_INCOMPLETE, message.clone())
                .await;
            Err(ReconcileError::Apply(message))
        }
        After::Release => {
            finalizer::set(&shared.settings, &shared.impersonated, current, false).await?;
            shared.forget(&key);
            Ok(Action::await_change())
        }
        After::Schedule => {
            let resync = resync::jittered(shared.settings.resync);
            let mut next = next_schedule(requeue, resync, done);
            let settled =
                report.failures.is_empty() && !report.status_deferred && next.1 == Trigger::Resync;
            shared.states.settle(&key, inputs.filter(|_| settled));
            if let Some(due) = held_due(shared, &key, &report)
                && due < next.0
            {
                next = (due, Trigger::Requeue);
            }
            shared.states.succeeded(&key, next.clone());
            Ok(Action::requeue(next.0))
        }
    };
    after.map(Ran::from)
}

/// What [`run_once`] did: the next action, and whether it ended before the call because its
/// inputs were those of a call that left nothing to do.
struct Ran {
    action: Action,
    unchanged: bool,
}

impl From<Action> for Ran {
    fn from(action: Action) -> Self {
        Ran {
            action,
            unchanged: false,
        }
    }
}

/// A reconcile whose inputs did not change since a call that left nothing to do: no call, no
/// write; the next one is due at the resync.
fn unchanged_inputs(shared: &Shared, key: &ObjectKey) -> Action {
    metrics::global().reconcile_skipped(&shared.settings.name);
    let next = (resync::jittered(shared.settings.resync), Trigger::Resync);
    shared.states.succeeded(key, next.clone());
    Action::requeue(next.0)
}

/// A reconcile that waits for the children the last one created to reach the caches (see
/// [`super::expect`]): no call, no write; their creation events call for the next reconcile,
/// at the latest after `wait`.
fn awaiting_children(shared: &Shared, key: &ObjectKey, wait: Duration) -> Action {
    tracing::debug!(
        wait_ms = wait.as_millis() as u64,
        "waiting for the children the last reconcile created to reach the caches"
    );
    shared.states.succeeded(key, (wait, Trigger::Requeue));
    Action::requeue(wait)
}

/// When the reconcile that writes a status held back by `report` is due at the latest (see
/// [`hold::due_within`]).
fn held_due(shared: &Shared, key: &ObjectKey, report: &ApplyReport) -> Option<Duration> {
    if !report.status_deferred {
        return None;
    }
    let since = shared.states.held_since(key)?;
    hold::due_within(since, shared.settings.status_debounce, Instant::now())
}

/// The backoff after a failed reconcile of `primary` (see [`backoff`]).
pub(super) fn error_policy(
    primary: Arc<Compact>,
    error: &ReconcileError,
    shared: Arc<Shared>,
) -> Action {
    let failures = shared.states.failed(&ObjectKey::of(&*primary));
    let delay = backoff(failures);
    shared.states.queue().requeued(true);
    tracing::debug!(reconciler = %shared.settings.name, object = %primary.name_any(), failures, delay_ms = delay.as_millis() as u64, error = %error, "backing off");
    Action::requeue(delay)
}

/// What the intent check needs of the primary: [`Primary::from_object`] of `object`, read from
/// its fields instead of a JSON copy of the whole object (made once per reconcile before).
///
/// # Errors
/// As [`Primary::from_object`]: a message if apiVersion, kind or name is missing.
fn primary_of(object: &DynamicObject) -> Result<Primary, String> {
    let types = object
        .types
        .as_ref()
        .ok_or("the primary object has no apiVersion")?;
    let meta = &object.metadata;
    Ok(Primary {
        kind: Gvk::new(types.api_version.clone(), types.kind.clone()),
        namespace: meta.namespace.clone().filter(|n| !n.is_empty()),
        name: meta
            .name
            .clone()
            .ok_or("the primary object has no metadata.name")?,
        uid: meta
            .uid
            .clone()
            .unwrap_or_else(|| "00000000-0000-0000-0000-000000000000".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primary_of_reads_what_from_object_reads_from_json() {
        let objects = [
            serde_json::json!({"apiVersion": "example.com/v1", "kind": "App",
                   "metadata": {"name": "a", "namespace": "ns", "uid": "u-1"}}),
            serde_json::json!({"apiVersion": "example.com/v1", "kind": "Cluster",
                   "metadata": {"name": "c", "namespace": ""}}),
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}),
            serde_json::json!({"metadata": {"name": "no-types"}}),
        ];
        for value in objects {
            let object: DynamicObject = serde_json::from_value(value.clone()).expect("parses");
            let from_json = Primary::from_object(&serde_json::to_value(&object).expect("json"));
            assert_eq!(primary_of(&object), from_json, "{value}");
        }
    }

    const MIN: Duration = Duration::from_secs(60);

    /// The host's own Warnings (`ModuleError`, `InvalidIntents`, `ApplyFailed`...) are sent
    /// while the reconcile holds its concurrency permits: an Events API that does not answer
    /// (overload, a hung webhook on Events) must not hold them past the publish timeout.
    #[tokio::test]
    async fn a_host_warning_nobody_answers_gives_up_at_the_publish_timeout() {
        let (posted, mut seen) = tokio::sync::watch::channel(0);
        let client = crate::controller::apply::tests::events_never_answered(Arc::new(posted));
        let reporter = kube::runtime::events::Reporter {
            controller: "test".into(),
            instance: None,
        };
        let recorder = Recorder::new(client, reporter);
        let event = KubeEvent {
            type_: KubeEventType::Warning,
            reason: "ModuleError".into(),
            note: Some("boom".into()),
            action: "Reconcile".into(),
            secondary: None,
        };
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            name: Some("p".into()),
            namespace: Some("ns".into()),
            ..Default::default()
        };
        // Generous: it must give up after its 100 ms, not wait for an answer.
        let published = tokio::time::timeout(
            Duration::from_secs(60),
            publish_warning(&recorder, &event, &reference, Duration::from_millis(100)),
        )
        .await;
        assert!(published.is_ok(), "the Warning held the reconcile for 60 s");
        assert_eq!(*seen.borrow_and_update(), 1, "it was sent");
    }

    #[test]
    fn a_shorter_requeue_comes_before_the_resync() {
        let next = next_schedule(Some(Duration::from_secs(5)), MIN, None);
        assert_eq!(next, (Duration::from_secs(5), Trigger::Requeue));
    }

    #[test]
    fn a_longer_or_no_requeue_waits_for_the_resync() {
        assert_eq!(
            next_schedule(Some(MIN * 2), MIN, None),
            (MIN, Trigger::Resync)
        );
        assert_eq!(next_schedule(Some(MIN), MIN, None), (MIN, Trigger::Resync));
        assert_eq!(next_schedule(None, MIN, None), (MIN, Trigger::Resync));
    }

    #[test]
    fn an_unfinished_finalize_runs_again_after_a_second_unless_it_asked() {
        assert_eq!(
            next_schedule(None, MIN, Some(false)),
            (Duration::from_secs(1), Trigger::Requeue)
        );
        let asked = Duration::from_secs(7);
        assert_eq!(
            next_schedule(Some(asked), MIN, Some(false)),
            (asked, Trigger::Requeue)
        );
    }

    #[test]
    fn a_truncated_note_ends_in_dots_at_a_character_boundary() {
        assert_eq!(text::cut("abc".into(), 5), "abc");
        assert_eq!(text::cut("abcdefgh".into(), 6), "abc...");
        assert_eq!(text::cut("ééééé".into(), 6), "é...");
    }

    /// A reconcile of one Widget with the real misbehave module (a ConfigMap child and a
    /// status, no requeue) against a fake API server that answers discovery for ConfigMaps,
    /// echoes every write and counts them.
    mod harness {
        use std::sync::Mutex;

        use kube::api::{ApiResource, GroupVersionKind};
        use kube::runtime::events::Reporter;
        use kube::runtime::reflector::store::Writer;
        use kube::runtime::watcher;
        use serde_json::json;

        use super::super::*;
        use crate::controller::apply::tests::{Bodies, recording_bodies};
        use crate::controller::health::Health;
        use crate::controller::{Watched, limit};
        use crate::discovery::Resolved;
        use crate::engine::{Engine, EngineConfig, Limits};
        use crate::modules::slot::{Active, Fit, ModuleSlot};

        pub type Seen = Arc<Mutex<Vec<String>>>;

        pub const NAME: &str = "unit-inputs";

        /// `o` as the primaries' store holds it.
        pub fn compact(o: &DynamicObject) -> Compact {
            Compact::new(
                &lean(o),
                crate::controller::predicate::Changes::OutsideStatus,
            )
        }

        /// `o` as its watch delivers it.
        pub fn lean(o: &DynamicObject) -> crate::lean::Lean {
            crate::lean::Lean::of(o).unwrap_or_else(|e| panic!("lean: {e}"))
        }

        pub fn primary() -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                "metadata": {"name": "w", "namespace": "ns", "uid": "u-w", "resourceVersion": "5",
                             "generation": 1},
                "spec": {}
            }))
            .unwrap_or_else(|e| panic!("literal: {e}"))
        }

        /// The Widget's ConfigMap child at `rv`, as its watch delivers it.
        pub fn child(rv: &str) -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "w-out", "namespace": "ns", "uid": "u-c", "resourceVersion": rv,
                    "ownerReferences": [{"apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                        "name": "w", "uid": "u-w", "controller": true}]},
                "data": {"owner": "w"}
            }))
            .unwrap_or_else(|e| panic!("literal: {e}"))
        }

        /// The shared state of reconciler [`NAME`], its ConfigMap cache holding `child` (listed),
        /// and what its fake API server saw.
        pub async fn shared(child: &DynamicObject) -> (Arc<Shared>, Arc<Cache>, Seen) {
            let (shared, cache, seen, _) = named(NAME, child).await;
            (shared, cache, seen)
        }

        /// As [`shared`], for reconciler `name` (a test of its own: the module-call metrics are
        /// per reconciler name), with the bodies its fake API server received.
        pub async fn named(
            name: &str,
            child: &DynamicObject,
        ) -> (Arc<Shared>, Arc<Cache>, Seen, Bodies) {
            named_with(name, child, Limits::default()).await
        }

        /// As [`named`], with the module calls' `limits`.
        pub async fn named_with(
            name: &str,
            child: &DynamicObject,
            limits: Limits,
        ) -> (Arc<Shared>, Arc<Cache>, Seen, Bodies) {
            let module = tokio::task::spawn_blocking(|| {
                let engine =
                    Engine::new(&EngineConfig::default()).unwrap_or_else(|e| panic!("engine: {e}"));
                let bytes = wasmop_test_modules::bytes(wasmop_test_modules::MISBEHAVE);
                engine
                    .load(&bytes, &Limits::default())
                    .unwrap_or_else(|e| panic!("module: {e}"))
            })
            .await
            .unwrap_or_else(|e| panic!("{e}"));
            let config_map = Gvk::new("v1", "ConfigMap");
            let mut grant = crate::grant::Grant::default();
            grant.owned.insert(config_map.clone());
            let fit = Fit {
                grant,
                related: Vec::new(),
                ungranted: Vec::new(),
            };
            let slot = ModuleSlot::new(Active::new(module, fit, "1".into()));
            let (seen, bodies) = (Seen::default(), Bodies::default());
            let client = recording_bodies(seen.clone(), bodies.clone());
            let reporter = Reporter {
                controller: "test".into(),
                instance: None,
            };
            let clients = super::super::super::Clients {
                host: client.clone(),
                module: client.clone(),
                discovery: Discovery::new(client.clone()),
                host_events: Recorder::new(client.clone(), reporter.clone()),
                module_events: crate::controller::emit::EventLane::start(
                    crate::controller::emit::Recorders::new(&client, &reporter),
                    name,
                    Arc::default(),
                ),
            };
            let gvk = GroupVersionKind::gvk("test.wasmop.dev", "v1", "Widget");
            let resource = ApiResource::from_gvk_with_plural(&gvk, "widgets");
            let settings = Settings {
                name: name.into(),
                primary: Watched {
                    kind: Gvk::new("test.wasmop.dev/v1", "Widget"),
                    resolved: Resolved {
                        resource: resource.clone(),
                        namespaced: true,
                    },
                },
                owned: Vec::new(),
                related: Vec::new(),
                namespaces: Vec::new(),
                limits,
                concurrency: 1,
                reconcile_limit: limit::ReconcileLimit::new(1),
                resync: Duration::from_secs(600),
                primary_changes: Default::default(),
                status_debounce: Duration::from_secs(5),
                config: "{}".into(),
                service_account: "system:serviceaccount:ns:sa".into(),
                recorder: None,
                shards: None,
            };
            let cache = Cache::new(cache::controller_uid);
            for event in [
                watcher::Event::Init,
                watcher::Event::InitApply(lean(child)),
                watcher::Event::InitDone,
            ] {
                cache.record(&event);
            }
            let queue = metrics::global().queue(name);
            let states = States::new(name, Arc::new(Health::default()), queue);
            let (_gate, synced) = tokio::sync::watch::channel(Gate::Synced);
            let caches = Caches {
                owned: vec![Cached {
                    kind: config_map,
                    cache: cache.clone(),
                }],
                related: Vec::new(),
                primaries: Writer::<Compact>::new(resource).as_reader(),
                synced,
                listed: None,
            };
            // The checks of a response know the child kinds' scopes from discovery.
            clients
                .discovery
                .resolve(&Gvk::new("v1", "ConfigMap"))
                .await
                .unwrap_or_else(|e| panic!("the fake discovery: {e}"));
            let priority = priority::PriorityGate::new(1, Box::new(|_| {}), None);
            let shared = Shared::new(settings, slot, &clients, states, caches, priority);
            (Arc::new(shared), cache, seen, bodies)
        }

        /// How many times reconciler [`NAME`] called its module's `reconcile`.
        pub fn module_calls() -> f64 {
            module_calls_of(NAME)
        }

        /// How many times reconciler `name` called its module's `reconcile`.
        pub fn module_calls_of(name: &str) -> f64 {
            let text = metrics::encode().unwrap_or_default();
            text.lines()
                .filter(|l| l.starts_with("wasmop_module_call_duration_seconds_count{"))
                .filter(|l| l.contains(&format!("reconciler=\"{name}\"")))
                .filter(|l| l.contains("function=\"reconcile\""))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        }
    }

    /// What the host hands a module is copied into its memory: inputs larger than the module's
    /// memory cap (a child or related objects someone else made huge) can never fit. They must
    /// not be copied for the call, nor count as the module's failure (which would roll back a
    /// good new module): the reconcile fails as the host's, before the call.
    #[tokio::test]
    async fn inputs_larger_than_the_modules_memory_are_refused_before_the_call() {
        let mut child = harness::child("7");
        child.data["data"]["big"] = serde_json::json!("x".repeat(2 << 20));
        let limits = crate::engine::Limits {
            memory_bytes: 1 << 20,
            ..crate::engine::Limits::default()
        };
        let (shared, _, _, bodies) = harness::named_with("too-large", &child, limits).await;
        let primary = Arc::new(harness::compact(&harness::primary()));
        let active = shared.slot.active();
        let ran = run_once(&primary, &shared, &active, Trigger::PrimaryChanged, 1).await;
        let Err(e) = ran else {
            panic!("a reconcile whose inputs cannot fit in the module's memory ran")
        };
        assert!(!e.is_module_failure(), "{e}");
        assert!(e.to_string().contains("memory"), "{e}");
        assert_eq!(harness::module_calls_of("too-large"), 0.0);
        let bodies = bodies.lock().map(|b| b.clone()).unwrap_or_default();
        let warned = bodies.iter().any(|(request, body)| {
            request.contains("/events") && String::from_utf8_lossy(body).contains("InputsTooLarge")
        });
        assert!(warned, "no InputsTooLarge Warning on the primary");
    }

    #[tokio::test]
    async fn a_reconcile_whose_inputs_did_not_change_does_not_call_the_module() {
        let first = harness::child("7");
        let (shared, cache, seen) = harness::shared(&first).await;
        let primary = Arc::new(harness::compact(&harness::primary()));
        let reconcile = |trigger: Trigger| {
            let (primary, shared) = (primary.clone(), shared.clone());
            async move {
                let active = shared.slot.active();
                // As `admitted` does before each reconcile.
                let key = ObjectKey::of(&*primary);
                let rv = primary.resource_version();
                shared
                    .states
                    .begin(&key, rv.as_deref(), active.module.sha256());
                run_once(&primary, &shared, &active, trigger, 1)
                    .await
                    .unwrap_or_else(|e| panic!("reconcile: {e}"))
                    .action
            }
        };
        let requests = || seen.lock().map(|s| s.len()).unwrap_or_default();
        reconcile(Trigger::PrimaryChanged).await;
        assert_eq!(harness::module_calls(), 1.0);
        let written = requests();
        assert!(
            written >= 2,
            "the child and the status are written: {seen:?}"
        );

        // A resync, a relist: the same primary, the same child, the same module.
        let action = reconcile(Trigger::Resync).await;
        assert_eq!(
            harness::module_calls(),
            1.0,
            "nothing changed since a call that asked for no requeue: the module is not called"
        );
        assert_eq!(requests(), written, "and nothing is written: {seen:?}");
        assert_ne!(action, Action::await_change(), "the resync stays scheduled");

        // The child changed: the module is called.
        cache.record(&watcher_apply(harness::child("8")));
        reconcile(Trigger::Resync).await;
        assert_eq!(
            harness::module_calls(),
            2.0,
            "a changed child calls the module"
        );
    }

    /// A reconcile's span gets its outcome in one `record_all` (the JSON log re-encodes the
    /// span's fields on each); one that ended on unchanged inputs says so in the same record.
    #[tokio::test]
    async fn a_finished_reconcile_records_its_outcome_once() {
        use crate::operations::fields::recorded::Records;
        use tracing_subscriber::layer::SubscriberExt as _;
        let (shared, _, _, _) = harness::named("unit-one-record", &harness::child("7")).await;
        let active = shared.slot.active();
        let key = ObjectKey::of(&harness::primary());
        let records = Records::default();
        let subscriber = tracing_subscriber::registry().with(records.clone());
        tracing::subscriber::with_default(subscriber, || {
            for unchanged in [true, false] {
                let span = reconcile_span(&shared.settings, &key, &active, &Trigger::Resync, 1);
                let done = Ok(Action::await_change());
                finished(
                    &shared,
                    &key,
                    &active,
                    &span,
                    (Duration::ZERO, unchanged),
                    &done,
                );
            }
        });
        let field = |name: &str, value: &str| (name.to_string(), value.to_string());
        let ok = [
            field("outcome", "\"ok\""),
            field("otel.status_code", "\"OK\""),
        ];
        let mut skipped = ok.to_vec();
        skipped.push(field("inputs.unchanged", "true"));
        assert_eq!(records.seen(), [skipped, ok.to_vec()]);
    }

    /// The loop guard of a Metacontroller hook synced on status changes
    /// ([`crate::controller::predicate::Changes::WithStatus`]): the host's own status write calls for one more
    /// reconcile; it calls the module (the primary changed), which answers the same status, and
    /// writes nothing, so no watch event follows and the chain ends there.
    #[tokio::test]
    async fn the_reconcile_after_the_hosts_own_status_write_writes_nothing() {
        const NAME: &str = "unit-status-sync";
        let (shared, cache, seen, bodies) = harness::named(NAME, &harness::child("7")).await;
        let reconcile = |primary: DynamicObject| {
            let shared = shared.clone();
            async move {
                let primary = Arc::new(harness::compact(&primary));
                let active = shared.slot.active();
                let key = ObjectKey::of(&*primary);
                let rv = primary.resource_version();
                shared
                    .states
                    .begin(&key, rv.as_deref(), active.module.sha256());
                run_once(&primary, &shared, &active, Trigger::PrimaryChanged, 1)
                    .await
                    .unwrap_or_else(|e| panic!("reconcile: {e}"))
                    .action
            }
        };
        let requests = || seen.lock().map(|s| s.len()).unwrap_or_default();
        let before = harness::primary();
        reconcile(before.clone()).await;
        assert_eq!(harness::module_calls_of(NAME), 1.0);
        let written_to = |path: &str| -> serde_json::Value {
            let body = bodies
                .lock()
                .unwrap_or_else(|e| panic!("{e}"))
                .iter()
                .find(|(request, _)| request.starts_with("PATCH ") && request.ends_with(path))
                .map(|(_, body)| body.clone())
                .unwrap_or_else(|| panic!("{path} is written: {seen:?}"));
            serde_json::from_slice(&body).unwrap_or_else(|e| panic!("the patch: {e}"))
        };

        // The child and the primary as their watches bring them back after the host's writes.
        let mut child: DynamicObject = serde_json::from_value(written_to("/configmaps/w-out"))
            .unwrap_or_else(|e| panic!("the child: {e}"));
        child.metadata.uid = Some("u-c".into());
        child.metadata.resource_version = Some("8".into());
        cache.record(&watcher_apply(child));
        let mut after = before.clone();
        after.data["status"] = written_to("/widgets/w/status")["status"].clone();
        after.metadata.resource_version = Some("6".into());
        let changes = crate::controller::predicate::Changes::WithStatus;
        assert_ne!(
            changes.fingerprint(&harness::lean(&before)),
            changes.fingerprint(&harness::lean(&after)),
            "the host's status write calls for a reconcile"
        );
        let written = requests();
        reconcile(after.clone()).await;
        assert_eq!(
            harness::module_calls_of(NAME),
            2.0,
            "the module is called: its primary's status changed"
        );
        assert_eq!(
            requests(),
            written,
            "it answers the same status, which is not written again: {seen:?}"
        );
        // Nothing written, no event; and a write that left the status as it was would call
        // for no reconcile either.
        let mut rewritten = after.clone();
        rewritten.metadata.resource_version = Some("7".into());
        assert_eq!(
            changes.fingerprint(&harness::lean(&after)),
            changes.fingerprint(&harness::lean(&rewritten))
        );
    }

    fn watcher_apply(o: DynamicObject) -> kube::runtime::watcher::Event<crate::lean::Lean> {
        kube::runtime::watcher::Event::Apply(harness::lean(&o))
    }

    #[test]
    fn outcomes_name_the_kind_of_failure() {
        assert_eq!(outcome(&Ok(Action::await_change())), "ok");
        assert_eq!(
            outcome(&Err(ReconcileError::Conflict("x".into()))),
            "conflict"
        );
        assert_eq!(
            outcome(&Err(ReconcileError::Join("x".into()))),
            "call_failed"
        );
    }
}
