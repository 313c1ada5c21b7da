//! Finding, or building, the control-plane binaries.
//!
//! Resolution order, for each binary separately:
//! 1. `$KUBEBUILDER_ASSETS/<binary>` (the controller-runtime envtest convention), when present;
//! 2. the cache, `$WASMOP_CACHE/bin/<component>-<version>/<binary>` (default cache
//!    `~/.cache/wasmop`), keyed by the pinned versions below;
//! 3. otherwise the whole component is built from the Go module proxy with the pinned, checked-in
//!    `go.mod`/`go.sum` under `tests/controlplane/go/<component>/` and installed into the cache.
//!
//! # Guarantees
//! - A build happens at most once at a time per cache (a file lock serialises concurrent test
//!   binaries) and is installed atomically (a half-built directory is never used).
//! - Builds use `-mod=readonly`: what is built is exactly what the checked-in `go.sum` pins.
//! - Progress is printed to stderr while building, at least every 15 seconds, and when a build
//!   waits for another process's build (the cache's lock) before it starts.
//!
//! # Errors
//! [`Error::MissingBinary`] when a binary can be neither found nor built (for example, no Go),
//! [`Error::Build`] when a build ran and failed (with the tail of its log).

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The pinned Kubernetes release (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl).
pub const KUBERNETES_VERSION: &str = "v1.37.2";
/// The pinned etcd release (the one Kubernetes 1.37 ships with).
pub const ETCD_VERSION: &str = "v3.7.0";
/// The pinned kwok release.
pub const KWOK_VERSION: &str = "v0.8.0";

/// The kwok Stage files (inside the kwok module) that give fake nodes and pods their lifecycle:
/// nodes become Ready and keep a Lease, pods become Running/Ready, Job pods complete, and deleted
/// pods go away (no kubelet confirms it).
const KWOK_STAGES: &[&str] = &[
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
];

/// The file name, in the kwok cache directory, of the assembled Stage documents.
const KWOK_STAGES_FILE: &str = "stages.yaml";

/// Paths to every binary and data file the control plane needs.
#[derive(Debug, Clone)]
pub struct Assets {
    /// etcd.
    pub etcd: PathBuf,
    /// kube-apiserver.
    pub kube_apiserver: PathBuf,
    /// kube-controller-manager.
    pub kube_controller_manager: PathBuf,
    /// kube-scheduler.
    pub kube_scheduler: PathBuf,
    /// kubectl of the same release, for people and scripts.
    pub kubectl: PathBuf,
    /// kwok.
    pub kwok: PathBuf,
    /// kwok's Stage documents (multi-document YAML).
    pub kwok_stages: PathBuf,
}

/// One buildable component: a Go helper module and the binaries it produces.
#[derive(Debug, Clone, Copy)]
struct Component {
    /// Directory name under `tests/controlplane/go/` and cache prefix.
    name: &'static str,
    version: &'static str,
    /// (binary file name, Go package path) pairs.
    binaries: &'static [(&'static str, &'static str)],
}

