//! A wasmop host (`wasmop run`) as a child process that a test can crash and restart.
//!
//! ```no_run
//! # async fn t(bin: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<()> {
//! let args = vec!["--log-format".into(), "json".into(), "run".into(),
//!                 "--metrics-addr".into(), "127.0.0.1:0".into()];
//! let mut host = wasmop_testenv::HostProcess::start(bin, args, "info", dir).await?;
//! host.kill().await?;
//! host.restart().await?;
//! assert_eq!(host.readyz().await?.0, 200);
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//! - [`HostProcess::start`] and [`HostProcess::restart`] return once the host logged the address
//!   of its `/metrics`, `/healthz` and `/readyz` server (the arguments must include
//!   `--log-format json` and a `--metrics-addr`); each run logs to a file of its own
//!   (`host-<n>.log` in the given directory), all kept for a failure report.
//! - [`HostProcess::kill`] is a crash: SIGKILL, no graceful shutdown, nothing released.
//! - Dropping a [`HostProcess`] kills the child.
//! - Its compiled-module cache is its own (`WASMOP_CACHE=<dir>/wasmop-cache`, kept across
//!   restarts, unless the caller sets `WASMOP_CACHE` or passes `--cache-dir`): a test that kills
//!   a host during a compile leaves the compile's quarantine marker there, never in the user's
//!   `~/.cache/wasmop/compiled`, where two such kills quarantined the module for the user's
//!   own `wasmop push` (a bare machine's `make demo` after `make test` failed so).
//!
//! # Errors
//! `anyhow` errors that say what failed, with the host's log when it exited or did not start.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a host may take to serve its probes after it was started.
const START: Duration = Duration::from_secs(60);
/// The message the host logs when its probe server listens.
const SERVING: &str = "serving /metrics, /healthz and /readyz";

/// A running `wasmop run` child process.
#[derive(Debug)]
pub struct HostProcess {
    binary: PathBuf,
    args: Vec<String>,
    rust_log: String,
    dir: PathBuf,
    runs: usize,
    child: Option<tokio::process::Child>,
    log: PathBuf,
    metrics: SocketAddr,
    /// Environment variables set (`Some`) or removed (`None`) for the child.
    env: Vec<(String, Option<String>)>,
}

impl HostProcess {
    /// Starts `binary` with `args` and `RUST_LOG=rust_log`, logging into `dir`.
    ///
    /// # Errors
    /// If it cannot be started, exits, or does not serve its probes within a minute.
    pub async fn start(
        binary: &Path,
        args: Vec<String>,
        rust_log: &str,
        dir: &Path,
    ) -> anyhow::Result<Self> {
        Self::start_with_env(binary, args, rust_log, dir, Vec::new()).await
    }

    /// As [`HostProcess::start`], with environment variables set (`Some`) or removed (`None`)
    /// for the child (every run).
    ///
    /// # Errors
    /// As [`HostProcess::start`].
    pub async fn start_with_env(
        binary: &Path,
        args: Vec<String>,
        rust_log: &str,
        dir: &Path,
        env: Vec<(String, Option<String>)>,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut host = HostProcess {
            binary: binary.to_path_buf(),
            args,
            rust_log: rust_log.to_string(),
            dir: dir.to_path_buf(),
            runs: 0,
            child: None,
            log: PathBuf::new(),
            metrics: SocketAddr::from(([127, 0, 0, 1], 0)),
            env,
        };
        host.launch().await?;
        Ok(host)
    }

