//! One control plane shared by all tests of a test binary, one namespace per test.
//!
//! ```no_run
//! # async fn t() -> anyhow::Result<()> {
//! let env = wasmop_testenv::TestEnv::get("my-test").await?;
//! let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = env.api();
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//! - The control plane starts once per process, on first use; every test gets its own fresh
//!   namespace (with its `default` ServiceAccount already created) and its own client, so tests
//!   may run in parallel and in separate tokio runtimes.
//! - If the control plane cannot be started, every test fails with the same error, which says how
//!   to provide the binaries. Nothing is skipped.
//! - When a test panics, its [`TestEnv`] guard prints where the component logs are, with their
//!   last lines, and keeps them on disk.
//! - The processes are stopped when the test binary exits (see [`crate::process::Reaper`]).

use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::{Client, Resource};

use crate::controlplane::{ControlPlane, Options};

/// The shared control plane, or the message of why it could not start.
static SHARED: OnceLock<std::result::Result<ControlPlane, String>> = OnceLock::new();
/// Serialises the first start (OnceLock::get_or_init would block a runtime thread otherwise).
static STARTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Returns the control plane of this process, starting it on first use.
///
/// # Errors
/// The start error, as text, on every call once a start has failed.
pub async fn shared() -> std::result::Result<&'static ControlPlane, String> {
    if let Some(result) = SHARED.get() {
        return result.as_ref().map_err(Clone::clone);
    }
    let _guard = STARTING.lock().await;
    if SHARED.get().is_none() {
        // Start on a runtime of its own, so no test's runtime owns anything of it.
        let started = std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match runtime {
                Ok(rt) => rt
                    .block_on(ControlPlane::start(Options::default()))
                    .map_err(|e| e.to_string()),
                Err(e) => Err(format!("cannot build a tokio runtime: {e}")),
            }
        })
        .join()
        .unwrap_or_else(|_| Err("the control-plane start thread panicked".to_string()));
        if let Ok(cp) = &started {
            eprintln!(
                "[testenv] control plane up in {:.1}s at {} (kubeconfig {})",
                cp.started_in().as_secs_f64(),
                cp.server(),
                cp.kubeconfig().display()
            );
        }
        let _ = SHARED.set(started);
    }
    match SHARED.get() {
        Some(result) => result.as_ref().map_err(Clone::clone),
        None => Err("the control plane was not started".to_string()),
    }
}

/// A test's view of the shared control plane: a client and a fresh namespace.
#[derive(Clone)]
pub struct TestEnv {
    /// The shared control plane.
    pub cp: &'static ControlPlane,
    /// An admin client, made in the calling test's runtime.
    pub client: Client,
    /// The namespace created for this test.
    pub namespace: String,
}

impl TestEnv {
    /// Starts (once) the shared control plane and creates a namespace `<prefix>-<n>` for the test.
    ///
    /// # Errors
    /// Fails if the control plane cannot start or the namespace cannot be created.
    pub async fn get(prefix: &str) -> anyhow::Result<Self> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let cp = shared()
            .await
            .map_err(|e| anyhow::anyhow!("the local control plane is not available:\n{e}"))?;
        let client = cp.client().await?;
        let namespace = format!("{}-{}", prefix, N.fetch_add(1, Ordering::Relaxed));
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": { "name": namespace, "labels": { "wasmop.dev/test": prefix } }
        }))?;
        namespaces.create(&PostParams::default(), &ns).await?;
        // The ServiceAccount admission plugin refuses pods until the namespace's `default`
        // ServiceAccount exists; wait for the controller-manager to create it.
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while accounts.get_opt("default").await?.is_none() {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "ServiceAccount {namespace}/default was not created in 30 s (is kube-controller-manager running? logs: {})",
                cp.log_dir().display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(TestEnv {
            cp,
            client,
            namespace,
        })
    }

    /// An `Api` for a namespaced kind in this test's namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The admin kubeconfig of the shared control plane.
    pub fn kubeconfig(&self) -> &Path {
        self.cp.kubeconfig()
    }
}

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv")
            .field("server", &self.cp.server())
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.cp.keep();
            eprintln!(
                "[testenv] test in namespace {} failed; control-plane logs are kept in {}\n{}",
                self.namespace,
                self.cp.log_dir().display(),
                self.cp.log_tails(15)
            );
        }
    }
}
