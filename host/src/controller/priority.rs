//! The order in which one reconciler's due reconciles run: work that reacts to a change before
//! timed work.
//!
//! kube-runtime's runner takes due entries from its scheduler and starts each at once, up to a
//! concurrency bound; it cannot be reordered. When thousands of timed requeues (a module's
//! `requeue_after`, the periodic resync) are due together, they took every slot, and a primary
//! created meanwhile waited behind all of them. So each reconcile first [arrives](PriorityGate::arrive)
//! at this gate, which has exactly `spec.limits.concurrency` permits and two lanes:
//!
//! - [`Lane::Reactive`]: the primary was first seen or changed, a child or related object
//!   changed, a new module was activated, or a retry after a failure. Without a free permit it
//!   waits here, holding its runner slot (the runner's bound is [`runner_bound`]: twice the
//!   permits, so reactive entries keep coming in while every permit is taken).
//! - [`Lane::Timed`]: the module's requeue-after and the periodic resync. Without a free permit
//!   it is *parked*: the reconcile returns at once (freeing its runner slot, so the runner keeps
//!   pulling due entries and finds the reactive ones), and the gate keeps only its key. When a
//!   permit comes free and no reactive entry waits, the oldest parked key is handed back to the
//!   controller (`unpark`), which schedules the primary again; it then takes the free permit.
//!
//! Why not let the runner hand over every due entry and hold them all here: kube-runtime 5's
//! runner keeps its running futures in a map that polls *every* one of them whenever any wakes,
//! so thousands of waiting futures made each wake O(N) (measured at N = 1,000: 16 reconciles a
//! second instead of 100; see docs/benchmarks.md, "Reactive work before timed requeues").
//! A parked key costs a few dozen bytes and no polling.
//!
//! # Guarantees
//! - At most `permits` holders at once; a permit comes back when its [`Permit`] is dropped,
//!   however the reconcile ends, and a reactive waiter that gives up (its future is dropped)
//!   takes none.
//! - A free permit always goes to the oldest reactive waiter first. A handed-back key's claim on
//!   a free permit is not binding: it must come back through kube-runtime's runner, and while
//!   the runner's slots are all held by reactive waiters it cannot, so a binding claim would
//!   leave those waiters and the key waiting on each other for ever (found by the N = 10,000
//!   benchmark: 32 reactive waiters, 16 free permits all claimed, nothing running). A key that
//!   loses its permit this way goes back to the front of the parked keys.
//! - Anti-starvation: once the oldest parked key has waited [`PROMOTE_AFTER`] and arrived
//!   before the oldest reactive waiter, every permit that comes back hands it back, and when it
//!   returns without a free permit it joins the reactive waiters instead of being parked again:
//!   it then waits only for the reactive work queued before it. Within a lane: first come,
//!   first served.
//! - A timed entry runs at once only when a permit is free that no handed-back key is due to
//!   take and nothing is parked: fresh timed work does not pass parked timed work.
//! - A key is parked at most once; a reactive run of a parked primary takes its place (the
//!   module's next requeue-after is decided by that run). A handed-back key whose primary is
//!   gone is [forgotten](PriorityGate::forget) and its reservation goes to the next key.
//! - Every operation is O(1) amortized (no scan of the waiters or the parked keys).
//!
//! # Errors
//! Nothing here fails.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::contract::Trigger;

/// How long a parked timed key may be passed by reactive work that arrived after it.
pub const PROMOTE_AFTER: Duration = Duration::from_secs(30);

/// How many entries kube-runtime's runner hands over at once (its `concurrency` setting) for a
/// reconciler with `permits` permits: twice that (reactive entries wait in the runner while
/// every permit is taken; timed ones are parked and leave it at once).
pub fn runner_bound(permits: u16) -> u16 {
    permits.max(1).saturating_mul(2)
}

/// Which lane a reconcile goes to.
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
}

/// Told the number of waiting entries of each lane (`[reactive, timed]`) whenever it changes.
pub type Observer = Box<dyn Fn([usize; 2]) + Send + Sync>;

/// Hands a parked key back to the controller (which schedules its primary again).
pub type Unpark<K> = Box<dyn Fn(K) + Send + Sync>;

type Clock = Box<dyn Fn() -> Instant + Send + Sync>;

