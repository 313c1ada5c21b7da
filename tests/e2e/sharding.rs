//! Sharding (`wasmop run --shards auto`): three host processes share 300 Widgets spread over 30
//! namespaces; one is SIGKILLed and a fourth joins. Each primary is reconciled by one replica at
//! a time, and nothing is lost.
//!
//! Each scenario runs on a control plane of its own: one with the `ShardedListAndWatch` feature
//! gate (the hosts detect it and let the API server filter their watches), one without (the
//! hosts filter on their side). Each runs on a control plane of its own, beside the other
//! tests of the e2e process but not beside another scenario of this file ([`scenario_turn`]):
//! four hosts and a control plane at a time are enough for a 2-core machine.
//!
//! The proof, from records rather than timing:
//! - the objects: every Widget's `status.observedGeneration` catches up with each spec change
//!   (made after the kill, and after the fourth replica joined);
//! - the hosts' metrics: the primaries in each replica's slice sum to 300, the live members'
//!   shares of the hash space sum to 1, and each replica reports how its watches are filtered;
//! - the hosts' reconcile records (one `sharded reconcile` debug line per reconcile, with the
//!   primary and its start and end): per primary, the replicas' reconciles never overlap and
//!   each replica's form one block (no replica reconciles a primary again after another took it
//!   over), and before the kill each primary was reconciled by exactly one replica;
//! - the same records, with the children the caches held (reliability item 6): once every Widget
//!   has its child, no reconcile (a takeover's or a join's included) sees none, i.e. no gained
//!   primary is reconciled before its owned cache listed it;
//! - and (item 8): while the fourth replica joins, the replicas that only give ranges up
//!   reconcile nothing, and from the kill to the fourth's start each survivor reconciles every
//!   primary it held all along once, for the spec change (a range change reconciles the
//!   primaries gained, not every one held; a relisted child of a built-in kind is no change).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use wasm_encoder::ComponentSection;
use wasmop_testenv::{ControlPlane, HostProcess, Options, eventually};

/// Namespaces of Widgets, and Widgets per namespace (namespaced primaries shard by namespace).
const NAMESPACES: usize = 30;
const PER_NAMESPACE: usize = 10;
const TOTAL: usize = NAMESPACES * PER_NAMESPACE;
/// The host processes' namespace (their member Leases).
const HOST_NS: &str = "wasmop-system";
/// The module's namespace (its ConfigMap and ServiceAccount).
const MODULE_NS: &str = "shard-module";
/// The WasmReconciler.
const WR: &str = "widgets";
/// Lease timings near the defaults (15 s / 10 s / 2 s), with a shorter retry period; a renew
/// deadline must outlast the API server's stalls on a loaded 2-core machine: a replica that
/// cannot renew within it stops by design (fencing), and with 3 s one did (load average ~15,
/// etcd cancelling requests), and with 8 s all three did once beside two busy loops (the API
/// server did not answer for over 8 s). Lease 20 s, renew deadline 15 s, retry 1 s.
const LEASE: Duration = Duration::from_secs(20);
const RENEW_DEADLINE: Duration = Duration::from_secs(15);
const RETRY: Duration = Duration::from_secs(1);
/// The WasmReconciler's resync period: longer than the scenario, so that every reconcile in the
/// records has a cause the scenario made (a spec change, a handover), not a resync.
const RESYNC: Duration = Duration::from_secs(900);
/// Generous: 300 Widgets on a loaded 2-core machine.
const CONVERGE: Duration = Duration::from_secs(240);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// A sharded host process logging into `dir`.
async fn replica(cp: &ControlPlane, dir: &Path) -> anyhow::Result<HostProcess> {
    replica_with(cp, dir, &[]).await
}

/// A sharded host process logging into `dir`, with `extra` arguments.
async fn replica_with(
    cp: &ControlPlane,
    dir: &Path,
    extra: &[&str],
) -> anyhow::Result<HostProcess> {
    replica_with_env(cp, dir, extra, Vec::new()).await
}

