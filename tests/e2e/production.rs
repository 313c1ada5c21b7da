//! The host's production features end to end, with the host as real `wasmop run` processes on
//! the local control plane: admission refuses an illegal transition with the module's message,
//! metrics count what happened, `/readyz` flips once caches sync, and with leader election only
//! the leader reconciles, a follower takes over after the leader is killed, and a graceful stop
//! releases the Lease.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::*;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmop_testenv::{Plane, TestEnv, Turn, eventually};

fn app(name: &str, image: &str) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App",
        "metadata": {"name": name},
        "spec": {"image": image, "replicas": 1, "port": 8080}
    }))?)
}

/// The image-updater reconciler of `env`'s namespace, with admission; returns its name and
/// module digest.
async fn image_updater_with_admission(env: &TestEnv) -> anyhow::Result<(String, String)> {
    image_updater(
        env,
        "image-updater",
        wasmop_test_modules::IMAGE_UPDATER,
        true,
        json!({"admission": {"timeoutSeconds": 5, "failurePolicy": "Fail"}}),
    )
    .await
}

/// A `wasmop run` process, killed when dropped.
struct HostProcess {
    child: tokio::process::Child,
    log: PathBuf,
    metrics: SocketAddr,
    identity: Option<String>,
}

/// The JSON log lines of a host so far.
fn log_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn field<'a>(line: &'a Value, name: &str) -> Option<&'a str> {
    line["fields"][name].as_str()
}

