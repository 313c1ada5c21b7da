//! The process-wide, fair queue of module calls.
//!
//! The sandbox pool has a fixed number of instances, shared by every WasmReconciler and by
//! admission. Instead of failing when it is full ("maximum concurrent limit reached", which used
//! to count as the module's failure), a call waits here for one of the queue's slots, within its
//! own deadline.
//!
//! # Guarantees
//! - At most `slots` calls hold a slot at once; the pool is sized so that they always find an
//!   instance.
//! - The memory caps of the calls holding slots add up to at most the queue's memory budget: a
//!   call reserves its cap (at most the whole budget) with its slot. A waiter whose cap does not
//!   fit yet holds back the waiters behind it, so a large call is never starved by small ones.
//! - Fairness between lanes (a lane is a WasmReconciler, or a module's admission calls): a freed
//!   slot goes to the lane that waited longest since it was last served (round robin over the
//!   lanes with waiters), first come first served within a lane. One reconciler's burst of calls
//!   cannot starve another reconciler.
//! - A call that cannot get a slot before its deadline gives up with [`QueueTimeout`]; it never
//!   holds anything afterwards. A slot is released when its [`Slot`] is dropped, whatever happens.
//! - Threads ([`CallQueue::acquire`]) and async tasks ([`CallQueue::acquire_async`]) wait in the
//!   same lanes. An async waiter dropped while it waits (its task aborted) leaves nothing behind:
//!   its ticket is forgotten, or the slot it was just granted is handed on.
//!
//! # Errors
//! [`QueueTimeout`] when the deadline passes while queued.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The deadline passed while the call waited for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no sandbox slot became free within {waited:?} ({slots} module calls were running)")]
pub struct QueueTimeout {
    /// How long the call waited.
    pub waited: Duration,
    /// The queue's size.
    pub slots: usize,
}

#[derive(Debug, Default)]
struct State {
    running: usize,
    /// The memory caps of the running calls.
    reserved: u64,
    next_ticket: u64,
    /// Lanes with waiters, in serving order; each with its waiters' tickets and memory caps
    /// (oldest first).
    lanes: VecDeque<Arc<str>>,
    waiting: HashMap<Arc<str>, VecDeque<(u64, u64)>>,
    /// Tickets that were handed a slot but have not noticed yet.
    granted: Vec<u64>,
}

/// A fair, bounded queue of module calls. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct CallQueue {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    slots: usize,
    /// The most memory (caps) the running calls may reserve together.
    budget: u64,
    state: Mutex<State>,
    freed: Condvar,
    /// Wakes the async waiters when slots were granted (the threads wait on `freed`).
    granted: tokio::sync::Notify,
}

/// A held slot; dropping it lets the next call in.
#[derive(Debug)]
pub struct Slot {
    inner: Arc<Inner>,
    /// The memory it reserved.
    bytes: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        release(&self.inner, self.bytes);
    }
}

/// Gives back a slot that reserved `bytes`, and hands the room to the next waiters.
fn release(inner: &Inner, bytes: u64) {
    let mut state = inner.lock();
    state.running = state.running.saturating_sub(1);
    state.reserved = state.reserved.saturating_sub(bytes);
    let mut granted = false;
    while grant_next(inner, &mut state) {
        granted = true;
    }
    if granted {
        drop(state);
        inner.wake();
    }
}

