//! The epoch ticker: the clock of every call's deadline, running only while a call does.
//!
//! Each store gets an epoch deadline some ticks ahead (`Module::store`); a thread increments
//! the engines' epoch every tick. Ticking with no call in flight cost a wakeup every 2 ms for
//! nothing: ~4% of a converging host's CPU and ~0.3 s a minute of an idle one
//! (`docs/benchmarks.md`, the profile). The thread now sleeps while no [`Ticking`] guard lives.
//!
//! # Guarantees
//! - While a [`Ticking`] guard lives, the epoch advances once per tick, as before: a deadline
//!   of n ticks set after the guard was taken traps within n + 1 ticks.
//! - With no guard alive the thread waits on a condition variable (no wakeups) and the epoch
//!   stands still; no store exists then whose deadline could be missed.
//! - Dropping the [`Ticker`] (the last engine clone) stops the thread within one tick.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// The shared state of the ticker thread and its guards.
#[derive(Debug, Default)]
struct Shared {
    running: AtomicUsize,
    /// Whether the thread waits (or is about to) on `wake`: only then does a first call
    /// notify it, so calls that come faster than ticks make no syscall.
    waiting: AtomicBool,
    stop: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

impl Shared {
    /// Wakes the thread (under the lock, so a check-then-wait cannot miss it).
    fn notify(&self) {
        let _held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.wake.notify_all();
    }

    /// Waits until a call runs or the ticker stops; false when it stopped.
    ///
    /// `waiting` is set before `running` is read, and a guard bumps `running` before it reads
    /// `waiting` (both sequentially consistent): either the thread sees the call, or the
    /// guard sees the thread waiting and notifies it under the lock.
    fn wait_for_calls(&self) -> bool {
        let mut held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.waiting.store(true, Ordering::SeqCst);
        while self.running.load(Ordering::SeqCst) == 0 && !self.stop.load(Ordering::SeqCst) {
            held = self.wake.wait(held).unwrap_or_else(PoisonError::into_inner);
        }
        self.waiting.store(false, Ordering::SeqCst);
        !self.stop.load(Ordering::SeqCst)
    }
}

/// Owns the ticker thread; stops it when dropped.
#[derive(Debug)]
pub(crate) struct Ticker {
    shared: Arc<Shared>,
}

/// Keeps the epoch advancing while it lives (one per call's store).
#[derive(Debug)]
pub(crate) struct Ticking {
    shared: Arc<Shared>,
}

impl Ticker {
    /// Starts the thread that calls `tick` every `every` while a [`Ticking`] guard lives;
    /// `tick` returns false when there is nothing left to tick (the thread then ends).
    pub(crate) fn start(
        every: Duration,
        mut tick: impl FnMut() -> bool + Send + 'static,
    ) -> std::io::Result<Ticker> {
        let shared = Arc::new(Shared::default());
        let thread = shared.clone();
        std::thread::Builder::new()
            .name("wasmop-epoch".into())
            .spawn(move || {
                while thread.wait_for_calls() {
                    std::thread::sleep(every);
                    if !tick() {
                        return;
                    }
                }
            })?;
        Ok(Ticker { shared })
    }

    /// A guard under which the epoch advances.
    pub(crate) fn running(&self) -> Ticking {
        if self.shared.running.fetch_add(1, Ordering::SeqCst) == 0
            && self.shared.waiting.load(Ordering::SeqCst)
        {
            self.shared.notify();
        }
        Ticking {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Ticking {
    fn drop(&mut self) {
        self.shared.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Instant;

    /// A ticker whose ticks are sent to the returned receiver and counted.
    fn counting() -> (Ticker, mpsc::Receiver<()>, Arc<AtomicUsize>) {
        let (send, ticks) = mpsc::channel();
        let count = Arc::new(AtomicUsize::new(0));
        let counted = count.clone();
        let ticker = Ticker::start(Duration::from_millis(1), move || {
            counted.fetch_add(1, Ordering::SeqCst);
            send.send(()).is_ok()
        })
        .unwrap_or_else(|e| panic!("thread: {e}"));
        (ticker, ticks, count)
    }

    #[test]
    fn it_ticks_while_a_guard_lives_and_not_before() {
        let (ticker, ticks, count) = counting();
        // Not one tick without a call (generous: 50 ticks' worth of waiting).
        assert!(ticks.recv_timeout(Duration::from_millis(50)).is_err());
        let guard = ticker.running();
        for _ in 0..3 {
            assert!(ticks.recv_timeout(Duration::from_secs(60)).is_ok());
        }
        drop(guard);
        // Ticks sent before the guard went are not "after": on a busy machine the ticker
        // may have sent several while this thread waited for a core (CI saw 2 counted from
        // the channel). At most the tick in progress when the guard went follows, then none
        // (a ticker that kept going would tick ~200 times in this window).
        let sent = count.load(Ordering::SeqCst);
        let window = Instant::now() + Duration::from_millis(200);
        while let Some(left) = window.checked_duration_since(Instant::now()) {
            let _ = ticks.recv_timeout(left);
        }
        let after = count.load(Ordering::SeqCst) - sent;
        assert!(after <= 1, "{after} ticks after the last guard went");
    }

    #[test]
    fn dropping_the_ticker_ends_the_thread_even_while_a_guard_lives() {
        let (ticker, ticks, _) = counting();
        let _guard = ticker.running();
        assert!(ticks.recv_timeout(Duration::from_secs(60)).is_ok());
        drop(ticker);
        // The thread ends and drops its sender: the channel disconnects.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match ticks.recv_timeout(Duration::from_secs(60)) {
                Ok(()) if Instant::now() < deadline => continue,
                Ok(()) => panic!("still ticking a minute after the ticker was dropped"),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("thread neither ticks nor ends"),
            }
        }
    }
}
