//! The order in which one reconciler's waiting reconciles run: work that reacts to a change
//! before timed work.
//!
//! kube-runtime's runner takes due entries from its scheduler and starts each at once, up to a
//! concurrency bound; it cannot be reordered. When thousands of timed requeues (a module's
//! `requeue_after`, the periodic resync) are due together, they took every slot, and a primary
//! created meanwhile waited behind all of them. So the runner hands over (almost) every due
//! entry ([`RUNNER_BOUND`]), and each reconcile first passes this [`PriorityGate`], which has
//! exactly `spec.limits.concurrency` permits and two lanes:
//!
//! - [`Lane::Reactive`]: the primary was first seen or changed, a child or related object
//!   changed, a new module was activated, or a retry after a failure;
//! - [`Lane::Timed`]: the module's requeue-after and the periodic resync.
//!
//! # Guarantees
//! - At most `permits` holders at once; a permit comes back when its [`Permit`] is dropped,
//!   however the reconcile ends, and a waiter that gives up (its future is dropped) takes none.
//! - When a permit comes free and both lanes wait, a reactive waiter gets it, unless the oldest
//!   timed waiter has waited [`PROMOTE_AFTER`] or longer and arrived before the oldest reactive
//!   one: then it does (anti-starvation). Within a lane: first come, first served.
//! - So a timed waiter waits at most [`PROMOTE_AFTER`] plus the work of the waiters that arrived
//!   before it; a reactive waiter is passed only by timed waiters that arrived earlier and have
//!   waited [`PROMOTE_AFTER`]. With a permit free, nobody waits.
//! - Every operation is O(1) amortized (no scan of the waiters).
//! - The lane is decided when the reconcile arrives (from the same state `begin` reads): an
//!   entry that waits in the timed lane while its primary changes keeps its place there; the
//!   reconcile, once admitted, sees the change (it reads everything afresh), and kube-runtime
//!   holds the change's own request until then.
//!
//! # Errors
//! Nothing here fails.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::contract::Trigger;

/// How long a timed waiter may be passed by reactive waiters that arrived after it.
pub const PROMOTE_AFTER: Duration = Duration::from_secs(30);

/// How many entries kube-runtime's runner hands over at once (its `concurrency` setting): every
/// due entry, up to `u16::MAX` (the runner's largest bound). The runner holds at most one entry
/// per primary (the scheduler deduplicates, and never hands over an object that is running or
/// waiting here), so in practice the bound is the number of primaries in scope. A waiting entry
/// shares its primary with the cache (kube-runtime keeps the object it handed over, for the
/// error policy; the reconcile reads the current one again once admitted), so only a primary
/// that changed while its entry waits costs an extra copy.
pub const RUNNER_BOUND: u16 = u16::MAX;

/// Which lane a reconcile waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Reacts to a change: first sight or change of the primary, a child or related change, a
    /// new module, a retry after a failure.
    Reactive,
    /// Timed: the module's requeue-after, the periodic resync.
    Timed,
}

impl Lane {
    /// The lane of a reconcile with `trigger`.
    pub fn of(trigger: &Trigger) -> Lane {
        match trigger {
            Trigger::Requeue | Trigger::Resync => Lane::Timed,
            Trigger::PrimaryChanged
            | Trigger::ChildChanged(_)
            | Trigger::RelatedChanged(_)
            | Trigger::Retry
            | Trigger::ModuleChanged
            | Trigger::DryRun => Lane::Reactive,
        }
    }

    /// `reactive` or `timed` (the `lane` label of `wasmop_workqueue_waiting`).
    pub fn name(self) -> &'static str {
        match self {
            Lane::Reactive => "reactive",
            Lane::Timed => "timed",
        }
    }

    fn index(self) -> usize {
        match self {
            Lane::Reactive => 0,
            Lane::Timed => 1,
        }
    }
}

/// Told the number of waiters of each lane (`[reactive, timed]`) whenever it changes.
pub type Observer = Box<dyn Fn([usize; 2]) + Send + Sync>;

type Clock = Box<dyn Fn() -> Instant + Send + Sync>;

/// A per-reconciler gate with a fixed number of permits and two lanes; clones share it.
#[derive(Clone)]
pub struct PriorityGate {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PriorityGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PriorityGate")
            .field("waiting", &self.waiting())
            .finish_non_exhaustive()
    }
}

struct Inner {
    state: Mutex<State>,
    promote_after: Duration,
    clock: Clock,
    observer: Option<Observer>,
}

#[derive(Default)]
struct State {
    available: usize,
    lanes: [VecDeque<Waiter>; 2],
    /// Live waiters per lane (the lanes may still hold waiters that gave up).
    waiting: [usize; 2],
}

struct Waiter {
    arrived: Instant,
    tx: oneshot::Sender<Permit>,
}

