//! `wasmop run`: the operator host.

use std::path::PathBuf;
use std::process::ExitCode;

use super::{CliError, cache_dir};
use crate::crd::parse_duration;
use crate::host::{Host, HostOptions};

/// Arguments of `run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The kubeconfig to use (default: in-cluster, then $KUBECONFIG, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Where compiled modules are cached (default: $WASMOP_CACHE/compiled).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// The resync period of WasmReconcilers that do not set one.
    #[arg(long, default_value = "10m")]
    pub resync: String,
    /// Serve only WasmReconcilers matching this label selector (e.g. `shard=a`).
    #[arg(long)]
    pub selector: Option<String>,
}

pub(crate) async fn run(args: Args) -> Result<ExitCode, CliError> {
    let resync =
        parse_duration(&args.resync).map_err(|e| CliError::Other(format!("--resync: {e}")))?;
    let options = HostOptions {
        kubeconfig: args.kubeconfig,
        cache_dir: Some(
            args.cache_dir
                .unwrap_or_else(|| cache_dir().join("compiled")),
        ),
        resync,
        selector: args.selector,
        ..HostOptions::default()
    };
    let mut host = Host::start(options)
        .await
        .map_err(|e| CliError::Other(e.to_string()))?;
    tracing::info!(version = crate::VERSION, "wasmop host started");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| CliError::Other(format!("cannot listen for SIGTERM: {e}")))?;
    tokio::select! {
        r = host.wait() => {
            r.map_err(|e| CliError::Other(e.to_string()))?;
            return Ok(ExitCode::FAILURE);
        }
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down: finishing running reconciles");
    host.shutdown()
        .await
        .map_err(|e| CliError::Other(e.to_string()))?;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}
