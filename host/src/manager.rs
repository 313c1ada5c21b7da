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
//! ([`crate::controller::conflict`]): they are restarted so that the winner is decided again.
//!
//! # Lifecycle guarantees
//! - Every served WasmReconciler carries [`RECONCILER_FINALIZER`]. When it is deleted, its
//!   controller keeps running for up to [`RELEASE_GRACE`] while primaries that are being deleted
//!   still hold its finalizer (so the module's finalize runs while the module is loaded); then
//!   the controller stops, the finalizer is removed from every remaining primary with a
//!   `FinalizerReleased` Event ([`crate::controller::release`]), the module copy is deleted, and the
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
//! reconciler is reported in its status and Events and retried.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::oneshot;

use crate::contract::{Context, Gvk, KindObjects, ReconcileRequest, Trigger};
use crate::controller::access;
use crate::controller::health::WATCH_FAILED;
use crate::controller::intents::{self, Primary, Rejected};
use crate::controller::release::{Releaser, Which};
use crate::controller::{self, Clients, Health, Running, Settings};
use crate::crd::{
    ActiveModule, MAX_DEADLINE, MAX_RESYNC, RECONCILER_FINALIZER, SourceKind, WasmReconciler,
    WasmReconcilerStatus, parse_bounded_duration, parse_quantity,
};
use crate::discovery::{Discovery, Resolved};
use crate::engine::{CallError, Compiled, Engine, Limits, Module, sha256_hex};
use crate::modules::slot::{Active, Fit, ModuleSlot};
use crate::modules::source::{self, ModuleBytes};
use crate::modules::{oci, signature};
use crate::{controller::conditions, controller::conflict, modules::copy};
use crate::{operations::metrics, operations::readiness};

/// How long a deleted WasmReconciler's controller keeps running so that the module's finalize
/// can finish primaries already being deleted, before their finalizers are released anyway.
pub const RELEASE_GRACE: Duration = Duration::from_secs(20);

/// The field manager of the host's own writes (WasmReconciler status).
pub const HOST_MANAGER: &str = "wasmop";

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
}

impl std::fmt::Debug for HostContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostContext")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl HostContext {
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
    task: tokio::task::JoinHandle<()>,
}

type Updates = futures::channel::mpsc::UnboundedSender<WasmReconciler>;
type UpdatesRx = futures::channel::mpsc::UnboundedReceiver<WasmReconciler>;

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
    let mut running: HashMap<String, Supervised> = HashMap::new();
    let mut releasing: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut seen_in_init: Option<Vec<String>> = None;
    readiness::global().pending("manager");
    tokio::pin!(shutdown);
    loop {
        let event = tokio::select! {
            _ = &mut shutdown => break,
            e = events.try_next() => e,
        };
        let event = match event {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %e, "watching WasmReconcilers");
                continue;
            }
        };
        releasing.retain(|_, task| !task.is_finished());
        match event {
            watcher::Event::Init => seen_in_init = Some(Vec::new()),
            watcher::Event::InitApply(wr) | watcher::Event::Apply(wr) => {
                let name = wr.name_any();
                if let Some(seen) = &mut seen_in_init {
                    seen.push(name.clone());
                }
                if wr.metadata.deletion_timestamp.is_some() {
                    if let std::collections::hash_map::Entry::Vacant(slot) =
                        releasing.entry(name.clone())
                    {
                        tracing::info!(reconciler = %name, "WasmReconciler deleted; releasing its primaries");
                        let supervised = running.remove(&name);
                        slot.insert(tokio::spawn(release_deleted(
                            ctx.clone(),
                            wr.clone(),
                            supervised,
                        )));
                    }
                    restart_losers_to(&ctx, &mut running, &wr).await;
                    continue;
                }
                ensure_finalizer(&ctx, &wr).await;
                let generation = wr.metadata.generation;
                if running
                    .get(&name)
                    .is_some_and(|s| s.generation == generation)
                {
                    continue;
                }
                if let Some(s) = running.get_mut(&name)
                    && only_oci_module_changed(&s.wr, &wr)
                    && s.updates.unbounded_send(wr.clone()).is_ok()
                {
                    tracing::info!(reconciler = %name, "the WasmReconciler's OCI module changed; swapping it");
                    s.wr = wr;
                    s.generation = generation;
                    continue;
                }
                if let Some(old) = running.remove(&name) {
                    tracing::info!(reconciler = %name, "WasmReconciler changed; restarting its controller");
                    old.stop().await;
                }
                running.insert(name, spawn_supervisor(ctx.clone(), wr.clone()));
                restart_losers_to(&ctx, &mut running, &wr).await;
            }
            watcher::Event::InitDone => {
                readiness::global().ready("manager");
                if let Some(seen) = seen_in_init.take() {
                    let gone: Vec<String> = running
                        .keys()
                        .filter(|k| !seen.contains(k))
                        .cloned()
                        .collect();
                    for name in gone {
                        if let Some(s) = running.remove(&name) {
                            s.stop().await;
                        }
                    }
                }
            }
            watcher::Event::Delete(wr) => {
                if let Some(s) = running.remove(&wr.name_any()) {
                    tracing::info!(reconciler = %wr.name_any(), "WasmReconciler deleted; stopping its controller");
                    s.stop().await;
                }
                restart_losers_to(&ctx, &mut running, &wr).await;
            }
        }
    }
    for (_, s) in running.drain() {
        s.stop().await;
    }
    // An unfinished release is redone by whichever host serves the WasmReconciler next.
    for (_, task) in releasing.drain() {
        task.abort();
    }
    readiness::global().forget("manager");
    Ok(())
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

