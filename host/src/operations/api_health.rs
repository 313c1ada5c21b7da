//! Whether the API server answers, as the readiness component `api-server`.
//!
//! Caches that synced once stay "synced" while the API server is gone: kube-runtime's watchers
//! keep their stores and retry with backoff, and nothing else flips [`crate::operations::readiness`] back.
//! A replica that cannot reach its API server can neither reconcile nor admit correctly, so
//! `/readyz` must say so: this task asks the API server's own `/readyz` every
//! [`PROBE_PERIOD`] and marks the component pending on the first failure, ready on the first
//! success.
//!
//! # Guarantees
//! - `api-server` is pending from the start until the API server first answers `ok`, pending
//!   again within [`PROBE_PERIOD`] + [`PROBE_TIMEOUT`] of it becoming unreachable or unready,
//!   and ready again within the same time of its recovery.
//! - Each transition is logged once (warn when lost, info when back), not every probe.
//! - When `stop` resolves the component is forgotten, so a stopped host holds nothing back.
//!
//! # Errors
//! None: a failed probe is the information this task reports.

use std::time::Duration;

use kube::Client;

use crate::operations::readiness;

/// The readiness component this task feeds.
pub const COMPONENT: &str = "api-server";
/// How often the API server is asked.
pub const PROBE_PERIOD: Duration = Duration::from_secs(2);
/// How long one probe may take before it counts as a failure.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Registers [`COMPONENT`] as pending, then asks the API server's `/readyz` in a task of its
/// own until `stop` resolves.
pub fn spawn(
    client: Client,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    readiness::global().pending(COMPONENT);
    tokio::spawn(watch(client, stop))
}

async fn watch(client: Client, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    let mut reachable: Option<bool> = None;
    loop {
        let outcome = probe(&client).await;
        match (&outcome, reachable) {
            (Ok(()), Some(true)) | (Err(_), Some(false)) => {}
            (Ok(()), _) => {
                readiness::global().ready(COMPONENT);
                if reachable.is_some() {
                    tracing::info!("the API server answers again");
                }
            }
            (Err(e), _) => {
                readiness::global().pending(COMPONENT);
                tracing::warn!(error = %e, "the API server does not answer; not ready until it does");
            }
        }
        reachable = Some(outcome.is_ok());
        tokio::select! {
            () = &mut stop => break,
            () = tokio::time::sleep(PROBE_PERIOD) => {}
        }
    }
    readiness::global().forget(COMPONENT);
}

/// One `GET /readyz` of the API server.
async fn probe(client: &Client) -> Result<(), String> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(PROBE_TIMEOUT, client.request_text(request)).await {
        Err(_) => Err(format!("no answer to /readyz within {PROBE_TIMEOUT:?}")),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(body)) if body.trim() == "ok" => Ok(()),
        Ok(Ok(body)) => Err(format!("/readyz answered {:?}", body.trim())),
    }
}
