//! The module's Events, published off the reconcile's path.
//!
//! A reconcile hands the Events its module asked for to the reconciler's [`EventLane`] and goes
//! on; one task per reconciler publishes them, in order, through kube-runtime's `Recorder`
//! (which turns a repeat into a patch of the Event's `series.count`), with the module's
//! identity. client-go's recorder works the same way (a queue per broadcaster, one goroutine
//! sending, dropping when full): under load the Events trail the writes convergence needs
//! instead of taking their turn in the API server's queue before them (issue 27).
//!
//! # Guarantees
//! - Never blocks a reconcile: [`EventLane::send`] queues the Event, or drops it when
//!   [`EVENT_QUEUE`] already wait; it never waits.
//! - Bounded: at most [`EVENT_QUEUE`] Events wait per reconciler (each note at most
//!   `intents::MAX_EVENT_NOTE` bytes), one is in flight at a time, and each publish is given
//!   [`PUBLISH_TIMEOUT`].
//! - An Event the API server could not take (no connection, no answer within the timeout, 429 or
//!   5xx) is tried again, up to [`PUBLISH_TRIES`] times in all, after [`RETRY_AFTER`], doubled
//!   after each try (about a minute in all): an API server that restarts or goes away for a
//!   while loses none of them. The lane waits meanwhile, so the order is kept; what arrives
//!   meanwhile waits in the queue, within its bound. client-go's recorder retries such an
//!   Event too (12 tries, 10 s apart).
//! - `wasmop_module_events_queued` says how many wait or are in flight, per reconciler.
//! - Every Event handed over is counted once in `wasmop_module_events_total{result}`:
//!   `published`, `failed` (refused, or not taken in [`PUBLISH_TRIES`] tries; logged at warn
//!   with the reason), or `dropped` (the queue was full, or the reconciler stopped before it
//!   was sent).
//! - [`EventLane::close`] publishes what is queued, within [`FLUSH_GRACE`], when the reconciler
//!   stops; what is left then is dropped and counted.
//!
//! - An Event refused by RBAC (403) is reported to the reconciler's [`Health`] until an Event
//!   is published again: the WasmReconciler shows `Degraded=True`, reason `Forbidden`.
//! - A publish scans about 1/[`RECORDERS`] of the Events the lane published in the last six
//!   minutes, not all of them: kube-runtime's `Recorder` drops its expired entries on every
//!   publish by scanning its whole cache, so a lane publishes through [`RECORDERS`] of them, each
//!   for the objects whose reference hashes to it ([`Recorders`]). An object's Events all go
//!   through one, so a repeat is still a patch of its series. `make bench-event-publish`: 19
//!   against 771 us per publish after 20,000 Events.
//!
//! # Caveats
//! - A failed Event does not fail the reconcile or hold the finalizer back (before issue 27 it
//!   did): Events are reports, not intents. Only a 403 degrades the reconciler; a timeout or
//!   another error shows in the log and in `result="failed"`.
//! - A refused Event (403, 422 and any other answer but 429 and 5xx) is not retried, as
//!   client-go's recorder does not retry it: the Events refused before the grant are lost, and
//!   the condition clears with the module's next Event, not with the grant itself.
//! - A try that timed out may have been stored all the same: its retry may then record the
//!   Event twice. A report twice beats a report lost.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder, Reporter};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::health::Health;
use crate::operations::metrics;

/// How many Events may wait per reconciler.
pub const EVENT_QUEUE: usize = 1024;

/// How long one publish may take.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`EventLane::close`] publishes what is queued.
pub const FLUSH_GRACE: Duration = Duration::from_secs(5);

/// How many times one Event is tried when the API server could not take it.
pub const PUBLISH_TRIES: u32 = 6;

/// The wait after the first try that the API server could not take; doubled after each later
/// one (2 + 4 + 8 + 16 + 32 s).
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// The bounds of a lane.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// How many Events may wait ([`EVENT_QUEUE`]).
    pub queue: usize,
    /// How long one publish may take ([`PUBLISH_TIMEOUT`]).
    pub publish: Duration,
    /// How long [`EventLane::close`] publishes what is queued ([`FLUSH_GRACE`]).
    pub flush: Duration,
    /// How many times one Event is tried ([`PUBLISH_TRIES`]; 1: never again).
    pub tries: u32,
    /// The wait after the first failed try, doubled after each later one ([`RETRY_AFTER`]).
    pub retry_after: Duration,
}

