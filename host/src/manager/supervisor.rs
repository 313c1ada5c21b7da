//! One reconciler's supervisor: sets the reconciler up (kinds, read access, module, settings),
//! starts its controller, and serves: swaps modules as their source changes and reports the
//! controller's health in the WasmReconciler's status.
//!
//! # Guarantees
//! - A set-up that fails is reported (`Ready=False` with the reason, a Warning Event) and
//!   retried with backoff (1 s doubling to 60 s); a new module reference retries at once.
//! - `stop` ends a set-up and an OCI swap at once, even one waiting on a registry: the
//!   manager's loop, which waits for a stopped supervisor, is never held by one. A swap from a
//!   ConfigMap and a rollback wait on no registry and run to their end (their API calls are
//!   bounded), so their status and copy writes are never cut apart.
//! - While it serves, a change of the ConfigMap or Secret holding its signing policy's key
//!   checks the serving module's signatures again ([`rekey`]): a module the new key does not
//!   verify stops serving as a revoked one does.
//! - A reconciler that loses a conflict ([`super::conflict`]) or whose ServiceAccount may not
//!   read its kinds ([`super::access`]) never starts its controller. A conflict's loser releases
//!   its finalizers on the primaries the winner reconciles ([`release::to_winner`]).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject};
use kube::runtime::events::{EventType as KubeEventType, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::sync::oneshot;

use super::status::{SetupError, Subject};
use super::swap::{self, Candidate, Kept, Serving, SwapState};
use super::{DecisionsRx, HostContext, UpdatesRx, access, conflict, rekey, release};
use crate::contract::Gvk;
use crate::controller::emit::{EventLane, Recorders};
use crate::controller::predicate::Changes;
use crate::controller::{self, Clients, Health, Running, Settings};
use crate::crd::{MAX_RESYNC, WasmReconciler, WasmReconcilerSpec, parse_bounded_duration};
use crate::discovery::Resolved;
use crate::modules::slot::{Active, ModuleSlot};
use crate::operations::{metrics, readiness};
use crate::reasons;

/// Supervises one WasmReconciler.
pub(super) struct Supervisor {
    s: Subject,
    /// The modules activated last, for the host's copy.
    kept: Kept,
    /// Whether the primaries outside `spec.namespaces` were released.
    narrowed: bool,
    /// Whether the primaries a conflict's winner took over were released.
    yielded: bool,
    /// What the group decided about the module (see [`swap::follow`]).
    decisions: DecisionsRx,
    /// Set-up failures in a row not reported because the group's view was not known.
    unreported: u32,
}

/// With sharding: how many set-up failures in a row go unreported while it is not known
/// whether another replica serves the reconciler (1 s + 2 s + 4 s of backoff).
const UNREPORTED_TRIES: u32 = 3;

/// The owned and related kinds of a reconciler, resolved.
struct Kinds {
    owned: Vec<(Gvk, Resolved)>,
    related: Vec<(Gvk, Resolved, Option<String>)>,
}

impl Supervisor {
    pub fn new(ctx: Arc<HostContext>, wr: WasmReconciler, decisions: DecisionsRx) -> Self {
        Supervisor {
            s: Subject::new(ctx, wr),
            kept: Kept::default(),
            narrowed: false,
            yielded: false,
            decisions,
            unreported: 0,
        }
    }

    pub fn name(&self) -> String {
        self.s.name()
    }

    /// Reports a panic of this supervisor (see [`Subject::panicked`]).
    pub async fn panicked(&mut self, message: &str) {
        self.s.panicked(message).await;
    }

    pub async fn run(&mut self, stop: oneshot::Receiver<()>, updates: UpdatesRx) {
        self.supervise(stop, updates).await;
        if let Some(shards) = &self.s.ctx.shards {
            shards.serving().forget(&self.name());
        }
    }

    async fn supervise(&mut self, mut stop: oneshot::Receiver<()>, mut updates: UpdatesRx) {
        let mut delay = Duration::from_secs(1);
        loop {
            // A newer module reference replaces the one that could not be set up.
            while let Ok(wr) = updates.try_recv() {
                self.s.wr = wr;
            }
            // A set-up can wait on a slow registry: `stop` ends it (the manager waits on this).
            let Some(ready) = unless_stopped(&mut stop, self.prepare()).await else {
                return;
            };
            match ready {
                Ok((settings, candidate, resolved)) => {
                    self.report_serving(true);
                    self.unreported = 0;
                    let ended = self
                        .serve(settings, candidate, resolved, &mut stop, &mut updates)
                        .await;
                    match ended {
                        Ended::Stopped => return,
                        // The serving module stopped because the current policy refuses it:
                        // set up again (which refuses it too, and reports why) until the spec
                        // changes.
                        Ended::Revoked(e) => self.revoked(&e).await,
                        Ended::SetUpAgain => continue,
                    }
                }
                Err(e) => self.not_started(&e).await,
            }
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(delay) => {}
                Some(wr) = updates.next() => {
                    self.s.wr = wr;
                    delay = Duration::from_secs(1);
                    continue;
                }
            }
            delay = (delay * 2).min(Duration::from_secs(60));
        }
    }

    /// Checks for a conflict, releases the primaries outside the namespaces once, and sets up.
    async fn prepare(&mut self) -> Result<(Settings, Candidate, (Gvk, Resolved)), SetupError> {
        self.s.follower = !decides(&self.s);
        self.refuse_if_conflicting().await?;
        if !self.narrowed {
            self.narrowed = release::outside_namespaces(&self.s).await;
        }
        self.setup().await
    }

    /// With sharding: tells the group whether this reconciler is set up here (see
    /// [`crate::sharding::serving`]).
    fn report_serving(&self, serving: bool) {
        report_serving(&self.s, serving);
    }

    /// With sharding: whether a healthy replica serves this reconciler, so that its failure
    /// here is this replica's alone (it withdraws its share rather than report it). While
    /// the group's view is not known yet (see [`crate::sharding::Serving::served_elsewhere`]),
    /// the first [`UNREPORTED_TRIES`] failures are not reported either (the next try decides).
    fn served_elsewhere(&mut self) -> bool {
        let Some(shards) = &self.s.ctx.shards else {
            return false;
        };
        match shards.serving().served_elsewhere(&self.name()) {
            Some(served) => served,
            None => {
                self.unreported += 1;
                self.unreported <= UNREPORTED_TRIES
            }
        }
    }

    /// Reports a set-up that failed: `Ready=False`, and `ModuleLoaded=False` when the module
    /// itself could not be read or loaded. With sharding, when a healthy replica serves the
    /// reconciler, this replica withdraws its share instead and writes nothing: the status
    /// stays what the serving replicas report.
    async fn not_started(&mut self, e: &SetupError) {
        // Reported in its status; it does not hold the process's readiness back.
        readiness::global().ready(&controller::readiness_component(&self.name()));
        tracing::warn!(reconciler = %self.name(), reason = e.reason, error = %e.message, "cannot start; retrying");
        self.report_serving(false);
        if self.served_elsewhere() {
            tracing::warn!(reconciler = %self.name(), "served by another replica: this replica withdraws its share of the primaries and leaves the status to the others");
            return;
        }
        let loaded = !matches!(
            e.reason,
            reasons::MODULE_UNAVAILABLE
                | reasons::MODULE_INVALID
                | reasons::MODULE_QUARANTINED
                | reasons::DIGEST_MISMATCH
                | reasons::MODULE_MISMATCH
                | reasons::MODULE_NOT_FOUND
                | reasons::REGISTRY_UNREACHABLE
                | reasons::REGISTRY_UNAUTHORIZED
                | reasons::REGISTRY_CREDENTIALS_INVALID
                | reasons::REGISTRY_ERROR
                | reasons::SIGNATURE_INVALID
                | reasons::SIGNATURE_KEY_INVALID
                | reasons::SIGNATURE_REQUIRED
        );
        self.s
            .condition(reasons::READY, false, e.reason, &e.message);
        if !loaded {
            self.s
                .condition(reasons::MODULE_LOADED, false, e.reason, &e.message);
        }
        self.s.write_status().await;
        self.s
            .event_on_wr(KubeEventType::Warning, e.reason, &e.message)
            .await;
    }

    /// Refuses this reconciler (reason `Conflict`) when an earlier one claims the same primaries.
    async fn refuse_if_conflicting(&mut self) -> Result<(), SetupError> {
        let api: Api<WasmReconciler> = Api::all(self.s.ctx.client.clone());
        let all = api
            .list(&Default::default())
            .await
            .map_err(|e| SetupError {
                reason: reasons::CONFLICT_CHECK_FAILED,
                message: format!(
                    "cannot list WasmReconcilers to rule out a conflict: {e} (the host needs list on wasmreconcilers)"
                ),
            })?;
        match conflict::winner_over(&self.s.wr, &all.items) {
            Some(winner) => {
                if !self.yielded {
                    self.yielded = release::to_winner(&self.s, winner).await;
                }
                Err(SetupError {
                    reason: reasons::CONFLICT,
                    message: conflict::message(&self.s.wr, winner),
                })
            }
            None => {
                self.yielded = false;
                Ok(())
            }
        }
    }

    async fn setup(&mut self) -> Result<(Settings, Candidate, (Gvk, Resolved)), SetupError> {
        let spec = &self.s.wr.spec;
        let discovery = &self.s.ctx.discovery;
        // Fresh answers (a CRD may have changed), without clearing what other reconcilers use.
        let primary = spec.primary.gvk();
        let primary_resolved = discovery.refresh(&primary).await.map_err(not_served)?;
        if !primary_resolved.namespaced && !spec.namespaces.is_empty() {
            return Err(SetupError {
                reason: reasons::INVALID_SPEC,
                message: format!(
                    "spec.namespaces limits namespaced primaries, but {} is cluster-scoped: remove spec.namespaces",
                    primary.kind
                ),
            });
        }
        let kinds = self.resolve_kinds().await?;
        let primary = (primary, primary_resolved);
        self.check_reads(&primary, &kinds).await?;
        let (primary, primary_resolved) = primary;
        let candidate = swap::candidate(&self.s, None).await?;
        let settings = self.settings((primary.clone(), primary_resolved.clone()), kinds)?;
        Ok((settings, candidate, (primary, primary_resolved)))
    }

    /// Resolves the owned and related kinds the spec names.
    async fn resolve_kinds(&self) -> Result<Kinds, SetupError> {
        let spec = &self.s.wr.spec;
        let discovery = &self.s.ctx.discovery;
        let mut owned = Vec::new();
        for k in &spec.owns {
            owned.push((
                k.gvk(),
                discovery.refresh(&k.gvk()).await.map_err(not_served)?,
            ));
        }
        let mut related = Vec::new();
        for r in &spec.related {
            related.push((
                r.gvk(),
                discovery.refresh(&r.gvk()).await.map_err(not_served)?,
                r.selector.clone(),
            ));
        }
        Ok(Kinds { owned, related })
    }

    /// The module reads through the host's watches: its own identity must be allowed them.
    async fn check_reads(
        &self,
        primary: &(Gvk, Resolved),
        kinds: &Kinds,
    ) -> Result<(), SetupError> {
        let spec = &self.s.wr.spec;
        let related_kinds: Vec<(Gvk, Resolved)> = kinds
            .related
            .iter()
            .map(|(k, r, _)| (k.clone(), r.clone()))
            .collect();
        let reads = access::reads(primary, &kinds.owned, &related_kinds, &spec.namespaces);
        access::check_reads(&self.s.ctx.client, &spec.service_account, &reads)
            .await
            .map_err(|e| SetupError {
                reason: match e {
                    access::AccessError::NotAllowed { .. } => reasons::READ_NOT_ALLOWED,
                    access::AccessError::Review { .. } => reasons::ACCESS_CHECK_FAILED,
                },
                message: e.to_string(),
            })
    }

    /// The controller's settings from the spec.
    fn settings(&self, primary: (Gvk, Resolved), kinds: Kinds) -> Result<Settings, SetupError> {
        let spec = &self.s.wr.spec;
        let ctx = &self.s.ctx;
        let limits = swap::limits(&self.s.wr, ctx.engine.queue().budget())?;
        let resync =
            match &spec.resync_period {
                Some(p) => parse_bounded_duration("spec.resyncPeriod", p, MAX_RESYNC).map_err(
                    |message| SetupError {
                        reason: reasons::INVALID_SPEC,
                        message,
                    },
                )?,
                None => ctx.default_resync.min(MAX_RESYNC),
            };
        Ok(Settings {
            name: self.name(),
            primary: primary.into(),
            owned: kinds.owned.into_iter().map(Into::into).collect(),
            related: kinds.related.into_iter().map(Into::into).collect(),
            namespaces: spec.namespaces.clone(),
            limits,
            concurrency: spec.limits.concurrency.max(1),
            reconcile_limit: ctx.reconcile_limit.clone(),
            resync: resync.max(Duration::from_secs(1)),
            primary_changes: primary_changes(spec),
            status_debounce: ctx.status_debounce,
            config: spec.config.clone().unwrap_or_else(|| json!({})).to_string(),
            service_account: spec.service_account.username(),
            recorder: ctx.failures.clone(),
            shards: ctx.shards.clone(),
        })
    }

    /// The clients of the reconciler; its module's Events report RBAC's refusals to `health`.
    fn clients(&self, health: &Arc<Health>) -> Result<Clients, SetupError> {
        let ctx = &self.s.ctx;
        let module = ctx.module_client(&self.s.wr).map_err(|e| SetupError {
            reason: reasons::CLIENT_ERROR,
            message: e.to_string(),
        })?;
        Ok(Clients {
            host: ctx.client.clone(),
            module: module.clone(),
            discovery: ctx.discovery.clone(),
            host_events: self.s.events.clone(),
            module_events: EventLane::start(
                Recorders::new(
                    &module,
                    &Reporter {
                        controller: format!("wasmop/{}", self.name()),
                        instance: Some(ctx.instance.clone()),
                    },
                ),
                &self.name(),
                health.clone(),
            ),
        })
    }

    /// Serves until stopped, or until the serving module must stop (see [`Ended`]).
    async fn serve(
        &mut self,
        settings: Settings,
        first: Candidate,
        primary: (Gvk, Resolved),
        stop: &mut oneshot::Receiver<()>,
        updates: &mut UpdatesRx,
    ) -> Ended {
        let health = Arc::new(Health::default());
        let clients = match self.clients(&health) {
            Ok(c) => c,
            Err(e) => {
                self.s
                    .condition(reasons::READY, false, e.reason, &e.message);
                self.s.write_status().await;
                return Ended::Stopped;
            }
        };
        let (changed_tx, changed_rx) = futures::channel::mpsc::unbounded::<()>();
        let (slot, running) = self.serve_first(first, &settings, clients, &health, changed_rx);
        self.started(&slot).await;
        let primaries = self.primaries(&settings, &primary.1);
        let serving = Serving {
            slot: &slot,
            settings: &settings,
            primaries: &primaries,
            changed: &changed_tx,
        };
        let ended = self.serve_loop(&serving, &health, stop, updates).await;
        running.stop().await;
        ended
    }

    /// Reports that the serving module stopped because the current signing policy refuses it
    /// (`Ready=False`, `ModuleLoaded=False`, a Warning Event) and takes it out of admission.
    async fn revoked(&mut self, e: &SetupError) {
        let name = self.name();
        self.report_serving(false);
        self.s.ctx.slots.remove(&name);
        metrics::global().module_active(&name, None);
        let message = format!(
            "{}; the module serving is refused by the current signing policy and stopped serving",
            e.message
        );
        tracing::warn!(reconciler = %name, reason = e.reason, "{message}");
        self.s
            .condition(reasons::MODULE_LOADED, false, e.reason, &message);
        self.s.condition(reasons::READY, false, e.reason, &message);
        self.s.write_status().await;
        self.s
            .event_on_wr(KubeEventType::Warning, e.reason, &message)
            .await;
    }

    /// Puts the first module in its slot (published for admission) and starts the controller.
    fn serve_first(
        &mut self,
        first: Candidate,
        settings: &Settings,
        clients: Clients,
        health: &Arc<Health>,
        changed: futures::channel::mpsc::UnboundedReceiver<()>,
    ) -> (ModuleSlot, Running) {
        let slot = ModuleSlot::new(Active::new(
            first.module.clone(),
            first.fit.clone(),
            first.bytes.resource_version.clone(),
        ));
        self.kept.keep(
            first.module.sha256(),
            first.bytes.bytes.into_shared(),
            &first.origin,
            &first.verified_by,
        );
        if !first.from_copy {
            // The ConfigMap holds another module than the one rolled back.
            self.s.status.rejected_sha256 = None;
        }
        self.s.ctx.slots.publish(&self.name(), slot.clone());
        let running: Running = controller::start(
            settings.clone(),
            slot.clone(),
            clients,
            health.clone(),
            changed,
        );
        (slot, running)
    }

    /// Records the first module as active, with a `Started` Event.
    async fn started(&mut self, slot: &ModuleSlot) {
        let active = slot.active();
        let m = &active.module;
        let message = format!(
            "serving module {} {} ({})",
            m.metadata().name,
            m.metadata().version,
            swap::short(m.sha256())
        );
        let copy = !self.s.follower;
        swap::activated(
            &mut self.s,
            &mut self.kept,
            slot,
            KubeEventType::Normal,
            reasons::STARTED,
            message,
            copy,
        )
        .await;
    }

    /// The primaries the self-check samples, in the reconciler's own scope: its first namespace
    /// when it is namespaced to some, the whole cluster otherwise.
    fn primaries(&self, settings: &Settings, primary: &Resolved) -> Api<DynamicObject> {
        let client = self.s.ctx.client.clone();
        match settings.namespaces.first() {
            Some(ns) if primary.namespaced => Api::namespaced_with(client, ns, &primary.resource),
            _ => Api::all_with(client, &primary.resource),
        }
    }

    /// The module's ConfigMap watch; an OCI reference changes with the spec (`updates`) instead.
    fn module_events(
        &self,
    ) -> futures::stream::BoxStream<'static, Result<watcher::Event<ConfigMap>, watcher::Error>>
    {
        match self.s.wr.spec.module.config_map.clone() {
            Some(source) => {
                let cms: Api<ConfigMap> =
                    Api::namespaced(self.s.ctx.client.clone(), &source.namespace);
                watcher(
                    cms,
                    watcher::Config::default().fields(&format!("metadata.name={}", source.name)),
                )
                .default_backoff()
                .boxed()
            }
            None => futures::stream::pending().boxed(),
        }
    }

    /// Serves until `stop`: offers each new module, retries deferred swaps, watches rollouts,
    /// follows the group's decisions, and reports the controller's health.
    async fn serve_loop(
        &mut self,
        serving: &Serving<'_>,
        health: &Health,
        stop: &mut oneshot::Receiver<()>,
        updates: &mut UpdatesRx,
    ) -> Ended {
        let mut cm_events = self.module_events();
        let mut key_changes = rekey::changes(&self.s);
        let mut rekey_pending = None;
        let mut state = SwapState::default();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let (s, kept, decisions) = (&mut self.s, &mut self.kept, &mut self.decisions);
        loop {
            s.follower = !decides(s);
            tokio::select! {
                _ = &mut *stop => break,
                // What the group decided (a swap by the deciding replica, a rollback by any).
                Some(decided) = decisions.next() => {
                    // Following may pull the decided module from its registry (up to the pull
                    // deadline): a stop ends it, as it ends an offer's.
                    let follow = swap::follow(s, kept, serving, decided, &mut state);
                    if unless_stopped(stop, follow).await.is_none() {
                        break;
                    }
                    if std::mem::take(&mut state.set_up_again) {
                        return Ended::SetUpAgain;
                    }
                }
                _ = health.changed.notified() => s.degraded(health).await,
                event = cm_events.next() => {
                    let cm = match event {
                        Some(Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm))) => cm,
                        _ => continue,
                    };
                    // A newer ConfigMap replaces a deferred one.
                    state.deferred = None;
                    if s.follower {
                        // The deciding replica offers it; this one follows the status.
                        state.undecided = Some(cm);
                        continue;
                    }
                    // A ConfigMap's module waits on no registry: the swap runs to its end, so
                    // its status and copy writes are never cut between them.
                    swap::offer(s, kept, Some(cm), 0, serving, &mut state).await;
                }
                Some(change) = key_changes.next() => {
                    // The key of the signing policy changed: the serving module checked again.
                    let check = rekey::recheck(s, kept, change, 0, &mut state, &mut rekey_pending);
                    if unless_stopped(stop, check).await.is_none() {
                        break;
                    }
                    if let Some(e) = state.revoked.take() {
                        return Ended::Revoked(e);
                    }
                }
                Some(wr) = updates.next() => {
                    // A new OCI reference replaces a deferred one.
                    s.wr = wr;
                    state.deferred = None;
                    state.refused_version = None;
                    // The policy may name another key object; a pending re-check is moot.
                    key_changes = rekey::changes(s);
                    rekey_pending = None;
                    if !s.follower {
                        let offer = swap::offer(s, kept, None, 0, serving, &mut state);
                        if unless_stopped(stop, offer).await.is_none() {
                            break;
                        }
                        if let Some(e) = state.revoked.take() {
                            return Ended::Revoked(e);
                        }
                    }
                    // Records the generation seen even when the module is unchanged.
                    s.write_status().await;
                }
                _ = tick.tick() => {
                    if unless_stopped(stop, due(s, kept, serving, &mut state, &mut rekey_pending)).await.is_none() {
                        break;
                    }
                    if let Some(e) = state.revoked.take() {
                        return Ended::Revoked(e);
                    }
                    // A rollback reads no registry; cut between its status write and its copy
                    // write, the copy would hold the rolled-back module and a restart could
                    // not serve the good one.
                    swap::watch_rollout(s, kept, serving, &mut state).await;
                }
            }
        }
        Ended::Stopped
    }
}

