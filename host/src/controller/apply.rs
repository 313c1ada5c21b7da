//! Applying a validated response to the cluster, with the module's own identity.
//!
//! Order: children (server-side apply, field manager `wasmop/<reconciler>`, forced), pruning of
//! owned children missing from a complete set, actions in order, the status (a server-side
//! apply of the module's fields on the /status subresource, conditioned on the primary's
//! resourceVersion), then Events, handed to the reconciler's [`EventLane`] and published after
//! the reconcile (see [`super::emit`]).
//!
//! Children and status writes that would change nothing are not sent (see
//! [`super::noop`]): a converged reconciler writes nothing.
//!
//! # Guarantees
//! - A child the watch cache does not hold as this primary's is never taken over: its first
//!   apply carries a resourceVersion precondition no stored object matches
//!   ([`CREATE_ONLY`]), so it creates the child or fails with 409 when the name is held; only
//!   then is the holder read, and the child applied only if this primary controls it. A
//!   new child costs one request, as the floor does.
//! - A status that would be written is held back as the caller allows ([`Applier::apply`]'s
//!   [`StatusHold`]): after this apply created children (the module computed it without them,
//!   and their creation calls for the next reconcile), or while the module is in flux (see
//!   [`super::hold`]).
//! - Every request goes through the client it is given: the reconciler's impersonating client, so
//!   the module's ServiceAccount's RBAC decides; nothing is written with the host's own rights.
//! - Pruning deletes only children of this primary (controller ownerReference uid) that carry
//!   this reconciler's label, of kinds whose complete set the module sent.
//! - Every prune, and every delete of an observed child or of the primary, carries the uid the
//!   host observed as a precondition (`Preconditions { uid }`): a stale cache never deletes a
//!   same-named object that someone recreated; that object is left alone.
//! - Children are applied [`APPLY_CONCURRENCY`] at a time, so one response (at most
//!   `spec.limits.children` children) never opens more requests than that at once.
//! - A failed write does not stop the others: every intent is attempted and every failure is
//!   reported, classified (forbidden, conflict, invalid, transient). Events are not written
//!   here: they are queued for the reconciler's [`EventLane`], whose failures are its own.
//! - The status is written only when it differs from the object's or from what this field
//!   manager last applied, conditioned on the primary's resourceVersion: a stale write is a
//!   conflict, never a lost update. Only the module's fields are applied (its own field
//!   manager), so other writers' status fields are left alone.
//! - An apply is skipped only when this field manager last applied exactly the same intent and
//!   the observed object still holds all of it ([`super::noop::unchanged`]).

use std::collections::BTreeSet;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{
    Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions, PropagationPolicy,
};
use kube::core::DynamicResourceScope;
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType};
use kube::{Client, ResourceExt};
use serde_json::Value;
use tracing::field::Empty;
use tracing::{Instrument, info_span};

use crate::contract::{Action, EventType, Gvk, ObjectRef, Propagation};
use crate::controller::emit::EventLane;
use crate::controller::hold::StatusHold;
use crate::controller::intents::{PreparedSet, Validated, status_object};
use crate::controller::noop::{self, Applied, Target};
use crate::discovery::{Discovery, Resolved};
use crate::object::{ObjectKey, Unread, controller_of};
use crate::operations::fields;

/// How a write failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// 403: the module's ServiceAccount may not do this.
    Forbidden,
    /// 409: the object changed since it was read.
    Conflict,
    /// 400/422: the API server refused the content.
    Invalid,
    /// Anything else (network, 5xx, unknown kind): worth retrying.
    Transient,
}

/// One failed write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteFailure {
    /// Which intent (`apply apps/v1/Deployment demo/web`).
    pub intent: String,
    /// How it failed.
    pub kind: FailureKind,
    /// The API server's message.
    pub message: String,
}

impl std::fmt::Display for WriteFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.intent, self.message)
    }
}

/// What applying did.
#[derive(Debug, Clone, Default)]
pub struct ApplyReport {
    /// Children applied.
    pub applied: usize,
    /// Children (and the status) not written because nothing would change.
    pub unchanged: usize,
    /// The fingerprints of what is now applied for this primary (see [`super::noop`]): the
    /// previous memory, updated with this apply's successful writes.
    pub remembered: Applied,
    /// Children pruned.
    pub pruned: usize,
    /// Actions carried out.
    pub actions: usize,
    /// Whether the status was written.
    pub status_written: bool,
    /// Whether the status was held back because children were created (see the guarantees).
    pub status_deferred: bool,
    /// The children this apply created (they were not in the watch cache, and no object held
    /// their name).
    pub created: Vec<Target>,
    /// Events queued for publishing (see [`super::emit`]).
    pub events: usize,
    /// Every failed write.
    pub failures: Vec<WriteFailure>,
}

impl ApplyReport {
    /// The failures of one kind.
    pub fn of(&self, kind: FailureKind) -> impl Iterator<Item = &WriteFailure> {
        self.failures.iter().filter(move |f| f.kind == kind)
    }
}

/// The most of the API server's message a [`WriteFailure`] keeps.
pub const MAX_FAILURE_MESSAGE: usize = 1024;

/// The failure of a write of `intent` to an object of `target`, from the client's error (its
/// message: [`write_error_text`]).
fn classify(intent: String, target: &Gvk, e: &kube::Error) -> WriteFailure {
    let kind = match e {
        kube::Error::Api(s) => match s.code {
            403 => FailureKind::Forbidden,
            409 => FailureKind::Conflict,
            400 | 422 => FailureKind::Invalid,
            _ => FailureKind::Transient,
        },
        _ => FailureKind::Transient,
    };
    WriteFailure {
        intent,
        kind,
        message: write_error_text(target, e, false),
    }
}

/// What may be said of the client's error `e` for a write to an object of `target`.
///
/// # Guarantees
/// The text reaches Warning Events, logs, traces and `wasmop diff`'s output: it is made inert
/// and cut to [`MAX_FAILURE_MESSAGE`] bytes, and for a `v1/Secret` the API server's own text
/// is withheld unless `show_secrets` (its typed-patch check quotes the value it rejects: the
/// Secret's data; so may an admission webhook's or policy's denial, whatever its code); the
/// code and reason stay. Kept for a Secret: the texts of 403 (RBAC's: who may not do what),
/// 404 and 409 that no admission check wrote, which name the object, never its data.
pub fn write_error_text(target: &Gvk, e: &kube::Error, show_secrets: bool) -> String {
    let secret = target.api_version == "v1" && target.kind == "Secret";
    let text = match e {
        kube::Error::Api(s) if secret && !show_secrets && !names_only(s) => {
            format!(
                "HTTP {} {}: the API server's message is withheld (it may quote the Secret's data)",
                s.code, s.reason
            )
        }
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    };
    crate::text::cut(crate::text::inert(&text).into_owned(), MAX_FAILURE_MESSAGE)
}

