//! The process-wide bound on reconciles running at once (`--max-concurrent-reconciles`),
//! shared fairly between reconcilers.
//!
//! Each WasmReconciler's controller runs at most `spec.limits.concurrency` reconciles at once;
//! with many WasmReconcilers those add up without bound: every running reconcile holds a sandbox,
//! its request and response, and API requests in flight. [`ReconcileLimit`] bounds them all: a
//! reconcile takes a [`Permit`] in its reconciler's lane before it reads the caches and calls
//! the module, and gives it back when its writes are done.
//!
//! A permit is held across the module call, which may last the module's whole deadline (up to
//! minutes). With one first-come-first-served semaphore, a reconciler with a high concurrency
//! and slow calls took every permit, and every other reconciler waited behind its queue for as
//! long as its calls lasted.
//!
//! # Guarantees
//! - At most `max` reconciles (and finalizes) run at once over all reconcilers of the host.
//! - No reconciler holds more than [`ReconcileLimit::share`] permits (`max` less a quarter,
//!   for `max` >= 4): a quarter of the permits is always left to the others, so a reconciler
//!   whose calls are slow cannot make another wait for them.
//! - A freed permit goes to the lane that waited longest since it was last served (round robin
//!   over the lanes with waiters, as the engine's call queue does), first come first served
//!   within a lane.
//! - A permit is returned when it is dropped, however its reconcile ends; a waiter that gives up
//!   (its future dropped) takes nothing.
//!
//! # Caveats
//! - Permits already held are not taken back: fairness is decided when a permit is handed out.
//!
//! # Errors
//! Nothing here fails.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// The default `--max-concurrent-reconciles` (see docs/operating.md, "Scale").
pub const DEFAULT_MAX: usize = 64;

/// A process-wide count of running reconciles; clones share it.
#[derive(Debug, Clone)]
pub struct ReconcileLimit {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    max: usize,
    share: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    running: usize,
    /// Permits held per lane (lanes holding none are removed).
    held: HashMap<Arc<str>, usize>,
    /// Lanes with waiters, in serving order.
    lanes: VecDeque<Arc<str>>,
    waiting: HashMap<Arc<str>, VecDeque<oneshot::Sender<Permit>>>,
}

/// One running reconcile of a lane; dropping it lets the next one in.
#[derive(Debug)]
pub struct Permit {
    inner: Arc<Inner>,
    lane: Arc<str>,
    /// False for a permit that was never handed over (its waiter had gone): nothing to return.
    armed: bool,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut state = self.inner.lock();
        state.release(&self.lane);
        self.inner.grant(&mut state);
    }
}

impl Default for ReconcileLimit {
    fn default() -> Self {
        ReconcileLimit::new(DEFAULT_MAX)
    }
}

impl State {
    fn held(&self, lane: &str) -> usize {
        self.held.get(lane).copied().unwrap_or(0)
    }

    fn take(&mut self, lane: &Arc<str>) {
        self.running += 1;
        *self.held.entry(lane.clone()).or_insert(0) += 1;
    }

    fn release(&mut self, lane: &str) {
        self.running = self.running.saturating_sub(1);
        if let Some(n) = self.held.get_mut(lane) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.held.remove(lane);
            }
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a holder panicked; every update is a few statements that
        // leave the counts consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands free permits to waiters, round robin over the lanes below their share.
    fn grant(self: &Arc<Self>, state: &mut State) {
        let mut skipped = 0;
        while state.running < self.max && skipped < state.lanes.len() {
            let Some(lane) = state.lanes.pop_front() else {
                return;
            };
            if state.held(&lane) >= self.share {
                state.lanes.push_back(lane);
                skipped += 1;
                continue;
            }
            let next = state.waiting.get_mut(&lane).and_then(VecDeque::pop_front);
            let Some(tx) = next else {
                state.waiting.remove(&lane);
                continue;
            };
            if state.waiting.get(&lane).is_some_and(|w| !w.is_empty()) {
                state.lanes.push_back(lane.clone());
            } else {
                state.waiting.remove(&lane);
            }
            state.take(&lane);
            let permit = Permit {
                inner: self.clone(),
                lane: lane.clone(),
                armed: true,
            };
            if let Err(mut unsent) = tx.send(permit) {
                // The waiter gave up: undo (without locking again) and serve the next one.
                unsent.armed = false;
                state.release(&lane);
            }
            skipped = 0;
        }
    }
}

