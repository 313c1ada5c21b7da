//! One contender's run at one N, on its own fresh control plane.
//!
//! Steps: start the control plane (with the contender's feature gates) and create the Apps'
//! namespaces; set up and start the controller (ready before anything is timed; sharded
//! replicas also with their membership settled); start the watches; read the API server's
//! counters and the controller's CPU; create the N Apps; wait for convergence; read again (and
//! what each wasmop host reports about its caches and slice); let the tail of the work settle
//! (no controller write for 6 s, at most 60 s); then count the writes of an idle window.
//!
//! While it runs, [`Series`] records for the charts what is observed anyway: the converged count
//! at each change the watches saw, and the controller's RSS from `/proc` every 250 ms, from
//! the first create to the end of the idle window (no API request is added).
//!
//! A contender that does not converge within the budget still yields a row: its
//! [`Measurement::converged`] says how many Apps it got to, its convergence time is the budget,
//! and it has no idle window (a run that is still working has nothing idle to measure).
//!
//! A contender of several processes (sharded replicas) is measured per process
//! ([`Measurement::processes`]); its [`ProcStat`]s in [`Measurement`] combine them
//! ([`procstat::combine`]: the largest RSS, the sum of CPU).
//!
//! # Guarantees
//! - Every measurement of a [`Measurement`] was obtained; a missing one is an error.
//! - The control plane and the controller are stopped when the run ends, failed or not.
//!
//! # Errors
//! Any step's error (a controller that exits carries its log tail); running out of the
//! convergence budget is a row, not an error.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::apimetrics::Requests;
use crate::cluster::Cluster;
use crate::contenders::{self, Binaries, Contender, Running, Tuning};
use crate::converge::{Tracker, create_apps};
use crate::procstat::{self, ProcStat, RssSampler};
use crate::replicametrics::ReplicaReport;
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
    /// First create to convergence (the budget, when it ran out first).
    pub converge: Duration,
    /// How many Apps converged: `n`, unless the budget ran out first.
    pub converged: usize,
    /// First create to the last App ready (converged, its Deployment rolled out), if every App
    /// was ready by the end of the idle window.
    pub ready: Option<Duration>,
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
    /// The controller process before the Apps were created (its peak RSS: start-up's). The
    /// peak is reset then, so the later readings' peaks are those of the work since.
    pub at_start: ProcStat,
    /// The controller process when the idle window began.
    pub at_idle_start: ProcStat,
    /// The controller process at the end of the idle window.
    pub at_end: ProcStat,
    /// Each process of the controller (one, or one per sharded replica).
    pub processes: Vec<Process>,
    /// Converged Apps and RSS over time, for the charts.
    pub series: Series,
}

/// Converged Apps and the controller's RSS over time, in seconds since the first create
/// (samples taken just before it are slightly negative).
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// (seconds, converged Apps) at every change the watches saw, until the end of the run.
    pub converged: Vec<(f64, usize)>,
    /// (seconds, RSS bytes) every [`procstat::SAMPLE_EVERY`]; of the largest process when
    /// there are several (sharded replicas).
    pub rss: Vec<(f64, u64)>,
    /// When the observation ended (the end of the idle window), seconds.
    pub end: f64,
}

/// Seconds from `origin` to `t`, negative when `t` came first.
pub fn seconds_since(origin: Instant, t: Instant) -> f64 {
    if t >= origin {
        t.duration_since(origin).as_secs_f64()
    } else {
        -origin.duration_since(t).as_secs_f64()
    }
}

impl Series {
    /// The series of a run whose first create was at `started`, observed until `end`.
    pub fn new(
        started: Instant,
        end: Instant,
        converged: &[(Instant, usize)],
        rss: &[(Instant, u64)],
    ) -> Self {
        let at = |t| seconds_since(started, t);
        // The count before the first create is 0 (a fresh cluster): the line starts there.
        let converged = std::iter::once((0.0, 0))
            .chain(converged.iter().map(|(t, c)| (at(*t).max(0.0), *c)))
            .collect();
        Series {
            converged,
            rss: rss.iter().map(|(t, b)| (at(*t), *b)).collect(),
            end: at(end),
        }
    }
}

/// One process of a contender.
#[derive(Debug, Clone, Default)]
pub struct Process {
    /// Before the Apps were created (peak RSS: start-up's; reset then).
    pub at_start: ProcStat,
    /// At convergence.
    pub at_converge: ProcStat,
    /// At the end of the idle window.
    pub at_end: ProcStat,
    /// What it reported on its `/metrics` at convergence (wasmop hosts only).
    pub report: Option<ReplicaReport>,
}

impl Process {
    /// CPU seconds from the first create to convergence.
    pub fn cpu_converge(&self) -> f64 {
        self.at_converge.cpu_seconds - self.at_start.cpu_seconds
    }
}

impl Measurement {
    /// Whether every App converged within the budget.
    pub fn finished(&self) -> bool {
        self.converged >= self.n
    }

    /// Its row name: the contender's, `wasmop xK` for K sharded replicas.
    pub fn label(&self) -> String {
        self.contender.label(&self.tuning)
    }

    /// CPU seconds from the first create to convergence.
    pub fn cpu_converge(&self) -> f64 {
        self.at_converge.cpu_seconds - self.at_start.cpu_seconds
    }

    /// CPU seconds per minute while idle (settling excluded; NaN without an idle window).
    pub fn cpu_idle_per_min(&self) -> f64 {
        if self.idle.is_zero() {
            return f64::NAN;
        }
        (self.at_end.cpu_seconds - self.at_idle_start.cpu_seconds) * 60.0 / self.idle.as_secs_f64()
    }
}