/// Hands a free slot to the next waiter, round robin over lanes, if its memory cap fits. True if
/// one was granted.
fn grant_next(inner: &Inner, state: &mut State) -> bool {
    if state.running >= inner.slots {
        return false;
    }
    while let Some(lane) = state.lanes.pop_front() {
        let Some(tickets) = state.waiting.get_mut(&lane) else {
            continue;
        };
        let Some(&(ticket, bytes)) = tickets.front() else {
            state.waiting.remove(&lane);
            continue;
        };
        if state.reserved.saturating_add(bytes) > inner.budget {
            // Its turn, but not its room yet: nobody passes it.
            state.lanes.push_front(lane);
            return false;
        }
        tickets.pop_front();
        if tickets.is_empty() {
            state.waiting.remove(&lane);
        } else {
            state.lanes.push_back(lane);
        }
        state.running += 1;
        state.reserved = state.reserved.saturating_add(bytes);
        state.granted.push(ticket);
        return true;
    }
    false
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means another caller panicked while holding it; the counters
        // are still consistent (every update is a single statement).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes every waiter, thread or task, to look whether its ticket was granted.
    fn wake(&self) {
        self.freed.notify_all();
        self.granted.notify_waiters();
    }

    /// A slot for a call reserving `bytes`, at once, when one is free and nobody waits.
    fn take_free(self: &Arc<Self>, state: &mut State, bytes: u64) -> Option<Slot> {
        let free = state.running < self.slots
            && state.lanes.is_empty()
            && state.reserved.saturating_add(bytes) <= self.budget;
        free.then(|| {
            state.running += 1;
            state.reserved = state.reserved.saturating_add(bytes);
            Slot {
                inner: self.clone(),
                bytes,
            }
        })
    }

    /// Queues a waiter of `lane` reserving `bytes`; its ticket.
    fn enqueue(&self, state: &mut State, lane: &Arc<str>, bytes: u64) -> u64 {
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        let tickets = state.waiting.entry(lane.clone()).or_default();
        tickets.push_back((ticket, bytes));
        if tickets.len() == 1 {
            state.lanes.push_back(lane.clone());
        }
        // A slot may be free while others wait only for an instant (a grant in flight);
        // hand it out now so nobody sleeps on a free slot.
        if grant_next(self, state) {
            self.wake();
        }
        ticket
    }

    /// Whether `ticket` was granted a slot (then it is the ticket's: taken off the list).
    fn take_granted(state: &mut State, ticket: u64) -> bool {
        let at = state.granted.iter().position(|t| *t == ticket);
        at.map(|i| state.granted.swap_remove(i)).is_some()
    }

    /// A waiter of `lane` with `ticket` gives up: forgotten, and those it held back may pass.
    fn give_up(&self, state: &mut State, lane: &Arc<str>, ticket: u64) {
        forget(state, lane, ticket);
        if grant_next(self, state) {
            self.wake();
        }
    }
}

/// An async waiter's ticket; dropped before it got its slot, it leaves the queue as it was.
struct Waiting {
    inner: Arc<Inner>,
    lane: Arc<str>,
    ticket: u64,
    bytes: u64,
    settled: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut state = self.inner.lock();
        if Inner::take_granted(&mut state, self.ticket) {
            // Granted while nobody was polling: hand the slot on.
            drop(state);
            release(&self.inner, self.bytes);
        } else {
            self.inner.give_up(&mut state, &self.lane, self.ticket);
        }
    }
}

impl CallQueue {
    /// A queue letting `slots` calls run at once (at least one), with no memory budget.
    pub fn new(slots: usize) -> Self {
        Self::with_budget(slots, u64::MAX)
    }

    /// A queue letting `slots` calls run at once (at least one) whose memory caps add up to at
    /// most `budget` bytes (at least 1).
    pub fn with_budget(slots: usize, budget: u64) -> Self {
        CallQueue {
            inner: Arc::new(Inner {
                slots: slots.max(1),
                budget: budget.max(1),
                state: Mutex::new(State::default()),
                freed: Condvar::new(),
                granted: tokio::sync::Notify::new(),
            }),
        }
    }

    /// How many calls may run at once.
    pub fn slots(&self) -> usize {
        self.inner.slots
    }

    /// The memory budget of the running calls.
    pub fn budget(&self) -> u64 {
        self.inner.budget
    }

    /// The memory caps the running calls reserved.
    pub fn reserved(&self) -> u64 {
        self.inner.lock().reserved
    }

    /// How many calls are waiting.
    pub fn waiting(&self) -> usize {
        let state = self.inner.lock();
        state.waiting.values().map(VecDeque::len).sum()
    }