/// Whether the API server's error `s` names the object only: RBAC's 403, a 404 or a 409, not
/// written by an admission webhook or policy (`... denied the request: <their message>`).
fn names_only(s: &kube::core::Status) -> bool {
    matches!(s.code, 403 | 404 | 409) && !s.message.contains("denied")
}

/// How many children of one set are written at once (one apply each).
pub const APPLY_CONCURRENCY: usize = 8;

/// The resourceVersion precondition of a new child's first apply. The API server creates an
/// absent object from an apply and drops the resourceVersion it carries (storage assigns one);
/// an existing object must hold exactly this version or the apply fails with 409 Conflict.
/// No object stored in etcd holds version 1: etcd starts at revision 1 and its first write is
/// revision 2. So the apply creates the child or fails when anyone holds the name, the check
/// a GET made before, in the same request. (A create, POST, would check the same, but it
/// records its fields under an `Update` entry of the field manager, which later applies do not
/// own: fields the module drops would never be removed.)
pub const CREATE_ONLY: &str = "1";

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Whether a delete found its target gone: not found, or (409) the uid precondition failed
/// because the name now belongs to another object, which is not ours to delete.
fn is_gone(e: &kube::Error) -> bool {
    is_not_found(e) || matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// The uid precondition of a delete of `uid`.
fn uid_precondition(uid: Option<String>) -> Option<Preconditions> {
    uid.map(|uid| Preconditions {
        uid: Some(uid),
        resource_version: None,
    })
}

/// Observed children of one owned kind (already filtered to this primary).
#[derive(Debug, Clone)]
pub struct Observed {
    /// The kind.
    pub kind: Gvk,
    /// The objects.
    pub objects: Vec<DynamicObject>,
}

/// Writes validated responses with one identity.
#[derive(Clone)]
pub struct Applier {
    client: Client,
    reader: Client,
    field_manager: String,
    discovery: Discovery,
    events: EventLane,
}

impl std::fmt::Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier")
            .field("field_manager", &self.field_manager)
            .finish()
    }
}

/// The API of `resolved` in `namespace`: `Api<DynamicObject>` for reads, `Api<Unread>` for
/// writes, whose answers the host does not read.
fn api_for<K>(client: &Client, resolved: &Resolved, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<DynamicType = kube::api::ApiResource, Scope = DynamicResourceScope>,
{
    match (resolved.namespaced, namespace) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resolved.resource),
        _ => Api::all_with(client.clone(), &resolved.resource),
    }
}

/// The primary as an Event's subject.
fn regarding_primary(primary: &DynamicObject) -> ObjectRef {
    let types = primary.types.as_ref();
    ObjectRef {
        api_version: types.map(|t| t.api_version.clone()).unwrap_or_default(),
        kind: types.map(|t| t.kind.clone()).unwrap_or_default(),
        namespace: primary.namespace(),
        name: primary.name_any(),
    }
}

/// An ObjectReference for Events.
pub fn object_reference(r: &ObjectRef, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some(r.api_version.clone()),
        kind: Some(r.kind.clone()),
        namespace: r.namespace.clone(),
        name: Some(r.name.clone()),
        uid,
        ..Default::default()
    }
}

impl Applier {
    /// An applier writing through `client` (the reconciler's impersonating client) as field
    /// manager `wasmop/<reconciler>`, handing the module's Events to `events`. `reader` (the
    /// host's own identity, which may read the owned kinds) checks that a new child's name is
    /// not taken.
    pub fn new(
        client: Client,
        reader: Client,
        reconciler: &str,
        discovery: Discovery,
        events: EventLane,
    ) -> Self {
        Applier {
            client,
            reader,
            field_manager: format!("wasmop/{reconciler}"),
            discovery,
            events,
        }
    }

    /// Publishes the Events still queued and stops taking more (see [`EventLane::close`]).
    pub async fn close(&self) {
        self.events.close().await;
    }

    /// The field manager.
    pub fn field_manager(&self) -> &str {
        &self.field_manager
    }

    async fn resolve(
        &self,
        kind: &Gvk,
        intent: &str,
        report: &mut ApplyReport,
    ) -> Option<Resolved> {
        match self.discovery.resolve(kind).await {
            Ok(r) => Some(r),
            Err(e) => {
                report.failures.push(WriteFailure {
                    intent: intent.to_string(),
                    kind: FailureKind::Transient,
                    message: e.to_string(),
                });
                None
            }
        }
    }

    /// Applies `validated` for `primary` (as read, with its resourceVersion), pruning against
    /// `observed`. `applied` is what this field manager last applied for the primary; writes
    /// that would change nothing are skipped (see [`super::noop`]). A status that would be
    /// written is held back as `hold` allows (see [`super::hold`]).
    pub async fn apply(
        &self,
        primary: &DynamicObject,
        primary_resource: &Resolved,
        observed: &[Observed],
        validated: Validated,
        (applied, hold): (Applied, StatusHold),
    ) -> ApplyReport {
        let mut report = ApplyReport {
            remembered: applied,
            ..ApplyReport::default()
        };
        let primary_uid = primary.uid().unwrap_or_default();
        let params = PatchParams::apply(&self.field_manager).force();

        // Children, concurrently within each kind, then the prune of that kind.
        for set in &validated.children {
            let Some(resolved) = self
                .resolve(&set.kind, &format!("apply {}", set.kind), &mut report)
                .await
            else {
                continue;
            };
            let span = info_span!(
                "apply.children",
                kind = %set.kind,
                children = set.objects.len() as i64,
                applied = Empty,
                unchanged = Empty,
                failed = Empty,
            );
            self.children(set, &resolved, observed, &primary_uid, &params, &mut report)
                .instrument(span)
                .await;
            let span = info_span!("apply.prune", kind = %set.kind, pruned = Empty, failed = Empty);
            self.prune(set, &resolved, observed, &primary_uid, &mut report)
                .instrument(span)
                .await;
        }

        if !validated.actions.is_empty() {
            let span = info_span!(
                "apply.actions",
                actions = validated.actions.len() as i64,
                done = Empty,
                failed = Empty,
            );
            self.actions(primary, observed, validated.actions, &mut report)
                .instrument(span)
                .await;
        }

        if let Some(status) = &validated.status {
            match status_plan(primary, status, &report.remembered) {
                StatusPlan::Write(write)
                    if hold.holds(
                        !report.created.is_empty(),
                        primary.data.get("status"),
                        primary.metadata.generation.unwrap_or_default(),
                    ) =>
                {
                    drop(write);
                    report.status_deferred = true;
                }
                plan => {
                    self.traced_status(primary, primary_resource, plan, &mut report)
                        .await
                }
            }
        }

        if !validated.events.is_empty() {
            let span = info_span!(
                "apply.events",
                events = validated.events.len() as i64,
                queued = Empty,
            );
            span.in_scope(|| self.events(primary, &primary_uid, &validated.events, &mut report));
        }
        report
    }

