//! Peak RSS and CPU seconds of a process, from `/proc/<pid>/status` (VmHWM) and
//! `/proc/<pid>/stat` (utime + stime).
//!
//! # Errors
//! [`Error::Io`] when the process is gone; [`Error::Other`] when the files do not parse.

use crate::{Error, Result};

/// One reading.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcStat {
    /// Peak resident set size, bytes.
    pub peak_rss: u64,
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

/// Reads the process's peak RSS and CPU time.
///
/// # Errors
/// See the module docs.
pub fn read(pid: u32) -> Result<ProcStat> {
    let status_path = format!("/proc/{pid}/status");
    let status =
        std::fs::read_to_string(&status_path).map_err(Error::io("reading", &status_path))?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| Error::Other(format!("{status_path} has no VmHWM line")))?;
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
        peak_rss: kib * 1024,
        cpu_seconds: (utime + stime) as f64 / clock_ticks(),
    })
}