/// Why a reconciler stopped serving.
enum Ended {
    /// `stop` (or the controller could not start).
    Stopped,
    /// The current signing policy refuses the serving module.
    Revoked(SetupError),
    /// The group rejected the serving module and nothing here serves instead: set up again.
    SetUpAgain,
}

/// With sharding: whether this replica decides the reconciler's module for the group (alone:
/// always).
fn decides(s: &Subject) -> bool {
    s.ctx
        .shards
        .as_ref()
        .is_none_or(|shards| shards.serving().decides(&s.name()))
}

/// The work that is due at a tick, but the rollout watch: a deferred swap, a decision not
/// followed yet, a module ConfigMap this replica did not offer while another decided (it
/// decides now), a re-check of signatures.
async fn due(
    s: &mut Subject,
    kept: &mut Kept,
    serving: &Serving<'_>,
    state: &mut SwapState,
    rekey_pending: &mut Option<rekey::Pending>,
) {
    let now = tokio::time::Instant::now();
    if let Some(d) = state.deferred.take_if(|d| d.at <= now) {
        swap::offer(s, kept, d.cm, d.attempts, serving, state).await;
        if state.revoked.is_some() {
            return;
        }
    }
    if let Some(f) = state.following.take_if(|f| f.at <= now) {
        match s.follower {
            true => swap::follow_activation(s, kept, serving, &f.sha, f.attempts, state).await,
            // This replica decides now: what it serves stands.
            false => report_serving(s, true),
        }
    }
    if !s.follower
        && let Some(cm) = state.undecided.take()
    {
        swap::offer(s, kept, Some(cm), 0, serving, state).await;
    }
    rekey::retry_due(s, kept, state, rekey_pending).await;
}

