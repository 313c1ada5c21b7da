//! `make bench-event-publish`: what publishing a module's Event costs the host once the lane has
//! published many, without a control plane. kube-runtime's `Recorder` scans its whole cache
//! (every Event of the last six minutes) on each publish, so its cost grows with the Events
//! before it; a lane publishes through [`Recorders`], several `Recorder`s chosen by the object.
//!
//! Each round publishes `WASMOP_BENCH_N` Events (default 20000), one per object and one after the
//! other as a lane does, to an API server that answers at once (an in-process HTTP service
//! echoing the Event), through one `Recorder` (the host before) and through [`Recorders`] of
//! [`RECORDERS`] (now), and prints the mean per Event of the first and the last tenth. Rounds
//! alternate; the figures are the median round's. Last line: `event publish us per event, last
//! tenth: one recorder X.XX recorders Y.YY`.

use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::client::Body;
use kube::runtime::events::{Event, EventType, Reporter};
use wasmop::controller::emit::{RECORDERS, Recorders};

const ROUNDS: usize = 3;

/// A client whose API server answers every request 201 with its body.
fn echo_client() -> Client {
    let service = tower::service_fn(|req: http::Request<Body>| async move {
        let body = req.into_body().collect().await?.to_bytes();
        Ok::<_, tower::BoxError>(
            http::Response::builder()
                .status(201)
                .body(Body::from(body.to_vec()))?,
        )
    });
    Client::new(service, "default")
}

fn event(i: usize) -> (Event, ObjectReference) {
    let event = Event {
        type_: EventType::Normal,
        reason: "Creating".into(),
        note: Some("creating the Deployment and the Service".into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    let regarding = ObjectReference {
        api_version: Some("example.wasmop.dev/v1".into()),
        kind: Some("App".into()),
        namespace: Some(format!("ns-{}", i % 100)),
        name: Some(format!("app-{i}")),
        uid: Some(format!("00000000-0000-0000-0000-{i:012}")),
        ..ObjectReference::default()
    };
    (event, regarding)
}

/// Publishes `n` Events one after the other through `recorders` recorders; returns the mean
/// microseconds per Event of the first and of the last tenth.
async fn run(n: usize, recorders: usize) -> (f64, f64) {
    let reporter = Reporter {
        controller: "wasmop/bench".into(),
        instance: None,
    };
    let recorders = Recorders::with_count(&echo_client(), &reporter, recorders);
    let tenth = (n / 10).max(1);
    let (mut first, mut last) = (Duration::ZERO, Duration::ZERO);
    for i in 0..n {
        let (e, r) = event(i);
        let began = Instant::now();
        recorders
            .publish(&e, &r)
            .await
            .expect("the echo server takes every Event");
        if i < tenth {
            first += began.elapsed();
        } else if i >= n - tenth {
            last += began.elapsed();
        }
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / tenth as f64;
    (per(first), per(last))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n = std::env::var("WASMOP_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n: &usize| *n >= 10)
        .unwrap_or(20_000);
    println!("event publish, {n} Events per round, {ROUNDS} rounds (us per Event)");
    let mut one = Vec::new();
    let mut many = Vec::new();
    for round in 1..=ROUNDS {
        let o = run(n, 1).await;
        let m = run(n, RECORDERS).await;
        eprintln!("  round {round}: one recorder {o:.2?}, {RECORDERS} recorders {m:.2?}");
        one.push(o);
        many.push(m);
    }
    println!("| recorders | first tenth | last tenth |");
    println!("| --- | --- | --- |");
    for (label, runs) in [
        ("one (before)".to_string(), &one),
        (format!("{RECORDERS} (now)"), &many),
    ] {
        println!(
            "| {label} | {:.2} us | {:.2} us |",
            median(runs.iter().map(|r| r.0).collect()),
            median(runs.iter().map(|r| r.1).collect())
        );
    }
    println!();
    println!(
        "event publish us per event, last tenth: one recorder {:.2} recorders {:.2}",
        median(one.iter().map(|r| r.1).collect()),
        median(many.iter().map(|r| r.1).collect())
    );
}
