//! wasmop as a user runs it: the WasmReconciler CRD, the example's RBAC, `wasmop push` of the
//! image-updater module, the example's WasmReconciler (with the bench's resync period and
//! concurrency), and `wasmop run` as a child process. [`register`], [`host_args`] and [`serve`]
//! are shared with the sharded contender.
//!
//! # Guarantees
//! - [`start`] and [`serve`] return once the host's `/readyz` answers 200 (every reconciler's
//!   module loaded and caches synced) and the module's optimized build serves.
//!
//! # Errors
//! [`Error::Controller`] when a step fails, with the host's log.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmop_testenv::HostProcess;

use super::{Binaries, Running, Tuning};
use crate::cluster::{Cluster, NAMESPACE, repo, yaml_docs};
use crate::converge::Layout;
use crate::{Error, Result};

fn failed(detail: String) -> Error {
    Error::Controller {
        contender: "wasmop".into(),
        detail,
    }
}

/// Registers the module and starts the host.
///
/// # Errors
/// See the module docs.
pub async fn start(
    cluster: &Cluster,
    binaries: &Binaries,
    tuning: Tuning,
    dir: &Path,
) -> Result<Running> {
    register(cluster, binaries, tuning).await?;
    let host = serve(&binaries.wasmop, host_args(cluster, dir, WEBHOOK, &[]), dir).await?;
    Ok(Running::Host(Box::new(host)))
}

/// The module's rights everywhere: the rules of the example's namespaced Role `image-updater`
/// in a ClusterRole bound to the same ServiceAccount (for Apps spread over namespaces).
fn everywhere(rbac: &[Value]) -> Result<Vec<Value>> {
    let rules = rbac
        .iter()
        .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == "image-updater")
        .map(|d| d["rules"].clone())
        .ok_or_else(|| {
            failed("examples/image-updater/k8s/rbac.yaml has no Role image-updater".into())
        })?;
    Ok(vec![
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "image-updater-everywhere"}, "rules": rules
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "image-updater-everywhere"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "image-updater-everywhere"},
            "subjects": [{"kind": "ServiceAccount", "name": "image-updater", "namespace": NAMESPACE}]
        }),
    ])
}

/// Installs the WasmReconciler CRD and the example's RBAC, pushes the module and applies the
/// example's WasmReconciler with the bench's resync period and concurrency. With Apps spread
/// over namespaces ([`Layout::Spread`]) the WasmReconciler names no namespaces (it watches all)
/// and the module's Role is granted cluster-wide.
///
/// # Errors
/// See the module docs.
pub async fn register(cluster: &Cluster, binaries: &Binaries, tuning: Tuning) -> Result<()> {
    let example = repo().join("examples/image-updater/k8s");
    cluster
        .apply_yaml(&repo().join("deploy/crds/wasmreconciler.yaml"))
        .await?;
    let rbac = yaml_docs(&example.join("rbac.yaml"))?;
    let spread = matches!(tuning.layout, Layout::Spread(_));
    let extra = if spread {
        everywhere(&rbac)?
    } else {
        Vec::new()
    };
    cluster.apply(rbac).await?;
    cluster.apply(extra).await?;
    let kubeconfig = cluster.kubeconfig().display().to_string();
    let push = tokio::process::Command::new(&binaries.wasmop)
        .arg("push")
        .arg(&binaries.module)
        .args([
            "--name",
            "image-updater",
            "-n",
            NAMESPACE,
            "--kubeconfig",
            &kubeconfig,
        ])
        .output()
        .await
        .map_err(Error::io("running", &binaries.wasmop))?;
    if !push.status.success() {
        return Err(failed(format!(
            "wasmop push failed ({}): {}",
            push.status,
            String::from_utf8_lossy(&push.stderr)
        )));
    }
    let mut docs = yaml_docs(&example.join("wasmreconciler.yaml"))?;
    for doc in &mut docs {
        doc["spec"]["resyncPeriod"] = json!(format!("{}ms", tuning.resync.as_millis()));
        doc["spec"]["limits"]["concurrency"] = json!(tuning.concurrency);
        if spread && let Some(spec) = doc["spec"].as_object_mut() {
            spec.remove("namespaces");
        }
    }
    cluster.apply(docs).await
}

/// Where the single host serves its webhook: a free loopback port, as a deployed host serves it
/// (the image-updater's validating webhook, and the finalizer webhook, which spares the
/// finalizer's write per App).
pub const WEBHOOK: &str = "127.0.0.1:0";