    /// Carries out `plan` (see [`Applier::status`]) in its own span, with the counts recorded.
    async fn traced_status(
        &self,
        primary: &DynamicObject,
        primary_resource: &Resolved,
        plan: StatusPlan,
        report: &mut ApplyReport,
    ) {
        let span = info_span!(
            "apply.status",
            written = Empty,
            unchanged = Empty,
            failed = Empty
        );
        async {
            let (unchanged, failures) = (report.unchanged, report.failures.len());
            self.status(primary, primary_resource, plan, report).await;
            fields::record(
                &tracing::Span::current(),
                [
                    ("written", &report.status_written),
                    ("unchanged", &(report.unchanged > unchanged)),
                    ("failed", &((report.failures.len() - failures) as i64)),
                ],
            );
        }
        .instrument(span)
        .await;
    }

    /// Applies one complete child set (server-side apply, [`APPLY_CONCURRENCY`] at a time),
    /// skipping unchanged children; records the counts on the current span.
    async fn children(
        &self,
        set: &PreparedSet,
        resolved: &Resolved,
        observed: &[Observed],
        primary_uid: &str,
        params: &PatchParams,
        report: &mut ApplyReport,
    ) {
        let (applied, unchanged, failures) =
            (report.applied, report.unchanged, report.failures.len());
        let ours: std::collections::BTreeMap<ObjectKey, &DynamicObject> = observed
            .iter()
            .filter(|o| o.kind == set.kind)
            .flat_map(|o| o.objects.iter())
            .filter(|o| controlled_by(o, primary_uid))
            .map(|o| (ObjectKey::of(o), o))
            .collect();
        let remembered = &report.remembered;
        // Collected first: a stream over a closure-mapped iterator is not provably Send.
        let writes: Vec<_> = set
            .objects
            .iter()
            .map(|child| {
                let current = ours
                    .get(&ObjectKey::new(child.namespace.clone(), child.name.clone()))
                    .copied();
                let target: Target = (
                    set.kind.clone(),
                    child.namespace.clone(),
                    child.name.clone(),
                );
                let fingerprint = noop::fingerprint(&child.object);
                let unchanged = remembered.get(&target) == Some(&fingerprint)
                    && current.is_some_and(|c| {
                        serde_json::to_value(c)
                            .is_ok_and(|c| noop::covers_object(&child.object, &c))
                    });
                let write = Write {
                    set,
                    child,
                    resolved,
                    params,
                    primary_uid,
                    known: current.is_some(),
                };
                self.write_child(write, target, fingerprint, unchanged)
            })
            .collect();
        let results: Vec<Result<(Target, u64, Wrote), WriteFailure>> =
            futures::stream::iter(writes)
                .buffer_unordered(APPLY_CONCURRENCY)
                .collect()
                .await;
        for result in results {
            match result {
                Ok((target, fingerprint, wrote)) => {
                    match wrote {
                        Wrote::Unchanged => report.unchanged += 1,
                        Wrote::Changed => report.applied += 1,
                        Wrote::Created => {
                            report.applied += 1;
                            report.created.push(target.clone());
                        }
                    }
                    report.remembered.insert(target, fingerprint);
                }
                Err(f) => report.failures.push(f),
            }
        }
        fields::record(
            &tracing::Span::current(),
            [
                ("applied", &((report.applied - applied) as i64)),
                ("unchanged", &((report.unchanged - unchanged) as i64)),
                ("failed", &((report.failures.len() - failures) as i64)),
            ],
        );
    }

