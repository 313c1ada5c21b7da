//! What a call is charged against its deadline: its wall time, less the time the host took its
//! thread back at a tick.
//!
//! An awaited call runs its guest on an async worker and gives the worker back at every epoch
//! tick ([`Charge::at_tick`]), so that other tasks run. How long the guest then waits for the
//! worker depends on the host's load, not on the module: a flood of TLS handshakes on a loaded
//! machine kept a review of a few milliseconds' work waiting past its 500 ms deadline (the e2e
//! flood test on CI, 2026-12-01). Those waits are not the module's, so they are not charged to
//! it.
//!
//! # Guarantees
//! - A guest is charged for everything but its waits at a yield: its own work, its WASI
//!   sleeps, the queue and instantiation before it, and the operating system's preemptions of
//!   its thread (as on a thread of its own).
//! - Between two yields a guest runs at least one tick: a guest resumed after a long wait is
//!   not sent back to wait before it has done any work.
//! - A guest past its charged deadline traps at its next tick ([`Charge::at_tick`]), one that
//!   is not running (in a WASI sleep) is dropped at it ([`Charge::within`]).
//!
//! # Caveats
//! - A call's wall time is its deadline plus its waits: bounded by the deadline's ticks (one
//!   wait per tick of work at most) times the runtime's longest turn, not by the deadline.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The clock of one call's deadline, shared by its store's epoch callback and the call.
#[derive(Debug)]
pub(crate) struct Charge {
    /// When the call is due, not counting its waits.
    deadline_at: Instant,
    /// The epoch's tick: the least a guest runs between two yields.
    tick: Duration,
    waits: Mutex<Waits>,
}

/// The waits at yields so far.
#[derive(Debug)]
struct Waits {
    /// The finished waits' total.
    total: Duration,
    /// When the wait in progress began, if the guest waits now.
    since: Option<Instant>,
    /// When the guest last got its thread back (or the call started).
    resumed: Instant,
}

impl Charge {
    pub(crate) fn new(started: Instant, deadline: Duration, tick: Duration) -> Arc<Self> {
        Arc::new(Self {
            deadline_at: started + deadline,
            tick,
            waits: Mutex::new(Waits {
                total: Duration::ZERO,
                since: None,
                resumed: started,
            }),
        })
    }

    /// The call's deadline, moved by its waits up to `now`.
    pub(crate) fn due(&self, now: Instant) -> Instant {
        let waits = self.waits.lock().unwrap_or_else(PoisonError::into_inner);
        let waiting = waits
            .since
            .map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
        self.deadline_at + waits.total + waiting
    }

    /// What a call's store does at an epoch tick while its guest runs: traps once the call is
    /// due, runs on for another tick when the guest got its thread back less than a tick ago,
    /// else yields to the async runtime (at the back of its queue, so other tasks run), the
    /// wait not charged.
    pub(crate) fn at_tick(self: &Arc<Self>, now: Instant) -> wasmtime::UpdateDeadline {
        if now >= self.due(now) {
            return wasmtime::UpdateDeadline::Interrupt;
        }
        let mut waits = self.waits.lock().unwrap_or_else(PoisonError::into_inner);
        if now.saturating_duration_since(waits.resumed) < self.tick {
            return wasmtime::UpdateDeadline::Continue(1);
        }
        waits.since = Some(now);
        let charge = Arc::clone(self);
        wasmtime::UpdateDeadline::YieldCustom(
            1,
            Box::pin(async move {
                tokio::task::yield_now().await;
                charge.resume(Instant::now());
            }),
        )
    }

    /// Ends the wait in progress at `now`.
    fn resume(&self, now: Instant) {
        let mut waits = self.waits.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(since) = waits.since.take() {
            waits.total += now.saturating_duration_since(since);
        }
        waits.resumed = now;
    }

    /// Runs `run` until it finishes or the call is due, whichever comes first; `Err` when due.
    /// A timer that fires while the deadline moved on (the guest waited meanwhile) is set
    /// again.
    pub(crate) async fn within<F: Future>(
        &self,
        run: F,
    ) -> Result<F::Output, tokio::time::error::Elapsed> {
        let mut run = std::pin::pin!(run);
        loop {
            let due = tokio::time::Instant::from_std(self.due(Instant::now()));
            match tokio::time::timeout_at(due, run.as_mut()).await {
                Ok(out) => return Ok(out),
                Err(elapsed) if Instant::now() >= self.due(Instant::now()) => return Err(elapsed),
                Err(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(2);

    fn yields(update: &wasmtime::UpdateDeadline) -> bool {
        matches!(update, wasmtime::UpdateDeadline::YieldCustom(1, _))
    }

    #[test]
    fn a_wait_at_a_yield_moves_the_deadline_and_the_next_tick_runs_on() {
        let t0 = Instant::now();
        let charge = Charge::new(t0, Duration::from_millis(100), TICK);
        assert!(yields(&charge.at_tick(t0 + TICK)));
        // Waiting 500 ms: due 500 ms later, counted while it waits too.
        let resumed = t0 + TICK + Duration::from_millis(500);
        assert_eq!(charge.due(resumed), t0 + Duration::from_millis(600));
        charge.resume(resumed);
        assert_eq!(
            charge.due(resumed + TICK * 10),
            t0 + Duration::from_millis(600)
        );
        // Just resumed: runs a tick before it yields again.
        assert!(matches!(
            charge.at_tick(resumed),
            wasmtime::UpdateDeadline::Continue(1)
        ));
        assert!(yields(&charge.at_tick(resumed + TICK)));
    }

    #[test]
    fn a_guest_past_its_charged_deadline_traps() {
        let t0 = Instant::now();
        let charge = Charge::new(t0, Duration::from_millis(100), TICK);
        assert!(matches!(
            charge.at_tick(t0 + Duration::from_millis(100)),
            wasmtime::UpdateDeadline::Interrupt
        ));
    }
}
