//! Starting and stopping a real local control plane.
//!
//! etcd, kube-apiserver (TLS, RBAC, service-account issuer and keys), kube-controller-manager,
//! kube-scheduler and kwok, all on loopback with ephemeral ports and one temporary directory,
//! then fake nodes that kwok keeps Ready so pods are scheduled and become Running/Ready.
//!
//! # Guarantees
//! - [`ControlPlane::start`] returns only when `/readyz` is ok, the controller-manager and the
//!   scheduler answer `/healthz`, every node is Ready and untainted, and the `default`
//!   ServiceAccount exists (so the controller-manager's controllers are running).
//! - With [`Options::webhook_client_cert`] (the default), kube-apiserver presents
//!   [`Pki::webhook_client_cert`] to every admission webhook that asks for a client certificate
//!   (its admission configuration's webhook kubeconfig, user `*`: every host and port). A
//!   webhook that asks for none sees no difference.
//! - kube-apiserver keeps an audit log of the reads (`get`) of Deployments and Services, one
//!   line per request with its user ([`ControlPlane::child_reads`]): a test that counts a
//!   controller's reads tells them from the control plane's own (the controller-manager's
//!   garbage collector, for one, reads an owner it has not observed yet).
//! - Dropping the [`ControlPlane`] stops every process (SIGTERM, then SIGKILL after a grace
//!   period) and removes the temporary directory, unless [`ControlPlane::keep`] was called.
//!   If the owning process dies without dropping it, the [`Reaper`] does the same.
//!
//! # Errors
//! See [`Error`]: missing binaries, a component that exits or does not become ready in time
//! (with the tail of its log and the log directory).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::assets::Assets;
use crate::error::{Error, Result};
use crate::pki::Pki;
use crate::process::{KEEP_MARKER, Process, Reaper, tail};

/// How to start a control plane.
#[derive(Debug, Clone)]
pub struct Options {
    /// How many kwok nodes to create (at least 1).
    pub nodes: usize,
    /// How many pods each kwok node takes (its `pods` capacity; at least 1). Benchmarks that
    /// run more pods than `nodes * 110` raise it, so every pod is scheduled.
    pub pods_per_node: u32,
    /// Budget for each readiness wait.
    pub ready_timeout: Duration,
    /// kube-apiserver feature gates to turn on (e.g. `ShardedListAndWatch`).
    pub feature_gates: Vec<String>,
    /// Present [`Pki::webhook_client_cert`] to admission webhooks that ask for a client
    /// certificate. On by default: it costs two small files, and webhooks that ask for none
    /// (every host without `--webhook-client-ca`) see no difference.
    pub webhook_client_cert: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 2,
            pods_per_node: 110,
            ready_timeout: Duration::from_secs(90),
            feature_gates: Vec::new(),
            webhook_client_cert: true,
        }
    }
}

/// A running local control plane. Drop it to tear it down.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    logs: PathBuf,
    kubeconfig: PathBuf,
    server: String,
    pki: Pki,
    assets: Assets,
    nodes: Vec<String>,
    /// The components in start order. Behind a lock so that faults (see [`crate::faults`]) can
    /// kill and restart one through a shared `&ControlPlane`; never held across an await.
    processes: Mutex<Vec<Process>>,
    reaper: Mutex<Option<Reaper>>,
    /// etcd's client port (its HTTP gateway serves the v3 API there).
    pub(crate) etcd_client: u16,
    started_in: Duration,
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(Error::io("binding", "127.0.0.1:0"))?;
    let port = listener
        .local_addr()
        .map_err(Error::io("binding", "127.0.0.1:0"))?
        .port();
    Ok(port)
}

fn new_cluster_dir() -> Result<PathBuf> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "wasmop-testenv-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(Error::io("creating", &dir))?;
    Ok(dir)
}