    /// Applies one child (server-side apply with force) unless it is `unchanged`; refuses to
    /// take over an object of the same name that this primary does not control.
    async fn write_child(
        &self,
        write: Write<'_>,
        target: Target,
        fingerprint: u64,
        unchanged: bool,
    ) -> Result<(Target, u64, Wrote), WriteFailure> {
        if unchanged {
            return Ok((target, fingerprint, Wrote::Unchanged));
        }
        let Write {
            set,
            child,
            resolved,
            params,
            primary_uid,
            known,
        } = write;
        let api: Api<Unread> = api_for(&self.client, resolved, child.namespace.as_deref());
        let intent = format!(
            "apply {} {}",
            set.kind,
            display_name(child.namespace.as_deref(), &child.name)
        );
        // Server-side apply with force would take over an object of the same name that
        // someone else made (and a later prune would delete it): a child not yet known as
        // ours is created only if the name is free ([`CREATE_ONLY`]); when it is held, the
        // holder is read and must be this primary's (ours are the only ones the watch cache
        // may not have caught up with).
        if !known {
            let mut create = child.object.clone();
            if let Some(meta) = create.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.insert("resourceVersion".into(), CREATE_ONLY.into());
            }
            match api.patch(&child.name, params, &Patch::Apply(&create)).await {
                Ok(_) => return Ok((target, fingerprint, Wrote::Created)),
                Err(e) if is_conflict(&e) => {}
                Err(e) => return Err(classify(intent, &set.kind, &e)),
            }
            let reader: Api<DynamicObject> =
                api_for(&self.reader, resolved, child.namespace.as_deref());
            match reader.get_opt(&child.name).await {
                Ok(Some(existing)) if !controlled_by(&existing, primary_uid) => {
                    return Err(taken(intent, &existing));
                }
                Ok(Some(_)) => {}
                // Deleted since: created again, still only if nobody holds the name (someone
                // may have taken it since the GET).
                Ok(None) => {
                    return api
                        .patch(&child.name, params, &Patch::Apply(&create))
                        .await
                        .map(|_| (target, fingerprint, Wrote::Created))
                        .map_err(|e| classify(intent, &set.kind, &e));
                }
                Err(e) => return Err(classify(intent, &set.kind, &e)),
            }
        }
        api.patch(&child.name, params, &Patch::Apply(&child.object))
            .await
            .map(|_| (target, fingerprint, Wrote::Changed))
            .map_err(|e| classify(intent, &set.kind, &e))
    }

    /// Prunes what this primary owns of the set's kind that is not in the complete set; records
    /// the counts on the current span.
    async fn prune(
        &self,
        set: &PreparedSet,
        resolved: &Resolved,
        observed: &[Observed],
        primary_uid: &str,
        report: &mut ApplyReport,
    ) {
        let (pruned, failures) = (report.pruned, report.failures.len());
        // Prune what this primary owns of this kind that is not in the complete set.
        let keep: BTreeSet<(Option<String>, String)> = set
            .objects
            .iter()
            .map(|c| (c.namespace.clone(), c.name.clone()))
            .chain(
                set.keep
                    .iter()
                    .map(|k| (k.namespace.clone(), k.name.clone())),
            )
            .collect();
        let stale = observed
            .iter()
            .filter(|o| o.kind == set.kind)
            .flat_map(|o| o.objects.iter())
            .filter(|o| controlled_by(o, primary_uid))
            .filter(|o| !keep.contains(&(o.namespace(), o.name_any())));
        for object in stale {
            let namespace = object.namespace();
            let intent = format!(
                "prune {} {}",
                set.kind,
                display_name(namespace.as_deref(), &object.name_any())
            );
            let api: Api<Unread> = api_for(&self.client, resolved, namespace.as_deref());
            report
                .remembered
                .remove(&(set.kind.clone(), namespace.clone(), object.name_any()));
            let params = DeleteParams {
                preconditions: uid_precondition(object.uid()),
                ..DeleteParams::background()
            };
            match api.delete(&object.name_any(), &params).await {
                Ok(_) => report.pruned += 1,
                Err(e) if is_gone(&e) => {}
                Err(e) => report.failures.push(classify(intent, &set.kind, &e)),
            }
        }
        fields::record(
            &tracing::Span::current(),
            [
                ("pruned", &((report.pruned - pruned) as i64)),
                ("failed", &((report.failures.len() - failures) as i64)),
            ],
        );
    }

    /// Carries out the actions in order; records the counts on the current span.
    async fn actions(
        &self,
        primary: &DynamicObject,
        observed: &[Observed],
        actions: Vec<Action>,
        report: &mut ApplyReport,
    ) {
        let (done, failures) = (report.actions, report.failures.len());
        for action in actions {
            let uid = observed_uid(primary, observed, action.target());
            if self.action(&action, uid, report).await {
                report.actions += 1;
            }
        }
        fields::record(
            &tracing::Span::current(),
            [
                ("done", &((report.actions - done) as i64)),
                ("failed", &((report.failures.len() - failures) as i64)),
            ],
        );
    }

    /// Hands the module's Events to the reconciler's [`EventLane`] (published after this
    /// reconcile, never waited for); records how many were queued on the current span.
    fn events(
        &self,
        primary: &DynamicObject,
        primary_uid: &str,
        events: &[crate::contract::Event],
        report: &mut ApplyReport,
    ) {
        let recorded = report.events;
        for event in events {
            let regarding = event
                .regarding
                .clone()
                .unwrap_or_else(|| regarding_primary(primary));
            // The primary's uid only for the primary: a child may share its name.
            let same_kind = primary
                .types
                .as_ref()
                .is_none_or(|t| t.kind == regarding.kind && t.api_version == regarding.api_version);
            let uid = (same_kind
                && regarding.name == primary.name_any()
                && regarding.namespace == primary.namespace())
            .then(|| primary_uid.to_string());
            let ev = KubeEvent {
                type_: match event.type_ {
                    EventType::Normal => KubeEventType::Normal,
                    EventType::Warning => KubeEventType::Warning,
                },
                reason: event.reason.clone(),
                note: Some(event.message.clone()),
                action: event.action.clone(),
                secondary: None,
            };
            if self.events.send(ev, object_reference(&regarding, uid)) {
                report.events += 1;
            }
        }
        fields::record(
            &tracing::Span::current(),
            [("queued", &((report.events - recorded) as i64))],
        );
    }

    /// Carries out one action; true on success. A delete is conditioned on `uid` when given.
    async fn action(&self, action: &Action, uid: Option<String>, report: &mut ApplyReport) -> bool {
        let target = action.target();
        let intent = format!("{} {target}", action.name());
        let Some(resolved) = self.resolve(&target.gvk(), &intent, report).await else {
            return false;
        };
        let api: Api<Unread> = api_for(&self.client, &resolved, target.namespace.as_deref());
        let result = match action {
            Action::MergePatch { patch, .. } => api
                .patch(&target.name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .map(|_| ()),
            Action::JsonPatch { patch, .. } => {
                match serde_json::from_value::<json_patch::Patch>(patch.clone()) {
                    Ok(p) => api
                        .patch(&target.name, &PatchParams::default(), &Patch::<()>::Json(p))
                        .await
                        .map(|_| ()),
                    Err(e) => {
                        report.failures.push(WriteFailure {
                            intent,
                            kind: FailureKind::Invalid,
                            message: e.to_string(),
                        });
                        return false;
                    }
                }
            }
            Action::Delete { propagation, .. } => {
                let dp = DeleteParams {
                    propagation_policy: Some(match propagation {
                        Propagation::Background => PropagationPolicy::Background,
                        Propagation::Foreground => PropagationPolicy::Foreground,
                        Propagation::Orphan => PropagationPolicy::Orphan,
                    }),
                    preconditions: uid_precondition(uid),
                    ..DeleteParams::default()
                };
                match api.delete(&target.name, &dp).await {
                    Ok(_) => Ok(()),
                    Err(e) if is_gone(&e) => Ok(()),
                    Err(e) => Err(e),
                }
            }
        };
        match result {
            Ok(()) => true,
            Err(e) => {
                report.failures.push(classify(intent, &target.gvk(), &e));
                false
            }
        }
    }

    /// Carries out a status plan: an unchanged status is counted, a write is sent (only the
    /// module's fields, under this field manager; the resourceVersion makes a write based on a
    /// stale read a conflict).
    async fn status(
        &self,
        primary: &DynamicObject,
        resource: &Resolved,
        plan: StatusPlan,
        report: &mut ApplyReport,
    ) {
        let write = match plan {
            StatusPlan::Unchanged => {
                report.unchanged += 1;
                return;
            }
            StatusPlan::Invalid(failure) => {
                report.failures.push(failure);
                return;
            }
            StatusPlan::Write(write) => write,
        };
        let StatusWrite {
            target,
            fingerprint,
            patch,
        } = *write;
        let intent = format!(
            "status of {}",
            display_name(primary.namespace().as_deref(), &primary.name_any())
        );
        let api: Api<Unread> = api_for(&self.client, resource, primary.namespace().as_deref());
        let params = PatchParams::apply(&self.field_manager).force();
        match api
            .patch_status(&primary.name_any(), &params, &Patch::Apply(&patch))
            .await
        {
            Ok(_) => {
                report.status_written = true;
                report.remembered.insert(target, fingerprint);
            }
            Err(e) => {
                let kind = Gvk::new(&resource.resource.api_version, &resource.resource.kind);
                report.failures.push(classify(intent, &kind, &e));
            }
        }
    }
}

