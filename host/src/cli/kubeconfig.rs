//! kubectl's connection flags (`--kubeconfig`, `--context`, `--cluster`, `--user`) and its
//! kubeconfig conventions, shared by every subcommand that talks to a cluster.
//!
//! # Guarantees
//! - Without `--kubeconfig`, `KUBECONFIG` is read as kubectl reads it: a colon-separated list
//!   of files merged in order (by [`kube::config::Kubeconfig::from_env`]), else
//!   `~/.kube/config`; with no flag at all, in-cluster configuration is the fallback
//!   ([`kube::Config::infer`]).
//! - The default namespace is the selected context's (`default` when it names none), as
//!   kubectl's `-n` default is.

use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::CliError;

/// kubectl's flags that pick the cluster, context and user.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Connection {
    /// The kubeconfig file (default: $KUBECONFIG, a colon-separated list merged as kubectl
    /// merges it, then ~/.kube/config, then in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current-context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// The kubeconfig cluster to use (default: the context's).
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,
    /// The kubeconfig user to use (default: the context's).
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
}

impl Connection {
    /// Whether any of the flags was given.
    pub fn is_given(&self) -> bool {
        self.kubeconfig.is_some()
            || self.context.is_some()
            || self.cluster.is_some()
            || self.user.is_some()
    }

    fn options(&self) -> KubeConfigOptions {
        KubeConfigOptions {
            context: self.context.clone(),
            cluster: self.cluster.clone(),
            user: self.user.clone(),
        }
    }

    /// The client configuration these flags select.
    ///
    /// # Errors
    /// [`CliError::Other`] naming the kubeconfig and what is wrong with it (a missing file,
    /// an unknown context...).
    pub async fn config(&self) -> Result<kube::Config, CliError> {
        let options = self.options();
        match &self.kubeconfig {
            Some(path) => {
                let bad = |e: &dyn std::fmt::Display| {
                    CliError::Other(format!("kubeconfig {}: {e}", path.display()))
                };
                let kc = Kubeconfig::read_from(path).map_err(|e| bad(&e))?;
                kube::Config::from_custom_kubeconfig(kc, &options)
                    .await
                    .map_err(|e| bad(&e))
            }
            None if self.is_given() => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| CliError::Other(format!("kubeconfig ($KUBECONFIG or ~/.kube/config): {e}"))),
            None => kube::Config::infer().await.map_err(|e| {
                CliError::Other(format!(
                    "no cluster configuration (tried $KUBECONFIG, ~/.kube/config and in-cluster): {e}"
                ))
            }),
        }
    }

    /// A client for these flags, with the namespace to use: `namespace` when given, else the
    /// selected context's.
    ///
    /// # Errors
    /// As [`Connection::config`], or when the client cannot be built.
    pub async fn client(
        &self,
        namespace: Option<&str>,
    ) -> Result<(kube::Client, kube::Config, String), CliError> {
        let config = self.config().await?;
        let namespace = namespace
            .map(str::to_string)
            .unwrap_or_else(|| config.default_namespace.clone());
        let client =
            kube::Client::try_from(config.clone()).map_err(|e| CliError::Other(e.to_string()))?;
        Ok((client, config, namespace))
    }
}
