//! The one error type of the test environment.

use std::path::PathBuf;

/// Everything that can stop the local control plane from being provided or started.
///
/// Each variant says what failed and, where there is one, what the user can do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A binary could not be found nor built.
    #[error(
        "cannot provide `{binary}` {version}: {reason}\n\
         Provide the control plane in one of these ways:\n\
         - install Go >= 1.26 with access to the Go module proxy, and the harness builds it into \
         {cache} (first time: many minutes);\n\
         - or set KUBEBUILDER_ASSETS to a directory holding etcd, kube-apiserver, \
         kube-controller-manager, kube-scheduler, kubectl and kwok;\n\
         - or set WASMOP_CACHE to a cache directory that already holds them."
    )]
    MissingBinary {
        /// The binary's file name.
        binary: String,
        /// The pinned version it should have.
        version: String,
        /// Why it could not be had.
        reason: String,
        /// The cache directory that was looked in and would be built into.
        cache: PathBuf,
    },

    /// A build step (`go build`, `go mod download`) ran and failed.
    #[error("building {what} failed: {detail}\nfull build log: {log}")]
    Build {
        /// What was being built.
        what: String,
        /// The last lines of its output.
        detail: String,
        /// Where the whole output was written.
        log: PathBuf,
    },

    /// Reading or writing a file or directory failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    /// A control-plane process could not be started.
    #[error("starting {component} ({binary}): {source}")]
    Spawn {
        /// The component's name.
        component: &'static str,
        /// The binary that was run.
        binary: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    /// A component exited while it was expected to run.
    #[error("{component} exited ({status}) while starting; last lines of {log}:\n{tail}")]
    Exited {
        /// The component's name.
        component: &'static str,
        /// Its exit status.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The last lines of that log.
        tail: String,
    },

    /// A component did not become ready in time.
    #[error("{what} was not ready after {seconds} s: {last}\ncomponent logs are in {logs}")]
    NotReady {
        /// What was awaited.
        what: String,
        /// How long it was awaited.
        seconds: u64,
        /// The last error or state seen.
        last: String,
        /// The directory holding the component logs.
        logs: PathBuf,
    },

    /// Injecting a fault (killing, restarting or compacting) failed.
    #[error("{action}: {detail}")]
    Fault {
        /// What was being done.
        action: String,
        /// What went wrong.
        detail: String,
    },

    /// Making the certificates failed.
    #[error("generating certificates: {0}")]
    Pki(#[from] rcgen::Error),

    /// Building a Kubernetes client for the new cluster failed.
    #[error("kubernetes client: {0}")]
    Kube(#[from] kube::Error),

    /// The kubeconfig the harness wrote could not be loaded.
    #[error("kubeconfig {path}: {detail}")]
    Kubeconfig {
        /// The kubeconfig's path.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

/// The result type of the test environment.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::Io`] for `action` on `path`.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Error::Io {
            action,
            path,
            source,
        }
    }
}
