//! The running host: clients, engine and manager, started and stopped as one.
//!
//! `wasmop run` uses it; so do the end-to-end tests, in-process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::Config;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::watch;

use crate::admission::config::{BuiltinKinds, WebhookConfigs, WebhookTarget};
use crate::admission::tls::{ClientAuth, ServingCert};
use crate::controller::limit::ReconcileLimit;
use crate::discovery::Discovery;
use crate::engine::{Engine, EngineConfig};
use crate::manager::{self, HostContext};
use crate::operations::leader::{Elector, LeaderConfig};
use crate::operations::ratelimit::{self, RateLimit};
use crate::operations::serving::ServerLimits;
use crate::operations::transport::Traffic;
use crate::{
    admission, operations::api_health, operations::metrics, operations::probes,
    operations::readiness,
};

/// How the admission webhook is served.
#[derive(Debug, Clone)]
pub struct WebhookOptions {
    /// Where to listen (port 0: any free port).
    pub addr: SocketAddr,
    /// How the API server reaches the host (None: `https://<bound address>` when it is a
    /// specific IP, else webhook configurations are not managed).
    pub target: Option<WebhookTarget>,
    /// A directory with `tls.crt`, `tls.key` and `ca.crt` (None: generate a CA and certificate).
    pub cert_dir: Option<PathBuf>,
    /// The host's own namespace, left out of every webhook's namespace selector.
    pub host_namespace: Option<String>,
    /// Connection cap and read timeout of the webhook server.
    pub limits: ServerLimits,
    /// Reviews read, parsed and judged at once.
    pub max_reviews: usize,
    /// Bytes of review bodies held at once (`admission::budget`).
    pub max_review_bytes: usize,
    /// The Kubernetes built-in kinds modules may validate (none by default).
    pub builtin_kinds: BuiltinKinds,
    /// Accept only clients with a certificate of this CA (and name): the API server
    /// (`--webhook-client-ca`; None: any client).
    pub client_auth: Option<ClientAuth>,
}

impl WebhookOptions {
    /// Serves on `addr` with the default limits, no target, a generated certificate.
    pub fn new(addr: SocketAddr) -> Self {
        WebhookOptions {
            addr,
            target: None,
            cert_dir: None,
            host_namespace: None,
            limits: ServerLimits::ADMISSION,
            max_reviews: admission::MAX_REVIEWS,
            max_review_bytes: admission::budget::DEFAULT_BYTES,
            builtin_kinds: BuiltinKinds::default(),
            client_auth: None,
        }
    }
}

/// The default memory budget of the running module calls: below `deploy/`'s 1 GiB pod limit,
/// with room for the host itself (its caches, compiles and servers).
pub const DEFAULT_MODULE_MEMORY_BUDGET: u64 = 768 << 20;

/// How long a shutdown waits for the failed requests queued for recording to be written.
pub const RECORD_FLUSH: Duration = Duration::from_secs(5);