/// A sharded host process logging into `dir`, with `extra` arguments and environment `env`.
async fn replica_with_env(
    cp: &ControlPlane,
    dir: &Path,
    extra: &[&str],
    env: Vec<(String, Option<String>)>,
) -> anyhow::Result<HostProcess> {
    let bin = wasmop_binary().await?;
    let secs = |d: Duration| format!("{}s", d.as_secs());
    let args = [
        "--log-format",
        "json",
        "run",
        "--kubeconfig",
        &cp.kubeconfig().display().to_string(),
        "--namespace",
        HOST_NS,
        "--metrics-addr",
        "127.0.0.1:0",
        "--webhook-addr",
        "off",
        "--shards",
        "auto",
        "--shard-lease-duration",
        &secs(LEASE),
        "--shard-renew-deadline",
        &secs(RENEW_DEADLINE),
        "--shard-retry-period",
        &secs(RETRY),
    ]
    .into_iter()
    .chain(extra.iter().copied())
    .map(str::to_string)
    .collect();
    HostProcess::start_with_env(bin, args, "info,wasmop::sharding=debug", dir, env).await
}

/// One reconcile as a replica recorded it.
#[derive(Debug, Clone)]
struct Record {
    replica: usize,
    started: u64,
    finished: u64,
    /// The children of the primary in the replica's caches when the reconcile started.
    children: u64,
}

/// Every `sharded reconcile` record of every run of every replica, by primary (`ns/name`).
fn records(dirs: &[PathBuf]) -> BTreeMap<String, Vec<Record>> {
    let mut out: BTreeMap<String, Vec<Record>> = BTreeMap::new();
    for (replica, dir) in dirs.iter().enumerate() {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            for line in text.lines() {
                let Ok(v) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                let f = &v["fields"];
                if f["message"] != "sharded reconcile" || f["reconciler"] != WR {
                    continue;
                }
                let (Some(primary), Some(started), Some(finished)) = (
                    f["primary"].as_str(),
                    f["started_ms"].as_u64(),
                    f["finished_ms"].as_u64(),
                ) else {
                    continue;
                };
                out.entry(primary.to_string()).or_default().push(Record {
                    replica,
                    started,
                    finished,
                    children: f["children"].as_u64().unwrap_or_default(),
                });
            }
        }
    }
    for v in out.values_mut() {
        v.sort_by_key(|r| (r.started, r.finished));
    }
    out
}

/// Per primary: no two replicas' reconciles overlap, and each replica's reconciles form one
/// block (a primary never goes back to a replica that handed it over).
fn assert_exclusive(records: &BTreeMap<String, Vec<Record>>) -> anyhow::Result<()> {
    for (primary, rs) in records {
        for pair in rs.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if a.replica != b.replica {
                anyhow::ensure!(
                    a.finished <= b.started,
                    "{primary}: replica {} reconciled it until {} while replica {} started at {}: {rs:?}",
                    a.replica,
                    a.finished,
                    b.replica,
                    b.started
                );
            }
        }
        let mut blocks: Vec<usize> = rs.iter().map(|r| r.replica).collect();
        blocks.dedup();
        let mut distinct = blocks.clone();
        distinct.sort_unstable();
        distinct.dedup();
        anyhow::ensure!(
            blocks.len() == distinct.len(),
            "{primary} went back to a replica that had handed it over: {blocks:?}"
        );
    }
    Ok(())
}

/// Reliability item 6: no reconcile that started after `since` (when every Widget had its
/// child) saw a primary without its child: gained primaries wait for their caches.
fn assert_children_listed(
    records: &BTreeMap<String, Vec<Record>>,
    since: u64,
) -> anyhow::Result<()> {
    let blind: Vec<(&String, &Record)> = records
        .iter()
        .flat_map(|(p, rs)| rs.iter().map(move |r| (p, r)))
        .filter(|(_, r)| r.started > since && r.children == 0)
        .collect();
    anyhow::ensure!(
        blind.is_empty(),
        "{} reconciles saw no child although every Widget had one (caches not listed yet): {:?}",
        blind.len(),
        blind.iter().take(5).collect::<Vec<_>>()
    );
    Ok(())
}

/// Reliability item 8: the reconciles `replicas` started in `[from, to)`.
fn reconciles_between(
    records: &BTreeMap<String, Vec<Record>>,
    replicas: &[usize],
    (from, to): (u64, u64),
) -> usize {
    records
        .values()
        .flatten()
        .filter(|r| replicas.contains(&r.replica) && r.started >= from && r.started < to)
        .count()
}

