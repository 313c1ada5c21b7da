//! The WasmReconciler's status as its supervisor reports it: conditions (`metav1.Condition`,
//! kept the Kubernetes way: `lastTransitionTime` changes only when a condition's status does),
//! the status writes, and the Events on the WasmReconciler.
//!
//! # Guarantees
//! - Every condition carries the generation it was set at; every write records
//!   `status.observedGeneration`.
//! - A failure to write the status or an Event is logged, never fatal: the next change writes
//!   again.

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

/// Sets condition `type_` in `conditions`, keeping its transition time if the status is unchanged.
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
        message: message.to_string(),
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
        let forbidden = health
            .forbidden
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default();
        if forbidden.is_empty() {
            self.condition(reasons::DEGRADED, false, reasons::ALL_WRITES_ALLOWED, "");
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
            self.condition(reasons::DEGRADED, true, reasons::FORBIDDEN, &message);
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
        let patch = json!({ "status": self.status });
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

/// `s` cut to what an Event note holds, with `...` when cut.
pub(super) fn truncate(s: &str) -> String {
    crate::text::cut(s.to_string(), intents::MAX_EVENT_NOTE)
}
