//! Control planes shared by the tests of a test binary, one namespace per test.
//!
//! ```no_run
//! # async fn t() -> anyhow::Result<()> {
//! let env = wasmop_testenv::TestEnv::get("my-test").await?;
//! let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = env.api();
//! # Ok(()) }
//! ```
//!
//! Most tests share one control plane ([`Plane::Shared`]). A test that breaks its control plane
//! (stops the API server, compacts etcd) or counts cluster-wide things asks for a plane of its
//! own ([`Plane::Own`]), shared only with the tests that name the same plane. A test that
//! measures this process (its memory, the process-wide metrics) or faults a plane runs alone
//! ([`Turn::Alone`]): no other test of the process runs meanwhile.
//!
//! # Guarantees
//! - Each plane starts once per process, on first use; every test gets its own fresh
//!   namespace (with its `default` ServiceAccount already created) and its own client, so tests
//!   may run in parallel and in separate tokio runtimes.
//! - If a control plane cannot be started, every test on it fails with the same error, which
//!   says how to provide the binaries. Nothing is skipped.
//! - A test that takes [`Turn::Alone`] starts once every running test has finished, and no test
//!   starts until it ends; the others share their turns. A test may take several shared turns
//!   (several [`TestEnv`]s): a waiting lone test never blocks them.
//! - When a test fails, its [`TestEnv`] keeps the component logs on disk and prints where they
//!   are, with their last lines: a test that ends without [`TestEnv::passed`] failed.
//! - The processes are stopped when the test binary exits (see [`crate::process::Reaper`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::{Client, Resource};

use crate::controlplane::{ControlPlane, Options};
use crate::turns::{Turn, TurnGuard};

/// Which control plane a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    /// The one most tests of the process share.
    Shared,
    /// One of its own, shared only with the tests naming the same plane: for tests that break
    /// their control plane. It stays up until the process exits.
    Own(&'static str),
    /// A new one for this test alone, stopped when the test ends (its logs kept if it failed):
    /// for a test that counts what happens cluster-wide.
    Fresh,
}

/// The shared control plane, or the message of why it could not start.
static SHARED: OnceLock<std::result::Result<ControlPlane, String>> = OnceLock::new();
/// The planes of [`Plane::Own`], by name (kept until the process exits, like the shared one).
static OWN: std::sync::Mutex<BTreeMap<&'static str, &'static ControlPlane>> =
    std::sync::Mutex::new(BTreeMap::new());
/// Serialises starts (OnceLock::get_or_init would block a runtime thread otherwise).
static STARTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts a control plane on a runtime of its own, so no test's runtime owns anything of it.
fn start_plane(name: &str) -> std::result::Result<ControlPlane, String> {
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
            "[testenv] control plane {name} up in {:.1}s at {} (kubeconfig {})",
            cp.started_in().as_secs_f64(),
            cp.server(),
            cp.kubeconfig().display()
        );
    }
    started
}

/// Returns the shared control plane of this process, starting it on first use.
///
/// # Errors
/// The start error, as text, on every call once a start has failed.
pub async fn shared() -> std::result::Result<&'static ControlPlane, String> {
    if let Some(result) = SHARED.get() {
        return result.as_ref().map_err(Clone::clone);
    }
    let _guard = STARTING.lock().await;
    if SHARED.get().is_none() {
        let _ = SHARED.set(start_plane("shared"));
    }
    match SHARED.get() {
        Some(result) => result.as_ref().map_err(Clone::clone),
        None => Err("the control plane was not started".to_string()),
    }
}

/// Returns the control plane `plane`, starting it on first use.
///
/// # Errors
/// The start error, as text (an own plane that failed to start is tried again by the next
/// test that names it).
pub async fn plane(plane: Plane) -> std::result::Result<&'static ControlPlane, String> {
    let name = match plane {
        Plane::Shared => return shared().await,
        Plane::Own(name) => name,
        Plane::Fresh => {
            let cp = start_plane("fresh")?;
            // Leaked, not dropped: a test may hold `&'static` references to it after its
            // `TestEnv`s are gone; its processes are stopped when the test ends.
            return Ok(Box::leak(Box::new(cp)));
        }
    };
    let _guard = STARTING.lock().await;
    let known = lock(&OWN).get(name).copied();
    if let Some(cp) = known {
        return Ok(cp);
    }
    let cp: &'static ControlPlane = Box::leak(Box::new(start_plane(name)?));
    lock(&OWN).insert(name, cp);
    Ok(cp)
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A test's view of a control plane: a client and a fresh namespace.
///
/// # Guarantees
/// - A test whose [`TestEnv`]s are all dropped before [`TestEnv::passed`] was called (an error
///   returned with `?`, a panic) failed: the plane's component logs and the test's own log
///   directory ([`TestEnv::log_dir`]) are kept on disk, and where they are is printed into the
///   test's output, with the last lines of each component log.
#[derive(Clone)]
pub struct TestEnv {
    /// The test's control plane.
    pub cp: &'static ControlPlane,
    /// An admin client, made in the calling test's runtime.
    pub client: Client,
    /// The namespace created for this test.
    pub namespace: String,
    verdict: Arc<Verdict>,
}

