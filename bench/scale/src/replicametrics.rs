//! What a wasmop host reports about itself on its own `/metrics`: the objects in its watch
//! caches, its reconciles and module calls, and with `--shards auto` the members it sees, its share of the hash space, the
//! primaries in its slice and where its watches are filtered.
//!
//! # Guarantees
//! - [`ReplicaReport::parse`] never fails: a series the host does not export is `None` (a host
//!   without `--shards` has no `wasmop_shard_*`).
//!
//! # Errors
//! [`Error::Other`] when `/metrics` cannot be fetched or does not answer 200.

use std::net::SocketAddr;

use crate::{Error, Result};

/// One host's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicaReport {
    /// Objects in its watch caches, every reconciler and kind (`wasmop_cache_objects`).
    pub cache_objects: Option<f64>,
    /// Reconciles it ran since it started, every reconciler and result
    /// (`wasmop_reconcile_total`).
    pub reconciles: Option<f64>,
    /// Live members it sees, itself included (`wasmop_shard_members`).
    pub members: Option<f64>,
    /// Its share of the hash space (`wasmop_shard_fraction`).
    pub fraction: Option<f64>,
    /// Primaries in its slice, every reconciler (`wasmop_shard_primaries`).
    pub primaries: Option<f64>,
    /// How its sharded watches are filtered: the `mode` labels of `wasmop_shard_watch_filter`
    /// with their counts, e.g. `server 3`.
    pub filter: Vec<(String, f64)>,
    /// Module calls by function (`wasmop_module_call_duration_seconds`, every reconciler):
    /// (function, calls, seconds in the calls).
    pub calls: Vec<(String, f64, f64)>,
    /// The highest linear-memory size a module call reached, bytes
    /// (`wasmop_module_memory_peak_bytes`, the largest over reconcilers).
    pub memory_peak: Option<f64>,
}

/// The sum of every sample of `name` (any labels), `None` if there is none.
fn sum(text: &str, name: &str) -> Option<f64> {
    let mut total = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        // `name{labels} value` or `name value`, not a longer name with the same prefix.
        let value = if let Some(labelled) = rest.strip_prefix('{') {
            labelled.rsplit_once("} ").map(|(_, v)| v)
        } else {
            rest.strip_prefix(' ')
        };
        if let Some(v) = value.and_then(|v| v.trim().parse::<f64>().ok()) {
            *total.get_or_insert(0.0) += v;
        }
    }
    total
}

/// The samples of `name` summed by the value of their label `label`.
fn by_label(text: &str, name: &str, label: &str) -> std::collections::BTreeMap<String, f64> {
    let mut sums: std::collections::BTreeMap<String, f64> = Default::default();
    let (prefix, key) = (format!("{name}{{"), format!("{label}=\""));
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(prefix.as_str()) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let of = labels
            .split(',')
            .find_map(|l| l.strip_prefix(key.as_str()))
            .map(|m| m.trim_end_matches('"').to_string())
            .unwrap_or_default();
        if let Ok(v) = value.trim().parse::<f64>() {
            *sums.entry(of).or_insert(0.0) += v;
        }
    }
    sums
}

