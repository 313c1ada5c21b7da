//! The admission webhooks: every replica serves `POST /validate/<reconciler>` over HTTPS and
//! answers with the verdict of the module's `validate` on the old and new object, and
//! `POST /finalize/<reconciler>`, which adds the reconciler's finalizer to a primary as it is
//! created ([`finalizer`]); the leader keeps each WasmReconciler's
//! `ValidatingWebhookConfiguration` and `MutatingWebhookConfiguration` in sync
//! ([`crate::admission::config`]).
//!
//! Which module answers: the module serving the reconciler in this process (published by the
//! manager through [`Slots`], so a hot swap applies to admission at once); on a replica that does
//! not run reconcilers (a follower), the module named by the WasmReconciler's
//! `status.activeModule.sha256`, read from its ConfigMap, or, when that holds another module (a
//! refused push, a rolled-back one), from the leader's copy of the active module
//! (`status.moduleCopy`, see [`crate::modules::copy`]); checked against that digest, compiled
//! ahead (on every WasmReconciler change) and cached.
//!
//! Only modules whose metadata declares `validates` get a validating webhook: the contract says a
//! module that does not declare it has nothing to judge, so the host does not put it in the API
//! server's path. Likewise only modules that declare `finalizes` get the finalizer webhook.
//!
//! # Guarantees
//! - A review's budget is `spec.admission.timeoutSeconds` less one second: the wait for a
//!   follower's read of the module and the module's call (capped by `spec.limits.deadline`)
//!   share it, so the host answers before the API server gives up. A read goes on past a
//!   review that stopped waiting (on a task of its own, shared by the reviews after it); at
//!   most [`MAX_COMPILES`] loads compile at once.
//! - A denial carries the module's message prefixed with the offending field
//!   (`spec.track: ...`) in `status.message` (what kubectl prints) and the field again in
//!   `status.details.causes`.
//! - A module failure or timeout follows `spec.admission.failurePolicy`: `Fail` denies with a
//!   message saying the module failed, `Ignore` allows with a warning; both are logged and
//!   counted (`wasmop_admission_errors_total`).
//! - A request is refused before its body is read when its path is not `/validate/<name>` or
//!   `/finalize/<name>` (404), `<name>` is not a WasmReconciler this host serves (404: a stale webhook, the API
//!   server applies its failure policy), the WasmReconciler cache has not synced yet (503), its
//!   `Content-Length` exceeds 8 MiB (413), or a slot of `--webhook-max-reviews` or the body's
//!   bytes of `--webhook-max-review-bytes` ([`budget`]) cannot be had within
//!   [`REVIEW_QUEUE_WAIT`] (429). Each refusal is counted in
//!   `wasmop_server_rejected_total{server="admission",reason}`.
//! - At most `--webhook-max-reviews` bodies, and at most `--webhook-max-review-bytes` of them,
//!   are held at a time, each capped at 8 MiB and read within `--webhook-read-timeout` (408
//!   otherwise); a body over [`INLINE_PARSE_MAX`] is parsed on the blocking pool, not on the
//!   async workers (a smaller one, a few tens of microseconds, where it was read). Connections are
//!   capped and timed out as [`crate::operations::serving`] says.
//! - With `--webhook-client-ca`, a client that does not present a certificate of that CA (and
//!   name, with `--webhook-client-name`) fails the TLS handshake: nothing of it is read or
//!   judged ([`tls::clients`]). Failed handshakes are counted as
//!   `wasmop_server_rejected_total{server="admission",reason="handshake"}`.
//! - A review's objects are handed to the module as the text the API server sent (see `review`):
//!   a review holds its body and one copy of its objects, not a parsed tree.
//!
//! # Errors
//! [`AdmissionError`] when the server cannot start; per-review failures become verdicts.
//!
//! Its parts: [`config`] (the ValidatingWebhookConfigurations) and [`tls`] (the serving certificate).

pub mod budget;
pub mod config;
pub mod finalizer;
mod review;
/// The serving certificate (kept at the crate root, where the test registry uses it too).
pub use crate::tls;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use kube::api::Api;
use kube::core::admission::{AdmissionResponse, Operation};
use kube::core::response::{StatusCause, StatusDetails, StatusSummary};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tracing::Instrument;

use self::budget::ByteBudget;
use self::config::WebhookConfigs;
use self::review::Review;
use self::tls::ServingCert;
use crate::contract::{self, ValidateRequest, ValidateResponse};
use crate::crd::{FailurePolicy, WasmReconciler, parse_duration, parse_quantity};
use crate::engine::{Engine, Limits, Module};
use crate::modules::slot::ModuleSlot;
use crate::operations::probes::text;
use crate::operations::serving::{self, ServerLimits};
use crate::{modules::source, operations::metrics, operations::readiness};

/// How many of the webhook's module loads compile at once (a follower's look-ahead starts one
/// per WasmReconciler; each compile takes up to a few hundred MiB for a large module).
const MAX_COMPILES: usize = 2;

/// The largest AdmissionReview accepted.
pub const MAX_BODY: usize = 8 << 20;

/// How long a review waits for one of the `--webhook-max-reviews` slots before it is answered
/// 429 (the API server then applies the webhook's failure policy).
pub const REVIEW_QUEUE_WAIT: Duration = Duration::from_secs(1);

