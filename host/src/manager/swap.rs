//! Hot swap and rollback: reading and checking a module, the pre-swap self-check, the swap
//! itself, and watching a new module's first reconciles to roll it back.
//!
//! A module is read from its source ([`read_module`]), checked and compiled into a
//! [`Candidate`] ([`candidate`]), dry-run over a few primaries ([`self_check`]), then activated
//! in the reconciler's [`ModuleSlot`]; [`watch_rollout`] rolls it back when too many of its
//! first reconciles fail.
//!
//! # Guarantees
//! - Only a module's own failures (a failed call, invalid intents, a bad pin, metadata that do
//!   not fit) refuse it; a failure of the cluster or of the host defers the swap, retried with
//!   backoff ([`deferral_backoff`]); a registry outage is retried too.
//! - A refused or rolled-back module is not offered again until its source changes; the
//!   previous module keeps serving meanwhile.
//! - The host keeps a copy of the active module ([`crate::modules::copy`]) so that a rollback
//!   survives restarts.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DynamicObject};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType};
use kube::{Resource, ResourceExt};

use super::status::{SetupError, Subject, truncate};
use crate::contract::Gvk;
use crate::controller::intents::{self, Primary, Rejected};
use crate::controller::{Settings, call};
use crate::crd::{
    ActiveModule, ConfigMapKey, MAX_DEADLINE, SourceKind, VerifiedKey, WasmReconciler,
    parse_bounded_duration, parse_quantity,
};
use crate::engine::{CallError, Compiled, Limits, LoadError, Module};
use crate::modules::copy;
use crate::modules::slot::{Active, Fit, ModuleSlot};
use crate::modules::source::{self, ModuleBytes};
use crate::modules::{oci, signature};
use crate::operations::metrics;
use crate::reasons;

/// A module read and checked, not yet in service.
pub(super) struct Candidate {
    pub(super) module: Module,
    pub(super) fit: Fit,
    pub(super) bytes: ModuleBytes,
    /// Read from the host's copy because the ConfigMap holds a rolled-back module.
    pub(super) from_copy: bool,
    /// Where it came from: `configMap <ns>/<name>` or `oci <repository>@<digest>`.
    pub(super) origin: String,
    /// The keys whose signatures verified it (none when no signature is required).
    pub(super) verified_by: Vec<VerifiedKey>,
}

/// A module read from its source, before it is checked.
pub(super) struct Read {
    pub(super) bytes: ModuleBytes,
    /// See [`Candidate::origin`].
    pub(super) origin: String,
    /// See [`Candidate::verified_by`].
    pub(super) verified_by: Vec<VerifiedKey>,
}

/// Why a new module was not swapped in.
#[derive(Debug)]
pub(super) enum SwapError {
    /// The module itself is at fault: refused until the ConfigMap changes.
    Refused(SetupError),
    /// The cluster or the host is at fault: retried with backoff.
    Deferred(String),
    /// The module cannot be read now (registry unreachable, credentials refused): reported,
    /// and retried with backoff.
    Unavailable(SetupError),
}