/// How many `Recorder`s a lane publishes through ([`Recorders`]).
pub const RECORDERS: usize = 64;

/// The `Recorder`s of a lane, each publishing the Events of the objects whose reference hashes
/// to it.
///
/// # Guarantees
/// - All Events about one object (kind, namespace, name, uid) go through the same `Recorder`,
///   whose cache turns a repeat into a patch of the Event's series, as one `Recorder` does.
/// - Each publish scans only its `Recorder`'s cache: about 1/[`RECORDERS`] of the Events the
///   lane published in the `Recorder`'s time to live.
#[derive(Clone)]
pub struct Recorders(Arc<[Recorder]>);

impl std::fmt::Debug for Recorders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorders")
            .field("count", &self.0.len())
            .finish_non_exhaustive()
    }
}

impl Recorders {
    /// [`RECORDERS`] recorders publishing with `client` as `reporter`.
    pub fn new(client: &kube::Client, reporter: &Reporter) -> Recorders {
        Recorders::with_count(client, reporter, RECORDERS)
    }

    /// `count` recorders (at least one) publishing with `client` as `reporter`.
    pub fn with_count(client: &kube::Client, reporter: &Reporter, count: usize) -> Recorders {
        Recorders(
            (0..count.max(1))
                .map(|_| Recorder::new(client.clone(), reporter.clone()))
                .collect(),
        )
    }

    /// Publishes `event` about `regarding` through the recorder of that object.
    ///
    /// # Errors
    /// As kube-runtime's `Recorder::publish`: the API server's refusal or the client's error.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        self.of(regarding).publish(event, regarding).await
    }

    /// The recorder of the object `regarding` names.
    fn of(&self, regarding: &ObjectReference) -> &Recorder {
        let mut h = std::hash::DefaultHasher::new();
        (
            &regarding.api_version,
            &regarding.kind,
            &regarding.namespace,
            &regarding.name,
            &regarding.uid,
        )
            .hash(&mut h);
        // The remainder is below the slice's length, which is a usize.
        let i = usize::try_from(h.finish() % self.0.len() as u64).unwrap_or(0);
        &self.0[i]
    }
}

/// An Event and what it is about.
type Queued = (Event, ObjectReference);

/// A reconciler's queue of Events and the task publishing them.
#[derive(Clone)]
pub struct EventLane {
    queue: mpsc::Sender<Queued>,
    closing: Arc<watch::Sender<bool>>,
    worker: Arc<Mutex<Option<JoinHandle<()>>>>,
    /// Events queued or in flight.
    pending: Arc<AtomicUsize>,
    /// `wasmop_module_events_queued`: raised and lowered with `pending`.
    queued: Gauge,
    flush_grace: Duration,
    reconciler: Arc<str>,
}

impl std::fmt::Debug for EventLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLane")
            .field("reconciler", &self.reconciler)
            .finish_non_exhaustive()
    }
}

impl EventLane {
    /// A lane publishing through `recorders` for `reconciler`, its task started, reporting
    /// Events refused by RBAC to `health`. Must be called within a tokio runtime.
    pub fn start(recorders: Recorders, reconciler: &str, health: Arc<Health>) -> EventLane {
        let bounds = Bounds {
            queue: EVENT_QUEUE,
            publish: PUBLISH_TIMEOUT,
            flush: FLUSH_GRACE,
            tries: PUBLISH_TRIES,
            retry_after: RETRY_AFTER,
        };
        EventLane::bounded(recorders, reconciler, health, bounds)
    }

    /// [`EventLane::start`] with other bounds.
    pub fn bounded(
        recorders: Recorders,
        reconciler: &str,
        health: Arc<Health>,
        bounds: Bounds,
    ) -> EventLane {
        let capacity = bounds.queue;
        let (queue, rx) = mpsc::channel(capacity);
        let (closing, closed) = watch::channel(false);
        let reconciler: Arc<str> = reconciler.into();
        let pending = Arc::new(AtomicUsize::new(0));
        let queued = metrics::global().module_events_queued(&reconciler);
        let publisher = Publisher {
            recorders,
            health,
            reconciler: reconciler.clone(),
            pending: pending.clone(),
            queued: queued.clone(),
            timeout: bounds.publish,
            tries: bounds.tries.max(1),
            retry_after: bounds.retry_after,
        };
        let worker = tokio::spawn(publisher.run(rx, closed));
        EventLane {
            queue,
            closing: Arc::new(closing),
            worker: Arc::new(Mutex::new(Some(worker))),
            pending,
            queued,
            flush_grace: bounds.flush,
            reconciler,
        }
    }