const KUBERNETES: Component = Component {
    name: "kubernetes",
    version: KUBERNETES_VERSION,
    binaries: &[
        ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
        (
            "kube-controller-manager",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
        ),
        ("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),
        ("kubectl", "k8s.io/kubernetes/cmd/kubectl"),
    ],
};
const ETCD: Component = Component {
    name: "etcd",
    version: ETCD_VERSION,
    binaries: &[("etcd", "go.etcd.io/etcd/server/v3")],
};
const KWOK: Component = Component {
    name: "kwok",
    version: KWOK_VERSION,
    binaries: &[("kwok", "sigs.k8s.io/kwok/cmd/kwok")],
};

/// The pinned OCI registry (distribution/distribution, `cmd/registry`).
pub const REGISTRY_VERSION: &str = "v3.1.2";

const REGISTRY: Component = Component {
    name: "registry",
    version: REGISTRY_VERSION,
    binaries: &[(
        "registry",
        "github.com/distribution/distribution/v3/cmd/registry",
    )],
};

/// The pinned cosign release (`cmd/cosign`): proves that module signatures are
/// cosign-compatible, in both directions.
pub const COSIGN_VERSION: &str = "v2.6.5";

const COSIGN: Component = Component {
    name: "cosign",
    version: COSIGN_VERSION,
    binaries: &[("cosign", "github.com/sigstore/cosign/v2/cmd/cosign")],
};

/// The pinned go-containerregistry release (`cmd/crane`): assembles and pushes the host's image
/// without a container daemon (`make image`).
pub const CRANE_VERSION: &str = "v0.22.1";

const CRANE: Component = Component {
    name: "crane",
    version: CRANE_VERSION,
    binaries: &[("crane", "github.com/google/go-containerregistry/cmd/crane")],
};

/// The pinned Helm release (`cmd/helm`): lints, renders and installs the chart in
/// deploy/helm/wasmop (the chart tests and the deploy test).
pub const HELM_VERSION: &str = "v3.22.0";

/// The Kubernetes minor version of the client libraries the pinned Helm is built with: what
/// `helm template` and `helm lint` assume without a cluster.
const HELM_KUBERNETES_MINOR: &str = "37";

const HELM: Component = Component {
    name: "helm",
    version: HELM_VERSION,
    binaries: &[("helm", "helm.sh/helm/v3/cmd/helm")],
};

/// The pinned Prometheus module (`cmd/promtool`): checks and unit-tests the alert rules in
/// deploy/monitoring/.
pub const PROMTOOL_VERSION: &str = "v0.316.0";

const PROMTOOL: Component = Component {
    name: "promtool",
    version: PROMTOOL_VERSION,
    binaries: &[("promtool", "github.com/prometheus/prometheus/cmd/promtool")],
};

/// Finds, or builds, the helm binary (same order as the control plane's binaries).
///
/// # Errors
/// As [`Assets::provide`].
pub fn helm_binary() -> Result<PathBuf> {
    single_binary(HELM)
}

/// Finds, or builds, the promtool binary (same order as the control plane's binaries).
///
/// # Errors
/// As [`Assets::provide`].
pub fn promtool_binary() -> Result<PathBuf> {
    single_binary(PROMTOOL)
}

/// Finds, or builds, the OCI registry binary (same order as the control plane's binaries).
///
/// # Errors
/// As [`Assets::provide`].
pub fn registry_binary() -> Result<PathBuf> {
    single_binary(REGISTRY)
}

/// Finds, or builds, the cosign binary (same order as the control plane's binaries).
///
/// # Errors
/// As [`Assets::provide`].
pub fn cosign_binary() -> Result<PathBuf> {
    single_binary(COSIGN)
}

/// Finds, or builds, the crane binary (same order as the control plane's binaries).
///
/// # Errors
/// As [`Assets::provide`].
pub fn crane_binary() -> Result<PathBuf> {
    single_binary(CRANE)
}

fn single_binary(component: Component) -> Result<PathBuf> {
    let found = provide_component(&cache_dir(), component)?;
    found
        .into_iter()
        .next()
        .ok_or_else(|| Error::MissingBinary {
            binary: component.name.into(),
            version: component.version.into(),
            reason: "the build produced nothing".into(),
            cache: cache_dir(),
        })
}

/// The pinned OpenTelemetry Collector (core `otlp` receiver, contrib `file` exporter), built from
/// the builder-generated module under `tests/controlplane/go/otelcol/`.
pub const OTELCOL_VERSION: &str = "v0.165.0";

const OTELCOL: Component = Component {
    name: "otelcol",
    version: OTELCOL_VERSION,
    binaries: &[("otelcol-wasmop", "wasmop.dev/controlplane/otelcol")],
};

/// Finds, or builds, the OpenTelemetry Collector binary (same order as the control plane's
/// binaries).
///
/// # Errors
/// As [`Assets::provide`].
pub fn otelcol_binary() -> Result<PathBuf> {
    let found = provide_component(&cache_dir(), OTELCOL)?;
    found
        .into_iter()
        .next()
        .ok_or_else(|| Error::MissingBinary {
            binary: "otelcol-wasmop".into(),
            version: OTELCOL_VERSION.into(),
            reason: "the build produced nothing".into(),
            cache: cache_dir(),
        })
}

/// The cache directory: `$WASMOP_CACHE`, else `$XDG_CACHE_HOME/wasmop`, else `~/.cache/wasmop`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("WASMOP_CACHE").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir).join("wasmop");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("wasmop")
}

/// Where the checked-in Go helper modules are.
fn go_modules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("controlplane")
        .join("go")
}