/// With sharding: tells the group whether reconciler `s` is set up here (see
/// [`crate::sharding::serving`]).
fn report_serving(s: &Subject, serving: bool) {
    if let Some(shards) = &s.ctx.shards {
        match serving {
            true => shards.serving().serves(&s.name()),
            false => shards.serving().fails(&s.name()),
        }
    }
}

/// `work`'s output, or `None` as soon as `stop` fires (or its sender is gone): a set-up or a
/// swap waiting on a slow registry or API server never holds a stop back.
async fn unless_stopped<T>(
    stop: &mut oneshot::Receiver<()>,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        _ = stop => None,
        out = work => Some(out),
    }
}

/// Which changes of a primary call for a reconcile: for a Metacontroller hook that is synced on
/// status changes (`spec.hook.syncOnStatus`), its status's too; otherwise changes outside it.
fn primary_changes(spec: &WasmReconcilerSpec) -> Changes {
    match &spec.hook {
        Some(hook) if hook.sync_on_status => Changes::WithStatus,
        _ => Changes::OutsideStatus,
    }
}

fn not_served(e: crate::discovery::DiscoveryError) -> SetupError {
    SetupError {
        reason: reasons::KIND_NOT_SERVED,
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, EngineConfig};
    use crate::modules::hostile::{self, Answer};

    /// A host context whose API server is `h`.
    fn context(h: &hostile::Hostile) -> Arc<HostContext> {
        let (client, config) = h.kube_client();
        let Ok(engine) = Engine::new(&EngineConfig::default()) else {
            panic!("an engine")
        };
        Arc::new(HostContext {
            engine,
            discovery: crate::discovery::Discovery::new(client.clone()),
            client,
            config,
            instance: "test".into(),
            default_resync: Duration::from_secs(60),
            status_debounce: Duration::from_secs(5),
            selector: None,
            failures: None,
            oci: crate::modules::oci::OciOptions::default(),
            shards: None,
            reconcile_limit: crate::controller::limit::ReconcileLimit::new(1),
            rate_limit: None,
            slots: crate::admission::Slots::default(),
        })
    }

    fn wr() -> WasmReconciler {
        let value = json!({
            "apiVersion": "wasmop.dev/v1alpha1", "kind": "WasmReconciler",
            "metadata": {"name": "slow", "uid": "u"},
            "spec": {
                "module": {"oci": {"reference": format!("127.0.0.1:9/m@sha256:{}", "ab".repeat(32))}},
                "primary": {"apiVersion": "example.com/v1", "kind": "App"},
                "serviceAccount": {"namespace": "m", "name": "m"},
            }
        });
        match serde_json::from_value(value) {
            Ok(w) => w,
            Err(e) => panic!("test WasmReconciler: {e}"),
        }
    }

    /// A Metacontroller hook synced on status changes has its primaries' status changes call
    /// for a reconcile; every other WasmReconciler (a hook's without `syncOnStatus`, a module's)
    /// only changes outside the status.
    #[test]
    fn only_a_hook_synced_on_status_reconciles_on_status_changes() {
        let mut spec = wr().spec;
        assert_eq!(primary_changes(&spec), Changes::OutsideStatus);
        let hook = |sync_on_status: bool| -> crate::crd::HookSpec {
            match serde_json::from_value(json!({
                "controller": {}, "sync": "/sync", "syncOnStatus": sync_on_status
            })) {
                Ok(h) => h,
                Err(e) => panic!("hook spec: {e}"),
            }
        };
        spec.hook = Some(hook(true));
        assert_eq!(primary_changes(&spec), Changes::WithStatus);
        spec.hook = Some(hook(false));
        assert_eq!(primary_changes(&spec), Changes::OutsideStatus);
    }

    /// Item 1 of the reliability issue: a set-up waiting on a server that trickles bytes (here the API server; a registry is the same wait) must not hold `stop` back, as
    /// the manager's loop waits for a stopped supervisor.
    #[tokio::test]
    async fn a_stop_ends_a_set_up_stuck_on_a_slow_server() {
        let h = hostile::start(|_| Answer::trickle()).await;
        let mut supervisor =
            Supervisor::new(context(&h), wr(), futures::channel::mpsc::unbounded().1);
        let (stop, stop_rx) = oneshot::channel();
        let (_updates, updates_rx) = futures::channel::mpsc::unbounded();
        let run = supervisor.run(stop_rx, updates_rx);
        tokio::pin!(run);
        tokio::select! {
            _ = &mut run => panic!("the set-up ended before the server answered"),
            _ = h.requested.notified() => {}
        }
        let _ = stop.send(());
        // The stuck set-up would take 1000 x 0.5 s; a stop ends it at once (60 s: generous).
        let ended = tokio::time::timeout(Duration::from_secs(60), run).await;
        assert!(
            ended.is_ok(),
            "the stopped supervisor still waits on the server ({} bytes trickled)",
            h.sent()
        );
    }
}
