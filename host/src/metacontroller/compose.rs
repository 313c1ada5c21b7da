//! The controller of CompositeControllers: each one with `spec.wasmop` is served by a
//! WasmReconciler of its own (`compositecontroller-<name>`, owned by it), which the rest of the
//! host runs like any other; the CompositeController's `Ready` condition says whether and why.
//!
//! # Guarantees
//! - A CompositeController without `spec.wasmop` is left to Metacontroller: nothing is written
//!   on it, and a WasmReconciler wasmop made for it earlier is deleted.
//! - A refused controller (see [`refusal`]) has no WasmReconciler: wasmop does not serve part
//!   of it.
//! - A WasmReconciler of that name that another controller (or an administrator) owns is never
//!   overwritten (`Ready=False`, `NameTaken`).
//! - The WasmReconciler carries the controller's labels (and [`CONTROLLER_LABEL`]), so a host
//!   serving a label selector serves both or neither.
//! - Every controller is looked at again every 5 minutes (a WasmReconciler deleted by hand
//!   comes back), and every 30 s while its resources are not served or its name is taken.
//! - A plain loop over one watch, not kube-runtime's `Controller`: the host's tests run it on
//!   their own thread's stack beside everything else.
//! - Every write is idempotent (server-side apply under the field manager `wasmop`), so
//!   replicas that each run this controller (sharding) agree.
//!
//! # Caveats
//! - Whoever may create a CompositeController with `spec.wasmop` may have the host impersonate
//!   the ServiceAccount it names, as with a WasmReconciler: grant `compositecontrollers` to
//!   administrators only (Kubernetes grants it to nobody else by default).

use std::time::Duration;

use std::collections::BTreeMap;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::crd::{FIELD_MANAGER, KindRef, WasmReconciler};
use crate::discovery::Discovery;
use crate::reasons;

use super::api::{CompositeController, ControllerStatus, DecoratorController, WasmopHooks};
use super::spec::{Kinds, Refusal};

/// The label on a WasmReconciler serving a CompositeController: the controller's name.
pub const CONTROLLER_LABEL: &str = "wasmop.dev/compositecontroller";

/// The label on a WasmReconciler serving a DecoratorController: the controller's name.
pub const DECORATOR_LABEL: &str = "wasmop.dev/decoratorcontroller";

/// A resource by apiVersion and plural name.
type Named = (String, String);

/// A Metacontroller controller kind that wasmop serves through WasmReconcilers.
pub trait Served:
    Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The label on its WasmReconcilers ([`CONTROLLER_LABEL`]).
    const LABEL: &'static str;
    /// The name of the WasmReconciler serving the controller `name`.
    fn reconciler_name(name: &str) -> String;
    /// `spec.wasmop`.
    fn wasmop(&self) -> Option<&WasmopHooks>;
    /// The status wasmop wrote.
    fn served_status(&self) -> Option<&ControllerStatus>;
    /// The first feature wasmop refuses.
    fn refusal(&self) -> Option<Refusal>;
    /// The parent, child and related resources, to be resolved to kinds.
    fn resources(&self) -> (Named, Vec<Named>, Vec<Named>);
    /// The WasmReconciler spec, once the resources are kinds.
    ///
    /// # Errors
    /// Why the controller is refused.
    fn reconciler_spec(&self, kinds: &Kinds) -> Result<crate::crd::WasmReconcilerSpec, Refusal>;
}

fn related_of(wasmop: Option<&WasmopHooks>) -> Vec<Named> {
    wasmop
        .iter()
        .flat_map(|w| w.related.iter())
        .map(|r| (r.api_version.clone(), r.resource.clone()))
        .collect()
}

impl Served for CompositeController {
    const LABEL: &'static str = CONTROLLER_LABEL;
    fn reconciler_name(name: &str) -> String {
        super::spec::reconciler_name(name)
    }
    fn wasmop(&self) -> Option<&WasmopHooks> {
        self.spec.wasmop.as_ref()
    }
    fn served_status(&self) -> Option<&ControllerStatus> {
        self.status.as_ref()
    }
    fn refusal(&self) -> Option<Refusal> {
        super::spec::refusal(self)
    }
    fn resources(&self) -> (Named, Vec<Named>, Vec<Named>) {
        let parent = &self.spec.parent_resource;
        let children = self.spec.child_resources.iter();
        (
            (parent.api_version.clone(), parent.resource.clone()),
            children
                .map(|c| (c.api_version.clone(), c.resource.clone()))
                .collect(),
            related_of(self.spec.wasmop.as_ref()),
        )
    }
    fn reconciler_spec(&self, kinds: &Kinds) -> Result<crate::crd::WasmReconcilerSpec, Refusal> {
        super::spec::reconciler_spec(self, kinds)
    }
}