/// The admission server's defaults: reviews read, parsed and judged at once.
pub const MAX_REVIEWS: usize = 16;

/// The modules serving reconcilers in this process, by WasmReconciler name: the manager
/// publishes, the webhook reads. Clones share one map.
#[derive(Debug, Default, Clone)]
pub struct Slots {
    map: Arc<Mutex<HashMap<String, ModuleSlot>>>,
}

/// The process's serving modules: the [`Slots`] a [`crate::host::Host`] hands its manager and
/// webhook (and tests read).
pub fn slots() -> &'static Slots {
    static SLOTS: OnceLock<Slots> = OnceLock::new();
    SLOTS.get_or_init(Slots::default)
}

impl Slots {
    /// `slot` serves `reconciler` now.
    pub fn publish(&self, reconciler: &str, slot: ModuleSlot) {
        if let Ok(mut m) = self.map.lock() {
            m.insert(reconciler.to_string(), slot);
        }
    }

    /// `reconciler` stopped.
    pub fn remove(&self, reconciler: &str) {
        if let Ok(mut m) = self.map.lock() {
            m.remove(reconciler);
        }
    }

    /// The module serving `reconciler`, if it runs here.
    pub fn module(&self, reconciler: &str) -> Option<Module> {
        let m = self.map.lock().ok()?;
        m.get(reconciler).map(|s| s.active().module.clone())
    }
}

/// A failure to start serving admission.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// The address could not be bound.
    #[error("cannot listen on {addr} for the admission webhook: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate is unusable.
    #[error("{0}")]
    Tls(#[from] tls::TlsError),
}

/// Why a module could not judge a review.
#[derive(Debug, thiserror::Error)]
enum ModuleUnavailable {
    #[error("no module is active yet for WasmReconciler {0}")]
    NotActive(String),
    #[error("{0}")]
    Source(#[from] source::SourceError),
    #[error(
        "ConfigMap {cm} holds module sha256 {found}, but the active module is {active}; waiting for the leader"
    )]
    Digest {
        cm: String,
        found: String,
        active: String,
    },
    #[error("{0}")]
    Load(String),
    #[error("{0}")]
    Copy(#[from] crate::modules::copy::CopyError),
    #[error("{0}")]
    Registry(#[from] crate::modules::oci::OciError),
    #[error(
        "the registry serves module sha256 {found} for {reference}, but the active module is {active}; waiting for the leader"
    )]
    Pulled {
        reference: String,
        found: String,
        active: String,
    },
}

/// What the webhook needs.
struct Webhook {
    client: Client,
    engine: Engine,
    reconcilers: Store<WasmReconciler>,
    /// The modules serving reconcilers in this process.
    slots: Slots,
    /// Modules loaded from ConfigMaps, copies or registries (followers): name -> (sha, module).
    loaded: Mutex<HashMap<String, (String, Module)>>,
    /// The reads and loads under way, one per reconciler, each on a task of its own: the
    /// reviews waiting for a module share its read and wait at most their budget; another
    /// reconciler's read never waits on it (a module slow to read must not hold the others'
    /// reviews past the API server's timeout).
    loading: Mutex<HashMap<String, Loading>>,
    /// Permits of the loads' compiles ([`MAX_COMPILES`]).
    compiles: Semaphore,
    /// How OCI modules are pulled (a follower pulls one its copy cannot hold).
    oci: crate::modules::oci::OciOptions,
}

/// A read and load of a reconciler's module under way: the active digest it reads, and its
/// outcome, shared by every review waiting for it.
#[derive(Clone)]
struct Loading {
    active: String,
    done: futures::future::Shared<futures::future::BoxFuture<'static, Result<Module, String>>>,
}

impl Webhook {
    /// How long a review of `wr` may take in all: `spec.admission.timeoutSeconds` (1-30) less
    /// one second, at least 200 ms; the API server gives up after the timeout.
    fn budget(wr: &WasmReconciler) -> Duration {
        let timeout = Duration::from_secs(
            u64::try_from(wr.spec.admission.timeout_seconds.clamp(1, 30)).unwrap_or(5),
        );
        timeout
            .saturating_sub(Duration::from_secs(1))
            .max(Duration::from_millis(200))
    }

    fn limits(wr: &WasmReconciler) -> Limits {
        let base = Limits::default();
        Limits {
            deadline: parse_duration(&wr.spec.limits.deadline)
                .unwrap_or(base.deadline)
                .min(Self::budget(wr)),
            memory_bytes: parse_quantity(&wr.spec.limits.memory).unwrap_or(base.memory_bytes),
            ..base
        }
    }

    /// The module judging `wr`'s reviews, read and loaded if this process does not hold it.
    ///
    /// *Caveat:* waits for the read as long as it takes (a pull is bounded by its deadline);
    /// a review waits through [`Webhook::module_within`].
    async fn module(self: &Arc<Self>, wr: &WasmReconciler) -> Result<Module, String> {
        match self.served_or_loading(wr)? {
            Ok(m) => Ok(m),
            Err(loading) => loading.await,
        }
    }