impl HostProcess {
    /// Starts a host serving `env`'s WasmReconcilers, with metrics and the webhook on loopback.
    async fn start(env: &TestEnv, cache: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        let bin = wasmop_binary().await?;
        // Kept with the control plane's logs if the test fails.
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = env.log_dir("hosts")?.join(format!("host-{n}.log"));
        let mut cmd = tokio::process::Command::new(bin);
        cmd.arg("--log-format")
            .arg("json")
            .arg("run")
            .arg("--kubeconfig")
            .arg(env.kubeconfig())
            .arg("--cache-dir")
            .arg(cache)
            .args(["--selector", &format!("wasmop.dev/test={}", env.namespace)])
            .args(["--metrics-addr", "127.0.0.1:0"])
            .args(extra)
            .env_remove("RUST_BACKTRACE")
            .env(
                "RUST_LOG",
                std::env::var("WASMOP_E2E_HOST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log)?))
            .kill_on_drop(true);
        if !extra.contains(&"--webhook-addr") {
            cmd.args(["--webhook-addr", "127.0.0.1:0"]);
        }
        let child = cmd.spawn()?;
        let mut host = HostProcess {
            child,
            log,
            metrics: SocketAddr::from(([127, 0, 0, 1], 0)),
            identity: None,
        };
        let started = Instant::now();
        loop {
            let lines = log_lines(&host.log);
            host.identity = lines
                .iter()
                .find_map(|l| field(l, "identity").map(str::to_string));
            if let Some(addr) = lines
                .iter()
                .find(|l| field(l, "message") == Some("serving /metrics, /healthz and /readyz"))
                .and_then(|l| field(l, "addr"))
            {
                host.metrics = addr.parse()?;
                return Ok(host);
            }
            if let Some(status) = host.child.try_wait()? {
                anyhow::bail!("wasmop run exited with {status}:\n{}", host.log_text());
            }
            anyhow::ensure!(
                started.elapsed() < WAIT,
                "wasmop run did not serve metrics within {WAIT:?}:\n{}",
                host.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET `path` on the metrics server: (status, body).
    async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(self.metrics, path).await
    }

    /// The value of one sample of `/metrics` (`name{labels}` exactly as rendered).
    async fn sample(&self, series: &str) -> anyhow::Result<Option<f64>> {
        let (status, body) = self.get("/metrics").await?;
        anyhow::ensure!(status == 200, "/metrics answered {status}");
        Ok(parse_sample(&body, series))
    }

    fn signal(&self, signal: nix::sys::signal::Signal) -> anyhow::Result<()> {
        let pid = self
            .child
            .id()
            .ok_or_else(|| anyhow::anyhow!("the host already exited"))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(pid)?), signal)?;
        Ok(())
    }
}

async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("not an HTTP response: {out:?}"))?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// The value of `series` (e.g. `wasmop_reconcile_total{reconciler="x",result="ok"}`).
fn parse_sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

fn series(name: &str, labels: &[(&str, &str)]) -> String {
    let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{name}{{{}}}", l.join(","))
}

/// Every sample of a metric family, for messages.
fn family(body: &str, name: &str) -> String {
    body.lines()
        .filter(|l| l.starts_with(name))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn admission_refuses_an_illegal_transition_and_metrics_count_the_scenario()
-> anyhow::Result<()> {
    let env = TestEnv::get("prod-admission").await?;
    let (wr, sha) = image_updater_with_admission(&env).await?;
    let cache = tempfile::tempdir()?;
    let host = HostProcess::start(&env, cache.path(), &[]).await?;
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
    let config = eventually("the ValidatingWebhookConfiguration", WAIT, || async {
        Ok(vwcs.get_opt(&format!("wasmop-{wr}")).await?)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nhost log:\n{}", host.log_text()))?;
    let webhook = &config.webhooks.unwrap_or_default()[0];
    assert_eq!(webhook.failure_policy.as_deref(), Some("Fail"));
    assert_eq!(webhook.timeout_seconds, Some(5));
    assert_eq!(webhook.side_effects, "None");

    let apps = apps(&env.client, &env.namespace);
    apps.create(&PostParams::default(), &app("web", "nginx:1.27")?)
        .await?;
    // The API server picks a new webhook configuration up within a moment; until then an
    // illegal change would pass, so probe with dry runs (no side effects) until it is refused.
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let refusal = eventually("spec.track changes to be refused", WAIT, || async {
        let r = apps
            .patch(
                "web",
                &dry,
                &Patch::Merge(json!({"spec": {"track": "canary"}})),
            )
            .await;
        Ok(match r {
            Ok(_) => None,
            Err(kube::Error::Api(s)) => Some(s),
            Err(e) => return Err(e.into()),
        })
    })
    .await?;
    println!("refused: {}", refusal.message);
    assert!(
        refusal.message.contains("admission webhook")
            && refusal
                .message
                .contains("spec.track: spec.track is immutable"),
        "the API server relays the module's message with its field: {refusal:?}"
    );
    // The same, for real, is refused too and leaves the App as it was.
    let real = apps
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"track": "canary"}})),
        )
        .await;
    assert!(real.is_err(), "changing spec.track must be refused");
    assert_eq!(apps.get("web").await?.data["spec"]["track"], "stable");
    // A legal change passes (with the module's warning-free verdict) and is reconciled.
    apps.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"image": "nginx:1.28"}})),
    )
    .await?;
    let deployments: Api<Deployment> = env.api();
    eventually("the Deployment on nginx:1.28", WAIT, || async {
        Ok(deployments.get_opt("web").await?.filter(|d| {
            d.spec
                .template
                .spec
                .as_ref()
                .and_then(|p| p.containers.first())
                .and_then(|c| c.image.as_deref())
                == Some("nginx:1.28")
        }))
    })
    .await?;

    // Metrics: the reconciles, the module, the calls and the reviews, labelled by reconciler.
    let ok = series(
        "wasmop_reconcile_total",
        &[("reconciler", &wr), ("result", "ok")],
    );
    eventually("reconciles counted", WAIT, || async {
        Ok(host.sample(&ok).await?.filter(|v| *v >= 2.0))
    })
    .await?;
    let (_, body) = host.get("/metrics").await?;
    let r = wr.as_str();
    let expect = |s: String, min: f64| {
        let v = parse_sample(&body, &s);
        assert!(
            v.is_some_and(|v| v >= min),
            "{s} >= {min}, got {v:?}; metrics:\n{}",
            family(&body, "wasmop_")
        );
    };
    expect(
        series("wasmop_module_info", &[("reconciler", r), ("sha256", &sha)]),
        1.0,
    );
    expect(
        series(
            "wasmop_reconcile_duration_seconds_count",
            &[("reconciler", r)],
        ),
        2.0,
    );
    expect(
        series(
            "wasmop_module_call_duration_seconds_count",
            &[("reconciler", r), ("function", "reconcile")],
        ),
        2.0,
    );
    expect(
        series(
            "wasmop_module_call_duration_seconds_count",
            &[("reconciler", r), ("function", "validate")],
        ),
        3.0,
    );
    expect(
        series(
            "wasmop_module_instantiate_duration_seconds_count",
            &[("reconciler", r)],
        ),
        2.0,
    );
    expect(
        series("wasmop_module_memory_peak_bytes", &[("reconciler", r)]),
        65536.0,
    );
    expect(
        series("wasmop_workqueue_adds_total", &[("reconciler", r)]),
        2.0,
    );
    expect(
        series(
            "wasmop_admission_reviews_total",
            &[("reconciler", r), ("allowed", "false")],
        ),
        2.0,
    );
    // The image change; the App's create is reviewed too only if the API server used the new
    // webhook configuration by then, which nothing above waits for (seen: 1, on a fresh clone).
    expect(
        series(
            "wasmop_admission_reviews_total",
            &[("reconciler", r), ("allowed", "true")],
        ),
        1.0,
    );
    expect(series("wasmop_leader", &[]).replace("{}", ""), 1.0);
    assert_eq!(host.get("/healthz").await?.0, 200);
    let (status, body) = host.get("/readyz").await?;
    assert_eq!(status, 200, "ready: {body}");

    // Deleting the WasmReconciler removes its webhook.
    Api::<wasmop::crd::WasmReconciler>::all(env.client.clone())
        .delete(&wr, &Default::default())
        .await?;
    eventually("the webhook configuration removed", WAIT, || async {
        Ok(vwcs
            .get_opt(&format!("wasmop-{wr}"))
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    env.passed()
}

#[tokio::test]
async fn readyz_is_unavailable_until_the_caches_sync() -> anyhow::Result<()> {
    let env = TestEnv::get("prod-ready").await?;
    let (wr, _) = image_updater_with_admission(&env).await?;
    // A fresh cache: the module is compiled at start, so startup takes a while.
    let cache = tempfile::tempdir()?;
    let host = HostProcess::start(&env, cache.path(), &["--webhook-addr", "off"]).await?;
    // How soon the host is ready depends on this machine: what is asserted is the order.
    // The host logs "caches synced" before it reports the reconciler ready (synchronously,
    // to the log file), so once /readyz answers 200 the line is there; a readiness reported
    // before the caches synced would answer 200 without it.
    let answers = std::sync::Mutex::new(Vec::new());
    let synced_when_ready = eventually("/readyz 200", WAIT, || async {
        let (status, _) = host.get("/readyz").await?;
        answers
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .push(status);
        if status != 200 {
            return Ok(None);
        }
        Ok(Some(
            log_lines(&host.log)
                .into_iter()
                .any(|l| field(&l, "message") == Some("caches synced")),
        ))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nhost log:\n{}", host.log_text()))?;
    let answers = answers.into_inner().unwrap_or_default();
    println!("/readyz answered {answers:?}");
    assert!(
        synced_when_ready,
        "/readyz answered 200 before the controller logged its caches synced:\n{}",
        host.log_text()
    );
    assert!(
        answers.iter().all(|s| *s == 503 || *s == 200),
        "not ready is 503: {answers:?}"
    );
    assert_eq!(host.get("/healthz").await?.0, 200, "alive");
    let (_, body) = host.get("/metrics").await?;
    assert!(
        body.contains(&format!("wasmop_module_info{{reconciler=\"{wr}\",sha256=")),
        "the module serving when ready is reported:\n{}",
        family(&body, "wasmop_module_info")
    );
    env.passed()
}

async fn lease_holder(client: &Client, ns: &str) -> anyhow::Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    Ok(leases
        .get_opt("wasmop-leader")
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

#[tokio::test]
async fn only_the_leader_reconciles_and_a_follower_takes_over() -> anyhow::Result<()> {
    let env = TestEnv::get("prod-leader").await?;
    let (wr, _) = image_updater_with_admission(&env).await?;
    let cache = tempfile::tempdir()?;
    let elect = [
        "--leader-elect",
        "--leader-election-namespace",
        &env.namespace,
    ];
    let first = HostProcess::start(&env, cache.path(), &elect).await?;
    let first_id = first
        .identity
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no identity logged:\n{}", first.log_text()))?;
    eventually("the first host leads", WAIT, || async {
        Ok(
            (lease_holder(&env.client, &env.namespace).await? == Some(first_id.clone()))
                .then_some(()),
        )
    })
    .await?;
    let second = HostProcess::start(&env, cache.path(), &elect).await?;
    let second_id = second
        .identity
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no identity logged:\n{}", second.log_text()))?;
    assert_ne!(first_id, second_id);

    // The leader reconciles; the follower does not.
    let apps = apps(&env.client, &env.namespace);
    let deployments: Api<Deployment> = env.api();
    let create = |name: &'static str| {
        let apps = apps.clone();
        async move {
            // Right after a leader change the webhook may still point at the old leader.
            eventually(&format!("App {name} created"), WAIT, || async {
                match apps
                    .create(&PostParams::default(), &app(name, "nginx:1.27")?)
                    .await
                {
                    Ok(_) => Ok(Some(())),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(Some(())),
                    Err(e) => Err(e.into()),
                }
            })
            .await
        }
    };
    create("one").await?;
    eventually("Deployment one", WAIT, || async {
        Ok(deployments.get_opt("one").await?)
    })
    .await?;
    let ok = series(
        "wasmop_reconcile_total",
        &[("reconciler", &wr), ("result", "ok")],
    );
    eventually("the leader counted its reconciles", WAIT, || async {
        Ok(first.sample(&ok).await?.filter(|v| *v >= 1.0))
    })
    .await?;
    let (_, follower_metrics) = second.get("/metrics").await?;
    assert_eq!(
        family(&follower_metrics, "wasmop_reconcile_total"),
        "",
        "the follower ran no reconcile"
    );
    assert_eq!(parse_sample(&follower_metrics, "wasmop_leader"), Some(0.0));
    assert_eq!(
        second.get("/readyz").await?.0,
        200,
        "a follower is ready (it serves admission)"
    );
    let follower_writes = log_lines(&second.log)
        .into_iter()
        .filter(|l| field(l, "message") == Some("acquired leadership"))
        .count();
    assert_eq!(follower_writes, 0, "the follower never led");

    // Kill the leader: the follower takes over once the Lease expires.
    let mut first = first;
    first.child.start_kill()?;
    first.child.wait().await?;
    // The takeover time is read from the Lease (the killed leader's last renewal, the new
    // holder's acquisition), not from how soon this test happened to look.
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.namespace);
    let micros = |t: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime>| {
        t.map(|t| t.0.as_microsecond())
    };
    let last_renewal = micros(
        leases
            .get("wasmop-leader")
            .await?
            .spec
            .and_then(|s| s.renew_time),
    )
    .ok_or_else(|| anyhow::anyhow!("the Lease records no renewal"))?;
    eventually(
        "the second host leads",
        Duration::from_secs(120),
        || async {
            Ok(
                (lease_holder(&env.client, &env.namespace).await? == Some(second_id.clone()))
                    .then_some(()),
            )
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nsecond host log:\n{}", second.log_text()))?;
    let acquired = micros(
        leases
            .get("wasmop-leader")
            .await?
            .spec
            .and_then(|s| s.acquire_time),
    )
    .ok_or_else(|| anyhow::anyhow!("the Lease records no acquisition"))?;
    let takeover =
        Duration::from_micros(u64::try_from(acquired - last_renewal).unwrap_or_default());
    println!("takeover {takeover:?} after the last renewal (lease 15 s, retry 2 s)");
    // Expected: the lease duration plus up to a retry (~17 s), read from what the Lease records.
    // The bound, three lease durations, is far above that: it catches a follower that waits
    // for something other than the expiry, not an API server slowed by a loaded CI.
    assert!(
        takeover <= Duration::from_secs(3 * 15),
        "takeover within three lease durations of the last renewal: {takeover:?}"
    );
    create("two").await?;
    eventually("Deployment two, made by the new leader", WAIT, || async {
        Ok(deployments.get_opt("two").await?)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nsecond host log:\n{}", second.log_text()))?;
    eventually("the new leader counted its reconciles", WAIT, || async {
        Ok(second.sample(&ok).await?.filter(|v| *v >= 1.0))
    })
    .await?;

    // A graceful stop exits 0 and hands the Lease back at once.
    let mut second = second;
    second.signal(nix::sys::signal::Signal::SIGTERM)?;
    let status = tokio::time::timeout(Duration::from_secs(40), second.child.wait()).await??;
    assert!(
        status.success(),
        "SIGTERM exits 0: {status}\n{}",
        second.log_text()
    );
    assert_eq!(
        lease_holder(&env.client, &env.namespace).await?,
        None,
        "the Lease was released"
    );
    let d = deployments.get("two").await?;
    assert_eq!(
        d.labels().get("wasmop.dev/reconciler").map(String::as_str),
        Some(wr.as_str())
    );
    env.passed()
}

/// Reliability item 3 (the QPS budget can starve liveness): with a request budget far below
/// the work (`--kube-qps 1 --kube-burst 1`, 30 Apps of about eight requests each), the leader
/// keeps renewing its Lease. Before the fix, renewals waited behind the work in the one
/// budget's queue: past the 10 s renew deadline the host gave its leadership up and exited.
/// What is counted is what the Lease records (its renewTime values, and its holder and
/// transitions), not how fast anything happened.
#[tokio::test]
async fn a_request_storm_does_not_hold_back_the_leader_lease() -> anyhow::Result<()> {
    let env = TestEnv::get("prod-liveness").await?;
    updater(&env, "image-updater").await?;
    let cache = tempfile::tempdir()?;
    let args = [
        "--leader-elect",
        "--leader-election-namespace",
        &env.namespace,
        "--webhook-addr",
        "off",
        "--kube-qps",
        "1",
        "--kube-burst",
        "1",
    ];
    let mut host = HostProcess::start(&env, cache.path(), &args).await?;
    let id = host
        .identity
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no identity logged:\n{}", host.log_text()))?;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.namespace);
    eventually("the host leads", Duration::from_secs(120), || async {
        Ok((lease_holder(&env.client, &env.namespace).await? == Some(id.clone())).then_some(()))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nhost log:\n{}", host.log_text()))?;
    let transitions = |l: &Lease| l.spec.as_ref().and_then(|s| s.lease_transitions);
    let before = transitions(&leases.get("wasmop-leader").await?);

    // The storm: every App queues its requests behind the others' in the work budget.
    let apps = apps(&env.client, &env.namespace);
    for i in 0..30 {
        apps.create(
            &PostParams::default(),
            &app(&format!("storm-{i}"), "nginx:1.27")?,
        )
        .await?;
    }
    // Once the storm is under way (a first Deployment made: the other Apps' requests are
    // queued), ten renewals (~20 s at one per 2 s retry period), the host alive throughout.
    let deployments: Api<Deployment> = env.api();
    let deadline = Instant::now() + Duration::from_secs(180);
    while deployments
        .list(&Default::default())
        .await?
        .items
        .is_empty()
    {
        if let Some(status) = host.child.try_wait()? {
            anyhow::bail!("the host exited ({status}):\n{}", host.log_text());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no App reconciled within 180 s:\n{}",
            host.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut renewals = std::collections::BTreeSet::new();
    while renewals.len() < 10 {
        if let Some(status) = host.child.try_wait()? {
            anyhow::bail!(
                "the host exited during the storm ({status}) after {} renewals:\n{}",
                renewals.len(),
                host.log_text()
            );
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} Lease renewals within 180 s of the storm:\n{}",
            renewals.len(),
            host.log_text()
        );
        let lease = leases.get("wasmop-leader").await?;
        if let Some(t) = lease.spec.and_then(|s| s.renew_time) {
            renewals.insert(t.0.as_microsecond());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lease = leases.get("wasmop-leader").await?;
    assert_eq!(
        lease.spec.as_ref().and_then(|s| s.holder_identity.clone()),
        Some(id),
        "the same host holds the Lease"
    );
    assert_eq!(transitions(&lease), before, "the Lease never changed hands");
    env.passed()
}

/// How long a host may take to start compiling the Python module (an 18 MB pull first, on a
/// loaded machine).
const COMPILE_START: Duration = Duration::from_secs(300);

/// The crashes the quarantine markers of module `sha` in `cache` count (the highest, over the
/// tiers), if there is a marker.
fn compile_marker(cache: &Path, sha: &str) -> Option<u32> {
    std::fs::read_dir(cache)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(&format!("{sha}-")) && name.ends_with(".compiling")
        })
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|text| text.trim().parse().ok())
        .max()
}

/// The demo's failure (and a rolling restart's): SIGTERM while the optimized build compiles in
/// the background. The host exits by choice, so the compile did not crash: no marker is left to
/// count towards quarantine at the next start.
async fn graceful_exit_during_a_compile(
    env: &TestEnv,
    cache: &Path,
    args: &[&str],
    wr: &str,
    sha: &str,
) -> anyhow::Result<()> {
    let mut host = HostProcess::start(env, cache, args).await?;
    // The fast build serves, and the optimized one compiles (its marker counts this start).
    eventually(
        "Ready=True with the optimized build compiling",
        COMPILE_START,
        || async {
            let ready = wr_condition(&env.client, wr, "Ready")
                .await?
                .is_some_and(|(s, _, _)| s == "True");
            Ok((ready && compile_marker(cache, sha) == Some(1)).then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nhost log:\n{}", host.log_text()))?;
    let pid = host.child.id().and_then(|p| i32::try_from(p).ok());
    let pid = pid.ok_or_else(|| anyhow::anyhow!("the host has exited:\n{}", host.log_text()))?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )?;
    let status = tokio::time::timeout(WAIT, host.child.wait()).await??;
    assert!(status.success(), "{status}:\n{}", host.log_text());
    assert_eq!(
        compile_marker(cache, sha),
        None,
        "a host stopped by SIGTERM during a compile leaves no crash behind:\n{}",
        host.log_text()
    );
    Ok(())
}

/// Item 16 of the reliability issue: a module whose compile kills the host would crash-loop
/// every replica. Killed twice while compiling the (slow to compile) Python module, the third
/// host refuses it before compiling, naming the digest and how to clear it. First, a host
/// stopped by SIGTERM during a compile counts no crash ([`graceful_exit_during_a_compile`]).
#[tokio::test]
async fn a_module_whose_compile_killed_the_host_twice_is_quarantined() -> anyhow::Result<()> {
    // A plane of its own: its tenant reconciler (a cluster-scoped primary, left quarantined)
    // would conflict with the python suite's on the shared plane.
    let env = TestEnv::with("quarantine", Plane::Fresh, Turn::Shared).await?;
    let registry = wasmop_testenv::Registry::start().await?;
    let module = std::fs::read(tenant_module(TenantBuild::First).await?)?;
    let sha = wasmop::engine::sha256_hex(&module);
    let digest = oci_push(&registry, "mods/slow:v1", module).await?;
    oci_pull_secret(&env, &registry, "registry").await?;
    // The tenant reconciler as the example registers it: the module serves (Ready), so its
    // optimized build compiles in the background.
    let reference = format!("{}/mods/slow@{digest}", registry.host);
    let wr = register_tenant(&env, oci_module(&registry, &reference, "registry")).await?;
    let cache = tempfile::tempdir()?;
    let args = ["--namespace", &env.namespace, "--webhook-addr", "off"];
    graceful_exit_during_a_compile(&env, cache.path(), &args, &wr, &sha).await?;
    for crash in 1..=2 {
        let mut host = HostProcess::start(&env, cache.path(), &args).await?;
        // The compile is under way once its marker counts this start: killed in it.
        eventually(
            &format!("compile {crash} under way"),
            COMPILE_START,
            || async { Ok(compile_marker(cache.path(), &sha).filter(|c| *c == crash)) },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nhost log:\n{}", host.log_text()))?;
        host.child.kill().await?;
        assert_eq!(
            compile_marker(cache.path(), &sha),
            Some(crash),
            "killed during the compile, the marker stays"
        );
    }
    let host = HostProcess::start(&env, cache.path(), &args).await?;
    let (_, _, message) = eventually("Ready=False ModuleQuarantined", WAIT, || async {
        Ok(wr_condition(&env.client, &wr, "Ready")
            .await?
            .filter(|(s, r, _)| s == "False" && r == "ModuleQuarantined"))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nhost log:\n{}", host.log_text()))?;
    assert!(
        message.contains(&sha) && message.contains(".compiling") && message.contains("2 times"),
        "{message}"
    );
    // Refused before compiling: no third compile was counted.
    assert_eq!(compile_marker(cache.path(), &sha), Some(2));
    env.passed()
}
