//! The review path in process: a real module judges reviews handed to [`super::handle`] as
//! in-memory bodies, so what the server holds can be counted exactly (no sockets, no RSS).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Bytes, Frame, SizeHint};
use kube::runtime::{reflector, watcher};
use serde_json::json;

use super::*;
use crate::engine::EngineConfig;
use crate::modules::slot::{Active, Fit};

const RECONCILER: &str = "widgets";

fn reconciler() -> WasmReconciler {
    serde_json::from_value(json!({
        "apiVersion": "wasmop.dev/v1alpha1", "kind": "WasmReconciler",
        "metadata": {"name": RECONCILER, "uid": "u-1"},
        "spec": {
            "module": {"configMap": {"namespace": "ops", "name": "m"}},
            "primary": {"apiVersion": "test.wasmop.dev/v1", "kind": "Widget"},
            "serviceAccount": {"namespace": "ops", "name": "sa"},
            "admission": {"timeoutSeconds": 10, "failurePolicy": "Fail"},
            "limits": {"deadline": "5s"}
        }
    }))
    .unwrap_or_else(|e| panic!("literal: {e}"))
}

/// A webhook serving [`RECONCILER`] with the misbehave test module (it denies `spec.mode:
/// forbidden`), its WasmReconcilers listed, its API server unreachable (nothing here calls it).
async fn webhook() -> Arc<Webhook> {
    webhook_with(wasmop_test_modules::MISBEHAVE).await
}

/// A webhook serving [`RECONCILER`] with test module `name`.
async fn webhook_with(name: &'static str) -> Arc<Webhook> {
    // The engine blocks on its own runtime while loading: off the test's workers.
    let (engine, module) = tokio::task::spawn_blocking(move || {
        let engine =
            Engine::new(&EngineConfig::default()).unwrap_or_else(|e| panic!("engine: {e}"));
        let bytes = wasmop_test_modules::bytes(name);
        let module = engine
            .load(&bytes, &Limits::default())
            .unwrap_or_else(|e| panic!("module: {e}"));
        (engine, module)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let fit = Fit {
        grant: crate::grant::Grant::default(),
        related: Vec::new(),
        ungranted: Vec::new(),
    };
    let slots = Slots::default();
    slots.publish(
        RECONCILER,
        ModuleSlot::new(Active::new(module, fit, "1".into())),
    );
    let (reconcilers, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitApply(reconciler()));
    writer.apply_watcher_event(&watcher::Event::InitDone);
    // The kube client's TLS stack wants a process-wide provider (the host installs ring).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = "http://127.0.0.1:9"
        .parse()
        .unwrap_or_else(|e| panic!("{e}"));
    let client = Client::try_from(kube::Config::new(url)).unwrap_or_else(|e| panic!("{e}"));
    Arc::new(Webhook {
        client,
        engine,
        reconcilers,
        slots,
        loaded: Mutex::default(),
        loading: Mutex::default(),
        compiles: Semaphore::new(MAX_COMPILES),
        oci: crate::modules::oci::OciOptions::default(),
    })
}

/// An AdmissionReview creating a Widget in `mode`, padded to at least `size` bytes.
fn review(uid: &str, mode: &str, size: usize) -> String {
    let mut r = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "test.wasmop.dev", "version": "v1", "kind": "Widget"},
            "resource": {"group": "test.wasmop.dev", "version": "v1", "resource": "widgets"},
            "name": "w", "namespace": "team-a", "operation": "CREATE",
            "userInfo": {"username": "someone"},
            "object": {
                "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                "metadata": {"name": "w", "namespace": "team-a"},
                "spec": {"mode": mode, "pad": ""}
            },
            "oldObject": null, "dryRun": false
        }
    });
    let len = r.to_string().len();
    r["request"]["object"]["spec"]["pad"] = json!("p".repeat(size.saturating_sub(len)));
    r.to_string()
}

