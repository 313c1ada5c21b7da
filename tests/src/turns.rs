//! Turns: which tests of a process may run at the same time.
//!
//! Tests run in parallel threads of one process. Most share it ([`Turn::Shared`]); a test that
//! measures the process itself (its memory, the process-wide metrics of in-process hosts) or
//! takes a control plane down runs alone ([`Turn::Alone`]).
//!
//! # Guarantees
//! - While a lone turn is held, no other turn is; a lone turn is given once every shared turn
//!   has been returned.
//! - Shared turns never wait for a lone turn that is only waiting: a test may take several
//!   shared turns (one per [`crate::TestEnv`]) without deadlocking against a lone test queued
//!   in between.
//!
//! # Caveats
//! - A test holding a shared turn that asks for a lone one waits forever.
//! - A lone test waits for a gap between the shared tests of the other threads; with the test
//!   harness's few threads such gaps come at every test's end.

use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

/// Whether a test shares the process with other tests or runs alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Other shared tests may run at the same time.
    Shared,
    /// No other test runs at the same time.
    Alone,
}

#[derive(Debug)]
struct State {
    shared: usize,
    alone: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    shared: 0,
    alone: false,
});
static CHANGED: Notify = Notify::const_new();

fn state() -> MutexGuard<'static, State> {
    STATE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A turn held until dropped.
#[derive(Debug)]
pub struct TurnGuard(Turn);

impl TurnGuard {
    /// Which turn this is.
    pub fn turn(&self) -> Turn {
        self.0
    }
}

/// Waits for a turn of this kind and takes it.
pub async fn take(turn: Turn) -> TurnGuard {
    loop {
        let notified = CHANGED.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut s = state();
            match turn {
                Turn::Shared if !s.alone => {
                    s.shared += 1;
                    return TurnGuard(turn);
                }
                Turn::Alone if !s.alone && s.shared == 0 => {
                    s.alone = true;
                    return TurnGuard(turn);
                }
                _ => {}
            }
        }
        notified.await;
    }
}

/// Waits until no other test runs and keeps them out until the guard is dropped.
pub async fn alone() -> TurnGuard {
    take(Turn::Alone).await
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        {
            let mut s = state();
            match self.0 {
                Turn::Shared => s.shared = s.shared.saturating_sub(1),
                Turn::Alone => s.alone = false,
            }
        }
        CHANGED.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Long enough for a spawned task to have taken a free turn on this runtime.
    const SETTLE: Duration = Duration::from_millis(100);
    /// Far above the time a free turn takes.
    const SOON: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn a_lone_turn_waits_for_the_shared_ones_and_keeps_them_out() -> anyhow::Result<()> {
        let first = take(Turn::Shared).await;
        let lone = tokio::spawn(alone());
        tokio::time::sleep(SETTLE).await;
        anyhow::ensure!(!lone.is_finished(), "a lone turn beside a shared one");
        // A waiting lone turn does not hold up a second shared turn of a running test.
        let second = tokio::time::timeout(SOON, take(Turn::Shared)).await?;
        drop(first);
        tokio::time::sleep(SETTLE).await;
        anyhow::ensure!(!lone.is_finished(), "a lone turn beside a shared one");
        drop(second);
        let lone = tokio::time::timeout(SOON, lone).await??;
        anyhow::ensure!(lone.turn() == Turn::Alone);
        let shared = tokio::spawn(take(Turn::Shared));
        tokio::time::sleep(SETTLE).await;
        anyhow::ensure!(!shared.is_finished(), "a shared turn beside a lone one");
        drop(lone);
        let shared = tokio::time::timeout(SOON, shared).await??;
        anyhow::ensure!(shared.turn() == Turn::Shared);
        Ok(())
    }
}