    async fn launch(&mut self) -> anyhow::Result<()> {
        self.runs += 1;
        self.log = self.dir.join(format!("host-{}.log", self.runs));
        let log = std::fs::File::create(&self.log)
            .with_context(|| format!("creating {}", self.log.display()))?;
        let mut command = tokio::process::Command::new(&self.binary);
        command.env("WASMOP_CACHE", self.dir.join("wasmop-cache"));
        for (key, value) in &self.env {
            match value {
                Some(v) => command.env(key, v),
                None => command.env_remove(key),
            };
        }
        let child = command
            .args(&self.args)
            .env_remove("RUST_BACKTRACE")
            .env("RUST_LOG", &self.rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if let Some(addr) = self
                .lines()
                .iter()
                .find(|l| l["fields"]["message"] == SERVING)
                .and_then(|l| l["fields"]["addr"].as_str())
            {
                self.metrics = addr
                    .parse()
                    .with_context(|| format!("the host logged a bad address {addr:?}"))?;
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                anyhow::bail!("wasmop run exited with {status}:\n{}", self.log_text());
            }
            anyhow::ensure!(
                started.elapsed() < START,
                "wasmop run did not serve its probes within {START:?}:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILLs the host (a crash) and waits until it is gone.
    ///
    /// # Errors
    /// If it was not running or cannot be signalled.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        let mut child = self
            .child
            .take()
            .ok_or_else(|| anyhow::anyhow!("the host is not running"))?;
        // tokio's `kill` sends SIGKILL and waits for the exit.
        child.kill().await.context("SIGKILL to the host")?;
        Ok(())
    }

    /// SIGTERMs the host (a graceful shutdown) and waits up to `within` for it to exit.
    ///
    /// # Errors
    /// If it was not running, cannot be signalled, or did not exit in time (it is then killed).
    pub async fn terminate(
        &mut self,
        within: Duration,
    ) -> anyhow::Result<std::process::ExitStatus> {
        let mut child = self
            .child
            .take()
            .ok_or_else(|| anyhow::anyhow!("the host is not running"))?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| anyhow::anyhow!("the host has already exited"))?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .context("SIGTERM to the host")?;
        match tokio::time::timeout(within, child.wait()).await {
            Ok(status) => Ok(status.context("waiting for the host")?),
            Err(_) => {
                let _ = child.kill().await;
                anyhow::bail!(
                    "the host did not exit within {within:?} of SIGTERM:\n{}",
                    self.log_text()
                )
            }
        }
    }

    /// The names of the current run's threads (`/proc/<pid>/task/*/comm`, at most 15 bytes
    /// each), empty if it is not running.
    pub fn thread_names(&self) -> Vec<String> {
        let Some(pid) = self.pid() else {
            return Vec::new();
        };
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        tasks
            .filter_map(Result::ok)
            .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
            .map(|n| n.trim().to_string())
            .collect()
    }

    /// Starts the host again with the same arguments (after [`HostProcess::kill`]).
    ///
    /// # Errors
    /// As [`HostProcess::start`]; also if it is still running.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.child.is_none(),
            "the host is still running; kill it first"
        );
        self.launch().await
    }

    /// The JSON log lines of the current run.
    pub fn lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The logs of every run so far, for a failure report.
    pub fn log_text(&self) -> String {
        (1..=self.runs)
            .map(|n| {
                let path = self.dir.join(format!("host-{n}.log"));
                format!(
                    "---- {} ----\n{}",
                    path.display(),
                    std::fs::read_to_string(&path).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The address of the probe server of the current run.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics
    }

    /// The process id of the current run (for /proc measurements), if it is running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(tokio::process::Child::id)
    }

    /// `GET /readyz`: (status, body).
    ///
    /// # Errors
    /// If the probe server does not answer within 10 s or not in HTTP.
    pub async fn readyz(&self) -> anyhow::Result<(u16, String)> {
        http_get(self.metrics, "/readyz").await
    }

    /// `GET /metrics`, the value of one sample (`name{labels}` exactly as rendered).
    ///
    /// # Errors
    /// If the probe server does not answer 200.
    pub async fn sample(&self, series: &str) -> anyhow::Result<Option<f64>> {
        let (status, body) = http_get(self.metrics, "/metrics").await?;
        anyhow::ensure!(status == 200, "/metrics answered {status}: {body}");
        Ok(body.lines().find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        }))
    }
}

/// `GET path` over HTTP/1.0 on a host's probe server, within 10 s: the status code and the body.
///
/// # Errors
/// No connection, no answer within 10 s, or an answer that is not HTTP.
pub async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    let out = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| anyhow::anyhow!("GET {path} on {addr}: no answer within 10 s"))?
        .with_context(|| format!("GET {path} on {addr}"))?;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("GET {path} on {addr}: not an HTTP response: {out:?}"))?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}
