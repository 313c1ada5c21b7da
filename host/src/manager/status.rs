//! The WasmReconciler's status as its supervisor reports it: conditions (`metav1.Condition`,
//! kept the Kubernetes way: `lastTransitionTime` changes only when a condition's status does),
//! the status writes, and the Events on the WasmReconciler.
//!
//! # Guarantees
//! - Every condition carries the generation it was set at; every write records
//!   `status.observedGeneration`.
//! - A failure to write the status or an Event is logged, never fatal: the next change writes
//!   again.
//! - Condition messages and Event notes are made inert and cut
//!   ([`MAX_CONDITION_MESSAGE`], [`intents::MAX_EVENT_NOTE`]): they carry text from registries,
//!   the API server and modules, which must not forge a line or fill the object.
//! - A field the host cleared (`rejectedSha256`, `ungranted`, `activeModule.origin`,
//!   `activeModule.verifiedBy`) is cleared on the object too: the merge patch names it with
//!   `null`.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType as KubeEventType, Recorder};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::HostContext;
use crate::controller::{self, Health, intents};
use crate::crd::{WasmReconciler, WasmReconcilerStatus};
use crate::operations::readiness;
use crate::reasons;

/// The longest condition message the host writes (the API allows 32 KiB; a message is read by
/// people in `kubectl describe`).
pub const MAX_CONDITION_MESSAGE: usize = 4096;

/// Sets condition `type_` in `conditions`, keeping its transition time if the status is unchanged.
/// `message` is made inert and cut to [`MAX_CONDITION_MESSAGE`].
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let since = conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone());
    conditions.retain(|c| c.type_ != type_);
    conditions.push(Condition {
        type_: type_.to_string(),
        status,
        reason: reason.to_string(),
        message: outside_text(message, MAX_CONDITION_MESSAGE),
        observed_generation: generation,
        last_transition_time: since.unwrap_or_else(|| Time(Timestamp::now())),
    });
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}

/// Whether condition `type_` is present and True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// A failure to set a reconciler up, with the condition reason to report.
#[derive(Debug)]
pub(super) struct SetupError {
    pub reason: &'static str,
    pub message: String,
}

/// The WasmReconciler a supervisor reports on: the object as last seen, the status it writes,
/// and the recorder of its Events.
pub(super) struct Subject {
    pub ctx: Arc<HostContext>,
    pub wr: WasmReconciler,
    pub status: WasmReconcilerStatus,
    pub events: Recorder,
    /// With sharding: another replica decides this reconciler's module
    /// ([`crate::sharding::Serving::decides`]). A follower's status writes leave the fields the
    /// decider owns (`activeModule`, `rejectedSha256`, `moduleCopy`, `ungranted`) as they are.
    pub follower: bool,
}

impl Subject {
    pub fn new(ctx: Arc<HostContext>, wr: WasmReconciler) -> Self {
        let status = wr.status.clone().unwrap_or_default();
        let events = ctx.host_events();
        Subject {
            ctx,
            wr,
            status,
            events,
            follower: false,
        }
    }

    pub fn name(&self) -> String {
        self.wr.name_any()
    }

    /// Reports a panic of this supervisor (a host bug): logged as an error, `Ready=False` with
    /// reason `InternalError`, and a Warning Event. The reconciler stays stopped until the
    /// WasmReconciler changes or the host restarts.
    pub async fn panicked(&mut self, message: &str) {
        let message = format!(
            "the host's supervisor of this reconciler panicked: {message} (a wasmop bug: please report it; edit the WasmReconciler or restart the host to retry)"
        );
        tracing::error!(reconciler = %self.name(), "{message}");
        self.condition(reasons::READY, false, reasons::INTERNAL_ERROR, &message);
        self.write_status().await;
        self.event_on_wr(KubeEventType::Warning, reasons::INTERNAL_ERROR, &message)
            .await;
    }