    /// Queues `event` about `regarding`; false when it was dropped (the queue is full or the
    /// lane closed). Never waits.
    pub fn send(&self, event: Event, regarding: ObjectReference) -> bool {
        // Counted before it is queued, so the publisher never takes it below zero.
        self.pending.fetch_add(1, Ordering::Relaxed);
        self.queued.inc();
        let queued = self.queue.try_send((event, regarding)).is_ok();
        if !queued {
            self.pending.fetch_sub(1, Ordering::Relaxed);
            self.queued.dec();
            counted(&self.reconciler, "dropped");
        }
        queued
    }

    /// Stops taking Events and publishes those queued, within [`FLUSH_GRACE`]; the rest are
    /// dropped and counted. Later calls return at once.
    pub async fn close(&self) {
        self.closing.send_replace(true);
        let worker = self.worker.lock().ok().and_then(|mut w| w.take());
        let Some(mut worker) = worker else { return };
        if tokio::time::timeout(self.flush_grace, &mut worker)
            .await
            .is_err()
        {
            worker.abort();
            // Stopped at its next await: it counts nothing more.
            let _ = worker.await;
            let left = self.pending.swap(0, Ordering::Relaxed);
            self.queued.dec_by(i64::try_from(left).unwrap_or(i64::MAX));
            tracing::warn!(reconciler = %self.reconciler, left, "Events still queued after the flush grace; dropped");
            for _ in 0..left {
                counted(&self.reconciler, "dropped");
            }
        }
    }
}

/// The lane's task: publishes through `recorders`, counting each outcome and reporting RBAC's
/// refusals to `health`.
struct Publisher {
    recorders: Recorders,
    health: Arc<Health>,
    reconciler: Arc<str>,
    pending: Arc<AtomicUsize>,
    queued: Gauge,
    timeout: Duration,
    tries: u32,
    retry_after: Duration,
}

/// A try that did not publish its Event.
struct Failed {
    error: String,
    /// Whether another try may succeed.
    transient: bool,
}

impl Publisher {
    /// Publishes every Event of `rx`, one at a time, until every lane handle is gone or
    /// `closed` turns true and the queue is empty.
    async fn run(self, mut rx: mpsc::Receiver<Queued>, mut closed: watch::Receiver<bool>) {
        loop {
            let next = tokio::select! {
                biased;
                next = rx.recv() => next,
                // Closing (or every handle gone): what is queued is still received, then None.
                _ = closed.changed() => {
                    rx.close();
                    continue;
                }
            };
            let Some((event, regarding)) = next else {
                return;
            };
            let result = self.publish(&event, &regarding).await;
            self.pending.fetch_sub(1, Ordering::Relaxed);
            self.queued.dec();
            counted(&self.reconciler, result);
        }
    }

    /// Publishes one Event, trying it again while the API server could not take it:
    /// `published` or `failed` (logged; a 403 reported to the reconciler's health, which the
    /// next published Event clears).
    async fn publish(&self, event: &Event, regarding: &ObjectReference) -> &'static str {
        let mut wait = self.retry_after;
        let mut tries = 1;
        let failed = loop {
            match self.try_publish(event, regarding).await {
                Ok(()) => {
                    self.health.record_events(None);
                    return "published";
                }
                Err(failed) if failed.transient && tries < self.tries => {
                    tracing::debug!(reconciler = %self.reconciler, reason = %event.reason,
                        tries, error = %failed.error, "the module's Event is tried again");
                    tokio::time::sleep(wait).await;
                    wait = wait.saturating_mul(2);
                    tries += 1;
                }
                Err(failed) => break failed,
            }
        };
        tracing::warn!(
            reconciler = %self.reconciler,
            reason = %event.reason,
            object = regarding.name.as_deref().unwrap_or_default(),
            namespace = regarding.namespace.as_deref().unwrap_or_default(),
            tries,
            error = %failed.error,
            "cannot publish the module's Event"
        );
        "failed"
    }

    /// One try, bounded by its timeout; a 403 is reported to the reconciler's health.
    async fn try_publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), Failed> {
        let publish = self.recorders.publish(event, regarding);
        match tokio::time::timeout(self.timeout, publish).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                if let kube::Error::Api(status) = &e
                    && status.is_forbidden()
                {
                    self.health.record_events(Some(status.message.clone()));
                }
                Err(Failed {
                    transient: not_taken(&e),
                    error: e.to_string(),
                })
            }
            Err(_) => Err(Failed {
                error: format!("no answer within {:?}", self.timeout),
                transient: true,
            }),
        }
    }
}

