//! What a reconciler's controller reports to the manager ([`Health`]): Forbidden writes, the
//! module's Events refused by RBAC, its crash, and the health of its watches (which watched kinds
//! cannot list or watch, and why).
//!
//! kube-runtime's watchers retry failed lists and watches with a backoff and only hand the
//! errors down their streams; the controller taps each stream and records the last error per
//! kind here, so the manager can report it on the WasmReconciler (`Ready=False`, reason
//! `WatchFailed`, and a Warning Event) instead of leaving it in debug logs.
//!
//! # Guarantees
//! - A kind is listed as failing from its first error until its watcher delivers an object or
//!   finishes a list again.
//! - The manager is notified only when the set of failures (or a message) changes, so a watch
//!   retrying the same error does not write the status again.
//!
//! # Errors
//! Nothing here fails; a poisoned lock only drops a report.

use std::collections::BTreeMap;
use std::sync::Mutex;

use kube::runtime::watcher;

use crate::contract::Gvk;

/// The reason of the `Ready=False` condition a failing watch sets.
pub use crate::reasons::WATCH_FAILED;

/// The last error of every watched kind that currently fails, by `apiVersion/kind`.
#[derive(Debug, Default)]
pub struct WatchErrors {
    failing: Mutex<BTreeMap<String, (String, bool)>>,
}

impl WatchErrors {
    /// Records what a watcher of `kind` just delivered. Returns whether the failures changed.
    pub fn record<K>(&self, kind: &Gvk, event: &Result<watcher::Event<K>, watcher::Error>) -> bool {
        let key = format!("{}/{}", kind.api_version, kind.kind);
        let Ok(mut failing) = self.failing.lock() else {
            return false;
        };
        match event {
            Err(e) => {
                let entry = (describe(kind, e), is_lasting(e));
                failing.insert(key, entry.clone()).as_ref() != Some(&entry)
            }
            // `Init` starts a list that may still fail; anything after it means the API answered.
            Ok(watcher::Event::Init) => false,
            Ok(_) => failing.remove(&key).is_some(),
        }
    }

    /// The failing kinds' messages, in kind order.
    pub fn failing(&self) -> Vec<String> {
        self.failing
            .lock()
            .map(|f| f.values().map(|(m, _)| m.clone()).collect())
            .unwrap_or_default()
    }

    /// Whether some failure lasts until the cluster changes (see [`is_lasting`]).
    pub fn lasting(&self) -> bool {
        self.failing
            .lock()
            .is_ok_and(|f| f.values().any(|(_, lasting)| *lasting))
    }
}

/// What the controller tells the manager (for the WasmReconciler's status).
#[derive(Debug, Default)]
pub struct Health {
    /// Objects whose last reconcile hit a Forbidden write, with the message.
    pub forbidden: Mutex<BTreeMap<String, String>>,
    /// The API's message when the module's last Event was refused by RBAC (403); cleared by the
    /// next Event published (see [`super::emit`]).
    pub events_refused: Mutex<Option<String>>,
    /// Watched kinds that cannot list or watch, with the API's error.
    pub watches: WatchErrors,
    /// The controller panicked (a host bug), with the panic's message.
    pub crashed: Mutex<Option<String>>,
    /// Bumped whenever `forbidden`, `events_refused`, `watches` or `crashed` changes.
    pub changed: tokio::sync::Notify,
}

impl Health {
    /// Records what a watcher of `kind` delivered and tells the manager when that changes the
    /// failing watches.
    pub(super) fn watched<K>(&self, kind: &Gvk, event: &Result<watcher::Event<K>, watcher::Error>) {
        if let Err(e) = event {
            tracing::debug!(kind = %kind.kind, error = %e, "watch failed; retrying");
        }
        if self.watches.record(kind, event) {
            self.changed.notify_one();
        }
    }

    /// Records that the module's last Event was refused by RBAC (`Some`, the API's message) or
    /// published (`None`), and tells the manager when that changes.
    pub(super) fn record_events(&self, refused: Option<String>) {
        let changed = self.events_refused.lock().is_ok_and(|mut was| {
            let changed = *was != refused;
            *was = refused;
            changed
        });
        if changed {
            self.changed.notify_one();
        }
    }

    /// Records that the controller panicked with `message` and tells the manager.
    pub(super) fn report_crash(&self, message: String) {
        if let Ok(mut c) = self.crashed.lock() {
            *c = Some(message);
        }
        self.changed.notify_one();
    }
}

/// The message of a panic's payload (a `&str` or `String` for `panic!` and `.expect`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// The API status of a watcher error, when the API server answered with one.
fn status(e: &watcher::Error) -> Option<&kube::core::Status> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => Some(&**s),
        _ => None,
    }
}

/// What failed, for the WasmReconciler's condition and Event: the kind, the API's reason and
/// message, and what to do.
pub fn describe(kind: &Gvk, e: &watcher::Error) -> String {
    let what = format!("cannot list and watch {}/{}", kind.api_version, kind.kind);
    match status(e) {
        Some(s) => {
            let hint = match s.code {
                401 | 403 => {
                    " (grant the host's ServiceAccount get, list and watch on this kind, e.g. in a ClusterRole labelled wasmop.dev/aggregate-to-host=true)"
                }
                404 => " (is the kind's CRD installed and served?)",
                _ => "",
            };
            format!("{what}: {} ({}): {}{hint}", s.reason, s.code, s.message)
        }
        None => format!("{what}: {e}"),
    }
}

/// Whether the error lasts until someone changes the cluster (RBAC, CRDs), as opposed to a
/// transient failure the watcher's retries ride out.
pub fn is_lasting(e: &watcher::Error) -> bool {
    status(e).is_some_and(|s| matches!(s.code, 401 | 403 | 404))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden() -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(kube::core::Status {
            code: 403,
            reason: "Forbidden".into(),
            message: "namespaces is forbidden: User \"h\" cannot list resource \"namespaces\""
                .into(),
            ..kube::core::Status::default()
        })))
    }

    #[test]
    fn a_failing_kind_is_recorded_once_and_cleared_by_a_successful_list() {
        let kind = Gvk::new("v1", "Namespace");
        let w = WatchErrors::default();
        let e: Result<watcher::Event<()>, _> = Err(forbidden());
        assert!(w.record(&kind, &e), "the first error is a change");
        assert!(!w.record(&kind, &e), "the same error again is not");
        let failing = w.failing();
        assert_eq!(failing.len(), 1);
        assert!(
            failing[0].contains("v1/Namespace") && failing[0].contains("Forbidden (403)"),
            "{failing:?}"
        );
        assert!(is_lasting(&forbidden()));
        assert!(!w.record(&kind, &Ok(watcher::Event::<()>::Init)));
        assert_eq!(
            w.failing().len(),
            1,
            "Init alone does not prove the list works"
        );
        assert!(w.record(&kind, &Ok(watcher::Event::<()>::InitDone)));
        assert!(w.failing().is_empty());
    }

    #[test]
    fn transport_errors_are_not_lasting() {
        let e = watcher::Error::NoResourceVersion;
        assert!(!is_lasting(&e));
        assert!(describe(&Gvk::new("v1", "Pod"), &e).contains("v1/Pod"));
    }
}
