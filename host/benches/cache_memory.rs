//! `make bench-cache-memory`: what the controller's caches hold per object at N Apps, without a
//! control plane. Builds N objects of each kind the image-updater example works with (the App,
//! its Deployment and its Service, as the API server returns them: uid, resourceVersion,
//! creationTimestamp, generation, ownerReferences, the defaulted spec fields, a status with two
//! conditions; names and uids vary), strips `managedFields` as the controller does, and feeds them
//! as one list (`Init`, `InitApply`..., `InitDone`) into the caches:
//! - **old**: every kind in a kube-runtime reflector `Store<DynamicObject>` plus its
//!   [`Index`] (the controller before the compact caches);
//! - **new**: the Apps as [`Compact`]s in a reflector store (the primaries' store feeds
//!   kube-runtime's `Controller`: typed metadata plus the JSON text), the Deployments and
//!   Services in compact [`Cache`]s (each object as its JSON text), with their indexes.
//!
//! Each representation runs in a fresh child process (freed heap is not returned to the system,
//! so a second measurement in the same process would reuse the first one's pages) and reports its
//! RssAnon growth per kind. `WASMOP_BENCH_N` (default 10000). Last line:
//! `cache memory per object KiB: old X.X new Y.Y` (RssAnon growth over all 3N objects / 3N).

use std::process::Command;

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::Event;
use serde_json::Value;
use wasmop::controller::cache::{self, Cache, Index};
use wasmop::controller::compact::Compact;
use wasmop::controller::predicate::Changes;
use wasmop::lean::Lean;

#[path = "support/objects.rs"]
mod objects;
use objects::{app, deployment, service, uid};

/// RssAnon in KiB.
fn rss_anon_kib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN)
}

/// One object as the controller's watch delivers it (`managedFields` stripped).
fn object(v: Value) -> anyhow::Result<Lean> {
    Ok(Lean::parse(&v.to_string())?)
}

/// One object as the controller before the compact caches held it (`managedFields` stripped).
fn whole(v: Value) -> anyhow::Result<DynamicObject> {
    let mut o: DynamicObject = serde_json::from_value(v)?;
    o.metadata.managed_fields = None;
    Ok(o)
}

fn resource(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

/// The holders of one kind's objects; kept alive until the process reports.
enum Held {
    Old(
        #[allow(dead_code)] kube::runtime::reflector::Store<DynamicObject>,
        #[allow(dead_code)] std::sync::Arc<Index>,
    ),
    Primaries(
        #[allow(dead_code)] kube::runtime::reflector::Store<Compact>,
        #[allow(dead_code)] std::sync::Arc<Index>,
    ),
    New(std::sync::Arc<Cache>),
}

/// How one kind is cached.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    /// `DynamicObject`s in a reflector store, with an index.
    Whole,
    /// [`Compact`]s in a reflector store, with an index (the primaries, new).
    Compact,
    /// A [`Cache`] (owned and related kinds, new).
    Text,
}

/// Feeds N objects of one kind into the representation `mode`; prints the RssAnon growth.
fn fill(
    mode: &str,
    n: usize,
    (name, ar, make, by): (&str, ApiResource, fn(usize) -> Value, cache::GroupBy),
    form: Form,
) -> anyhow::Result<(f64, Held)> {
    let before = rss_anon_kib();
    let held = if form == Form::Compact {
        let mut writer = Writer::<Compact>::new(ar);
        let index = Index::new(by);
        let store = writer.as_reader();
        for e in std::iter::once(Ok(Event::Init))
            .chain((0..n).map(|i| object(make(i)).map(Event::InitApply)))
            .chain(std::iter::once(Ok(Event::InitDone)))
        {
            // As the controller: the index follows the watch's objects, the store their
            // compact form.
            let e = e?;
            index.record(&e);
            let c = match e {
                Event::InitApply(o) => Event::InitApply(Compact::new(&o, Changes::OutsideStatus)),
                Event::Init => Event::Init,
                _ => Event::InitDone,
            };
            writer.apply_watcher_event(&c);
        }
        anyhow::ensure!(
            store.len() == n,
            "the store holds {} of {n} {name}s",
            store.len()
        );
        Held::Primaries(store, index)
    } else if form == Form::Text {
        let c = Cache::new(by);
        c.record(&Event::Init);
        for i in 0..n {
            c.record(&Event::InitApply(object(make(i))?));
        }
        c.record(&Event::InitDone);
        anyhow::ensure!(c.len() == n, "the cache holds {} of {n} {name}s", c.len());
        Held::New(c)
    } else {
        let mut writer = Writer::new(ar);
        let index = Index::new(by);
        let store = writer.as_reader();
        writer.apply_watcher_event(&Event::Init);
        index.record(&Event::Init);
        for i in 0..n {
            writer.apply_watcher_event(&Event::InitApply(whole(make(i))?));
            index.record(&Event::InitApply(object(make(i))?));
        }
        writer.apply_watcher_event(&Event::InitDone);
        index.record(&Event::InitDone);
        anyhow::ensure!(
            store.len() == n,
            "the store holds {} of {n} {name}s",
            store.len()
        );
        Held::Old(store, index)
    };
    let grown = rss_anon_kib() - before;
    println!(
        "cache memory {mode} {name}: {:.2} KiB per object ({:.1} MiB for {n})",
        grown / n as f64,
        grown / 1024.0
    );
    Ok((grown, held))
}

