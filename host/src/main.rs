//! The `wasmop` command.

use clap::Parser;

/// A WebAssembly-hosted reconcile runtime for Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "wasmop", version = wasmop::VERSION)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    Ok(())
}