/// The `wasmop run` arguments: JSON logs, the probe server on a free port, the webhook at
/// `webhook` (`--webhook-addr`), a compiled-module cache in `dir`, then `extra`, then
/// `WASMOP_BENCH_WASMOP_ARGS`.
pub fn host_args(cluster: &Cluster, dir: &Path, webhook: &str, extra: &[String]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--log-format",
        "json",
        "run",
        "--kubeconfig",
        &cluster.kubeconfig().display().to_string(),
        "--metrics-addr",
        "127.0.0.1:0",
        "--webhook-addr",
        webhook,
        "--cache-dir",
        &dir.join("compiled").display().to_string(),
    ]
    .map(str::to_string)
    .to_vec();
    args.extend_from_slice(extra);
    // Extra `wasmop run` flags (e.g. `--kube-qps 0`), to measure a setting against the defaults.
    if let Ok(extra) = std::env::var("WASMOP_BENCH_WASMOP_ARGS") {
        args.extend(extra.split_whitespace().map(str::to_string));
    }
    args
}

/// Starts `wasmop args...` logging into `dir` and waits until its `/readyz` answers 200 and
/// the module's optimized build serves.
///
/// # Errors
/// See the module docs.
pub async fn serve(wasmop: &Path, args: Vec<String>, dir: &Path) -> Result<HostProcess> {
    let host = HostProcess::start(wasmop, args, "info", dir)
        .await
        .map_err(|e| failed(format!("{e:#}")))?;
    let began = Instant::now();
    loop {
        if let Ok((200, _)) = host.readyz().await {
            optimized(&host).await;
            return Ok(host);
        }
        if began.elapsed() > Duration::from_secs(120) {
            return Err(failed(format!(
                "/readyz not 200 within 120 s; log:\n{}",
                host.log_text()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (at most 5 minutes) until the host logs that the module's optimized build serves.
///
/// With tiered compilation the host serves at once with a fast build and compiles the optimized
/// one in the background, on the cores the convergence is measured on. The other contenders are
/// compiled before they start (cargo, go build), so the measurement starts once wasmop's
/// compile is done too: a one-time cost of a new module digest (later starts load it from the
/// compiled cache), measured by `make bench-hotswap` and `make bench-dispatch`.
async fn optimized(host: &HostProcess) {
    let began = Instant::now();
    let serving = |host: &HostProcess| {
        host.lines()
            .iter()
            .any(|l| l["fields"]["message"].as_str() == Some("the optimized build now serves"))
    };
    while !serving(host) {
        if began.elapsed() > Duration::from_secs(300) {
            eprintln!(
                "[bench] wasmop: no optimized build serving after 300 s (tiered compilation off?); measuring anyway"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "[bench] wasmop: optimized build serving {:.1} s after ready",
        began.elapsed().as_secs_f64()
    );
}

/// The `wasmop` binary of the same build profile as the running benchmark or test (`cargo build`
/// into the same target directory; a no-op when it is fresh): `--profile bench` for `cargo
/// bench`, the dev profile for `cargo test`. `WASMOP_BENCH_BINARY` names another build instead
/// (the release image's static musl binary, say), used as it is: nothing is built. A relative
/// path is read from the repository's root (cargo runs a bench in its package's directory).
///
/// # Errors
/// If cargo cannot be run or the build fails, or `WASMOP_BENCH_BINARY` names no file.
pub async fn binary() -> Result<std::path::PathBuf> {
    if let Some(named) = std::env::var_os("WASMOP_BENCH_BINARY") {
        let named = repo().join(named);
        if !named.is_file() {
            return Err(Error::Other(format!(
                "WASMOP_BENCH_BINARY={} is not a file",
                named.display()
            )));
        }
        eprintln!(
            "[bench] wasmop: the binary named by WASMOP_BENCH_BINARY, {}",
            named.display()
        );
        return Ok(named);
    }
    // <target>/<profile dir>/deps/<binary>
    let exe = std::env::current_exe().map_err(Error::io("finding", "the running binary"))?;
    let (Some(profile_dir), Some(target)) = (exe.ancestors().nth(2), exe.ancestors().nth(3)) else {
        return Err(Error::Other(format!(
            "unexpected binary path {}",
            exe.display()
        )));
    };
    let dir_name = profile_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut command = wasmop_testenv::cargo::command();
    command.arg("build");
    if dir_name == "release" {
        // As `make bench-scale` builds it (workspace features, so nothing is built twice).
        command.args(["--profile", "bench", "--workspace"]);
    } else {
        // As the e2e tests build it (tests/e2e/faults.rs).
        command.args(["-p", "wasmop"]);
    }
    command
        .args(["--bin", "wasmop", "--target-dir"])
        .arg(target)
        .current_dir(repo());
    let status = command
        .status()
        .await
        .map_err(Error::io("running", "cargo build"))?;
    if !status.success() {
        return Err(Error::Other(format!(
            "cargo build -p wasmop failed: {status}"
        )));
    }
    Ok(profile_dir.join("wasmop"))
}
