//! The host's Prometheus metrics (process-wide, like a default registry): reconciles, the work
//! queue, module calls, hot swaps and admission reviews, each labelled with the WasmReconciler.
//!
//! [`global`] is the one registry; [`encode`] renders it in the OpenMetrics text format that
//! [`crate::operations::probes`] serves on `/metrics`. Every metric and its exact semantics are listed in
//! `docs/operating.md` (section "Metrics").
//!
//! # Guarantees
//! - Recording never blocks on I/O and never fails; a poisoned lock only loses the label
//!   bookkeeping of [`Metrics::module_active`], never a count.
//! - `wasmop_module_info{reconciler,sha256}` holds exactly one series per serving reconciler: the
//!   previous digest's series is removed when a module is swapped in or the reconciler stops.
//!
//! # Errors
//! [`MetricsError`] only when the registry cannot be rendered (a formatting error).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The content type of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A failure to render the metrics.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The text encoder failed.
    #[error("cannot encode the metrics: {0}")]
    Encode(#[from] std::fmt::Error),
}

/// `{reconciler}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcilerLabel {
    /// The WasmReconciler's name.
    pub reconciler: String,
}

/// `{reconciler, result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// The WasmReconciler's name.
    pub reconciler: String,
    /// `ok` or `error` (reconciles); `swapped`, `unchanged`, `refused`, `rolled_back` (swaps).
    pub result: String,
}

/// `{reconciler, function}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// The WasmReconciler's name.
    pub reconciler: String,
    /// `reconcile`, `finalize`, `validate` or `dry_run`.
    pub function: String,
}

/// `{reconciler, allowed}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// The WasmReconciler's name.
    pub reconciler: String,
    /// `true` or `false`.
    pub allowed: String,
}

/// `{reconciler, webhook}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    /// The WasmReconciler's name.
    pub reconciler: String,
    /// `validate` or `finalizer`.
    pub webhook: String,
}

/// `{reconciler, sha256}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModuleLabels {
    /// The WasmReconciler's name.
    pub reconciler: String,
    /// The active module's digest (hex).
    pub sha256: String,
}

/// `{reconciler, kind}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    /// The WasmReconciler's name.
    pub reconciler: String,
    /// The watched kind, `apiVersion/kind`.
    pub kind: String,
}

/// `{reconciler, lane}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneLabels {
    /// The WasmReconciler's name.
    pub reconciler: String,
    /// `reactive` or `timed` (see [`crate::controller::priority::Lane`]).
    pub lane: String,
}

/// `{server}`: `admission` or `probes`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServerLabel {
    /// The server.
    pub server: String,
}

/// `{server, reason}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    /// The server.
    pub server: String,
    /// `connections` (the connection cap), `reviews` (the concurrent-review cap), `unknown`
    /// (a path, method or reconciler this host does not serve), `not_ready` (WasmReconcilers
    /// not listed yet), `too_large` (a body over 8 MiB), `timeout` (no TLS handshake or body
    /// within the read timeout).
    pub reason: String,
}

/// `{component}`: a readiness component (`startup`, `admission`, `api-server`, `manager`,
/// `reconciler/<name>`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ComponentLabel {
    /// The component, as `/readyz` names it.
    pub component: String,
}

type Hist<L> = Family<L, Histogram, fn() -> Histogram>;

fn seconds_buckets() -> Histogram {
    // 0.5 ms .. ~16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// One running reconcile in `wasmop_reconcile_active` (see [`Metrics::active`]).
#[derive(Debug)]
#[must_use = "the reconcile counts as active only while the guard lives"]
pub struct ActiveGuard(Gauge);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Every metric of the host.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconcile: Family<ResultLabels, Counter>,
    reconcile_errors: Family<ReconcilerLabel, Counter>,
    reconcile_skipped: Family<ReconcilerLabel, Counter>,
    reconcile_duration: Hist<ReconcilerLabel>,
    reconcile_active: Family<ReconcilerLabel, Gauge>,
    queue_depth: Family<ReconcilerLabel, Gauge>,
    queue_adds: Family<ReconcilerLabel, Counter>,
    queue_retries: Family<ReconcilerLabel, Counter>,
    queue_waiting: Family<LaneLabels, Gauge>,
    call_duration: Hist<CallLabels>,
    instantiate_duration: Hist<ReconcilerLabel>,
    memory_peak: Family<ReconcilerLabel, Gauge>,
    hotswap: Family<ResultLabels, Counter>,
    admission: Family<AdmissionLabels, Counter>,
    admission_errors: Family<ReconcilerLabel, Counter>,
    admission_duration: Hist<WebhookLabels>,
    finalizers_added: Family<ReconcilerLabel, Counter>,
    module_events: Family<ResultLabels, Counter>,
    module_events_queued: Family<ReconcilerLabel, Gauge>,
    module_info: Family<ModuleLabels, Gauge>,
    leader: Gauge,
    server_connections: Family<ServerLabel, Gauge>,
    server_rejected: Family<RejectLabels, Counter>,
    cache_objects: Family<CacheLabels, Gauge>,
    reconcile_limit: Gauge,
    component_ready: Family<ComponentLabel, Gauge>,
    webhook_cert_expiry: Gauge,
    active_sha: Mutex<HashMap<String, String>>,
    shards: ShardMetrics,
}