    /// [`Webhook::module`], waiting at most `wait` for a read under way (which goes on for
    /// the reviews after it).
    async fn module_within(
        self: &Arc<Self>,
        wr: &WasmReconciler,
        wait: Duration,
    ) -> Result<Module, String> {
        match self.served_or_loading(wr)? {
            Ok(m) => Ok(m),
            Err(loading) => tokio::time::timeout(wait, loading).await.map_err(|_| {
                format!(
                    "its module is still being read (not ready within {wait:?}); reviews fail by the failure policy until it is"
                )
            })?,
        }
    }

    /// The module serving or loaded for `wr`, else the read and load of its active module
    /// (started here unless one is under way).
    #[allow(clippy::type_complexity)]
    fn served_or_loading(
        self: &Arc<Self>,
        wr: &WasmReconciler,
    ) -> Result<
        Result<
            Module,
            futures::future::Shared<futures::future::BoxFuture<'static, Result<Module, String>>>,
        >,
        String,
    > {
        let name = wr.name_any();
        if let Some(m) = self.slots.module(&name) {
            return Ok(Ok(m));
        }
        let active = wr
            .status
            .as_ref()
            .and_then(|s| s.active_module.as_ref())
            .map(|a| a.sha256.clone())
            .ok_or_else(|| ModuleUnavailable::NotActive(name.clone()).to_string())?;
        let mut loading = self.loading.lock().unwrap_or_else(PoisonError::into_inner);
        // Under the lock: a load that ends keeps its module before it leaves `loading`.
        if let Some(m) = self.already_loaded(&name, &active) {
            return Ok(Ok(m));
        }
        if let Some(l) = loading.get(&name).filter(|l| l.active == active) {
            return Ok(Err(l.done.clone()));
        }
        let done = self.spawn_load(wr.clone(), name.clone(), active.clone());
        loading.insert(
            name,
            Loading {
                active,
                done: done.clone(),
            },
        );
        Ok(Err(done))
    }