/// Bytes that bodies handed to the server and the server has not answered yet, and their peak.
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    peak: AtomicUsize,
}

/// Opens once every offered review was either started (its body polled) or answered unread:
/// until then, started bodies hold back their last chunk, so every review the server lets in
/// is in flight at once, whatever the scheduling.
struct Gate {
    state: Mutex<(usize, Vec<Waker>)>,
    total: usize,
}

impl Gate {
    fn count(&self) {
        let wakers = match self.state.lock() {
            Ok(mut s) => {
                s.0 += 1;
                if s.0 >= self.total {
                    std::mem::take(&mut s.1)
                } else {
                    Vec::new()
                }
            }
            Err(_) => Vec::new(),
        };
        wakers.into_iter().for_each(Waker::wake);
    }

    fn poll_open(&self, cx: &Context<'_>) -> bool {
        match self.state.lock() {
            Ok(mut s) if s.0 < self.total => {
                s.1.push(cx.waker().clone());
                false
            }
            _ => true,
        }
    }
}

/// One review's body, in chunks sharing one buffer, counted as it is read.
struct Counted {
    chunks: VecDeque<Bytes>,
    len: u64,
    started: Arc<AtomicBool>,
    delivered: Arc<AtomicUsize>,
    gate: Arc<Gate>,
    in_flight: Arc<InFlight>,
}