fn label(reconciler: &str) -> ReconcilerLabel {
    ReconcilerLabel {
        reconciler: reconciler.to_string(),
    }
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            reconcile: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_skipped: Family::default(),
            reconcile_duration: Family::new_with_constructor(seconds_buckets),
            reconcile_active: Family::default(),
            queue_depth: Family::default(),
            queue_adds: Family::default(),
            queue_retries: Family::default(),
            queue_waiting: Family::default(),
            call_duration: Family::new_with_constructor(seconds_buckets),
            instantiate_duration: Family::new_with_constructor(seconds_buckets),
            memory_peak: Family::default(),
            hotswap: Family::default(),
            admission: Family::default(),
            admission_errors: Family::default(),
            admission_duration: Family::new_with_constructor(seconds_buckets),
            finalizers_added: Family::default(),
            module_events: Family::default(),
            module_events_queued: Family::default(),
            module_info: Family::default(),
            leader: Gauge::default(),
            server_connections: Family::default(),
            server_rejected: Family::default(),
            cache_objects: Family::default(),
            reconcile_limit: Gauge::default(),
            component_ready: Family::default(),
            webhook_cert_expiry: Gauge::default(),
            active_sha: Mutex::default(),
            shards: ShardMetrics::default(),
            registry: Registry::default(),
        };
        m.shards.register(&mut registry);
        // Counters are registered without `_total`; the encoder appends it.
        registry.register(
            "wasmop_reconcile",
            "Reconciles finished, by result (ok, error)",
            m.reconcile.clone(),
        );
        registry.register(
            "wasmop_reconcile_errors",
            "Reconciles that failed (module error, refused intents, write failure, conflict)",
            m.reconcile_errors.clone(),
        );
        registry.register(
            "wasmop_reconcile_skipped",
            "Reconciles that did not call the module: its inputs (primary, children, related objects, config, module) were those of a call that succeeded and asked for no requeue",
            m.reconcile_skipped.clone(),
        );
        registry.register(
            "wasmop_reconcile_duration_seconds",
            "Wall time of one reconcile: module call, validation and writes",
            m.reconcile_duration.clone(),
        );
        registry.register(
            "wasmop_reconcile_active",
            "Reconciles running now",
            m.reconcile_active.clone(),
        );
        registry.register(
            "wasmop_workqueue_depth",
            "Objects whose reconcile was requested (by a watch event, a child or related change or a module swap) and has not started yet",
            m.queue_depth.clone(),
        );
        registry.register(
            "wasmop_workqueue_adds",
            "Reconcile requests: watch-event triggers, module-swap re-reconciles and scheduled requeues (after success or failure)",
            m.queue_adds.clone(),
        );
        registry.register(
            "wasmop_workqueue_retries",
            "Requeues after a failed reconcile (with backoff)",
            m.queue_retries.clone(),
        );
        registry.register(
            "wasmop_workqueue_waiting",
            "Reconciles handed over by the work queue and waiting for one of the reconciler's concurrency permits, by lane (reactive: a change; timed: requeue-after or resync)",
            m.queue_waiting.clone(),
        );
        registry.register(
            "wasmop_module_call_duration_seconds",
            "Wall time of one module function call (without instantiation), by function",
            m.call_duration.clone(),
        );
        registry.register(
            "wasmop_module_instantiate_duration_seconds",
            "Time to create a fresh sandbox (store and instance) for one call",
            m.instantiate_duration.clone(),
        );
        registry.register(
            "wasmop_module_memory_peak_bytes",
            "The highest linear-memory size any call of the reconciler's modules reached",
            m.memory_peak.clone(),
        );
        registry.register(
            "wasmop_hotswap",
            "Module changes seen in the ConfigMap, by result (swapped, unchanged, refused, rolled_back)",
            m.hotswap.clone(),
        );
        registry.register(
            "wasmop_admission_reviews",
            "Admission reviews answered, by verdict",
            m.admission.clone(),
        );
        registry.register(
            "wasmop_admission_review_duration_seconds",
            "Time from a review's request head to its answer, by webhook (validate, finalizer); the body's read and parse included",
            m.admission_duration.clone(),
        );
        registry.register(
            "wasmop_admission_errors",
            "Admission reviews whose module call failed or timed out (answered by the failure policy)",
            m.admission_errors.clone(),
        );
        registry.register(
            "wasmop_finalizers_added",
            "Primaries the finalizer webhook gave their reconciler's finalizer as they were created",
            m.finalizers_added.clone(),
        );
        registry.register(
            "wasmop_module_events",
            "Events the modules asked for, by result (published, failed, dropped)",
            m.module_events.clone(),
        );
        registry.register(
            "wasmop_module_events_queued",
            "Events the modules asked for that wait to be published or are being published",
            m.module_events_queued.clone(),
        );
        registry.register(
            "wasmop_module_info",
            "1 for the module serving each reconciler",
            m.module_info.clone(),
        );
        registry.register(
            "wasmop_leader",
            "1 while this process holds the leader lease (or runs without leader election)",
            m.leader.clone(),
        );
        registry.register(
            "wasmop_server_connections",
            "Connections open now on the admission and probe servers",
            m.server_connections.clone(),
        );
        registry.register(
            "wasmop_server_rejected",
            "Connections and requests the admission and probe servers refused before doing any work, by reason",
            m.server_rejected.clone(),
        );
        registry.register(
            "wasmop_cache_objects",
            "Objects in a reconciler's watch cache, by kind (only the namespaces in its scope are watched)",
            m.cache_objects.clone(),
        );
        registry.register(
            "wasmop_reconcile_limit",
            "The host-wide bound on reconciles at once (--max-concurrent-reconciles)",
            m.reconcile_limit.clone(),
        );
        registry.register(
            "wasmop_component_ready",
            "1 when a readiness component is ready (its caches listed and synced), 0 while it is pending",
            m.component_ready.clone(),
        );
        registry.register(
            "wasmop_webhook_certificate_expiry_timestamp_seconds",
            "When the webhook's serving certificate expires (Unix seconds), as last loaded",
            m.webhook_cert_expiry.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Readiness component `component` is ready (`Some(true)`), pending (`Some(false)`) or gone
    /// (`None`: its series is removed).
    pub fn component_ready(&self, component: &str, ready: Option<bool>) {
        let label = ComponentLabel {
            component: component.to_string(),
        };
        match ready {
            Some(ready) => {
                self.component_ready
                    .get_or_create(&label)
                    .set(i64::from(ready));
            }
            None => {
                self.component_ready.remove(&label);
            }
        }
    }

    /// The webhook's serving certificate (as last loaded) expires at `unix_seconds`.
    pub fn webhook_certificate_expiry(&self, unix_seconds: i64) {
        self.webhook_cert_expiry.set(unix_seconds);
    }

    /// A connection of `server` opened (`delta` 1) or closed (-1).
    pub fn server_connection(&self, server: &str, delta: i64) {
        self.server_connections
            .get_or_create(&ServerLabel {
                server: server.to_string(),
            })
            .inc_by(delta);
    }

    /// `server` refused a connection or request for `reason`.
    pub fn server_rejected(&self, server: &str, reason: &str) {
        self.server_rejected
            .get_or_create(&RejectLabels {
                server: server.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// One finished reconcile.
    pub fn reconciled(&self, reconciler: &str, ok: bool, elapsed: Duration) {
        self.reconcile
            .get_or_create(&ResultLabels {
                reconciler: reconciler.to_string(),
                result: if ok { "ok" } else { "error" }.into(),
            })
            .inc();
        if !ok {
            self.reconcile_errors
                .get_or_create(&label(reconciler))
                .inc();
        }
        self.reconcile_duration
            .get_or_create(&label(reconciler))
            .observe(elapsed.as_secs_f64());
    }

    /// A reconcile that did not call the module: its inputs had not changed.
    pub fn reconcile_skipped(&self, reconciler: &str) {
        self.reconcile_skipped
            .get_or_create(&label(reconciler))
            .inc();
    }

    /// A reconcile of `reconciler` starts: `wasmop_reconcile_active` is raised now and lowered
    /// when the guard drops.
    ///
    /// Guarantees: lowered however the reconcile ends, a future dropped mid-call included (a
    /// controller aborted, a host dropped); drop it after [`Metrics::reconciled`], so a gauge at
    /// 0 means every finished reconcile is counted.
    pub fn active(&self, reconciler: &str) -> ActiveGuard {
        let gauge = self
            .reconcile_active
            .get_or_create(&label(reconciler))
            .clone();
        gauge.inc();
        ActiveGuard(gauge)
    }

    /// One module call's cost.
    pub fn module_call(&self, reconciler: &str, function: &str, stats: &crate::engine::CallStats) {
        self.call_duration
            .get_or_create(&CallLabels {
                reconciler: reconciler.to_string(),
                function: function.to_string(),
            })
            .observe(stats.call.as_secs_f64());
        self.instantiate_duration
            .get_or_create(&label(reconciler))
            .observe(stats.instantiate.as_secs_f64());
        let peak = i64::try_from(stats.memory_peak).unwrap_or(i64::MAX);
        self.memory_peak
            .get_or_create(&label(reconciler))
            .inner()
            .fetch_max(peak, Ordering::Relaxed);
    }

    /// A module change seen: `swapped`, `unchanged`, `refused` or `rolled_back`.
    pub fn hotswap(&self, reconciler: &str, result: &str) {
        self.hotswap
            .get_or_create(&ResultLabels {
                reconciler: reconciler.to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// One admission review answered.
    pub fn admission(&self, reconciler: &str, allowed: bool) {
        self.admission
            .get_or_create(&AdmissionLabels {
                reconciler: reconciler.to_string(),
                allowed: allowed.to_string(),
            })
            .inc();
    }

    /// One review of `webhook` (`validate`, `finalizer`) answered, `elapsed` after its head.
    pub fn admission_review(&self, reconciler: &str, webhook: &str, elapsed: Duration) {
        self.admission_duration
            .get_or_create(&WebhookLabels {
                reconciler: reconciler.to_string(),
                webhook: webhook.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// One admission review whose module call failed.
    pub fn admission_error(&self, reconciler: &str) {
        self.admission_errors
            .get_or_create(&label(reconciler))
            .inc();
    }

    /// The finalizer webhook added `reconciler`'s finalizer to a created primary.
    pub fn finalizer_added(&self, reconciler: &str) {
        self.finalizers_added
            .get_or_create(&label(reconciler))
            .inc();
    }

    /// One Event `reconciler`'s module asked for: `published`, `failed` or `dropped` (see
    /// [`crate::controller::emit`]).
    pub fn module_event(&self, reconciler: &str, result: &str) {
        self.module_events
            .get_or_create(&ResultLabels {
                reconciler: reconciler.to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// The count of `reconciler`'s module's Events that wait or are in flight, to raise and
    /// lower as they come and go (see [`crate::controller::emit`]); clones share it.
    pub fn module_events_queued(&self, reconciler: &str) -> Gauge {
        self.module_events_queued
            .get_or_create(&ReconcilerLabel {
                reconciler: reconciler.to_string(),
            })
            .clone()
    }

    /// `sha256` now serves `reconciler` (None: the reconciler stopped).
    pub fn module_active(&self, reconciler: &str, sha256: Option<&str>) {
        let Ok(mut active) = self.active_sha.lock() else {
            return;
        };
        if let Some(old) = active.remove(reconciler) {
            self.module_info.remove(&ModuleLabels {
                reconciler: reconciler.to_string(),
                sha256: old,
            });
        }
        if let Some(sha) = sha256 {
            self.module_info
                .get_or_create(&ModuleLabels {
                    reconciler: reconciler.to_string(),
                    sha256: sha.to_string(),
                })
                .set(1);
            active.insert(reconciler.to_string(), sha.to_string());
        }
    }

    /// The sharding metrics (`--shards auto`).
    pub fn shards(&self) -> &ShardMetrics {
        &self.shards
    }

    /// The watch cache of `reconciler`'s `kind` holds `n` objects.
    pub fn cache_objects(&self, reconciler: &str, kind: &str, n: usize) {
        self.cache_objects
            .get_or_create(&CacheLabels {
                reconciler: reconciler.to_string(),
                kind: kind.to_string(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The cache of `reconciler`'s `kind` is gone (the reconciler stopped).
    pub fn forget_cache_objects(&self, reconciler: &str, kind: &str) {
        self.cache_objects.remove(&CacheLabels {
            reconciler: reconciler.to_string(),
            kind: kind.to_string(),
        });
    }

    /// The host-wide bound on reconciles at once.
    pub fn reconcile_limit(&self, max: usize) {
        self.reconcile_limit
            .set(i64::try_from(max).unwrap_or(i64::MAX));
    }

    /// Whether this process leads.
    pub fn leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// The work-queue bookkeeping of one reconciler.
    pub fn queue(&'static self, reconciler: &str) -> Queue {
        let lane = |lane: &str| {
            self.queue_waiting
                .get_or_create(&LaneLabels {
                    reconciler: reconciler.to_string(),
                    lane: lane.to_string(),
                })
                .clone()
        };
        Queue {
            metrics: self,
            label: label(reconciler),
            pending: Arc::default(),
            waiting: [lane("reactive"), lane("timed")],
        }
    }
}

/// The process's metrics.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

/// Renders every metric (OpenMetrics text, ending in `# EOF`).
///
/// # Errors
/// [`MetricsError::Encode`].
pub fn encode() -> Result<String, MetricsError> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &global().registry)?;
    Ok(out)
}

/// The work queue of one reconciler, as the host sees it: kube-runtime's scheduler does not
/// expose its queue, so the host counts at the points where it asks for a reconcile (watch
/// triggers, module swaps, requeues) and where a reconcile starts.
///
/// # Guarantees
/// - `depth` counts distinct objects (the scheduler deduplicates by object too) requested and not
///   yet started; delayed requeues are not in it until they fire, as in client-go's queue.
/// - A requeue that fires while every worker is busy is not seen until it starts: `depth` can
///   under-count then, never over-count for long (a start always removes the object).
/// - `waiting{lane}` counts the reconciles handed over by kube-runtime's runner that wait for
///   one of the reconciler's concurrency permits (see [`crate::controller::priority`]), by
///   lane; timed requeues that fired while every permit is taken are in it.
#[derive(Debug, Clone)]
pub struct Queue {
    metrics: &'static Metrics,
    label: ReconcilerLabel,
    pending: Arc<Mutex<HashSet<String>>>,
    /// `wasmop_workqueue_waiting` of the `reactive` and `timed` lanes.
    waiting: [Gauge; 2],
}

impl Queue {
    fn set_depth(&self, pending: &HashSet<String>) {
        self.metrics
            .queue_depth
            .get_or_create(&self.label)
            .set(i64::try_from(pending.len()).unwrap_or(i64::MAX));
    }

    /// A reconcile of `key` was requested now.
    pub fn requested(&self, key: String) {
        self.metrics.queue_adds.get_or_create(&self.label).inc();
        if let Ok(mut p) = self.pending.lock() {
            p.insert(key);
            self.set_depth(&p);
        }
    }

    /// A reconcile was scheduled for later (`retry`: after a failure).
    pub fn requeued(&self, retry: bool) {
        self.metrics.queue_adds.get_or_create(&self.label).inc();
        if retry {
            self.metrics.queue_retries.get_or_create(&self.label).inc();
        }
    }

    /// The reconcile of `key` started.
    pub fn started(&self, key: &str) {
        if let Ok(mut p) = self.pending.lock()
            && p.remove(key)
        {
            self.set_depth(&p);
        }
    }

    /// Reconciles waiting for a concurrency permit now: `[reactive, timed]`.
    pub fn waiting(&self, lanes: [usize; 2]) {
        for (gauge, n) in self.waiting.iter().zip(lanes) {
            gauge.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The reconciler stopped: its depth is zero, and nothing waits.
    pub fn clear(&self) {
        if let Ok(mut p) = self.pending.lock() {
            p.clear();
            self.set_depth(&p);
        }
        self.waiting([0, 0]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_with_their_labels() -> Result<(), MetricsError> {
        let m = global();
        m.reconciled("unit-a", true, Duration::from_millis(3));
        m.reconciled("unit-a", false, Duration::from_millis(3));
        m.module_active("unit-a", Some("aaa"));
        m.module_active("unit-a", Some("bbb"));
        let q = m.queue("unit-a");
        q.requested("ns/x".into());
        q.requested("ns/x".into());
        q.requeued(true);
        q.waiting([2, 5]);
        let text = encode()?;
        assert!(text.contains(r#"wasmop_reconcile_total{reconciler="unit-a",result="ok"} 1"#));
        assert!(text.contains(r#"wasmop_reconcile_errors_total{reconciler="unit-a"} 1"#));
        assert!(text.contains(r#"wasmop_module_info{reconciler="unit-a",sha256="bbb"} 1"#));
        assert!(!text.contains(r#"sha256="aaa""#));
        assert!(text.contains(r#"wasmop_workqueue_depth{reconciler="unit-a"} 1"#));
        assert!(text.contains(r#"wasmop_workqueue_adds_total{reconciler="unit-a"} 3"#));
        assert!(text.contains(r#"wasmop_workqueue_retries_total{reconciler="unit-a"} 1"#));
        assert!(
            text.contains(r#"wasmop_workqueue_waiting{reconciler="unit-a",lane="reactive"} 2"#)
        );
        assert!(text.contains(r#"wasmop_workqueue_waiting{reconciler="unit-a",lane="timed"} 5"#));
        q.started("ns/x");
        assert!(encode()?.contains(r#"wasmop_workqueue_depth{reconciler="unit-a"} 0"#));
        Ok(())
    }

    #[tokio::test]
    async fn a_reconcile_dropped_mid_call_is_no_longer_counted_active() -> Result<(), MetricsError>
    {
        let active = r#"wasmop_reconcile_active{reconciler="unit-dropped"}"#;
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let reconcile = tokio::spawn(async move {
            let _active = global().active("unit-dropped");
            let _ = started_tx.send(());
            std::future::pending::<()>().await;
        });
        let _ = started.await;
        assert!(encode()?.contains(&format!("{active} 1")));
        reconcile.abort();
        let _ = reconcile.await;
        assert!(
            encode()?.contains(&format!("{active} 0")),
            "an aborted reconcile left the gauge raised"
        );
        Ok(())
    }
}

/// `{direction}`: `gained` or `released`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    /// `gained` or `released`.
    pub direction: String,
}

/// `{kind, mode}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FilterLabels {
    /// `apiVersion/kind` of a sharded watch.
    pub kind: String,
    /// `server` (the API server's shardSelector) or `client`.
    pub mode: String,
}

/// This replica's share of the work with `--shards auto` (see docs/operating.md, "Sharding").
#[derive(Debug, Default)]
pub struct ShardMetrics {
    ranges: Gauge,
    fraction: Gauge<f64, std::sync::atomic::AtomicU64>,
    members: Gauge,
    primaries: Family<ReconcilerLabel, Gauge>,
    handovers: Family<DirectionLabel, Counter>,
    filter: Family<FilterLabels, Gauge>,
}

impl ShardMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "wasmop_shard_ranges",
            "Hash ranges this replica reconciles (active)",
            self.ranges.clone(),
        );
        registry.register(
            "wasmop_shard_fraction",
            "Share of the 64-bit hash space this replica reconciles (0..1)",
            self.fraction.clone(),
        );
        registry.register(
            "wasmop_shard_members",
            "Live members of this replica's shard group, itself included",
            self.members.clone(),
        );
        registry.register(
            "wasmop_shard_primaries",
            "Primaries in this replica's slice (its cache), by reconciler",
            self.primaries.clone(),
        );
        registry.register(
            "wasmop_shard_handovers",
            "Range handovers: ranges gained (claimed and verified) or released (drained)",
            self.handovers.clone(),
        );
        registry.register(
            "wasmop_shard_watch_filter",
            "Sharded watches by where they are filtered (server: shardSelector, client: here)",
            self.filter.clone(),
        );
    }

    /// The active ranges changed.
    pub fn held(&self, ranges: &crate::sharding::Ranges) {
        self.ranges
            .set(i64::try_from(ranges.ranges().len()).unwrap_or(i64::MAX));
        self.fraction.set(ranges.fraction());
    }

    /// The number of live members.
    pub fn members(&self, n: usize) {
        self.members.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The primaries in `reconciler`'s slice.
    pub fn primaries(&self, reconciler: &str, n: usize) {
        self.primaries
            .get_or_create(&label(reconciler))
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// One handover (`gained` or `released`).
    pub fn handover(&self, direction: &str) {
        self.handovers
            .get_or_create(&DirectionLabel {
                direction: direction.to_string(),
            })
            .inc();
    }

    /// How a sharded watch of `kind` is filtered (the other mode's series drops to 0).
    pub fn filter(&self, kind: &str, server: bool) {
        for (mode, on) in [("server", server), ("client", !server)] {
            self.filter
                .get_or_create(&FilterLabels {
                    kind: kind.to_string(),
                    mode: mode.to_string(),
                })
                .set(i64::from(on));
        }
    }
}
