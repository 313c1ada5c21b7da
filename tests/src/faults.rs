//! Faults of the cluster, injected into a running [`ControlPlane`]: kube-apiserver crashing and
//! coming back, and etcd compacting its history so that watches resuming from an old
//! resourceVersion get `410 Gone` and must relist.
//!
//! ```no_run
//! # async fn t(cp: &wasmop_testenv::ControlPlane) -> wasmop_testenv::Result<()> {
//! cp.stop_apiserver()?;
//! let compacted_at = cp.compact_etcd().await?;
//! cp.start_apiserver().await?;
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//! - [`ControlPlane::stop_apiserver`] SIGKILLs kube-apiserver (a crash: no graceful shutdown, open
//!   connections are reset) and returns once it is gone; [`ControlPlane::start_apiserver`] starts
//!   it again with the same port, certificates and flags, and returns once its `/readyz` says
//!   `ok`. The restarted process is registered with the reaper like the first one.
//! - [`ControlPlane::compact_etcd`] writes one key outside the apiserver's `/registry` prefix
//!   (so the revision moves past every resourceVersion a client has seen) and compacts etcd's
//!   whole history up to that revision, physically. A watch resuming from any resourceVersion
//!   seen before then can only be answered with `410 Gone`, by etcd or by a restarted
//!   apiserver's watch cache.
//! - All of these take `&self`: a control plane shared by the tests of a test binary can be
//!   faulted. Tests that fault a shared control plane must not run concurrently with tests that
//!   need it up (the `faults` e2e binary runs its tests one at a time).
//!
//! # Errors
//! [`Error::Fault`] when a component is unknown or etcd's gateway refuses a request,
//! [`Error::Spawn`] when a component cannot be started again, [`Error::NotReady`] when the
//! restarted apiserver is not ready in time (with the component logs' location).

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::controlplane::ControlPlane;
use crate::error::{Error, Result};

/// How long a restarted kube-apiserver may take to become ready.
const RESTART_READY: Duration = Duration::from_secs(90);
/// The key [`ControlPlane::compact_etcd`] writes (`/wasmop-testenv/compaction`, base64).
const BUMP_KEY: &str = "L3dhc21vcC10ZXN0ZW52L2NvbXBhY3Rpb24=";
/// Its value (`bump`, base64).
const BUMP_VALUE: &str = "YnVtcA==";

impl ControlPlane {
    /// Crashes kube-apiserver: SIGKILL, and waits until it is gone.
    ///
    /// # Errors
    /// [`Error::Fault`] if there is no kube-apiserver (or the control plane is shutting down).
    pub fn stop_apiserver(&self) -> Result<()> {
        self.kill_component("kube-apiserver")
    }

    /// Starts kube-apiserver again after [`ControlPlane::stop_apiserver`], on the same port with
    /// the same certificates and flags, and waits until its `/readyz` says `ok`.
    ///
    /// # Errors
    /// See the module docs.
    pub async fn start_apiserver(&self) -> Result<()> {
        self.start_component("kube-apiserver")?;
        self.wait_for_apiserver(RESTART_READY).await
    }

    /// Crashes kube-apiserver, keeps it down for `down`, then starts it again and waits until it
    /// is ready.
    ///
    /// # Errors
    /// See the module docs.
    pub async fn restart_apiserver(&self, down: Duration) -> Result<()> {
        self.stop_apiserver()?;
        tokio::time::sleep(down).await;
        self.start_apiserver().await
    }

    /// SIGKILLs the component called `name` (e.g. `kube-controller-manager`) and reaps it.
    ///
    /// # Errors
    /// [`Error::Fault`] if there is no such component.
    pub fn kill_component(&self, name: &str) -> Result<()> {
        self.with_component(name, |p, _| {
            p.kill();
            Ok(())
        })
    }

    /// Starts the component called `name` again after [`ControlPlane::kill_component`], with
    /// the same binary and arguments. Does not wait for it to be ready.
    ///
    /// # Errors
    /// [`Error::Fault`] if there is no such component, [`Error::Spawn`] if it is still running
    /// or cannot be started.
    pub fn start_component(&self, name: &str) -> Result<()> {
        self.with_component(name, |p, reaper| p.respawn(reaper))
    }

    /// Compacts etcd's whole history (see the module docs) and returns the revision compacted
    /// to: every resourceVersion below it is gone.
    ///
    /// # Errors
    /// [`Error::Fault`] if etcd's HTTP gateway refuses the write or the compaction.
    pub async fn compact_etcd(&self) -> Result<i64> {
        let put = self
            .etcd("/v3/kv/put", json!({"key": BUMP_KEY, "value": BUMP_VALUE}))
            .await?;
        let revision = put["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse::<i64>().ok())
            .or_else(|| put["header"]["revision"].as_i64())
            .ok_or_else(|| Error::Fault {
                action: "writing a key into etcd".into(),
                detail: format!("no revision in the answer: {put}"),
            })?;
        self.etcd(
            "/v3/kv/compaction",
            json!({"revision": revision.to_string(), "physical": true}),
        )
        .await?;
        Ok(revision)
    }

    /// POSTs `body` to etcd's gRPC gateway at `path` and returns the JSON answer.
    async fn etcd(&self, path: &str, body: Value) -> Result<Value> {
        let action = || format!("POST {path} to etcd at 127.0.0.1:{}", self.etcd_client);
        let fault = |detail: String| Error::Fault {
            action: action(),
            detail,
        };
        let body = body.to_string();
        let request = format!(
            "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.etcd_client))
                .await
                .map_err(|e| fault(e.to_string()))?;
            stream
                .write_all(request.as_bytes())
                .await
                .map_err(|e| fault(e.to_string()))?;
            let mut answer = String::new();
            stream
                .read_to_string(&mut answer)
                .await
                .map_err(|e| fault(e.to_string()))?;
            Ok::<_, Error>(answer)
        };
        let answer = tokio::time::timeout(Duration::from_secs(30), exchange)
            .await
            .map_err(|_| fault("no answer within 30 s".into()))??;
        let (head, payload) = answer
            .split_once("\r\n\r\n")
            .ok_or_else(|| fault(format!("not an HTTP answer: {answer:?}")))?;
        if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
            return Err(fault(format!("{head}\n{payload}")));
        }
        serde_json::from_str(payload).map_err(|e| fault(format!("{e}: {payload:?}")))
    }
}