/// `wasmop_shard_watch_filter` summed by its `mode` label.
fn filter_modes(text: &str) -> Vec<(String, f64)> {
    by_label(text, "wasmop_shard_watch_filter", "mode")
        .into_iter()
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// Module calls by function: (function, calls, seconds).
fn calls(text: &str) -> Vec<(String, f64, f64)> {
    let seconds = by_label(text, "wasmop_module_call_duration_seconds_sum", "function");
    by_label(
        text,
        "wasmop_module_call_duration_seconds_count",
        "function",
    )
    .into_iter()
    .filter(|(_, n)| *n > 0.0)
    .map(|(f, n)| {
        let s = seconds.get(&f).copied().unwrap_or(0.0);
        (f, n, s)
    })
    .collect()
}

/// The largest sample of `name` (any labels), `None` if there is none.
fn max(text: &str, name: &str) -> Option<f64> {
    let prefix = format!("{name}{{");
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .filter_map(|rest| rest.rsplit_once("} "))
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .reduce(f64::max)
}

impl ReplicaReport {
    /// Reads a Prometheus text exposition.
    pub fn parse(text: &str) -> Self {
        ReplicaReport {
            cache_objects: sum(text, "wasmop_cache_objects"),
            reconciles: sum(text, "wasmop_reconcile_total"),
            members: sum(text, "wasmop_shard_members"),
            fraction: sum(text, "wasmop_shard_fraction"),
            primaries: sum(text, "wasmop_shard_primaries"),
            filter: filter_modes(text),
            calls: calls(text),
            memory_peak: max(text, "wasmop_module_memory_peak_bytes"),
        }
    }

    /// Fetches and reads the host's `/metrics` at `addr`.
    ///
    /// # Errors
    /// See the module docs.
    pub async fn read(addr: SocketAddr) -> Result<Self> {
        Ok(Self::parse(&metrics_text(addr).await?))
    }

    /// The filter modes as text, e.g. `server` or `client 2, server 1`; `-` when none.
    pub fn filter_text(&self) -> String {
        match self.filter.as_slice() {
            [] => "-".into(),
            [(mode, _)] => mode.clone(),
            many => many
                .iter()
                .map(|(m, v)| format!("{m} {v:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// `GET /metrics` on the host's probe server (testenv's HTTP/1.0 client), within 10 s.
async fn metrics_text(addr: SocketAddr) -> Result<String> {
    let failed = |e: String| Error::Other(format!("GET /metrics on the host at {addr}: {e}"));
    let (status, body) = wasmop_testenv::host_process::http_get(addr, "/metrics")
        .await
        .map_err(|e| failed(format!("{e:#}")))?;
    if status != 200 {
        return Err(failed(format!("answered {status}")));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_series_and_reads_filter_modes() {
        let text = r#"# HELP wasmop_cache_objects x
wasmop_cache_objects{reconciler="image-updater",kind="example.wasmop.dev/v1/App"} 3334
wasmop_cache_objects{reconciler="image-updater",kind="apps/v1/Deployment"} 3334
wasmop_cache_objects_extra 99
wasmop_reconcile_total{reconciler="image-updater",result="ok"} 40
wasmop_reconcile_total{reconciler="image-updater",result="error"} 2
wasmop_shard_members 3
wasmop_shard_fraction 0.3125
wasmop_shard_primaries{reconciler="image-updater"} 3334
wasmop_shard_watch_filter{kind="apps/v1/Deployment",mode="server"} 1
wasmop_shard_watch_filter{kind="v1/Service",mode="server"} 1
wasmop_shard_watch_filter{kind="v1/ConfigMap",mode="client"} 0
wasmop_module_call_duration_seconds_sum{reconciler="image-updater",function="reconcile"} 0.5
wasmop_module_call_duration_seconds_count{reconciler="image-updater",function="reconcile"} 40
wasmop_module_call_duration_seconds_bucket{reconciler="image-updater",function="reconcile",le="0.001"} 30
wasmop_module_call_duration_seconds_count{reconciler="image-updater",function="validate"} 0
wasmop_module_memory_peak_bytes{reconciler="a"} 1048576
wasmop_module_memory_peak_bytes{reconciler="b"} 2097152
"#;
        let r = ReplicaReport::parse(text);
        assert_eq!(r.cache_objects, Some(6668.0));
        assert_eq!(r.members, Some(3.0));
        assert_eq!(r.reconciles, Some(42.0));
        assert_eq!(r.fraction, Some(0.3125));
        assert_eq!(r.primaries, Some(3334.0));
        assert_eq!(r.filter_text(), "server");
        assert_eq!(r.calls, vec![("reconcile".to_string(), 40.0, 0.5)]);
        assert_eq!(r.memory_peak, Some(2097152.0));
        let plain = ReplicaReport::parse("wasmop_reconcile_total{result=\"ok\"} 5\n");
        assert_eq!(plain.members, None);
        assert_eq!(plain.reconciles, Some(5.0));
        assert_eq!(plain.filter_text(), "-");
        assert!(plain.calls.is_empty());
        assert_eq!(plain.memory_peak, None);
    }
}