/// What to do with the status a module asked for.
enum StatusPlan {
    /// It is already there: nothing to write.
    Unchanged,
    /// It cannot be written.
    Invalid(WriteFailure),
    /// Write it (boxed: the other variants are small).
    Write(Box<StatusWrite>),
}

/// A status write: the apply patch, and what is remembered once it succeeded.
struct StatusWrite {
    target: Target,
    fingerprint: u64,
    patch: Value,
}

/// The plan for writing `status` on `primary`, given what this field manager last applied.
fn status_plan(
    primary: &DynamicObject,
    status: &crate::contract::Status,
    remembered: &Applied,
) -> StatusPlan {
    let previous = primary.data.get("status");
    let generation = primary.metadata.generation.unwrap_or_default();
    let now = k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now());
    let wanted = status_object(status, previous, generation, &now.to_string());
    let Some(types) = primary.types.as_ref() else {
        return StatusPlan::Invalid(WriteFailure {
            intent: "status".into(),
            kind: FailureKind::Invalid,
            message: "the primary has no apiVersion and kind".into(),
        });
    };
    let target: Target = (
        crate::contract::Gvk::new(&types.api_version, &types.kind),
        primary.namespace(),
        primary.name_any(),
    );
    let fingerprint = noop::fingerprint(&wanted);
    let observed = previous.cloned().unwrap_or(Value::Null);
    // Equal to what is there: nothing to write (whoever wrote it); remembered only when this
    // field manager applied it, so a field the module drops is still removed by an apply.
    let last = remembered.get(&target);
    if (last == Some(&fingerprint) && noop::covers(&wanted, &observed))
        || (last.is_none() && previous == Some(&wanted))
    {
        return StatusPlan::Unchanged;
    }
    let patch = serde_json::json!({
        "apiVersion": types.api_version,
        "kind": types.kind,
        "metadata": {
            "name": primary.name_any(),
            "resourceVersion": primary.resource_version(),
        },
        "status": wanted,
    });
    StatusPlan::Write(Box::new(StatusWrite {
        target,
        fingerprint,
        patch,
    }))
}

/// The uid the host observed for `target`: the primary's, or an observed child's.
fn observed_uid(
    primary: &DynamicObject,
    observed: &[Observed],
    target: &ObjectRef,
) -> Option<String> {
    let same = |o: &DynamicObject| o.name_any() == target.name && o.namespace() == target.namespace;
    let primary_kind = primary
        .types
        .as_ref()
        .map(|t| (t.api_version.as_str(), t.kind.as_str()));
    if primary_kind == Some((target.api_version.as_str(), target.kind.as_str())) && same(primary) {
        return primary.uid();
    }
    observed
        .iter()
        .filter(|o| o.kind == target.gvk())
        .flat_map(|o| o.objects.iter())
        .find(|o| same(o))
        .and_then(|o| o.uid())
}

/// Whether `object`'s controller ownerReference is the object with `uid`.
pub fn controlled_by(object: &DynamicObject, uid: &str) -> bool {
    controller_of(&object.metadata).is_some_and(|o| o.uid == uid)
}

/// What writing one child did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wrote {
    /// Nothing: it would change nothing.
    Unchanged,
    /// Applied over an object of this primary.
    Changed,
    /// Created (its name was free).
    Created,
}

/// One child to write, and what it is written with.
struct Write<'a> {
    set: &'a PreparedSet,
    child: &'a crate::controller::intents::PreparedChild,
    resolved: &'a Resolved,
    params: &'a PatchParams,
    primary_uid: &'a str,
    /// Whether the watch cache holds it as this primary's.
    known: bool,
}

/// The refusal to apply `intent` over `existing`, an object this primary does not control.
fn taken(intent: String, existing: &DynamicObject) -> WriteFailure {
    let owner = controller_of(&existing.metadata)
        .map(|o| format!("is controlled by {} {} (uid {})", o.kind, o.name, o.uid))
        .unwrap_or_else(|| "was not created by this reconciler".into());
    WriteFailure {
        intent,
        kind: FailureKind::Invalid,
        message: format!(
            "an object with this name already exists and {owner}; wasmop does not take over objects it does not control: delete or rename it, or give the child another name"
        ),
    }
}

fn display_name(namespace: Option<&str>, name: &str) -> String {
    ObjectKey::new(namespace.map(str::to_string), name).to_string()
}