/// Writes a kubeconfig for `server` authenticating with the given client certificate.
///
/// # Errors
/// [`Error::Io`] if it cannot be written.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    cert: &Path,
    key: &Path,
    user: &str,
) -> Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: wasmop-testenv\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
         users:\n- name: {user}\n  user:\n    client-certificate: {cert}\n    client-key: {key}\n\
         contexts:\n- name: wasmop-testenv\n  context:\n    cluster: wasmop-testenv\n    user: {user}\n\
         current-context: wasmop-testenv\n",
        ca = ca.display(),
        cert = cert.display(),
        key = key.display(),
    );
    std::fs::write(path, text).map_err(Error::io("writing", path))
}

/// The audit log's file name in the log directory.
const AUDIT_LOG: &str = "audit.log";

/// Writes kube-apiserver's audit policy: reads of Deployments and Services at `Metadata` level
/// (who, what, answer), once each request completes; nothing else. Returns its path.
///
/// # Errors
/// [`Error::Io`] if it cannot be written.
fn write_audit_policy(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("audit-policy.yaml");
    let policy = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [get]
  resources:
  - group: apps
    resources: [deployments]
  - group: ""
    resources: [services]
- level: None
"#;
    std::fs::write(&path, policy).map_err(Error::io("writing", &path))?;
    Ok(path)
}

/// One read of a Deployment or Service, from the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildRead {
    /// The authenticated user (the impersonator when a request impersonates).
    pub user: String,
    /// The request's URI.
    pub uri: String,
}

/// Writes kube-apiserver's admission configuration: the validating and mutating webhook plugins
/// present `pki`'s webhook client certificate to every webhook (kubeconfig user `*`: any
/// `host:port` of a URL webhook and any Service). Returns the configuration's path.
///
/// # Errors
/// [`Error::Io`] if a file cannot be read or written.
pub fn write_admission_config(dir: &Path, pki: &Pki) -> Result<PathBuf> {
    use base64::Engine as _;
    let data = |path: &Path| -> Result<String> {
        let pem = std::fs::read(path).map_err(Error::io("reading", path))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(pem))
    };
    let kubeconfig = dir.join("webhook-client.kubeconfig");
    let users = format!(
        "apiVersion: v1\nkind: Config\nusers:\n- name: '*'\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
        data(&pki.webhook_client_cert)?,
        data(&pki.webhook_client_key)?,
    );
    std::fs::write(&kubeconfig, users).map_err(Error::io("writing", &kubeconfig))?;
    let plugin = |name: &str| {
        format!(
            "- name: {name}\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: {}\n",
            kubeconfig.display()
        )
    };
    let config = dir.join("admission.yaml");
    let text = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n{}{}",
        plugin("ValidatingAdmissionWebhook"),
        plugin("MutatingAdmissionWebhook"),
    );
    std::fs::write(&config, text).map_err(Error::io("writing", &config))?;
    Ok(config)
}

/// Makes ring the process's rustls crypto provider, once. Builds that also link the wasmop host
/// compile rustls with a second provider (aws-lc-rs, for sigstore), and then kube cannot build a
/// TLS client until a default is installed; every client made here calls this first.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Builds a client from a kubeconfig file.
///
/// # Errors
/// [`Error::Kubeconfig`] if it cannot be read, [`Error::Kube`] if no client can be made from it.
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client> {
    install_crypto_provider();
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig {
        path: path.into(),
        detail: e.to_string(),
    })?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig {
            path: path.into(),
            detail: e.to_string(),
        })?;
    Ok(Client::try_from(config)?)
}