    /// Reads and loads `wr`'s module `active` on a task of its own, which leaves `loading`
    /// when it ends (a failed read is tried again by the next review).
    fn spawn_load(
        self: &Arc<Self>,
        wr: WasmReconciler,
        name: String,
        active: String,
    ) -> futures::future::Shared<futures::future::BoxFuture<'static, Result<Module, String>>> {
        let webhook = self.clone();
        let task = tokio::spawn(async move {
            let loaded = webhook.load(&wr, &name, &active).await;
            let mut loading = webhook
                .loading
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if loading.get(&name).is_some_and(|l| l.active == active) {
                loading.remove(&name);
            }
            loaded.map_err(|e| e.to_string())
        });
        task.map(|ended| ended.unwrap_or_else(|e| Err(format!("the module's read ended: {e}"))))
            .boxed()
            .shared()
    }

    /// The module loaded for `name` earlier, if it is still the active one.
    fn already_loaded(&self, name: &str, active: &str) -> Option<Module> {
        let l = self.loaded.lock().ok()?;
        let (sha, m) = l.get(name)?;
        sha.eq_ignore_ascii_case(active).then(|| m.clone())
    }

    /// Reads the active module of `wr` (from its ConfigMap, the leader's copy or its registry),
    /// loads it and keeps it.
    async fn load(
        &self,
        wr: &WasmReconciler,
        name: &str,
        active: &str,
    ) -> Result<Module, ModuleUnavailable> {
        let name = name.to_string();
        let active = active.to_string();
        // The copy holds no signature: under a signing policy the module is pulled and
        // verified, never read from the copy; a host requiring signatures serves no ConfigMap.
        let signed = self.oci.required_key.is_some()
            || wr
                .spec
                .module
                .oci
                .as_ref()
                .is_some_and(|o| o.verify.is_some());
        let copy = wr
            .status
            .as_ref()
            .and_then(|s| s.module_copy.as_ref())
            .filter(|_| !signed);
        let bytes = match (&wr.spec.module.config_map, copy) {
            (Some(_), _) if self.oci.required_key.is_some() => {
                return Err(ModuleUnavailable::Load(
                    "this host requires signed modules (--require-signed-modules): a ConfigMap module does not judge reviews".into(),
                ));
            }
            (Some(source), copy) => {
                let bytes = source::fetch(&self.client, source).await?;
                let found = bytes.bytes.sha256().to_string();
                if found.eq_ignore_ascii_case(&active) {
                    bytes
                } else {
                    // The ConfigMap holds a module that is not serving: the leader's copy holds
                    // the one that is.
                    let Some(copy) = copy else {
                        return Err(ModuleUnavailable::Digest {
                            cm: format!("{}/{}", source.namespace, source.name),
                            found,
                            active,
                        });
                    };
                    crate::modules::copy::load(&self.client, copy, &active).await?
                }
            }
            // An OCI module is read from the leader's copy, not pulled by every follower; one
            // the copy cannot hold (over ~1 MiB) is pulled by its pinned digest and checked.
            (None, copy) => match copy {
                Some(copy) => match crate::modules::copy::load(&self.client, copy, &active).await {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        tracing::info!(reconciler = %name, copy = %e, "the module copy cannot serve; pulling the module from its registry");
                        self.pull(wr, &active).await?
                    }
                },
                None => self.pull(wr, &active).await?,
            },
        };
        let found = bytes.bytes.sha256().to_string();
        let (engine, limits) = (self.engine.clone(), Self::limits(wr));
        // Reads run side by side (one may stall); compiles, which take memory, two at a time.
        let _compiling = self
            .compiles
            .acquire()
            .await
            .map_err(|e| ModuleUnavailable::Load(e.to_string()))?;
        let module =
            tokio::task::spawn_blocking(move || engine.load_digested(&bytes.bytes, &limits))
                .await
                .map_err(|e| ModuleUnavailable::Load(e.to_string()))?
                .map_err(|e| ModuleUnavailable::Load(e.to_string()))?;
        let module = crate::metacontroller::serve(module, &wr.spec)
            .map_err(|e| ModuleUnavailable::Load(e.to_string()))?;
        tracing::info!(reconciler = %name, sha256 = %crate::text::short_hex(&found), "loaded the module for admission");
        if let Ok(mut l) = self.loaded.lock() {
            l.insert(name, (found, module.clone()));
        }
        Ok(module)
    }

    /// Pulls `wr`'s OCI module as the spec pins it (the host's signature policy included) and
    /// checks that it is the active one.
    async fn pull(
        &self,
        wr: &WasmReconciler,
        active: &str,
    ) -> Result<source::ModuleBytes, ModuleUnavailable> {
        let Some(spec) = wr.spec.module.oci.as_ref() else {
            return Err(ModuleUnavailable::NotActive(wr.name_any()));
        };
        let pulled = crate::modules::oci::fetch(&self.client, &self.oci, spec).await?;
        let found = pulled.bytes.sha256().to_string();
        if !found.eq_ignore_ascii_case(active) {
            return Err(ModuleUnavailable::Pulled {
                reference: spec.reference.clone(),
                found,
                active: active.to_string(),
            });
        }
        Ok(source::ModuleBytes {
            bytes: pulled.bytes,
            key: String::new(),
            resource_version: pulled.manifest_digest,
        })
    }

    async fn review(
        self: &Arc<Self>,
        name: &str,
        review: Result<Review, String>,
    ) -> AdmissionResponse {
        let request = match review {
            Ok(r) => r,
            Err(e) => return AdmissionResponse::invalid(format!("not an AdmissionReview: {e}")),
        };
        let response = allowed(&request);
        let operation = match request.operation {
            Operation::Create => contract::Operation::Create,
            Operation::Update => contract::Operation::Update,
            _ => return response,
        };
        let Some(wr) = self
            .reconcilers
            .state()
            .into_iter()
            .find(|w| w.name_any() == name)
        else {
            let mut r = response;
            r.warnings = Some(vec![format!(
                "wasmop: no WasmReconciler {name} is served here; the change was not validated"
            )]);
            return r;
        };
        let object = format!(
            "{}/{}",
            request.namespace.as_deref().unwrap_or_default(),
            request.name
        );
        let verdict = self.judge(&wr, &request, operation).await;
        let policy = wr.spec.admission.failure_policy;
        let response = match verdict {
            Ok(ValidateResponse::Allowed { warnings }) => {
                let mut r = response;
                if !warnings.is_empty() {
                    r.warnings = Some(warnings);
                }
                r
            }
            Ok(ValidateResponse::Denied { message, field }) => {
                tracing::info!(reconciler = name, %object, field = field.as_deref().unwrap_or(""), %message, "denied");
                deny(response, &request, message, field)
            }
            Err(e) => {
                metrics::global().admission_error(name);
                tracing::warn!(reconciler = name, %object, error = %e, policy = policy.as_str(), "the module could not validate");
                match policy {
                    FailurePolicy::Fail => response.deny(format!(
                        "wasmop: the module of WasmReconciler {name} could not validate this change: {e} (failurePolicy Fail)"
                    )),
                    FailurePolicy::Ignore => {
                        let mut r = response;
                        r.warnings = Some(vec![format!(
                            "wasmop: not validated, the module of WasmReconciler {name} failed: {e} (failurePolicy Ignore)"
                        )]);
                        r
                    }
                }
            }
        };
        metrics::global().admission(name, response.allowed);
        response
    }

    /// The finalizer webhook's answer for a review of WasmReconciler `name`: always allowed,
    /// with the patch adding its finalizer when [`finalizer::finalizer_patch`] gives one.
    fn finalizer(&self, name: &str, review: Result<Review, String>) -> AdmissionResponse {
        let request = match review {
            Ok(r) => r,
            Err(e) => return AdmissionResponse::invalid(format!("not an AdmissionReview: {e}")),
        };
        let response = allowed(&request);
        let (Operation::Create, Some(object)) = (&request.operation, request.object()) else {
            return response;
        };
        let all = self.reconcilers.state();
        let Some(wr) = all.iter().find(|w| w.name_any() == name) else {
            return response;
        };
        let finalizes = self.served(wr).map(|m| m.metadata().finalizes);
        let all = all.iter().map(|w| &**w);
        let namespace = request.namespace.as_deref();
        let Some(patch) = finalizer::finalizer_patch(wr, all, namespace, object, finalizes) else {
            return response;
        };
        match response.with_patch(patch) {
            Ok(r) => {
                metrics::global().finalizer_added(name);
                r
            }
            Err(e) => {
                tracing::warn!(reconciler = name, error = %e, "the finalizer patch does not serialize");
                allowed(&request)
            }
        }
    }

    /// The module serving `wr` on this replica, without reading or loading one: the manager's,
    /// or one loaded ahead for admission that is still the active one.
    fn served(&self, wr: &WasmReconciler) -> Option<Module> {
        let name = wr.name_any();
        self.slots.module(&name).or_else(|| {
            let active = &wr.status.as_ref()?.active_module.as_ref()?.sha256;
            self.already_loaded(&name, active)
        })
    }

    /// The module's verdict on `request`, within the review's budget: the wait for the module
    /// (a follower's read) and the call together.
    async fn judge(
        self: &Arc<Self>,
        wr: &WasmReconciler,
        request: &Review,
        operation: contract::Operation,
    ) -> Result<ValidateResponse, String> {
        let started = std::time::Instant::now();
        let budget = Self::budget(wr);
        let module = self.module_within(wr, budget).await?;
        if !module.metadata().validates {
            return Ok(ValidateResponse::Allowed {
                warnings: Vec::new(),
            });
        }
        let new = request
            .object()
            .ok_or("the review has no object")?
            .to_string();
        let old = request.old_object().map(str::to_string);
        let call = ValidateRequest {
            operation,
            old,
            new,
            config: wr
                .spec
                .config
                .clone()
                .unwrap_or_else(|| serde_json::json!({}))
                .to_string(),
        };
        let mut limits = Self::limits(wr);
        // What the wait for the module left of the budget, at least 100 ms (a module that
        // answers in it is still heard).
        limits.deadline = limits.deadline.min(
            budget
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(100)),
        );
        let name = wr.name_any();
        // A panic in the call (a host or engine bug) fails this review only.
        let validating = std::panic::AssertUnwindSafe(module.validate_async(call, &limits));
        let outcome = tokio::time::timeout(
            limits.deadline + Duration::from_millis(500),
            futures::FutureExt::catch_unwind(validating),
        )
        .await
        .map_err(|_| format!("no verdict within {:?}", limits.deadline))?
        .map_err(|_| "the module call panicked".to_string())?;
        metrics::global().module_call(&name, "validate", &outcome.stats);
        outcome.result.map_err(|e| e.to_string())
    }
}