/// Item 8 for a takeover: from the kill to the fourth replica's start, each survivor reconciled
/// every primary it held all along once (for the spec change made after the kill), not again
/// when it gained the killed replica's ranges: a gain relists every watch, and a relist of
/// unchanged objects calls for no reconcile. `before` holds the records up to the kill.
fn assert_held_reconciled_once(
    all: &BTreeMap<String, Vec<Record>>,
    before: &BTreeMap<String, Vec<Record>>,
    (from, to): (u64, u64),
) -> anyhow::Result<()> {
    let mut again = Vec::new();
    for (primary, rs) in before {
        let Some(holder) = rs.first().map(|r| r.replica).filter(|r| *r != 2) else {
            continue;
        };
        let n = all
            .get(primary)
            .into_iter()
            .flatten()
            .filter(|r| r.replica == holder && r.started >= from && r.started < to);
        let n = n.count();
        if n != 1 {
            again.push(format!("{primary}: {n} by replica {holder}"));
        }
    }
    anyhow::ensure!(
        again.is_empty(),
        "{} primaries held all along by a survivor were not reconciled exactly once for one spec change while the survivors took the killed replica's ranges over: {again:?}",
        again.len()
    );
    Ok(())
}

fn widget(ns: &str, name: &str) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"round": 0}
    }))?)
}

/// The Widgets' namespaces. Their varying part comes first: FNV-1a (the API server's shard
/// hash) leaves names that differ only in their last bytes close together in the hash space
/// (`shard-ns-0` .. `shard-ns-29` fall into two clusters), which would put whole groups of them
/// on one replica.
fn namespaces() -> Vec<String> {
    (0..NAMESPACES).map(|i| format!("ns{i}-shard")).collect()
}

/// The cluster-side setup: CRDs, namespaces, the module, its ServiceAccount (allowed
/// everywhere) and the WasmReconciler.
async fn register(client: &Client) -> anyhow::Result<()> {
    install_crds(client).await?;
    let ns_api: Api<Namespace> = Api::all(client.clone());
    for ns in [HOST_NS.to_string(), MODULE_NS.to_string()]
        .into_iter()
        .chain(namespaces())
    {
        let n: Namespace = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )?;
        match ns_api.create(&PostParams::default(), &n).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    push_module(client, MODULE_NS, WR, wasmop_test_modules::MISBEHAVE).await?;
    service_account(client, MODULE_NS, WR, json!([])).await?;
    let apply = PatchParams::apply("wasmop-e2e").force();
    let role: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "shard-widgets"}, "rules": widget_rules()
    }))?;
    Api::<ClusterRole>::all(client.clone())
        .patch("shard-widgets", &apply, &Patch::Apply(&role))
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "shard-widgets"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "shard-widgets"},
        "subjects": [{"kind": "ServiceAccount", "name": WR, "namespace": MODULE_NS}]
    }))?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch("shard-widgets", &apply, &Patch::Apply(&binding))
        .await?;
    let wr = json!({
        "apiVersion": "wasmop.dev/v1alpha1", "kind": "WasmReconciler",
        "metadata": {"name": WR},
        "spec": {
            "module": {"configMap": {"namespace": MODULE_NS, "name": WR}},
            "primary": {"apiVersion": "test.wasmop.dev/v1", "kind": "Widget"},
            "owns": [{"apiVersion": "v1", "kind": "ConfigMap"}],
            "namespaces": namespaces(),
            "serviceAccount": {"namespace": MODULE_NS, "name": WR},
            "limits": {"deadline": "2s", "memory": "64Mi", "concurrency": 8},
            "resyncPeriod": format!("{}s", RESYNC.as_secs()),
        }
    });
    apply_reconciler(client, &wr).await
}