/// The status value of an object, if any (for tests and status comparison).
pub fn status_of(object: &DynamicObject) -> Option<&Value> {
    object.data.get("status")
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use kube::client::Body;
    use kube::runtime::events::Reporter;
    use serde_json::json;

    use super::*;
    use crate::controller::intents::{PreparedChild, PreparedSet};

    /// Requests to ConfigMaps in flight now (also as a watch, for the gate), the most seen at
    /// once, and how many there were.
    struct InFlight {
        now: tokio::sync::watch::Sender<usize>,
        max: AtomicUsize,
        total: AtomicUsize,
    }

    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    /// A fake API server that answers discovery, says every ConfigMap is new (404) and echoes
    /// applies. Each ConfigMap request is held until `APPLY_CONCURRENCY` are in flight (or,
    /// for the last few of the set, 2 s passed), so the maximum seen does not depend on timing.
    async fn answer(
        flight: Arc<InFlight>,
        req: http::Request<Body>,
    ) -> Result<http::Response<Body>, BoxError> {
        let path = req.uri().path().to_string();
        let patch = req.method() == http::Method::PATCH;
        let body = req.into_body().collect().await?.to_bytes().to_vec();
        if path == "/api/v1" {
            let list = json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                {"name": "configmaps", "singularName": "configmap", "namespaced": true,
                 "kind": "ConfigMap", "verbs": ["get", "list", "patch"]}]});
            return Ok(http::Response::builder()
                .status(200)
                .body(Body::from(serde_json::to_vec(&list)?))?);
        }
        let mut now = 0;
        flight.now.send_modify(|n| {
            *n += 1;
            now = *n;
        });
        flight.max.fetch_max(now, Ordering::SeqCst);
        flight.total.fetch_add(1, Ordering::SeqCst);
        let mut gate = flight.now.subscribe();
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            gate.wait_for(|n| *n >= APPLY_CONCURRENCY),
        )
        .await;
        flight.now.send_modify(|n| *n -= 1);
        if patch {
            return Ok(http::Response::builder()
                .status(200)
                .body(Body::from(body))?);
        }
        let missing = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "NotFound", "code": 404, "message": "not found"});
        Ok(http::Response::builder()
            .status(404)
            .body(Body::from(serde_json::to_vec(&missing)?))?)
    }

    /// A kube client over [`answer`] (the kube-rs mock-service pattern).
    fn counting_client(flight: Arc<InFlight>) -> Client {
        let service = tower::service_fn(move |req| answer(flight.clone(), req));
        Client::new(service, "default")
    }

    #[tokio::test]
    async fn fifty_children_are_applied_at_most_apply_concurrency_at_a_time() {
        let flight = Arc::new(InFlight {
            now: tokio::sync::watch::channel(0).0,
            max: AtomicUsize::new(0),
            total: AtomicUsize::new(0),
        });
        let client = counting_client(flight.clone());
        let discovery = Discovery::new(client.clone());
        let applier = test_applier(&client, &discovery);
        let kind = Gvk::new("v1", "ConfigMap");
        let resolved = match discovery.resolve(&kind).await {
            Ok(r) => r,
            Err(e) => panic!("the fake discovery: {e}"),
        };
        let primary = primary_configmap();
        let objects = (0..50)
            .map(|i| PreparedChild {
                namespace: Some("ns".into()),
                name: format!("c{i}"),
                object: json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("c{i}"), "namespace": "ns"}}),
            })
            .collect();
        let validated = Validated {
            children: vec![PreparedSet {
                keep: Default::default(),
                kind,
                namespaced: true,
                objects,
            }],
            ..Validated::default()
        };
        let report = applier
            .apply(
                &primary,
                &resolved,
                &[],
                validated,
                (Applied::new(), StatusHold::NEVER),
            )
            .await;
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(report.applied, 50);
        // Each new child costs one apply: it carries the check that nobody holds the name.
        assert_eq!(flight.total.load(Ordering::SeqCst), 50);
        assert_eq!(report.created.len(), 50);
        assert_eq!(
            flight.max.load(Ordering::SeqCst),
            APPLY_CONCURRENCY,
            "children must be written {APPLY_CONCURRENCY} at a time, no more (and no fewer)"
        );
    }

    /// A fake API server that answers discovery for ConfigMaps, echoes every PATCH and records
    /// `METHOD path` of every other request.
    pub(crate) fn recording_client(seen: Arc<std::sync::Mutex<Vec<String>>>) -> Client {
        recording_bodies(seen, Arc::default())
    }

    /// The bodies a fake API server received: `METHOD path` and the body, in order.
    pub(crate) type Bodies = Arc<std::sync::Mutex<Vec<(String, Vec<u8>)>>>;

    /// As [`recording_client`], also keeping every request's body in `bodies`.
    pub(crate) fn recording_bodies(
        seen: Arc<std::sync::Mutex<Vec<String>>>,
        bodies: Bodies,
    ) -> Client {
        let service = tower::service_fn(move |req: http::Request<Body>| {
            let (seen, bodies) = (seen.clone(), bodies.clone());
            async move {
                let (method, path) = (req.method().clone(), req.uri().path().to_string());
                let body = req.into_body().collect().await?.to_bytes().to_vec();
                if let Ok(mut bodies) = bodies.lock() {
                    bodies.push((format!("{method} {path}"), body.clone()));
                }
                if path == "/api/v1" {
                    let list = json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                        {"name": "configmaps", "singularName": "configmap", "namespaced": true,
                         "kind": "ConfigMap", "verbs": ["get", "list", "patch"]}]});
                    return Ok::<_, BoxError>(
                        http::Response::builder()
                            .status(200)
                            .body(Body::from(serde_json::to_vec(&list)?))?,
                    );
                }
                if let Ok(mut seen) = seen.lock() {
                    seen.push(format!("{method} {path}"));
                }
                Ok(http::Response::builder()
                    .status(200)
                    .body(Body::from(body))?)
            }
        });
        Client::new(service, "default")
    }

    /// The primary of these tests: ConfigMap `ns/primary`, uid `u-1`.
    fn primary_configmap() -> DynamicObject {
        match serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "primary", "namespace": "ns", "uid": "u-1", "resourceVersion": "1"}
        })) {
            Ok(p) => p,
            Err(e) => panic!("literal: {e}"),
        }
    }

    /// An applier of reconciler `t` writing and reading through `client`.
    fn test_applier(client: &Client, discovery: &Discovery) -> Applier {
        let reporter = Reporter {
            controller: "test".into(),
            instance: None,
        };
        let lane = EventLane::start(
            crate::controller::emit::Recorders::new(client, &reporter),
            "t",
            Arc::default(),
        );
        Applier::new(client.clone(), client.clone(), "t", discovery.clone(), lane)
    }

    /// A client whose API server never answers an Event's create; `posted` counts them.
    pub(crate) fn events_never_answered(posted: Arc<tokio::sync::watch::Sender<usize>>) -> Client {
        let service = tower::service_fn(move |req: http::Request<Body>| {
            let posted = posted.clone();
            async move {
                if req.uri().path().contains("/events") {
                    posted.send_modify(|n| *n += 1);
                    std::future::pending::<()>().await;
                }
                Ok::<_, BoxError>(http::Response::builder().status(404).body(Body::empty())?)
            }
        });
        Client::new(service, "default")
    }

    /// ConfigMaps, resolved as discovery would.
    fn configmaps() -> Resolved {
        Resolved {
            resource: kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            namespaced: true,
        }
    }

    /// The set of one child `ns/c` of `kind`.
    fn set_of_c(kind: Gvk) -> PreparedSet {
        PreparedSet {
            keep: Default::default(),
            objects: vec![PreparedChild {
                namespace: Some("ns".into()),
                name: "c".into(),
                object: json!({"apiVersion": kind.api_version, "kind": kind.kind,
                    "metadata": {"name": "c", "namespace": "ns"}}),
            }],
            kind,
            namespaced: true,
        }
    }

    /// Intents of one Normal Event about `regarding` (the primary when `None`).
    fn one_event(regarding: Option<ObjectRef>) -> Validated {
        Validated {
            events: vec![crate::contract::Event {
                type_: EventType::Normal,
                reason: "Noted".into(),
                message: "m".into(),
                action: "Testing".into(),
                regarding,
            }],
            ..Validated::default()
        }
    }

    #[tokio::test]
    async fn an_events_api_that_never_answers_does_not_hold_the_reconcile() {
        let (posted, mut seen) = tokio::sync::watch::channel(0);
        let client = events_never_answered(Arc::new(posted));
        let applier = test_applier(&client, &Discovery::new(client.clone()));
        let primary = primary_configmap();
        let resolved = configmaps();
        let validated = one_event(None);
        let hold = (Applied::new(), StatusHold::NEVER);
        let apply = applier.apply(&primary, &resolved, &[], validated, hold);
        // Generous: the reconcile must not wait for the Event at all (before the lane it waited
        // for the client's 295 s read timeout).
        let report = match tokio::time::timeout(std::time::Duration::from_secs(60), apply).await {
            Ok(r) => r,
            Err(_) => panic!("the reconcile waited for an Event nobody answers"),
        };
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(report.events, 1, "queued for the lane");
        // The lane did send it (and waits for the answer, not the reconcile).
        let sent = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            seen.wait_for(|n| *n == 1),
        )
        .await;
        assert!(matches!(sent, Ok(Ok(_))), "the lane never sent the Event");
    }

    /// An Event about a child named like the primary (App `ns/web` owns Deployment `ns/web`)
    /// carries no uid of the primary: tagged with it, `kubectl describe` of the Deployment
    /// did not show it and the Recorder counted it in the App's series.
    #[tokio::test]
    async fn an_event_about_a_child_named_like_the_primary_is_not_tagged_with_its_uid() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let bodies: Bodies = Arc::default();
        let client = recording_bodies(seen, bodies.clone());
        let applier = test_applier(&client, &Discovery::new(client.clone()));
        let primary = primary_configmap();
        let resolved = configmaps();
        let validated = one_event(Some(ObjectRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: Some("ns".into()),
            name: "primary".into(),
        }));
        let hold = (Applied::new(), StatusHold::NEVER);
        let report = applier
            .apply(&primary, &resolved, &[], validated, hold)
            .await;
        assert_eq!(report.events, 1);
        applier.close().await;
        let bodies = bodies.lock().map(|b| b.clone()).unwrap_or_default();
        let posted: Vec<Value> = bodies
            .iter()
            .filter(|(what, _)| what.starts_with("POST") && what.contains("/events"))
            .filter_map(|(_, body)| serde_json::from_slice(body).ok())
            .collect();
        assert_eq!(posted.len(), 1, "{bodies:?}");
        assert_eq!(posted[0]["regarding"]["kind"], "Deployment");
        assert_ne!(posted[0]["regarding"]["uid"], "u-1", "{}", posted[0]);
    }

    /// A fake API server that answers discovery for ConfigMaps and Secrets and refuses every
    /// other request with HTTP 500 and `message`.
    fn refusing_client(message: String) -> Client {
        let service = tower::service_fn(move |req: http::Request<Body>| {
            let message = message.clone();
            async move {
                if req.uri().path() == "/api/v1" {
                    let list = json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                        {"name": "configmaps", "singularName": "configmap", "namespaced": true,
                         "kind": "ConfigMap", "verbs": ["get", "list", "patch"]},
                        {"name": "secrets", "singularName": "secret", "namespaced": true,
                         "kind": "Secret", "verbs": ["get", "list", "patch"]}]});
                    return Ok::<_, BoxError>(
                        http::Response::builder()
                            .status(200)
                            .body(Body::from(serde_json::to_vec(&list)?))?,
                    );
                }
                let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "InternalError", "code": 500, "message": message});
                Ok(http::Response::builder()
                    .status(500)
                    .body(Body::from(serde_json::to_vec(&status)?))?)
            }
        });
        Client::new(service, "default")
    }

    /// The failures of applying one child of `kind` through an API server answering `message`.
    async fn failures_of_one_child(kind: Gvk, message: &str) -> Vec<WriteFailure> {
        let client = refusing_client(message.to_string());
        let discovery = Discovery::new(client.clone());
        let applier = test_applier(&client, &discovery);
        let resolved = match discovery.resolve(&Gvk::new("v1", "ConfigMap")).await {
            Ok(r) => r,
            Err(e) => panic!("the fake discovery: {e}"),
        };
        let primary = primary_configmap();
        let validated = Validated {
            children: vec![set_of_c(kind)],
            ..Validated::default()
        };
        let hold = (Applied::new(), StatusHold::NEVER);
        applier
            .apply(&primary, &resolved, &[], validated, hold)
            .await
            .failures
    }

    /// A new child's create-only apply meets a name held (409), whose holder is gone by the
    /// GET (404): the apply that follows must still be create-only, or an object someone
    /// made in between would be taken over (force) and later pruned.
    #[tokio::test]
    async fn a_child_deleted_since_its_conflict_is_created_only_if_the_name_is_still_free() {
        let patches: Bodies = Arc::default();
        let recorded = patches.clone();
        let service = tower::service_fn(move |req: http::Request<Body>| {
            let recorded = recorded.clone();
            async move {
                let (method, path) = (req.method().clone(), req.uri().path().to_string());
                let body = req.into_body().collect().await?.to_bytes().to_vec();
                let answer = |status: u16, body: Value| {
                    http::Response::builder()
                        .status(status)
                        .body(Body::from(serde_json::to_vec(&body).unwrap_or_default()))
                };
                if path == "/api/v1" {
                    let list = json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                        {"name": "configmaps", "singularName": "configmap", "namespaced": true,
                         "kind": "ConfigMap", "verbs": ["get", "list", "patch"]}]});
                    return Ok::<_, BoxError>(answer(200, list)?);
                }
                if method == http::Method::GET {
                    return Ok(answer(
                        404,
                        json!({"kind": "Status", "code": 404, "reason": "NotFound"}),
                    )?);
                }
                let first = recorded.lock().map(|r| r.is_empty()).unwrap_or(true);
                if let Ok(mut r) = recorded.lock() {
                    r.push((format!("{method} {path}"), body.clone()));
                }
                if first {
                    return Ok(answer(
                        409,
                        json!({"kind": "Status", "code": 409, "reason": "Conflict"}),
                    )?);
                }
                Ok(answer(
                    200,
                    serde_json::from_slice(&body).unwrap_or_default(),
                )?)
            }
        });
        let client = Client::new(service, "default");
        let discovery = Discovery::new(client.clone());
        let applier = test_applier(&client, &discovery);
        let resolved = match discovery.resolve(&Gvk::new("v1", "ConfigMap")).await {
            Ok(r) => r,
            Err(e) => panic!("the fake discovery: {e}"),
        };
        let validated = Validated {
            children: vec![set_of_c(Gvk::new("v1", "ConfigMap"))],
            ..Validated::default()
        };
        let hold = (Applied::new(), StatusHold::NEVER);
        let report = applier
            .apply(&primary_configmap(), &resolved, &[], validated, hold)
            .await;
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        let patches = patches.lock().map(|p| p.clone()).unwrap_or_default();
        assert_eq!(patches.len(), 2, "{patches:?}");
        let second: Value = serde_json::from_slice(&patches[1].1).unwrap_or_default();
        assert_eq!(
            second["metadata"]["resourceVersion"], CREATE_ONLY,
            "{second}"
        );
    }

    /// The API server's message for a refused apply can quote the object's values (its typed
    /// patch check prints the value it rejects); the message reaches a Warning Event, the log
    /// and the trace, so a Secret's is withheld, and every message is made inert and cut.
    #[tokio::test]
    async fn an_apply_error_quotes_no_secret_value_and_no_unbounded_text() {
        let quoting = r#"failed to create typed patch object (/v1, Kind=Secret): .stringData.password: expected string, got &value.valueUnstructured{Value:[]interface {}{"hunter2"}}"#;
        let failures = failures_of_one_child(Gvk::new("v1", "Secret"), quoting).await;
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(!failures[0].message.contains("hunter2"), "{failures:?}");
        assert!(failures[0].message.contains("500"), "{failures:?}");
        let long = format!("\u{1b}[31m{}", "x".repeat(1 << 20));
        let failures = failures_of_one_child(Gvk::new("v1", "ConfigMap"), &long).await;
        assert_eq!(failures.len(), 1, "{failures:?}");
        let message = &failures[0].message;
        assert!(message.len() <= 1024, "{} bytes", message.len());
        assert!(!message.contains('\u{1b}'), "{message}");
    }

    /// An admission webhook or policy that denies a Secret write answers with a code of its
    /// choosing (403 when it names none) and a message that may quote the data it refused;
    /// RBAC's 403, a 404 and a 409 name the object only and are kept.
    #[test]
    fn an_admission_denial_of_a_secret_write_quotes_no_value() {
        let secret = Gvk::new("v1", "Secret");
        let api = |code: u16, reason: &str, message: &str| {
            kube::Error::Api(
                kube::core::Status::failure(message, reason)
                    .with_code(code)
                    .boxed(),
            )
        };
        let denials = [
            api(
                403,
                "Forbidden",
                r#"admission webhook "p.example.com" denied the request: hunter2 is weak"#,
            ),
            api(
                403,
                "Forbidden",
                r#"secrets "s" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: hunter2 is weak"#,
            ),
            api(
                409,
                "Conflict",
                r#"admission webhook "p.example.com" denied the request: hunter2 is taken"#,
            ),
        ];
        for e in &denials {
            let text = write_error_text(&secret, e, false);
            assert!(!text.contains("hunter2"), "{text}");
            assert!(write_error_text(&secret, e, true).contains("hunter2"));
        }
        let rbac = r#"secrets "s" is forbidden: User "system:serviceaccount:ops:sa" cannot patch resource "secrets" in API group "" in the namespace "a""#;
        assert!(
            write_error_text(&secret, &api(403, "Forbidden", rbac), false).contains("cannot patch")
        );
        let missing = r#"namespaces "a" not found"#;
        assert!(
            write_error_text(&secret, &api(404, "NotFound", missing), false).contains("not found")
        );
    }

    #[tokio::test]
    async fn the_status_of_an_apply_that_created_children_waits_when_allowed() {
        let created_only = StatusHold {
            if_created: true,
            in_flux: false,
        };
        for defer in [true, false] {
            let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            let client = recording_client(seen.clone());
            let discovery = Discovery::new(client.clone());
            let applier = test_applier(&client, &discovery);
            let kind = Gvk::new("v1", "ConfigMap");
            let resolved = match discovery.resolve(&kind).await {
                Ok(r) => r,
                Err(e) => panic!("the fake discovery: {e}"),
            };
            let primary = primary_configmap();
            let validated = Validated {
                children: vec![set_of_c(kind)],
                status: Some(crate::contract::Status {
                    fields: json!({"phase": "Creating"}),
                    conditions: vec![],
                }),
                ..Validated::default()
            };
            let report = applier
                .apply(
                    &primary,
                    &resolved,
                    &[],
                    validated,
                    (
                        Applied::new(),
                        if defer {
                            created_only
                        } else {
                            StatusHold::NEVER
                        },
                    ),
                )
                .await;
            assert!(report.failures.is_empty(), "{:?}", report.failures);
            let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
            let child = "PATCH /api/v1/namespaces/ns/configmaps/c".to_string();
            let status = "PATCH /api/v1/namespaces/ns/configmaps/primary/status".to_string();
            if defer {
                assert_eq!(seen, vec![child], "only the child: the status waits");
                assert!(report.status_deferred && !report.status_written);
            } else {
                assert_eq!(seen, vec![child, status]);
                assert!(!report.status_deferred && report.status_written);
            }
        }
    }
}
