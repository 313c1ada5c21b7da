//! The memory of an idle host with many loaded modules (`make bench-idle-host`): M
//! WasmReconcilers (default 20), each with its own module and no objects, served by `wasmop
//! run` on a fresh control plane; the host's VmRSS and VmHWM once every module is loaded, its
//! caches are synced and every optimized build serves.
//!
//! The M modules are the image-updater component with a custom section naming its index
//! appended, so each has its own digest and is compiled and held on its own (M copies of one
//! digest would share one compiled module and understate the cost). Each WasmReconciler serves
//! Apps in its own namespace `idle-<i>` (one reconciler per primary kind and namespace), with the
//! example's RBAC in that namespace.
//!
//! # Guarantees
//! - The figures are read only after `/readyz` is 200 and the host logged M optimized builds
//!   serving, then 5 s of quiet: what an idle host holds, not a compile in flight (VmHWM keeps
//!   the compile peak).
//!
//! # Errors
//! Any step's error, with the host's log tail when the host is involved.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wasmop_testenv::HostProcess;

use crate::cluster::{Cluster, repo, yaml_docs};
use crate::procstat;
use crate::{Error, Result};

/// What the idle host holds.
#[derive(Debug, Clone, Copy)]
pub struct IdleHost {
    /// Loaded modules (WasmReconcilers).
    pub modules: usize,
    /// Resident set size once idle, bytes (VmRSS).
    pub rss: u64,
    /// Peak resident set size since the start, bytes (VmHWM: includes compiling).
    pub peak_rss: u64,
    /// Of `rss`: anonymous memory (heap, pools, compiled code copied into anonymous pages),
    /// bytes (`RssAnon`).
    pub rss_anon: u64,
    /// Of `rss`: file-backed pages (the binary's own text and data, mapped compiled artifacts),
    /// bytes (`RssFile`).
    pub rss_file: u64,
    /// From the start of the host to every optimized build serving.
    pub load: Duration,
}

/// How the idle host is run beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Extra arguments of `wasmop run` (`WASMOP_BENCH_HOST_ARGS`, split on whitespace).
    pub host_args: Vec<String>,
    /// Keep the host running this long after the reading, for `/proc/<pid>/smaps` and the like
    /// (`WASMOP_BENCH_HOLD`, seconds).
    pub hold: Option<Duration>,
}

fn failed(detail: String) -> Error {
    Error::Controller {
        contender: "wasmop (idle host)".into(),
        detail,
    }
}

/// The example's RBAC with namespace `demo` replaced by `ns`.
fn rbac_in(ns: &str) -> Result<Vec<Value>> {
    let path = repo().join("examples/image-updater/k8s/rbac.yaml");
    let text = serde_json::to_string(&yaml_docs(&path)?)
        .map_err(|e| Error::Other(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text.replace("\"demo\"", &format!("\"{ns}\"")))
        .map_err(|e| Error::Other(format!("{}: {e}", path.display())))
}

async fn push(wasmop: &Path, file: &Path, ns: &str, kubeconfig: &str) -> Result<()> {
    let out = tokio::process::Command::new(wasmop)
        .arg("push")
        .arg(file)
        .args([
            "--name",
            "image-updater",
            "-n",
            ns,
            "--kubeconfig",
            kubeconfig,
        ])
        .output()
        .await
        .map_err(Error::io("running", wasmop))?;
    if !out.status.success() {
        return Err(failed(format!(
            "wasmop push -n {ns} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// Registers `modules` WasmReconcilers with distinct modules and measures the idle host.
///
/// # Errors
/// See the module docs.
pub async fn measure(
    wasmop: &Path,
    module: &Path,
    modules: usize,
    dir: &Path,
    options: &Options,
) -> Result<IdleHost> {
    let cluster = Cluster::start().await?;
    cluster
        .apply_yaml(&repo().join("deploy/crds/wasmreconciler.yaml"))
        .await?;
    std::fs::create_dir_all(dir).map_err(Error::io("creating", dir))?;
    let component = std::fs::read(module).map_err(Error::io("reading", module))?;
    let kubeconfig = cluster.kubeconfig().display().to_string();
    let template = yaml_docs(&repo().join("examples/image-updater/k8s/wasmreconciler.yaml"))?;
    for i in 0..modules {
        let ns = format!("idle-{i}");
        cluster.apply(rbac_in(&ns)?).await?;
        let file = dir.join(format!("image_updater_{i}.wasm"));
        std::fs::write(&file, wasmop_test_modules::variant(&component, i))
            .map_err(Error::io("writing", &file))?;
        push(wasmop, &file, &ns, &kubeconfig).await?;
        let mut docs = template.clone();
        for doc in &mut docs {
            doc["metadata"]["name"] = json!(format!("image-updater-{i}"));
            doc["spec"]["module"]["configMap"]["namespace"] = json!(ns);
            doc["spec"]["namespaces"] = json!([ns]);
            doc["spec"]["serviceAccount"]["namespace"] = json!(ns);
        }
        cluster.apply(docs).await?;
    }
    eprintln!("[bench] idle host: {modules} WasmReconcilers registered; starting wasmop run");
    let args = [
        "--log-format",
        "json",
        "run",
        "--kubeconfig",
        &kubeconfig,
        "--metrics-addr",
        "127.0.0.1:0",
        "--webhook-addr",
        "off",
        "--cache-dir",
        &dir.join("compiled").display().to_string(),
    ]
    .map(str::to_string)
    .to_vec();
    let args = args.into_iter().chain(options.host_args.clone()).collect();
    let started = Instant::now();
    let host = HostProcess::start(wasmop, args, "info", dir)
        .await
        .map_err(|e| failed(format!("{e:#}")))?;
    let optimized = |host: &HostProcess| {
        host.lines()
            .iter()
            .filter(|l| l["fields"]["message"].as_str() == Some("the optimized build now serves"))
            .count()
    };
    loop {
        let ready = matches!(host.readyz().await, Ok((200, _)));
        if ready && optimized(&host) >= modules {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err(failed(format!(
                "not ready with {modules} optimized builds within 600 s ({} so far); log:\n{}",
                optimized(&host),
                host.log_text()
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let load = started.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pid = host
        .pid()
        .ok_or_else(|| failed(format!("the host exited; log:\n{}", host.log_text())))?;
    let peak = procstat::read(pid)?;
    let [rss, rss_anon, rss_file] = procstat::status_kib(pid, ["VmRSS:", "RssAnon:", "RssFile:"])?;
    if let Some(hold) = options.hold {
        eprintln!(
            "[bench] idle host: pid {pid} held for {} s (WASMOP_BENCH_HOLD); logs in {}",
            hold.as_secs(),
            dir.display()
        );
        tokio::time::sleep(hold).await;
    }
    drop(host);
    drop(cluster);
    Ok(IdleHost {
        modules,
        rss: rss * 1024,
        peak_rss: peak.peak_rss,
        rss_anon: rss_anon * 1024,
        rss_file: rss_file * 1024,
        load,
    })
}
