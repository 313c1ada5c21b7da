//! Waiting for a condition on a live cluster.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `probe` every 100 ms until it yields `Some(value)`, for at most `timeout`.
///
/// `probe` errors are remembered and reported if the time runs out (a transient error, such as a
/// conflict or a not-yet-registered kind, does not end the wait).
///
/// # Errors
/// When `timeout` passes, an error naming `what`, the time waited and the last error seen.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let start = Instant::now();
    let mut last = String::from("condition not met");
    loop {
        match probe().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if start.elapsed() >= timeout {
            anyhow::bail!("timed out after {:?} waiting for {what}: {last}", timeout);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
