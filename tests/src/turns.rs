//! Turns: which tests of a process may run at the same time.
//!
//! Tests run in parallel threads of one process. Most share it ([`Turn::Shared`]); a test that
//! measures the process itself (its memory, the process-wide metrics of in-process hosts) or
//! takes a control plane down runs alone ([`Turn::Alone`]).
//!
//! # Guarantees
//! - While a lone turn is held, no other turn is; a lone turn is given once every shared turn
//!   has been returned.
//! - A lone turn asked for goes before the tests that have not started: while one waits, a
//!   test thread (libtest names it after its test, `suite::test`) that holds no turn yet gets
//!   none, so a lone test waits only for the tests already running, not for a gap that may never
//!   come while the other threads keep starting tests.
//! - A test never deadlocks against a waiting lone turn: a thread that already holds a shared
//!   turn, or is not a test's thread (a runtime worker), gets a further shared turn at once.
//! - With `WASMOP_TEST_TIMELINE=<file>` set, each returned turn appends a line to that file:
//!   the test (its thread's name), the turn, the seconds waited for it, the seconds held, and
//!   when it was returned, in seconds since this process took its first turn (`make test` sets
//!   it and prints the lone turns, whose sum is the suite's floor, and the last to end).
//!
//! # Caveats
//! - A test holding a shared turn that asks for a lone one waits forever.
//! - A test that takes a second shared turn on a thread of its own whose name looks like a
//!   test's (`a::b`) waits for the lone turns queued meanwhile.

use std::io::Write;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

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
    /// Lone turns asked for and not yet given.
    lone_waiting: usize,
    /// The threads holding shared turns, by name (one entry per turn).
    holders: Vec<String>,
}

static STATE: Mutex<State> = Mutex::new(State {
    shared: 0,
    alone: false,
    lone_waiting: 0,
    holders: Vec::new(),
});

/// This thread's name, if it is a test's (libtest names a test's thread after the test's path).
fn test_thread() -> Option<String> {
    std::thread::current()
        .name()
        .filter(|name| name.contains("::"))
        .map(str::to_string)
}

impl State {
    /// Whether the test on this thread may take a shared turn now.
    fn shared_allowed(&self, thread: Option<&str>) -> bool {
        let starting = thread.is_some_and(|t| !self.holders.iter().any(|h| h == t));
        let queued_behind_lone = starting && self.lone_waiting > 0;
        !self.alone && !queued_behind_lone
    }
}

/// Counts a lone turn as waiting until it is given or its future is dropped.
struct LoneWaiting;

impl LoneWaiting {
    fn new() -> Self {
        state().lone_waiting += 1;
        LoneWaiting
    }
}

impl Drop for LoneWaiting {
    fn drop(&mut self) {
        {
            let mut s = state();
            s.lone_waiting = s.lone_waiting.saturating_sub(1);
        }
        CHANGED.notify_waiters();
    }
}
static CHANGED: Notify = Notify::const_new();

fn state() -> MutexGuard<'static, State> {
    STATE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A turn held until dropped.
#[derive(Debug)]
pub struct TurnGuard {
    turn: Turn,
    thread: Option<String>,
    waited: Duration,
    since: Instant,
}

impl TurnGuard {
    /// Which turn this is.
    pub fn turn(&self) -> Turn {
        self.turn
    }
}

/// Appends `guard`'s line to the timeline file, if one is asked for (best effort: a test
/// never fails for its timeline).
fn record(guard: &TurnGuard) {
    let Some(path) = std::env::var_os("WASMOP_TEST_TIMELINE") else {
        return;
    };
    let test = guard.thread.as_deref().unwrap_or("(not a test's thread)");
    let line = format!(
        "{test}\t{:?}\t{:.1}\t{:.1}\t{:.1}\n",
        guard.turn,
        guard.waited.as_secs_f64(),
        guard.since.elapsed().as_secs_f64(),
        first_turn().elapsed().as_secs_f64()
    );
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = file.write_all(line.as_bytes());
    }
}

/// When this process first asked for a turn (the timeline's origin).
fn first_turn() -> Instant {
    static FIRST: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *FIRST.get_or_init(Instant::now)
}

/// Waits for a turn of this kind and takes it.
pub async fn take(turn: Turn) -> TurnGuard {
    let asked = Instant::now();
    first_turn();
    let thread = test_thread();
    let waiting = (turn == Turn::Alone).then(LoneWaiting::new);
    loop {
        let notified = CHANGED.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut s = state();
            match turn {
                Turn::Shared if s.shared_allowed(thread.as_deref()) => {
                    s.shared += 1;
                    s.holders.extend(thread.clone());
                    return TurnGuard::new(turn, thread, asked);
                }
                Turn::Alone if !s.alone && s.shared == 0 => {
                    s.alone = true;
                    drop(s);
                    drop(waiting);
                    return TurnGuard::new(turn, thread, asked);
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

impl TurnGuard {
    fn new(turn: Turn, thread: Option<String>, asked: Instant) -> Self {
        TurnGuard {
            turn,
            thread,
            waited: asked.elapsed(),
            since: Instant::now(),
        }
    }
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        record(self);
        {
            let mut s = state();
            match self.turn {
                Turn::Shared => {
                    s.shared = s.shared.saturating_sub(1);
                    if let Some(i) = s
                        .holders
                        .iter()
                        .position(|h| Some(h) == self.thread.as_ref())
                    {
                        s.holders.swap_remove(i);
                    }
                }
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
        drop(shared);
        a_waiting_lone_turn_goes_before_tests_not_started().await
    }

    /// (Part of the test above: the turns are process-wide, so their tests run one at a time.)
    async fn a_waiting_lone_turn_goes_before_tests_not_started() -> anyhow::Result<()> {
        let first = take(Turn::Shared).await;
        let lone = tokio::spawn(alone());
        tokio::time::sleep(SETTLE).await;
        // Another test's thread, starting now: it holds no turn, so it waits for the lone one.
        let (granted, got) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let newcomer = std::thread::Builder::new()
            .name("suite::newcomer".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let turn = rt.block_on(take(Turn::Shared));
                granted.send(turn.turn())?;
                released.recv()?;
                anyhow::Ok(())
            })?;
        anyhow::ensure!(
            got.recv_timeout(SETTLE).is_err(),
            "a test not started got a shared turn before a waiting lone one"
        );
        // This test's own further turn is not held up (no deadlock against the lone turn).
        let second = tokio::time::timeout(SOON, take(Turn::Shared)).await?;
        drop((first, second));
        let lone = tokio::time::timeout(SOON, lone).await??;
        anyhow::ensure!(
            got.recv_timeout(SETTLE).is_err(),
            "a shared turn beside a lone one"
        );
        drop(lone);
        anyhow::ensure!(got.recv_timeout(SOON)? == Turn::Shared);
        release.send(())?;
        newcomer
            .join()
            .map_err(|_| anyhow::anyhow!("the newcomer thread panicked"))??;
        Ok(())
    }
}
