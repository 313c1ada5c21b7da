//! The contenders and how each controller process is started.
//!
//! - [`wasmop`]: `wasmop run` with the image-updater module and the example's WasmReconciler.
//! - [`sharded`]: k `wasmop run --shards auto` replicas sharing the Apps, on a control plane with
//!   the `ShardedListAndWatch` feature gate.
//! - [`metacontroller`]: the same logic as a Metacontroller hook (JavaScript), served by
//!   `wasmop run` through a CompositeController with `spec.wasmop`.
//! - [`child`]: the native kube-rs operator, the Go operator and the floor, which print `READY`.
//! - [`gobuild`]: builds the Go controller-runtime operator once, cached by a hash of its sources.
//!
//! # Errors
//! [`Error::Controller`] when a controller does not start or become ready.

pub mod child;
pub mod gobuild;
pub mod metacontroller;
pub mod sharded;
pub mod wasmop;

use std::path::PathBuf;
use std::time::Duration;

use crate::Result;
use crate::cluster::Cluster;
use crate::converge::Layout;
use crate::replicametrics::ReplicaReport;

/// One contender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contender {
    /// `wasmop run` with the image-updater module.
    Wasmop,
    /// The same logic on kube-runtime's Controller.
    KubeRs,
    /// The same logic on controller-runtime (Go).
    ControllerRuntime,
    /// A bare client: the writes convergence needs, nothing else.
    Floor,
    /// `wasmop run --shards auto` replicas sharing the Apps ([`Tuning::replicas`] of them).
    WasmopSharded,
    /// `wasmop run` serving the same logic as a Metacontroller hook (JavaScript) through a
    /// CompositeController with `spec.wasmop`.
    WasmopMetacontroller,
}

impl Contender {
    /// Every contender, in report order.
    pub const ALL: [Contender; 6] = [
        Contender::Floor,
        Contender::Wasmop,
        Contender::KubeRs,
        Contender::ControllerRuntime,
        Contender::WasmopSharded,
        Contender::WasmopMetacontroller,
    ];

    /// Its name in settings and tables.
    pub fn name(self) -> &'static str {
        match self {
            Contender::Wasmop => "wasmop",
            Contender::KubeRs => "kube-rs",
            Contender::ControllerRuntime => "controller-runtime",
            Contender::Floor => "floor",
            Contender::WasmopSharded => "wasmop-sharded",
            Contender::WasmopMetacontroller => "wasmop-metacontroller",
        }
    }

    /// Its name in a table row: `wasmop xK` for K sharded replicas.
    pub fn label(self, tuning: &Tuning) -> String {
        match self {
            Contender::WasmopSharded => format!("wasmop x{}", tuning.replicas),
            other => other.name().into(),
        }
    }

    /// Where its Apps live: spread over namespaces when sharded (namespaced primaries shard by
    /// namespace), else all in `demo`.
    pub fn layout(self, namespaces: usize) -> Layout {
        match self {
            Contender::WasmopSharded => Layout::Spread(namespaces),
            _ => Layout::One,
        }
    }

    /// The kube-apiserver feature gates its control plane gets.
    pub fn feature_gates(self) -> Vec<String> {
        match self {
            Contender::WasmopSharded => vec![sharded::FEATURE_GATE.into()],
            _ => Vec::new(),
        }
    }

    /// Parses [`Contender::name`].
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The client-side rate limit it runs with.
    pub fn client_limit(self) -> &'static str {
        match self {
            Contender::Wasmop | Contender::WasmopMetacontroller => {
                "host default --kube-qps 500 --kube-burst 1000, shared by all its clients"
            }
            Contender::WasmopSharded => "host default --kube-qps 500 --kube-burst 1000 per replica",
            Contender::KubeRs | Contender::Floor => {
                "none (kube-rs client has no client-side limit)"
            }
            Contender::ControllerRuntime => "none (client-go QPS -1: rate limiter off)",
        }
    }
}

/// The programs the contenders run.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `wasmop`.
    pub wasmop: PathBuf,
    /// The image-updater module (wasm32-wasip2 component).
    pub module: PathBuf,
    /// The image-updater hook module (world `hook`, [`metacontroller::build_hook`]).
    pub hook: PathBuf,
    /// `scale-kube-rs`.
    pub kube_rs: PathBuf,
    /// The Go operator.
    pub controller_runtime: PathBuf,
    /// `scale-floor`.
    pub floor: PathBuf,
}

/// How a controller runs: its settings.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// Reconciles at once (the floor: writes at once; sharded: per replica).
    pub concurrency: usize,
    /// The resync period.
    pub resync: Duration,
    /// Processes sharing the work (1 unless sharded).
    pub replicas: usize,
    /// Where the Apps live.
    pub layout: Layout,
}