/// Sets every Widget's `spec.round` (a new generation each).
async fn bump(client: &Client, round: u32) -> anyhow::Result<()> {
    for ns in namespaces() {
        let api = widgets(client, &ns);
        for i in 0..PER_NAMESPACE {
            api.patch(
                &format!("w-{i}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"round": round}})),
            )
            .await?;
        }
    }
    Ok(())
}

/// Waits until every Widget's status has caught up with its generation.
async fn converged(client: &Client, what: &str) -> anyhow::Result<()> {
    eventually(what, CONVERGE, || async {
        let mut behind = Vec::new();
        for ns in namespaces() {
            for w in widgets(client, &ns).list(&ListParams::default()).await? {
                let generation = w.metadata.generation;
                let observed = w.data["status"]["observedGeneration"].as_i64();
                if generation.is_none() || observed != generation {
                    behind.push(format!("{ns}/{}", w.metadata.name.unwrap_or_default()));
                }
            }
        }
        if behind.is_empty() {
            Ok(Some(()))
        } else {
            anyhow::bail!(
                "{} Widgets behind, e.g. {:?}",
                behind.len(),
                &behind[..behind.len().min(5)]
            )
        }
    })
    .await
}

/// A sample of a host's metrics, 0 when absent.
async fn sample(host: &HostProcess, series: &str) -> anyhow::Result<f64> {
    Ok(host.sample(series).await?.unwrap_or(0.0))
}

/// Whether the member Leases hold exactly what the ring assigns to the `n` members.
async fn leases_settled(client: &Client, n: usize) -> anyhow::Result<()> {
    use wasmop::sharding::{Ranges, membership, ring};
    let leases: Api<Lease> = Api::namespaced(client.clone(), HOST_NS);
    let members: Vec<(String, Ranges)> = leases
        .list(&ListParams::default().labels(&format!("{}=wasmop", membership::GROUP_LABEL)))
        .await?
        .items
        .into_iter()
        .filter_map(|l| {
            let held = l
                .metadata
                .annotations
                .as_ref()?
                .get(membership::HELD_ANNOTATION)?
                .clone();
            let identity = l.spec?.holder_identity?;
            Some((identity, Ranges::parse(&held).ok()?))
        })
        .collect();
    anyhow::ensure!(
        members.len() == n,
        "{} member Leases, want {n}",
        members.len()
    );
    let names: Vec<String> = members.iter().map(|(m, _)| m.clone()).collect();
    for (m, held) in &members {
        anyhow::ensure!(
            *held == ring::assignment(&names, m),
            "{m} holds {held}, not its assignment"
        );
    }
    Ok(())
}

/// Waits until the `hosts` see each other and split the whole hash space between them as the
/// ring assigns it.
async fn balanced(client: &Client, hosts: &[&HostProcess]) -> anyhow::Result<Vec<f64>> {
    eventually(
        "the live replicas split the hash space",
        CONVERGE,
        || async {
            leases_settled(client, hosts.len()).await?;
            let mut shares = Vec::new();
            for h in hosts {
                let members = sample(h, "wasmop_shard_members").await?;
                anyhow::ensure!(
                    members == hosts.len() as f64,
                    "a host sees {members} members"
                );
                shares.push(sample(h, "wasmop_shard_fraction").await?);
            }
            let total: f64 = shares.iter().sum();
            anyhow::ensure!(
                (total - 1.0).abs() < 1e-9 && shares.iter().all(|s| *s > 0.0),
                "shares {shares:?}"
            );
            Ok(Some(shares))
        },
    )
    .await
}

/// The primaries in each host's slice, once they sum to the total.
async fn partitioned(hosts: &[&HostProcess]) -> anyhow::Result<Vec<f64>> {
    let series = format!("wasmop_shard_primaries{{reconciler=\"{WR}\"}}");
    eventually(
        "the replicas' slices partition the Widgets",
        CONVERGE,
        || async {
            let mut counts = Vec::new();
            for h in hosts {
                counts.push(sample(h, &series).await?);
            }
            anyhow::ensure!(
                counts.iter().sum::<f64>() == TOTAL as f64,
                "slices {counts:?} do not sum to {TOTAL}"
            );
            Ok(Some(counts))
        },
    )
    .await
}

/// The member Leases as (identity, held ranges, withdrawn).
async fn member_leases(
    client: &Client,
) -> anyhow::Result<Vec<(String, wasmop::sharding::Ranges, bool)>> {
    use wasmop::sharding::{Ranges, membership, serving};
    let leases: Api<Lease> = Api::namespaced(client.clone(), HOST_NS);
    let list = leases
        .list(&ListParams::default().labels(&format!("{}=wasmop", membership::GROUP_LABEL)))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|l| {
            let annotations = l.metadata.annotations.unwrap_or_default();
            let held = Ranges::parse(annotations.get(membership::HELD_ANNOTATION)?).ok()?;
            let withdrawn = annotations
                .get(serving::WITHDRAWN_ANNOTATION)
                .map(String::as_str)
                == Some("true");
            Some((l.spec?.holder_identity?, held, withdrawn))
        })
        .collect())
}