/// Whether `error` says the API server did not take the request, rather than refused it: no
/// connection or a broken one, 429 or 5xx.
fn not_taken(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

fn counted(reconciler: &str, result: &str) {
    metrics::global().module_event(reconciler, result);
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use kube::Client;
    use kube::client::Body;
    use kube::runtime::events::{EventType, Reporter};
    use tower::BoxError;

    use super::*;

    /// How the fake API server answers an Event's create.
    #[derive(Clone, Copy)]
    enum Answer {
        /// 201 with the Event.
        Created,
        /// 403.
        Forbidden,
        /// 403 to the first request, then 201.
        ForbiddenOnce,
        /// No connection for the first request, then 201.
        UnreachableOnce,
        /// 503 to the first request, then 201.
        UnavailableOnce,
        /// Never.
        Never,
    }

    /// A client whose API server answers every request as `answer`, counting the requests
    /// received in `seen`.
    fn client(answer: Answer, seen: watch::Sender<usize>) -> Client {
        let seen = Arc::new(seen);
        let service = tower::service_fn(move |req: http::Request<Body>| {
            let seen = seen.clone();
            async move {
                let body = req.into_body().collect().await?.to_bytes().to_vec();
                seen.send_modify(|n| *n += 1);
                let first = *seen.borrow() == 1;
                let (status, body) = match answer {
                    Answer::Created => (201, body),
                    Answer::ForbiddenOnce | Answer::UnreachableOnce | Answer::UnavailableOnce
                        if !first =>
                    {
                        (201, body)
                    }
                    Answer::UnreachableOnce => return Err("connection refused".into()),
                    Answer::UnavailableOnce => (
                        503,
                        serde_json::to_vec(&serde_json::json!({"kind": "Status",
                            "apiVersion": "v1", "status": "Failure", "reason": "ServiceUnavailable",
                            "code": 503, "message": "the server is shutting down"}))?,
                    ),
                    Answer::Forbidden | Answer::ForbiddenOnce => (
                        403,
                        serde_json::to_vec(&serde_json::json!({"kind": "Status",
                            "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
                            "code": 403, "message": "events.events.k8s.io is forbidden"}))?,
                    ),
                    Answer::Never => std::future::pending().await,
                };
                Ok::<_, BoxError>(
                    http::Response::builder()
                        .status(status)
                        .body(Body::from(body))?,
                )
            }
        });
        Client::new(service, "default")
    }

    /// Short enough for a test that waits them out; the outcomes do not depend on them.
    const SHORT: Duration = Duration::from_millis(100);

    /// Tries per Event in these tests: more than one, so that "not tried again" can fail.
    const TRIES: u32 = 3;

    fn lane(
        reconciler: &str,
        answer: Answer,
        capacity: usize,
    ) -> (EventLane, watch::Receiver<usize>) {
        reporting(reconciler, answer, capacity, Arc::default())
    }

    /// [`lane`], reporting to `health`.
    fn reporting(
        reconciler: &str,
        answer: Answer,
        capacity: usize,
        health: Arc<Health>,
    ) -> (EventLane, watch::Receiver<usize>) {
        let (seen, requests) = watch::channel(0);
        let reporter = Reporter {
            controller: format!("wasmop/{reconciler}"),
            instance: None,
        };
        let recorders = Recorders::new(&client(answer, seen), &reporter);
        let bounds = Bounds {
            queue: capacity,
            publish: SHORT,
            flush: SHORT,
            tries: TRIES,
            retry_after: SHORT,
        };
        (
            EventLane::bounded(recorders, reconciler, health, bounds),
            requests,
        )
    }

    fn event(reason: &str) -> (Event, ObjectReference) {
        let event = Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some("a note".into()),
            action: "Testing".into(),
            secondary: None,
        };
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            namespace: Some("default".into()),
            name: Some("one".into()),
            ..ObjectReference::default()
        };
        (event, regarding)
    }

    /// `wasmop_module_events_total` of `reconciler` by result: published, failed, dropped.
    fn counts(reconciler: &str) -> [u64; 3] {
        let text = metrics::encode().unwrap_or_default();
        ["published", "failed", "dropped"].map(|result| {
            let prefix = format!(
                "wasmop_module_events_total{{reconciler=\"{reconciler}\",result=\"{result}\"}} "
            );
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        })
    }

    /// `wasmop_module_events_queued` of `reconciler`.
    fn queued(reconciler: &str) -> Option<u64> {
        let text = metrics::encode().unwrap_or_default();
        let prefix = format!("wasmop_module_events_queued{{reconciler=\"{reconciler}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
    }

    #[tokio::test]
    async fn an_objects_repeated_event_patches_its_series_whichever_recorder_it_hashes_to() {
        // Every request's method and the object it is about, in order; 201 echoing the body.
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let service = tower::service_fn(move |req: http::Request<Body>| {
            let log = log.clone();
            async move {
                let method = req.method().to_string();
                let body = req.into_body().collect().await?.to_bytes().to_vec();
                let sent: serde_json::Value = serde_json::from_slice(&body)?;
                let name = sent["regarding"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                log.lock().expect("the log").push((method, name));
                Ok::<_, BoxError>(
                    http::Response::builder()
                        .status(201)
                        .body(Body::from(body))?,
                )
            }
        });
        let reporter = Reporter {
            controller: "wasmop/emit-series".into(),
            instance: None,
        };
        let recorders = Recorders::new(&Client::new(service, "default"), &reporter);
        let bounds = Bounds {
            queue: 128,
            publish: Duration::from_secs(30),
            flush: Duration::from_secs(60),
            tries: 1,
            retry_after: SHORT,
        };
        let lane = EventLane::bounded(recorders, "emit-series", Arc::default(), bounds);
        // 40 objects, spread over the recorders by their hashes (deterministic: the hasher's
        // keys are fixed); not a multiple of the recorders, so a recorder chosen by turn would
        // not serve an object's second Event.
        for round in 0..2 {
            for i in 0..40 {
                let (e, mut r) = event("Repeated");
                r.name = Some(format!("object-{i}"));
                assert!(lane.send(e, r), "round {round}, object {i}");
            }
        }
        lane.close().await;
        let seen = seen.lock().expect("the log").clone();
        assert_eq!(seen.len(), 80, "{seen:?}");
        for i in 0..40 {
            let name = format!("object-{i}");
            let methods: Vec<&str> = seen
                .iter()
                .filter(|(_, n)| *n == name)
                .map(|(m, _)| m.as_str())
                .collect();
            assert_eq!(
                methods,
                ["POST", "PATCH"],
                "{name}: created, then its series patched"
            );
        }
        assert_eq!(counts("emit-series"), [80, 0, 0]);
    }

    #[tokio::test]
    async fn close_publishes_every_event_queued_in_order() {
        let (lane, mut requests) = lane("emit-close", Answer::Created, 8);
        for reason in ["First", "Second", "Third"] {
            let (e, r) = event(reason);
            assert!(lane.send(e, r));
        }
        lane.close().await;
        assert_eq!(*requests.borrow_and_update(), 3);
        assert_eq!(counts("emit-close"), [3, 0, 0]);
        assert_eq!(
            queued("emit-close"),
            Some(0),
            "none waits once they are published"
        );
        // Closed: nothing more is taken, and the drop is counted.
        let (e, r) = event("Late");
        assert!(!lane.send(e, r));
        assert_eq!(counts("emit-close"), [3, 0, 1]);
        lane.close().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_queued_gauge_ends_at_zero_however_sends_and_publishes_interleave() {
        let (lane, _) = lane("emit-gauge", Answer::Created, 4096);
        let senders: Vec<_> = (0..4)
            .map(|_| {
                let lane = lane.clone();
                tokio::spawn(async move {
                    for _ in 0..500 {
                        let (e, r) = event("Many");
                        lane.send(e, r);
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        for sender in senders {
            sender.await.ok();
        }
        lane.close().await;
        let [published, failed, dropped] = counts("emit-gauge");
        assert_eq!(published + failed + dropped, 2000);
        assert_eq!(
            queued("emit-gauge"),
            Some(0),
            "every Event counted out again"
        );
    }

    #[tokio::test]
    async fn send_never_waits_and_drops_what_the_queue_cannot_hold() {
        let (lane, mut requests) = lane("emit-full", Answer::Never, 2);
        let (e, r) = event("InFlight");
        assert!(lane.send(e, r));
        // The first Event is in flight (its request is stuck), so the queue holds two more.
        requests.wait_for(|n| *n == 1).await.ok();
        let sent: Vec<bool> = ["Queued", "Queued", "Dropped"]
            .into_iter()
            .map(|reason| {
                let (e, r) = event(reason);
                lane.send(e, r)
            })
            .collect();
        assert_eq!(sent, [true, true, false]);
        assert_eq!(counts("emit-full"), [0, 0, 1]);
        assert_eq!(queued("emit-full"), Some(3), "one in flight, two queued");
    }

    #[tokio::test]
    async fn close_gives_up_after_the_flush_grace_and_counts_what_is_left() {
        let (lane, mut requests) = lane("emit-stuck", Answer::Never, 4);
        for reason in ["InFlight", "Left"] {
            let (e, r) = event(reason);
            assert!(lane.send(e, r));
        }
        requests.wait_for(|n| *n == 1).await.ok();
        // The publish timeout is as long as the grace: the first Event may fail before the
        // grace ends; either way each Event is counted once, and none published.
        lane.close().await;
        let [published, failed, dropped] = counts("emit-stuck");
        assert_eq!((published, failed + dropped), (0, 2));
    }

    #[tokio::test]
    async fn a_refused_event_is_counted_as_failed_once_and_not_retried() {
        let (lane, mut requests) = lane("emit-forbidden", Answer::Forbidden, 4);
        let (e, r) = event("Refused");
        assert!(lane.send(e, r));
        lane.close().await;
        assert_eq!(*requests.borrow_and_update(), 1);
        assert_eq!(counts("emit-forbidden"), [0, 1, 0]);
    }

    #[tokio::test]
    async fn an_event_the_api_server_could_not_take_is_tried_again_and_published() {
        for (reconciler, answer) in [
            ("emit-unreachable", Answer::UnreachableOnce),
            ("emit-unavailable", Answer::UnavailableOnce),
        ] {
            let (lane, mut requests) = lane(reconciler, answer, 4);
            let (e, r) = event("Kept");
            assert!(lane.send(e, r));
            // The second try is the one that succeeds (a generous bound: a missing try fails,
            // not hangs).
            let second = requests.wait_for(|n| *n == 2);
            let tried = tokio::time::timeout(Duration::from_secs(60), second)
                .await
                .is_ok();
            assert!(tried, "{reconciler}: the Event was not tried again");
            lane.close().await;
            assert_eq!(*requests.borrow_and_update(), 2, "{reconciler}");
            assert_eq!(counts(reconciler), [1, 0, 0], "{reconciler}");
        }
    }

    #[tokio::test]
    async fn a_refused_event_degrades_the_reconciler_until_an_event_is_published() {
        let health = Arc::new(Health::default());
        let (lane, mut requests) = reporting("emit-rbac", Answer::ForbiddenOnce, 4, health.clone());
        let refused = |h: &Health| h.events_refused.lock().ok().and_then(|r| r.clone());
        let (e, r) = event("Refused");
        assert!(lane.send(e, r));
        // Told once the refusal is recorded (a generous bound: a missing report fails, not hangs).
        let told = tokio::time::timeout(Duration::from_secs(60), health.changed.notified()).await;
        assert!(told.is_ok(), "the refusal was never reported to the health");
        let message = refused(&health).unwrap_or_default();
        assert!(message.contains("forbidden"), "{message}");
        let (e, r) = event("Published");
        assert!(lane.send(e, r));
        lane.close().await;
        assert_eq!(*requests.borrow_and_update(), 2);
        assert_eq!(refused(&health), None, "the published Event clears it");
        assert_eq!(counts("emit-rbac"), [1, 1, 0]);
    }

    #[tokio::test]
    async fn an_event_that_fails_otherwise_does_not_degrade_the_reconciler() {
        let health = Arc::new(Health::default());
        let (lane, _) = reporting("emit-slow", Answer::Never, 4, health.clone());
        let (e, r) = event("Unanswered");
        assert!(lane.send(e, r));
        lane.close().await;
        assert_eq!(counts("emit-slow")[0], 0);
        let refused = health.events_refused.lock().ok().and_then(|r| r.clone());
        assert_eq!(refused, None);
    }

    #[tokio::test]
    async fn a_publish_that_gets_no_answer_fails_after_its_tries_and_the_next_goes_on() {
        let (lane, mut requests) = lane("emit-timeout", Answer::Never, 4);
        for reason in ["Unanswered", "Next"] {
            let (e, r) = event(reason);
            assert!(lane.send(e, r));
        }
        // Each try of the first Event times out; the next Event's request follows its last.
        requests.wait_for(|n| *n == TRIES as usize + 1).await.ok();
        assert_eq!(counts("emit-timeout")[1], 1);
    }
}