/// The right to run one reconcile; given back when dropped.
#[must_use = "the reconcile runs while the permit lives"]
pub struct Permit {
    gate: Option<Arc<Inner>>,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit").finish_non_exhaustive()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(inner) = self.gate.take() {
            inner.release();
        }
    }
}

impl PriorityGate {
    /// A gate with `permits` permits (at least 1), promoting timed waiters after
    /// [`PROMOTE_AFTER`], reporting the waiters of each lane to `observer`.
    pub fn new(permits: usize, observer: Option<Observer>) -> Self {
        Self::with_clock(permits, PROMOTE_AFTER, Box::new(Instant::now), observer)
    }

    /// [`PriorityGate::new`] with the promotion age and the clock given.
    pub fn with_clock(
        permits: usize,
        promote_after: Duration,
        clock: Clock,
        observer: Option<Observer>,
    ) -> Self {
        PriorityGate {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    available: permits.max(1),
                    ..State::default()
                }),
                promote_after,
                clock,
                observer,
            }),
        }
    }

    /// Live waiters per lane: `[reactive, timed]`.
    pub fn waiting(&self) -> [usize; 2] {
        self.inner
            .state
            .lock()
            .map(|s| s.waiting)
            .unwrap_or_default()
    }

    /// Waits in `lane` for a permit. Dropping the returned future before it completes gives up
    /// the place in the lane (and any permit handed to it meanwhile comes back).
    pub async fn acquire(&self, lane: Lane) -> Permit {
        let rx = {
            let Ok(mut s) = self.inner.state.lock() else {
                // A poisoned lock (a panic elsewhere while holding it): let the reconcile run
                // rather than hang it; the bound is lost, the work is not.
                return Permit { gate: None };
            };
            if s.available > 0 {
                // A permit is free only while no live waiter is left: drop those that gave up.
                s.available -= 1;
                s.lanes.iter_mut().for_each(VecDeque::clear);
                return Permit {
                    gate: Some(self.inner.clone()),
                };
            }
            let (tx, rx) = oneshot::channel();
            let arrived = (self.inner.clock)();
            s.lanes[lane.index()].push_back(Waiter { arrived, tx });
            s.waiting[lane.index()] += 1;
            self.inner.observe(&s);
            rx
        };
        let mut waiting = Waiting {
            inner: &self.inner,
            lane,
            rx: Some(rx),
        };
        let permit = match waiting.rx.as_mut() {
            Some(rx) => rx.await.ok(),
            None => None,
        };
        waiting.rx = None;
        // The sender is only dropped unsent when the gate is gone: nothing to bound then.
        permit.unwrap_or(Permit { gate: None })
    }
}

/// A waiter's place in its lane; giving it up (dropping it unadmitted) updates the count.
struct Waiting<'a> {
    inner: &'a Arc<Inner>,
    lane: Lane,
    rx: Option<oneshot::Receiver<Permit>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        // Permits are only sent under the lock: under it, either one was sent already (give it
        // back, outside the lock) or none will be (the closed receiver is skipped).
        let handed = match self.inner.state.lock() {
            Ok(mut s) => match rx.try_recv() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    rx.close();
                    let i = self.lane.index();
                    s.waiting[i] = s.waiting[i].saturating_sub(1);
                    self.inner.observe(&s);
                    None
                }
            },
            Err(_) => rx.try_recv().ok(),
        };
        drop(handed);
    }
}

impl Inner {
    fn observe(&self, s: &State) {
        if let Some(observer) = &self.observer {
            observer(s.waiting);
        }
    }

    /// A permit came back: hand it to the next live waiter, or keep it.
    fn release(self: &Arc<Self>) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        let now = (self.clock)();
        while let Some((lane, waiter)) = s.next(now, self.promote_after) {
            let permit = Permit {
                gate: Some(self.clone()),
            };
            match waiter.tx.send(permit) {
                Ok(()) => {
                    s.waiting[lane] = s.waiting[lane].saturating_sub(1);
                    self.observe(&s);
                    return;
                }
                // The waiter gave up: this permit must not release again (the lock is held).
                Err(mut permit) => {
                    permit.gate = None;
                }
            }
        }
        s.available += 1;
    }
}