/// Reliability item 7: a replica that cannot set the reconciler up (here: its memory budget
/// for module calls is under the reconciler's `limits.memory`) withdraws its share: the two
/// others serve every Widget, and the WasmReconciler's status, as its watch history records it,
/// never says Ready=False.
async fn withdrawal(cp: &ControlPlane) -> anyhow::Result<()> {
    let client = cp.client().await?;
    let dirs: Vec<PathBuf> = (0..3)
        .map(|i| replica_logs(cp).join(format!("replica-{i}")))
        .collect();
    register(&client).await?;
    let healthy = [replica(cp, &dirs[0]).await?, replica(cp, &dirs[1]).await?];
    balanced(&client, &healthy.iter().collect::<Vec<_>>()).await?;
    wait_wr_ready(&client, WR).await?;
    let wrs: Api<wasmop::crd::WasmReconciler> = Api::all(client.clone());
    let since = wrs
        .get(WR)
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let _third = replica_with(cp, &dirs[2], &["--module-memory-budget", "32Mi"]).await?;
    eventually(
        "the third replica withdraws and the two others hold everything",
        CONVERGE,
        || async {
            let leases = member_leases(&client).await?;
            let serving: Vec<String> = leases
                .iter()
                .filter(|l| !l.2)
                .map(|l| l.0.clone())
                .collect();
            anyhow::ensure!(leases.len() == 3 && serving.len() == 2, "leases {leases:?}");
            for (identity, held, withdrawn) in &leases {
                let want = if *withdrawn {
                    wasmop::sharding::Ranges::empty()
                } else {
                    wasmop::sharding::ring::assignment(&serving, identity)
                };
                anyhow::ensure!(*held == want, "{identity} holds {held}, not {want}");
            }
            Ok(Some(()))
        },
    )
    .await?;
    for ns in namespaces() {
        let api = widgets(&client, &ns);
        for i in 0..PER_NAMESPACE {
            api.create(&PostParams::default(), &widget(&ns, &format!("w-{i}"))?)
                .await?;
        }
    }
    converged(
        &client,
        "300 Widgets reconciled while a replica cannot serve them",
    )
    .await?;
    // The status's history since the healthy replicas reported Ready: a server-side watch
    // timeout ends the stream once it has sent what changed.
    let params = kube::api::WatchParams::default().timeout(5);
    let mut history = Box::pin(wrs.watch(&params, &since).await?);
    let mut seen = 0;
    while let Some(event) = futures::StreamExt::next(&mut history).await {
        if let kube::api::WatchEvent::Modified(wr) = event? {
            seen += 1;
            let ready = wr.status.as_ref().and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == "Ready")
                    .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
            });
            anyhow::ensure!(
                ready.as_ref().is_some_and(|r| r.0 == "True"),
                "the WasmReconciler's Ready flipped: {ready:?}"
            );
        }
    }
    eprintln!("[sharding] withdrawal: {seen} status changes since Ready, none of them Ready=False");
    group_rollback(&client, &healthy).await?;
    group_swap(cp, &client, &healthy).await
}

/// The conditions `Ready` and `ModuleLoaded` of every status in the WasmReconciler's watch
/// history since `since`, where either is False (a server-side watch timeout ends the stream
/// once it has sent what changed).
async fn flips_since(client: &Client, since: &str) -> anyhow::Result<(usize, Vec<String>)> {
    let wrs: Api<wasmop::crd::WasmReconciler> = Api::all(client.clone());
    let params = kube::api::WatchParams::default().timeout(5);
    let mut history = Box::pin(wrs.watch(&params, since).await?);
    let (mut seen, mut flips) = (0, Vec::new());
    while let Some(event) = futures::StreamExt::next(&mut history).await {
        if let kube::api::WatchEvent::Modified(wr) = event? {
            seen += 1;
            let conditions = wr.status.map(|s| s.conditions).unwrap_or_default();
            flips.extend(
                conditions
                    .iter()
                    .filter(|c| {
                        (c.type_ == "Ready" || c.type_ == "ModuleLoaded") && c.status != "True"
                    })
                    .map(|c| format!("{} {} {}: {}", c.type_, c.status, c.reason, c.message)),
            );
        }
    }
    Ok((seen, flips))
}