impl ControlPlane {
    /// Provides the binaries (building them the first time) and starts a control plane.
    ///
    /// Port clashes with other processes are retried, up to three attempts.
    ///
    /// # Errors
    /// See the module docs.
    pub async fn start(options: Options) -> Result<Self> {
        let assets = tokio::task::spawn_blocking(Assets::provide)
            .await
            .map_err(|e| Error::MissingBinary {
                binary: "control plane".into(),
                version: String::new(),
                reason: format!("the provisioning task failed: {e}"),
                cache: crate::assets::cache_dir(),
            })??;
        let mut last = None;
        for attempt in 1..=3 {
            match Self::start_once(&assets, &options).await {
                Ok(cp) => return Ok(cp),
                Err(e) => {
                    let retry = matches!(e, Error::Exited { .. }) && attempt < 3;
                    if !retry {
                        return Err(e);
                    }
                    eprintln!(
                        "[testenv] start attempt {attempt} failed, retrying with new ports: {e}"
                    );
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::NotReady {
            what: "control plane".into(),
            seconds: 0,
            last: "no attempt made".into(),
            logs: PathBuf::new(),
        }))
    }

    async fn start_once(assets: &Assets, options: &Options) -> Result<Self> {
        let began = Instant::now();
        let dir = new_cluster_dir()?;
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(Error::io("creating", &logs))?;
        let reaper = Reaper::start(&dir)?;
        let pki = Pki::write(&dir.join("pki"))?;
        let secure_port = free_port()?;
        let server = format!("https://127.0.0.1:{secure_port}");
        let kubeconfig = dir.join("kubeconfig");
        write_kubeconfig(
            &kubeconfig,
            &server,
            &pki.ca_cert,
            &pki.admin_cert,
            &pki.admin_key,
            "wasmop-admin",
        )?;
        let mut cp = ControlPlane {
            dir,
            logs,
            kubeconfig,
            server,
            pki,
            assets: assets.clone(),
            nodes: Vec::new(),
            processes: Mutex::new(Vec::new()),
            reaper: Mutex::new(Some(reaper)),
            etcd_client: 0,
            started_in: Duration::ZERO,
        };
        cp.start_etcd_and_apiserver(secure_port, options).await?;
        cp.start_controllers(options).await?;
        cp.create_nodes(options).await?;
        cp.started_in = began.elapsed();
        Ok(cp)
    }

    fn spawn(&self, name: &'static str, binary: PathBuf, args: Vec<String>) -> Result<()> {
        let mut reaper = lock(&self.reaper);
        let reaper = reaper.as_mut().ok_or_else(|| Error::Spawn {
            component: name,
            binary: binary.clone(),
            source: std::io::Error::other("the control plane is shutting down"),
        })?;
        let process = Process::spawn(name, &binary, &args, &self.logs, reaper)?;
        lock(&self.processes).push(process);
        Ok(())
    }

    /// Runs `f` on the component called `name` (and the reaper, to register a restart).
    pub(crate) fn with_component<T>(
        &self,
        name: &str,
        f: impl FnOnce(&mut Process, &mut Reaper) -> Result<T>,
    ) -> Result<T> {
        let mut reaper = lock(&self.reaper);
        let reaper = reaper.as_mut().ok_or_else(|| Error::Fault {
            action: format!("acting on {name}"),
            detail: "the control plane is shutting down".into(),
        })?;
        let mut processes = lock(&self.processes);
        let process = processes
            .iter_mut()
            .find(|p| p.name == name)
            .ok_or_else(|| Error::Fault {
                action: format!("acting on {name}"),
                detail: "no such component".into(),
            })?;
        f(process, reaper)
    }

    /// Fails with [`Error::Exited`] if any component has exited.
    fn check_running(&self) -> Result<()> {
        lock(&self.processes)
            .iter_mut()
            .try_for_each(Process::check_running)
    }

    /// Polls `probe` every 100 ms until it returns `Ok(true)`, failing early if a component exits.
    pub(crate) async fn wait_for<F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        mut probe: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<bool, String>>,
    {
        let start = Instant::now();
        let mut last;
        loop {
            self.check_running()?;
            match probe().await {
                Ok(true) => return Ok(()),
                Ok(false) => last = "not yet".into(),
                Err(e) => last = e,
            }
            if start.elapsed() > timeout {
                return Err(Error::NotReady {
                    what: what.into(),
                    seconds: timeout.as_secs(),
                    last,
                    logs: self.logs.clone(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn start_etcd_and_apiserver(
        &mut self,
        secure_port: u16,
        options: &Options,
    ) -> Result<()> {
        let etcd_client = free_port()?;
        let etcd_peer = free_port()?;
        let data = self.dir.join("etcd");
        self.spawn(
            "etcd",
            self.assets.etcd.clone(),
            vec![
                "--name=wasmop-testenv".into(),
                format!("--data-dir={}", data.display()),
                format!("--listen-client-urls=http://127.0.0.1:{etcd_client}"),
                format!("--advertise-client-urls=http://127.0.0.1:{etcd_client}"),
                format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
                format!("--initial-cluster=wasmop-testenv=http://127.0.0.1:{etcd_peer}"),
                "--unsafe-no-fsync=true".into(),
                "--quota-backend-bytes=8589934592".into(),
                "--log-level=warn".into(),
            ],
        )?;
        self.etcd_client = etcd_client;
        let addr = SocketAddr::from(([127, 0, 0, 1], etcd_client));
        self.wait_for("etcd", options.ready_timeout, || async move {
            Ok(TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())
        })
        .await?;

        let pki = self.pki.clone();
        let cert_dir = self.dir.join("apiserver-certs");
        let gates: Vec<String> = if options.feature_gates.is_empty() {
            Vec::new()
        } else {
            let on: Vec<String> = options
                .feature_gates
                .iter()
                .map(|g| format!("{g}=true"))
                .collect();
            vec![format!("--feature-gates={}", on.join(","))]
        };
        let admission = if options.webhook_client_cert {
            let config = write_admission_config(&self.dir, &pki)?;
            vec![format!(
                "--admission-control-config-file={}",
                config.display()
            )]
        } else {
            Vec::new()
        };
        self.spawn(
            "kube-apiserver",
            self.assets.kube_apiserver.clone(),
            [
                format!("--etcd-servers=http://127.0.0.1:{etcd_client}"),
                format!("--secure-port={secure_port}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                // A loopback address cannot be the `kubernetes` Service's endpoint.
                "--endpoint-reconciler-type=none".into(),
                format!("--cert-dir={}", cert_dir.display()),
                format!("--tls-cert-file={}", pki.server_cert.display()),
                format!("--tls-private-key-file={}", pki.server_key.display()),
                format!("--client-ca-file={}", pki.ca_cert.display()),
                "--authorization-mode=RBAC".into(),
                "--allow-privileged=true".into(),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!(
                    "--service-account-key-file={}",
                    pki.service_account_pub.display()
                ),
                format!(
                    "--service-account-signing-key-file={}",
                    pki.service_account_key.display()
                ),
                // A test cluster: no request throttling.
                "--max-requests-inflight=0".into(),
                "--max-mutating-requests-inflight=0".into(),
                "--enable-priority-and-fairness=false".into(),
                "--profiling=false".into(),
                format!(
                    "--audit-policy-file={}",
                    write_audit_policy(&self.dir)?.display()
                ),
                format!("--audit-log-path={}", self.logs.join(AUDIT_LOG).display()),
            ]
            .into_iter()
            .chain(gates)
            .chain(admission)
            .collect(),
        )?;
        self.wait_for_apiserver(options.ready_timeout).await
    }

    /// Waits until kube-apiserver's `/readyz` says `ok`.
    pub(crate) async fn wait_for_apiserver(&self, timeout: Duration) -> Result<()> {
        let client = client_from_kubeconfig(&self.kubeconfig).await?;
        self.wait_for("kube-apiserver /readyz", timeout, || {
            let client = client.clone();
            async move {
                let req = http::Request::get("/readyz")
                    .body(Vec::new())
                    .map_err(|e| e.to_string())?;
                client
                    .request_text(req)
                    .await
                    .map(|body| body.trim() == "ok")
                    .map_err(|e| e.to_string())
            }
        })
        .await
    }

    async fn start_controllers(&mut self, options: &Options) -> Result<()> {
        let kubeconfig = self.kubeconfig.display().to_string();
        let pki = self.pki.clone();
        let common = |port: u16| -> Vec<String> {
            vec![
                format!("--kubeconfig={kubeconfig}"),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".into(),
                "--leader-elect=false".into(),
                "--kube-api-qps=5000".into(),
                "--kube-api-burst=10000".into(),
            ]
        };
        let kcm_port = free_port()?;
        let mut kcm_args = common(kcm_port);
        kcm_args.extend([
            // Every default controller: garbage collector, deployment, replicaset, statefulset,
            // namespace, service accounts and their tokens, node lifecycle (removes the
            // not-ready taint once kwok reports a node Ready), endpoints, jobs...
            "--controllers=*".into(),
            format!("--root-ca-file={}", pki.ca_cert.display()),
            format!(
                "--service-account-private-key-file={}",
                pki.service_account_key.display()
            ),
            format!("--cluster-signing-cert-file={}", pki.ca_cert.display()),
            format!("--cluster-signing-key-file={}", pki.ca_key.display()),
            "--concurrent-gc-syncs=5".into(),
        ]);
        self.spawn(
            "kube-controller-manager",
            self.assets.kube_controller_manager.clone(),
            kcm_args,
        )?;
        let sched_port = free_port()?;
        self.spawn(
            "kube-scheduler",
            self.assets.kube_scheduler.clone(),
            common(sched_port),
        )?;
        self.spawn(
            "kwok",
            self.assets.kwok.clone(),
            vec![
                format!("--kubeconfig={kubeconfig}"),
                format!("--config={}", self.assets.kwok_stages.display()),
                "--manage-all-nodes=true".into(),
                "--node-lease-duration-seconds=40".into(),
                "--cidr=10.244.0.0/16".into(),
            ],
        )?;
        for (name, port) in [
            ("kube-controller-manager", kcm_port),
            ("kube-scheduler", sched_port),
        ] {
            let mut config = Config::new(format!("https://127.0.0.1:{port}").parse().map_err(
                |e: http::uri::InvalidUri| Error::Kubeconfig {
                    path: PathBuf::new(),
                    detail: e.to_string(),
                },
            )?);
            // Their serving certificates are self-signed; only liveness is asked of them.
            config.accept_invalid_certs = true;
            install_crypto_provider();
            let client = Client::try_from(config)?;
            self.wait_for(&format!("{name} /healthz"), options.ready_timeout, || {
                let client = client.clone();
                async move {
                    let req = http::Request::get("/healthz")
                        .body(Vec::new())
                        .map_err(|e| e.to_string())?;
                    client
                        .request_text(req)
                        .await
                        .map(|body| body.trim() == "ok")
                        .map_err(|e| e.to_string())
                }
            })
            .await?;
        }
        Ok(())
    }

    async fn create_nodes(&mut self, options: &Options) -> Result<()> {
        let client = client_from_kubeconfig(&self.kubeconfig).await?;
        let nodes: Api<Node> = Api::all(client.clone());
        let pods = options.pods_per_node.max(1).to_string();
        for i in 0..options.nodes.max(1) {
            let name = format!("kwok-node-{i}");
            let node: Node = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": { "kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0" },
                    "labels": {
                        "type": "kwok",
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "topology.kubernetes.io/zone": format!("zone-{}", i % 2),
                    }
                },
                "status": {
                    "allocatable": { "cpu": "32", "memory": "256Gi", "pods": pods },
                    "capacity": { "cpu": "32", "memory": "256Gi", "pods": pods }
                }
            }))
            .map_err(|e| Error::Kubeconfig { path: PathBuf::new(), detail: format!("node template: {e}") })?;
            nodes.create(&PostParams::default(), &node).await?;
            self.nodes.push(name);
        }
        let names = self.nodes.clone();
        self.wait_for(
            "kwok nodes Ready and untainted",
            options.ready_timeout,
            || {
                let (nodes, names) = (nodes.clone(), names.clone());
                async move {
                    for name in &names {
                        let node = nodes.get(name).await.map_err(|e| e.to_string())?;
                        if !node_ready(&node) {
                            return Err(format!("node {name} is not Ready yet"));
                        }
                        let tainted = node
                            .spec
                            .as_ref()
                            .and_then(|s| s.taints.as_ref())
                            .is_some_and(|t| !t.is_empty());
                        if tainted {
                            return Err(format!("node {name} still has taints"));
                        }
                    }
                    Ok(true)
                }
            },
        )
        .await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client, "default");
        self.wait_for(
            "ServiceAccount default/default",
            options.ready_timeout,
            || {
                let accounts = accounts.clone();
                async move {
                    accounts
                        .get_opt("default")
                        .await
                        .map(|sa| sa.is_some())
                        .map_err(|e| e.to_string())
                }
            },
        )
        .await
    }

    /// The admin kubeconfig (user in `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The apiserver's URL, `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The certificates and keys (tests can sign more client certificates with the CA).
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// The binaries in use.
    pub fn assets(&self) -> &Assets {
        &self.assets
    }

    /// The kwok node names.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// The cluster's temporary directory (removed at teardown unless [`ControlPlane::keep`] was
    /// called): certificates, etcd data, `logs/`, and the tests' own logs under `tests/`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory with one log file per component.
    pub fn log_dir(&self) -> &Path {
        &self.logs
    }

    /// Every read (`get`) of a Deployment or Service the API server has completed so far, in
    /// order, from its audit log.
    ///
    /// # Errors
    /// [`Error::Io`] if the log cannot be read; a line that does not parse is an error too.
    pub fn child_reads(&self) -> Result<Vec<ChildRead>> {
        let path = self.logs.join(AUDIT_LOG);
        let text = std::fs::read_to_string(&path).map_err(Error::io("reading", &path))?;
        // A line the API server is still writing (no newline yet) is read next time.
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        complete
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                let event: serde_json::Value = serde_json::from_str(line).map_err(|e| {
                    Error::io("parsing", &path)(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        e,
                    ))
                })?;
                let field = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
                Ok(ChildRead {
                    user: field(&event["user"]["username"]),
                    uri: field(&event["requestURI"]),
                })
            })
            .collect()
    }

