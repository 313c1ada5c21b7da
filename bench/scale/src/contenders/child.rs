//! A controller child process that prints `READY` on stdout when its caches are filled.
//!
//! # Guarantees
//! - [`Child::start`] returns only after `READY`; stderr goes to `<dir>/<name>.log`.
//! - Dropping a [`Child`] kills the process.
//!
//! # Errors
//! [`Error::Controller`] when it cannot start, exits, or is not ready within two minutes.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::{Error, Result};

/// How long a controller may take to fill its caches.
const READY: Duration = Duration::from_secs(120);

/// A running controller process.
#[derive(Debug)]
pub struct Child {
    name: String,
    child: tokio::process::Child,
    log: PathBuf,
}

impl Child {
    /// Starts `binary args...` with `KUBECONFIG=kubeconfig` and waits for `READY`.
    ///
    /// # Errors
    /// See the module docs.
    pub async fn start(
        name: &str,
        binary: &Path,
        args: &[String],
        kubeconfig: &Path,
        dir: &Path,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(Error::io("creating", dir))?;
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).map_err(Error::io("creating", &log))?;
        let mut child = tokio::process::Command::new(binary)
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(file))
            .kill_on_drop(true)
            .spawn()
            .map_err(Error::io("starting", binary))?;
        let stdout = child.stdout.take().ok_or_else(|| Error::Controller {
            contender: name.into(),
            detail: "no stdout".into(),
        })?;
        let mut started = Child {
            name: name.into(),
            child,
            log,
        };
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(READY, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.trim() == "READY" {
                    return true;
                }
            }
            false
        })
        .await;
        if ready != Ok(true) {
            let why = started
                .exited()
                .unwrap_or_else(|| format!("not READY within {READY:?}"));
            return Err(Error::Controller {
                contender: name.into(),
                detail: format!("{why}; its log:\n{}", started.log_text()),
            });
        }
        // Keep reading stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(started)
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// `Some(why)` if it has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!("{} exited with {status}", self.name)),
            Ok(None) => None,
            Err(e) => Some(format!("{}: {e}", self.name)),
        }
    }

    /// Its stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
