//! `wasmop push MODULE.wasm --name NAME [-n NAMESPACE] [--dry-run]`: put a module in a ConfigMap.

use std::path::PathBuf;
use std::process::ExitCode;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};

use super::{CliError, engine, to_yaml};
use crate::engine::Limits;
use crate::host::kube_config;
use crate::modules::source;

/// Arguments of `push`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The module (a `.wasm` component).
    pub module: PathBuf,
    /// The ConfigMap's name.
    #[arg(long)]
    pub name: String,
    /// The ConfigMap's namespace.
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
    /// Print the ConfigMap as YAML instead of writing it.
    #[arg(long)]
    pub dry_run: bool,
    /// The kubeconfig to use.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

pub(crate) async fn run(args: Args) -> Result<ExitCode, CliError> {
    let bytes = std::fs::read(&args.module).map_err(CliError::read(&args.module))?;
    eprintln!(
        "checking {} ({} bytes)...",
        args.module.display(),
        bytes.len()
    );
    let module = {
        let (bytes, path) = (bytes.clone(), args.module.clone());
        super::off_runtime(move || {
            engine(true)?
                .load(&bytes, &Limits::default())
                .map_err(|source| CliError::Load { path, source })
        })
        .await?
    };
    let m = module.metadata();
    eprintln!(
        "module {} {} for {}, sha256 {}",
        m.name,
        m.version,
        m.primary,
        module.sha256()
    );
    let cm = source::to_config_map(
        &args.name,
        &args.namespace,
        &bytes,
        &m.name,
        &m.version,
        module.sha256(),
    )
    .map_err(|e| CliError::Other(format!("cannot compress the module: {e}")))?;
    let stored: usize = cm
        .binary_data
        .iter()
        .flatten()
        .map(|(_, v)| v.0.len())
        .sum();
    if stored >= 1 << 20 {
        return Err(CliError::Other(format!(
            "the module is {stored} bytes even compressed, over the 1 MiB a ConfigMap holds; build it smaller (opt-level \"s\", strip, fewer dependencies)"
        )));
    }
    if args.dry_run {
        print!("{}", to_yaml(&cm));
        return Ok(ExitCode::SUCCESS);
    }
    let config = kube_config(args.kubeconfig.as_ref())
        .await
        .map_err(|e| CliError::Other(e.to_string()))?;
    let client = kube::Client::try_from(config).map_err(|e| CliError::Other(e.to_string()))?;
    let api: Api<ConfigMap> = Api::namespaced(client, &args.namespace);
    eprintln!(
        "writing ConfigMap {}/{} ({stored} bytes stored)...",
        args.namespace, args.name
    );
    api.patch(
        &args.name,
        &PatchParams::apply("wasmop-push").force(),
        &Patch::Apply(&cm),
    )
    .await
    .map_err(|e| {
        CliError::Other(format!(
            "cannot write ConfigMap {}/{}: {e}",
            args.namespace, args.name
        ))
    })?;
    println!(
        "configmap/{} pushed (sha256 {})",
        args.name,
        module.sha256()
    );
    Ok(ExitCode::SUCCESS)
}