    /// Waits (blocking the thread) for a slot in `lane`, and room for a call with memory cap
    /// `bytes` (at most the whole budget), until `deadline`.
    ///
    /// # Errors
    /// [`QueueTimeout`] if no slot was free by then.
    pub fn acquire(&self, lane: &str, deadline: Instant, bytes: u64) -> Result<Slot, QueueTimeout> {
        let started = Instant::now();
        let inner = &self.inner;
        let bytes = bytes.min(inner.budget);
        let mut state = inner.lock();
        if let Some(slot) = inner.take_free(&mut state, bytes) {
            return Ok(slot);
        }
        let lane: Arc<str> = Arc::from(lane);
        let ticket = inner.enqueue(&mut state, &lane, bytes);
        loop {
            if Inner::take_granted(&mut state, ticket) {
                return Ok(Slot {
                    inner: inner.clone(),
                    bytes,
                });
            }
            let now = Instant::now();
            if now >= deadline {
                inner.give_up(&mut state, &lane, ticket);
                return Err(self.timeout(started));
            }
            state = inner
                .freed
                .wait_timeout(state, deadline - now)
                .map(|(s, _)| s)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// As [`CallQueue::acquire`], waiting as an async task (on a Tokio runtime with timers)
    /// instead of blocking its thread.
    ///
    /// # Errors
    /// [`QueueTimeout`] if no slot was free by then.
    pub async fn acquire_async(
        &self,
        lane: &str,
        deadline: Instant,
        bytes: u64,
    ) -> Result<Slot, QueueTimeout> {
        let started = Instant::now();
        let inner = &self.inner;
        let bytes = bytes.min(inner.budget);
        let lane: Arc<str> = Arc::from(lane);
        let mut waiting = {
            let mut state = inner.lock();
            if let Some(slot) = inner.take_free(&mut state, bytes) {
                return Ok(slot);
            }
            let ticket = inner.enqueue(&mut state, &lane, bytes);
            Waiting {
                inner: inner.clone(),
                lane,
                ticket,
                bytes,
                settled: false,
            }
        };
        loop {
            // Registered before the look, so a grant between the look and the wait wakes it.
            let notified = inner.granted.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            {
                let mut state = inner.lock();
                if Inner::take_granted(&mut state, waiting.ticket) {
                    waiting.settled = true;
                    return Ok(Slot {
                        inner: inner.clone(),
                        bytes,
                    });
                }
                if Instant::now() >= deadline {
                    inner.give_up(&mut state, &waiting.lane, waiting.ticket);
                    waiting.settled = true;
                    return Err(self.timeout(started));
                }
            }
            let until = tokio::time::Instant::from_std(deadline);
            let _ = tokio::time::timeout_at(until, notified).await;
        }
    }

    fn timeout(&self, started: Instant) -> QueueTimeout {
        QueueTimeout {
            waited: started.elapsed(),
            slots: self.inner.slots,
        }
    }
}

/// Removes a waiter that gave up.
fn forget(state: &mut State, lane: &Arc<str>, ticket: u64) {
    if let Some(tickets) = state.waiting.get_mut(lane) {
        tickets.retain(|(t, _)| *t != ticket);
        if tickets.is_empty() {
            state.waiting.remove(lane);
            state.lanes.retain(|l| l != lane);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soon(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    #[test]
    fn calls_beyond_the_slots_wait_and_time_out_without_holding_anything() {
        let q = CallQueue::new(2);
        let a = q.acquire("a", soon(10), 0).expect("free");
        let _b = q.acquire("a", soon(10), 0).expect("free");
        let err = q.acquire("b", soon(50), 0).expect_err("full");
        assert_eq!(err.slots, 2);
        assert!(err.waited >= Duration::from_millis(50), "{err:?}");
        assert_eq!(q.waiting(), 0, "a timed-out waiter is forgotten");
        drop(a);
        let _c = q.acquire("b", soon(10), 0).expect("a slot was freed");
    }

    #[test]
    fn a_freed_slot_goes_round_robin_over_lanes() {
        let q = CallQueue::new(1);
        let held = q.acquire("burst", soon(10), 0).expect("free");
        let order = Arc::new(Mutex::new(Vec::new()));
        std::thread::scope(|s| {
            // Three calls of the bursting lane queue first, then one of a quiet lane.
            for (i, lane) in ["burst", "burst", "burst", "quiet"].into_iter().enumerate() {
                let (queue, order) = (q.clone(), order.clone());
                s.spawn(move || {
                    let slot = queue.acquire(lane, soon(20_000), 0).expect("served");
                    order.lock().expect("order").push(lane);
                    drop(slot);
                });
                // Wait until this waiter is queued, so the queueing order is known.
                while q.waiting() < i + 1 {
                    std::thread::yield_now();
                }
            }
            drop(held);
        });
        let order = order.lock().expect("order").clone();
        // The quiet lane is served second: right after the burst's first call, not after all.
        assert_eq!(order, vec!["burst", "quiet", "burst", "burst"]);
    }

    #[test]
    fn running_calls_never_reserve_more_than_the_budget_and_large_calls_are_not_starved() {
        let q = CallQueue::with_budget(8, 100);
        let a = q.acquire("a", soon(10), 60).expect("fits");
        // 60 + 60 > 100: waits, and gives up at its deadline holding nothing.
        let late = q.acquire("b", soon(50), 60).expect_err("over the budget");
        assert_eq!(late.slots, 8);
        assert_eq!(q.reserved(), 60);
        let peak = Arc::new(Mutex::new(0u64));
        std::thread::scope(|s| {
            // A large call queues first, then small ones that would fit beside `a` now.
            for (i, (lane, bytes)) in [("big", 90), ("small", 30), ("small", 30)]
                .into_iter()
                .enumerate()
            {
                let (queue, peak) = (q.clone(), peak.clone());
                s.spawn(move || {
                    let slot = queue.acquire(lane, soon(20_000), bytes).expect("served");
                    let mut p = peak.lock().expect("peak");
                    *p = (*p).max(queue.reserved());
                    drop(p);
                    drop(slot);
                });
                while q.waiting() < i + 1 {
                    std::thread::yield_now();
                }
            }
            assert_eq!(
                q.reserved(),
                60,
                "nobody passed the large call waiting for its room"
            );
            drop(a);
        });
        assert!(*peak.lock().expect("peak") <= 100);
        assert_eq!(q.reserved(), 0);
        // A cap over the whole budget runs alone, never for ever refused.
        let alone = q.acquire("huge", soon(10), 1_000).expect("runs alone");
        assert_eq!(q.reserved(), 100);
        drop(alone);
    }

    /// Polls `f` once, as a task that is then dropped or left would.
    fn poll_once<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> std::task::Poll<F::Output> {
        f.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    }

    #[tokio::test]
    async fn an_async_waiter_dropped_while_it_waits_leaves_nothing_behind() {
        let q = CallQueue::new(1);
        let held = q.acquire("a", soon(10), 0).expect("free");
        // Queued, then its task is aborted: its ticket goes.
        let mut gone = Box::pin(q.acquire_async("b", soon(60_000), 0));
        assert!(poll_once(gone.as_mut()).is_pending());
        assert_eq!(q.waiting(), 1);
        drop(gone);
        assert_eq!(q.waiting(), 0, "the dropped waiter's ticket is forgotten");
        // Granted the freed slot, then dropped before it looked: the slot is handed on.
        let mut late = Box::pin(q.acquire_async("b", soon(60_000), 0));
        assert!(poll_once(late.as_mut()).is_pending());
        drop(held);
        drop(late);
        let _c = q
            .acquire("c", soon(10), 0)
            .expect("the granted slot was handed on");
        assert_eq!(q.waiting(), 0);
    }

    #[tokio::test]
    async fn an_async_waiter_is_woken_by_a_slot_a_thread_frees_and_times_out_holding_nothing() {
        let q = CallQueue::new(1);
        let held = q.acquire("a", soon(10), 0).expect("free");
        let err = q.acquire_async("b", soon(50), 0).await.expect_err("full");
        assert!(err.waited >= Duration::from_millis(50), "{err:?}");
        assert_eq!(q.waiting(), 0, "a timed-out waiter is forgotten");
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.acquire_async("b", soon(60_000), 0).await.is_ok() }
        });
        while q.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        std::thread::spawn(move || drop(held))
            .join()
            .expect("freed");
        assert!(waiter.await.expect("the waiter ran"), "served");
        assert_eq!(q.reserved(), 0);
    }
}