/// The largest review parsed on the async worker that read it: parsing it takes less than
/// the two context switches of a hop to the blocking pool and back.
pub const INLINE_PARSE_MAX: usize = 64 << 10;

/// Parses a review's body: where it was read when small, else on the blocking pool.
///
/// # Errors
/// The blocking thread's failure (the parse's own is in the inner result).
async fn parse_review(body: Vec<u8>) -> Result<Result<Review, String>, tokio::task::JoinError> {
    if body.len() <= INLINE_PARSE_MAX {
        return Ok(review::parse(body));
    }
    tokio::task::spawn_blocking(move || review::parse(body)).await
}

/// The answer allowing `request` (what a verdict starts from).
fn allowed(request: &Review) -> AdmissionResponse {
    let mut r = AdmissionResponse::invalid("");
    r.types = request.types.clone();
    r.uid = request.uid.clone();
    r.allowed = true;
    r.result = Default::default();
    r
}

/// A denial as kubectl shows it: `field: message` (even when the message names the field too:
/// the prefix is what tools parse), with the field in the details too.
fn deny(
    response: AdmissionResponse,
    request: &Review,
    message: String,
    field: Option<String>,
) -> AdmissionResponse {
    let text = match &field {
        Some(f) if !message.starts_with(&format!("{f}:")) => format!("{f}: {message}"),
        _ => message.clone(),
    };
    let mut r = response.deny(&text);
    r.result.status = Some(StatusSummary::Failure);
    r.result.code = 422;
    r.result.reason = "Invalid".into();
    r.result.details = Some(StatusDetails {
        name: request.name.clone(),
        group: request.kind.group.clone(),
        kind: request.kind.kind.clone(),
        uid: String::new(),
        causes: vec![StatusCause {
            reason: "FieldValueInvalid".into(),
            message,
            field: field.unwrap_or_default(),
        }],
        retry_after_seconds: 0,
    });
    r
}

/// What [`serve`] needs.
pub struct Setup {
    /// The serving certificate.
    pub cert: ServingCert,
    /// The host's client.
    pub client: Client,
    /// The engine follower modules are loaded with.
    pub engine: Engine,
    /// Only WasmReconcilers matching this label selector.
    pub selector: Option<String>,
    /// Where the leader writes webhook configurations (None: not managed).
    pub configs: Option<WebhookConfigs>,
    /// Connection cap and read timeout.
    pub limits: ServerLimits,
    /// Reviews read, parsed and judged at once (at least 1).
    pub max_reviews: usize,
    /// Bytes of review bodies held at once ([`budget`]).
    pub max_review_bytes: usize,
    /// The modules serving reconcilers in this process (the manager's).
    pub slots: Slots,
    /// How OCI modules are pulled (a follower pulls one the leader's copy cannot hold).
    pub oci: crate::modules::oci::OciOptions,
    /// The clients accepted (None: any; see [`tls::clients`]).
    pub clients: Option<tls::ClientAuth>,
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup")
            .field("selector", &self.selector)
            .field("configs", &self.configs)
            .field("limits", &self.limits)
            .field("max_reviews", &self.max_reviews)
            .field("max_review_bytes", &self.max_review_bytes)
            .field("clients", &self.clients)
            .finish_non_exhaustive()
    }
}