impl Served for DecoratorController {
    const LABEL: &'static str = DECORATOR_LABEL;
    fn reconciler_name(name: &str) -> String {
        super::decorator::reconciler_name(name)
    }
    fn wasmop(&self) -> Option<&WasmopHooks> {
        self.spec.wasmop.as_ref()
    }
    fn served_status(&self) -> Option<&ControllerStatus> {
        self.status.as_ref()
    }
    fn refusal(&self) -> Option<Refusal> {
        super::decorator::refusal(self)
    }
    fn resources(&self) -> (Named, Vec<Named>, Vec<Named>) {
        // `refusal` passed: exactly one resource.
        let parent = self.spec.resources.first();
        let attachments = self.spec.attachments.iter();
        (
            parent
                .map(|p| (p.api_version.clone(), p.resource.clone()))
                .unwrap_or_default(),
            attachments
                .map(|a| (a.api_version.clone(), a.resource.clone()))
                .collect(),
            related_of(self.spec.wasmop.as_ref()),
        )
    }
    fn reconciler_spec(&self, kinds: &Kinds) -> Result<crate::crd::WasmReconcilerSpec, Refusal> {
        super::decorator::reconciler_spec(self, kinds)
    }
}

/// How often a controller whose resources are not served yet is looked at again.
const RETRY: Duration = Duration::from_secs(30);

struct Ctx {
    client: Client,
    discovery: Discovery,
}

/// A failure to write, retried with backoff.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ComposeError(String);

/// Serves CompositeControllers and DecoratorControllers (see [`run`]) until `stop` turns true.
pub async fn run_all(
    client: Client,
    discovery: Discovery,
    selector: Option<String>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let composite = run::<CompositeController>(
        client.clone(),
        discovery.clone(),
        selector.clone(),
        stop.clone(),
    );
    let decorator = run::<DecoratorController>(client, discovery, selector, stop);
    futures::future::join(Box::pin(composite), Box::pin(decorator)).await;
}

/// Runs until `stop` turns true, if the API server serves `K` (checked once a minute until it
/// does: Metacontroller's CRD, or wasmop's, installed later is picked up).
pub async fn run<K: Served>(
    client: Client,
    discovery: Discovery,
    selector: Option<String>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let kind = crate::contract::Gvk::new(K::api_version(&()), K::kind(&()));
    while discovery.refresh(&kind).await.is_err() {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
    }
    tracing::info!(kind = %kind.kind, "serving Metacontroller controllers that name a module in spec.wasmop");
    let ctx = Ctx {
        client: client.clone(),
        discovery,
    };
    // The host's selector (`--selector`) chooses the controllers too; their WasmReconcilers
    // carry their labels, so the same host serves them.
    let config = match &selector {
        Some(s) => watcher::Config::default().labels(s),
        None => watcher::Config::default(),
    };
    let mut events = watcher(Api::<K>::all(client), config)
        .default_backoff()
        .boxed();
    let mut queue = Queue::<K>::default();
    let mut tick = tokio::time::interval(TICK);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            event = events.try_next() => match event {
                Ok(Some(e)) => queue.event(e),
                Ok(None) => break,
                Err(e) => tracing::warn!(kind = %kind.kind, error = %e, "watching Metacontroller controllers"),
            },
            _ = tick.tick() => {}
        }
        for cc in queue.due() {
            let after = match reconcile(&cc, &ctx).await {
                Ok(after) => after,
                Err(e) => {
                    tracing::warn!(kind = %kind.kind, controller = %cc.name_any(), error = %e, "serving a Metacontroller controller; retried");
                    Some(Duration::from_secs(5))
                }
            };
            queue.again(&cc.name_any(), after);
        }
    }
}

