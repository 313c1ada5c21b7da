//! Peak RSS, RSS and CPU seconds of a process, from `/proc/<pid>/status` (VmHWM, VmRSS) and
//! `/proc/<pid>/stat` (utime + stime); [`combine`] sums the processes of a sharded contender;
//! [`reset_peak`] starts a new peak (so start-up and the work after it are measured apart);
//! [`RssSampler`] records RSS over time for the memory chart, from `/proc` only (no API request).
//!
//! # Errors
//! [`Error::Io`] when the process is gone; [`Error::Other`] when the files do not parse.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// One reading.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcStat {
    /// Peak resident set size, bytes.
    pub peak_rss: u64,
    /// Resident set size now, bytes.
    pub rss: u64,
    /// User + system CPU time, seconds.
    pub cpu_seconds: f64,
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 on Linux unless it says otherwise).
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// Reads the kB values of `fields` (`"VmRSS:"`, `"RssAnon:"`, ...) from `/proc/<pid>/status`.
///
/// # Errors
/// See the module docs.
pub fn status_kib<const N: usize>(pid: u32, fields: [&str; N]) -> Result<[u64; N]> {
    let status_path = format!("/proc/{pid}/status");
    let status =
        std::fs::read_to_string(&status_path).map_err(Error::io("reading", &status_path))?;
    let mut values = [0; N];
    for (value, field) in values.iter_mut().zip(fields) {
        *value = status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .ok_or_else(|| Error::Other(format!("{status_path} has no {field} line")))?;
    }
    Ok(values)
}

/// Reads the process's peak RSS and CPU time.
///
/// # Errors
/// See the module docs.
pub fn read(pid: u32) -> Result<ProcStat> {
    let [peak, rss] = status_kib(pid, ["VmHWM:", "VmRSS:"])?;
    let stat_path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&stat_path).map_err(Error::io("reading", &stat_path))?;
    // Fields after the command name (which may hold spaces and parentheses): state is field 3,
    // utime field 14 and stime field 15, so index 11 and 12 after the closing parenthesis.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| Error::Other(format!("{stat_path} does not parse")))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    let (Some(utime), Some(stime)) = (tick(11), tick(12)) else {
        return Err(Error::Other(format!("{stat_path} has no utime/stime")));
    };
    Ok(ProcStat {
        peak_rss: peak * 1024,
        rss: rss * 1024,
        cpu_seconds: (utime + stime) as f64 / clock_ticks(),
    })
}

/// Resets the process's peak RSS (VmHWM) to its current RSS: `5` written to
/// `/proc/<pid>/clear_refs` (Linux 4.0 and later; needs the right to ptrace the process, which
/// a parent running as the same user has).
///
/// # Errors
/// [`Error::Io`] when the file cannot be written: the peak would silently include what came
/// before, so this is an error, not a warning.
pub fn reset_peak(pid: u32) -> Result<()> {
    let path = format!("/proc/{pid}/clear_refs");
    std::fs::write(&path, "5").map_err(Error::io("writing", &path))
}

/// Several processes as one contender: the largest peak and current RSS (what one replica
/// needs), the sum of CPU seconds (what they cost together).
pub fn combine(stats: &[ProcStat]) -> ProcStat {
    ProcStat {
        peak_rss: stats.iter().map(|s| s.peak_rss).max().unwrap_or(0),
        rss: stats.iter().map(|s| s.rss).max().unwrap_or(0),
        cpu_seconds: stats.iter().map(|s| s.cpu_seconds).sum(),
    }
}

/// How often [`RssSampler`] reads `/proc/<pid>/status`.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// The largest RSS (`VmRSS`, bytes) of `pids` now, leaving out those that cannot be read
/// (exited); `None` if none can.
pub fn largest_rss(pids: &[u32]) -> Option<u64> {
    pids.iter()
        .filter_map(|pid| status_kib(*pid, ["VmRSS:"]).ok())
        .map(|[kib]| kib * 1024)
        .max()
}

/// Samples the RSS (`VmRSS`) of a contender's processes every [`SAMPLE_EVERY`] while it runs,
/// the largest of them per sample (as [`combine`] does for the tables). Reads `/proc` only, so it
/// adds no request to the API server and nothing to what the benchmark measures. A process that
/// has exited is left out of a sample; a sample with no readable process is not recorded.
#[derive(Debug)]
pub struct RssSampler {
    samples: Arc<Mutex<Vec<(Instant, u64)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    /// Starts sampling `pids` (the first sample at once).
    pub fn start(pids: Vec<u32>) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let out = Arc::clone(&samples);
        let task = tokio::spawn(async move {
            let mut every = tokio::time::interval(SAMPLE_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                if let Some(rss) = largest_rss(&pids) {
                    out.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((Instant::now(), rss));
                }
            }
        });
        RssSampler { samples, task }
    }

    /// The samples so far (when, RSS bytes), in time order.
    pub fn samples(&self) -> Vec<(Instant, u64)> {
        self.samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops sampling; the samples (when, RSS bytes), in time order.
    pub fn stop(self) -> Vec<(Instant, u64)> {
        self.task.abort();
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_and_combines() -> Result<()> {
        let me = read(std::process::id())?;
        assert!(me.peak_rss >= me.rss && me.rss > 0, "{me:?}");
        let a = ProcStat {
            peak_rss: 5,
            rss: 3,
            cpu_seconds: 1.5,
        };
        let b = ProcStat {
            peak_rss: 7,
            rss: 2,
            cpu_seconds: 0.5,
        };
        let c = combine(&[a, b]);
        assert_eq!((c.peak_rss, c.rss, c.cpu_seconds), (7, 3, 2.0));
        Ok(())
    }

    #[test]
    fn the_largest_rss_leaves_out_processes_that_are_gone() {
        // u32::MAX is above any pid_max: no such process.
        assert_eq!(largest_rss(&[u32::MAX]), None);
        let me = largest_rss(&[u32::MAX, std::process::id()]);
        assert!(me.is_some_and(|rss| rss > 0), "{me:?}");
    }

    #[tokio::test]
    async fn the_sampler_records_in_time_order() {
        let sampler = RssSampler::start(vec![std::process::id()]);
        // Waits for samples, however slow the machine; asserts nothing about time.
        while sampler.samples().len() < 3 {
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
        let samples = sampler.stop();
        assert!(samples.iter().all(|(_, rss)| *rss > 0), "{samples:?}");
        assert!(samples.windows(2).all(|w| w[0].0 <= w[1].0), "{samples:?}");
    }
}