/// A bound admission server.
pub struct Bound {
    listener: TcpListener,
    /// The bound address.
    pub addr: SocketAddr,
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound").field("addr", &self.addr).finish()
    }
}

/// Binds the webhook's address (before the certificate is made: it may name the bound IP), with
/// a backlog of `limits.max_connections`, at least 1024 ([`serving::listen`]).
///
/// # Errors
/// [`AdmissionError::Bind`].
pub fn bind(addr: SocketAddr, limits: &ServerLimits) -> Result<Bound, AdmissionError> {
    let listener =
        serving::listen(addr, limits).map_err(|source| AdmissionError::Bind { addr, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| AdmissionError::Bind { addr, source })?;
    Ok(Bound { listener, addr })
}

/// Serves admission until `shutdown`: watches WasmReconcilers, answers reviews, loads follower
/// modules ahead, and, while `leading` is true, keeps the webhook configurations in sync.
///
/// # Errors
/// [`AdmissionError::Tls`] when the certificate is unusable.
pub async fn serve(
    bound: Bound,
    setup: Setup,
    leading: watch::Receiver<bool>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>, AdmissionError> {
    let Setup {
        cert,
        client,
        engine,
        selector,
        configs,
        limits,
        max_reviews,
        max_review_bytes,
        slots,
        oci,
        clients,
    } = setup;
    let acceptor = tokio_rustls::TlsAcceptor::from(cert.server_config_for(clients.as_ref())?);
    let api: Api<WasmReconciler> = Api::all(client.clone());
    let wc = match &selector {
        Some(s) => watcher::Config::default().labels(s),
        None => watcher::Config::default(),
    };
    let (reader, writer) = reflector::store();
    // Boxed, as the futures below: built inline, the server's future took ~2 MiB of a debug
    // build's stack on its way to `tokio::spawn`, the whole stack of a test thread.
    let events = reflector::reflector(writer, watcher(api, wc).default_backoff()).boxed();
    let webhook = Arc::new(Webhook {
        client,
        engine,
        reconcilers: reader.clone(),
        slots,
        loaded: Mutex::default(),
        loading: Mutex::default(),
        compiles: Semaphore::new(MAX_COMPILES),
        oci,
    });
    readiness::global().pending("admission");
    let addr = bound.addr;
    let listener = bound.listener;
    let server = Arc::new(Server {
        webhook: webhook.clone(),
        reviews: Semaphore::new(max_reviews.max(1)),
        budget: ByteBudget::new(max_review_bytes),
        read_timeout: limits.read_timeout,
    });
    let http = serving::http1(&limits);
    Ok(Box::pin(
        async move {
            let sync = Box::pin(keep_in_sync(webhook, reader, events, configs, leading));
            let stop = async move {
                tokio::select! {
                    _ = shutdown => {}
                    _ = sync => {}
                }
            };
            serving::accept_loop("admission", listener, limits, stop, move |stream, peer| {
            let (acceptor, server, http) = (acceptor.clone(), server.clone(), http.clone());
            async move {
                let tls = match tokio::time::timeout(server.read_timeout, acceptor.accept(stream))
                    .await
                {
                    Ok(Ok(t)) => t,
                    Ok(Err(e)) => {
                        // Without an accepted client certificate (`--webhook-client-ca`) too.
                        metrics::global().server_rejected("admission", "handshake");
                        tracing::debug!(%peer, error = %e, "TLS handshake");
                        return;
                    }
                    Err(_) => {
                        metrics::global().server_rejected("admission", "timeout");
                        tracing::debug!(%peer, "no TLS handshake within the read timeout; closing");
                        return;
                    }
                };
                let service = service_fn(move |req: Request<Incoming>| {
                    let server = server.clone();
                    async move { Ok::<_, Infallible>(handle(&server, req).await) }
                });
                if let Err(e) = http.serve_connection(TokioIo::new(tls), service).await {
                    tracing::debug!(%peer, error = %e, "admission connection");
                }
            }
        })
        .await;
            readiness::global().forget("admission");
        }
        .instrument(tracing::info_span!("admission", %addr)),
    ))
}

/// What each connection's requests need.
struct Server {
    webhook: Arc<Webhook>,
    /// Slots for reviews being read, parsed and judged.
    reviews: Semaphore,
    /// Bytes of review bodies held at once.
    budget: ByteBudget,
    read_timeout: Duration,
}

/// A refusal before any work, counted by reason.
fn refuse(status: StatusCode, reason: &str, message: String) -> Response<Full<Bytes>> {
    metrics::global().server_rejected("admission", reason);
    let mut r = text(status, "text/plain", message);
    if status == StatusCode::TOO_MANY_REQUESTS
        && let Ok(v) = http::HeaderValue::from_str("1")
    {
        r.headers_mut().insert(http::header::RETRY_AFTER, v);
    }
    r
}

/// Routes one request: everything that can be refused is refused before the body is read.
async fn handle<B>(server: &Server, req: Request<B>) -> Response<Full<Bytes>>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let started = std::time::Instant::now();
    let path = req.uri().path().to_string();
    let Some((hook, name)) = route(&path) else {
        return refuse(StatusCode::NOT_FOUND, "unknown", "not found\n".into());
    };
    if req.method() != Method::POST {
        return refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            "unknown",
            "POST only\n".into(),
        );
    }
    let webhook = &server.webhook;
    if webhook
        .reconcilers
        .wait_until_ready()
        .now_or_never()
        .is_none()
    {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "wasmop: the WasmReconcilers are not listed yet\n".into(),
        );
    }
    if webhook.reconcilers.find(|w| w.name_any() == name).is_none() {
        return refuse(
            StatusCode::NOT_FOUND,
            "unknown",
            format!("wasmop: no WasmReconciler {name} is served here\n"),
        );
    }
    let cap = MAX_BODY.min(server.budget.total());
    let declared = content_length(&req);
    if declared.is_some_and(|n| n > cap as u64) {
        return too_large(cap);
    }
    // A slot and the body's bytes, both within the queue wait: a review that cannot have them
    // is answered at once, not queued.
    let want = declared.map_or(budget::STEP.min(cap), |n| n as usize);
    let admitted = tokio::time::timeout(REVIEW_QUEUE_WAIT, async {
        let slot = server.reviews.acquire().await.ok()?;
        Some((slot, server.budget.reserve(want).await?))
    });
    let Ok(Some((_slot, mut reserved))) = admitted.await else {
        tracing::warn!(
            reconciler = name,
            "too many admission reviews or review bytes in flight; answering 429"
        );
        return refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "reviews",
            "wasmop: too many reviews in flight\n".into(),
        );
    };
    let body = read_body(req.into_body(), &mut reserved, cap);
    let body = match tokio::time::timeout(server.read_timeout, body).await {
        Ok(Ok(b)) => b,
        Ok(Err(ReadError::TooLarge)) => return too_large(cap),
        Ok(Err(ReadError::OverBudget)) => {
            return refuse(
                StatusCode::TOO_MANY_REQUESTS,
                "reviews",
                "wasmop: too many review bytes in flight\n".into(),
            );
        }
        Ok(Err(ReadError::Body(e))) => {
            return text(
                StatusCode::BAD_REQUEST,
                "text/plain",
                format!("cannot read the review: {e}\n"),
            );
        }
        Err(_) => {
            return refuse(
                StatusCode::REQUEST_TIMEOUT,
                "timeout",
                format!(
                    "wasmop: the review was not sent within {:?}\n",
                    server.read_timeout
                ),
            );
        }
    };
    let parsed = match parse_review(body).await {
        Ok(p) => p,
        Err(e) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("wasmop: parsing the review failed: {e}\n"),
            );
        }
    };
    let response = match hook {
        Hook::Validate => {
            webhook
                .review(name, parsed)
                .instrument(tracing::info_span!("review", reconciler = name))
                .await
        }
        Hook::Finalizer => webhook.finalizer(name, parsed),
    };
    let answer = match serde_json::to_string(&response.into_review()) {
        Ok(json) => text(StatusCode::OK, "application/json", json),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("{e}\n"),
        ),
    };
    metrics::global().admission_review(name, hook.as_str(), started.elapsed());
    answer
}