impl Body for Counted {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if !this.started.swap(true, Ordering::SeqCst) {
            this.gate.count();
        }
        if this.chunks.len() == 1 && !this.gate.poll_open(cx) {
            return Poll::Pending;
        }
        let Some(chunk) = this.chunks.pop_front() else {
            return Poll::Ready(None);
        };
        let now = this.in_flight.now.fetch_add(chunk.len(), Ordering::SeqCst) + chunk.len();
        this.in_flight.peak.fetch_max(now, Ordering::SeqCst);
        this.delivered.fetch_add(chunk.len(), Ordering::SeqCst);
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

fn post<B>(body: B, len: usize) -> Request<B> {
    post_to("validate", body, len)
}

fn post_to<B>(hook: &str, body: B, len: usize) -> Request<B> {
    Request::post(format!("/{hook}/{RECONCILER}"))
        .header(http::header::CONTENT_LENGTH, len)
        .body(body)
        .unwrap_or_else(|e| panic!("request: {e}"))
}

/// The verdict of one small review.
async fn verdict(server: &Server, mode: &str) -> serde_json::Value {
    let text = review("small", mode, 0);
    let len = text.len();
    answer(
        server,
        post(http_body_util::Full::new(Bytes::from(text)), len),
    )
    .await
}

/// The AdmissionReview `request` is answered with (200 OK).
async fn answer(
    server: &Server,
    request: Request<http_body_util::Full<Bytes>>,
) -> serde_json::Value {
    let response = handle(server, request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap_or_else(|e| match e {})
        .to_bytes();
    serde_json::from_slice(&body).unwrap_or_else(|e| panic!("response: {e}"))
}

const BUDGET: usize = 4 << 20;

fn server(webhook: Arc<Webhook>) -> Arc<Server> {
    Arc::new(Server {
        webhook,
        reviews: Semaphore::new(MAX_REVIEWS),
        budget: ByteBudget::new(BUDGET),
        read_timeout: Duration::from_secs(30),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_large_reviews_stay_within_the_byte_budget_and_small_ones_are_judged() {
    const OFFERED: usize = 24;
    let server = server(webhook().await);
    let text = Bytes::from(review("large", "good", 1 << 20));
    let gate = Arc::new(Gate {
        state: Mutex::new((0, Vec::new())),
        total: OFFERED,
    });
    let in_flight = Arc::new(InFlight::default());
    let mut tasks = Vec::new();
    for _ in 0..OFFERED {
        let chunks: VecDeque<Bytes> = (0..text.len())
            .step_by(64 << 10)
            .map(|at| text.slice(at..(at + (64 << 10)).min(text.len())))
            .collect();
        let started: Arc<AtomicBool> = Arc::default();
        let delivered = Arc::new(AtomicUsize::new(0));
        let body = Counted {
            chunks,
            len: text.len() as u64,
            started: Arc::clone(&started),
            delivered: Arc::clone(&delivered),
            gate: Arc::clone(&gate),
            in_flight: Arc::clone(&in_flight),
        };
        let (server, gate, in_flight) = (server.clone(), gate.clone(), in_flight.clone());
        let len = text.len();
        tasks.push(tokio::spawn(async move {
            let status = handle(&server, post(body, len)).await.status();
            if !started.load(Ordering::SeqCst) {
                gate.count();
            }
            in_flight
                .now
                .fetch_sub(delivered.load(Ordering::SeqCst), Ordering::SeqCst);
            status
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap_or_else(|e| panic!("task: {e}")));
    }
    let peak = in_flight.peak.load(Ordering::SeqCst);
    assert!(
        peak <= BUDGET,
        "review bodies held at once peaked at {peak} bytes, over the budget of {BUDGET}"
    );
    assert!(
        statuses.contains(&StatusCode::OK),
        "no large review was judged: {statuses:?}"
    );
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::OK || *s == StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    assert_eq!(
        server.budget.available(),
        BUDGET,
        "every reservation was returned"
    );
    // Small reviews are judged by the module as before.
    let denied = verdict(&server, "forbidden").await;
    assert_eq!(denied["response"]["uid"], "small");
    assert_eq!(denied["response"]["allowed"], false);
    assert_eq!(
        denied["response"]["status"]["message"],
        "spec.mode: widgets in forbidden mode are refused"
    );
    assert_eq!(verdict(&server, "good").await["response"]["allowed"], true);
}

/// The finalizer webhook's answer to a small create review, from a webhook serving `module`.
async fn finalizer_answer(module: &'static str) -> serde_json::Value {
    let server = server(webhook_with(module).await);
    let text = review("create", "good", 0);
    let len = text.len();
    let body = http_body_util::Full::new(Bytes::from(text));
    answer(&server, post_to("finalize", body, len)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_finalizer_webhook_patches_a_create_only_for_a_module_that_finalizes() {
    use base64::Engine as _;
    let finalizing = finalizer_answer(wasmop_test_modules::IMAGE_UPDATER).await;
    let r = &finalizing["response"];
    assert_eq!((&r["uid"], &r["allowed"]), (&json!("create"), &json!(true)));
    assert_eq!(r["patchType"], "JSONPatch");
    // kube-core sends the patch's bytes as a JSON array of numbers (Go's decoder takes that as
    // well as base64 for a []byte); either is read here.
    let patch: Vec<u8> = match r["patch"].as_str() {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap_or_else(|e| panic!("{e}")),
        None => serde_json::from_value(r["patch"].clone()).unwrap_or_else(|e| panic!("{e}: {r}")),
    };
    let patch: serde_json::Value = serde_json::from_slice(&patch).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        patch,
        json!([{"op": "add", "path": "/metadata/finalizers", "value": [crate::crd::finalizer_for(RECONCILER)]}])
    );
    let plain = finalizer_answer(wasmop_test_modules::MISBEHAVE).await;
    assert_eq!(plain["response"]["allowed"], true);
    assert!(plain["response"]["patch"].is_null(), "{plain}");
}

#[test]
fn only_the_two_webhook_paths_route() {
    assert_eq!(route("/validate/a"), Some((Hook::Validate, "a")));
    assert_eq!(route("/finalize/a"), Some((Hook::Finalizer, "a")));
    for path in [
        "/validate/",
        "/finalize/",
        "/finalize/a/b",
        "/mutate/a",
        "/",
    ] {
        assert_eq!(route(path), None, "{path}");
    }
}

/// `wasmop_admission_review_duration_seconds_count` of `webhook` for [`RECONCILER`].
fn reviews_timed(webhook: &str) -> f64 {
    let series = format!(
        "wasmop_admission_review_duration_seconds_count{{reconciler=\"{RECONCILER}\",webhook=\"{webhook}\"}} "
    );
    crate::operations::metrics::encode()
        .unwrap_or_else(|e| panic!("{e}"))
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answered_review_is_timed_by_its_webhook() {
    let (validated, finalized) = (reviews_timed("validate"), reviews_timed("finalizer"));
    let server = server(webhook().await);
    assert_eq!(verdict(&server, "good").await["response"]["allowed"], true);
    finalizer_answer(wasmop_test_modules::IMAGE_UPDATER).await;
    // Other tests answer reviews of the same reconciler meanwhile: at least these two.
    assert!(reviews_timed("validate") >= validated + 1.0);
    assert!(reviews_timed("finalizer") >= finalized + 1.0);
}

/// An engine of the default configuration, built off the test's workers.
async fn engine() -> Engine {
    tokio::task::spawn_blocking(|| Engine::new(&EngineConfig::default()))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("engine: {e}"))
}

/// A follower's webhook whose API server serves ConfigMap `ops/b` (the misbehave module, its
/// sha256 given) and trickles every other answer (1000 x 0.5 s).
async fn trickling_webhook() -> (Arc<Webhook>, crate::modules::hostile::Hostile, String) {
    use crate::modules::hostile::{self, Answer};
    let bytes = wasmop_test_modules::bytes(wasmop_test_modules::MISBEHAVE);
    let sha = crate::engine::sha256_hex(&bytes);
    let cm = crate::modules::source::to_config_map("b", "ops", &bytes, "b", "1", &sha)
        .unwrap_or_else(|e| panic!("{e}"));
    let cm = serde_json::to_vec(&cm).unwrap_or_else(|e| panic!("{e}"));
    let h = hostile::start(move |r| {
        if r.path.ends_with("/configmaps/b") {
            return Answer::ok(&cm);
        }
        Answer::trickle()
    })
    .await;
    let (client, _) = h.kube_client();
    let engine = engine().await;
    let webhook = Arc::new(Webhook {
        client,
        engine,
        reconcilers: reflector::store().0,
        slots: Slots::default(),
        loaded: Mutex::default(),
        loading: Default::default(),
        compiles: Semaphore::new(MAX_COMPILES),
        oci: crate::modules::oci::OciOptions::default(),
    });
    (webhook, h, sha)
}

/// WasmReconciler `name` reading its module from ConfigMap `ops/<name>`, module `sha` active.
fn serving(name: &str, sha: &str) -> WasmReconciler {
    serde_json::from_value(json!({
        "apiVersion": "wasmop.dev/v1alpha1", "kind": "WasmReconciler",
        "metadata": {"name": name, "uid": format!("u-{name}")},
        "spec": {
            "module": {"configMap": {"namespace": "ops", "name": name}},
            "primary": {"apiVersion": "test.wasmop.dev/v1", "kind": "Widget"},
            "serviceAccount": {"namespace": "ops", "name": "sa"},
            "admission": {"timeoutSeconds": 2, "failurePolicy": "Fail"}
        },
        "status": {"activeModule": {"sha256": sha, "name": name, "version": "1",
            "loadedAt": "2026-11-30T00:00:00Z", "source": "configmap"}}
    }))
    .unwrap_or_else(|e| panic!("literal: {e}"))
}

/// A follower loads the modules of reconcilers it does not serve for their reviews: one whose
/// module is slow to read (a registry or an API server that trickles) must not hold the loads
/// of the others, whose reviews the API server gives up on after their timeout.
#[tokio::test]
async fn a_module_slow_to_read_holds_no_other_reconcilers_load() {
    let (webhook, h, sha) = trickling_webhook().await;
    let slow = serving("a", &"ab".repeat(32));
    let requested = h.requested.notified();
    let stuck = {
        let webhook = webhook.clone();
        tokio::spawn(async move { webhook.module(&slow).await.map(|_| ()) })
    };
    requested.await;
    // The slow read takes 1000 x 0.5 s; the other module loads at once (60 s: generous).
    let other =
        tokio::time::timeout(Duration::from_secs(60), webhook.module(&serving("b", &sha))).await;
    assert!(
        matches!(other, Ok(Ok(_))),
        "another reconciler's load waited on the slow one: {:?}",
        other.map(|r| r.map(|_| ()).map_err(|e| e.to_string()))
    );
    stuck.abort();
}

/// A review whose own module is slow to read is answered (by its failure policy) within its
/// admission timeout, after which the API server no longer waits and the review only holds one
/// of the server's slots; the read goes on for the reviews after it, which share it.
#[tokio::test]
async fn a_review_waits_for_its_module_no_longer_than_its_timeout() {
    let (webhook, h, _) = trickling_webhook().await;
    let slow = serving("a", &"ab".repeat(32));
    let text = review("u-slow", "ok", 0);
    let request = review::parse(text.into_bytes()).unwrap_or_else(|e| panic!("{e}"));
    for _ in 0..2 {
        // timeoutSeconds 2: answered in about a second (60 s: generous).
        let verdict = tokio::time::timeout(
            Duration::from_secs(60),
            webhook.judge(&slow, &request, contract::Operation::Create),
        )
        .await;
        let Ok(Err(message)) = verdict else {
            panic!(
                "no failure within 60 s: {:?}",
                verdict.map(|v| v.map(|_| ()))
            )
        };
        assert!(message.contains("still being read"), "{message}");
    }
    let reads = h
        .paths()
        .iter()
        .filter(|p| p.ends_with("/configmaps/a"))
        .count();
    assert_eq!(reads, 1, "{:?}", h.paths());
}

/// A follower loads every reconciler's module ahead as the WasmReconcilers change: one slow to
/// read must not hold the look-ahead of the others (nor the loop that follows deletions and
/// leadership).
#[tokio::test]
async fn a_look_ahead_slow_to_read_holds_no_other_reconcilers_look_ahead() {
    let (webhook, h, sha) = trickling_webhook().await;
    let events = futures::stream::iter([
        Ok(watcher::Event::Apply(serving("a", &"ab".repeat(32)))),
        Ok(watcher::Event::Apply(serving("b", &sha))),
    ])
    .chain(futures::stream::pending());
    let (_lead, leading) = watch::channel(false);
    let sync = tokio::spawn(keep_in_sync(
        webhook.clone(),
        reflector::store().0,
        events,
        None,
        leading,
    ));
    // The slow read takes 1000 x 0.5 s; b's module loads at once (60 s: generous).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while webhook.already_loaded("b", &sha).is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "b's look-ahead waited on a's read: {:?}",
            h.paths()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(h.paths().iter().any(|p| p.ends_with("/configmaps/a")));
    sync.abort();
}

/// The host's copy of a module holds no signature: with a signing policy in force (the spec's
/// `verify`, or the host's `--require-signed-modules`) a follower's review must not judge with
/// it (a module the leader revoked for its signature would judge again, from the copy).
#[tokio::test]
async fn a_signing_policy_keeps_the_unsigned_copy_out_of_admission() {
    use crate::modules::hostile::{self, Answer, Body};
    let bytes = wasmop_test_modules::bytes(wasmop_test_modules::MISBEHAVE);
    let sha = crate::engine::sha256_hex(&bytes);
    let at = crate::modules::copy::location("signed", "ops");
    let copy =
        crate::modules::copy::encode(&at, &bytes, &sha, "1").unwrap_or_else(|e| panic!("{e}"));
    let copy = serde_json::to_vec(&copy).unwrap_or_else(|e| panic!("{e}"));
    let copy_path = format!("/configmaps/{}", at.name);
    let h = hostile::start(move |r| {
        if r.path.ends_with(&copy_path) {
            return Answer::ok(&copy);
        }
        Answer::with(
            404,
            Body::Bytes(br#"{"kind":"Status","code":404}"#.to_vec()),
        )
    })
    .await;
    let (client, _) = h.kube_client();
    let engine = engine().await;
    let key = rcgen::KeyPair::generate()
        .map(|p| p.public_key_pem())
        .unwrap_or_else(|e| panic!("{e}"));
    let host_key = crate::modules::signature::TrustedKey::from_pem(&key, "test")
        .unwrap_or_else(|e| panic!("{e}"));
    let policies = [(json!({"key": key}), None), (json!(null), Some(host_key))];
    for (verify, required_key) in policies {
        let webhook = Arc::new(Webhook {
            client: client.clone(),
            engine: engine.clone(),
            reconcilers: reflector::store().0,
            slots: Slots::default(),
            loaded: Mutex::default(),
            loading: Default::default(),
            compiles: Semaphore::new(MAX_COMPILES),
            oci: crate::modules::oci::OciOptions {
                required_key,
                ..Default::default()
            },
        });
        let wr: WasmReconciler = serde_json::from_value(json!({
            "apiVersion": "wasmop.dev/v1alpha1", "kind": "WasmReconciler",
            "metadata": {"name": "signed", "uid": "u-signed"},
            "spec": {
                "module": {"oci": {"reference": format!("{}/mods/m@sha256:{sha}", h.addr),
                    "verify": verify}},
                "primary": {"apiVersion": "test.wasmop.dev/v1", "kind": "Widget"},
                "serviceAccount": {"namespace": "ops", "name": "sa"}
            },
            "status": {"activeModule": {"sha256": sha, "name": "m", "version": "1",
                "loadedAt": "2026-11-30T00:00:00Z", "source": "oci"},
                "moduleCopy": {"namespace": at.namespace, "name": at.name}}
        }))
        .unwrap_or_else(|e| panic!("literal: {e}"));
        let got = webhook.module(&wr).await;
        assert!(
            got.is_err(),
            "the unsigned copy judged under {:?}",
            wr.spec.module.oci
        );
        if webhook.oci.required_key.is_some() {
            // A ConfigMap module (its ConfigMap is the copy here) is refused too.
            let mut wr = wr;
            wr.spec.module.oci = None;
            wr.spec.module.config_map = Some(at.clone());
            let got = webhook.module(&wr).await;
            assert!(got.is_err_and(|e| e.contains("requires signed modules")));
        }
    }
}

/// A WasmReconciler's webhook configurations are written from its spec only once the manager
/// serves that spec (`Ready=True` for its generation): a creator who edits an active
/// reconciler's primary to another tenant's kind (refused by the manager) must not get the
/// old module, with `failurePolicy: Fail`, in the path of that kind's writes.
#[test]
fn only_a_spec_the_manager_serves_gets_webhook_configurations() {
    let with = |generation: i64, observed: Option<i64>, ready: &str| {
        let mut wr = serving("a", &"ab".repeat(32));
        wr.metadata.generation = Some(generation);
        if let Some(s) = wr.status.as_mut() {
            s.observed_generation = observed;
            s.conditions = vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: "Ready".into(),
                status: ready.into(),
                reason: "Served".into(),
                message: String::new(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: None,
            }];
        }
        wr
    };
    assert!(accepted(&with(2, Some(2), "True")));
    assert!(
        !accepted(&with(3, Some(2), "True")),
        "an edit not served yet"
    );
    assert!(
        !accepted(&with(3, Some(3), "False")),
        "an edit the manager refused"
    );
    assert!(!accepted(&with(1, None, "True")));
}
