//! wasmop sharded: k `wasmop run --shards auto` processes, each its own member (the host makes
//! a per-process identity), in one shard group with their member Leases in [`HOST_NAMESPACE`],
//! on a control plane with the [`FEATURE_GATE`] on, sharing the Apps of one WasmReconciler that
//! watches every namespace. The member Lease timings are the defaults (lease 15 s, renew
//! deadline 10 s, retry period 2 s), as a user runs it.
//!
//! # Guarantees
//! - [`start`] returns once every replica serves (`/readyz` 200, optimized build serving) and
//!   the membership has settled: every replica sees k live members and their shares of the
//!   hash space (`wasmop_shard_fraction`, published only for ranges a member verified it alone
//!   holds) are all positive and sum to 1. Apps created after that have exactly one owner from
//!   the start, and the convergence time holds no handover.
//!
//! # Errors
//! [`Error::Controller`] when a replica does not start or the membership does not settle within
//! [`SETTLE`], with every replica's log tail.

use std::path::Path;
use std::time::{Duration, Instant};

use wasmop_testenv::HostProcess;

use super::{Binaries, Running, Tuning, wasmop};
use crate::cluster::Cluster;
use crate::replicametrics::ReplicaReport;
use crate::{Error, Result};

/// The kube-apiserver feature gate of server-side sharded list and watch (KEP-5866).
pub const FEATURE_GATE: &str = "ShardedListAndWatch";
/// Where the replicas keep their member Leases (`--namespace`).
pub const HOST_NAMESPACE: &str = "wasmop-system";
/// How long the membership may take to settle once every replica serves.
pub const SETTLE: Duration = Duration::from_secs(120);

fn failed(detail: String) -> Error {
    Error::Controller {
        contender: "wasmop-sharded".into(),
        detail,
    }
}

/// Whether the replicas' reports show a settled membership of `k`: each sees `k` members, each
/// holds a positive share, and the shares sum to 1.
pub fn settled(reports: &[ReplicaReport], k: usize) -> bool {
    let shares: Vec<f64> = reports.iter().filter_map(|r| r.fraction).collect();
    reports.len() == k
        && shares.len() == k
        && reports.iter().all(|r| r.members == Some(k as f64))
        && shares.iter().all(|s| *s > 0.0)
        && (shares.iter().sum::<f64>() - 1.0).abs() < 1e-6
}

async fn reports(hosts: &[HostProcess]) -> Result<Vec<ReplicaReport>> {
    let mut out = Vec::new();
    for h in hosts {
        out.push(ReplicaReport::read(h.metrics_addr()).await?);
    }
    Ok(out)
}

/// Registers the module and starts `tuning.replicas` sharded hosts, one after the other.
///
/// # Errors
/// See the module docs.
pub async fn start(
    cluster: &Cluster,
    binaries: &Binaries,
    tuning: Tuning,
    dir: &Path,
) -> Result<Running> {
    wasmop::register(cluster, binaries, tuning).await?;
    cluster.namespaces(&[HOST_NAMESPACE.to_string()]).await?;
    let k = tuning.replicas.max(1);
    let mut hosts = Vec::new();
    for i in 0..k {
        // Each replica has its own compiled-module cache, as a pod of its own would.
        let own = dir.join(format!("replica-{i}"));
        let extra = ["--namespace", HOST_NAMESPACE, "--shards", "auto"].map(str::to_string);
        // No webhook: replicas serving admission need one serving certificate (`--shards auto`
        // refuses otherwise), which the bench does not make; so these rows write each App's
        // finalizer with a request of the host's own, as a host without its webhook does.
        let args = wasmop::host_args(cluster, &own, "off", &extra);
        hosts.push(wasmop::serve(&binaries.wasmop, args, &own).await?);
    }
    let began = Instant::now();
    loop {
        let now = reports(&hosts).await?;
        if settled(&now, k) {
            let shares: Vec<String> = now
                .iter()
                .map(|r| format!("{:.3}", r.fraction.unwrap_or(0.0)))
                .collect();
            eprintln!(
                "[bench] wasmop x{k}: membership settled {:.1} s after the last replica served: {k} members, shares of the hash space [{}]; creating the Apps only now",
                began.elapsed().as_secs_f64(),
                shares.join(", ")
            );
            return Ok(Running::Replicas(hosts));
        }
        if began.elapsed() > SETTLE {
            let running = Running::Replicas(hosts);
            return Err(failed(format!(
                "the membership of {k} replicas did not settle within {SETTLE:?} (last reports {now:?}); logs:\n{}",
                running.log_tail()
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(members: f64, fraction: f64) -> ReplicaReport {
        ReplicaReport {
            members: Some(members),
            fraction: Some(fraction),
            ..Default::default()
        }
    }

    #[test]
    fn settled_needs_every_member_seen_and_the_whole_space_held() {
        assert!(settled(&[report(1.0, 1.0)], 1));
        assert!(settled(&[report(2.0, 0.4), report(2.0, 0.6)], 2));
        // One replica still sees itself alone.
        assert!(!settled(&[report(1.0, 0.4), report(2.0, 0.6)], 2));
        // A range not yet claimed.
        assert!(!settled(&[report(2.0, 0.4), report(2.0, 0.5)], 2));
        // A replica holding nothing yet.
        assert!(!settled(&[report(2.0, 0.0), report(2.0, 1.0)], 2));
        // A host without sharding metrics.
        assert!(!settled(&[ReplicaReport::default()], 1));
    }
}