/// What a test's [`TestEnv`]s share: its turn, and whether it passed.
struct Verdict {
    cp: &'static ControlPlane,
    /// Stop the plane at the end ([`Plane::Fresh`]).
    fresh: bool,
    namespace: String,
    passed: AtomicBool,
    _turn: TurnGuard,
}

impl TestEnv {
    /// Takes a shared turn, starts (once) the shared control plane and creates a namespace
    /// `<prefix>-<n>` for the test.
    ///
    /// # Errors
    /// Fails if the control plane cannot start or the namespace cannot be created.
    pub async fn get(prefix: &str) -> anyhow::Result<Self> {
        Self::with(prefix, Plane::Shared, Turn::Shared).await
    }

    /// As [`TestEnv::get`], on `plane`, once the test may run (see [`Turn`]).
    ///
    /// # Errors
    /// Fails if the control plane cannot start or the namespace cannot be created.
    pub async fn with(prefix: &str, plane: Plane, turn: Turn) -> anyhow::Result<Self> {
        let turn = crate::turns::take(turn).await;
        let cp = self::plane(plane)
            .await
            .map_err(|e| anyhow::anyhow!("the local control plane is not available:\n{e}"))?;
        let client = cp.client().await?;
        let namespace = create_namespace(cp, &client, prefix).await?;
        let verdict = Arc::new(Verdict {
            cp,
            fresh: plane == Plane::Fresh,
            namespace: namespace.clone(),
            passed: AtomicBool::new(false),
            _turn: turn,
        });
        Ok(TestEnv {
            cp,
            client,
            namespace,
            verdict,
        })
    }

    /// Another namespace `<prefix>-<n>` on the same plane, for the same test (one verdict).
    ///
    /// # Errors
    /// Fails if the namespace cannot be created.
    pub async fn another(&self, prefix: &str) -> anyhow::Result<Self> {
        let namespace = create_namespace(self.cp, &self.client, prefix).await?;
        Ok(TestEnv {
            namespace,
            ..self.clone()
        })
    }

    /// Marks the test passed (its evidence is not kept): a test's last line.
    ///
    /// # Errors
    /// Never; returns `Ok(())` so that it can end a test.
    pub fn passed(&self) -> anyhow::Result<()> {
        self.verdict.passed.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// A directory for this test's own logs (host processes, tools), kept with the control
    /// plane's logs when the test fails: `<cluster dir>/tests/<namespace>/<name>`.
    ///
    /// # Errors
    /// Fails if it cannot be created.
    pub fn log_dir(&self, name: &str) -> anyhow::Result<PathBuf> {
        let dir = test_dir(self.cp, &self.verdict.namespace).join(name);
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// An `Api` for a namespaced kind in this test's namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The admin kubeconfig of the test's control plane.
    pub fn kubeconfig(&self) -> &Path {
        self.cp.kubeconfig()
    }
}

fn test_dir(cp: &ControlPlane, namespace: &str) -> PathBuf {
    cp.dir().join("tests").join(namespace)
}

/// Creates namespace `<prefix>-<n>` (labelled with the prefix) and waits for its `default`
/// ServiceAccount.
async fn create_namespace(
    cp: &ControlPlane,
    client: &Client,
    prefix: &str,
) -> anyhow::Result<String> {
    static N: AtomicUsize = AtomicUsize::new(0);
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
    Ok(namespace)
}

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv")
            .field("server", &self.cp.server())
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl Drop for Verdict {
    fn drop(&mut self) {
        if !self.passed.load(Ordering::Relaxed) || std::thread::panicking() {
            self.report_failure();
        }
        if self.fresh {
            self.cp.stop();
        }
    }
}

impl Verdict {
    /// Keeps the plane's directory and says where the evidence is.
    fn report_failure(&self) {
        self.cp.keep();
        let own = test_dir(self.cp, &self.namespace);
        let own = if own.exists() {
            format!("; its own logs (host processes) are in {}", own.display())
        } else {
            String::new()
        };
        eprintln!(
            "[testenv] test in namespace {} failed; control-plane logs are kept in {}{own}\n\
             (in-process hosts log into the test's captured output above)\n{}",
            self.namespace,
            self.cp.log_dir().display(),
            self.cp.log_tails(15)
        );
    }
}

#[cfg(test)]
mod tests {
    /// Every e2e test that takes a [`super::TestEnv`] calls `env.passed()`: one that ends in
    /// `Ok(())` without it reports a failure when its env drops (to a stderr libtest captures
    /// and drops when the test passes) and keeps the shared control plane's directory, ~114 MB
    /// in /tmp per `make test` (the seven Metacontroller tests did until b6b6505).
    #[test]
    fn every_e2e_test_with_a_test_env_records_that_it_passed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e");
        let mut forgot = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
            let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
            for test in source.split("#[tokio::test").skip(1) {
                // The test's body ends at the first line that closes an item.
                let body = test.split("\n}\n").next().unwrap_or_default();
                if body.contains("TestEnv::") && !body.contains(".passed()") {
                    let name = body.lines().find(|l| l.contains("fn ")).unwrap_or_default();
                    forgot.push(format!("{}: {}", path.display(), name.trim()));
                }
            }
        }
        assert!(
            forgot.is_empty(),
            "tests that never call env.passed(): {forgot:#?}"
        );
    }
}
