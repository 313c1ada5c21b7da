//! One contender's run at one N, on its own fresh control plane.
//!
//! Steps: start the control plane; set up and start the controller (ready before anything is
//! timed); start the watches; read the API server's counters and the controller's CPU; create
//! the N Apps; wait for convergence; read again; let the tail of the work settle (no controller
//! write for 6 s, at most 60 s); then count the writes of an idle window.
//!
//! # Guarantees
//! - Every measurement of a [`Measurement`] was obtained; a missing one is an error.
//! - The control plane and the controller are stopped when the run ends, failed or not.
//!
//! # Errors
//! Any step's error; a timeout carries the controller's log tail.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::apimetrics::Requests;
use crate::cluster::{Cluster, NAMESPACE};
use crate::contenders::{self, Binaries, Contender, Running, Tuning};
use crate::converge::{Tracker, create_apps};
use crate::procstat::{self, ProcStat};
use crate::{Error, Result};

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// Who.
    pub contender: Contender,
    /// How many Apps.
    pub n: usize,
    /// Its settings.
    pub tuning: Tuning,
    /// First create to convergence.
    pub converge: Duration,
    /// Requests during convergence (all clients).
    pub converge_requests: Requests,
    /// Controller writes during convergence (the bench's N App creates not counted).
    pub converge_writes: f64,
    /// Requests during the idle window.
    pub idle_requests: Requests,
    /// Controller writes per minute during the idle window.
    pub idle_writes_per_min: f64,
    /// How long the idle window was.
    pub idle: Duration,
    /// The controller process at convergence.
    pub at_converge: ProcStat,
    /// The controller process before the Apps were created.
    pub at_start: ProcStat,
    /// The controller process when the idle window began.
    pub at_idle_start: ProcStat,
    /// The controller process at the end of the idle window.
    pub at_end: ProcStat,
}

impl Measurement {
    /// CPU seconds from the first create to convergence.
    pub fn cpu_converge(&self) -> f64 {
        self.at_converge.cpu_seconds - self.at_start.cpu_seconds
    }

    /// CPU seconds per minute while idle (settling excluded).
    pub fn cpu_idle_per_min(&self) -> f64 {
        (self.at_end.cpu_seconds - self.at_idle_start.cpu_seconds) * 60.0 / self.idle.as_secs_f64()
    }
}

fn pid_of(contender: Contender, running: &Running) -> Result<u32> {
    running.pid().ok_or_else(|| Error::Controller {
        contender: contender.name().into(),
        detail: format!("exited; log:\n{}", running.log_tail()),
    })
}

fn stat(contender: Contender, running: &mut Running) -> Result<ProcStat> {
    if let Some(why) = running.exited() {
        return Err(Error::Controller {
            contender: contender.name().into(),
            detail: format!("{why}; log:\n{}", running.log_tail()),
        });
    }
    procstat::read(pid_of(contender, running)?)
}

fn run_dir(contender: Contender, n: usize, tuning: Tuning) -> PathBuf {
    std::env::temp_dir().join(format!(
        "wasmop-bench-scale-{}-{}-{n}-{}",
        std::process::id(),
        contender.name(),
        tuning.concurrency
    ))
}

/// Waits until no controller write happened for 6 s, at most `cap` (a controller that writes
/// on every resync never goes quiet for long).
async fn settle(client: &kube::Client, cap: Duration) -> Result<()> {
    let began = Instant::now();
    let mut last = Requests::read(client).await?.controller_writes();
    let mut quiet = 0;
    while quiet < 3 && began.elapsed() < cap {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = Requests::read(client).await?.controller_writes();
        quiet = if now == last { quiet + 1 } else { 0 };
        last = now;
    }
    Ok(())
}

/// Runs `contender` at `n` Apps.
///
/// # Errors
/// See the module docs.
pub async fn measure(
    contender: Contender,
    n: usize,
    tuning: Tuning,
    binaries: &Binaries,
    idle: Duration,
    timeout: Duration,
) -> Result<Measurement> {
    eprintln!(
        "[bench] {} N={n} concurrency={}: starting a fresh control plane",
        contender.name(),
        tuning.concurrency
    );
    let cluster = Cluster::start().await?;
    let client = cluster.client.clone();
    let dir = run_dir(contender, n, tuning);
    let _ = std::fs::remove_dir_all(&dir);
    let mut running = contenders::start(contender, &cluster, binaries, tuning, &dir).await?;
    let mut tracker = Tracker::start(&client, NAMESPACE).await?;
    let at_start = stat(contender, &mut running)?;
    let before = Requests::read(&client).await?;
    eprintln!("[bench] {}: creating {n} Apps", contender.name());
    let started = create_apps(&client, NAMESPACE, n).await?;
    let done = match tracker.wait(contender.name(), n, timeout).await {
        Ok(at) => at,
        Err(e) => {
            return Err(Error::Other(format!(
                "{e}\n{} log tail:\n{}",
                contender.name(),
                running.log_tail()
            )));
        }
    };
    let converge = done.saturating_duration_since(started);
    let at_converge = stat(contender, &mut running)?;
    let after = Requests::read(&client).await?;
    let converge_requests = after.since(&before);
    let converge_writes = (converge_requests.controller_writes() - n as f64).max(0.0);
    eprintln!(
        "[bench] {}: converged in {:.1} s; settling, then {} s idle",
        contender.name(),
        converge.as_secs_f64(),
        idle.as_secs()
    );
    settle(
        &client,
        tuning
            .resync
            .clamp(Duration::from_secs(10), Duration::from_secs(60)),
    )
    .await?;
    let idle_start = stat(contender, &mut running)?;
    let idle_before = Requests::read(&client).await?;
    tokio::time::sleep(idle).await;
    let idle_requests = Requests::read(&client).await?.since(&idle_before);
    let at_end = stat(contender, &mut running)?;
    let idle_writes_per_min = idle_requests.controller_writes() * 60.0 / idle.as_secs_f64();
    drop(tracker);
    drop(running);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Measurement {
        contender,
        n,
        tuning,
        converge,
        converge_requests,
        converge_writes,
        idle_requests,
        idle_writes_per_min,
        idle,
        at_converge,
        at_start,
        at_idle_start: idle_start,
        at_end,
    })
}