    /// How long [`ControlPlane::start`] took after the binaries were provided.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// A new admin client.
    ///
    /// # Errors
    /// [`Error::Kubeconfig`] or [`Error::Kube`] if no client can be built.
    pub async fn client(&self) -> Result<Client> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// Keeps the cluster directory (logs, certificates, etcd data) after teardown.
    pub fn keep(&self) {
        let _ = std::fs::write(self.dir.join(KEEP_MARKER), b"kept because a test failed\n");
    }

    /// The last `lines` lines of every component log, for a failure report.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        // A fault may hold the lock for a moment; a report without tails is better than a hang.
        let Ok(processes) = self.processes.try_lock() else {
            return format!("(component logs are in {})\n", self.logs.display());
        };
        for p in processes.iter() {
            out.push_str(&format!(
                "---- {} ({}) ----\n{}\n",
                p.name,
                p.log.display(),
                tail(&p.log, lines)
            ));
        }
        out
    }
}

/// Locks `m`, also after a panic elsewhere poisoned it (the list itself stays consistent).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

impl ControlPlane {
    /// Stops every process (reverse start order: kwok, scheduler, controller-manager,
    /// apiserver, etcd) and removes the cluster directory unless [`ControlPlane::keep`] was
    /// called. What dropping it does, for a plane others may still hold a reference to: it
    /// answers nothing afterwards, and a fault on it fails.
    pub fn stop(&self) {
        let mut processes = lock(&self.processes);
        while let Some(mut p) = processes.pop() {
            p.stop(Duration::from_secs(10));
        }
        drop(processes);
        if let Some(reaper) = lock(&self.reaper).take() {
            reaper.finish();
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}
