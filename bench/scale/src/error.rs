//! The benchmark's errors.

use std::path::PathBuf;

/// What went wrong in a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the API server failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The control plane could not be started or reached.
    #[error("local control plane: {0}")]
    ControlPlane(#[from] wasmop_testenv::Error),
    /// A file or process could not be read, written or started.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A controller process did not start, exited or did not become ready.
    #[error("{contender}: {detail}")]
    Controller {
        /// Which contender.
        contender: String,
        /// What happened (with the tail of its log).
        detail: String,
    },
    /// The Apps did not converge in time.
    #[error(
        "{contender}: {converged}/{n} Apps converged within {seconds} s (raise WASMOP_BENCH_TIMEOUT)"
    )]
    Timeout {
        /// Which contender.
        contender: String,
        /// How many converged.
        converged: usize,
        /// How many were created.
        n: usize,
        /// The budget.
        seconds: u64,
    },
    /// A setting from the environment is not valid.
    #[error("{variable}={value:?}: {reason}")]
    Setting {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// Something else (manifests, metrics, the reconcile logic).
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// A closure mapping a kube error to [`Error::Kube`] with a description.
    pub fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }

    /// A closure mapping an I/O error to [`Error::Io`].
    pub fn io(
        what: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { what, path, source }
    }
}

/// The benchmark's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
