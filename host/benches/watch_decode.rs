//! `make bench-watch-decode`: what the controller's watches spend on each event before a reconcile
//! sees it, without a control plane: the watch event lines of an image-updater App's rollout (the
//! App, its Deployment, its Service, as the API server sends them, `managedFields` of the host's
//! apply and the controller-manager's status updates included), decoded and cached as the host
//! does, side by side in one run:
//! - **old**: `WatchEvent<DynamicObject>` (a `serde_json::Value` tree, through serde's flatten
//!   buffer), `managedFields` stripped, serialized back to text for the cache; a primary also
//!   fingerprinted over its `Value`s (the host before [`Lean`]);
//! - **new**: `WatchEvent<Lean>` (the text split into fields, the metadata parsed), the cache
//!   entry shares its text; a primary made a [`Compact`].
//!
//! Rounds alternate old and new; each prints its mean, the figure is the median round.
//! `WASMOP_BENCH_N` events per kind and round (default 5000). Last line:
//! `watch decode us per event: old X.XX new Y.YY`.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Instant;

use kube::api::DynamicObject;
use kube::core::WatchEvent;
use serde_json::{Value, json};
use wasmop::controller::compact::Compact;
use wasmop::controller::noop;
use wasmop::controller::predicate::Changes;
use wasmop::lean::Lean;

#[path = "support/objects.rs"]
mod objects;

const ROUNDS: usize = 7;

/// The managedFields of a rolled-out child: the host's apply and the controller-manager's
/// status updates (what a Deployment's watch events carry while its rollout progresses).
fn rollout_managed_fields(kind: &str) -> Value {
    json!([
        {"manager": "wasmop-image-updater", "operation": "Apply", "apiVersion": "apps/v1",
         "time": "2026-11-24T10:00:01Z", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:metadata": {"f:labels": {"f:app.kubernetes.io/managed-by": {},
             "f:app.kubernetes.io/name": {}, "f:example.wasmop.dev/track": {}},
             "f:ownerReferences": {"k:{\"uid\":\"x\"}": {}}},
           "f:spec": {"f:replicas": {}, "f:selector": {}, "f:template": {"f:metadata": {
             "f:labels": {"f:app.kubernetes.io/name": {}, "f:example.wasmop.dev/track": {}}},
             "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:image": {},
               "f:name": {}, "f:ports": {"k:{\"containerPort\":8080,\"protocol\":\"TCP\"}": {
                 ".": {}, "f:containerPort": {}, "f:name": {}}}}}}}}}},
        {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "apps/v1",
         "time": "2026-11-24T10:00:04Z", "fieldsType": "FieldsV1", "subresource": "status",
         "fieldsV1": {"f:metadata": {"f:annotations": {".": {},
             "f:deployment.kubernetes.io/revision": {}}},
           "f:status": {"f:availableReplicas": {}, "f:conditions": {".": {},
             "k:{\"type\":\"Available\"}": {".": {}, "f:lastTransitionTime": {}, "f:lastUpdateTime": {},
               "f:message": {}, "f:reason": {}, "f:status": {}, "f:type": {}},
             "k:{\"type\":\"Progressing\"}": {".": {}, "f:lastTransitionTime": {},
               "f:lastUpdateTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}, "f:type": {}}},
             "f:observedGeneration": {}, "f:readyReplicas": {}, "f:replicas": {},
             "f:updatedReplicas": {}}}},
        {"manager": kind, "operation": "Update", "apiVersion": "v1", "time": "2026-11-24T10:00:01Z",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:finalizers": {".": {}}}}}
    ])
}