impl Tuning {
    /// One process, the Apps in `demo`.
    pub fn single(concurrency: usize, resync: Duration) -> Self {
        Tuning {
            concurrency,
            resync,
            replicas: 1,
            layout: Layout::One,
        }
    }
}

/// A running controller process.
#[derive(Debug)]
pub enum Running {
    /// wasmop's host.
    Host(Box<wasmop_testenv::HostProcess>),
    /// A child that printed READY.
    Child(Box<child::Child>),
    /// Sharded hosts, one per replica.
    Replicas(Vec<wasmop_testenv::HostProcess>),
    /// wasmop's host serving a hook module, and the registry it was pulled from.
    Hook {
        /// The host.
        host: Box<wasmop_testenv::HostProcess>,
        /// The registry (stopped when dropped).
        registry: Box<wasmop_testenv::Registry>,
    },
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Running {
    /// Its process ids, one per process (`None` for one that is not running).
    pub fn pids(&self) -> Vec<Option<u32>> {
        match self {
            Running::Host(h) | Running::Hook { host: h, .. } => vec![h.pid()],
            Running::Child(c) => vec![c.pid()],
            Running::Replicas(hosts) => hosts.iter().map(|h| h.pid()).collect(),
        }
    }

    /// The tail of its log (of each replica's), for a failure report.
    pub fn log_tail(&self) -> String {
        match self {
            Running::Host(h) | Running::Hook { host: h, .. } => tail(&h.log_text(), 40),
            Running::Child(c) => tail(&c.log_text(), 40),
            Running::Replicas(hosts) => hosts
                .iter()
                .enumerate()
                .map(|(i, h)| format!("replica {i}:\n{}", tail(&h.log_text(), 20)))
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// Whether it (any of its processes) has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self {
            Running::Host(h) | Running::Hook { host: h, .. } => {
                h.pid().is_none().then(|| "the host is not running".into())
            }
            Running::Child(c) => c.exited(),
            Running::Replicas(hosts) => hosts
                .iter()
                .position(|h| h.pid().is_none())
                .map(|i| format!("replica {i} is not running")),
        }
    }

    /// What each wasmop host reports on its `/metrics` (empty for other contenders).
    ///
    /// # Errors
    /// If a host's `/metrics` cannot be read.
    pub async fn reports(&self) -> Result<Vec<ReplicaReport>> {
        let hosts: Vec<&wasmop_testenv::HostProcess> = match self {
            Running::Host(h) | Running::Hook { host: h, .. } => vec![h],
            Running::Child(_) => Vec::new(),
            Running::Replicas(hosts) => hosts.iter().collect(),
        };
        let mut out = Vec::new();
        for h in hosts {
            out.push(ReplicaReport::read(h.metrics_addr()).await?);
        }
        Ok(out)
    }
}

/// Sets up what `contender` needs in the cluster and starts it, ready to reconcile.
///
/// # Errors
/// See the module docs.
pub async fn start(
    contender: Contender,
    cluster: &Cluster,
    binaries: &Binaries,
    tuning: Tuning,
    dir: &std::path::Path,
) -> Result<Running> {
    let kubeconfig = cluster.kubeconfig();
    let ns = crate::cluster::NAMESPACE;
    match contender {
        Contender::Wasmop => wasmop::start(cluster, binaries, tuning, dir).await,
        Contender::WasmopSharded => sharded::start(cluster, binaries, tuning, dir).await,
        Contender::WasmopMetacontroller => {
            metacontroller::start(cluster, binaries, tuning, dir).await
        }
        Contender::KubeRs => child::Child::start(
            contender.name(),
            &binaries.kube_rs,
            &[
                ns.into(),
                tuning.concurrency.to_string(),
                tuning.resync.as_secs_f64().to_string(),
            ],
            kubeconfig,
            dir,
        )
        .await
        .map(|c| Running::Child(Box::new(c))),
        Contender::ControllerRuntime => child::Child::start(
            contender.name(),
            &binaries.controller_runtime,
            &[
                format!("--namespace={ns}"),
                format!("--concurrency={}", tuning.concurrency),
                format!("--resync={}ms", tuning.resync.as_millis()),
            ],
            kubeconfig,
            dir,
        )
        .await
        .map(|c| Running::Child(Box::new(c))),
        Contender::Floor => child::Child::start(
            contender.name(),
            &binaries.floor,
            &[ns.into(), tuning.concurrency.to_string()],
            kubeconfig,
            dir,
        )
        .await
        .map(|c| Running::Child(Box::new(c))),
    }
}