/// How to run the host.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// A kubeconfig file (None: in-cluster or the default kubeconfig).
    pub kubeconfig: Option<PathBuf>,
    /// A client configuration the caller resolved (the command line's kubectl flags, see
    /// `cli::kubeconfig`); when set, `kubeconfig` is not read.
    pub config: Option<Config>,
    /// The compiled-module cache directory (None: no disk cache).
    pub cache_dir: Option<PathBuf>,
    /// The most the cache directory holds, every file counted.
    pub cache_max_bytes: u64,
    /// Consecutive crashes during compiles of one module after which it is refused (0: never).
    pub quarantine_after: u32,
    /// The most memory the running module calls may be capped at together.
    pub module_memory_budget: u64,
    /// The resync period for WasmReconcilers that do not set one.
    pub resync: Duration,
    /// How long a status in flux may be held back before it is written (zero: every status
    /// is written at once; see `controller::hold`).
    pub status_debounce: Duration,
    /// The name this host reports Events with.
    pub instance: String,
    /// Serve only WasmReconcilers matching this label selector (None: all). Lets several hosts
    /// split the WasmReconcilers of one cluster.
    pub selector: Option<String>,
    /// Serve `/metrics`, `/healthz` and `/readyz` here (None: not served).
    pub metrics_addr: Option<SocketAddr>,
    /// Connection cap and read timeout of the metrics server.
    pub metrics_limits: ServerLimits,
    /// Serve the admission webhook (None: not served).
    pub webhook: Option<WebhookOptions>,
    /// Run reconcilers only while holding this Lease (None: always).
    pub leader: Option<LeaderConfig>,
    /// How long [`Host::shutdown`] lets running reconciles finish.
    pub shutdown_grace: Duration,
    /// How many module calls (reconcile, finalize, validate, load) may run at once, over all
    /// WasmReconcilers and admission; the sandbox pool holds this many instances. More calls
    /// wait in a fair queue, within their deadline.
    pub max_module_calls: u32,
    /// Activate a quickly compiled build of a new module first and swap the optimized build in
    /// when it is ready (see `engine::Tier`); when false, modules compile optimized before they
    /// serve.
    pub tiered_compilation: bool,
    /// Record the request of every failed reconcile here (bounded; Secrets redacted unless
    /// allowed), to replay with `wasmop test --request`. Off when `None`.
    pub record_failures: Option<crate::controller::record::RecordOptions>,
    /// Where OCI modules' pull Secrets and CA ConfigMaps are read, and how large a module may be.
    pub oci: crate::modules::oci::OciOptions,
    /// Share every WasmReconciler's primaries with the other replicas of the group (None: this
    /// host reconciles all of them, or leads with `leader`).
    pub shards: Option<crate::sharding::ShardConfig>,
    /// How many reconciles may run at once over every WasmReconciler (at least 1).
    pub max_concurrent_reconciles: usize,
    /// Requests per second to the API server over all of the host's clients (0: no limit).
    pub kube_qps: f64,
    /// The most requests the host may send at once above `kube_qps` after a quiet time.
    pub kube_burst: u32,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            kubeconfig: None,
            config: None,
            cache_dir: None,
            cache_max_bytes: crate::engine::DEFAULT_CACHE_MAX_BYTES,
            quarantine_after: crate::engine::DEFAULT_QUARANTINE_AFTER,
            module_memory_budget: DEFAULT_MODULE_MEMORY_BUDGET,
            resync: Duration::from_secs(600),
            status_debounce: crate::controller::hold::DEFAULT_DEBOUNCE,
            instance: std::env::var("POD_NAME")
                .or_else(|_| std::env::var("HOSTNAME"))
                .unwrap_or_else(|_| "wasmop".into()),
            selector: None,
            metrics_addr: None,
            metrics_limits: ServerLimits::PROBES,
            webhook: None,
            leader: None,
            shutdown_grace: Duration::from_secs(30),
            max_module_calls: 256,
            tiered_compilation: true,
            record_failures: None,
            oci: crate::modules::oci::OciOptions::default(),
            shards: None,
            max_concurrent_reconciles: crate::controller::limit::DEFAULT_MAX,
            kube_qps: crate::operations::ratelimit::DEFAULT_QPS,
            kube_burst: crate::operations::ratelimit::DEFAULT_BURST,
        }
    }
}