/// Reliability item 7, swaps: one replica decides a new module for the group. A replica that
/// cannot load it (here its `--max-module-bytes` is under the new module's size) follows
/// nothing it cannot serve: it withdraws its share, and the status, as its watch history
/// records it, never says the module was refused; every Widget is then served by the new
/// module. Its identity sorts after the others', so that it does not decide.
async fn group_swap(
    cp: &ControlPlane,
    client: &Client,
    healthy: &[HostProcess; 2],
) -> anyhow::Result<()> {
    let good = wasmop_test_modules::bytes(wasmop_test_modules::MISBEHAVE);
    let mut big = good.clone();
    let padding: Vec<u8> = (0..128u32 << 10)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    wasm_encoder::CustomSection {
        name: "wasmop-test-padding".into(),
        data: padding.into(),
    }
    .append_to_component(&mut big);
    let cap = (good.len() + (64 << 10)).to_string();
    let dir = replica_logs(cp).join("replica-capped");
    let hostname = vec![("HOSTNAME".to_string(), Some("zzzz-capped".to_string()))];
    let capped = replica_with_env(cp, &dir, &["--max-module-bytes", &cap], hostname).await?;
    eventually("the capped replica serves a share", CONVERGE, || async {
        let leases = member_leases(client).await?;
        let serving = leases.iter().filter(|l| !l.2 && !l.1.is_empty()).count();
        Ok((serving == 3).then_some(()))
    })
    .await?;
    let wrs: Api<wasmop::crd::WasmReconciler> = Api::all(client.clone());
    let since = wrs
        .get(WR)
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let sha = wasmop::engine::sha256_hex(&big);
    let cm = wasmop::modules::source::to_config_map(WR, MODULE_NS, &big, "test", "0", &sha)?;
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), MODULE_NS)
        .patch(WR, &apply_params(), &Patch::Apply(&cm))
        .await?;
    let series = format!("wasmop_module_info{{reconciler=\"{WR}\",sha256=\"{sha}\"}}");
    eventually(
        "the two healthy replicas serve the new module, the capped one withdrew",
        CONVERGE,
        || async {
            for h in healthy {
                anyhow::ensure!(
                    sample(h, &series).await? == 1.0,
                    "a replica does not serve {sha}"
                );
            }
            let leases = member_leases(client).await?;
            let capped = leases.iter().find(|l| l.0.starts_with("zzzz-capped"));
            anyhow::ensure!(
                capped.is_some_and(|l| l.2 && l.1.is_empty()),
                "leases {leases:?}"
            );
            let active = wrs.get(WR).await?.status.and_then(|s| s.active_module);
            anyhow::ensure!(
                active.is_some_and(|a| a.sha256 == sha),
                "the status records another module"
            );
            Ok(Some(()))
        },
    )
    .await?;
    bump(client, 7).await?;
    converged(client, "300 Widgets reconciled after the group swapped").await?;
    let (seen, flips) = flips_since(client, &since).await?;
    anyhow::ensure!(flips.is_empty(), "the status flipped: {flips:?}");
    eprintln!("[sharding] group swap: {seen} status changes, no flip; the capped replica withdrew");
    drop(capped);
    Ok(())
}

/// Reliability item 7, rollbacks: a new module that fails on every primary of one replica and
/// on none of the other's is rolled back by the first, and the second follows that decision
/// (it serves the good module again) instead of serving the rejected one.
async fn group_rollback(client: &Client, healthy: &[HostProcess; 2]) -> anyhow::Result<()> {
    let good =
        wasmop::engine::sha256_hex(&wasmop_test_modules::bytes(wasmop_test_modules::MISBEHAVE));
    // The self-check samples the first namespace: it stays well-behaved, so that both
    // replicas swap and the failures show in the rollout of one of them only.
    let first = namespaces()[0].clone();
    let first_hash = wasmop::sharding::hash::fnv1a64(&first);
    let leases = member_leases(client).await?;
    let (_, fragile_ranges, _) = leases
        .iter()
        .find(|(_, held, withdrawn)| !withdrawn && !held.is_empty() && !held.contains(first_hash))
        .ok_or_else(|| anyhow::anyhow!("no serving replica without {first}: {leases:?}"))?;
    let fragile: Vec<String> = namespaces()
        .into_iter()
        .filter(|ns| fragile_ranges.contains(wasmop::sharding::hash::fnv1a64(ns)))
        .collect();
    for ns in &fragile {
        for i in 0..PER_NAMESPACE {
            widgets(client, ns)
                .patch(
                    &format!("w-{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"labels": {"test.wasmop.dev/fragile": "true"}}}),
                    ),
                )
                .await?;
        }
    }
    let bad = push_module(
        client,
        MODULE_NS,
        WR,
        wasmop_test_modules::MISBEHAVE_FRAGILE,
    )
    .await?;
    let wrs: Api<wasmop::crd::WasmReconciler> = Api::all(client.clone());
    eventually(
        "the fragile module rolled back by one replica",
        CONVERGE,
        || async {
            let status = wrs.get(WR).await?.status.unwrap_or_default();
            Ok((status.rejected_sha256.as_deref() == Some(bad.as_str())).then_some(()))
        },
    )
    .await?;
    let series = format!("wasmop_module_info{{reconciler=\"{WR}\",sha256=\"{good}\"}}");
    eventually(
        "both serving replicas serve the good module again",
        CONVERGE,
        || async {
            for h in healthy {
                anyhow::ensure!(
                    sample(h, &series).await? == 1.0,
                    "a replica does not serve {good}"
                );
            }
            Ok(Some(()))
        },
    )
    .await?;
    eprintln!(
        "[sharding] rollback: {} fragile namespaces; both replicas serve the good module again",
        fragile.len()
    );
    Ok(())
}