/// One reading per process, in order.
fn stats(contender: Contender, running: &mut Running) -> Result<Vec<ProcStat>> {
    if let Some(why) = running.exited() {
        return Err(Error::Controller {
            contender: contender.name().into(),
            detail: format!("{why}; log:\n{}", running.log_tail()),
        });
    }
    running
        .pids()
        .into_iter()
        .map(|pid| {
            let pid = pid.ok_or_else(|| Error::Controller {
                contender: contender.name().into(),
                detail: format!("exited; log:\n{}", running.log_tail()),
            })?;
            procstat::read(pid)
        })
        .collect()
}

fn run_dir(contender: Contender, n: usize, tuning: Tuning) -> PathBuf {
    std::env::temp_dir().join(format!(
        "wasmop-bench-scale-{}-{}-{n}-{}-x{}",
        std::process::id(),
        contender.name(),
        tuning.concurrency,
        tuning.replicas
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
    let label = contender.label(&tuning);
    let gates = contender.feature_gates();
    eprintln!(
        "[bench] {label} N={n} concurrency={}: starting a fresh control plane{}",
        tuning.concurrency,
        if gates.is_empty() {
            String::new()
        } else {
            format!(" (feature gates {})", gates.join(","))
        }
    );
    // One pod per App (replicas 1): every pod has a node.
    let cluster = Cluster::start_with(gates, n).await?;
    let client = cluster.client.clone();
    cluster.namespaces(&tuning.layout.namespaces(n)).await?;
    let dir = run_dir(contender, n, tuning);
    let _ = std::fs::remove_dir_all(&dir);
    let mut running = contenders::start(contender, &cluster, binaries, tuning, &dir).await?;
    let mut tracker = Tracker::start(&client, tuning.layout.watched()).await?;
    let at_start = stats(contender, &mut running)?;
    // From here the peak is the work's: start-up (a wasmop host's module compile) is `at_start`.
    let pids: Vec<u32> = running.pids().into_iter().flatten().collect();
    for pid in &pids {
        procstat::reset_peak(*pid)?;
    }
    let sampler = RssSampler::start(pids);
    let before = Requests::read(&client).await?;
    eprintln!(
        "[bench] {label}: creating {n} Apps in {} namespace(s)",
        tuning.layout.count(n)
    );
    let started = create_apps(&client, tuning.layout, n).await?;
    let (done, converged) = match tracker.wait(&label, n, timeout).await {
        Ok(at) => (at, n),
        Err(e) => {
            eprintln!(
                "[bench] {label}: {e}; {} log tail:\n{}",
                contender.name(),
                running.log_tail()
            );
            (Instant::now(), tracker.converged())
        }
    };
    let converge = done.saturating_duration_since(started);
    let at_converge = stats(contender, &mut running)?;
    let after = Requests::read(&client).await?;
    let reports = running.reports().await?;
    let converge_requests = after.since(&before);
    let converge_writes = (converge_requests.controller_writes() - n as f64).max(0.0);
    let reconciles: f64 = reports.iter().filter_map(|r| r.reconciles).sum();
    let by_hosts = if reports.iter().any(|r| r.reconciles.is_some()) {
        format!(" ({reconciles} reconciles by wasmop hosts)")
    } else {
        String::new()
    };
    eprintln!(
        "[bench] {label}: {converged} of {n} converged in {:.1} s{by_hosts}",
        converge.as_secs_f64(),
    );
    let idle = if converged < n { Duration::ZERO } else { idle };
    if !idle.is_zero() {
        eprintln!("[bench] {label}: settling, then {} s idle", idle.as_secs());
        settle(
            &client,
            tuning
                .resync
                .clamp(Duration::from_secs(10), Duration::from_secs(60)),
        )
        .await?;
    }
    let idle_start = stats(contender, &mut running)?;
    let idle_before = Requests::read(&client).await?;
    tokio::time::sleep(idle).await;
    let idle_requests = Requests::read(&client).await?.since(&idle_before);
    let at_end = stats(contender, &mut running)?;
    let ready = tracker
        .all_ready(n)
        .map(|at| at.saturating_duration_since(started));
    let series = Series::new(started, Instant::now(), &tracker.history(), &sampler.stop());
    let idle_writes_per_min = if idle.is_zero() {
        f64::NAN
    } else {
        idle_requests.controller_writes() * 60.0 / idle.as_secs_f64()
    };
    drop(tracker);
    drop(running);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    let processes = (0..at_start.len())
        .map(|i| Process {
            at_start: at_start[i],
            at_converge: at_converge.get(i).copied().unwrap_or_default(),
            at_end: at_end.get(i).copied().unwrap_or_default(),
            report: reports.get(i).cloned(),
        })
        .collect();
    Ok(Measurement {
        contender,
        n,
        tuning,
        converge,
        converged,
        ready,
        converge_requests,
        converge_writes,
        idle_requests,
        idle_writes_per_min,
        idle,
        at_converge: procstat::combine(&at_converge),
        at_start: procstat::combine(&at_start),
        at_idle_start: procstat::combine(&idle_start),
        at_end: procstat::combine(&at_end),
        processes,
        series,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_in_seconds_since_the_first_create() {
        let t0 = Instant::now();
        let started = t0 + Duration::from_secs(1);
        let s = Series::new(
            started,
            started + Duration::from_secs(30),
            &[
                (started + Duration::from_secs(2), 1),
                (started + Duration::from_secs(5), 2),
            ],
            &[(t0, 10), (started + Duration::from_millis(250), 20)],
        );
        assert_eq!(s.converged, vec![(0.0, 0), (2.0, 1), (5.0, 2)]);
        assert_eq!(s.rss, vec![(-1.0, 10), (0.25, 20)]);
        assert_eq!(s.end, 30.0);
    }
}