/// Which webhook a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hook {
    /// `/validate/<name>`: the module's verdict.
    Validate,
    /// `/finalize/<name>`: the reconciler's finalizer on a created primary ([`finalizer`]).
    Finalizer,
}

impl Hook {
    /// Its name in metrics: `validate` or `finalizer`.
    fn as_str(self) -> &'static str {
        match self {
            Hook::Validate => "validate",
            Hook::Finalizer => "finalizer",
        }
    }
}

/// The webhook and WasmReconciler name `path` is for, if any.
fn route(path: &str) -> Option<(Hook, &str)> {
    let (hook, name) = if let Some(name) = path.strip_prefix("/validate/") {
        (Hook::Validate, name)
    } else {
        (Hook::Finalizer, path.strip_prefix("/finalize/")?)
    };
    (!name.is_empty() && !name.contains('/')).then_some((hook, name))
}

fn too_large(cap: usize) -> Response<Full<Bytes>> {
    refuse(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("wasmop: an AdmissionReview is at most {cap} bytes\n"),
    )
}

/// Why a body was not read.
enum ReadError {
    /// Over the body cap.
    TooLarge,
    /// Longer than declared and the budget has no more bytes now.
    OverBudget,
    /// The connection failed.
    Body(String),
}

/// Reads a body into one buffer no larger than `reserved` (grown [`budget::STEP`] at a time for
/// a body longer than reserved, while the budget allows) and `cap`.
async fn read_body<B>(
    body: B,
    reserved: &mut budget::Reservation<'_>,
    cap: usize,
) -> Result<Vec<u8>, ReadError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut body = std::pin::pin!(body);
    let mut buf = Vec::with_capacity(reserved.bytes());
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            let e: Box<dyn std::error::Error + Send + Sync> = e.into();
            ReadError::Body(e.to_string())
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let len = buf.len() + data.len();
        if len > cap {
            return Err(ReadError::TooLarge);
        }
        if len > reserved.bytes() {
            // At least what this frame needs (len <= cap), a step ahead when the cap allows.
            let more = (len - reserved.bytes())
                .max(budget::STEP)
                .min(cap.saturating_sub(reserved.bytes()));
            if !reserved.grow(more) {
                return Err(ReadError::OverBudget);
            }
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf)
}