/// The child process: one representation, all three kinds; prints `total KiB: X`.
fn child(mode: &str, n: usize) -> anyhow::Result<()> {
    // The old form keeps every kind whole; the new one keeps primaries compact and the rest as
    // text, as the controller does.
    let (primaries, others) = if mode == "new" {
        (Form::Compact, Form::Text)
    } else {
        (Form::Whole, Form::Whole)
    };
    let kinds = [
        (
            "App",
            resource("example.wasmop.dev", "v1", "App"),
            app as fn(usize) -> Value,
            cache::namespace as cache::GroupBy,
            primaries,
        ),
        (
            "Deployment",
            resource("apps", "v1", "Deployment"),
            deployment,
            cache::controller_uid,
            others,
        ),
        (
            "Service",
            resource("", "v1", "Service"),
            service,
            cache::controller_uid,
            others,
        ),
    ];
    let mut total = 0.0;
    let mut held = Vec::new();
    for (name, ar, make, by, form) in kinds {
        let (grown, h) = fill(mode, n, (name, ar, make, by), form)?;
        total += grown;
        held.push(h);
    }
    if let Some(Held::New(c)) = held.get(1) {
        // A lookup works on what was measured (and keeps the caches alive until here).
        anyhow::ensure!(c.group(&uid(1, 0)).len() == 1, "a child lookup failed");
    }
    println!("total KiB: {total:.1}");
    Ok(())
}

fn run(mode: &str, n: usize) -> anyhow::Result<f64> {
    let out = Command::new(std::env::current_exe()?)
        .env("WASMOP_BENCH_CACHE_MODE", mode)
        .env("WASMOP_BENCH_N", n.to_string())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "the {mode} run failed: {}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut total = None;
    for line in text.lines() {
        match line.strip_prefix("total KiB: ") {
            Some(t) => total = t.trim().parse::<f64>().ok(),
            None => println!("{line}"),
        }
    }
    total.ok_or_else(|| anyhow::anyhow!("the {mode} run printed no total: {text}"))
}

fn main() -> anyhow::Result<()> {
    let n: usize = match std::env::var("WASMOP_BENCH_N") {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("WASMOP_BENCH_N={v:?} is not a number"))?,
        _ => 10_000,
    };
    anyhow::ensure!(n > 0, "WASMOP_BENCH_N must be at least 1");
    if let Ok(mode) = std::env::var("WASMOP_BENCH_CACHE_MODE") {
        return child(&mode, n);
    }
    let sample = [app(0), deployment(0), service(0)]
        .into_iter()
        .map(object)
        .collect::<anyhow::Result<Vec<_>>>()?;
    for (o, kind) in sample.iter().zip(["App", "Deployment", "Service"]) {
        println!(
            "cache memory JSON text of one {kind}: {} bytes",
            o.json().len()
        );
    }
    let old = run("old", n)?;
    let new = run("new", n)?;
    let objects = 3.0 * n as f64;
    println!(
        "cache memory N={n}: old {:.1} MiB new {:.1} MiB for {} objects",
        old / 1024.0,
        new / 1024.0,
        3 * n
    );
    println!(
        "cache memory per object KiB: old {:.1} new {:.1}",
        old / objects,
        new / objects
    );
    Ok(())
}