/// How often the queue looks for controllers due again.
const TICK: Duration = Duration::from_secs(5);

/// How often every controller is looked at again (a WasmReconciler deleted by hand comes back).
const RESYNC: Duration = Duration::from_secs(300);

/// The controllers seen (their latest version) and when each is due.
struct Queue<K> {
    latest: BTreeMap<String, K>,
    due: BTreeMap<String, Instant>,
}

impl<K> Default for Queue<K> {
    fn default() -> Self {
        Queue {
            latest: BTreeMap::new(),
            due: BTreeMap::new(),
        }
    }
}

impl<K: Served> Queue<K> {
    fn event(&mut self, event: watcher::Event<K>) {
        match event {
            watcher::Event::Apply(cc) | watcher::Event::InitApply(cc) => {
                let name = cc.name_any();
                self.latest.insert(name.clone(), cc);
                self.due.insert(name, Instant::now());
            }
            // Its WasmReconciler is its child: the garbage collector deletes it.
            watcher::Event::Delete(cc) => {
                self.latest.remove(&cc.name_any());
                self.due.remove(&cc.name_any());
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// The controllers due now, taken off the queue.
    fn due(&mut self) -> Vec<K> {
        let now = Instant::now();
        let names: Vec<String> = self
            .due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(n, _)| n.clone())
            .collect();
        names
            .into_iter()
            .filter_map(|n| {
                self.due.remove(&n);
                self.latest.get(&n).cloned()
            })
            .collect()
    }

    /// `name` is due again after `after`, or at the next resync.
    fn again(&mut self, name: &str, after: Option<Duration>) {
        if self.latest.contains_key(name) && !self.due.contains_key(name) {
            self.due
                .insert(name.to_string(), Instant::now() + after.unwrap_or(RESYNC));
        }
    }
}

/// Serves `cc` once: when it is due again (None: at the next resync or change).
async fn reconcile<K: Served>(cc: &K, ctx: &Ctx) -> Result<Option<Duration>, ComposeError> {
    let wr_name = K::reconciler_name(&cc.name_any());
    if cc.wasmop().is_none() {
        delete_ours(ctx, cc, &wr_name).await?;
        return Ok(None);
    }
    if cc.meta().deletion_timestamp.is_some() {
        return Ok(None);
    }
    let planned = match cc.refusal() {
        Some(r) => Err((reasons::UNSUPPORTED, r.to_string())),
        None => plan(cc, &ctx.discovery).await,
    };
    let (status, reason, message, after) = match planned {
        Ok(spec) => match apply(ctx, cc, &wr_name, spec).await? {
            true => (
                "True",
                reasons::SERVED,
                format!("served by WasmReconciler {wr_name} (its conditions say how it runs)"),
                None,
            ),
            false => (
                "False",
                reasons::NAME_TAKEN,
                format!(
                    "WasmReconciler {wr_name} exists and is not this controller's: delete or rename it"
                ),
                Some(RETRY),
            ),
        },
        Err((reason, message)) => {
            delete_ours(ctx, cc, &wr_name).await?;
            let retry = (reason == reasons::KIND_NOT_SERVED).then_some(RETRY);
            ("False", reason, message, retry)
        }
    };
    write_status(ctx, cc, status, reason, &message, &wr_name).await?;
    Ok(after)
}

/// The WasmReconciler spec serving `cc`, or the reason and message of why not.
async fn plan<K: Served>(
    cc: &K,
    discovery: &Discovery,
) -> Result<crate::crd::WasmReconcilerSpec, (&'static str, String)> {
    let not_served = |e: String| (reasons::KIND_NOT_SERVED, e);
    let ((api_version, resource), children, related) = cc.resources();
    let mut kinds = Kinds {
        parent: kind_of(discovery, &api_version, &resource)
            .await
            .map_err(not_served)?,
        children: Vec::new(),
        related: Vec::new(),
    };
    for (api_version, resource) in related {
        kinds.related.push(
            kind_of(discovery, &api_version, &resource)
                .await
                .map_err(not_served)?,
        );
    }
    for (api_version, resource) in children {
        kinds.children.push(
            kind_of(discovery, &api_version, &resource)
                .await
                .map_err(not_served)?,
        );
    }
    cc.reconciler_spec(&kinds)
        .map_err(|r: Refusal| (reasons::UNSUPPORTED, r.to_string()))
}

/// The kind served as `resource` in `api_version`.
async fn kind_of(
    discovery: &Discovery,
    api_version: &str,
    resource: &str,
) -> Result<KindRef, String> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gv = kube::core::GroupVersion::gv(group, version);
    let found = kube::discovery::oneshot::pinned_group(discovery.client(), &gv)
        .await
        .map_err(|e| format!("the API server does not serve {api_version}: {e}"))?;
    found
        .versioned_resources(version)
        .into_iter()
        .find(|(r, _)| r.plural == resource)
        .map(|(r, _)| KindRef {
            api_version: api_version.to_string(),
            kind: r.kind,
        })
        .ok_or_else(|| {
            format!("the API server does not serve the resource {resource} in {api_version}")
        })
}

/// Applies the WasmReconciler; false when the name is another's.
async fn apply<K: Served>(
    ctx: &Ctx,
    cc: &K,
    name: &str,
    spec: crate::crd::WasmReconcilerSpec,
) -> Result<bool, ComposeError> {
    let api: Api<WasmReconciler> = Api::all(ctx.client.clone());
    let uid = cc.uid().unwrap_or_default();
    if let Some(existing) = api
        .get_opt(name)
        .await
        .map_err(|e| ComposeError(format!("reading WasmReconciler {name}: {e}")))?
        && !existing.owner_references().iter().any(|o| o.uid == uid)
    {
        return Ok(false);
    }
    let owner = OwnerReference {
        api_version: K::api_version(&()).into(),
        kind: K::kind(&()).into(),
        name: cc.name_any(),
        uid,
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let mut labels = cc.labels().clone();
    labels.insert(K::LABEL.into(), cc.name_any());
    let body = json!({
        "apiVersion": "wasmop.dev/v1alpha1",
        "kind": "WasmReconciler",
        "metadata": {"name": name, "labels": labels, "ownerReferences": [owner]},
        "spec": spec,
    });
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(|e| ComposeError(format!("applying WasmReconciler {name}: {e}")))?;
    Ok(true)
}

/// Deletes the WasmReconciler wasmop made for `cc`, if there is one (and only that one).
async fn delete_ours<K: Served>(ctx: &Ctx, cc: &K, name: &str) -> Result<(), ComposeError> {
    let api: Api<WasmReconciler> = Api::all(ctx.client.clone());
    let uid = cc.uid().unwrap_or_default();
    let Some(existing) = api
        .get_opt(name)
        .await
        .map_err(|e| ComposeError(format!("reading WasmReconciler {name}: {e}")))?
    else {
        return Ok(());
    };
    if !existing.owner_references().iter().any(|o| o.uid == uid) {
        return Ok(());
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: existing.uid(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(ComposeError(format!("deleting WasmReconciler {name}: {e}"))),
    }
}

/// Writes `Ready` on `cc` (kept as it is while it does not change).
async fn write_status<K: Served>(
    ctx: &Ctx,
    cc: &K,
    status: &str,
    reason: &str,
    message: &str,
    reconciler: &str,
) -> Result<(), ComposeError> {
    let current = cc
        .served_status()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == reasons::READY));
    let generation = cc.meta().generation;
    if current.is_some_and(|c| {
        c.status == status
            && c.reason == reason
            && c.message == message
            && c.observed_generation == generation
    }) {
        return Ok(());
    }
    let since = match current {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(k8s_openapi::jiff::Timestamp::now()),
    };
    let condition = Condition {
        type_: reasons::READY.into(),
        status: status.into(),
        reason: reason.into(),
        message: crate::text::cut(message.to_string(), 1024),
        observed_generation: generation,
        last_transition_time: since,
    };
    let served = (status == "True").then(|| reconciler.to_string());
    let patch = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": {"conditions": [condition], "observedGeneration": generation, "reconciler": served},
    });
    let api: Api<K> = Api::all(ctx.client.clone());
    api.patch_status(
        &cc.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| {
        ComposeError(format!(
            "writing the status of {} {}: {e}",
            K::kind(&()),
            cc.name_any()
        ))
    })?;
    Ok(())
}
