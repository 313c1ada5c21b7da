//! The sandbox under attack and overload, on the real local control plane: a flood of
//! endless-loop reconciles of one WasmReconciler cannot make another one fail.

use crate::support::*;
use kube::api::{DynamicObject, PostParams};
use serde_json::json;
use wasmop::host::{Host, HostOptions};
use wasmop_testenv::{TestEnv, eventually};

/// The value of a metric series in the host's registry (0 when the series does not exist).
fn metric(name: &str, reconciler: &str) -> anyhow::Result<f64> {
    let text = wasmop::operations::metrics::encode()?;
    let prefix = format!("{name}{{reconciler=\"{reconciler}\"");
    Ok(text
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

fn widget(name: &str) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
        "metadata": {"name": name},
        "spec": {}
    }))?)
}

fn app(name: &str) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App",
        "metadata": {"name": name},
        "spec": {"image": "nginx:1.27", "replicas": 1, "port": 8080}
    }))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_reconcilers_endless_loops_cannot_make_another_reconciler_fail() -> anyhow::Result<()> {
    const SLOTS: u32 = 4;
    const LOOPING: usize = 300;
    const GOOD: usize = 10;
    let env = TestEnv::get("sandbox-fair").await?;
    // A: every reconcile is an endless loop stopped at its 1 s deadline, 32 at a time: eight
    // times the host's sandbox slots.
    let (looper, _) = widget_reconciler(
        &env,
        "looper",
        wasmop_test_modules::MISBEHAVE,
        json!({
            "config": {"mode": "loop"},
            "limits": {"deadline": "1s", "memory": "64Mi", "concurrency": 32},
        }),
    )
    .await?;
    // B: a good module whose deadline leaves room to wait for a slot.
    let (good, _) = image_updater(
        &env,
        "good",
        wasmop_test_modules::IMAGE_UPDATER,
        false,
        json!({"limits": {"deadline": "10s", "memory": "64Mi", "concurrency": 4}}),
    )
    .await?;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let host = Host::start(HostOptions {
        kubeconfig: Some(env.kubeconfig().to_path_buf()),
        selector: Some(format!("wasmop.dev/test={}", env.namespace)),
        instance: format!("e2e-{}", env.namespace),
        max_module_calls: SLOTS,
        ..HostOptions::default()
    })
    .await?;
    for wr in [&looper, &good] {
        wait_wr_ready(&env.client, wr).await?;
    }

    let widgets = widgets(&env.client, &env.namespace);
    for i in 0..LOOPING {
        widgets
            .create(&PostParams::default(), &widget(&format!("loop-{i}"))?)
            .await?;
    }
    // The flood is on: A's calls hold every slot and time out.
    eventually(
        "A's endless loops are stopped at their deadline",
        WAIT,
        || async {
            Ok(
                (metric("wasmop_reconcile_errors_total", &looper)? >= f64::from(2 * SLOTS))
                    .then_some(()),
            )
        },
    )
    .await?;

    let apps = apps(&env.client, &env.namespace);
    for i in 0..GOOD {
        apps.create(&PostParams::default(), &app(&format!("good-{i}"))?)
            .await?;
    }
    for i in 0..GOOD {
        let name = format!("good-{i}");
        eventually(&format!("App {name} reconciled"), WAIT, || async {
            let a = apps.get(&name).await?;
            Ok((a.data["status"]["image"] == json!("nginx:1.27")).then_some(()))
        })
        .await?;
    }
    // B was reconciled while A kept every slot busy, and never failed: no call of B found the
    // sandbox pool full or timed out waiting for it.
    assert!(metric("wasmop_reconcile_total", &good)? >= GOOD as f64);
    assert_eq!(metric("wasmop_reconcile_errors_total", &good)?, 0.0);
    // A never succeeds, and was still flooding when B was done: its first pass alone is 300
    // one-second calls on 4 slots, at least 75 s.
    assert_eq!(
        metric("wasmop_reconcile_total", &format!("{looper}\",result=\"ok"))?,
        0.0
    );
    host.shutdown().await?;
    env.passed()
}
