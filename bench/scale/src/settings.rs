//! What a benchmark run measures, from the environment.
//!
//! - `WASMOP_BENCH_N`: comma list of App counts (default `1000,10000`).
//! - `WASMOP_BENCH_CONTENDERS`: comma list of `wasmop`, `kube-rs`, `controller-runtime`,
//!   `floor`, `wasmop-sharded`, `wasmop-metacontroller` (default all).
//! - `WASMOP_BENCH_RESYNC`: the resync period in seconds, applied to every controller
//!   (default 30).
//! - `WASMOP_BENCH_IDLE`: seconds of idle measurement after convergence (default two resync
//!   periods plus 10 s).
//! - `WASMOP_BENCH_CONCURRENCY`: reconciles at once in every controller (default 16).
//! - `WASMOP_BENCH_FLOOR_CONCURRENCY`: the floor's concurrency settings (default `8,16,32`).
//! - `WASMOP_BENCH_TIMEOUT`: seconds allowed for convergence (default 120 + 0.3 s per App).
//! - `WASMOP_BENCH_REPLICAS`: the replica counts of `wasmop-sharded`, one row each (default
//!   `1,2,3`, at most 16).
//! - `WASMOP_BENCH_NAMESPACES`: how many namespaces `wasmop-sharded` spreads the Apps over
//!   (default 100; never more than the Apps). Namespaced primaries shard by namespace, so Apps
//!   in one namespace would all land on one replica.
//! - `WASMOP_BENCH_WASMOP_ARGS`: extra `wasmop run` flags, space-separated (e.g.
//!   `--kube-qps 0`), read by [`crate::contenders::wasmop`].
//! - `WASMOP_BENCH_CHARTS`: the directory the SVG charts go to (default `<target>/bench`, see
//!   [`crate::chart`]).
//!
//! # Errors
//! [`Error::Setting`] for a value that does not parse or is out of range.

use std::path::PathBuf;
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
    /// The replica counts `wasmop-sharded` runs with, one row each.
    pub replicas: Vec<usize>,
    /// Namespaces `wasmop-sharded` spreads the Apps over.
    pub namespaces: usize,
    /// Where the charts go, if set (else the bench's default).
    pub charts: Option<PathBuf>,
}

/// Most replicas a row may start (each is a host process with its own module compile).
pub const MAX_REPLICAS: usize = 16;

/// Where settings come from: the environment, or a map in unit tests.
type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

fn var(lookup: Lookup<'_>, name: &'static str) -> Option<String> {
    lookup(name).filter(|v| !v.trim().is_empty())
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

fn seconds(lookup: Lookup<'_>, name: &'static str) -> Result<Option<Duration>> {
    var(lookup, name)
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
        Self::from_lookup(default_sizes, &|name: &str| std::env::var(name).ok())
    }

    /// As [`Settings::from_env`], reading variables through `lookup`.
    ///
    /// # Errors
    /// See the module docs.
    pub fn from_lookup(default_sizes: &str, lookup: Lookup<'_>) -> Result<Self> {
        let var = |name| var(lookup, name);
        let seconds = |name| seconds(lookup, name);
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
                            "{c:?} is not one of wasmop, kube-rs, controller-runtime, floor, wasmop-sharded, wasmop-metacontroller"
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
        let replicas = list(
            "WASMOP_BENCH_REPLICAS",
            &var("WASMOP_BENCH_REPLICAS").unwrap_or("1,2,3".into()),
        )?;
        if let Some(r) = replicas.iter().find(|r| **r > MAX_REPLICAS) {
            return Err(Error::Setting {
                variable: "WASMOP_BENCH_REPLICAS",
                value: var("WASMOP_BENCH_REPLICAS").unwrap_or_default(),
                reason: format!("{r} replicas: at most {MAX_REPLICAS}"),
            });
        }
        let namespaces = match var("WASMOP_BENCH_NAMESPACES") {
            None => 100,
            Some(v) => list("WASMOP_BENCH_NAMESPACES", &v)?
                .first()
                .copied()
                .unwrap_or(100),
        };
        Ok(Settings {
            replicas,
            namespaces,
            sizes,
            contenders,
            resync,
            idle,
            concurrency,
            floor_concurrency,
            timeout: seconds("WASMOP_BENCH_TIMEOUT")?,
            charts: var("WASMOP_BENCH_CHARTS").map(PathBuf::from),
        })
    }

    /// The convergence budget for `n` Apps.
    pub fn timeout(&self, n: usize) -> Duration {
        self.timeout
            .unwrap_or(Duration::from_secs(120) + Duration::from_millis(300 * n as u64))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Settings> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup("1000,10000", &move |name: &str| map.get(name).cloned())
    }

    #[test]
    fn defaults_include_the_sharded_rows() -> Result<()> {
        let s = settings(&[])?;
        assert_eq!(s.sizes, vec![1000, 10000]);
        assert!(s.contenders.contains(&Contender::WasmopSharded));
        assert_eq!(s.replicas, vec![1, 2, 3]);
        assert_eq!(s.namespaces, 100);
        assert_eq!(s.charts, None);
        Ok(())
    }

    #[test]
    fn parses_replicas_namespaces_and_the_sharded_contender() -> Result<()> {
        let s = settings(&[
            ("WASMOP_BENCH_CONTENDERS", "floor, wasmop-sharded"),
            ("WASMOP_BENCH_REPLICAS", "2, 3"),
            ("WASMOP_BENCH_NAMESPACES", "40"),
            ("WASMOP_BENCH_N", " "),
            ("WASMOP_BENCH_CHARTS", "/tmp/charts"),
        ])?;
        assert_eq!(s.charts, Some(PathBuf::from("/tmp/charts")));
        assert_eq!(
            s.contenders,
            vec![Contender::Floor, Contender::WasmopSharded]
        );
        assert_eq!(s.replicas, vec![2, 3]);
        assert_eq!(s.namespaces, 40);
        assert_eq!(s.sizes, vec![1000, 10000], "a blank variable is unset");
        Ok(())
    }

    #[test]
    fn refuses_bad_replica_counts_and_names() {
        for (var, value) in [
            ("WASMOP_BENCH_REPLICAS", "0"),
            ("WASMOP_BENCH_REPLICAS", "2,x"),
            ("WASMOP_BENCH_REPLICAS", "17"),
            ("WASMOP_BENCH_NAMESPACES", "-1"),
            ("WASMOP_BENCH_CONTENDERS", "wasmop-shards"),
        ] {
            match settings(&[(var, value)]) {
                Err(Error::Setting { variable, .. }) => assert_eq!(variable, var),
                other => panic!("{var}={value}: {other:?}"),
            }
        }
    }
}
