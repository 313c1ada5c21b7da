//! What a benchmark run measures, from the environment.
//!
//! - `WASMOP_BENCH_N`: comma list of App counts (default `1000,10000`).
//! - `WASMOP_BENCH_CONTENDERS`: comma list of `wasmop`, `kube-rs`, `controller-runtime`,
//!   `floor` (default all).
//! - `WASMOP_BENCH_RESYNC`: the resync period in seconds, applied to every controller
//!   (default 30).
//! - `WASMOP_BENCH_IDLE`: seconds of idle measurement after convergence (default two resync
//!   periods plus 10 s).
//! - `WASMOP_BENCH_CONCURRENCY`: reconciles at once in every controller (default 16).
//! - `WASMOP_BENCH_FLOOR_CONCURRENCY`: the floor's concurrency settings (default `8,16,32`).
//! - `WASMOP_BENCH_TIMEOUT`: seconds allowed for convergence (default 120 + 0.3 s per App).
//! - `WASMOP_BENCH_WASMOP_ARGS`: extra `wasmop run` flags, space-separated (e.g.
//!   `--kube-qps 0`), read by [`crate::contenders::wasmop`].
//!
//! # Errors
//! [`Error::Setting`] for a value that does not parse or is out of range.

use std::time::Duration;

use crate::contenders::Contender;
use crate::{Error, Result};

/// The settings of a run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// App counts, one table each.
    pub sizes: Vec<usize>,
    /// Which contenders, in order.
    pub contenders: Vec<Contender>,
    /// The resync period of every controller.
    pub resync: Duration,
    /// How long idle writes are counted after convergence.
    pub idle: Duration,
    /// Reconciles at once (wasmop `spec.limits.concurrency`, kube-rs `Config::concurrency`,
    /// controller-runtime `MaxConcurrentReconciles`).
    pub concurrency: usize,
    /// The floor's concurrency settings; the fastest is reported.
    pub floor_concurrency: Vec<usize>,
    /// Convergence budget, if set (else per N, see [`Settings::timeout`]).
    pub timeout: Option<Duration>,
}

fn var(name: &'static str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn list(name: &'static str, value: &str) -> Result<Vec<usize>> {
    value
        .split(',')
        .map(|v| {
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| Error::Setting {
                    variable: name,
                    value: value.into(),
                    reason: format!("{v:?} is not a positive whole number"),
                })
        })
        .collect()
}

fn seconds(name: &'static str) -> Result<Option<Duration>> {
    var(name)
        .map(|v| {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e6)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| Error::Setting {
                    variable: name,
                    value: v.clone(),
                    reason: "not a positive number of seconds".into(),
                })
        })
        .transpose()
}

impl Settings {
    /// Reads the environment, with `default_sizes` when `WASMOP_BENCH_N` is unset.
    ///
    /// # Errors
    /// See the module docs.
    pub fn from_env(default_sizes: &str) -> Result<Self> {
        let sizes = list(
            "WASMOP_BENCH_N",
            &var("WASMOP_BENCH_N").unwrap_or(default_sizes.into()),
        )?;
        let contenders = match var("WASMOP_BENCH_CONTENDERS") {
            None => Contender::ALL.to_vec(),
            Some(v) => v
                .split(',')
                .map(|c| {
                    Contender::parse(c.trim()).ok_or_else(|| Error::Setting {
                        variable: "WASMOP_BENCH_CONTENDERS",
                        value: v.clone(),
                        reason: format!(
                            "{c:?} is not one of wasmop, kube-rs, controller-runtime, floor"
                        ),
                    })
                })
                .collect::<Result<_>>()?,
        };
        let resync = seconds("WASMOP_BENCH_RESYNC")?.unwrap_or(Duration::from_secs(30));
        let idle = seconds("WASMOP_BENCH_IDLE")?.unwrap_or(resync * 2 + Duration::from_secs(10));
        let concurrency = match var("WASMOP_BENCH_CONCURRENCY") {
            None => 16,
            Some(v) => list("WASMOP_BENCH_CONCURRENCY", &v)?
                .first()
                .copied()
                .unwrap_or(16)
                .min(256),
        };
        let floor_concurrency = list(
            "WASMOP_BENCH_FLOOR_CONCURRENCY",
            &var("WASMOP_BENCH_FLOOR_CONCURRENCY").unwrap_or("8,16,32".into()),
        )?;
        Ok(Settings {
            sizes,
            contenders,
            resync,
            idle,
            concurrency,
            floor_concurrency,
            timeout: seconds("WASMOP_BENCH_TIMEOUT")?,
        })
    }

    /// The convergence budget for `n` Apps.
    pub fn timeout(&self, n: usize) -> Duration {
        self.timeout
            .unwrap_or(Duration::from_secs(120) + Duration::from_millis(300 * n as u64))
    }
}