/// Adds [`RECONCILER_FINALIZER`] to `wr` if it lacks it. A failure is logged; the next event
/// of the WasmReconciler tries again.
async fn ensure_finalizer(ctx: &HostContext, wr: &WasmReconciler) {
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

/// The client impersonating `wr`'s ServiceAccount.
fn module_client(ctx: &HostContext, wr: &WasmReconciler) -> Result<Client, kube::Error> {
    let mut config = ctx.config.clone();
    config.auth_info.impersonate = Some(wr.spec.service_account.username());
    crate::operations::ratelimit::client(config, ctx.rate_limit.as_ref())
}

/// The releaser of `wr`'s finalizers, or None when its primary kind is not served (there is
/// then nothing to release).
async fn releaser(ctx: &HostContext, wr: &WasmReconciler) -> Result<Option<Releaser>, String> {
    let kind = wr.spec.primary.gvk();
    let Ok(resolved) = ctx.discovery.resolve(&kind).await else {
        return Ok(None);
    };
    let module = module_client(ctx, wr).map_err(|e| e.to_string())?;
    Ok(Some(Releaser {
        reconciler: wr.name_any(),
        primary: (kind, resolved),
        host: ctx.client.clone(),
        module,
        events: ctx.host_events(),
    }))
}

/// Releases everything deleted WasmReconciler `wr` holds, then lets it go; retried until done.
async fn release_deleted(
    ctx: Arc<HostContext>,
    wr: WasmReconciler,
    mut supervised: Option<Supervised>,
) {
    let mut delay = Duration::from_secs(1);
    loop {
        match release_deleted_once(&ctx, &wr, &mut supervised).await {
            Ok(()) => return,
            Err(message) => {
                tracing::warn!(reconciler = %wr.name_any(), error = %message, "cannot release the deleted WasmReconciler yet; retrying");
                let event = KubeEvent {
                    type_: KubeEventType::Warning,
                    reason: "ReleaseFailed".into(),
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
    supervised: &mut Option<Supervised>,
) -> Result<(), String> {
    let api: Api<WasmReconciler> = Api::all(ctx.client.clone());
    let all = api
        .list(&Default::default())
        .await
        .map_err(|e| format!("cannot list WasmReconcilers: {e}"))?;
    // The legacy shared finalizer is this reconciler's only if it did not lose a conflict.
    let legacy = conflict::winner_over(wr, &all.items).is_none();
    let releaser = releaser(ctx, wr).await?;
    if let Some(s) = supervised.take() {
        // Let the running controller finalize primaries already being deleted, bounded.
        let until = tokio::time::Instant::now() + RELEASE_GRACE;
        if let Some(r) = &releaser {
            while tokio::time::Instant::now() < until
                && r.deletions_pending(legacy).await.unwrap_or(false)
            {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        s.stop().await;
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
        && let Err(e) = copy::delete(&ctx.client, copy).await
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

fn spawn_supervisor(ctx: Arc<HostContext>, wr: WasmReconciler) -> Supervised {
    let (tx, rx) = oneshot::channel();
    let (updates, updates_rx) = futures::channel::mpsc::unbounded();
    let generation = wr.metadata.generation;
    let name = wr.name_any();
    let component = controller::readiness_component(&name);
    readiness::global().pending(&component);
    let spawned = wr.clone();
    let task = tokio::spawn(async move {
        let mut sup = Supervisor::new(ctx, wr);
        // A bug must not stop a reconciler silently: report the panic on the WasmReconciler.
        let outcome = std::panic::AssertUnwindSafe(sup.run(rx, updates_rx))
            .catch_unwind()
            .await;
        if let Err(panic) = outcome {
            sup.panicked(&controller::panic_message(panic.as_ref()))
                .await;
        }
        readiness::global().forget(&component);
        metrics::global().module_active(&sup.name(), None);
        crate::admission::slots().remove(&sup.name());
    });
    tracing::info!(reconciler = %name, "supervising");
    Supervised {
        wr: spawned,
        generation,
        stop: Some(tx),
        updates,
        task,
    }
}

/// A failure to set a reconciler up, with the condition reason to report.
#[derive(Debug)]
struct SetupError {
    reason: &'static str,
    message: String,
}

struct Supervisor {
    ctx: Arc<HostContext>,
    wr: WasmReconciler,
    status: WasmReconcilerStatus,
    host_events: Recorder,
    /// The bytes of the modules activated last (the active and the previous one), by sha256,
    /// for the host's copy of the active module.
    kept: Vec<(String, Arc<Vec<u8>>)>,
    /// Whether the primaries outside `spec.namespaces` were released.
    narrowed: bool,
    /// Where the modules in `kept` came from (for `status.activeModule.origin`), by sha256.
    origins: Vec<(String, String)>,
}

/// A module read and checked, not yet in service.
struct Candidate {
    module: Module,
    fit: Fit,
    bytes: ModuleBytes,
    /// Read from the host's copy because the ConfigMap holds a rolled-back module.
    from_copy: bool,
    /// Where it came from: `configMap <ns>/<name>` or `oci <repository>@<digest>`.
    origin: String,
}

/// Why a new module was not swapped in.
#[derive(Debug)]
enum SwapError {
    /// The module itself is at fault: refused until the ConfigMap changes.
    Refused(SetupError),
    /// The cluster or the host is at fault: retried with backoff.
    Deferred(String),
    /// The module cannot be read now (registry unreachable, credentials refused): reported,
    /// and retried with backoff.
    Unavailable(SetupError),
}

/// The reason of a setup that failed because the host had no sandbox (or cache) to spare:
/// not the module's fault.
const HOST_BUSY: &str = "HostBusy";

/// The reason a ConfigMap module is refused by a host that requires signed modules
/// (`--require-signed-modules`): a ConfigMap cannot carry a cosign signature.
const SIGNATURE_REQUIRED: &str = "SignatureRequired";

impl From<SetupError> for SwapError {
    fn from(e: SetupError) -> Self {
        if e.reason == HOST_BUSY {
            SwapError::Deferred(e.message)
        } else {
            SwapError::Refused(e)
        }
    }
}

/// What went wrong in the pre-swap self-check.
#[derive(Debug)]
enum CheckFailure {
    /// Listing the primaries failed.
    Cluster(kube::Error),
    /// The module call task did not complete.
    Interrupted(String),
    /// The module call on primary `on` failed.
    Call {
        /// The primary.
        on: String,
        /// The failure.
        error: CallError,
    },
    /// The module's intents for primary `on` are invalid.
    Intents {
        /// The primary.
        on: String,
        /// What is wrong.
        rejected: Rejected,
    },
}

impl CheckFailure {
    /// Whether the module is at fault (its version may be refused for good). A cluster error
    /// (timeout, 5xx, 429, connection, even 403) or a host one (no sandbox free, an interrupted
    /// task) says nothing about the module.
    fn is_module_failure(&self) -> bool {
        match self {
            CheckFailure::Cluster(_) | CheckFailure::Interrupted(_) => false,
            CheckFailure::Call { error, .. } => error.is_module_fault(),
            CheckFailure::Intents { .. } => true,
        }
    }
}

impl std::fmt::Display for CheckFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckFailure::Cluster(e) => write!(f, "cannot list primaries for the self-check: {e}"),
            CheckFailure::Interrupted(e) => write!(f, "the self-check was interrupted: {e}"),
            CheckFailure::Call { on, error } => write!(f, "dry run on {on}: {error}"),
            CheckFailure::Intents { on, rejected } => write!(f, "dry run on {on}: {rejected}"),
        }
    }
}

/// Whether a failure to read a module may pass without the spec changing (a registry outage,
/// credentials being fixed).
fn is_transient(reason: &str) -> bool {
    matches!(
        reason,
        "RegistryUnreachable"
            | "RegistryUnauthorized"
            | "RegistryCredentialsInvalid"
            | "RegistryError"
            | "ModuleNotFound"
            | signature::SIGNATURE_INVALID
            | signature::KEY_INVALID
    )
}

/// The self-check's retry delay after `attempts` deferrals: 1 s doubling to 60 s.
fn deferral_backoff(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.min(6)).min(Duration::from_secs(60))
}

/// A swap waiting for its retry.
struct Deferred {
    /// The ConfigMap offered, or None for the OCI module the spec names.
    cm: Option<ConfigMap>,
    at: tokio::time::Instant,
    attempts: u32,
}

/// What the serve loop keeps between ConfigMap events.
#[derive(Default)]
struct SwapState {
    refused_version: Option<String>,
    /// (sha, ConfigMap version) of the module rolled back.
    rejected: Option<(String, String)>,
    /// The sha of a newly swapped module under watch.
    watching: Option<String>,
    deferred: Option<Deferred>,
}

/// What swaps work with while a reconciler serves.
struct Serving<'a> {
    slot: &'a ModuleSlot,
    settings: &'a Settings,
    primaries: &'a Api<DynamicObject>,
    changed: &'a futures::channel::mpsc::UnboundedSender<()>,
}

impl Supervisor {
    fn new(ctx: Arc<HostContext>, wr: WasmReconciler) -> Self {
        let status = wr.status.clone().unwrap_or_default();
        let host_events = ctx.host_events();
        Supervisor {
            ctx,
            wr,
            status,
            host_events,
            kept: Vec::new(),
            narrowed: false,
            origins: Vec::new(),
        }
    }

    fn name(&self) -> String {
        self.wr.name_any()
    }

    fn limits(&self) -> Result<Limits, SetupError> {
        let l = &self.wr.spec.limits;
        let bad = |message: String| SetupError {
            reason: "InvalidSpec",
            message,
        };
        Ok(Limits {
            deadline: parse_bounded_duration("spec.limits.deadline", &l.deadline, MAX_DEADLINE)
                .map_err(bad)?,
            memory_bytes: parse_quantity(&l.memory)
                .map_err(|e| bad(format!("spec.limits.memory: {e}")))?,
            ..Limits::default()
        })
    }

    async fn run(&mut self, mut stop: oneshot::Receiver<()>, mut updates: UpdatesRx) {
        let mut delay = Duration::from_secs(1);
        loop {
            // A newer module reference replaces the one that could not be set up.
            while let Ok(wr) = updates.try_recv() {
                self.wr = wr;
            }
            let ready = match self.refuse_if_conflicting().await {
                Ok(()) => {
                    self.release_outside_namespaces().await;
                    self.setup().await
                }
                Err(e) => Err(e),
            };
            match ready {
                Ok((settings, candidate, resolved)) => {
                    self.serve(settings, candidate, resolved, &mut stop, &mut updates)
                        .await;
                    return;
                }
                Err(e) => {
                    // Reported in its status; it does not hold the process's readiness back.
                    readiness::global().ready(&controller::readiness_component(&self.name()));
                    tracing::warn!(reconciler = %self.name(), reason = e.reason, error = %e.message, "cannot start; retrying");
                    let loaded = !matches!(
                        e.reason,
                        "ModuleUnavailable"
                            | "ModuleInvalid"
                            | "DigestMismatch"
                            | "ModuleMismatch"
                            | "ModuleNotFound"
                            | "RegistryUnreachable"
                            | "RegistryUnauthorized"
                            | "RegistryCredentialsInvalid"
                            | "RegistryError"
                            | signature::SIGNATURE_INVALID
                            | signature::KEY_INVALID
                            | SIGNATURE_REQUIRED
                    );
                    self.condition("Ready", false, e.reason, &e.message);
                    if !loaded {
                        self.condition("ModuleLoaded", false, e.reason, &e.message);
                    }
                    self.write_status().await;
                    self.event_on_wr(KubeEventType::Warning, e.reason, &e.message)
                        .await;
                }
            }
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(delay) => {}
                Some(wr) = updates.next() => {
                    self.wr = wr;
                    delay = Duration::from_secs(1);
                    continue;
                }
            }
            delay = (delay * 2).min(Duration::from_secs(60));
        }
    }

    /// Refuses this reconciler (reason `Conflict`) when an earlier one claims the same primaries.
    async fn refuse_if_conflicting(&self) -> Result<(), SetupError> {
        let api: Api<WasmReconciler> = Api::all(self.ctx.client.clone());
        let all = api
            .list(&Default::default())
            .await
            .map_err(|e| SetupError {
                reason: "ConflictCheckFailed",
                message: format!(
                    "cannot list WasmReconcilers to rule out a conflict: {e} (the host needs list on wasmreconcilers)"
                ),
            })?;
        match conflict::winner_over(&self.wr, &all.items) {
            Some(winner) => Err(SetupError {
                reason: "Conflict",
                message: conflict::message(&self.wr, winner),
            }),
            None => Ok(()),
        }
    }

    /// Releases the primaries outside `spec.namespaces` (once per supervisor); failures are
    /// logged and Events record each release.
    async fn release_outside_namespaces(&mut self) {
        if self.narrowed || self.wr.spec.namespaces.is_empty() {
            return;
        }
        let releaser = match releaser(&self.ctx, &self.wr).await {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(reconciler = %self.name(), error = %e, "cannot release primaries outside spec.namespaces");
                return;
            }
        };
        let which = Which::OutsideOf(self.wr.spec.namespaces.clone());
        let why = format!(
            "no longer serves this namespace (spec.namespaces: {})",
            self.wr.spec.namespaces.join(", ")
        );
        match releaser.release(&which, true, &why).await {
            Ok(out) if out.failed.is_empty() => self.narrowed = true,
            Ok(out) => {
                let message = format!(
                    "cannot remove the finalizer from primaries outside spec.namespaces: {}",
                    out.failed.join("; ")
                );
                self.event_on_wr(KubeEventType::Warning, "ReleaseFailed", &message)
                    .await;
            }
            Err(e) => {
                tracing::warn!(reconciler = %self.name(), error = %e, "cannot release primaries outside spec.namespaces")
            }
        }
    }

    async fn setup(&mut self) -> Result<(Settings, Candidate, (Gvk, Resolved)), SetupError> {
        let spec = &self.wr.spec;
        let discovery = &self.ctx.discovery;
        let not_served = |e: crate::discovery::DiscoveryError| SetupError {
            reason: "KindNotServed",
            message: e.to_string(),
        };
        discovery.forget();
        let primary = spec.primary.gvk();
        let primary_resolved = discovery.resolve(&primary).await.map_err(not_served)?;
        if !primary_resolved.namespaced && !spec.namespaces.is_empty() {
            return Err(SetupError {
                reason: "InvalidSpec",
                message: format!(
                    "spec.namespaces limits namespaced primaries, but {} is cluster-scoped: remove spec.namespaces",
                    primary.kind
                ),
            });
        }
        let mut owned = Vec::new();
        for k in &spec.owns {
            owned.push((
                k.gvk(),
                discovery.resolve(&k.gvk()).await.map_err(not_served)?,
            ));
        }
        let mut related = Vec::new();
        for r in &spec.related {
            related.push((
                r.gvk(),
                discovery.resolve(&r.gvk()).await.map_err(not_served)?,
                r.selector.clone(),
            ));
        }
        // The module reads through the host's watches: its own identity must be allowed them.
        let related_kinds: Vec<(Gvk, Resolved)> = related
            .iter()
            .map(|(k, r, _)| (k.clone(), r.clone()))
            .collect();
        let reads = access::reads(
            &owned,
            &related_kinds,
            &spec.namespaces,
            primary_resolved.namespaced,
        );
        access::check_reads(&self.ctx.client, &spec.service_account, &reads)
            .await
            .map_err(|e| SetupError {
                reason: match e {
                    access::AccessError::NotAllowed { .. } => access::READ_NOT_ALLOWED,
                    access::AccessError::Review { .. } => "AccessCheckFailed",
                },
                message: e.to_string(),
            })?;
        let candidate = self.candidate(None).await?;
        let limits = self.limits()?;
        let resync =
            match &spec.resync_period {
                Some(p) => parse_bounded_duration("spec.resyncPeriod", p, MAX_RESYNC).map_err(
                    |message| SetupError {
                        reason: "InvalidSpec",
                        message,
                    },
                )?,
                None => self.ctx.default_resync.min(MAX_RESYNC),
            };
        let settings = Settings {
            name: self.name(),
            primary: (primary.clone(), primary_resolved.clone()).into(),
            owned: owned.into_iter().map(Into::into).collect(),
            related: related.into_iter().map(Into::into).collect(),
            namespaces: spec.namespaces.clone(),
            limits,
            concurrency: spec.limits.concurrency.max(1),
            reconcile_limit: self.ctx.reconcile_limit.clone(),
            resync: resync.max(Duration::from_secs(1)),
            config: spec.config.clone().unwrap_or_else(|| json!({})).to_string(),
            service_account: spec.service_account.username(),
            recorder: self.ctx.failures.clone(),
            shards: self.ctx.shards.clone(),
        };
        Ok((settings, candidate, (primary, primary_resolved)))
    }

    /// Where the spec's module is, for messages: `ConfigMap <ns>/<name>` or `OCI artifact <ref>`.
    fn source_label(&self) -> String {
        let m = &self.wr.spec.module;
        match (&m.config_map, &m.oci) {
            (Some(c), _) => format!("ConfigMap {}/{}", c.namespace, c.name),
            (None, Some(o)) => format!("OCI artifact {}", o.reference),
            (None, None) => "spec.module".into(),
        }
    }

    /// Reads the module the spec names: from the ConfigMap (`cm` if given, else from the
    /// cluster), or from the registry.
    async fn read_module(
        &self,
        cm: Option<&ConfigMap>,
    ) -> Result<(ModuleBytes, String), SetupError> {
        let invalid = |message: String| SetupError {
            reason: "InvalidSpec",
            message,
        };
        match self.wr.spec.module.kind().map_err(invalid)? {
            SourceKind::ConfigMap(source) => {
                if let Some(key) = &self.ctx.oci.required_key {
                    return Err(SetupError {
                        reason: SIGNATURE_REQUIRED,
                        message: format!(
                            "the host requires modules signed by key {} ({}), and a module in ConfigMap {}/{} cannot carry a signature: push it to a registry with `wasmop push --oci REF --sign KEY` and name it in spec.module.oci",
                            key.fingerprint, key.source, source.namespace, source.name
                        ),
                    });
                }
                let bytes = match cm {
                    Some(cm) => source::from_config_map(cm, source),
                    None => source::fetch(&self.ctx.client, source).await,
                }
                .map_err(|e| SetupError {
                    reason: "ModuleUnavailable",
                    message: e.to_string(),
                })?;
                let origin = format!("configMap {}/{}", source.namespace, source.name);
                Ok((bytes, origin))
            }
            SourceKind::Oci(spec) => {
                let pulled = oci::fetch(&self.ctx.client, &self.ctx.oci, spec)
                    .await
                    .map_err(|e| SetupError {
                        reason: e.reason(),
                        message: e.to_string(),
                    })?;
                let origin = pulled.origin;
                let bytes = ModuleBytes {
                    bytes: pulled.bytes,
                    key: pulled.layer_digest,
                    resource_version: pulled.manifest_digest,
                };
                Ok((bytes, origin))
            }
        }
    }

    /// At setup, when the registry cannot serve the module the status records as active (same
    /// origin), the host's copy of it: an outage does not stop a module across host restarts.
    async fn active_from_copy(&self, e: &SetupError) -> Option<(ModuleBytes, String)> {
        let spec = self.wr.spec.module.oci.as_ref()?;
        if !matches!(e.reason, "RegistryUnreachable" | "RegistryError") {
            return None;
        }
        let origin = oci::pin(spec).ok()?.origin();
        let active = self.status.active_module.as_ref()?;
        if active.origin.as_deref() != Some(origin.as_str()) {
            return None;
        }
        let copy = self.status.module_copy.as_ref()?;
        let mut bytes = copy::load(&self.ctx.client, copy, &active.sha256)
            .await
            .ok()?;
        tracing::warn!(reconciler = %self.name(), error = %e.message, "the registry cannot serve the active module; loading the host's copy of it");
        bytes.resource_version = oci::pin(spec).ok()?.digest;
        Some((bytes, origin))
    }

    /// Reads the module (from `given` if already read, else from its source), checks and loads
    /// it.
    async fn candidate(
        &self,
        given: Option<(ModuleBytes, String)>,
    ) -> Result<Candidate, SetupError> {
        let spec = &self.wr.spec;
        let at_setup = given.is_none();
        let (mut bytes, origin) = match given {
            Some(read) => read,
            None => match self.read_module(None).await {
                Ok(read) => read,
                Err(e) => self.active_from_copy(&e).await.ok_or(e)?,
            },
        };
        let mut sha = sha256_hex(&bytes.bytes);
        let mut from_copy = false;
        if at_setup && self.status.rejected_sha256.as_deref() == Some(sha.as_str()) {
            bytes = self.last_good(&sha).await?;
            sha = sha256_hex(&bytes.bytes);
            from_copy = true;
        }
        if let Some(pin) = &spec.module.sha256
            && !pin.eq_ignore_ascii_case(&sha)
        {
            return Err(SetupError {
                reason: "DigestMismatch",
                message: format!(
                    "{} holds a module with sha256 {sha}, but spec.module.sha256 pins {pin}",
                    self.source_label()
                ),
            });
        }
        let limits = self.limits()?;
        let engine = self.ctx.engine.clone();
        // The bytes move into the compile task and back: the module is never held twice.
        let raw = std::mem::take(&mut bytes.bytes);
        let (loaded, raw) = tokio::task::spawn_blocking(move || {
            let loaded = engine.load(&raw, &limits);
            (loaded, raw)
        })
        .await
        .map_err(|e| SetupError {
            reason: "ModuleInvalid",
            message: format!("loading was interrupted: {e}"),
        })?;
        bytes.bytes = raw;
        let module = loaded.map_err(|e| SetupError {
            reason: if e.is_module_fault() {
                "ModuleInvalid"
            } else {
                HOST_BUSY
            },
            message: format!("{} key {}: {e}", self.source_label(), bytes.key),
        })?;
        let owned: Vec<Gvk> = spec.owns.iter().map(|k| k.gvk()).collect();
        let related: Vec<Gvk> = spec.related.iter().map(|k| k.gvk()).collect();
        let mut fit = Fit::compute(module.metadata(), &spec.primary.gvk(), &owned, &related)
            .map_err(|message| SetupError {
                reason: "ModuleMismatch",
                message,
            })?;
        // Related kinds are read-only unless granted writes; each response is capped.
        let writable = spec.related.iter().filter(|r| r.write).map(|r| r.gvk());
        fit.grant = fit.grant.with_spec(writable, spec.limits.counts());
        Ok(Candidate {
            module,
            fit,
            bytes,
            from_copy,
            origin,
        })
    }

    /// The module that served before `rejected` was rolled back, from the host's copy.
    async fn last_good(&self, rejected: &str) -> Result<ModuleBytes, SetupError> {
        let refuse = |why: String| SetupError {
            reason: "ModuleRejected",
            message: format!(
                "the module ConfigMap holds sha256 {rejected}, which was rolled back (status.rejectedSha256), and {why}: push a fixed module"
            ),
        };
        let status = &self.status;
        let good = status
            .active_module
            .as_ref()
            .map(|a| a.sha256.clone())
            .filter(|g| !g.eq_ignore_ascii_case(rejected))
            .ok_or_else(|| refuse("no other module is recorded as active".into()))?;
        let copy = status
            .module_copy
            .as_ref()
            .ok_or_else(|| refuse("no copy of the last good module is recorded".into()))?;
        copy::load(&self.ctx.client, copy, &good)
            .await
            .map_err(|e| refuse(format!("the last good module cannot be read: {e}")))
    }

    fn clients(&self) -> Result<Clients, SetupError> {
        let mut config = self.ctx.config.clone();
        config.auth_info.impersonate = Some(self.wr.spec.service_account.username());
        let module = crate::operations::ratelimit::client(config, self.ctx.rate_limit.as_ref())
            .map_err(|e| SetupError {
                reason: "ClientError",
                message: e.to_string(),
            })?;
        Ok(Clients {
            host: self.ctx.client.clone(),
            module: module.clone(),
            discovery: self.ctx.discovery.clone(),
            host_events: self.host_events.clone(),
            module_events: Recorder::new(
                module,
                Reporter {
                    controller: format!("wasmop/{}", self.name()),
                    instance: Some(self.ctx.instance.clone()),
                },
            ),
        })
    }

    async fn serve(
        &mut self,
        settings: Settings,
        first: Candidate,
        primary: (Gvk, Resolved),
        stop: &mut oneshot::Receiver<()>,
        updates: &mut UpdatesRx,
    ) {
        let clients = match self.clients() {
            Ok(c) => c,
            Err(e) => {
                self.condition("Ready", false, e.reason, &e.message);
                self.write_status().await;
                return;
            }
        };
        let slot = ModuleSlot::new(Active::new(
            first.module.clone(),
            first.fit.clone(),
            first.bytes.resource_version.clone(),
        ));
        self.keep(first.module.sha256(), first.bytes.bytes, &first.origin);
        if !first.from_copy {
            // The ConfigMap holds another module than the one rolled back.
            self.status.rejected_sha256 = None;
        }
        crate::admission::slots().publish(&self.name(), slot.clone());
        let (changed_tx, changed_rx) = futures::channel::mpsc::unbounded::<()>();
        let health = Arc::new(Health::default());
        let running: Running = controller::start(
            settings.clone(),
            slot.clone(),
            clients.clone(),
            health.clone(),
            changed_rx,
        );
        self.activated(
            &slot,
            KubeEventType::Normal,
            "Started",
            format!(
                "serving module {} {} ({})",
                first.module.metadata().name,
                first.module.metadata().version,
                short(first.module.sha256())
            ),
        )
        .await;

        // A ConfigMap source is watched; an OCI reference changes with the spec (`updates`).
        let mut cm_events = match self.wr.spec.module.config_map.clone() {
            Some(source) => {
                let cms: Api<ConfigMap> =
                    Api::namespaced(self.ctx.client.clone(), &source.namespace);
                watcher(
                    cms,
                    watcher::Config::default().fields(&format!("metadata.name={}", source.name)),
                )
                .default_backoff()
                .boxed()
            }
            None => futures::stream::pending().boxed(),
        };
        let mut state = SwapState::default();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        // The self-check samples primaries in the reconciler's own scope: its first namespace
        // when it is namespaced to some, the whole cluster otherwise.
        let primaries: Api<DynamicObject> = match settings.namespaces.first() {
            Some(ns) if primary.1.namespaced => {
                Api::namespaced_with(self.ctx.client.clone(), ns, &primary.1.resource)
            }
            _ => Api::all_with(self.ctx.client.clone(), &primary.1.resource),
        };
        let serving = Serving {
            slot: &slot,
            settings: &settings,
            primaries: &primaries,
            changed: &changed_tx,
        };
        loop {
            tokio::select! {
                _ = &mut *stop => break,
                _ = health.changed.notified() => self.degraded(&health).await,
                event = cm_events.next() => {
                    let cm = match event {
                        Some(Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm))) => cm,
                        _ => continue,
                    };
                    // A newer ConfigMap replaces a deferred one.
                    state.deferred = None;
                    self.offer(Some(cm), 0, &serving, &mut state).await;
                }
                Some(wr) = updates.next() => {
                    // A new OCI reference replaces a deferred one.
                    self.wr = wr;
                    state.deferred = None;
                    state.refused_version = None;
                    self.offer(None, 0, &serving, &mut state).await;
                    // Records the generation seen even when the module is unchanged.
                    self.write_status().await;
                }
                _ = tick.tick() => {
                    if let Some(d) = state.deferred.take_if(|d| d.at <= tokio::time::Instant::now()) {
                        self.offer(d.cm, d.attempts, &serving, &mut state).await;
                    }
                    self.watch_rollout(&serving, &mut state).await;
                }
            }
        }
        running.stop().await;
    }

    /// Offers the module in `cm`, or the OCI module the spec names when `None` (after
    /// `attempts` deferred tries), for a swap.
    async fn offer(
        &mut self,
        cm: Option<ConfigMap>,
        attempts: u32,
        serving: &Serving<'_>,
        state: &mut SwapState,
    ) {
        let version = match (&cm, &self.wr.spec.module.oci) {
            (Some(cm), _) => cm.resource_version().unwrap_or_default(),
            (None, Some(spec)) => match oci::pin(spec) {
                Ok(pinned) => pinned.digest,
                Err(e) => {
                    let e = SetupError {
                        reason: e.reason(),
                        message: e.to_string(),
                    };
                    self.refused(None, &e).await;
                    return;
                }
            },
            (None, None) => return,
        };
        let active = serving.slot.active();
        // An OCI reference is always checked again (its tag or signature may have changed, and
        // an earlier refusal must be cleared): only a ConfigMap version seen is skipped.
        if (cm.is_some() && version == active.source_version)
            || state.refused_version.as_deref() == Some(&version)
            || state.rejected.as_ref().is_some_and(|(_, v)| *v == version)
        {
            return;
        }
        match self.swap(cm.as_ref(), serving).await {
            Ok(Some(sha)) => {
                state.refused_version = None;
                state.rejected = None;
                self.status.rejected_sha256 = None;
                state.watching = (self.wr.spec.rollout.watch_reconciles > 0).then_some(sha);
            }
            Ok(None) if cm.is_none() => {
                // The spec names the module already serving: clear an earlier refusal.
                let message = format!("{} is the module serving", self.source_label());
                self.condition("ModuleLoaded", true, "ModuleUnchanged", &message);
            }
            Ok(None) => {}
            Err(SwapError::Refused(e)) => {
                state.refused_version = Some(version);
                self.refused(cm.as_ref(), &e).await;
            }
            Err(SwapError::Unavailable(e)) => {
                let delay = deferral_backoff(attempts);
                let e = SetupError {
                    reason: e.reason,
                    message: format!("{}; retrying in {delay:?}", e.message),
                };
                self.refused(cm.as_ref(), &e).await;
                state.deferred = Some(Deferred {
                    cm,
                    at: tokio::time::Instant::now() + delay,
                    attempts: attempts.saturating_add(1),
                });
            }
            Err(SwapError::Deferred(why)) => {
                let delay = deferral_backoff(attempts);
                let message = format!(
                    "the self-check of the new module could not run: {why}; retrying in {delay:?} (the previous module keeps serving)"
                );
                tracing::warn!(reconciler = %self.name(), "{message}");
                metrics::global().hotswap(&self.name(), "deferred");
                self.event_on_wr(KubeEventType::Warning, "SelfCheckDeferred", &message)
                    .await;
                state.deferred = Some(Deferred {
                    cm,
                    at: tokio::time::Instant::now() + delay,
                    attempts: attempts.saturating_add(1),
                });
            }
        }
    }

    /// Rolls a newly swapped module back once its failure rate passes the threshold.
    async fn watch_rollout(&mut self, serving: &Serving<'_>, state: &mut SwapState) {
        let Some(sha) = state.watching.clone() else {
            return;
        };
        let slot = serving.slot;
        let active = slot.active();
        if active.module.sha256() != sha {
            state.watching = None;
            return;
        }
        let (calls, failures) = active.counts();
        let policy = &self.wr.spec.rollout;
        let n = policy.watch_reconciles.max(1);
        let threshold = policy.failure_threshold_percent.clamp(1, 100);
        // Past the threshold for good, even if every remaining reconcile succeeded?
        let doomed = failures * 100 >= threshold * n;
        if doomed || (calls >= n && failures * 100 >= threshold * calls) {
            let previous = slot.previous();
            if slot.roll_back() {
                let _ = serving.changed.unbounded_send(());
                let back = previous
                    .map(|p| p.module.sha256().to_string())
                    .unwrap_or_default();
                state.rejected = Some((sha.clone(), active.source_version.clone()));
                self.rolled_back(slot, &sha, &back, calls, failures).await;
            }
            state.watching = None;
        } else if calls >= n {
            state.watching = None;
        }
    }

    /// Checks, compiles and dry-runs the module in `cm` (or the OCI module the spec names),
    /// then swaps it in. Ok(None) when the source changed but holds the module already serving,
    /// or one rolled back before.
    async fn swap(
        &mut self,
        cm: Option<&ConfigMap>,
        serving: &Serving<'_>,
    ) -> Result<Option<String>, SwapError> {
        let slot = serving.slot;
        let started = std::time::Instant::now();
        let read = match self.read_module(cm).await {
            Ok(read) => read,
            Err(e) if is_transient(e.reason) => return Err(SwapError::Unavailable(e)),
            Err(e) => return Err(SwapError::Refused(e)),
        };
        let read_at = started.elapsed();
        let candidate = self.candidate(Some(read)).await?;
        let loaded_at = started.elapsed();
        let old = slot.active();
        if candidate.module.sha256() == old.module.sha256() {
            metrics::global().hotswap(&self.name(), "unchanged");
            slot.refresh(candidate.bytes.resource_version.clone());
            return Ok(None);
        }
        if self.status.rejected_sha256.as_deref() == Some(candidate.module.sha256()) {
            // Rolled back before: not served again until the ConfigMap holds another module.
            metrics::global().hotswap(&self.name(), "unchanged");
            return Ok(None);
        }
        if let Err(failure) = self.self_check(&candidate, serving).await {
            return Err(if failure.is_module_failure() {
                SwapError::Refused(SetupError {
                    reason: "SelfCheckFailed",
                    message: failure.to_string(),
                })
            } else {
                SwapError::Deferred(failure.to_string())
            });
        }
        let checked_at = started.elapsed();
        let sha = candidate.module.sha256().to_string();
        let message = format!(
            "module {} {} ({}) replaces {} {} ({})",
            candidate.module.metadata().name,
            candidate.module.metadata().version,
            short(&sha),
            old.module.metadata().name,
            old.module.metadata().version,
            short(old.module.sha256())
        );
        let tier = candidate.module.tier();
        self.keep(&sha, candidate.bytes.bytes, &candidate.origin);
        slot.activate(Active::new(
            candidate.module,
            candidate.fit,
            candidate.bytes.resource_version,
        ));
        // Every primary is reconciled by the new module at once; the status, the host's copy
        // of the module and the Event follow (the copy of a large module takes a while).
        let _ = serving.changed.unbounded_send(());
        let ms = |d: Duration| d.as_millis() as u64;
        tracing::info!(
            reconciler = %self.name(),
            read_ms = ms(read_at),
            load_ms = ms(loaded_at - read_at),
            self_check_ms = ms(checked_at - loaded_at),
            %tier,
            "{message}"
        );
        metrics::global().hotswap(&self.name(), "swapped");
        self.activated(slot, KubeEventType::Normal, "ModuleSwapped", message)
            .await;
        Ok(Some(sha))
    }

    /// A dry run of the candidate over a few cached primaries: its intents must validate.
    async fn self_check(
        &self,
        candidate: &Candidate,
        serving: &Serving<'_>,
    ) -> Result<(), CheckFailure> {
        let settings = serving.settings;
        let list = serving
            .primaries
            .list(&kube::api::ListParams::default().limit(3))
            .await
            .map_err(CheckFailure::Cluster)?;
        for p in list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            let value = serde_json::to_value(p).unwrap_or_default();
            let Ok(info) = Primary::from_object(&value) else {
                continue;
            };
            let request = ReconcileRequest {
                primary: value.to_string(),
                owned: candidate
                    .fit
                    .grant
                    .owned
                    .iter()
                    .map(|k| KindObjects {
                        kind: k.clone(),
                        objects: Vec::new(),
                    })
                    .collect(),
                related: candidate
                    .fit
                    .related
                    .iter()
                    .map(|r| KindObjects {
                        kind: r.kind.clone(),
                        objects: Vec::new(),
                    })
                    .collect(),
                context: Context {
                    reconciler: settings.name.clone(),
                    trigger: Trigger::DryRun,
                    attempt: 1,
                    config: settings.config.clone(),
                    now_unix_ms: 0,
                },
            };
            let module = candidate.module.clone();
            let limits = settings.limits;
            let outcome =
                tokio::task::spawn_blocking(move || module.reconcile(request, &limits).result)
                    .await
                    .map_err(|e| CheckFailure::Interrupted(e.to_string()))?;
            let response = outcome.map_err(|error| CheckFailure::Call {
                on: p.name_any(),
                error,
            })?;
            // The dry run observes no children (its request lists none), so it may not patch
            // or delete any.
            intents::validate(
                &settings.name,
                &info,
                &candidate.fit.grant,
                &self.ctx.discovery,
                &intents::ObservedChildren::default(),
                response,
            )
            .map_err(|rejected| CheckFailure::Intents {
                on: p.name_any(),
                rejected,
            })?;
        }
        Ok(())
    }

    /// Keeps `bytes` (module `sha`, from `origin`) for the copy; only the last two activated
    /// are kept.
    fn keep(&mut self, sha: &str, bytes: Vec<u8>, origin: &str) {
        self.kept.retain(|(s, _)| s != sha);
        self.kept.push((sha.to_string(), Arc::new(bytes)));
        while self.kept.len() > 2 {
            self.kept.remove(0);
        }
        self.origins.retain(|(s, _)| s != sha);
        self.origins.push((sha.to_string(), origin.to_string()));
        while self.origins.len() > 2 {
            self.origins.remove(0);
        }
    }

    /// Makes the host's copy hold the active module and records where it is in the status.
    async fn save_copy(&mut self, module: &Module) {
        let sha = module.sha256();
        let Some((_, bytes)) = self.kept.iter().find(|(s, _)| s == sha) else {
            return;
        };
        let fallback = match &self.wr.spec.module.config_map {
            Some(c) => c.namespace.clone(),
            None => self.ctx.oci.namespace(),
        };
        let at = copy::location(&self.name(), &fallback);
        let version = module.metadata().version.clone();
        let bytes = bytes.clone();
        match copy::save(&self.ctx.client, &at, &self.name(), bytes, sha, &version).await {
            Ok(()) => self.status.module_copy = Some(at),
            Err(e) => {
                tracing::warn!(reconciler = %self.name(), error = %e, "cannot keep a copy of the active module; a restart after a rollback will refuse to serve")
            }
        }
    }

    /// Records `slot`'s active module in the status and conditions, and tells users with an
    /// Event of type `kind`. A Warning is a rollback: the old module serves again, but
    /// `ModuleLoaded` is False (the pushed one was refused); a Normal one sets it True.
    async fn activated(
        &mut self,
        slot: &ModuleSlot,
        kind: KubeEventType,
        reason: &str,
        message: String,
    ) {
        let active = slot.active();
        let m = &active.module;
        metrics::global().module_active(&self.name(), Some(m.sha256()));
        self.status.active_module = Some(ActiveModule {
            sha256: m.sha256().to_string(),
            name: m.metadata().name.clone(),
            version: m.metadata().version.clone(),
            loaded_at: Time(k8s_openapi::jiff::Timestamp::now()),
            source: match m.compiled() {
                Compiled::Fresh => "compiled".into(),
                Compiled::FromCache => "cache".into(),
            },
            origin: self
                .origins
                .iter()
                .find(|(s, _)| s == m.sha256())
                .map(|(_, o)| o.clone()),
        });
        self.status.ungranted = active.fit.ungranted.clone();
        let loaded = !matches!(kind, KubeEventType::Warning);
        self.condition("ModuleLoaded", loaded, reason, &message);
        let watching = format!("watching {}", self.wr.spec.primary.kind);
        self.condition("Ready", true, "Reconciling", &watching);
        if !self.status.conditions.iter().any(|c| c.type_ == "Degraded") {
            self.condition("Degraded", false, "AllWritesAllowed", "");
        }
        self.write_status().await;
        self.event_on_wr(kind, reason, &message).await;
        // The copy (gzip of up to --max-module-bytes, then a ConfigMap write) comes after the
        // status, so the status names the serving module as soon as it serves.
        let copy_before = self.status.module_copy.clone();
        self.save_copy(m).await;
        if self.status.module_copy != copy_before {
            self.write_status().await;
        }
    }

    async fn refused(&mut self, cm: Option<&ConfigMap>, e: &SetupError) {
        metrics::global().hotswap(&self.name(), "refused");
        let message = format!("{}; the previous module keeps serving", e.message);
        tracing::warn!(reconciler = %self.name(), reason = e.reason, "{message}");
        self.condition("ModuleLoaded", false, e.reason, &message);
        self.write_status().await;
        self.event_on_wr(KubeEventType::Warning, e.reason, &message)
            .await;
        let Some(cm) = cm else {
            return;
        };
        let r = cm.object_ref(&());
        let event = KubeEvent {
            type_: KubeEventType::Warning,
            reason: e.reason.to_string(),
            note: Some(truncate(&message)),
            action: "LoadModule".into(),
            secondary: None,
        };
        if let Err(err) = self.host_events.publish(&event, &r).await {
            tracing::warn!(error = %err, "cannot record an Event on the module ConfigMap");
        }
    }

    async fn rolled_back(
        &mut self,
        slot: &ModuleSlot,
        bad: &str,
        back_to: &str,
        calls: u32,
        failures: u32,
    ) {
        let message = format!(
            "module {} failed {failures} of its first {calls} reconciles; rolled back to {} (push a fixed module to try again)",
            short(bad),
            short(back_to)
        );
        tracing::warn!(reconciler = %self.name(), "{message}");
        metrics::global().hotswap(&self.name(), "rolled_back");
        self.status.rejected_sha256 = Some(bad.to_string());
        self.activated(slot, KubeEventType::Warning, "RolledBack", message)
            .await;
    }

    /// Reports a panic of this supervisor (a host bug): logged as an error, `Ready=False` with
    /// reason `InternalError`, and a Warning Event. The reconciler stays stopped until the
    /// WasmReconciler changes or the host restarts.
    async fn panicked(&mut self, message: &str) {
        let message = format!(
            "the host's supervisor of this reconciler panicked: {message} (a wasmop bug: please report it; edit the WasmReconciler or restart the host to retry)"
        );
        tracing::error!(reconciler = %self.name(), "{message}");
        self.condition("Ready", false, "InternalError", &message);
        self.write_status().await;
        self.event_on_wr(KubeEventType::Warning, "InternalError", &message)
            .await;
    }

    /// Reports the watches that cannot list or watch: `Ready=False` (reason `WatchFailed`,
    /// naming each kind and the API's error) and a Warning Event when that changes; back to
    /// `Ready=True` once every watch works again. No reconcile runs meanwhile (the controller
    /// waits for every cache), so this does not hold the host's own readiness back.
    async fn watch_failures(&mut self, health: &Health) {
        let failing = health.watches.failing();
        let ready = self
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
        if failing.is_empty() {
            if ready.is_some_and(|(_, reason, _)| reason == WATCH_FAILED) {
                let watching = format!("watching {}", self.wr.spec.primary.kind);
                self.condition("Ready", true, "Reconciling", &watching);
                self.event_on_wr(KubeEventType::Normal, "WatchesSynced", &watching)
                    .await;
            }
            return;
        }
        let message = format!(
            "{}; no reconcile runs until every watch has listed its objects",
            failing.join("; ")
        );
        if ready.is_some_and(|(status, reason, m)| {
            status == "False" && reason == WATCH_FAILED && m == message
        }) {
            return;
        }
        tracing::warn!(reconciler = %self.name(), "{message}");
        if health.watches.lasting() {
            // Reported here; it must not keep the whole host unready (transient failures do,
            // until the watch recovers).
            readiness::global().ready(&controller::readiness_component(&self.name()));
        }
        self.condition("Ready", false, WATCH_FAILED, &message);
        self.event_on_wr(KubeEventType::Warning, WATCH_FAILED, &message)
            .await;
    }

    async fn degraded(&mut self, health: &Health) {
        let crashed = health.crashed.lock().ok().and_then(|mut c| c.take());
        if let Some(message) = crashed {
            self.panicked(&format!("its controller: {message}")).await;
            return;
        }
        self.watch_failures(health).await;
        let forbidden = health
            .forbidden
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default();
        if forbidden.is_empty() {
            self.condition("Degraded", false, "AllWritesAllowed", "");
        } else {
            let first = forbidden
                .iter()
                .next()
                .map(|(k, v)| format!("{k}: {v}"))
                .unwrap_or_default();
            let message = format!(
                "{} object(s) have writes refused by RBAC; first: {first}",
                forbidden.len()
            );
            self.condition("Degraded", true, "Forbidden", &message);
        }
        self.write_status().await;
    }

    /// Sets a condition of the WasmReconciler's status at its current generation.
    fn condition(&mut self, type_: &str, status: bool, reason: &str, message: &str) {
        let generation = self.wr.metadata.generation;
        conditions::set(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            generation,
        );
    }

    async fn write_status(&mut self) {
        self.status.observed_generation = self.wr.metadata.generation;
        let api: Api<WasmReconciler> = Api::all(self.ctx.client.clone());
        let patch = json!({ "status": self.status });
        if let Err(e) = api
            .patch_status(&self.name(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(reconciler = %self.name(), error = %e, "cannot write the WasmReconciler status");
        }
    }

    async fn event_on_wr(&self, type_: KubeEventType, reason: &str, message: &str) {
        let event = KubeEvent {
            type_,
            reason: reason.to_string(),
            note: Some(truncate(message)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self
            .host_events
            .publish(&event, &self.wr.object_ref(&()))
            .await
        {
            tracing::warn!(error = %e, "cannot record an Event on the WasmReconciler");
        }
    }
}

fn truncate(s: &str) -> String {
    let max = intents::MAX_EVENT_NOTE;
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max - 3;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &s[..cut])
}

fn short(sha: &str) -> String {
    format!("sha256:{}", &sha[..12.min(sha.len())])
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::LoadError;
    use kube::core::Status;

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status::failure("test", reason).with_code(code)))
    }

    #[test]
    fn only_the_modules_own_failures_refuse_it_in_the_self_check() {
        for (code, reason) in [
            (500, "InternalError"),
            (503, "ServiceUnavailable"),
            (504, "Timeout"),
            (429, "TooManyRequests"),
            (403, "Forbidden"),
        ] {
            let f = CheckFailure::Cluster(api_error(code, reason));
            assert!(!f.is_module_failure(), "{code} is the cluster's: {f}");
        }
        assert!(!CheckFailure::Interrupted("cancelled".into()).is_module_failure());
        let on = || "a-1".to_string();
        let pool = CheckFailure::Call {
            on: on(),
            error: CallError::Sandbox {
                detail: "maximum concurrent limit reached".into(),
            },
        };
        assert!(!pool.is_module_failure(), "a full pool is the host's");
        let busy = CheckFailure::Call {
            on: on(),
            error: CallError::Queued {
                deadline: Duration::from_secs(2),
                slots: 1,
            },
        };
        assert!(
            !busy.is_module_failure(),
            "no free sandbox slot is the host's"
        );
        let panicked = CheckFailure::Call {
            on: on(),
            error: CallError::Panic {
                message: "boom".into(),
            },
        };
        assert!(panicked.is_module_failure());
        assert!(panicked.to_string().contains("dry run on a-1"));
        let deadline = CheckFailure::Call {
            on: on(),
            error: CallError::Deadline {
                deadline: Duration::from_secs(1),
            },
        };
        assert!(deadline.is_module_failure());
        let invalid = CheckFailure::Intents {
            on: on(),
            rejected: Rejected {
                violations: Vec::new(),
            },
        };
        assert!(invalid.is_module_failure());
    }

    #[test]
    fn a_module_that_cannot_be_loaded_for_want_of_a_sandbox_is_deferred_not_refused() {
        let setup = |reason: &'static str| SetupError {
            reason,
            message: "m".into(),
        };
        assert!(matches!(
            SwapError::from(setup(HOST_BUSY)),
            SwapError::Deferred(_)
        ));
        for reason in ["ModuleInvalid", "ModuleMismatch", "DigestMismatch"] {
            assert!(matches!(
                SwapError::from(setup(reason)),
                SwapError::Refused(_)
            ));
        }
        let busy = LoadError::Busy(CallError::Queued {
            deadline: Duration::from_secs(2),
            slots: 1,
        });
        assert!(!busy.is_module_fault());
        assert!(LoadError::Metadata("failed: boom".into()).is_module_fault());
    }

    #[test]
    fn deferred_self_checks_back_off_from_1s_to_60s() {
        assert_eq!(deferral_backoff(0), Duration::from_secs(1));
        assert_eq!(deferral_backoff(1), Duration::from_secs(2));
        assert_eq!(deferral_backoff(5), Duration::from_secs(32));
        assert_eq!(deferral_backoff(6), Duration::from_secs(60));
        assert_eq!(deferral_backoff(u32::MAX), Duration::from_secs(60));
    }
}