/// The request's declared body length, if any.
fn content_length<B>(req: &Request<B>) -> Option<u64> {
    req.headers()
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Follows WasmReconcilers: loads follower modules ahead and, while leading, applies or removes
/// each one's webhook configuration. Returns only if the watch ends.
///
/// *Guarantees:* each reconciler's look-ahead runs on a task of its own ([`look_ahead`]): a
/// module slow to read holds neither the others' nor this loop (a deletion, a change of
/// leadership); a newer change of a reconciler, or its deletion, ends the look-ahead of the
/// one before, so an older spec's configuration is never applied after it.
async fn keep_in_sync(
    webhook: Arc<Webhook>,
    reader: Store<WasmReconciler>,
    events: impl futures::Stream<Item = Result<watcher::Event<WasmReconciler>, watcher::Error>> + Send,
    configs: Option<WebhookConfigs>,
    mut leading: watch::Receiver<bool>,
) {
    let mut events = std::pin::pin!(events);
    let mut ready = false;
    let mut ahead: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    loop {
        ahead.retain(|_, task| !task.is_finished());
        let changed: Vec<Arc<WasmReconciler>> = tokio::select! {
            e = events.next() => match e {
                None => return,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "watching WasmReconcilers for admission");
                    continue;
                }
                Some(Ok(watcher::Event::Apply(wr) | watcher::Event::InitApply(wr))) => vec![Arc::new(wr)],
                Some(Ok(watcher::Event::Delete(wr))) => {
                    let name = wr.name_any();
                    if let Some(task) = ahead.remove(&name) {
                        task.abort();
                    }
                    if let Ok(mut l) = webhook.loaded.lock() {
                        l.remove(&name);
                    }
                    if let Ok(mut l) = webhook.loading.lock() {
                        l.remove(&name);
                    }
                    if *leading.borrow()
                        && let Some(c) = &configs
                    {
                        for e in [c.remove(&name).await, c.remove_finalizer(&name).await].into_iter().filter_map(Result::err) {
                            tracing::warn!(reconciler = %name, error = %e, "removing the webhook configurations");
                        }
                    }
                    continue;
                }
                Some(Ok(watcher::Event::Init)) => continue,
                Some(Ok(watcher::Event::InitDone)) => {
                    if !ready {
                        ready = true;
                        readiness::global().ready("admission");
                    }
                    reader.state()
                }
            },
            r = leading.changed() => {
                if r.is_err() {
                    return;
                }
                reader.state()
            }
        };
        for wr in changed {
            let task = tokio::spawn(look_ahead(
                webhook.clone(),
                wr.clone(),
                reader.clone(),
                configs.clone(),
                leading.clone(),
            ));
            if let Some(before) = ahead.insert(wr.name_any(), task) {
                before.abort();
            }
        }
    }
}

/// Loads `wr`'s module ahead (a follower's reviews then find it loaded) and, while leading,
/// applies or removes its webhook configurations as the module declares.
async fn look_ahead(
    webhook: Arc<Webhook>,
    wr: Arc<WasmReconciler>,
    reader: Store<WasmReconciler>,
    configs: Option<WebhookConfigs>,
    leading: watch::Receiver<bool>,
) {
    let module = match webhook.module(&wr).await {
        Ok(m) => m,
        Err(e) => {
            tracing::debug!(reconciler = %wr.name_any(), error = %e, "no module for admission yet");
            return;
        }
    };
    let declared = (module.metadata().validates, module.metadata().finalizes);
    if !accepted(&wr) {
        tracing::debug!(reconciler = %wr.name_any(), "its current spec is not served (yet): its webhook configurations are left as they are");
        return;
    }
    if let Some(c) = configs.as_ref().filter(|_| *leading.borrow()) {
        sync_configs(c, &wr, &reader.state(), declared).await;
    }
}

/// Whether the manager serves `wr`'s current spec: `Ready=True` for its generation. Only
/// then are its webhook configurations written from that spec: a spec the manager refused
/// (another tenant's primary kind, namespaces its ServiceAccount may not read) must not put
/// the module, loaded for the spec before, in the path of that kind's writes.
fn accepted(wr: &WasmReconciler) -> bool {
    let Some(status) = &wr.status else {
        return false;
    };
    let current = status.observed_generation.is_some()
        && status.observed_generation == wr.metadata.generation;
    current
        && status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Applies or removes `wr`'s webhook configurations as its module declares (`validates`,
/// `finalizes`); `all` are the WasmReconcilers known (for the finalizer webhook's conflicts).
async fn sync_configs(
    c: &WebhookConfigs,
    wr: &WasmReconciler,
    all: &[Arc<WasmReconciler>],
    (validates, finalizes): (bool, bool),
) {
    let name = wr.name_any();
    let validating = if validates {
        c.apply(wr).await
    } else {
        c.remove(&name).await
    };
    if let Err(e) = validating {
        tracing::warn!(reconciler = %name, error = %e, "keeping the validating webhook configuration");
    }
    let finalizer = if finalizes {
        c.apply_finalizer(wr, all).await
    } else {
        c.remove_finalizer(&name).await.map(|()| false)
    };
    match finalizer {
        Ok(applied) => {
            tracing::debug!(reconciler = %name, applied, "finalizer webhook configuration")
        }
        Err(e) => {
            tracing::warn!(reconciler = %name, error = %e, "keeping the finalizer webhook configuration")
        }
    }
}
