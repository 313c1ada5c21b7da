//! The process-wide bound on reconciles running at once (`--max-concurrent-reconciles`).
//!
//! Each WasmReconciler's controller runs at most `spec.limits.concurrency` reconciles at once;
//! with many WasmReconcilers those add up without bound: every running reconcile holds a sandbox,
//! its request and response, and API requests in flight. [`ReconcileLimit`] is one semaphore
//! shared by every controller of the host: a reconcile takes a permit before it reads the
//! caches and calls the module, and gives it back when its writes are done.
//!
//! # Guarantees
//! - At most `max` reconciles (and finalizes) run at once over all WasmReconcilers of the host.
//! - Permits are handed out first come, first served (tokio's fair semaphore), so a busy
//!   reconciler cannot starve another.
//! - A permit is returned when its reconcile ends, however it ends (the permit is dropped).
//!
//! # Errors
//! Nothing here fails: the semaphore is never closed.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The default `--max-concurrent-reconciles` (see docs/operating.md, "Scale").
pub const DEFAULT_MAX: usize = 64;

/// A process-wide count of running reconciles; clones share it.
#[derive(Debug, Clone)]
pub struct ReconcileLimit {
    permits: Arc<Semaphore>,
    max: usize,
}

impl Default for ReconcileLimit {
    fn default() -> Self {
        ReconcileLimit::new(DEFAULT_MAX)
    }
}

impl ReconcileLimit {
    /// At most `max` reconciles at once (at least 1).
    pub fn new(max: usize) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        ReconcileLimit {
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Reconciles running now.
    pub fn running(&self) -> usize {
        self.max - self.permits.available_permits()
    }

    /// Waits for a permit; the reconcile runs while the permit lives.
    pub async fn admit(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().acquire_owned().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Ten reconciles (of any reconcilers) against a bound of three: three are admitted, the
    /// others wait; each one that ends admits exactly one more, and all ten run in the end.
    #[tokio::test(flavor = "current_thread")]
    async fn at_most_max_reconciles_run_over_all_reconcilers() {
        let limit = ReconcileLimit::new(3);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (admitted_tx, mut admitted) = tokio::sync::mpsc::unbounded_channel::<usize>();
        let mut finish = Vec::new();
        for i in 0..10 {
            // Every controller holds a clone of the one limit.
            let limit = limit.clone();
            let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
            finish.push(done_tx);
            let (in_flight, most, admitted_tx) =
                (in_flight.clone(), most.clone(), admitted_tx.clone());
            tokio::spawn(async move {
                let _permit = limit.admit().await;
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let _ = admitted_tx.send(i);
                let _ = done_rx.await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
            });
        }
        let settle = || async {
            for _ in 0..50 {
                tokio::task::yield_now().await;
            }
        };
        settle().await;
        let mut first = Vec::new();
        while let Ok(i) = admitted.try_recv() {
            first.push(i);
        }
        assert_eq!(first.len(), 3, "admitted at once: {first:?}");
        assert_eq!(limit.running(), 3);

        // Ending one admits exactly one more.
        let mut finish: Vec<Option<_>> = finish.into_iter().map(Some).collect();
        if let Some(tx) = finish[first[0]].take() {
            let _ = tx.send(());
        }
        settle().await;
        let mut next = Vec::new();
        while let Ok(i) = admitted.try_recv() {
            next.push(i);
        }
        assert_eq!(next.len(), 1, "admitted after one ended: {next:?}");

        // Ending everything lets all ten run, never more than three at once.
        let mut total = first.len() + next.len();
        for _ in 0..20 {
            if total >= 10 {
                break;
            }
            for tx in finish.iter_mut().filter_map(Option::take) {
                let _ = tx.send(());
            }
            settle().await;
            while admitted.try_recv().is_ok() {
                total += 1;
            }
        }
        assert_eq!(total, 10, "every reconcile ran in the end");
        assert_eq!(most.load(Ordering::SeqCst), 3);
        settle().await;
        assert_eq!(limit.running(), 0);
    }
}