impl From<SetupError> for SwapError {
    fn from(e: SetupError) -> Self {
        if e.reason == reasons::HOST_BUSY {
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

/// How many times a self-check that ran past its deadline is deferred before the version is
/// refused: on a host starved of CPU a deadline says more about the host than the module.
const DEADLINE_DEFERRALS: u32 = 3;

impl CheckFailure {
    /// Whether the module is at fault (its version may be refused for good), at the self-check's
    /// `attempts`-th deferral. A cluster error (timeout, 5xx, 429, connection, even 403) or a
    /// host one (no sandbox free, an interrupted task) says nothing about the module; a deadline
    /// counts only once it was met [`DEADLINE_DEFERRALS`] times.
    fn is_module_failure(&self, attempts: u32) -> bool {
        match self {
            CheckFailure::Cluster(_) | CheckFailure::Interrupted(_) => false,
            CheckFailure::Call {
                error: CallError::Deadline { .. },
                ..
            } if attempts < DEADLINE_DEFERRALS => false,
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
        reasons::REGISTRY_UNREACHABLE
            | reasons::REGISTRY_UNAUTHORIZED
            | reasons::REGISTRY_CREDENTIALS_INVALID
            | reasons::REGISTRY_ERROR
            | reasons::MODULE_NOT_FOUND
            | reasons::SIGNATURE_INVALID
            | reasons::SIGNATURE_KEY_INVALID
    )
}

/// The self-check's retry delay after `attempts` deferrals: 1 s doubling to 60 s.
pub(super) fn deferral_backoff(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.min(6)).min(Duration::from_secs(60))
}

/// A swap waiting for its retry.
pub(super) struct Deferred {
    /// The ConfigMap offered, or None for the OCI module the spec names.
    pub(super) cm: Option<ConfigMap>,
    pub(super) at: tokio::time::Instant,
    pub(super) attempts: u32,
}

/// What the serve loop keeps between ConfigMap events.
#[derive(Default)]
pub(super) struct SwapState {
    pub(super) refused_version: Option<String>,
    /// (sha, ConfigMap version) of the module rolled back.
    pub(super) rejected: Option<(String, String)>,
    /// The sha of a newly swapped module under watch.
    pub(super) watching: Option<String>,
    pub(super) deferred: Option<Deferred>,
    /// Why the module serving must stop: the current signing policy refuses it ([`revokes`]).
    pub(super) revoked: Option<SetupError>,
    /// With sharding, on a replica that does not decide: the module ConfigMap last seen, not
    /// offered (the decider offers it); offered if this replica becomes the decider.
    pub(super) undecided: Option<ConfigMap>,
    /// The group's module this replica could not load yet, and when it tries again.
    pub(super) following: Option<Following>,
    /// The group rejected the module serving here and there is nothing to roll back to: the
    /// reconciler is set up again (which serves the last good module from the copy).
    pub(super) set_up_again: bool,
}

/// A decision of the group that this replica has not followed yet.
pub(super) struct Following {
    /// The module the group serves.
    pub(super) sha: String,
    pub(super) at: tokio::time::Instant,
    pub(super) attempts: u32,
}

/// What swaps work with while a reconciler serves.
pub(super) struct Serving<'a> {
    pub(super) slot: &'a ModuleSlot,
    pub(super) settings: &'a Settings,
    pub(super) primaries: &'a Api<DynamicObject>,
    pub(super) changed: &'a futures::channel::mpsc::UnboundedSender<()>,
}

/// The origins of the modules a reconciler activated last (the active and the previous one),
/// by sha256, for `status.activeModule.origin` and `verifiedBy`; and the bytes of those the
/// host's copy may still have to be made to hold.
///
/// # Guarantees
/// - On the replica that writes the copy (a host alone, or the one deciding for its shard
///   group), a module's bytes are kept from its activation until the copy holds them (or never
///   can: too large for a ConfigMap), and, once a swap makes it the rollback target, until the
///   copy holds it again or another swap replaces it: an idle reconciler keeps no bytes.
/// - A replica that follows the group keeps the active module's and the rollback target's
///   bytes (at most two), as it would need them to write the copy after a failover.
///
/// # Caveats
/// - The rollback target's bytes are read back from the copy at the swap ([`hold_previous`])
///   when they are not kept. Where the copy does not hold them then (never written, too
///   large, unreadable at that moment, or, on a replica that stopped deciding, already
///   holding the new module), a rollback cannot rewrite the copy: [`save_copy`] says so, and
///   a host restarted after it, while the module ConfigMap holds the rejected module, refuses
///   to serve it until a fixed one is pushed.
#[derive(Default)]
pub(super) struct Kept {
    bytes: Vec<(String, Arc<Vec<u8>>)>,
    origins: Vec<(String, String, Vec<VerifiedKey>)>,
}

impl Kept {
    /// Keeps `bytes` (module `sha`, from `origin`, verified by `verified_by`) for the copy;
    /// only the last two activated are kept.
    pub fn keep(
        &mut self,
        sha: &str,
        bytes: Arc<Vec<u8>>,
        origin: &str,
        verified_by: &[VerifiedKey],
    ) {
        self.bytes.retain(|(s, _)| s != sha);
        self.bytes.push((sha.to_string(), bytes));
        while self.bytes.len() > 2 {
            self.bytes.remove(0);
        }
        self.origins.retain(|(s, _, _)| s != sha);
        self.origins
            .push((sha.to_string(), origin.to_string(), verified_by.to_vec()));
        while self.origins.len() > 2 {
            self.origins.remove(0);
        }
    }

    /// Keeps, beside the bytes of module `active` (just swapped in), only those of module
    /// `previous`, which the swap made the rollback target: as kept already, else `read` (from
    /// the host's copy), else none.
    pub fn keep_previous(&mut self, active: &str, previous: &str, read: Option<Arc<Vec<u8>>>) {
        let held = self.bytes_of(previous).or(read);
        self.bytes.retain(|(s, _)| s == active);
        if let Some(bytes) = held {
            self.bytes.insert(0, (previous.to_string(), bytes));
        }
    }

    /// The bytes of module `sha`, if kept.
    pub fn bytes_of(&self, sha: &str) -> Option<Arc<Vec<u8>>> {
        self.bytes
            .iter()
            .find(|(s, _)| s == sha)
            .map(|(_, b)| b.clone())
    }

    /// Records that the host's copy holds module `sha` (or never can): its bytes are not
    /// kept any longer.
    pub fn copied(&mut self, sha: &str) {
        self.bytes.retain(|(s, _)| s != sha);
    }

    /// The module bytes kept, in bytes.
    #[cfg(test)]
    fn bytes_held(&self) -> usize {
        self.bytes.iter().map(|(_, b)| b.len()).sum()
    }

    /// Records that module `sha` was verified again, by `keys`.
    pub fn verified(&mut self, sha: &str, keys: &[VerifiedKey]) {
        for (s, _, by) in &mut self.origins {
            if s == sha {
                *by = keys.to_vec();
            }
        }
    }
}

/// The call limits of `wr`'s spec. A memory cap over `budget` (the host's memory budget of
/// running calls) is refused: such a call could never run beside any other.
pub(super) fn limits(wr: &WasmReconciler, budget: u64) -> Result<Limits, SetupError> {
    let l = &wr.spec.limits;
    let bad = |message: String| SetupError {
        reason: reasons::INVALID_SPEC,
        message,
    };
    let memory_bytes =
        parse_quantity(&l.memory).map_err(|e| bad(format!("spec.limits.memory: {e}")))?;
    if memory_bytes > budget {
        return Err(bad(format!(
            "spec.limits.memory ({}) is over the host's memory budget for module calls ({budget} bytes, --module-memory-budget)",
            l.memory
        )));
    }
    Ok(Limits {
        deadline: parse_bounded_duration("spec.limits.deadline", &l.deadline, MAX_DEADLINE)
            .map_err(bad)?,
        memory_bytes,
        ..Limits::default()
    })
}

/// Where the spec's module is, for messages: `ConfigMap <ns>/<name>` or `OCI artifact <ref>`.
fn source_label(wr: &WasmReconciler) -> String {
    let m = &wr.spec.module;
    match (&m.config_map, &m.oci) {
        (Some(c), _) => format!("ConfigMap {}/{}", c.namespace, c.name),
        (None, Some(o)) => format!("OCI artifact {}", o.reference),
        (None, None) => "spec.module".into(),
    }
}

/// Reads the module the spec names: from the ConfigMap (`cm` if given, else from the
/// cluster), or from the registry.
pub(super) async fn read_module(s: &Subject, cm: Option<&ConfigMap>) -> Result<Read, SetupError> {
    let invalid = |message: String| SetupError {
        reason: reasons::INVALID_SPEC,
        message,
    };
    match s.wr.spec.module.kind().map_err(invalid)? {
        SourceKind::ConfigMap(source) => {
            if let Some(key) = &s.ctx.oci.required_key {
                return Err(SetupError {
                    reason: reasons::SIGNATURE_REQUIRED,
                    message: format!(
                        "the host requires modules signed by key {} ({}), and a module in ConfigMap {}/{} cannot carry a signature: push it to a registry with `wasmop push --oci REF --sign KEY` and name it in spec.module.oci",
                        key.fingerprint, key.source, source.namespace, source.name
                    ),
                });
            }
            let bytes = match cm {
                Some(cm) => source::from_config_map(cm, source),
                None => source::fetch(&s.ctx.client, source).await,
            }
            .map_err(|e| SetupError {
                reason: reasons::MODULE_UNAVAILABLE,
                message: e.to_string(),
            })?;

            let origin = format!("configMap {}/{}", source.namespace, source.name);
            Ok(Read {
                bytes,
                origin,
                verified_by: Vec::new(),
            })
        }
        SourceKind::Oci(spec) => {
            let pulled = oci::fetch(&s.ctx.client, &s.ctx.oci, spec)
                .await
                .map_err(|e| SetupError {
                    reason: e.reason(),
                    message: e.to_string(),
                })?;
            let bytes = ModuleBytes {
                bytes: pulled.bytes,
                key: pulled.layer_digest,
                resource_version: pulled.manifest_digest,
            };
            Ok(Read {
                bytes,
                origin: pulled.origin,
                verified_by: pulled.verified_by.iter().map(|k| k.recorded()).collect(),
            })
        }
    }
}

/// At setup, when the registry cannot serve the module the status records as active (same
/// origin), the host's copy of it: an outage does not stop a module across host restarts.
async fn active_from_copy(s: &Subject, e: &SetupError) -> Option<Read> {
    let spec = s.wr.spec.module.oci.as_ref()?;
    if !matches!(
        e.reason,
        reasons::REGISTRY_UNREACHABLE | reasons::REGISTRY_ERROR
    ) {
        return None;
    }
    let origin = oci::pin(spec).ok()?.origin();
    // The copy holds no signature: with a signing policy in force it cannot be verified, so it
    // is not served (the reconciler waits for the registry).
    let keys = signature::required_keys(
        &s.ctx.client,
        &s.ctx.oci.namespace(),
        spec,
        s.ctx.oci.required_key.as_ref(),
    )
    .await;
    if !keys.is_ok_and(|k| k.is_empty()) {
        tracing::warn!(reconciler = %s.name(), error = %e.message, "the registry cannot serve the active module, and a signing policy is in force: its unsigned copy is not served");
        return None;
    }
    let active = s.status.active_module.as_ref()?;
    if active.origin.as_deref() != Some(origin.as_str()) {
        return None;
    }
    let copy = s.status.module_copy.as_ref()?;
    let mut bytes = copy::load(&s.ctx.client, copy, &active.sha256).await.ok()?;
    tracing::warn!(reconciler = %s.name(), error = %e.message, "the registry cannot serve the active module; loading the host's copy of it");
    bytes.resource_version = oci::pin(spec).ok()?.digest;
    Some(Read {
        bytes,
        origin,
        verified_by: Vec::new(),
    })
}

/// Reads the module (from `given` if already read, else from its source), checks and loads
/// it.
pub(super) async fn candidate(s: &Subject, given: Option<Read>) -> Result<Candidate, SetupError> {
    let spec = &s.wr.spec;
    let at_setup = given.is_none();
    let Read {
        mut bytes,
        origin,
        mut verified_by,
    } = match given {
        Some(read) => read,
        None => match read_module(s, None).await {
            Ok(read) => read,
            Err(e) => active_from_copy(s, &e).await.ok_or(e)?,
        },
    };
    let mut sha = bytes.bytes.sha256().to_string();
    let mut from_copy = false;
    if at_setup && s.status.rejected_sha256.as_deref() == Some(sha.as_str()) {
        bytes = last_good(s, &sha).await?;
        sha = bytes.bytes.sha256().to_string();
        from_copy = true;
        // A ConfigMap's module (a rollback is only read back for one) carries no signature.
        verified_by.clear();
    } else if at_setup && let Some(decided) = undecided_here(s, &sha) {
        // Another replica decides, and has not taken (or refused) what the ConfigMap holds:
        // the group's module, from the host's copy.
        bytes = decided_copy(s, &decided).await?;
        sha = decided;
        from_copy = true;
    }
    let cap = s.ctx.oci.max_module_bytes;
    if bytes.bytes.len() as u64 > cap {
        return Err(SetupError {
            reason: reasons::MODULE_INVALID,
            message: format!(
                "{} holds a module of {} bytes, more than the host's cap of {cap} bytes (raise --max-module-bytes)",
                source_label(&s.wr),
                bytes.bytes.len()
            ),
        });
    }
    if let Some(pin) = &spec.module.sha256
        && !pin.eq_ignore_ascii_case(&sha)
    {
        return Err(SetupError {
            reason: reasons::DIGEST_MISMATCH,
            message: format!(
                "{} holds a module with sha256 {sha}, but spec.module.sha256 pins {pin}",
                source_label(&s.wr)
            ),
        });
    }
    let limits = limits(&s.wr, s.ctx.engine.queue().budget())?;
    let engine = s.ctx.engine.clone();
    // The bytes move into the compile task and back: the module is never held twice.
    let raw = std::mem::take(&mut bytes.bytes);
    let (loaded, raw) = tokio::task::spawn_blocking(move || {
        let loaded = engine.load_digested(&raw, &limits);
        (loaded, raw)
    })
    .await
    .map_err(|e| SetupError {
        reason: reasons::MODULE_INVALID,
        message: format!("loading was interrupted: {e}"),
    })?;
    bytes.bytes = raw;
    let module = loaded.map_err(|e| SetupError {
        reason: match &e {
            LoadError::Quarantined { .. } => reasons::MODULE_QUARANTINED,
            e if e.is_module_fault() => reasons::MODULE_INVALID,
            _ => reasons::HOST_BUSY,
        },
        message: format!("{} key {}: {e}", source_label(&s.wr), bytes.key),
    })?;
    let module = crate::metacontroller::serve(module, spec).map_err(|e| SetupError {
        reason: reasons::MODULE_INVALID,
        message: format!("{} key {}: {e}", source_label(&s.wr), bytes.key),
    })?;
    let owned: Vec<Gvk> = spec.owns.iter().map(|k| k.gvk()).collect();
    let related: Vec<Gvk> = spec.related.iter().map(|k| k.gvk()).collect();
    let mut fit = Fit::compute(module.metadata(), &spec.primary.gvk(), &owned, &related).map_err(
        |message| SetupError {
            reason: reasons::MODULE_MISMATCH,
            message,
        },
    )?;
    // Related kinds are read-only unless granted writes; each response is capped.
    let writable = spec.related.iter().filter(|r| r.write).map(|r| r.gvk());
    fit.grant = fit.grant.with_spec(writable, spec.limits.counts());
    Ok(Candidate {
        module,
        fit,
        bytes,
        from_copy,
        origin,
        verified_by,
    })
}

/// With sharding, on a replica that does not decide, for a ConfigMap module: the module the
/// group serves (`status.activeModule`) when the ConfigMap holds another one, `read`.
fn undecided_here(s: &Subject, read: &str) -> Option<String> {
    let active = s.status.active_module.as_ref()?;
    (s.follower && s.wr.spec.module.config_map.is_some() && active.sha256 != read)
        .then(|| active.sha256.clone())
}

/// Module `sha` from the host's copy.
async fn decided_copy(s: &Subject, sha: &str) -> Result<ModuleBytes, SetupError> {
    let unavailable = |why: String| SetupError {
        reason: reasons::MODULE_UNAVAILABLE,
        message: format!(
            "the group serves module {} and {why} (another replica decides this reconciler's module)",
            short(sha)
        ),
    };
    let copy = s
        .status
        .module_copy
        .as_ref()
        .ok_or_else(|| unavailable("no copy of it is recorded".into()))?;
    copy::load(&s.ctx.client, copy, sha)
        .await
        .map_err(|e| unavailable(format!("its copy cannot be read: {e}")))
}

/// The module that served before `rejected` was rolled back, from the host's copy.
async fn last_good(s: &Subject, rejected: &str) -> Result<ModuleBytes, SetupError> {
    let refuse = |why: String| SetupError {
        reason: reasons::MODULE_REJECTED,
        message: format!(
            "the module ConfigMap holds sha256 {rejected}, which was rolled back (status.rejectedSha256), and {why}: push a fixed module"
        ),
    };
    let status = &s.status;
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
    copy::load(&s.ctx.client, copy, &good)
        .await
        .map_err(|e| refuse(format!("the last good module cannot be read: {e}")))
}

/// Offers the module in `cm`, or the OCI module the spec names when `None` (after
/// `attempts` deferred tries), for a swap.
pub(super) async fn offer(
    s: &mut Subject,
    kept: &mut Kept,
    cm: Option<ConfigMap>,
    attempts: u32,
    serving: &Serving<'_>,
    state: &mut SwapState,
) {
    let version = match (&cm, &s.wr.spec.module.oci) {
        (Some(cm), _) => cm.resource_version().unwrap_or_default(),
        (None, Some(spec)) => match oci::pin(spec) {
            Ok(pinned) => pinned.digest,
            Err(e) => {
                let e = SetupError {
                    reason: e.reason(),
                    message: e.to_string(),
                };
                refused(s, None, &e).await;
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
    match swap(s, kept, cm.as_ref(), serving, attempts).await {
        Err(SwapError::Refused(e) | SwapError::Unavailable(e)) if revokes(s, &e) => {
            state.revoked = Some(e);
        }
        Ok(Some(sha)) => {
            state.refused_version = None;
            state.rejected = None;
            s.status.rejected_sha256 = None;
            state.watching = (s.wr.spec.rollout.watch_reconciles > 0).then_some(sha);
        }
        Ok(None) if cm.is_none() => {
            // The spec names the module already serving: clear an earlier refusal.
            let message = format!("{} is the module serving", source_label(&s.wr));
            s.condition(
                reasons::MODULE_LOADED,
                true,
                reasons::MODULE_UNCHANGED,
                &message,
            );
        }
        Ok(None) => {}
        Err(SwapError::Refused(e)) => {
            state.refused_version = Some(version);
            refused(s, cm.as_ref(), &e).await;
        }
        Err(SwapError::Unavailable(e)) => {
            let delay = deferral_backoff(attempts);
            let e = SetupError {
                reason: e.reason,
                message: format!("{}; retrying in {delay:?}", e.message),
            };
            refused(s, cm.as_ref(), &e).await;
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
            tracing::warn!(reconciler = %s.name(), "{message}");
            metrics::global().hotswap(&s.name(), "deferred");
            s.event_on_wr(
                KubeEventType::Warning,
                reasons::SELF_CHECK_DEFERRED,
                &message,
            )
            .await;
            state.deferred = Some(Deferred {
                cm,
                at: tokio::time::Instant::now() + delay,
                attempts: attempts.saturating_add(1),
            });
        }
    }
}

/// Whether refusal `e` of the spec's OCI module refuses the very artifact that serves: a
/// signature the current policy does not accept (`spec.module.oci.verify` added, its key
/// changed). That module must stop serving, not keep serving as an older module would.
pub(super) fn revokes(s: &Subject, e: &SetupError) -> bool {
    let signature = matches!(
        e.reason,
        reasons::SIGNATURE_INVALID | reasons::SIGNATURE_KEY_INVALID | reasons::SIGNATURE_REQUIRED
    );
    let pinned =
        s.wr.spec
            .module
            .oci
            .as_ref()
            .and_then(|spec| oci::pin(spec).ok())
            .map(|p| p.origin());
    let serving = s
        .status
        .active_module
        .as_ref()
        .and_then(|a| a.origin.clone());
    signature && pinned.is_some() && pinned == serving
}

/// Rolls a newly swapped module back once its failure rate passes the threshold.
pub(super) async fn watch_rollout(
    s: &mut Subject,
    kept: &mut Kept,
    serving: &Serving<'_>,
    state: &mut SwapState,
) {
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
    let verdict = rollout_verdict(&s.wr.spec.rollout, calls, failures);
    if verdict == Verdict::RollBack {
        let previous = slot.previous();
        if slot.roll_back() {
            let _ = serving.changed.unbounded_send(());
            let back = previous
                .map(|p| p.module.sha256().to_string())
                .unwrap_or_default();
            state.rejected = Some((sha.clone(), active.source_version.clone()));
            rolled_back(s, kept, slot, &sha, &back, calls, failures).await;
        }
        state.watching = None;
    } else if verdict == Verdict::Passed {
        state.watching = None;
    }
}

/// What a watched module's `calls` and `failures` so far call for under `policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Its failure rate passed the threshold, or will whatever the remaining reconciles do.
    RollBack,
    /// Every watched reconcile ran, under the threshold.
    Passed,
    /// Watching goes on.
    Watching,
}

/// The rollout decision. Counted in `u64`: in `u32`, a failure count past 42.9 million times
/// 100, or a watch count over 42.9 million (stored before the schema bounded it) times the
/// threshold, overflowed.
fn rollout_verdict(policy: &crate::crd::RolloutPolicy, calls: u32, failures: u32) -> Verdict {
    let n = u64::from(policy.watch_reconciles.max(1));
    let threshold = u64::from(policy.failure_threshold_percent.clamp(1, 100));
    let (calls, failures) = (u64::from(calls), u64::from(failures));
    // Past the threshold for good, even if every remaining reconcile succeeded?
    let doomed = failures * 100 >= threshold * n;
    if doomed || (calls >= n && failures * 100 >= threshold * calls) {
        Verdict::RollBack
    } else if calls >= n {
        Verdict::Passed
    } else {
        Verdict::Watching
    }
}

/// Follows what the group decided about the module (see [`super::Decided`]): a rejection is
/// recorded (and the rejected module rolled back here); on a replica that does not decide, the
/// shared status fields are taken as observed (its own status writes never overwrite them with
/// an older view) and the module the group serves is swapped in here ([`follow_activation`]).
pub(super) async fn follow(
    s: &mut Subject,
    kept: &mut Kept,
    serving: &Serving<'_>,
    decided: super::Decided,
    state: &mut SwapState,
) {
    if let Some(bad) = decided.rejected.as_deref()
        && follow_rollback(s, serving, bad, state).await
        && !s.follower
    {
        // Another replica rolled back: the deciding one keeps the copy and the status on the
        // module that serves again (its own writes since may have named `bad`).
        let active = serving.slot.active();
        record_active(s, kept, &active);
        let message = format!(
            "another replica saw module {} fail and rolled it back to {} (push a fixed module to try again)",
            short(bad),
            short(active.module.sha256())
        );
        s.condition(
            reasons::MODULE_LOADED,
            false,
            reasons::ROLLED_BACK,
            &message,
        );
        save_copy(s, kept, &active.module).await;
        s.write_status().await;
    }
    if !s.follower && !state.set_up_again {
        return;
    }
    s.status.rejected_sha256 = decided.rejected.clone();
    s.status.module_copy = decided.copy.clone().or(s.status.module_copy.take());
    s.status.active_module = decided.active.clone();
    let Some(sha) = decided.active_sha().filter(|_| !state.set_up_again) else {
        return;
    };
    if sha != serving.slot.active().module.sha256() && decided.rejected.as_deref() != Some(sha) {
        follow_activation(s, kept, serving, sha, 0, state).await;
    }
}

/// Swaps in module `sha`, which the deciding replica checked and swapped in (its status
/// records it), read from the ConfigMap last seen, the spec's source, or the host's copy. No
/// self-check and nothing written: the decider did both. A failure to load it here is this
/// replica's own (a registry unreachable from its node, a cap or budget of its own): it is
/// reported as failing to its shard group, so that it withdraws its share while a healthy
/// member serves the module, and retried with backoff.
pub(super) async fn follow_activation(
    s: &mut Subject,
    kept: &mut Kept,
    serving: &Serving<'_>,
    sha: &str,
    attempts: u32,
    state: &mut SwapState,
) {
    state.following = None;
    let candidate = match decided_module(s, sha, state).await {
        Ok(c) => c,
        Err(e) => {
            let delay = deferral_backoff(attempts);
            tracing::warn!(reconciler = %s.name(), module = %short(sha), reason = e.reason, error = %e.message, "cannot load the module the group serves; this replica withdraws its share and retries in {delay:?}");
            if let Some(shards) = &s.ctx.shards {
                shards.serving().fails(&s.name());
            }
            state.following = Some(Following {
                sha: sha.to_string(),
                at: tokio::time::Instant::now() + delay,
                attempts: attempts.saturating_add(1),
            });
            return;
        }
    };
    kept.keep(
        sha,
        candidate.bytes.bytes.into_shared(),
        &candidate.origin,
        &candidate.verified_by,
    );
    serving.slot.activate(Active::new(
        candidate.module,
        candidate.fit,
        candidate.bytes.resource_version,
    ));
    let _ = serving.changed.unbounded_send(());
    if let Some(previous) = serving.slot.previous() {
        hold_previous(s, kept, sha, previous.module.sha256()).await;
    }
    state.watching = (s.wr.spec.rollout.watch_reconciles > 0).then(|| sha.to_string());
    if let Some(shards) = &s.ctx.shards {
        shards.serving().serves(&s.name());
    }
    metrics::global().hotswap(&s.name(), "followed");
    metrics::global().module_active(&s.name(), Some(sha));
    tracing::info!(reconciler = %s.name(), module = %short(sha), "the group swapped this module in: swapped here too");
}

/// Module `sha` checked and compiled: from the ConfigMap last seen (or the spec's source read
/// again) when it holds it, else from the host's copy.
async fn decided_module(
    s: &Subject,
    sha: &str,
    state: &mut SwapState,
) -> Result<Candidate, SetupError> {
    let from_source = read_module(s, state.undecided.as_ref()).await;
    let read = match from_source {
        Ok(read) if read.bytes.bytes.sha256() == sha => {
            state.undecided = None;
            read
        }
        other => {
            let copy = s.status.module_copy.as_ref();
            let loaded = match copy {
                Some(copy) => copy::load(&s.ctx.client, copy, sha).await.ok(),
                None => None,
            };
            match (loaded, other) {
                (Some(bytes), _) => Read {
                    bytes,
                    origin: s
                        .status
                        .active_module
                        .as_ref()
                        .and_then(|a| a.origin.clone())
                        .unwrap_or_default(),
                    verified_by: Vec::new(),
                },
                (None, Err(e)) => return Err(e),
                (None, Ok(_)) => {
                    return Err(SetupError {
                        reason: reasons::MODULE_UNAVAILABLE,
                        message: format!(
                            "neither {} nor the host's copy holds module {}",
                            source_label(&s.wr),
                            short(sha)
                        ),
                    });
                }
            }
        }
    };
    candidate(s, Some(read)).await
}

/// Rolls module `bad` back here because the group rejected it (another replica's rollback,
/// recorded in the status): the decision is taken once, by the replica that saw the failures,
/// and every replica follows it. Nothing is written (the deciding replica wrote the status,
/// the Event and the copy), but the rejection is kept here too, so that no later swap on this
/// replica brings `bad` in; a replica with nothing to roll back to (it set up after the swap)
/// sets the reconciler up again, which serves the last good module from the host's copy.
pub(super) async fn follow_rollback(
    s: &mut Subject,
    serving: &Serving<'_>,
    bad: &str,
    state: &mut SwapState,
) -> bool {
    let slot = serving.slot;
    let active = slot.active();
    // Recorded even when another module serves here: a deferred swap must not bring it in.
    s.status.rejected_sha256 = Some(bad.to_string());
    if active.module.sha256() != bad {
        return false;
    }
    if !slot.roll_back() {
        tracing::warn!(reconciler = %s.name(), module = %short(bad), "the group rejected the module serving here, and there is no previous module to roll back to: setting the reconciler up again");
        state.set_up_again = true;
        return false;
    }
    let _ = serving.changed.unbounded_send(());
    state.watching = None;
    state.rejected = Some((bad.to_string(), active.source_version.clone()));
    s.status.rejected_sha256 = Some(bad.to_string());
    metrics::global().hotswap(&s.name(), "rolled_back");
    let back = slot.active();
    metrics::global().module_active(&s.name(), Some(back.module.sha256()));
    tracing::warn!(reconciler = %s.name(), module = %short(bad), back_to = %short(back.module.sha256()), "another replica rolled this module back: rolled back here too");
    true
}

/// Checks, compiles and dry-runs the module in `cm` (or the OCI module the spec names),
/// then swaps it in. Ok(None) when the source changed but holds the module already serving,
/// or one rolled back before.
async fn swap(
    s: &mut Subject,
    kept: &mut Kept,
    cm: Option<&ConfigMap>,
    serving: &Serving<'_>,
    attempts: u32,
) -> Result<Option<String>, SwapError> {
    let slot = serving.slot;
    let started = std::time::Instant::now();
    let read = match read_module(s, cm).await {
        Ok(read) => read,
        Err(e) if is_transient(e.reason) => return Err(SwapError::Unavailable(e)),
        Err(e) => return Err(SwapError::Refused(e)),
    };
    let read_at = started.elapsed();
    let candidate = candidate(s, Some(read)).await?;
    let loaded_at = started.elapsed();
    let old = slot.active();
    if candidate.module.sha256() == old.module.sha256() {
        metrics::global().hotswap(&s.name(), "unchanged");
        slot.refresh(candidate.bytes.resource_version.clone());
        // Checked again under the policy now in force: record the keys that verified it.
        kept.verified(candidate.module.sha256(), &candidate.verified_by);
        if let Some(active) = &mut s.status.active_module {
            active.verified_by = candidate.verified_by;
        }
        return Ok(None);
    }
    if s.status.rejected_sha256.as_deref() == Some(candidate.module.sha256()) {
        // Rolled back before: not served again until the ConfigMap holds another module.
        metrics::global().hotswap(&s.name(), "unchanged");
        return Ok(None);
    }
    if let Err(failure) = self_check(s, &candidate, serving).await {
        return Err(if failure.is_module_failure(attempts) {
            SwapError::Refused(SetupError {
                reason: reasons::SELF_CHECK_FAILED,
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
    kept.keep(
        &sha,
        candidate.bytes.bytes.into_shared(),
        &candidate.origin,
        &candidate.verified_by,
    );
    slot.activate(Active::new(
        candidate.module,
        candidate.fit,
        candidate.bytes.resource_version,
    ));
    // Every primary is reconciled by the new module at once; the status, the host's copy
    // of the module and the Event follow (the copy of a large module takes a while).
    let _ = serving.changed.unbounded_send(());
    hold_previous(s, kept, &sha, old.module.sha256()).await;
    let ms = |d: Duration| d.as_millis() as u64;
    tracing::info!(
        reconciler = %s.name(),
        read_ms = ms(read_at),
        load_ms = ms(loaded_at - read_at),
        self_check_ms = ms(checked_at - loaded_at),
        %tier,
        "{message}"
    );
    metrics::global().hotswap(&s.name(), "swapped");
    activated(
        s,
        kept,
        slot,
        KubeEventType::Normal,
        reasons::MODULE_SWAPPED,
        message,
        !s.follower,
    )
    .await;
    Ok(Some(sha))
}

/// A dry run of the candidate over a few cached primaries: its intents must validate.
async fn self_check(
    s: &Subject,
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
        // The same path as a reconcile (controller::call): request, call off the async
        // workers, validation. The dry run observes no children (its request lists none), so
        // it may not patch or delete any.
        let request = call::dry_run_request(
            value.to_string(),
            &candidate.fit,
            &settings.name,
            &settings.config,
            0,
        );
        let children = intents::ObservedChildren::default();
        let check = call::Check {
            reconciler: &settings.name,
            primary: &info,
            grant: &candidate.fit.grant,
            scopes: &s.ctx.discovery,
            children: &children,
        };
        let on = p.name_any();
        match call::run(
            &candidate.module,
            call::Export::Reconcile,
            request,
            settings.limits,
            &check,
        )
        .await
        {
            Ok(_) => {}
            Err(call::Failure::Join(e)) => return Err(CheckFailure::Interrupted(e)),
            Err(call::Failure::Call(error)) => return Err(CheckFailure::Call { on, error }),
            Err(call::Failure::Rejected(rejected)) => {
                return Err(CheckFailure::Intents { on, rejected });
            }
        }
    }
    Ok(())
}

/// Makes the host's copy hold the active module and records where it is in the status; its
/// bytes are not kept once it does (see [`Kept`]).
async fn save_copy(s: &mut Subject, kept: &mut Kept, module: &Module) {
    if s.follower {
        // The deciding replica keeps the copy: one writer.
        return;
    }
    let sha = module.sha256();
    let at = copy_location(s);
    let saved = match kept.bytes_of(sha) {
        Some(bytes) => {
            let version = module.metadata().version.clone();
            copy::save(&s.ctx.client, &at, &s.name(), bytes, sha, &version).await
        }
        None => match copy::holds(&s.ctx.client, &at, sha).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                tracing::warn!(reconciler = %s.name(), module = %short(sha), "cannot make the host's copy hold the module serving: its bytes are not held here (the copy did not hold them when it was swapped out); a restart will refuse to serve the rejected module");
                return;
            }
            Err(e) => Err(e),
        },
    };
    match saved {
        Ok(()) => {
            kept.copied(sha);
            s.status.module_copy = Some(at);
        }
        Err(e @ copy::CopyError::TooLarge { .. }) => {
            kept.copied(sha);
            tracing::warn!(reconciler = %s.name(), error = %e, "cannot keep a copy of the active module; a restart after a rollback will refuse to serve")
        }
        Err(e) => {
            tracing::warn!(reconciler = %s.name(), error = %e, "cannot keep a copy of the active module; a restart after a rollback will refuse to serve")
        }
    }
}

/// Where the host's copy of `s`'s module goes.
fn copy_location(s: &Subject) -> ConfigMapKey {
    let fallback = match &s.wr.spec.module.config_map {
        Some(c) => c.namespace.clone(),
        None => s.ctx.oci.namespace(),
    };
    copy::location(&s.name(), &fallback)
}

/// Keeps the bytes of module `previous`, which the swap to module `active` just made the
/// rollback target, reading them back from the host's copy when they are not kept (see
/// [`Kept`]): a rollback makes the copy hold it again. Called after the swap, before the copy
/// is made to hold the new module.
async fn hold_previous(s: &Subject, kept: &mut Kept, active: &str, previous: &str) {
    let read = match (&s.status.module_copy, kept.bytes_of(previous)) {
        (Some(at), None) => match copy::load(&s.ctx.client, at, previous).await {
            Ok(read) => Some(read.bytes.into_shared()),
            // A follower reads it only in case it decides later: the decider may have made
            // the copy hold the new module already.
            Err(e) if s.follower => {
                tracing::debug!(reconciler = %s.name(), module = %short(previous), error = %e, "the rollback target's bytes are not in the host's copy");
                None
            }
            Err(e) => {
                tracing::warn!(reconciler = %s.name(), module = %short(previous), error = %e, "cannot read the rollback target back from the host's copy: a rollback will not be able to make the copy hold it");
                None
            }
        },
        _ => None,
    };
    kept.keep_previous(active, previous, read);
}

/// Records `slot`'s active module in the status and conditions, and tells users with an
/// Event of type `kind`. A Warning is a rollback: the old module serves again, but
/// `ModuleLoaded` is False (the pushed one was refused); a Normal one sets it True. The host's
/// copy is written when `copy` (by the replica that decides the module, see [`follow`]).
pub(super) async fn activated(
    s: &mut Subject,
    kept: &mut Kept,
    slot: &ModuleSlot,
    kind: KubeEventType,
    reason: &str,
    message: String,
    copy: bool,
) {
    let active = slot.active();
    let m = &active.module;
    metrics::global().module_active(&s.name(), Some(m.sha256()));
    record_active(s, kept, &active);
    s.status.ungranted = active.fit.ungranted.clone();
    let loaded = !matches!(kind, KubeEventType::Warning);
    s.condition(reasons::MODULE_LOADED, loaded, reason, &message);
    let watching = format!("watching {}", s.wr.spec.primary.kind);
    s.condition(reasons::READY, true, reasons::RECONCILING, &watching);
    if !s
        .status
        .conditions
        .iter()
        .any(|c| c.type_ == reasons::DEGRADED)
    {
        s.condition(reasons::DEGRADED, false, reasons::ALL_WRITES_ALLOWED, "");
    }
    if !loaded {
        // A rollback: the copy holds the good module again before the status records the
        // bad one as rejected, so a restart between the two writes can still serve it.
        if copy {
            save_copy(s, kept, m).await;
        }
        s.write_status().await;
        s.event_on_wr(kind, reason, &message).await;
        return;
    }
    s.write_status().await;
    s.event_on_wr(kind, reason, &message).await;
    if !copy {
        return;
    }
    // The copy (gzip of up to --max-module-bytes, then a ConfigMap write) comes after the
    // status, so the status names the serving module as soon as it serves.
    let copy_before = s.status.module_copy.clone();
    save_copy(s, kept, m).await;
    if s.status.module_copy != copy_before {
        s.write_status().await;
    }
}

/// Records module `active` as the one serving in `status.activeModule`.
fn record_active(s: &mut Subject, kept: &Kept, active: &Active) {
    let m = &active.module;
    s.status.active_module = Some(ActiveModule {
        sha256: m.sha256().to_string(),
        name: m.metadata().name.clone(),
        version: m.metadata().version.clone(),
        loaded_at: Time(k8s_openapi::jiff::Timestamp::now()),
        source: match m.compiled() {
            Compiled::Fresh => "compiled".into(),
            Compiled::FromCache => "cache".into(),
        },
        origin: kept
            .origins
            .iter()
            .find(|(k, _, _)| k == m.sha256())
            .map(|(_, o, _)| o.clone()),
        verified_by: kept
            .origins
            .iter()
            .find(|(k, _, _)| k == m.sha256())
            .map(|(_, _, by)| by.clone())
            .unwrap_or_default(),
    });
}

/// Reports module `e` refused (`ModuleLoaded=False`, Warning Events on the WasmReconciler and
/// on the ConfigMap `cm` it came from); the previous module keeps serving.
async fn refused(s: &mut Subject, cm: Option<&ConfigMap>, e: &SetupError) {
    metrics::global().hotswap(&s.name(), "refused");
    let message = format!("{}; the previous module keeps serving", e.message);
    tracing::warn!(reconciler = %s.name(), reason = e.reason, "{message}");
    s.condition(reasons::MODULE_LOADED, false, e.reason, &message);
    s.write_status().await;
    s.event_on_wr(KubeEventType::Warning, e.reason, &message)
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
    if let Err(err) = s.events.publish(&event, &r).await {
        tracing::warn!(error = %err, "cannot record an Event on the module ConfigMap");
    }
}

/// Reports the rollback from module `bad` to `back_to` after `failures` of `calls` reconciles
/// failed, and records `bad` as rejected so that it is not served again.
async fn rolled_back(
    s: &mut Subject,
    kept: &mut Kept,
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
    tracing::warn!(reconciler = %s.name(), "{message}");
    metrics::global().hotswap(&s.name(), "rolled_back");
    s.status.rejected_sha256 = Some(bad.to_string());
    // Any replica that sees the failures decides a rollback for the group: it writes the
    // shared fields and the copy even where another replica decides swaps.
    // The copy stays the deciding replica's to write: it writes it when it follows.
    let follower = std::mem::replace(&mut s.follower, false);
    activated(
        s,
        kept,
        slot,
        KubeEventType::Warning,
        reasons::ROLLED_BACK,
        message,
        !follower,
    )
    .await;
    s.follower = follower;
}

pub(super) fn short(sha: &str) -> String {
    crate::text::short_sha(sha)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout(watch: u32, threshold: u32) -> crate::crd::RolloutPolicy {
        crate::crd::RolloutPolicy {
            watch_reconciles: watch,
            failure_threshold_percent: threshold,
        }
    }

    /// The decision over the watched reconciles, and no overflow at the largest counts (in
    /// `u32` the products overflowed: a panic in debug builds, a wrapped comparison in release
    /// ones).
    #[test]
    fn a_rollout_verdict_counts_without_overflow() {
        assert_eq!(rollout_verdict(&rollout(10, 50), 3, 5), Verdict::RollBack);
        assert_eq!(rollout_verdict(&rollout(10, 50), 4, 2), Verdict::Watching);
        assert_eq!(rollout_verdict(&rollout(10, 50), 10, 4), Verdict::Passed);
        assert_eq!(rollout_verdict(&rollout(10, 50), 12, 6), Verdict::RollBack);
        let most = crate::crd::MAX_WATCH_RECONCILES;
        assert_eq!(
            rollout_verdict(&rollout(most, 50), 10, 1),
            Verdict::Watching
        );
        assert_eq!(
            rollout_verdict(&rollout(most, 50), most, most / 2 - 1),
            Verdict::Passed
        );
        assert_eq!(
            rollout_verdict(&rollout(most, 50), 1, most / 2),
            Verdict::RollBack
        );
        assert_eq!(
            rollout_verdict(&rollout(most, 100), u32::MAX, u32::MAX),
            Verdict::RollBack
        );
        assert_eq!(
            rollout_verdict(&rollout(u32::MAX, 50), u32::MAX / 2, 1),
            Verdict::Watching
        );
    }
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
            assert!(!f.is_module_failure(0), "{code} is the cluster's: {f}");
        }
        assert!(!CheckFailure::Interrupted("cancelled".into()).is_module_failure(0));
        let on = || "a-1".to_string();
        let pool = CheckFailure::Call {
            on: on(),
            error: CallError::Sandbox {
                detail: "maximum concurrent limit reached".into(),
            },
        };
        assert!(!pool.is_module_failure(0), "a full pool is the host's");
        let busy = CheckFailure::Call {
            on: on(),
            error: CallError::Queued {
                deadline: Duration::from_secs(2),
                slots: 1,
            },
        };
        assert!(
            !busy.is_module_failure(0),
            "no free sandbox slot is the host's"
        );
        let panicked = CheckFailure::Call {
            on: on(),
            error: CallError::Panic {
                message: "boom".into(),
            },
        };
        assert!(panicked.is_module_failure(0));
        assert!(panicked.to_string().contains("dry run on a-1"));
        let deadline = CheckFailure::Call {
            on: on(),
            error: CallError::Deadline {
                deadline: Duration::from_secs(1),
            },
        };
        // A deadline may be the host's CPU starvation: deferred first, refused only after.
        assert!(!deadline.is_module_failure(0));
        assert!(!deadline.is_module_failure(DEADLINE_DEFERRALS - 1));
        assert!(deadline.is_module_failure(DEADLINE_DEFERRALS));
        let invalid = CheckFailure::Intents {
            on: on(),
            rejected: Rejected {
                violations: Vec::new(),
            },
        };
        assert!(invalid.is_module_failure(0));
    }

    #[test]
    fn a_module_that_cannot_be_loaded_for_want_of_a_sandbox_is_deferred_not_refused() {
        let setup = |reason: &'static str| SetupError {
            reason,
            message: "m".into(),
        };
        assert!(matches!(
            SwapError::from(setup(reasons::HOST_BUSY)),
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
    fn a_module_s_bytes_are_kept_only_until_the_copy_holds_them() {
        let mut kept = Kept::default();
        kept.keep("a", Arc::new(vec![1; 1 << 20]), "cm a", &[]);
        assert_eq!(kept.bytes_held(), 1 << 20, "kept for the first copy");
        kept.copied("a");
        assert_eq!(kept.bytes_held(), 0, "the copy holds it: nothing kept");
        // A swap: the previous module's bytes (read back from the copy) and the new one's.
        kept.keep("b", Arc::new(vec![2; 2 << 20]), "cm b", &[]);
        kept.keep_previous("b", "a", Some(Arc::new(vec![1; 1 << 20])));
        assert_eq!(kept.bytes_held(), 3 << 20, "both, until the copy holds b");
        kept.copied("b");
        assert_eq!(
            kept.bytes_held(),
            1 << 20,
            "only the rollback target is kept"
        );
        assert!(kept.bytes_of("a").is_some());
        kept.copied("a");
        assert_eq!(kept.bytes_held(), 0, "rolled back and copied: nothing kept");
        assert_eq!(
            kept.origins
                .iter()
                .map(|(s, o, _)| (s.as_str(), o.as_str()))
                .collect::<Vec<_>>(),
            [("a", "cm a"), ("b", "cm b")],
            "the origins stay, for the status"
        );
        kept.keep("c", Arc::new(vec![3; 1 << 20]), "cm c", &[]);
        kept.keep_previous("c", "z", None);
        assert_eq!(
            kept.bytes_held(),
            1 << 20,
            "no rollback target's bytes to be had"
        );
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