/// A per-reconciler gate with a fixed number of permits and two lanes; clones share it.
pub struct PriorityGate<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for PriorityGate<K> {
    fn clone(&self) -> Self {
        PriorityGate {
            inner: self.inner.clone(),
        }
    }
}

impl<K> std::fmt::Debug for PriorityGate<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PriorityGate")
            .field("waiting", &self.waiting())
            .finish_non_exhaustive()
    }
}

struct Inner<K> {
    state: Mutex<State<K>>,
    promote_after: Duration,
    clock: Clock,
    observer: Option<Observer>,
    unpark: Unpark<K>,
}

struct State<K> {
    available: usize,
    reactive: VecDeque<Waiter>,
    /// Live reactive waiters (the lane may still hold waiters that gave up).
    reactive_live: usize,
    /// Parked timed keys, oldest first; an entry whose key is no longer in `parked_keys` is
    /// stale (its primary ran meanwhile, or was forgotten) and skipped.
    parked: VecDeque<(K, Instant)>,
    parked_keys: HashSet<K>,
    /// Keys handed back and not arrived yet, with when they were first parked: each is due to
    /// take one of the `available` permits.
    unparking: HashMap<K, Instant>,
}

struct Waiter {
    arrived: Instant,
    tx: oneshot::Sender<Permit>,
}

/// The right to run one reconcile; given back when dropped.
#[must_use = "the reconcile runs while the permit lives"]
pub struct Permit {
    gate: Option<Arc<dyn Release>>,
}

/// Gives a permit back to its gate.
trait Release: Send + Sync {
    fn release(self: Arc<Self>);
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit").finish_non_exhaustive()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.take() {
            gate.release();
        }
    }
}

/// What a reconcile that arrives at the gate does.
#[derive(Debug)]
pub enum Arrival<K> {
    /// Run now, holding this permit.
    Run(Permit),
    /// Wait for a permit (reactive): the future resolves to it.
    Wait(Waiting<K>),
    /// Parked (timed): return now; the key comes back through `unpark`.
    Parked,
}

impl<K> PriorityGate<K> {
    /// Waiting entries per lane: `[reactive, timed]` (timed: parked or handed back).
    pub fn waiting(&self) -> [usize; 2] {
        self.inner
            .state
            .lock()
            .map(|s| s.waiting())
            .unwrap_or_default()
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> PriorityGate<K> {
    /// A gate with `permits` permits (at least 1), promoting parked keys after
    /// [`PROMOTE_AFTER`], handing parked keys back through `unpark`, reporting the waiting
    /// entries of each lane to `observer`.
    pub fn new(permits: usize, unpark: Unpark<K>, observer: Option<Observer>) -> Self {
        Self::with_clock(
            permits,
            PROMOTE_AFTER,
            Box::new(Instant::now),
            unpark,
            observer,
        )
    }

    /// [`PriorityGate::new`] with the promotion age and the clock given.
    pub fn with_clock(
        permits: usize,
        promote_after: Duration,
        clock: Clock,
        unpark: Unpark<K>,
        observer: Option<Observer>,
    ) -> Self {
        PriorityGate {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    available: permits.max(1),
                    reactive: VecDeque::new(),
                    reactive_live: 0,
                    parked: VecDeque::new(),
                    parked_keys: HashSet::new(),
                    unparking: HashMap::new(),
                }),
                promote_after,
                clock,
                observer,
                unpark,
            }),
        }
    }

    /// A reconcile of `key` in `lane` arrives.
    pub fn arrive(&self, key: &K, lane: Lane) -> Arrival<K> {
        let Ok(mut s) = self.inner.state.lock() else {
            // A poisoned lock (a panic elsewhere while holding it): let the reconcile run
            // rather than hang it; the bound is lost, the work is not.
            return Arrival::Run(Permit { gate: None });
        };
        let returning = s.unparking.remove(key);
        let arrival = match lane {
            Lane::Reactive => {
                // Runs for the parked key too: its place in the timed lane is void.
                s.parked_keys.remove(key);
                if s.available > 0 && s.reactive_live == 0 {
                    s.available -= 1;
                    Arrival::Run(self.inner.permit())
                } else {
                    let now = (self.inner.clock)();
                    self.inner.enqueue(&mut s, now)
                }
            }
            Lane::Timed => {
                let free = match returning {
                    Some(_) => s.available > 0,
                    None => s.available > s.unparking.len() && s.parked_keys.is_empty(),
                };
                let now = (self.inner.clock)();
                let promoted = returning
                    .is_some_and(|p| now.saturating_duration_since(p) >= self.inner.promote_after);
                if free {
                    s.available -= 1;
                    Arrival::Run(self.inner.permit())
                } else if promoted {
                    // Waited long enough: it queues with the reactive work instead of parking.
                    self.inner.enqueue(&mut s, now)
                } else {
                    if s.parked_keys.insert(key.clone()) {
                        match returning {
                            // Lost its permit to a reactive arrival: back to the front.
                            Some(parked) => s.parked.push_front((key.clone(), parked)),
                            None => {
                                let now = (self.inner.clock)();
                                s.parked.push_back((key.clone(), now));
                            }
                        }
                    }
                    Arrival::Parked
                }
            }
        };
        self.inner.pump(&mut s);
        self.inner.observe(&s);
        arrival
    }

    /// The primary of `key` is gone: its parked place or its handed-back reservation is freed.
    pub fn forget(&self, key: &K) {
        if let Ok(mut s) = self.inner.state.lock() {
            let parked = s.parked_keys.remove(key);
            let unparking = s.unparking.remove(key).is_some();
            if parked || unparking {
                self.inner.pump(&mut s);
                self.inner.observe(&s);
            }
        }
    }
}