impl Assets {
    /// Finds every binary, building what is missing (see the module docs for the order).
    ///
    /// # Errors
    /// See the module docs.
    pub fn provide() -> Result<Self> {
        let cache = cache_dir();
        let kubernetes = provide_component(&cache, KUBERNETES)?;
        let etcd = provide_component(&cache, ETCD)?;
        let kwok = provide_component(&cache, KWOK)?;
        let kwok_stages = provide_kwok_stages(&cache)?;
        let pick = |paths: &[PathBuf], name: &str| -> PathBuf {
            paths
                .iter()
                .find(|p| p.file_name().is_some_and(|f| f == name))
                .cloned()
                .unwrap_or_default()
        };
        Ok(Assets {
            etcd: pick(&etcd, "etcd"),
            kube_apiserver: pick(&kubernetes, "kube-apiserver"),
            kube_controller_manager: pick(&kubernetes, "kube-controller-manager"),
            kube_scheduler: pick(&kubernetes, "kube-scheduler"),
            kubectl: pick(&kubernetes, "kubectl"),
            kwok: pick(&kwok, "kwok"),
            kwok_stages,
        })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn component_cache_dir(cache: &Path, component: Component) -> PathBuf {
    cache
        .join("bin")
        .join(format!("{}-{}", component.name, component.version))
}

/// Returns one path per binary of `component`, building the component into the cache when a
/// binary is neither in `$KUBEBUILDER_ASSETS` nor in the cache.
fn provide_component(cache: &Path, component: Component) -> Result<Vec<PathBuf>> {
    let assets = std::env::var_os("KUBEBUILDER_ASSETS")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let cached = component_cache_dir(cache, component);
    let find = |name: &str| -> Option<PathBuf> {
        assets
            .as_ref()
            .map(|dir| dir.join(name))
            .filter(|p| is_executable(p))
            .or_else(|| Some(cached.join(name)).filter(|p| is_executable(p)))
    };
    let found: Option<Vec<PathBuf>> = component
        .binaries
        .iter()
        .map(|(name, _)| find(name))
        .collect();
    if let Some(found) = found {
        return Ok(found);
    }
    build_component(cache, component)?;
    component
        .binaries
        .iter()
        .map(|(name, _)| {
            find(name).ok_or_else(|| Error::MissingBinary {
                binary: (*name).to_string(),
                version: component.version.to_string(),
                reason: "the build finished but did not produce it".into(),
                cache: cache.to_path_buf(),
            })
        })
        .collect()
}

/// Takes the cache's build lock, blocking until no other process builds; says so on stderr
/// when it has to wait.
fn lock_cache(cache: &Path) -> Result<File> {
    lock_cache_with(cache, |path| {
        eprintln!(
            "[testenv] waiting for another process's build of the test tools to finish (lock {})",
            path.display()
        );
    })
}

/// [`lock_cache`], calling `waiting` before it blocks on a lock another process holds.
fn lock_cache_with(cache: &Path, waiting: impl FnOnce(&Path)) -> Result<File> {
    let dir = cache.join("bin");
    fs::create_dir_all(&dir).map_err(Error::io("creating", &dir))?;
    let path = dir.join(".build.lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(Error::io("opening", &path))?;
    match file.try_lock() {
        Ok(()) => return Ok(file),
        Err(fs::TryLockError::WouldBlock) => waiting(&path),
        Err(fs::TryLockError::Error(e)) => return Err(Error::io("locking", &path)(e)),
    }
    file.lock().map_err(Error::io("locking", &path))?;
    Ok(file)
}

fn go_command(work_dir: &Path) -> Command {
    let mut cmd = Command::new("go");
    cmd.current_dir(work_dir)
        // Never fetch another Go toolchain; build exactly what go.sum pins; static binaries.
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=readonly")
        .env("CGO_ENABLED", "0");
    cmd
}

fn build_component(cache: &Path, component: Component) -> Result<()> {
    let _lock = lock_cache(cache)?;
    let target = component_cache_dir(cache, component);
    if component
        .binaries
        .iter()
        .all(|(name, _)| is_executable(&target.join(name)))
    {
        return Ok(()); // Another process built it while we waited for the lock.
    }
    let missing = |reason: String| Error::MissingBinary {
        binary: component
            .binaries
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", "),
        version: component.version.to_string(),
        reason,
        cache: cache.to_path_buf(),
    };
    let go_version = Command::new("go")
        .arg("version")
        .env("GOTOOLCHAIN", "local")
        .output();
    match go_version {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            return Err(missing(format!(
                "`go version` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Err(e) => {
            return Err(missing(format!(
                "they are not in the cache and `go` cannot be run to build them ({e})"
            )));
        }
    }

    let src = go_modules_dir().join(component.name);
    let work = cache
        .join("build")
        .join(format!("{}-{}", component.name, component.version));
    fs::create_dir_all(&work).map_err(Error::io("creating", &work))?;
    // go.mod, go.sum and the Go sources (tools.go, or a main package of the helper module).
    for entry in fs::read_dir(&src).map_err(Error::io("reading", &src))? {
        let from = entry.map_err(Error::io("reading", &src))?.path();
        let name = from
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if from.is_file() && (name.ends_with(".go") || name == "go.mod" || name == "go.sum") {
            fs::copy(&from, work.join(name)).map_err(Error::io("copying", &from))?;
        }
    }
    let staging = target.with_extension("partial");
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging).map_err(Error::io("creating", &staging))?;

    let mut ldflags = String::from("-s -w");
    if component.name == KUBERNETES.name {
        // Without these, /version reports the placeholder v0.0.0-master and version-gated
        // features and clients that parse gitVersion misbehave.
        let minor = component.version.split('.').nth(1).unwrap_or("0");
        for (key, value) in [
            ("gitVersion", component.version),
            ("gitMajor", "1"),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
            ("buildDate", "1970-01-01T00:00:00Z"),
        ] {
            for pkg in [
                "k8s.io/component-base/version",
                "k8s.io/client-go/pkg/version",
            ] {
                ldflags.push_str(&format!(" -X '{pkg}.{key}={value}'"));
            }
        }
    }
    if component.name == HELM.name {
        // As Helm's Makefile sets them: without these, `helm version` is the module's and
        // `helm template` and `helm lint` assume Kubernetes v1.20 (the chart needs >= 1.30).
        // The Kubernetes minor is that of the client-go Helm v3.22 builds with (v0.37).
        ldflags.push_str(&format!(
            " -X 'helm.sh/helm/v3/internal/version.version={}'",
            component.version
        ));
        for pkg in [
            "helm.sh/helm/v3/pkg/chartutil",
            "helm.sh/helm/v3/pkg/lint/rules",
        ] {
            ldflags.push_str(&format!(
                " -X '{pkg}.k8sVersionMajor=1' -X '{pkg}.k8sVersionMinor={HELM_KUBERNETES_MINOR}'"
            ));
        }
    }
    // With several packages, `-o DIR/` writes one binary each, named after the package; a single
    // package is named explicitly (`go.etcd.io/etcd/server/v3` would otherwise become `server`).
    let out_dir = match component.binaries {
        [(name, _)] => staging.join(name).into_os_string(),
        _ => {
            let mut dir = staging.clone().into_os_string();
            dir.push("/");
            dir
        }
    };
    let mut cmd = go_command(&work);
    cmd.arg("build")
        .arg("-v")
        .arg("-trimpath")
        .arg("-ldflags")
        .arg(&ldflags)
        .arg("-o")
        .arg(&out_dir);
    for (_, package) in component.binaries {
        cmd.arg(package);
    }
    let what = format!("{} {}", component.name, component.version);
    run_with_progress(
        cmd,
        &what,
        &cache
            .join("build-logs")
            .join(format!("{}-{}.log", component.name, component.version)),
    )?;

    let _ = fs::remove_dir_all(&target);
    fs::rename(&staging, &target).map_err(Error::io("installing", &target))?;
    eprintln!("[testenv] installed {what} into {}", target.display());
    Ok(())
}

/// Runs a Go command, printing a progress line at least every 15 s, and keeps its output in `log`.
fn run_with_progress(mut cmd: Command, what: &str, log: &Path) -> Result<()> {
    if let Some(dir) = log.parent() {
        fs::create_dir_all(dir).map_err(Error::io("creating", dir))?;
    }
    let mut log_file = File::create(log).map_err(Error::io("creating", log))?;
    eprintln!(
        "[testenv] building {what} from Go modules (first time only; this takes minutes); log: {}",
        log.display()
    );
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Build {
            what: what.into(),
            detail: format!("cannot run go: {e}"),
            log: log.into(),
        })?;
    let packages = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ticker = {
        let (packages, done, what) = (packages.clone(), done.clone(), what.to_string());
        std::thread::spawn(move || {
            let mut last = Instant::now();
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                if last.elapsed() >= Duration::from_secs(15) {
                    last = Instant::now();
                    eprintln!(
                        "[testenv] building {what}: {} packages compiled, {}s elapsed",
                        packages.load(Ordering::Relaxed),
                        start.elapsed().as_secs()
                    );
                }
            }
        })
    };
    let mut tail: Vec<String> = Vec::new();
    if let Some(stderr) = child.stderr.take() {
        for line in BufReader::new(stderr)
            .lines()
            .map_while(std::result::Result::ok)
        {
            let _ = writeln!(log_file, "{line}");
            if !line.starts_with("go: downloading") {
                packages.fetch_add(1, Ordering::Relaxed);
            }
            tail.push(line);
            if tail.len() > 30 {
                tail.remove(0);
            }
        }
    }
    let status = child.wait();
    done.store(true, Ordering::Relaxed);
    let _ = ticker.join();
    match status {
        Ok(s) if s.success() => {
            eprintln!("[testenv] built {what} in {}s", start.elapsed().as_secs());
            Ok(())
        }
        Ok(s) => Err(Error::Build {
            what: what.into(),
            detail: format!("{s}\n{}", tail.join("\n")),
            log: log.into(),
        }),
        Err(e) => Err(Error::Build {
            what: what.into(),
            detail: e.to_string(),
            log: log.into(),
        }),
    }
}

/// Assembles kwok's Stage documents from the kwok module (downloaded through the Go module
/// proxy) into the kwok cache directory, once.
fn provide_kwok_stages(cache: &Path) -> Result<PathBuf> {
    let dir = component_cache_dir(cache, KWOK);
    let path = dir.join(KWOK_STAGES_FILE);
    if path.is_file() {
        return Ok(path);
    }
    let _lock = lock_cache(cache)?;
    if path.is_file() {
        return Ok(path);
    }
    let module = format!("sigs.k8s.io/kwok@{KWOK_VERSION}");
    eprintln!("[testenv] downloading kwok's Stage files ({module}, first time only)");
    let out = go_command(&go_modules_dir().join(KWOK.name))
        .args(["mod", "download", "-json", &module])
        .output()
        .map_err(|e| Error::MissingBinary {
            binary: KWOK_STAGES_FILE.into(),
            version: KWOK_VERSION.into(),
            reason: format!(
                "kwok's Stage files come from its Go module and `go` cannot be run ({e})"
            ),
            cache: cache.to_path_buf(),
        })?;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let Some(module_dir) = json.get("Dir").and_then(|d| d.as_str()) else {
        return Err(Error::Build {
            what: format!("download of {module}"),
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
            log: path,
        });
    };
    let mut docs = Vec::new();
    for stage in KWOK_STAGES {
        let file = Path::new(module_dir).join(stage);
        docs.push(fs::read_to_string(&file).map_err(Error::io("reading", &file))?);
    }
    fs::create_dir_all(&dir).map_err(Error::io("creating", &dir))?;
    let partial = path.with_extension("partial");
    fs::write(&partial, docs.join("\n---\n")).map_err(Error::io("writing", &partial))?;
    fs::rename(&partial, &path).map_err(Error::io("installing", &path))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_waiting_for_the_lock_says_so() {
        let cache = tempfile::tempdir().expect("a temporary directory");
        // Not waiting: no word.
        let first = lock_cache_with(cache.path(), |_| panic!("nobody holds the lock"))
            .expect("the free lock");
        let (said, heard) = std::sync::mpsc::channel();
        let dir = cache.path().to_path_buf();
        let second = std::thread::spawn(move || {
            lock_cache_with(&dir, |path| {
                let _ = said.send(path.to_path_buf());
            })
            .map(drop)
        });
        // The second waits on the first and says so; then the first lets go.
        let path = heard.recv().expect("word of waiting");
        assert_eq!(path, cache.path().join("bin").join(".build.lock"));
        drop(first);
        second
            .join()
            .expect("the waiting thread")
            .expect("the lock once the first let go");
    }
}
