//! The running host: clients, engine and manager, started and stopped as one.
//!
//! `wasmop run` uses it; so do the end-to-end tests, in-process.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::sync::oneshot;

use crate::discovery::Discovery;
use crate::engine::{Engine, EngineConfig};
use crate::manager::{self, HostContext};

/// How to run the host.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// A kubeconfig file (None: in-cluster or the default kubeconfig).
    pub kubeconfig: Option<PathBuf>,
    /// The compiled-module cache directory (None: no disk cache).
    pub cache_dir: Option<PathBuf>,
    /// The resync period for WasmReconcilers that do not set one.
    pub resync: Duration,
    /// The name this host reports Events with.
    pub instance: String,
    /// Serve only WasmReconcilers matching this label selector (None: all). Lets several hosts
    /// split the WasmReconcilers of one cluster.
    pub selector: Option<String>,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            kubeconfig: None,
            cache_dir: None,
            resync: Duration::from_secs(600),
            instance: std::env::var("POD_NAME")
                .or_else(|_| std::env::var("HOSTNAME"))
                .unwrap_or_else(|_| "wasmop".into()),
            selector: None,
        }
    }
}

/// A failure to start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The kubeconfig could not be read.
    #[error("cannot use kubeconfig {path}: {detail}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// No cluster configuration was found.
    #[error("no cluster to talk to: {0} (pass --kubeconfig, set KUBECONFIG, or run in a pod)")]
    NoConfig(String),
    /// The client could not be built.
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    /// The engine could not be built.
    #[error("{0}")]
    Engine(#[from] crate::engine::LoadError),
    /// The manager failed.
    #[error("{0}")]
    Manager(#[from] manager::ManagerError),
}

/// The client configuration from `kubeconfig`, or inferred.
///
/// # Errors
/// [`HostError::Kubeconfig`] or [`HostError::NoConfig`].
pub async fn kube_config(kubeconfig: Option<&PathBuf>) -> Result<Config, HostError> {
    match kubeconfig {
        Some(path) => {
            let bad = |detail: String| HostError::Kubeconfig {
                path: path.clone(),
                detail,
            };
            let kc = Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| bad(e.to_string()))
        }
        None => Config::infer()
            .await
            .map_err(|e| HostError::NoConfig(e.to_string())),
    }
}

/// A running host.
#[derive(Debug)]
pub struct Host {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), manager::ManagerError>>,
}

impl Host {
    /// Connects and starts reconciling.
    ///
    /// # Errors
    /// See [`HostError`].
    pub async fn start(options: HostOptions) -> Result<Host, HostError> {
        let config = kube_config(options.kubeconfig.as_ref()).await?;
        let client = Client::try_from(config.clone())?;
        let engine = Engine::new(&EngineConfig {
            cache_dir: options.cache_dir.clone(),
            ..EngineConfig::default()
        })?;
        let ctx = Arc::new(HostContext {
            engine,
            discovery: Discovery::new(client.clone()),
            client,
            config,
            instance: options.instance.clone(),
            default_resync: options.resync,
            selector: options.selector.clone(),
        });
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(manager::run(ctx, async move {
            let _ = rx.await;
        }));
        Ok(Host {
            stop: Some(tx),
            task,
        })
    }

    /// Stops taking new work, lets running reconciles finish, and returns.
    ///
    /// # Errors
    /// The manager's error, if it had failed.
    pub async fn shutdown(mut self) -> Result<(), HostError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match (&mut self.task).await {
            Ok(r) => Ok(r?),
            Err(_) => Ok(()),
        }
    }

    /// Waits until the host stops by itself (it only does on a fatal error).
    ///
    /// # Errors
    /// The manager's error.
    pub async fn wait(&mut self) -> Result<(), HostError> {
        match (&mut self.task).await {
            Ok(r) => Ok(r?),
            Err(_) => Ok(()),
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if self.stop.is_some() {
            self.task.abort();
        }
    }
}