/// A reactive reconcile's wait for a permit; dropping it gives up the place (and any permit
/// handed to it meanwhile comes back).
pub struct Waiting<K> {
    inner: Arc<Inner<K>>,
    rx: Option<oneshot::Receiver<Permit>>,
}

impl<K> std::fmt::Debug for Waiting<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting").finish_non_exhaustive()
    }
}

impl<K> Waiting<K> {
    /// Waits for the permit.
    pub async fn permit(mut self) -> Permit {
        let permit = match self.rx.as_mut() {
            Some(rx) => rx.await.ok(),
            None => None,
        };
        self.rx = None;
        // The sender is only dropped unsent when the gate is gone: nothing to bound then.
        permit.unwrap_or(Permit { gate: None })
    }
}

impl<K> Drop for Waiting<K> {
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
                    s.reactive_live = s.reactive_live.saturating_sub(1);
                    self.inner.observe(&s);
                    None
                }
            },
            Err(_) => rx.try_recv().ok(),
        };
        drop(handed);
    }
}

impl<K> State<K> {
    fn waiting(&self) -> [usize; 2] {
        [
            self.reactive_live,
            self.parked_keys.len() + self.unparking.len(),
        ]
    }
}

impl<K: Clone + Eq + Hash> State<K> {
    /// The oldest live parked key's time (stale entries dropped).
    fn parked_front(&mut self) -> Option<Instant> {
        while let Some((k, t)) = self.parked.front() {
            if self.parked_keys.contains(k) {
                return Some(*t);
            }
            self.parked.pop_front();
        }
        None
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Release for Inner<K> {
    fn release(self: Arc<Self>) {
        self.give_back();
    }
}

impl<K> Inner<K> {
    fn observe(&self, s: &State<K>) {
        if let Some(observer) = &self.observer {
            observer(s.waiting());
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Inner<K> {
    fn permit(self: &Arc<Self>) -> Permit {
        let gate: Arc<dyn Release> = self.clone();
        Permit { gate: Some(gate) }
    }

    /// Hands out the permits that are free and not spoken for by a handed-back key: to the
    /// oldest reactive waiter, else to the oldest parked key (handed back to the controller).
    /// Reactive waiters take any free permit (a handed-back key's claim is not binding, see the
    /// module docs); permits beyond the handed-back keys' claims hand back parked keys.
    fn pump(self: &Arc<Self>, s: &mut State<K>) {
        loop {
            while s.reactive.front().is_some_and(|w| w.tx.is_closed()) {
                s.reactive.pop_front();
            }
            if s.available > 0
                && let Some(waiter) = s.reactive.pop_front()
            {
                match waiter.tx.send(self.permit()) {
                    Ok(()) => {
                        s.available -= 1;
                        s.reactive_live = s.reactive_live.saturating_sub(1);
                    }
                    // The waiter gave up: this permit must not release again (the lock is held).
                    Err(mut permit) => permit.gate = None,
                }
                continue;
            }
            if s.available <= s.unparking.len() || !self.unpark_next(s) {
                return;
            }
        }
    }

    /// Queues a reconcile with the reactive waiters (arrived `now`).
    fn enqueue(self: &Arc<Self>, s: &mut State<K>, now: Instant) -> Arrival<K> {
        let (tx, rx) = oneshot::channel();
        s.reactive.push_back(Waiter { arrived: now, tx });
        s.reactive_live += 1;
        Arrival::Wait(Waiting {
            inner: self.clone(),
            rx: Some(rx),
        })
    }

    /// Hands the oldest parked key back; false when none is parked.
    fn unpark_next(&self, s: &mut State<K>) -> bool {
        while let Some((key, parked)) = s.parked.pop_front() {
            if !s.parked_keys.remove(&key) {
                continue;
            }
            if let Entry::Vacant(v) = s.unparking.entry(key.clone()) {
                v.insert(parked);
                (self.unpark)(key);
                return true;
            }
        }
        false
    }

    /// A permit came back: it goes to the next reactive waiter, or is kept for a parked key.
    fn give_back(self: &Arc<Self>) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        s.available += 1;
        while s.reactive.front().is_some_and(|w| w.tx.is_closed()) {
            s.reactive.pop_front();
        }
        let now = (self.clock)();
        let promoted = match (s.parked_front(), s.reactive.front()) {
            (Some(p), Some(r)) => {
                now.saturating_duration_since(p) >= self.promote_after && p <= r.arrived
            }
            _ => false,
        };
        if promoted {
            // Handed back now; it joins the reactive waiters when it returns (see `arrive`).
            self.unpark_next(&mut s);
        }
        self.pump(&mut s);
        self.observe(&s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::task::Poll;

    type Handed = Arc<Mutex<Vec<&'static str>>>;

    /// A gate of `permits` whose handed-back keys are recorded, with a clock that moves only
    /// when told (seconds after a fixed start).
    fn gate(permits: usize) -> (PriorityGate<&'static str>, Handed, Arc<AtomicU64>) {
        let handed: Handed = Arc::default();
        let h = handed.clone();
        let start = Instant::now();
        let secs = Arc::new(AtomicU64::new(0));
        let s = secs.clone();
        let gate = PriorityGate::with_clock(
            permits,
            Duration::from_secs(30),
            Box::new(move || start + Duration::from_secs(s.load(Ordering::SeqCst))),
            Box::new(move |k| {
                if let Ok(mut h) = h.lock() {
                    h.push(k);
                }
            }),
            None,
        );
        (gate, handed, secs)
    }

    fn taken(handed: &Handed) -> Vec<&'static str> {
        handed
            .lock()
            .map(|mut h| std::mem::take(&mut *h))
            .unwrap_or_default()
    }

    fn run(a: Arrival<&'static str>) -> Permit {
        match a {
            Arrival::Run(p) => p,
            other => panic!("expected to run, got {other:?}"),
        }
    }

    fn wait(a: Arrival<&'static str>) -> Pin<Box<dyn Future<Output = Permit>>> {
        match a {
            Arrival::Wait(w) => Box::pin(w.permit()),
            other => panic!("expected to wait, got {other:?}"),
        }
    }

    fn parked(a: &Arrival<&'static str>) -> bool {
        matches!(a, Arrival::Parked)
    }

    use std::future::Future;
    use std::pin::Pin;

    /// With every permit taken, reactive work goes before timed work whatever the arrival
    /// order; each lane is first come, first served; timed work is parked, not held.
    #[tokio::test(flavor = "current_thread")]
    async fn reactive_work_goes_first_and_each_lane_is_fifo() {
        let (gate, handed, _) = gate(1);
        let busy = run(gate.arrive(&"busy", Lane::Timed));
        assert!(parked(&gate.arrive(&"t1", Lane::Timed)));
        assert!(parked(&gate.arrive(&"t2", Lane::Timed)));
        let mut r1 = wait(gate.arrive(&"r1", Lane::Reactive));
        assert!(parked(&gate.arrive(&"t3", Lane::Timed)));
        let mut r2 = wait(gate.arrive(&"r2", Lane::Reactive));
        assert_eq!(gate.waiting(), [2, 3]);
        assert!(futures::poll!(r1.as_mut()).is_pending());

        // Each permit that comes back goes to the next reactive waiter, in order.
        drop(busy);
        let Poll::Ready(p1) = futures::poll!(r1.as_mut()) else {
            panic!("r1 not admitted first")
        };
        assert!(futures::poll!(r2.as_mut()).is_pending());
        drop(p1);
        let Poll::Ready(p2) = futures::poll!(r2.as_mut()) else {
            panic!("r2 not admitted second")
        };
        assert!(
            taken(&handed).is_empty(),
            "no timed key while reactive work waits"
        );
        // Then the parked keys, oldest first, one per free permit; a fresh timed arrival does
        // not pass them.
        drop(p2);
        assert_eq!(taken(&handed), ["t1"]);
        assert!(parked(&gate.arrive(&"t4", Lane::Timed)));
        let p = run(gate.arrive(&"t1", Lane::Timed));
        drop(p);
        assert_eq!(taken(&handed), ["t2"]);
        drop(run(gate.arrive(&"t2", Lane::Timed)));
        assert_eq!(taken(&handed), ["t3"]);
        drop(run(gate.arrive(&"t3", Lane::Timed)));
        assert_eq!(taken(&handed), ["t4"]);
        drop(run(gate.arrive(&"t4", Lane::Timed)));
        assert_eq!(gate.waiting(), [0, 0]);
        // Every permit is back: a timed arrival runs at once.
        drop(run(gate.arrive(&"t5", Lane::Timed)));
    }

    /// A parked key that has waited 30 s is no longer passed by reactive work that arrived
    /// after it, but still by reactive work that arrived before it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_parked_key_is_promoted_after_waiting_long_enough() {
        let (gate, handed, secs) = gate(1);
        let busy = run(gate.arrive(&"busy", Lane::Reactive));
        let mut early = wait(gate.arrive(&"r-early", Lane::Reactive));
        secs.store(1, Ordering::SeqCst);
        assert!(parked(&gate.arrive(&"t", Lane::Timed)));
        secs.store(2, Ordering::SeqCst);
        let mut late = wait(gate.arrive(&"r-late", Lane::Reactive));

        // Not waited long enough: reactive first.
        drop(busy);
        let Poll::Ready(p) = futures::poll!(early.as_mut()) else {
            panic!("r-early not admitted")
        };
        // 30 s after it was parked, the key is handed back at the next permit; the reactive
        // waiter already queued takes that permit, and the key, returning without one, queues
        // behind it instead of parking again, ahead of reactive work that comes after it.
        secs.store(31, Ordering::SeqCst);
        drop(p);
        assert_eq!(taken(&handed), ["t"]);
        let Poll::Ready(p) = futures::poll!(late.as_mut()) else {
            panic!("r-late not admitted")
        };
        let mut t = wait(gate.arrive(&"t", Lane::Timed));
        let mut after = wait(gate.arrive(&"r-after", Lane::Reactive));
        assert_eq!(gate.waiting(), [2, 0]);
        drop(p);
        let Poll::Ready(p) = futures::poll!(t.as_mut()) else {
            panic!("the promoted key was passed")
        };
        assert!(futures::poll!(after.as_mut()).is_pending());
        drop(p);
        assert!(futures::poll!(after.as_mut()).is_ready());
    }

    /// Reactive waiters that fill kube-runtime's runner are never held back by permits claimed
    /// for handed-back keys: those keys cannot come back through a full runner, so waiting for
    /// them would stop everything (the N = 10,000 benchmark's hang: 32 reactive waiters, every
    /// permit claimed, nothing running).
    #[tokio::test(flavor = "current_thread")]
    async fn claimed_permits_do_not_hold_back_reactive_waiters() {
        let (gate, handed, _) = gate(2);
        let a = run(gate.arrive(&"a", Lane::Reactive));
        let b = run(gate.arrive(&"b", Lane::Reactive));
        assert!(parked(&gate.arrive(&"t1", Lane::Timed)));
        assert!(parked(&gate.arrive(&"t2", Lane::Timed)));
        // Both permits come back with no reactive waiter: both go to the parked keys.
        drop(a);
        drop(b);
        assert_eq!(taken(&handed), ["t1", "t2"]);
        // Reactive work arrives before t1 and t2 return (their runner slots are taken): it runs
        // on the claimed permits, and what comes after waits.
        let p1 = run(gate.arrive(&"r1", Lane::Reactive));
        let p2 = run(gate.arrive(&"r2", Lane::Reactive));
        let mut r3 = wait(gate.arrive(&"r3", Lane::Reactive));
        // A permit comes back while both keys still claim one: the waiter gets it.
        drop(p1);
        let Poll::Ready(p3) = futures::poll!(r3.as_mut()) else {
            panic!("r3 held back by the claim of a key that cannot return")
        };
        // The keys return without a permit: back to the front of the parked keys.
        assert!(parked(&gate.arrive(&"t2", Lane::Timed)));
        assert!(parked(&gate.arrive(&"t1", Lane::Timed)));
        drop(p2);
        drop(p3);
        let mut back = taken(&handed);
        back.sort_unstable();
        assert_eq!(back, ["t1", "t2"]);
        drop(run(gate.arrive(&"t1", Lane::Timed)));
        drop(run(gate.arrive(&"t2", Lane::Timed)));
        assert_eq!(gate.waiting(), [0, 0]);
    }

    /// Permits come back on every path: a waiter that gives up, a waiter handed a permit and
    /// dropped before it runs, a reconcile that panics, a handed-back key whose primary is gone,
    /// and a handed-back key that lost its permit to reactive work (it goes back to the front).
    #[tokio::test(flavor = "current_thread")]
    async fn permits_come_back_on_every_drop_path() {
        let (gate, handed, _) = gate(1);
        let held = run(gate.arrive(&"a", Lane::Reactive));

        // A waiter dropped before it is admitted.
        let mut gone = wait(gate.arrive(&"b", Lane::Reactive));
        assert!(futures::poll!(gone.as_mut()).is_pending());
        assert_eq!(gate.waiting(), [1, 0]);
        drop(gone);
        assert_eq!(gate.waiting(), [0, 0]);

        // A waiter handed the permit, then dropped before it runs: the permit goes on.
        let handed_over = wait(gate.arrive(&"c", Lane::Reactive));
        let mut next = wait(gate.arrive(&"d", Lane::Reactive));
        drop(held);
        drop(handed_over);
        let Poll::Ready(permit) = futures::poll!(next.as_mut()) else {
            panic!("the handed permit did not come back")
        };

        // A reconcile that panics while holding its permit.
        drop(permit);
        let g = gate.clone();
        let crashed = tokio::spawn(async move {
            let _permit = run(g.arrive(&"e", Lane::Reactive));
            panic!("a host bug");
        })
        .await;
        assert!(crashed.is_err());

        // A handed-back key whose primary is gone: its reservation goes to the next key.
        let busy = run(gate.arrive(&"busy", Lane::Reactive));
        assert!(parked(&gate.arrive(&"gone", Lane::Timed)));
        assert!(parked(&gate.arrive(&"t", Lane::Timed)));
        drop(busy);
        assert_eq!(taken(&handed), ["gone"]);
        gate.forget(&"gone");
        assert_eq!(taken(&handed), ["t"]);

        // Reactive work that arrives first takes the permit; the handed-back key goes back to
        // the front and comes back with the next permit.
        let r = run(gate.arrive(&"r", Lane::Reactive));
        assert!(parked(&gate.arrive(&"later", Lane::Timed)));
        assert!(parked(&gate.arrive(&"t", Lane::Timed)));
        drop(r);
        assert_eq!(taken(&handed), ["t"]);
        drop(run(gate.arrive(&"t", Lane::Timed)));
        assert_eq!(taken(&handed), ["later"]);
        drop(run(gate.arrive(&"later", Lane::Timed)));
        assert_eq!(gate.waiting(), [0, 0]);
        // The one permit is free: taken at once.
        drop(run(gate.arrive(&"f", Lane::Reactive)));
    }

    /// What a waiting reactive reconcile holds of the gate stays small.
    #[test]
    fn a_waiting_reconcile_is_small() {
        let (gate, _, _) = gate(1);
        let _busy = run(gate.arrive(&"busy", Lane::Reactive));
        let Arrival::Wait(w) = gate.arrive(&"r", Lane::Reactive) else {
            panic!("expected to wait")
        };
        let size = std::mem::size_of_val(&w.permit());
        eprintln!("a waiting reactive reconcile's wait: {size} bytes");
        assert!(size <= 128, "wait future: {size} bytes");
    }
}
