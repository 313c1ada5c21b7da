//! `wasmop push MODULE.wasm --name NAME [-n NAMESPACE] [--dry-run]`: put a module in a ConfigMap;
//! `wasmop push MODULE.wasm --oci REGISTRY/REPOSITORY:TAG`: push it to an OCI registry as a Wasm
//! artifact, and print the reference by digest to pin in `spec.module.oci.reference`; with
//! `--sign KEYFILE`, also sign it the way `cosign sign --key` does.

use std::path::PathBuf;
use std::process::ExitCode;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};

use super::kubeconfig::Connection;
use super::{CliError, engine, to_yaml};
use crate::engine::Limits;
use crate::modules::{oci, signature, source};

/// Arguments of `push`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The module (a `.wasm` component).
    pub module: PathBuf,
    /// The ConfigMap's name.
    #[arg(long, required_unless_present = "oci")]
    pub name: Option<String>,
    /// Push to this OCI reference (`registry/repository:tag`) instead of a ConfigMap.
    #[arg(long, conflicts_with_all = ["name", "dry_run"])]
    pub oci: Option<String>,
    /// The registry user name (with --oci; anonymous without it).
    #[arg(long, env = "WASMOP_REGISTRY_USERNAME", requires = "oci")]
    pub registry_username: Option<String>,
    /// The registry password.
    #[arg(
        long,
        env = "WASMOP_REGISTRY_PASSWORD",
        hide_env_values = true,
        requires = "oci"
    )]
    pub registry_password: Option<String>,
    /// A PEM file of CA certificates to trust for the registry, besides the system roots.
    #[arg(long, requires = "oci")]
    pub ca_bundle: Option<PathBuf>,
    /// Sign the pushed module with this private key (cosign's, from `cosign generate-key-pair`,
    /// or a PKCS#8 PEM ECDSA P-256 key), as `cosign sign --key` does: the signature goes to
    /// the `sha256-<digest>.sig` tag, beside the signatures already there (other keys').
    #[arg(long, value_name = "KEYFILE", requires = "oci")]
    pub sign: Option<PathBuf>,
    /// The password of an encrypted --sign key (cosign's variable).
    #[arg(
        long,
        env = "COSIGN_PASSWORD",
        hide_env_values = true,
        default_value = ""
    )]
    pub sign_password: String,
    /// The ConfigMap's namespace (default: the context's namespace, as kubectl's; with
    /// --dry-run and no cluster configuration, `default`).
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// Print the ConfigMap as YAML instead of writing it.
    #[arg(long)]
    pub dry_run: bool,
    /// kubectl's connection flags.
    #[command(flatten)]
    pub connection: Connection,
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
    if let Some(reference) = &args.oci {
        return push_oci(&args, reference, bytes, &module).await;
    }
    let name = args.name.clone().unwrap_or_default();
    let namespace = match (&args.namespace, args.dry_run) {
        (Some(ns), _) => ns.clone(),
        // A dry run needs no cluster: without one configured, `default`; flags that name a
        // kubeconfig or context must work, though.
        (None, true) if !args.connection.is_given() => args
            .connection
            .config()
            .await
            .map_or_else(|_| "default".to_string(), |c| c.default_namespace),
        (None, _) => args.connection.config().await?.default_namespace,
    };
    let cm = source::to_config_map(
        &name,
        &namespace,
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
    let (client, _, namespace) = args.connection.client(Some(&namespace)).await?;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    eprintln!("writing ConfigMap {namespace}/{name} ({stored} bytes stored)...");
    api.patch(
        &name,
        &PatchParams::apply("wasmop-push").force(),
        &Patch::Apply(&cm),
    )
    .await
    .map_err(|e| CliError::Other(format!("cannot write ConfigMap {namespace}/{name}: {e}")))?;
    println!("configmap/{} pushed (sha256 {})", name, module.sha256());
    Ok(ExitCode::SUCCESS)
}

/// Pushes the module to `reference` and prints the reference by digest.
async fn push_oci(
    args: &Args,
    reference: &str,
    bytes: Vec<u8>,
    module: &crate::engine::Module,
) -> Result<ExitCode, CliError> {
    let auth = match (&args.registry_username, &args.registry_password) {
        (Some(u), Some(p)) => Some((u.clone(), p.clone())),
        (None, None) => None,
        _ => {
            return Err(CliError::Other(
                "--registry-username and --registry-password go together".into(),
            ));
        }
    };
    let ca_pem = match &args.ca_bundle {
        Some(path) => Some(std::fs::read_to_string(path).map_err(CliError::read(path))?),
        None => None,
    };
    // The key is opened before anything is pushed: a wrong password fails early.
    let key = match &args.sign {
        Some(path) => {
            let pem = std::fs::read(path).map_err(CliError::read(path))?;
            let source = path.display().to_string();
            let key = signature::SigningKey::from_pem(&pem, args.sign_password.as_bytes(), &source)
                .map_err(|e| CliError::Other(e.to_string()))?;
            Some(key)
        }
        None => None,
    };
    let m = module.metadata();
    let annotations = std::collections::BTreeMap::from([
        ("org.opencontainers.image.title".to_string(), m.name.clone()),
        (
            "org.opencontainers.image.version".to_string(),
            m.version.clone(),
        ),
        (
            "dev.wasmop.module.sha256".to_string(),
            module.sha256().to_string(),
        ),
    ]);
    eprintln!("pushing to {reference}...");
    let access = oci::Access { auth, ca_pem };
    let digest = oci::push(reference, bytes, annotations, &access)
        .await
        .map_err(|e| CliError::Other(e.to_string()))?;
    let repository = reference
        .rsplit_once('@')
        .map(|(r, _)| r)
        .unwrap_or(reference);
    let repository = match repository.rsplit_once(':') {
        Some((r, tag)) if !tag.contains('/') => r,
        _ => repository,
    };
    if let Some(key) = &key {
        let pinned = oci::pin(&crate::crd::OciModule {
            reference: format!("{repository}@{digest}"),
            digest: None,
            pull_secret: None,
            ca_bundle: None,
            ca_config_map: None,
            verify: None,
        })
        .map_err(|e| CliError::Other(e.to_string()))?;
        let tag = signature::sign(&pinned, key, &access)
            .await
            .map_err(|e| CliError::Other(e.to_string()))?;
        eprintln!("signed with key {} ({tag})", key.fingerprint);
    }
    eprintln!("pushed; pin it in spec.module.oci.reference:");
    println!("{repository}@{digest}");
    Ok(ExitCode::SUCCESS)
}