    /// Reports the watches that cannot list or watch: `Ready=False` (reason `WatchFailed`,
    /// naming each kind and the API's error) and a Warning Event when that changes; back to
    /// `Ready=True` once every watch works again. No reconcile runs meanwhile (the controller
    /// waits for every cache), so this does not hold the host's own readiness back.
    pub async fn watch_failures(&mut self, health: &Health) {
        let failing = health.watches.failing();
        let ready = self
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == reasons::READY)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
        if failing.is_empty() {
            if ready.is_some_and(|(_, reason, _)| reason == reasons::WATCH_FAILED) {
                let watching = format!("watching {}", self.wr.spec.primary.kind);
                self.condition(reasons::READY, true, reasons::RECONCILING, &watching);
                self.event_on_wr(KubeEventType::Normal, reasons::WATCHES_SYNCED, &watching)
                    .await;
            }
            return;
        }
        let message = format!(
            "{}; no reconcile runs until every watch has listed its objects",
            failing.join("; ")
        );
        if ready.is_some_and(|(status, reason, m)| {
            status == "False" && reason == reasons::WATCH_FAILED && m == message
        }) {
            return;
        }
        tracing::warn!(reconciler = %self.name(), "{message}");
        if health.watches.lasting() {
            // Reported here; it must not keep the whole host unready (transient failures do,
            // until the watch recovers).
            readiness::global().ready(&controller::readiness_component(&self.name()));
        }
        self.condition(reasons::READY, false, reasons::WATCH_FAILED, &message);
        self.event_on_wr(KubeEventType::Warning, reasons::WATCH_FAILED, &message)
            .await;
    }

    pub async fn degraded(&mut self, health: &Health) {
        let crashed = health.crashed.lock().ok().and_then(|mut c| c.take());
        if let Some(message) = crashed {
            self.panicked(&format!("its controller: {message}")).await;
            return;
        }
        self.watch_failures(health).await;
        match refused_by_rbac(health) {
            Some(message) => self.condition(reasons::DEGRADED, true, reasons::FORBIDDEN, &message),
            None => self.condition(reasons::DEGRADED, false, reasons::ALL_WRITES_ALLOWED, ""),
        }
        self.write_status().await;
    }

    /// Sets a condition of the WasmReconciler's status at its current generation.
    pub fn condition(&mut self, type_: &str, status: bool, reason: &str, message: &str) {
        let generation = self.wr.metadata.generation;
        set(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            generation,
        );
    }

    pub async fn write_status(&mut self) {
        self.status.observed_generation = self.wr.metadata.generation;
        let api: Api<WasmReconciler> = Api::all(self.ctx.client.clone());
        let patch = status_patch(&self.status, self.follower);
        if let Err(e) = api
            .patch_status(&self.name(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(reconciler = %self.name(), error = %e, "cannot write the WasmReconciler status");
        }
    }

    pub async fn event_on_wr(&self, type_: KubeEventType, reason: &str, message: &str) {
        let event = KubeEvent {
            type_,
            reason: reason.to_string(),
            note: Some(truncate(message)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.events.publish(&event, &self.wr.object_ref(&())).await {
            tracing::warn!(error = %e, "cannot record an Event on the WasmReconciler");
        }
    }
}

/// The merge patch that writes `status`, with `null` for each field the host clears. A merge
/// keeps every field a patch omits, and a stale `rejectedSha256` refused the module again after
/// a restart.
///
/// A `follower` (see [`Subject::follower`]) writes none of the fields the decider owns.
///
/// Caveats: `moduleCopy` is only ever replaced, never cleared: a copy is checked against
/// `activeModule.sha256` before it is used, and a status read before the copy was written
/// (a supervisor restarted from a watch event) must not erase it.
fn status_patch(status: &WasmReconcilerStatus, follower: bool) -> serde_json::Value {
    let mut value = json!(status);
    let fields = value.as_object_mut().expect("a status is an object");
    if follower {
        for decided in ["activeModule", "rejectedSha256", "moduleCopy", "ungranted"] {
            fields.remove(decided);
        }
        return json!({ "status": value });
    }
    for cleared in ["rejectedSha256", "ungranted"] {
        fields.entry(cleared).or_insert(serde_json::Value::Null);
    }
    if let Some(active) = fields
        .get_mut("activeModule")
        .and_then(|a| a.as_object_mut())
    {
        for cleared in ["origin", "verifiedBy"] {
            active.entry(cleared).or_insert(serde_json::Value::Null);
        }
    }
    json!({ "status": value })
}

/// `s` made inert and cut to what an Event note holds, with `...` when cut.
pub(super) fn truncate(s: &str) -> String {
    outside_text(s, intents::MAX_EVENT_NOTE)
}

/// `text` made inert (escaped, [`crate::text::inert`]) and then cut to `max` bytes: the one rule
/// for text from outside (registries, the API server, modules) that reaches a condition or an
/// Event.
fn outside_text(text: &str, max: usize) -> String {
    crate::text::cut(crate::text::inert(text).into_owned(), max)
}

/// The message of `Degraded=True` (reason `Forbidden`) when RBAC refuses some of the reconciler's
/// writes (by object) or its module's Events; None when it refuses nothing.
fn refused_by_rbac(health: &Health) -> Option<String> {
    let forbidden = health
        .forbidden
        .lock()
        .map(|f| f.clone())
        .unwrap_or_default();
    let writes = forbidden.iter().next().map(|(key, message)| {
        format!(
            "{} object(s) have writes refused by RBAC; first: {key}: {message}",
            forbidden.len()
        )
    });
    let events = health
        .events_refused
        .lock()
        .ok()
        .and_then(|refused| refused.clone())
        .map(|message| {
            format!(
                "the module's Events are refused by RBAC and dropped (grant create and patch on \
                 events.k8s.io events): {message}"
            )
        });
    match (writes, events) {
        (Some(w), Some(e)) => Some(format!("{w}; {e}")),
        (w, e) => w.or(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{ActiveModule, ConfigMapKey, VerifiedKey};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn active(origin: Option<&str>) -> ActiveModule {
        ActiveModule {
            sha256: "y".into(),
            name: "m".into(),
            version: "1".into(),
            loaded_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            source: "compiled".into(),
            origin: origin.map(str::to_string),
            verified_by: Vec::new(),
        }
    }

    #[test]
    fn refused_writes_and_refused_events_each_degrade_and_both_are_told() {
        let health = Health::default();
        assert_eq!(refused_by_rbac(&health), None);
        if let Ok(mut refused) = health.events_refused.lock() {
            *refused = Some("events.events.k8s.io is forbidden".into());
        }
        let events = refused_by_rbac(&health).unwrap_or_default();
        assert!(
            events.starts_with("the module's Events are refused by RBAC")
                && events.ends_with("events.events.k8s.io is forbidden"),
            "{events}"
        );
        if let Ok(mut forbidden) = health.forbidden.lock() {
            forbidden.insert("ns/app".into(), "may not create services".into());
        }
        let both = refused_by_rbac(&health).unwrap_or_default();
        assert!(
            both.starts_with("1 object(s) have writes refused by RBAC; first: ns/app: may not")
                && both.ends_with(&events),
            "{both}"
        );
    }

    #[test]
    fn condition_messages_and_event_notes_are_inert_and_cut() {
        let hostile = format!(
            "registry said:\n\u{1b}[2Jfake line\u{202e}{}",
            "x".repeat(100_000)
        );
        let mut conditions = Vec::new();
        set(
            &mut conditions,
            "Ready",
            false,
            "RegistryError",
            &hostile,
            Some(1),
        );
        let message = &conditions[0].message;
        assert!(message.len() <= MAX_CONDITION_MESSAGE, "{}", message.len());
        assert!(
            message.starts_with("registry said:\\n\\u{1b}[2Jfake line\\u{202e}xx"),
            "{message}"
        );
        assert!(!message.chars().any(crate::text::is_unsafe_char));
        let note = truncate(&hostile);
        assert!(note.len() <= intents::MAX_EVENT_NOTE);
        assert!(!note.chars().any(crate::text::is_unsafe_char), "{note}");
    }

    #[test]
    fn a_status_write_clears_the_fields_the_host_cleared() {
        let copy = ConfigMapKey {
            namespace: "wasmop-system".into(),
            name: "copy".into(),
            key: None,
        };
        let before = WasmReconcilerStatus {
            observed_generation: Some(1),
            active_module: Some(ActiveModule {
                verified_by: vec![VerifiedKey {
                    fingerprint: "sha256:k".into(),
                    source: "Secret wasmop-system/keys key cosign.pub".into(),
                }],
                ..active(Some("oci r@sha256:1"))
            }),
            rejected_sha256: Some("x".into()),
            ungranted: vec!["watch v1/Secret".into()],
            module_copy: Some(copy.clone()),
            ..WasmReconcilerStatus::default()
        };
        let mut live = json!({"metadata": {"name": "r"}, "status": before});
        // Rolled back X, then pushed Y from a ConfigMap: nothing is rejected, ungranted or
        // verified.
        let after = WasmReconcilerStatus {
            observed_generation: Some(2),
            active_module: Some(active(None)),
            ..WasmReconcilerStatus::default()
        };
        json_patch::merge(&mut live, &status_patch(&after, false));
        let expected = WasmReconcilerStatus {
            module_copy: Some(copy),
            ..after
        };
        assert_eq!(live["status"], json!(expected));
        assert_eq!(live["metadata"]["name"], "r");
    }

    /// Review of item 7: a replica that does not decide the module writes its conditions but
    /// never its older view of the module the group serves.
    #[test]
    fn a_follower_leaves_the_decided_fields_alone() {
        let decided = WasmReconcilerStatus {
            active_module: Some(active(Some("oci r@sha256:2"))),
            rejected_sha256: Some("x".into()),
            ..WasmReconcilerStatus::default()
        };
        let mut live = json!({"status": decided});
        let stale = WasmReconcilerStatus {
            observed_generation: Some(3),
            active_module: Some(active(None)),
            ..WasmReconcilerStatus::default()
        };
        json_patch::merge(&mut live, &status_patch(&stale, true));
        assert_eq!(live["status"]["activeModule"], json!(decided.active_module));
        assert_eq!(live["status"]["rejectedSha256"], "x");
        assert_eq!(live["status"]["observedGeneration"], 3);
    }
}