/// `n` watch event lines of one kind, each a MODIFIED event of its own object.
fn lines(n: usize, make: fn(usize) -> Value, kind: &str) -> Vec<String> {
    (0..n)
        .map(|i| {
            let mut o = make(i);
            o["metadata"]["managedFields"] = rollout_managed_fields(kind);
            // As the API server writes a watch event: `type` first (Go writes `WatchEvent`'s
            // fields in their order; `json!` would sort `object` first).
            format!(r#"{{"type":"MODIFIED","object":{o}}}"#)
        })
        .collect()
}

/// The old primary fingerprint: the metadata without resourceVersion and managedFields, and
/// each data field's `Value` (sorted keys), hashed.
fn old_fingerprint(o: &DynamicObject) -> u64 {
    let mut meta = o.metadata.clone();
    meta.resource_version = None;
    meta.managed_fields = None;
    let mut h = DefaultHasher::new();
    serde_json::to_string(&meta)
        .unwrap_or_default()
        .hash(&mut h);
    if let Value::Object(m) = &o.data {
        for (k, v) in m.iter().filter(|(k, _)| k.as_str() != "status") {
            k.hash(&mut h);
            noop::fingerprint(v).hash(&mut h);
        }
    }
    h.finish()
}

/// The host before [`Lean`]: decode, strip, serialize (and fingerprint a primary).
fn old(line: &str, primary: bool) -> anyhow::Result<usize> {
    let WatchEvent::Modified(mut o) = serde_json::from_str::<WatchEvent<DynamicObject>>(line)?
    else {
        anyhow::bail!("not a MODIFIED event");
    };
    o.metadata.managed_fields = None;
    let fingerprint = if primary { old_fingerprint(&o) } else { 0 };
    let text: std::sync::Arc<str> = serde_json::to_string(&o)?.into();
    Ok(text.len() + (fingerprint & 1) as usize)
}

/// The host now: decode as [`Lean`], share its text (a primary made a [`Compact`]).
fn new(line: &str, primary: bool) -> anyhow::Result<usize> {
    let WatchEvent::Modified(o) = serde_json::from_str::<WatchEvent<Lean>>(line)? else {
        anyhow::bail!("not a MODIFIED event");
    };
    if primary {
        let c = Compact::new(&o, Changes::OutsideStatus);
        return Ok(c.json().len() + c.fingerprint().map_or(0, |f| (f & 1) as usize));
    }
    Ok(o.json().clone().len())
}

/// Mean microseconds per event of `decode` over every line of `kinds`.
fn round(
    kinds: &[(Vec<String>, bool)],
    decode: fn(&str, bool) -> anyhow::Result<usize>,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let (mut events, mut bytes) = (0usize, 0usize);
    for (lines, primary) in kinds {
        for line in lines {
            bytes += decode(line, *primary)?;
            events += 1;
        }
    }
    anyhow::ensure!(bytes > 0, "nothing decoded");
    Ok(start.elapsed().as_secs_f64() * 1e6 / events as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let n: usize = match std::env::var("WASMOP_BENCH_N") {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("WASMOP_BENCH_N={v:?} is not a number"))?,
        Err(_) => 5000,
    };
    anyhow::ensure!(n > 0, "WASMOP_BENCH_N must be at least 1");
    let kinds = [
        (lines(n, objects::app, "wasmop"), true),
        (lines(n, objects::deployment, "wasmop"), false),
        (lines(n, objects::service, "wasmop"), false),
    ];
    for ((lines, _), kind) in kinds.iter().zip(["App", "Deployment", "Service"]) {
        let (old_text, new_text) = (old(&lines[0], false)?, new(&lines[0], false)?);
        println!(
            "watch decode {kind}: event line {} bytes, cached text {old_text} bytes (old) {new_text} bytes (new)",
            lines[0].len()
        );
    }
    for (k, kind) in kinds.iter().zip(["App", "Deployment", "Service"]) {
        let one = std::slice::from_ref(k);
        let (o, n) = (round(one, old)?, round(one, new)?);
        println!("watch decode {kind}: old {o:.2} us new {n:.2} us per event");
    }
    let (mut olds, mut news) = (Vec::new(), Vec::new());
    for r in 0..ROUNDS {
        olds.push(round(&kinds, old)?);
        news.push(round(&kinds, new)?);
        println!(
            "watch decode round {}: old {:.2} us new {:.2} us per event",
            r + 1,
            olds[r],
            news[r]
        );
    }
    println!(
        "watch decode us per event: old {:.2} new {:.2}",
        median(olds),
        median(news)
    );
    Ok(())
}