impl State {
    /// The waiter a free permit goes to (see the module's guarantees), with its lane's index.
    fn next(&mut self, now: Instant, promote_after: Duration) -> Option<(usize, Waiter)> {
        for lane in &mut self.lanes {
            while lane.front().is_some_and(|w| w.tx.is_closed()) {
                lane.pop_front();
            }
        }
        let [reactive, timed] = &self.lanes;
        let lane = match (reactive.front(), timed.front()) {
            (None, None) => return None,
            (Some(_), None) => 0,
            (None, Some(_)) => 1,
            (Some(r), Some(t)) => usize::from(
                now.saturating_duration_since(t.arrived) >= promote_after && t.arrived <= r.arrived,
            ),
        };
        self.lanes[lane].pop_front().map(|w| (lane, w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::sync::mpsc;

    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    /// A waiter task: waits in `lane`, reports `id` when admitted, holds the permit until told.
    fn waiter(
        gate: &PriorityGate,
        lane: Lane,
        id: &'static str,
        admitted: &mpsc::UnboundedSender<&'static str>,
    ) -> oneshot::Sender<()> {
        let (gate, admitted) = (gate.clone(), admitted.clone());
        let (done_tx, done_rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _permit = gate.acquire(lane).await;
            let _ = admitted.send(id);
            let _ = done_rx.await;
        });
        done_tx
    }

    /// Lets the admitted waiter `id` end (its permit comes back).
    fn finish(hold: &mut HashMap<&'static str, oneshot::Sender<()>>, id: Option<&'static str>) {
        if let Some(tx) = id.and_then(|id| hold.remove(id)) {
            let _ = tx.send(());
        }
    }

    fn drain(rx: &mut mpsc::UnboundedReceiver<&'static str>) -> Vec<&'static str> {
        let mut out = Vec::new();
        while let Ok(id) = rx.try_recv() {
            out.push(id);
        }
        out
    }

    /// A clock that moves only when told (seconds after a fixed start).
    fn manual_clock() -> (Clock, Arc<AtomicU64>) {
        let start = Instant::now();
        let secs = Arc::new(AtomicU64::new(0));
        let s = secs.clone();
        let clock: Clock = Box::new(move || start + Duration::from_secs(s.load(Ordering::SeqCst)));
        (clock, secs)
    }

    /// With every permit taken, reactive waiters are admitted before timed ones that arrived
    /// earlier, each lane first come, first served.
    #[tokio::test(flavor = "current_thread")]
    async fn reactive_waiters_go_first_and_each_lane_is_fifo() {
        let gate = PriorityGate::new(2, None);
        let (tx, mut admitted) = mpsc::unbounded_channel();
        let mut hold = HashMap::from([
            ("busy-1", waiter(&gate, Lane::Timed, "busy-1", &tx)),
            ("busy-2", waiter(&gate, Lane::Timed, "busy-2", &tx)),
        ]);
        settle().await;
        assert_eq!(drain(&mut admitted), ["busy-1", "busy-2"]);
        // Arrival order: timed, timed, reactive, timed, reactive.
        for (lane, id) in [
            (Lane::Timed, "t1"),
            (Lane::Timed, "t2"),
            (Lane::Reactive, "r1"),
            (Lane::Timed, "t3"),
            (Lane::Reactive, "r2"),
        ] {
            hold.insert(id, waiter(&gate, lane, id, &tx));
            settle().await;
        }
        assert!(drain(&mut admitted).is_empty(), "no permit is free");
        assert_eq!(gate.waiting(), [2, 3]);
        // Free one permit at a time (the longest-running holder's): each admits exactly the
        // next waiter in priority order.
        let mut running = VecDeque::from(["busy-1", "busy-2"]);
        let mut order = Vec::new();
        for _ in 0..5 {
            finish(&mut hold, running.pop_front());
            settle().await;
            let next = drain(&mut admitted);
            assert_eq!(next.len(), 1, "one admitted per permit freed: {next:?}");
            running.extend(next.iter().copied());
            order.extend(next);
        }
        assert_eq!(order, ["r1", "r2", "t1", "t2", "t3"]);
        assert_eq!(gate.waiting(), [0, 0]);
        for (_, h) in hold.drain() {
            let _ = h.send(());
        }
        settle().await;
        // Every permit came back: two fresh waiters are admitted at once.
        let _a = waiter(&gate, Lane::Timed, "a", &tx);
        let _b = waiter(&gate, Lane::Timed, "b", &tx);
        settle().await;
        assert_eq!(drain(&mut admitted), ["a", "b"]);
    }

    /// A timed waiter that has waited `promote_after` goes before reactive waiters that arrived
    /// after it, but not before those that arrived before it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_timed_waiter_is_promoted_after_waiting_long_enough() {
        let (clock, secs) = manual_clock();
        let gate = PriorityGate::with_clock(1, Duration::from_secs(30), clock, None);
        let (tx, mut admitted) = mpsc::unbounded_channel();
        let mut hold = HashMap::new();
        hold.insert("busy", waiter(&gate, Lane::Reactive, "busy", &tx));
        settle().await;
        hold.insert("r-early", waiter(&gate, Lane::Reactive, "r-early", &tx));
        settle().await;
        secs.store(1, Ordering::SeqCst);
        hold.insert("t", waiter(&gate, Lane::Timed, "t", &tx));
        settle().await;
        secs.store(2, Ordering::SeqCst);
        hold.insert("r-late-1", waiter(&gate, Lane::Reactive, "r-late-1", &tx));
        hold.insert("r-late-2", waiter(&gate, Lane::Reactive, "r-late-2", &tx));
        settle().await;
        assert_eq!(drain(&mut admitted), ["busy"]);

        // Not waited long enough: the reactive waiters keep going first.
        finish(&mut hold, Some("busy"));
        settle().await;
        assert_eq!(drain(&mut admitted), ["r-early"]);
        // 30 s after it arrived, the timed waiter passes the reactive ones that came later.
        secs.store(31, Ordering::SeqCst);
        finish(&mut hold, Some("r-early"));
        settle().await;
        assert_eq!(drain(&mut admitted), ["t"]);
        finish(&mut hold, Some("t"));
        settle().await;
        assert_eq!(drain(&mut admitted), ["r-late-1"]);
        finish(&mut hold, Some("r-late-1"));
        settle().await;
        assert_eq!(drain(&mut admitted), ["r-late-2"]);
        finish(&mut hold, Some("r-late-2"));
    }

    /// Without promotion timed waiters wait while reactive work keeps coming; but they run as
    /// soon as a permit is free and no reactive waiter is left.
    #[tokio::test(flavor = "current_thread")]
    async fn timed_waiters_run_when_no_reactive_waiter_is_left() {
        let gate = PriorityGate::new(1, None);
        let (tx, mut admitted) = mpsc::unbounded_channel();
        let busy = waiter(&gate, Lane::Reactive, "busy", &tx);
        settle().await;
        let t = waiter(&gate, Lane::Timed, "t", &tx);
        let r = waiter(&gate, Lane::Reactive, "r", &tx);
        settle().await;
        assert_eq!(drain(&mut admitted), ["busy"]);
        let _ = busy.send(());
        settle().await;
        assert_eq!(drain(&mut admitted), ["r"]);
        let _ = r.send(());
        settle().await;
        assert_eq!(drain(&mut admitted), ["t"]);
        let _ = t.send(());
    }

    /// Waiters that give up take no permit and leave the counts; a permit handed to a waiter
    /// that is then dropped comes back; a reconcile that panics gives its permit back.
    #[tokio::test(flavor = "current_thread")]
    async fn permits_come_back_on_every_drop_path() {
        let counts = Arc::new(Mutex::new(Vec::new()));
        let c = counts.clone();
        let observer: Observer = Box::new(move |w| {
            if let Ok(mut c) = c.lock() {
                c.push(w);
            }
        });
        let gate = PriorityGate::new(1, Some(observer));
        let held = gate.acquire(Lane::Reactive).await;

        // A waiter dropped before it is admitted.
        let mut gone = Box::pin(gate.acquire(Lane::Timed));
        assert!(futures::poll!(gone.as_mut()).is_pending());
        assert_eq!(gate.waiting(), [0, 1]);
        drop(gone);
        assert_eq!(gate.waiting(), [0, 0]);

        // A waiter that is handed the permit, then dropped before it runs: the permit goes on.
        let mut handed = Box::pin(gate.acquire(Lane::Reactive));
        assert!(futures::poll!(handed.as_mut()).is_pending());
        let mut next = Box::pin(gate.acquire(Lane::Timed));
        assert!(futures::poll!(next.as_mut()).is_pending());
        drop(held);
        drop(handed);
        let permit = match futures::poll!(next.as_mut()) {
            std::task::Poll::Ready(p) => p,
            std::task::Poll::Pending => panic!("the handed permit did not come back"),
        };
        assert_eq!(gate.waiting(), [0, 0]);

        // A reconcile that panics while holding its permit.
        let g = gate.clone();
        drop(permit);
        let crashed = tokio::spawn(async move {
            let _permit = g.acquire(Lane::Reactive).await;
            panic!("a host bug");
        })
        .await;
        assert!(crashed.is_err());
        // The one permit is free again: taken at once, without waiting.
        let again = futures::poll!(Box::pin(gate.acquire(Lane::Timed)));
        assert!(again.is_ready(), "the permit did not come back");
        assert_eq!(
            counts.lock().map(|c| c.last().copied()).ok().flatten(),
            Some([0, 0])
        );
    }

    /// What a waiting reconcile holds of the gate: the future of `acquire` stays small.
    #[test]
    fn a_waiting_acquire_is_small() {
        let gate = PriorityGate::new(1, None);
        let size = std::mem::size_of_val(&gate.acquire(Lane::Timed));
        eprintln!("a waiting acquire: {size} bytes");
        assert!(size <= 128, "acquire future: {size} bytes");
    }
}