/// A shared turn of the e2e process, and one scenario of this file at a time (each runs four
/// hosts and a control plane of its own).
async fn scenario_turn() -> (
    wasmop_testenv::turns::TurnGuard,
    tokio::sync::MutexGuard<'static, ()>,
) {
    static SCENARIO: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let scenario = SCENARIO.lock().await;
    let turn = wasmop_testenv::turns::take(wasmop_testenv::Turn::Shared).await;
    (turn, scenario)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_cannot_set_the_reconciler_up_withdraws_its_share() -> anyhow::Result<()> {
    let _turn = scenario_turn().await;
    let cp = ControlPlane::start(Options::default()).await?;
    let result = withdrawal(&cp).await;
    if result.is_err() {
        cp.keep();
        eprintln!(
            "[sharding] failed; control-plane logs are kept in {}, the replicas' logs in {}",
            cp.log_dir().display(),
            replica_logs(&cp).display(),
        );
    }
    result
}

async fn scenario(gate: bool) -> anyhow::Result<()> {
    let _turn = scenario_turn().await;
    let cp = ControlPlane::start(Options {
        feature_gates: if gate {
            vec!["ShardedListAndWatch".to_string()]
        } else {
            Vec::new()
        },
        ..Options::default()
    })
    .await?;
    let result = run(&cp, gate).await;
    if result.is_err() {
        cp.keep();
        eprintln!(
            "[sharding] failed; control-plane logs are kept in {}, the replicas' logs in {}\n{}",
            cp.log_dir().display(),
            replica_logs(&cp).display(),
            cp.log_tails(20)
        );
    }
    result
}

/// Where the replicas log: in the cluster's directory, kept with its logs when the scenario
/// fails.
fn replica_logs(cp: &ControlPlane) -> PathBuf {
    cp.dir().join("replicas")
}

async fn run(cp: &ControlPlane, gate: bool) -> anyhow::Result<()> {
    let client = cp.client().await?;
    let dirs: Vec<PathBuf> = (0..4)
        .map(|i| replica_logs(cp).join(format!("replica-{i}")))
        .collect();
    register(&client).await?;

    // Three replicas find each other before there is work, so each Widget has one owner.
    let mut hosts = Vec::new();
    for dir in &dirs[..3] {
        hosts.push(replica(cp, dir).await?);
    }
    let shares = balanced(&client, &hosts.iter().collect::<Vec<_>>()).await?;
    eprintln!("[sharding] shares of 3 replicas: {shares:?}");

    for ns in namespaces() {
        let api = widgets(&client, &ns);
        for i in 0..PER_NAMESPACE {
            api.create(&PostParams::default(), &widget(&ns, &format!("w-{i}"))?)
                .await?;
        }
    }
    let started = now_ms();
    async {
        converged(&client, "300 Widgets reconciled by 3 replicas").await?;
        let children_made = now_ms();
        eprintln!("[sharding] 3 replicas converged {TOTAL} Widgets in {} ms", now_ms() - started);
        let counts = partitioned(&hosts.iter().collect::<Vec<_>>()).await?;
        eprintln!("[sharding] primaries per replica: {counts:?}");
        let mode = if gate { "server" } else { "client" };
        for h in &hosts {
            let series = format!(
                "wasmop_shard_watch_filter{{kind=\"test.wasmop.dev/v1/Widget\",mode=\"{mode}\"}}"
            );
            anyhow::ensure!(sample(h, &series).await? == 1.0, "{series} on every replica");
        }
        let before = records(&dirs);
        anyhow::ensure!(before.len() == TOTAL, "every Widget has reconcile records: {}", before.len());
        for (primary, rs) in &before {
            let mut replicas: Vec<usize> = rs.iter().map(|r| r.replica).collect();
            replicas.dedup();
            anyhow::ensure!(replicas.len() == 1, "{primary} reconciled by one replica: {rs:?}");
        }
        let reconciles: Vec<usize> = (0..3)
            .map(|i| before.values().flatten().filter(|r| r.replica == i).count())
            .collect();
        eprintln!("[sharding] reconciles per replica: {reconciles:?}");

        // A crash: the survivors take the dead replica's ranges once its Lease expired.
        let victims: Vec<String> = before
            .iter()
            .filter(|(_, rs)| rs.iter().all(|r| r.replica == 2))
            .map(|(p, _)| p.clone())
            .collect();
        hosts[2].kill().await?;
        let killed = now_ms();
        bump(&client, 1).await?;
        converged(&client, "300 Widgets reconciled after a SIGKILL").await?;
        // Every victim's first reconcile by a survivor, once the survivors' logs hold one for
        // each (a record is written after its reconcile; read once, a late one would be
        // missing and its Widget left out of the maximum).
        let takeover = eventually("a survivor's record for every Widget of the killed replica", WAIT, || async {
            let after = records(&dirs);
            let firsts: Option<Vec<u64>> = victims
                .iter()
                .map(|p| {
                    after
                        .get(p)
                        .into_iter()
                        .flatten()
                        .filter(|r| r.replica != 2 && r.started >= killed)
                        .map(|r| r.started)
                        .min()
                })
                .collect();
            Ok(firsts.map(|f| f.into_iter().max().map(|t| t.saturating_sub(killed))))
        })
        .await?;
        eprintln!(
            "[sharding] the {} Widgets of the killed replica were taken over; the last one {takeover:?} ms after the kill (lease {LEASE:?})",
            victims.len()
        );
        // The survivors reconcile what they gained as soon as their caches listed it.
        let bound = (LEASE + RETRY + Duration::from_secs(90)).as_millis() as u64;
        anyhow::ensure!(
            takeover.is_some_and(|t| t <= bound),
            "every Widget of the killed replica reconciled by a survivor within {bound} ms, got {takeover:?}"
        );
        let survivors = [&hosts[0], &hosts[1]];
        balanced(&client, &survivors).await?;
        partitioned(&survivors).await?;

        // A fourth replica joins: it takes its share; nothing is lost, and the two others,
        // which only give ranges up, reconcile nothing meanwhile.
        let joined = now_ms();
        let fourth = replica(cp, &dirs[3]).await?;
        let live = [&hosts[0], &hosts[1], &fourth];
        let shares = balanced(&client, &live).await?;
        eprintln!("[sharding] shares after the fourth joined: {shares:?}");
        partitioned(&live).await?;
        let fourth_listed = eventually("the fourth replica reconciled what it gained", CONVERGE, || async {
            let n = reconciles_between(&records(&dirs), &[3], (joined, u64::MAX));
            Ok((n > 0).then_some(n))
        })
        .await?;
        let settled = now_ms();
        assert_children_listed(&records(&dirs), children_made)?;
        bump(&client, 2).await?;
        converged(&client, "300 Widgets reconciled after a fourth replica joined").await?;
        let counts = partitioned(&live).await?;
        eprintln!("[sharding] primaries per replica after the join: {counts:?}");
        let gained = sample(&fourth, "wasmop_shard_handovers_total{direction=\"gained\"}").await?;
        anyhow::ensure!(gained >= 1.0, "the fourth replica gained ranges");
        let all = records(&dirs);
        // Counted from the logs read after the bump converged, not at `settled`: a record of a
        // reconcile started in the window may be written after it.
        let kept = reconciles_between(&all, &[0, 1], (joined, settled));
        eprintln!("[sharding] while the fourth joined: {fourth_listed}+ reconciles by it, {kept} by the two others");
        anyhow::ensure!(
            kept == 0,
            "the replicas that only gave ranges up reconciled {kept} primaries while the fourth joined"
        );
        assert_held_reconciled_once(&all, &before, (killed, joined))?;
        assert_exclusive(&all)?;
        assert_children_listed(&all, children_made)?;
        let fourth_reconciles = all.values().flatten().filter(|r| r.replica == 3).count();
        anyhow::ensure!(fourth_reconciles > 0, "the fourth replica reconciles its share");
        Ok::<_, anyhow::Error>(())
    }
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_primaries_with_the_server_filtering() -> anyhow::Result<()> {
    scenario(true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_primaries_filtering_on_the_client() -> anyhow::Result<()> {
    scenario(false).await
}