/// A failure to start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The kubeconfig could not be read.
    #[error("cannot use kubeconfig {path}: {detail}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// No cluster configuration was found.
    #[error("no cluster to talk to: {0} (pass --kubeconfig, set KUBECONFIG, or run in a pod)")]
    NoConfig(String),
    /// The client could not be built.
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    /// The engine could not be built.
    #[error("{0}")]
    Engine(#[from] crate::engine::LoadError),
    /// The manager failed.
    #[error("{0}")]
    Manager(#[from] manager::ManagerError),
    /// The metrics server could not start.
    #[error("{0}")]
    Probes(#[from] probes::ServeError),
    /// The admission webhook could not start.
    #[error("{0}")]
    Admission(#[from] admission::AdmissionError),
    /// `kube_qps` / `kube_burst` cannot make a rate limit.
    #[error("{0}")]
    RateLimit(#[from] crate::operations::ratelimit::RateLimitError),
    /// Leadership was lost: this process must stop reconciling at once.
    #[error("{0}")]
    Leadership(#[from] crate::operations::leader::LeaderError),
    /// Shard membership was lost: this process must stop reconciling at once.
    #[error("{0}")]
    Sharding(#[from] crate::sharding::ShardError),
}

/// The client configuration from `kubeconfig`, or inferred.
///
/// # Errors
/// [`HostError::Kubeconfig`] or [`HostError::NoConfig`].
pub async fn kube_config(kubeconfig: Option<&PathBuf>) -> Result<Config, HostError> {
    match kubeconfig {
        Some(path) => {
            let bad = |detail: String| HostError::Kubeconfig {
                path: path.clone(),
                detail,
            };
            let kc = Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| bad(e.to_string()))
        }
        None => Config::infer()
            .await
            .map_err(|e| HostError::NoConfig(e.to_string())),
    }
}

/// A running host.
#[derive(Debug)]
pub struct Host {
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<Result<(), HostError>>>,
    elector: Option<Arc<Elector>>,
    /// With sharding: the trigger to leave the group, and the membership task.
    membership: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
    grace: Duration,
    /// `--record-failures`: flushed at shutdown, so every queued recording is on disk.
    recorder: Option<Arc<crate::controller::record::FailureRecorder>>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub metrics_addr: Option<SocketAddr>,
    /// Where the admission webhook is served.
    pub webhook_addr: Option<SocketAddr>,
}

/// The names a generated certificate must cover for `target`.
fn certificate_names(target: Option<&WebhookTarget>, bound: SocketAddr) -> Vec<String> {
    let mut names = vec!["localhost".to_string()];
    if !bound.ip().is_unspecified() {
        names.push(bound.ip().to_string());
    }
    match target {
        Some(WebhookTarget::Url(url)) => {
            let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
            let authority = rest.split('/').next().unwrap_or_default();
            let host = match authority.strip_prefix('[') {
                Some(v6) => v6.split(']').next().unwrap_or_default(),
                None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
            };
            if !host.is_empty() {
                names.push(host.to_string());
            }
        }
        Some(WebhookTarget::Service {
            namespace, name, ..
        }) => {
            names.push(format!("{name}.{namespace}.svc"));
            names.push(format!("{name}.{namespace}.svc.cluster.local"));
        }
        None => {}
    }
    names.sort();
    names.dedup();
    names
}

fn stopped(rx: &watch::Receiver<bool>) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut rx = rx.clone();
    async move {
        let _ = rx.wait_for(|s| *s).await;
    }
}

impl Host {
    /// Connects, starts the metrics and admission servers, and starts reconciling (once leading,
    /// with leader election).
    ///
    /// # Errors
    /// See [`HostError`].
    pub async fn start(options: HostOptions) -> Result<Host, HostError> {
        crate::install_crypto_provider();
        readiness::global().pending("startup");
        let config = match options.config.clone() {
            Some(config) => config,
            None => kube_config(options.kubeconfig.as_ref()).await?,
        };
        let rate_limit = RateLimit::new(options.kube_qps, options.kube_burst)?;
        let client = ratelimit::client(config.clone(), Traffic::Watches, rate_limit.as_ref())?;
        // Lease renewals, shard membership and the API-server probe never wait behind work.
        let liveness = ratelimit::liveness_client(config.clone())?;
        let reconcile_limit = ReconcileLimit::new(options.max_concurrent_reconciles);
        metrics::global().reconcile_limit(reconcile_limit.max());
        tracing::info!(
            max_concurrent_reconciles = reconcile_limit.max(),
            kube_qps = options.kube_qps,
            kube_burst = options.kube_burst,
            "host-wide limits"
        );
        let engine = Engine::new(&EngineConfig {
            cache_dir: options.cache_dir.clone(),
            cache_max_bytes: options.cache_max_bytes,
            quarantine_after: options.quarantine_after,
            memory_budget_bytes: options.module_memory_budget,
            max_instances: options.max_module_calls.max(1),
            max_calls: options.max_module_calls.max(1),
            // A push reconciles with a fast build at once; the optimized one follows.
            tiered: options.tiered_compilation,
            ..EngineConfig::default()
        })?;
        let ctx = Arc::new(HostContext {
            engine: engine.clone(),
            discovery: Discovery::new(client.clone()),
            client: client.clone(),
            config,
            instance: options.instance.clone(),
            default_resync: options.resync,
            status_debounce: options.status_debounce,
            selector: options.selector.clone(),
            failures: options
                .record_failures
                .clone()
                .map(|o| Arc::new(crate::controller::record::FailureRecorder::new(o))),
            oci: options.oci.clone(),
            shards: options
                .shards
                .as_ref()
                .map(|c| crate::sharding::Shards::new(&c.member.identity, c.server_side)),
            reconcile_limit,
            rate_limit,
            slots: admission::slots().clone(),
        });
        let (stop, stop_rx) = watch::channel(false);
        // `/readyz` is false while the API server does not answer (see `api_health`).
        api_health::spawn(liveness.clone(), stopped(&stop_rx));

        let mut metrics_addr = None;
        if let Some(addr) = options.metrics_addr {
            let (bound, serve) =
                probes::bind(addr, options.metrics_limits, stopped(&stop_rx)).await?;
            tracing::info!(addr = %bound, "serving /metrics, /healthz and /readyz");
            tokio::spawn(serve);
            metrics_addr = Some(bound);
        }

        let (leading_tx, leading_rx) = watch::channel(false);
        let mut webhook_addr = None;
        if let Some(w) = &options.webhook {
            let bound = admission::bind(w.addr, &w.limits)?;
            let addr = bound.addr;
            let target = w.target.clone().or_else(|| {
                (!addr.ip().is_unspecified()).then(|| WebhookTarget::Url(format!("https://{addr}")))
            });
            let cert = match &w.cert_dir {
                Some(dir) => ServingCert::load(dir),
                None => ServingCert::generate(&certificate_names(target.as_ref(), addr)),
            }
            .map_err(admission::AdmissionError::from)?;
            let configs = match target {
                Some(t) => Some(WebhookConfigs::new(
                    client.clone(),
                    ctx.config.clone(),
                    ctx.discovery.clone(),
                    t,
                    cert.ca_pem.clone(),
                    w.host_namespace.clone(),
                    w.builtin_kinds.clone(),
                )),
                None => {
                    tracing::warn!(
                        "no --webhook-url or --webhook-service and the webhook listens on every address: webhook configurations are not managed"
                    );
                    None
                }
            };
            let setup = admission::Setup {
                cert,
                client: client.clone(),
                engine: engine.clone(),
                selector: options.selector.clone(),
                configs,
                limits: w.limits,
                max_reviews: w.max_reviews,
                max_review_bytes: w.max_review_bytes,
                slots: ctx.slots.clone(),
                oci: options.oci.clone(),
                clients: w.client_auth.clone(),
            };
            let serve = admission::serve(bound, setup, leading_rx, stopped(&stop_rx)).await?;
            tracing::info!(%addr, "serving the admission webhook (HTTPS)");
            tokio::spawn(serve);
            webhook_addr = Some(addr);
        }

        let elector = options
            .leader
            .clone()
            .map(|c| Arc::new(Elector::new(liveness.clone(), c)));
        if elector.is_none() {
            // Registered before `startup` is ready, so `/readyz` waits for the first list.
            readiness::global().pending("manager");
        }
        let (leading_tx, membership, lost) = match (&options.shards, &ctx.shards) {
            (Some(config), Some(shards)) => {
                let (membership, lost) =
                    start_membership(liveness.clone(), config, shards.clone(), leading_tx);
                // Webhook configurations are written by the coordinator (see `start_membership`).
                (watch::channel(false).0, Some(membership), Some(lost))
            }
            _ => (leading_tx, None, None),
        };
        let recorder = ctx.failures.clone();
        let task = tokio::spawn(lead_and_run(
            ctx,
            elector.clone(),
            leading_tx,
            stop_rx.clone(),
            lost,
        ));
        readiness::global().ready("startup");
        Ok(Host {
            stop,
            task: Some(task),
            elector,
            membership,
            grace: options.shutdown_grace,
            recorder,
            metrics_addr,
            webhook_addr,
        })
    }

    /// Stops taking new work, lets running reconciles finish (within the shutdown grace), gives
    /// the leader Lease up, and returns.
    ///
    /// # Errors
    /// The manager's error, if it had failed.
    pub async fn shutdown(mut self) -> Result<(), HostError> {
        let _ = self.stop.send(true);
        let mut result = Ok(());
        if let Some(mut task) = self.task.take() {
            match tokio::time::timeout(self.grace, &mut task).await {
                Ok(Ok(r)) => result = r,
                Ok(Err(_)) => {}
                Err(_) => {
                    tracing::warn!(grace = ?self.grace, "reconciles still running after the shutdown grace; stopping them");
                    task.abort();
                }
            }
        }
        if let Some(recorder) = self.recorder.take() {
            // The writer is a plain thread; waiting for it blocks (at most RECORD_FLUSH).
            let flushed = tokio::task::spawn_blocking(move || recorder.flush(RECORD_FLUSH)).await;
            if !flushed.unwrap_or(true) {
                tracing::warn!(bound = ?RECORD_FLUSH, "the recordings queued were not all written within the bound; shutting down without them");
            }
        }
        // Only now, with every reconcile finished: the others take this replica's ranges.
        if let Some((leave, task)) = self.membership.take() {
            let _ = leave.send(());
            if tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .is_err()
            {
                tracing::warn!(
                    "could not leave the shard group in 10 s; the others wait for this member's Lease to expire"
                );
            }
        }
        if let Some(e) = &self.elector
            && let Err(err) = e.release().await
        {
            tracing::warn!(error = %err, "cannot release the leader Lease; the next leader waits for it to expire");
        }
        result
    }

    /// Waits until the host stops by itself: on a fatal error or when leadership is lost.
    ///
    /// # Errors
    /// The manager's error, or [`HostError::Leadership`].
    pub async fn wait(&mut self) -> Result<(), HostError> {
        let Some(task) = &mut self.task else {
            return Ok(());
        };
        let r = match task.await {
            Ok(r) => r,
            Err(_) => Ok(()),
        };
        self.task = None;
        r
    }
}

type Membership = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
);

/// Starts this replica's shard membership ([`crate::sharding::Handover`]). Returns the trigger
/// to leave and the task, and what reports a lost membership. The group's coordinator (one live
/// member) keeps the webhook configurations (`leading`); every member serves admission.
fn start_membership(
    client: kube::Client,
    config: &crate::sharding::ShardConfig,
    shards: Arc<crate::sharding::Shards>,
    leading: watch::Sender<bool>,
) -> (
    Membership,
    tokio::sync::oneshot::Receiver<crate::sharding::ShardError>,
) {
    let handover = crate::sharding::Handover::new(
        crate::sharding::Membership::new(client, config.member.clone()),
        shards,
    );
    let mut coordinator = handover.coordinator();
    tokio::spawn(async move {
        while coordinator.changed().await.is_ok() {
            let c = *coordinator.borrow_and_update();
            let _ = leading.send(c);
        }
    });
    let (leave_tx, leave_rx) = tokio::sync::oneshot::channel::<()>();
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        if let Err(e) = handover
            .run(async move {
                let _ = leave_rx.await;
            })
            .await
        {
            let _ = lost_tx.send(e);
        }
    });
    ((leave_tx, task), lost_rx)
}

/// Waits for leadership (when elected), then runs the manager until shutdown or loss (of
/// leadership or, with sharding, of membership).
async fn lead_and_run(
    ctx: Arc<HostContext>,
    elector: Option<Arc<Elector>>,
    leading: watch::Sender<bool>,
    stop: watch::Receiver<bool>,
    lost: Option<tokio::sync::oneshot::Receiver<crate::sharding::ShardError>>,
) -> Result<(), HostError> {
    metrics::global().leader(false);
    let mut since = std::time::Instant::now();
    if let Some(e) = &elector {
        tokio::select! {
            sent = e.acquire() => since = sent,
            _ = stopped(&stop) => return Ok(()),
        }
    }
    metrics::global().leader(true);
    let _ = leading.send(true);
    let run = manager::run(ctx, stopped(&stop));
    let result = match (&elector, lost) {
        (None, Some(lost)) => tokio::select! {
            r = run => r.map_err(HostError::from),
            Ok(e) = lost => Err(HostError::Sharding(e)),
        },
        (None, None) => run.await.map_err(HostError::from),
        (Some(e), _) => tokio::select! {
            r = run => r.map_err(HostError::from),
            lost = e.hold(since) => {
                tracing::error!(error = %lost, "leadership lost; stopping reconcilers at once");
                Err(HostError::Leadership(lost))
            }
        },
    };
    metrics::global().leader(false);
    let _ = leading.send(false);
    result
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some((_, task)) = self.membership.take() {
            task.abort();
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
