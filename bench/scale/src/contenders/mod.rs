//! The contenders and how each controller process is started.
//!
//! - [`wasmop`]: `wasmop run` with the image-updater module and the example's WasmReconciler.
//! - [`child`]: the native kube-rs operator, the Go operator and the floor, which print `READY`.
//! - [`gobuild`]: builds the Go controller-runtime operator once, cached by a hash of its sources.
//!
//! # Errors
//! [`Error::Controller`] when a controller does not start or become ready.

pub mod child;
pub mod gobuild;
pub mod wasmop;

use std::path::PathBuf;
use std::time::Duration;

use crate::Result;
use crate::cluster::Cluster;

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
}

impl Contender {
    /// Every contender, in report order.
    pub const ALL: [Contender; 4] = [
        Contender::Floor,
        Contender::Wasmop,
        Contender::KubeRs,
        Contender::ControllerRuntime,
    ];

    /// Its name in settings and tables.
    pub fn name(self) -> &'static str {
        match self {
            Contender::Wasmop => "wasmop",
            Contender::KubeRs => "kube-rs",
            Contender::ControllerRuntime => "controller-runtime",
            Contender::Floor => "floor",
        }
    }

    /// Parses [`Contender::name`].
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The client-side rate limit it runs with.
    pub fn client_limit(self) -> &'static str {
        match self {
            Contender::Wasmop => {
                "host default --kube-qps 500 --kube-burst 1000, shared by all its clients"
            }
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
    /// Reconciles at once (the floor: writes at once).
    pub concurrency: usize,
    /// The resync period.
    pub resync: Duration,
}

/// A running controller process.
#[derive(Debug)]
pub enum Running {
    /// wasmop's host.
    Host(Box<wasmop_testenv::HostProcess>),
    /// A child that printed READY.
    Child(Box<child::Child>),
}

impl Running {
    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        match self {
            Running::Host(h) => h.pid(),
            Running::Child(c) => c.pid(),
        }
    }

    /// The tail of its log, for a failure report.
    pub fn log_tail(&self) -> String {
        let text = match self {
            Running::Host(h) => h.log_text(),
            Running::Child(c) => c.log_text(),
        };
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self {
            Running::Host(h) => h.pid().is_none().then(|| "the host is not running".into()),
            Running::Child(c) => c.exited(),
        }
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