impl ReconcileLimit {
    /// At most `max` reconciles at once (at least 1).
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        let share = if max >= 4 { max - max / 4 } else { max };
        ReconcileLimit {
            inner: Arc::new(Inner {
                max,
                share,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.inner.max
    }

    /// The most permits one reconciler may hold.
    pub fn share(&self) -> usize {
        self.inner.share
    }

    /// Reconciles running now.
    pub fn running(&self) -> usize {
        self.inner.lock().running
    }

    /// Waits for a permit in `lane` (the reconciler's name); the reconcile runs while the
    /// permit lives. `None` only if the limit itself went away.
    pub async fn admit(&self, lane: &str) -> Option<Permit> {
        let rx = {
            let mut state = self.inner.lock();
            let lane: Arc<str> = Arc::from(lane);
            let queued = state.waiting.get(&lane).is_some_and(|w| !w.is_empty());
            if !queued && state.running < self.inner.max && state.held(&lane) < self.inner.share {
                state.take(&lane);
                return Some(Permit {
                    inner: self.inner.clone(),
                    lane,
                    armed: true,
                });
            }
            let (tx, rx) = oneshot::channel();
            if !state.lanes.contains(&lane) {
                state.lanes.push_back(lane.clone());
            }
            state.waiting.entry(lane).or_default().push_back(tx);
            rx
        };
        rx.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    /// Starts `n` reconciles of `lane`, each holding its permit until told to end; returns the
    /// receiver of admissions (the lane and index of each admitted reconcile) and the enders.
    fn start(
        limit: &ReconcileLimit,
        lane: &'static str,
        n: usize,
        admitted: &tokio::sync::mpsc::UnboundedSender<(&'static str, usize)>,
    ) -> Vec<oneshot::Sender<()>> {
        (0..n)
            .map(|i| {
                let (limit, admitted) = (limit.clone(), admitted.clone());
                let (end, ended) = oneshot::channel::<()>();
                tokio::spawn(async move {
                    let _permit = limit.admit(lane).await;
                    let _ = admitted.send((lane, i));
                    let _ = ended.await;
                });
                end
            })
            .collect()
    }

    fn drain<T>(rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>) -> Vec<T> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    /// Reliability item 14: a reconciler with more reconciles than permits and slow calls
    /// held every permit, and another reconciler waited for its calls to end. Now it holds at
    /// most its share, and the other's reconcile is admitted at once.
    #[tokio::test(flavor = "current_thread")]
    async fn a_busy_reconciler_leaves_permits_to_the_others() {
        let limit = ReconcileLimit::new(8);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let _busy = start(&limit, "busy", 20, &tx);
        settle().await;
        assert_eq!(
            drain(&mut rx).len(),
            6,
            "the busy reconciler holds its share, 6 of 8"
        );
        let _other = start(&limit, "other", 1, &tx);
        settle().await;
        assert_eq!(
            drain(&mut rx),
            vec![("other", 0)],
            "admitted with no permit returned"
        );
        assert_eq!(limit.running(), 7);
    }

    /// Ten reconciles against a bound of three: three are admitted, the others wait; each one
    /// that ends admits exactly one more, and all ten run in the end.
    #[tokio::test(flavor = "current_thread")]
    async fn at_most_max_reconciles_run_over_all_reconcilers() {
        let limit = ReconcileLimit::new(3);
        let most = Arc::new(AtomicUsize::new(0));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut ends = start(&limit, "a", 5, &tx);
        ends.extend(start(&limit, "b", 5, &tx));
        settle().await;
        let first = drain(&mut rx);
        assert_eq!(first.len(), 3, "admitted at once: {first:?}");
        assert_eq!(limit.running(), 3);
        let mut ends: Vec<Option<_>> = ends.into_iter().map(Some).collect();
        let index = |(lane, i): (&str, usize)| if lane == "a" { i } else { 5 + i };
        if let Some(end) = ends[index(first[0])].take() {
            let _ = end.send(());
        }
        settle().await;
        let next = drain(&mut rx);
        assert_eq!(next.len(), 1, "admitted after one ended: {next:?}");
        let mut total = first.len() + next.len();
        for _ in 0..20 {
            most.fetch_max(limit.running(), Ordering::SeqCst);
            if total >= 10 {
                break;
            }
            for end in ends.iter_mut().filter_map(Option::take) {
                let _ = end.send(());
            }
            settle().await;
            total += drain(&mut rx).len();
        }
        assert_eq!(total, 10, "every reconcile ran in the end");
        assert!(most.load(Ordering::SeqCst) <= 3);
        settle().await;
        assert_eq!(limit.running(), 0);
    }

    /// Freed permits go round robin over the waiting lanes, in the order they started waiting.
    #[tokio::test(flavor = "current_thread")]
    async fn freed_permits_go_round_robin_over_the_waiting_lanes() {
        let limit = ReconcileLimit::new(4);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut a = start(&limit, "a", 3, &tx);
        settle().await;
        let mut b = start(&limit, "b", 1, &tx);
        settle().await;
        assert_eq!(drain(&mut rx).len(), 4);
        a.extend(start(&limit, "a", 2, &tx));
        settle().await;
        b.extend(start(&limit, "b", 2, &tx));
        settle().await;
        let _c = start(&limit, "c", 1, &tx);
        settle().await;
        assert!(drain(&mut rx).is_empty(), "all four permits are held");
        let mut served = Vec::new();
        for end in [a.remove(0), b.remove(0), a.remove(0)] {
            let _ = end.send(());
            settle().await;
            served.extend(drain(&mut rx).into_iter().map(|(lane, _)| lane));
        }
        assert_eq!(served, ["a", "b", "c"]);
    }

    /// A waiter that gives up takes nothing: its permit goes to the next one.
    #[tokio::test(flavor = "current_thread")]
    async fn a_waiter_that_gives_up_takes_nothing() {
        let limit = ReconcileLimit::new(1);
        let held = limit.admit("a").await;
        let gave_up = tokio::spawn({
            let limit = limit.clone();
            async move { limit.admit("b").await.is_some() }
        });
        settle().await;
        gave_up.abort();
        settle().await;
        drop(held);
        assert_eq!(limit.running(), 0, "the aborted waiter holds nothing");
        let again = limit.admit("c").await;
        assert!(again.is_some());
        assert_eq!(limit.running(), 1);
    }
}
