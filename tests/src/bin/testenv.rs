//! `testenv`: provide and run the local control plane for people and scripts.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use wasmop_testenv::{Assets, ControlPlane, Options};

/// A real local Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager,
/// kube-scheduler and kwok fake nodes.
#[derive(Debug, Parser)]
#[command(name = "testenv")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Find or build every tool the tests use (into the cache), and print their paths: the
    /// control plane, the registry, the collector, crane and cosign.
    Provision,
    /// Print the path of one provided binary (etcd, kube-apiserver, kubectl, kwok, registry,
    /// cosign, crane, helm, promtool, ...), building it first if needed.
    Which {
        /// The binary's name.
        binary: String,
    },
    /// Start a cluster, print `export KUBECONFIG=...`, and keep it up until Ctrl-C or SIGTERM.
    Cluster {
        /// Number of kwok nodes.
        #[arg(long, default_value_t = 2)]
        nodes: usize,
        /// Also write the kubeconfig path to this file once the cluster is ready (for scripts).
        #[arg(long)]
        kubeconfig_out: Option<PathBuf>,
    },
}

/// Finds or builds one tool binary.
type Provide = fn() -> wasmop_testenv::Result<PathBuf>;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("testenv: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Cmd::Provision => {
            let start = Instant::now();
            let assets = tokio::task::spawn_blocking(Assets::provide).await??;
            println!("{assets:#?}");
            let registry =
                tokio::task::spawn_blocking(wasmop_testenv::assets::registry_binary).await??;
            println!("registry: {}", registry.display());
            let otelcol =
                tokio::task::spawn_blocking(wasmop_testenv::assets::otelcol_binary).await??;
            println!("otelcol: {}", otelcol.display());
            // The deploy test assembles the host image with it (`make image`).
            let crane = tokio::task::spawn_blocking(wasmop_testenv::assets::crane_binary).await??;
            println!("crane: {}", crane.display());
            // The module-signing tests check compatibility with it in both directions.
            let cosign =
                tokio::task::spawn_blocking(wasmop_testenv::assets::cosign_binary).await??;
            println!("cosign: {}", cosign.display());
            // The chart tests and the deploy test's `helm install` (deploy/helm/wasmop).
            let helm = tokio::task::spawn_blocking(wasmop_testenv::assets::helm_binary).await??;
            println!("helm: {}", helm.display());
            // The alert rules' checks and unit tests (deploy/monitoring/).
            let promtool =
                tokio::task::spawn_blocking(wasmop_testenv::assets::promtool_binary).await??;
            println!("promtool: {}", promtool.display());
            eprintln!("provisioned in {:.1}s", start.elapsed().as_secs_f64());
        }
        Cmd::Which { binary } => {
            let tool = match binary.as_str() {
                "registry" => Some(wasmop_testenv::assets::registry_binary as Provide),
                "cosign" => Some(wasmop_testenv::assets::cosign_binary as Provide),
                "crane" => Some(wasmop_testenv::assets::crane_binary as Provide),
                "helm" => Some(wasmop_testenv::assets::helm_binary as Provide),
                "promtool" => Some(wasmop_testenv::assets::promtool_binary as Provide),
                _ => None,
            };
            if let Some(provide) = tool {
                let path = tokio::task::spawn_blocking(provide).await??;
                println!("{}", path.display());
                return Ok(());
            }
            let assets = tokio::task::spawn_blocking(Assets::provide).await??;
            let path = match binary.as_str() {
                "etcd" => assets.etcd,
                "kube-apiserver" => assets.kube_apiserver,
                "kube-controller-manager" => assets.kube_controller_manager,
                "kube-scheduler" => assets.kube_scheduler,
                "kubectl" => assets.kubectl,
                "kwok" => assets.kwok,
                other => anyhow::bail!(
                    "unknown binary {other:?}: one of etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok, registry, cosign, crane, helm, promtool"
                ),
            };
            println!("{}", path.display());
        }
        Cmd::Cluster {
            nodes,
            kubeconfig_out,
        } => {
            let start = Instant::now();
            let cp = ControlPlane::start(Options {
                nodes,
                ..Options::default()
            })
            .await?;
            let bin_dir = cp
                .assets()
                .kubectl
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            eprintln!(
                "control plane ready in {:.1}s ({} kwok nodes Ready); component logs: {}",
                start.elapsed().as_secs_f64(),
                cp.nodes().len(),
                cp.log_dir().display()
            );
            eprintln!(
                "kubectl {} is in {bin_dir}",
                wasmop_testenv::assets::KUBERNETES_VERSION
            );
            println!("export KUBECONFIG={}", cp.kubeconfig().display());
            if let Some(out) = kubeconfig_out {
                std::fs::write(&out, cp.kubeconfig().display().to_string())?;
            }
            eprintln!("press Ctrl-C to stop");
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            eprintln!("stopping the control plane...");
            drop(cp);
            eprintln!("stopped");
        }
    }
    Ok(())
}
