//! The `wasmop` command: `inspect`, `test` (offline), and the cluster-facing subcommands.
//!
//! # Errors
//! Every subcommand returns a [`CliError`] whose text says what failed and what to do; the
//! binary prints it and exits non-zero.

mod capture;
pub mod diff;
mod inspect;
pub mod kubeconfig;
pub mod new;
pub mod output;
pub mod plugin;
pub mod push;
mod run;
mod test;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

use crate::controller::intents::Rejected;
use crate::engine::{CallError, Engine, EngineConfig, LoadError};
/// Re-exported for the subcommands, which render their output as YAML.
pub use crate::text::to_yaml;

/// A WebAssembly-hosted reconcile runtime for Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "wasmop", version = crate::VERSION, about, long_about = None)]
pub struct Cli {
    /// Log format: `text` or `json`.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print a module's metadata, contract version, size and sha256.
    Inspect(inspect::Args),
    /// Run a module offline on fixture objects; print the validated intents as YAML and compare
    /// them with a golden file.
    Test(test::Args),
    /// Run the operator host: reconcile every WasmReconciler's primaries with its module.
    Run(Box<run::Args>),
    /// Put a module in a ConfigMap (gzip-compressed when large), checking it first.
    Push(push::Args),
    /// Print the CustomResourceDefinitions the host serves (YAML).
    Crdgen {
        /// Print the CompositeController's (Metacontroller's, with `spec.wasmop`) instead of
        /// the WasmReconciler's.
        #[arg(long)]
        metacontroller: bool,
    },
    /// Scaffold a module project (skeleton, fixtures and golden file, k8s/ manifests, README)
    /// that builds and passes `wasmop test` out of the box.
    New(new::Args),
    /// Preview a swap: run a candidate module against every primary of a live WasmReconciler
    /// (read-only; server-side dry-run applies) and print what it would change.
    Diff(diff::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion(plugin::CompletionArgs),
    /// Install `wasmop` as a kubectl plugin (`kubectl wasmop ...`).
    Plugin(plugin::PluginArgs),
}

impl Cli {
    /// Parses the process's arguments, showing `kubectl wasmop` in help and errors when
    /// started as the kubectl plugin; exits with clap's message on bad arguments.
    pub fn parse_for(invocation: plugin::Invocation) -> Cli {
        let matches = Cli::command().bin_name(invocation.bin_name()).get_matches();
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// What can go wrong in a subcommand.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A file could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// Reading, writing...
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A YAML or JSON input is malformed.
    #[error("{path}: {detail}")]
    Input {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The module could not be loaded.
    #[error("cannot load {path}: {source}")]
    Load {
        /// The module file.
        path: PathBuf,
        /// Why.
        source: LoadError,
    },
    /// The module failed.
    #[error("{0}")]
    Call(#[from] CallError),
    /// The module's intents were refused.
    #[error("{0}")]
    Rejected(#[from] Rejected),
    /// The output differs from the golden file.
    #[error(
        "the intents differ from {0} (see the diff above); if the change is intended, run again with --update"
    )]
    Differs(PathBuf),
    /// Anything else, with its explanation.
    #[error("{0}")]
    Other(String),
}

impl CliError {
    pub(crate) fn read(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> CliError + '_ {
        move |source| CliError::Io {
            action: "cannot read",
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The directory of caches: `$WASMOP_CACHE`, else `$XDG_CACHE_HOME/wasmop`, else `~/.cache/wasmop`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("WASMOP_CACHE").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir).join("wasmop");
    }
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(".cache")
        .join("wasmop")
}

/// An engine for the command line: the compiled-module cache in `<cache>/compiled`.
///
/// # Errors
/// [`CliError::Other`] if the engine cannot be built.
pub fn engine(use_cache: bool) -> Result<Engine, CliError> {
    let config = EngineConfig {
        cache_dir: use_cache.then(|| cache_dir().join("compiled")),
        max_instances: 16,
        // One-shot commands want the optimized build now, not a fast one replaced later.
        tiered: false,
        ..EngineConfig::default()
    };
    Engine::new(&config).map_err(|e| CliError::Other(e.to_string()))
}

/// Parses YAML text (one or more documents) into JSON values, skipping empty documents.
///
/// # Errors
/// [`CliError::Input`] naming the file.
pub fn yaml_documents(
    text: &str,
    path: &std::path::Path,
) -> Result<Vec<serde_json::Value>, CliError> {
    crate::text::from_yaml_documents(text)
        .map(|docs| docs.into_iter().filter(|d| !d.is_null()).collect())
        .map_err(|e| CliError::Input {
            path: path.to_path_buf(),
            detail: format!("not valid YAML: {e}"),
        })
}

/// Runs `f` on a blocking thread. Module calls block their thread (see
/// [`crate::engine::Module::reconcile`]) and must never run on the async runtime's workers.
///
/// # Errors
/// `f`'s error, or [`CliError::Other`] if its thread could not run it to the end.
pub(crate) async fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, CliError> + Send + 'static,
) -> Result<T, CliError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CliError::Other(format!("the module call's thread failed: {e}")))?
}

/// Runs a parsed command line, started as `invocation`.
pub async fn run(cli: Cli, invocation: plugin::Invocation) -> Result<ExitCode, CliError> {
    crate::install_crypto_provider();
    match cli.command {
        Command::Inspect(args) => off_runtime(move || inspect::run(args)).await,
        Command::Test(args) => test::run_with_capture(args).await,
        Command::Run(args) => run::run(*args).await,
        Command::Push(args) => push::run(args).await,
        Command::New(args) => new::run(args),
        Command::Diff(args) => diff::run(args).await,
        Command::Completion(args) => Ok(plugin::completion(&args, invocation)),
        Command::Plugin(args) => plugin::run(args),
        Command::Crdgen { metacontroller } => {
            if metacontroller {
                print!("{}", crate::metacontroller::crds_yaml());
            } else {
                print!("{}", crate::crd::crds_yaml());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
