//! The author's day (issue 17), end to end on the real local control plane.
//!
//! - `wasmop new`: a generated project builds for wasm32-wasip2, passes `wasmop test` against
//!   its own golden file out of the box, and its `k8s/` files (CRD, RBAC, WasmReconciler) are
//!   enough for the host to reconcile the fixture's object on the cluster (the host impersonates
//!   the generated ServiceAccount, so this proves the generated RBAC too).
//! - `wasmop new --lang python`: a generated Python project passes its pytest, builds its
//!   component with the pinned componentize-py (`build.sh`) and passes `wasmop test` against its
//!   own golden file, out of the box.
//! - Record and replay: a host with `record_failures` (what `wasmop run --record-failures`
//!   sets) writes the request of every failed reconcile, names the file in the Warning Event,
//!   keeps at most the bounded count, and `wasmop test --request` replays the failure offline.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;
use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use serde_json::{Value, json};
use wasmop::cli::Cli;
use wasmop::cli::kubeconfig::Connection;
use wasmop_testenv::{TestEnv, eventually};

/// Runs a `wasmop` command line in this process, as the binary would.
async fn wasmop(args: &[&str]) -> anyhow::Result<()> {
    let cli = Cli::try_parse_from(std::iter::once("wasmop").chain(args.iter().copied()))?;
    let code = wasmop::cli::run(cli, wasmop::cli::plugin::Invocation::Wasmop)
        .await
        .map_err(|e| anyhow::anyhow!("wasmop {}: {e}", args.join(" ")))?;
    anyhow::ensure!(
        code == std::process::ExitCode::SUCCESS,
        "wasmop {} exited with {code:?}",
        args.join(" ")
    );
    Ok(())
}

/// Builds a generated project for wasm32-wasip2 (release) and returns its module.
///
/// The project's dependencies resolve to the workspace's lock file (copied in) and build
/// offline into `target/new-project`, which later runs reuse. The nested cargo gets none of this
/// test's cargo environment.
fn build_project(dir: &Path, krate: &str) -> anyhow::Result<PathBuf> {
    std::fs::copy(repo().join("Cargo.lock"), dir.join("Cargo.lock"))?;
    let target = repo().join("target").join("new-project");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(dir)
        .args([
            "build",
            "--release",
            "--offline",
            "--target",
            "wasm32-wasip2",
        ])
        .arg("--target-dir")
        .arg(&target);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().to_string();
        // Nor `make test`'s clippy wrapper (scripts/test-run.sh): the project builds as its
        // README says, with plain rustc.
        if key.starts_with("CARGO_") && key != "CARGO_HOME"
            || matches!(
                key.as_str(),
                "RUSTFLAGS" | "RUSTC_WORKSPACE_WRAPPER" | "CLIPPY_ARGS"
            )
        {
            cmd.env_remove(key);
        }
    }
    let out = cmd.output()?;
    anyhow::ensure!(
        out.status.success(),
        "building the generated project in {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let module = target
        .join("wasm32-wasip2")
        .join("release")
        .join(format!("{krate}.wasm"));
    anyhow::ensure!(module.is_file(), "{} was not built", module.display());
    Ok(module)
}

/// Server-side applies any object, finding its resource by discovery.
async fn apply_any(env: &TestEnv, discovery: &Discovery, doc: &Value) -> anyhow::Result<()> {
    let obj: DynamicObject = serde_json::from_value(doc.clone())?;
    let types = obj
        .types
        .clone()
        .ok_or_else(|| anyhow::anyhow!("an object without apiVersion/kind: {doc}"))?;
    let gvk = GroupVersionKind::try_from(&types)?;
    let (ar, caps) = discovery
        .resolve_gvk(&gvk)
        .ok_or_else(|| anyhow::anyhow!("the cluster does not serve {gvk:?}"))?;
    let api: Api<DynamicObject> = match (caps.scope, obj.metadata.namespace.as_deref()) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(env.client.clone(), ns, &ar),
        (Scope::Namespaced, None) => Api::namespaced_with(env.client.clone(), &env.namespace, &ar),
        (Scope::Cluster, _) => Api::all_with(env.client.clone(), &ar),
    };
    let name = obj.metadata.name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply("wasmop-e2e").force(),
        &Patch::Apply(doc),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn new_project_builds_passes_its_golden_test_and_reconciles_on_the_cluster()
-> anyhow::Result<()> {
    let env = TestEnv::get("author-new").await?;
    let ns = env.namespace.clone();
    let work = tempfile::tempdir()?;
    let dir = work.path().join("hello-op");
    let sdk = repo().join("guest-sdk");
    let (dir_s, sdk_s) = (dir.display().to_string(), sdk.display().to_string());

    // Generate: with the module's namespace set to the test's.
    wasmop(&[
        "new",
        "hello-op",
        "--dir",
        &dir_s,
        "--sdk-path",
        &sdk_s,
        "--namespace",
        &ns,
    ])
    .await?;
    for file in [
        "Cargo.toml",
        "README.md",
        "src/lib.rs",
        "fixtures/cr.yaml",
        "fixtures/expected.yaml",
        "k8s/crd.yaml",
        "k8s/rbac.yaml",
        "k8s/wasmreconciler.yaml",
    ] {
        anyhow::ensure!(dir.join(file).is_file(), "wasmop new wrote no {file}");
    }
    // A second `new` into the same directory is refused and overwrites nothing.
    let again = wasmop(&["new", "hello-op", "--dir", &dir_s]).await;
    anyhow::ensure!(
        again
            .as_ref()
            .is_err_and(|e| e.to_string().contains("not empty")),
        "a second wasmop new into {dir_s} was not refused: {again:?}"
    );

    // Build, then test against the project's own golden file, out of the box.
    let module = build_project(&dir, "hello_op")?;
    let module_s = module.display().to_string();
    let (cr, expected) = (
        dir.join("fixtures/cr.yaml"),
        dir.join("fixtures/expected.yaml"),
    );
    wasmop(&[
        "test",
        &module_s,
        "--reconciler",
        "hello-op",
        "--object",
        &cr.display().to_string(),
        "--expect",
        &expected.display().to_string(),
    ])
    .await?;

    // The generated k8s/ files on the cluster: CRD, RBAC (the Namespace is the test's), the
    // module, and the WasmReconciler, named and labelled for this test's host.
    apply_crds(&env.client, yaml_docs(&dir.join("k8s/crd.yaml"))?).await?;
    install_crds(&env.client).await?;
    let discovery = Discovery::new(env.client.clone()).run().await?;
    for doc in yaml_docs(&dir.join("k8s/rbac.yaml"))? {
        if doc["kind"] != "Namespace" {
            apply_any(&env, &discovery, &doc).await?;
        }
    }
    let bytes = std::fs::read(&module)?;
    let sha = wasmop::engine::sha256_hex(&bytes);
    let cm = wasmop::modules::source::to_config_map("hello-op", &ns, &bytes, "e2e", "0", &sha)?;
    Api::<ConfigMap>::namespaced(env.client.clone(), &ns)
        .patch(
            "hello-op",
            &PatchParams::apply("wasmop-e2e").force(),
            &Patch::Apply(&cm),
        )
        .await?;
    let mut wr = yaml_docs(&dir.join("k8s/wasmreconciler.yaml"))?.remove(0);
    wr["metadata"] = json!({"name": format!("{ns}-hello-op"), "labels": {"wasmop.dev/test": ns}});
    wr["spec"]["namespaces"] = json!([ns]);
    apply_reconciler(&env.client, &wr).await?;
    let _host = start_host(&env, None).await?;

    // The fixture's object, in the test's namespace, becomes its ConfigMap and is Ready.
    let mut object = yaml_docs(&cr)?.remove(0);
    if let Some(meta) = object["metadata"].as_object_mut() {
        meta.remove("uid");
        meta.remove("generation");
        meta.insert("namespace".into(), json!(ns));
    }
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "HelloOp"),
        "helloops",
    );
    let primaries: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &ns, &ar);
    primaries
        .patch(
            "hello",
            &PatchParams::apply("wasmop-e2e"),
            &Patch::Apply(&object),
        )
        .await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &ns);
    eventually("the generated module's ConfigMap", WAIT, || {
        let config_maps = config_maps.clone();
        async move {
            Ok(config_maps.get_opt("hello").await?.and_then(|cm| {
                let message = cm.data?.get("message")?.clone();
                (message == "hello, world").then_some(())
            }))
        }
    })
    .await?;
    eventually("the HelloOp's Ready condition", WAIT, || {
        let primaries = primaries.clone();
        async move {
            let p = primaries.get("hello").await?;
            let ready = p.data["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            let status_ok = p.data["status"]["configMap"] == "hello";
            Ok((ready && status_ok).then_some(()))
        }
    })
    .await?;
    env.passed()
}

/// The Warning Events of object `name` in `ns` whose note names a recording.
async fn recorded_in(env: &TestEnv, name: &str) -> anyhow::Result<Option<PathBuf>> {
    let all = events(&env.client, &env.namespace, "ModulePanicked").await?;
    Ok(all
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|e| e.note)
        .find_map(|note| {
            note.split("; request recorded in ")
                .nth(1)
                .map(|p| PathBuf::from(p.trim()))
        }))
}

#[tokio::test]
async fn a_failed_reconcile_is_recorded_bounded_and_replays_offline() -> anyhow::Result<()> {
    let env = TestEnv::get("author-record").await?;
    let (_wr, _sha) =
        widget_reconciler(&env, "misbehave", wasmop_test_modules::MISBEHAVE, json!({})).await?;
    let dir = tempfile::tempdir()?;
    let record_dir = dir.path().join("failures");
    let host = start_host_with(&env, |o| {
        o.record_failures = Some(wasmop::controller::record::RecordOptions {
            dir: record_dir.clone(),
            max_files: 2,
            max_bytes: 1 << 20,
            secrets: false,
        });
    })
    .await?;
    let widgets = widgets(&env.client, &env.namespace);
    for (name, mode) in [("bad-a", "panic"), ("bad-b", "panic"), ("bad-c", "panic")] {
        let w: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
            "metadata": {"name": name}, "spec": {"mode": mode}
        }))?;
        widgets
            .patch(name, &PatchParams::apply("wasmop-e2e"), &Patch::Apply(&w))
            .await?;
    }
    // The Warning Event names the file.
    let file = eventually("a Warning Event naming the recording", WAIT, || {
        let env = &env;
        async move { recorded_in(env, "bad-c").await }
    })
    .await?;
    anyhow::ensure!(
        file.starts_with(&record_dir),
        "the recording {} is outside {}",
        file.display(),
        record_dir.display()
    );
    // Bounded: three objects keep failing (and retrying), at most two files stay.
    eventually("recordings of every object", WAIT, || {
        let env = &env;
        async move {
            let a = recorded_in(env, "bad-a").await?;
            let b = recorded_in(env, "bad-b").await?;
            Ok(a.zip(b).map(|_| ()))
        }
    })
    .await?;
    // The host stops, so that no retry rotates the files while they are read.
    host.shutdown().await?;
    let count = std::fs::read_dir(&record_dir)?.count();
    anyhow::ensure!(count <= 2, "{count} recordings in a directory bounded to 2");

    // Replay the newest recording offline: the same failure, from the same request.
    let newest = std::fs::read_dir(&record_dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .max()
        .ok_or_else(|| anyhow::anyhow!("no recording left in {}", record_dir.display()))?;
    let recorded = wasmop::controller::record::RecordedRequest::read(&newest)?;
    anyhow::ensure!(
        recorded.error.contains("deliberate panic"),
        "the recording's error: {}",
        recorded.error
    );
    anyhow::ensure!(recorded.primary["spec"]["mode"] == "panic");
    let replay = wasmop(&[
        "test",
        wasmop_test_modules::MISBEHAVE,
        "--request",
        &newest.display().to_string(),
    ])
    .await;
    anyhow::ensure!(
        replay
            .as_ref()
            .is_err_and(|e| e.to_string().contains("deliberate panic")),
        "replaying {} did not reproduce the panic: {replay:?}",
        newest.display()
    );
    // A recording is a fixture like any other: edited (the primary back to the good mode), it
    // replays to a success.
    let text = std::fs::read_to_string(&newest)?.replace("mode: panic", "mode: good");
    let edited = dir.path().join("edited.yaml");
    std::fs::write(&edited, text)?;
    wasmop(&[
        "test",
        wasmop_test_modules::MISBEHAVE,
        "--request",
        &edited.display().to_string(),
    ])
    .await?;
    env.passed()
}

/// Writes a kubeconfig with two contexts: `elsewhere` (current, an address nothing listens
/// on) and `plane` (the test plane's cluster and user, namespace `ns`).
fn two_context_kubeconfig(env: &TestEnv, ns: &str, path: &std::path::Path) -> anyhow::Result<()> {
    use kube::config::{Cluster, Context, Kubeconfig, NamedCluster, NamedContext};
    let mut config = Kubeconfig::read_from(env.kubeconfig())?;
    let current = config.current_context.clone().unwrap_or_default();
    let mut plane = config
        .contexts
        .iter()
        .find(|c| c.name == current)
        .and_then(|c| c.context.clone())
        .ok_or_else(|| anyhow::anyhow!("the plane's kubeconfig has no current context"))?;
    plane.namespace = Some(ns.to_string());
    config.clusters.push(NamedCluster {
        name: "nowhere".into(),
        cluster: Some(Cluster {
            server: Some("https://127.0.0.1:1".into()),
            ..Cluster::default()
        }),
        ..NamedCluster::default()
    });
    config.contexts = vec![
        NamedContext {
            name: "elsewhere".into(),
            context: Some(Context {
                cluster: "nowhere".into(),
                user: plane.user.clone(),
                ..Context::default()
            }),
            ..NamedContext::default()
        },
        NamedContext {
            name: "plane".into(),
            context: Some(plane),
            ..NamedContext::default()
        },
    ];
    config.current_context = Some("elsewhere".into());
    std::fs::write(path, serde_json::to_vec(&config)?)?;
    Ok(())
}

#[tokio::test]
async fn capture_from_the_cluster_writes_what_the_host_hands_over_and_tests_it()
-> anyhow::Result<()> {
    let env = TestEnv::get("author-capture").await?;
    let ns = env.namespace.clone();
    let (wr, _sha) =
        widget_reconciler(&env, "misbehave", wasmop_test_modules::MISBEHAVE, json!({})).await?;
    let _host = start_host(&env, None).await?;
    let w: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
        "metadata": {"name": "cap"}, "spec": {"mode": "good"}
    }))?;
    widgets(&env.client, &ns)
        .patch("cap", &PatchParams::apply("wasmop-e2e"), &Patch::Apply(&w))
        .await?;
    // A ConfigMap the Widget does not control: the host would not hand it over.
    let stranger: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "stranger", "namespace": ns}
    }))?;
    let config_maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &ns);
    config_maps
        .patch(
            "stranger",
            &PatchParams::apply("wasmop-e2e"),
            &Patch::Apply(&stranger),
        )
        .await?;
    eventually("the Widget's child", WAIT, || {
        let config_maps = config_maps.clone();
        async move { Ok(config_maps.get_opt("cap-out").await?.map(|_| ())) }
    })
    .await?;

    let work = tempfile::tempdir()?;
    let out = work.path().join("cap");
    let golden = work.path().join("expected.yaml");
    // kubectl's conventions: a kubeconfig whose current context is elsewhere; `--context`
    // picks the plane's, and `Widget/cap` is in that context's namespace.
    let kubeconfig = work.path().join("kubeconfig");
    two_context_kubeconfig(&env, &ns, &kubeconfig)?;
    let kubeconfig = kubeconfig.display().to_string();
    wasmop(&[
        "test",
        wasmop_test_modules::MISBEHAVE,
        "--from-cluster",
        "Widget/cap",
        "--reconciler",
        &wr,
        "--out",
        &out.display().to_string(),
        "--kubeconfig",
        &kubeconfig,
        "--context",
        "plane",
        "--expect",
        &golden.display().to_string(),
        "--update",
    ])
    .await?;
    let primary = yaml_docs(&out.join("cr.yaml"))?;
    let live = widgets(&env.client, &ns).get("cap").await?;
    anyhow::ensure!(
        primary.len() == 1 && primary[0]["metadata"]["uid"] == json!(live.metadata.uid),
        "cr.yaml is not the live Widget: {primary:?}"
    );
    let children = yaml_docs(&out.join("observed/configmap.yaml"))?;
    let names: Vec<&str> = children
        .iter()
        .filter_map(|c| c["metadata"]["name"].as_str())
        .collect();
    anyhow::ensure!(
        names == ["cap-out"],
        "the captured children are {names:?}, not the Widget's one child"
    );
    anyhow::ensure!(
        children[0]["kind"] == "ConfigMap",
        "a captured child has no kind"
    );
    // The fixture directory replays as any fixture: the same intents as the golden file.
    wasmop(&[
        "test",
        wasmop_test_modules::MISBEHAVE,
        "--reconciler",
        &wr,
        "--object",
        &out.join("cr.yaml").display().to_string(),
        "--observed",
        &out.join("observed/configmap.yaml").display().to_string(),
        "--expect",
        &golden.display().to_string(),
    ])
    .await?;
    let intents = std::fs::read_to_string(&golden)?;
    anyhow::ensure!(
        intents.contains("cap-out"),
        "the intents do not keep the child: {intents}"
    );
    env.passed()
}

#[tokio::test]
async fn diff_previews_a_candidate_against_every_primary_without_writing() -> anyhow::Result<()> {
    use wasmop::cli::diff::{Args, Outcome, preview};
    let env = TestEnv::get("author-diff").await?;
    let ns = env.namespace.clone();
    let (wr, _sha) =
        widget_reconciler(&env, "misbehave", wasmop_test_modules::MISBEHAVE, json!({})).await?;
    let host = start_host(&env, None).await?;
    let widgets = widgets(&env.client, &ns);
    for (name, mode) in [
        ("drifted", "good"),
        ("steady", "good"),
        ("refused", "undeclared"),
        ("broken", "panic"),
    ] {
        let w: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
            "metadata": {"name": name}, "spec": {"mode": mode}
        }))?;
        widgets
            .patch(name, &PatchParams::apply("wasmop-e2e"), &Patch::Apply(&w))
            .await?;
    }
    for name in ["drifted", "steady"] {
        eventually("a reconciled Widget", WAIT, || {
            let widgets = widgets.clone();
            async move {
                let w = widgets.get(name).await?;
                Ok((w.data["status"]["reconciled"] == true).then_some(()))
            }
        })
        .await?;
    }
    // The host stops (nothing corrects drift any more); then one child drifts.
    host.shutdown().await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &ns);
    config_maps
        .patch(
            "drifted-out",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"owner": "someone else"}})),
        )
        .await?;
    let before = config_maps.get("drifted-out").await?;

    let outcomes = preview(&Args {
        module: PathBuf::from(wasmop_test_modules::MISBEHAVE),
        reconciler: wr.clone(),
        connection: Connection {
            kubeconfig: Some(env.kubeconfig().to_path_buf()),
            ..Connection::default()
        },
        output: None,
        show_secrets: false,
    })
    .await?;
    let of = |name: &str| {
        outcomes
            .iter()
            .find(|(shown, _)| shown == &format!("Widget {ns}/{name}"))
            .map(|(_, o)| o.clone())
    };
    anyhow::ensure!(outcomes.len() == 4, "outcomes: {outcomes:?}");
    anyhow::ensure!(
        matches!(of("drifted"), Some(Outcome::Changed(c)) if c.iter().any(|c| c.contains("update ConfigMap") && c.contains("someone else"))),
        "drifted: {:?}",
        of("drifted")
    );
    anyhow::ensure!(
        of("steady") == Some(Outcome::Unchanged),
        "steady: {:?}",
        of("steady")
    );
    anyhow::ensure!(
        matches!(of("refused"), Some(Outcome::Refused(_))),
        "refused: {:?}",
        of("refused")
    );
    anyhow::ensure!(
        matches!(of("broken"), Some(Outcome::Failed(e)) if e.contains("deliberate panic")),
        "broken: {:?}",
        of("broken")
    );
    // Read-only: the drifted child is as it was (dry runs write nothing).
    let after = config_maps.get("drifted-out").await?;
    anyhow::ensure!(
        after.metadata.resource_version == before.metadata.resource_version,
        "wasmop diff wrote {}",
        "drifted-out"
    );
    // The dry runs write as the module's ServiceAccount, not as the caller (here an
    // administrator): once its Role is gone, what the host could not write is not a change.
    Api::<Role>::namespaced(env.client.clone(), &ns)
        .delete("misbehave", &Default::default())
        .await?;
    // (The API server's authorizer learns of the deletion from its own watch: asked again
    // until it has.)
    eventually("the dry run refused as the module", WAIT, || async {
        let outcomes = preview(&Args {
            module: PathBuf::from(wasmop_test_modules::MISBEHAVE),
            reconciler: wr.clone(),
            connection: Connection {
                kubeconfig: Some(env.kubeconfig().to_path_buf()),
                ..Connection::default()
            },
            output: None,
            show_secrets: false,
        })
        .await?;
        let drifted = outcomes
            .iter()
            .find(|(shown, _)| shown == &format!("Widget {ns}/drifted"))
            .map(|(_, o)| o.clone());
        Ok(
            matches!(&drifted, Some(Outcome::Failed(e)) if e.to_lowercase().contains("forbidden"))
                .then_some(()),
        )
    })
    .await?;
    env.passed()
}

/// Runs the generated Python project's `build.sh` with `args`, returning its output.
fn python_project(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("bash")
        .arg(dir.join("build.sh"))
        .args(args)
        .current_dir(dir)
        .output()?;
    output_of(
        &out,
        &format!("build.sh {} in {}", args.join(" "), dir.display()),
    )
}

#[tokio::test]
async fn new_python_project_passes_pytest_builds_and_passes_its_golden_test() -> anyhow::Result<()>
{
    let work = tempfile::tempdir()?;
    let dir = work.path().join("hello-py");
    let dir_s = dir.display().to_string();
    wasmop(&["new", "hello-py", "--lang", "python", "--dir", &dir_s]).await?;
    for file in [
        "hello_py.py",
        "build.sh",
        "requirements.txt",
        "pyproject.toml",
        "README.md",
        "tests/test_hello_py.py",
        "fixtures/cr.yaml",
        "fixtures/expected.yaml",
        "k8s/crd.yaml",
        "k8s/rbac.yaml",
        "k8s/wasmreconciler.yaml",
        "wit/reconciler.wit",
        "wasmop_sdk/__init__.py",
        "wasmop_sdk/_glue.py",
    ] {
        anyhow::ensure!(
            dir.join(file).is_file(),
            "wasmop new --lang python wrote no {file}"
        );
    }
    // The same pins as wasmop's own Python builds: the project shares their venv.
    assert_eq!(
        std::fs::read_to_string(dir.join("requirements.txt"))?,
        std::fs::read_to_string(repo().join("guest-sdk/python/requirements.txt"))?
    );
    // pytest (natively), then the component, out of the box.
    let pytest = python_project(&dir, &["test"])?;
    anyhow::ensure!(pytest.contains("1 passed"), "pytest: {pytest}");
    let started = std::time::Instant::now();
    python_project(&dir, &[])?;
    println!(
        "built the generated Python project in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let module = dir.join("build/hello_py.wasm");
    anyhow::ensure!(module.is_file(), "{} was not built", module.display());
    wasmop(&[
        "test",
        &module.display().to_string(),
        "--reconciler",
        "hello-py",
        "--object",
        &dir.join("fixtures/cr.yaml").display().to_string(),
        "--expect",
        &dir.join("fixtures/expected.yaml").display().to_string(),
    ])
    .await?;
    Ok(())
}

/// The quarantine markers in compiled-module cache `dir`.
fn markers(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "compiling"))
        .collect()
}

/// Ctrl-C during a command's compile: the command exits with 130 and leaves no quarantine
/// marker. Killed by the signal, it left its marker, counted as a compile that crashed: a
/// second Ctrl-C quarantined the module in the user's cache.
#[tokio::test]
async fn ctrl_c_during_a_compile_exits_and_leaves_no_quarantine_marker() -> anyhow::Result<()> {
    use nix::sys::signal::{Signal, kill};
    // A Python component: its compile takes seconds, long enough to be interrupted.
    let module = tenant_module(TenantBuild::First).await?;
    let bin = wasmop_binary().await?;
    // A compile is interrupted once its marker is seen (a fresh cache each try: a compile that
    // ended first left its module cached).
    for attempt in 1..=3 {
        let cache = tempfile::tempdir()?;
        let compiled = cache.path().join("compiled");
        let mut child = tokio::process::Command::new(bin)
            .arg("inspect")
            .arg(&module)
            .env("WASMOP_CACHE", cache.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let seen = loop {
            if !markers(&compiled).is_empty() {
                break true;
            }
            if child.try_wait()?.is_some() {
                break false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        };
        if !seen {
            println!("try {attempt}: the compile ended before its marker was seen");
            continue;
        }
        let pid = child.id().ok_or_else(|| anyhow::anyhow!("no pid"))?;
        kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid)?),
            Signal::SIGINT,
        )?;
        let out = tokio::time::timeout(WAIT, child.wait_with_output()).await??;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(130),
            "wasmop inspect interrupted: {:?}\n{stderr}",
            out.status
        );
        assert!(stderr.contains("wasmop: interrupted"), "{stderr}");
        assert_eq!(markers(&compiled), Vec::<PathBuf>::new(), "no marker left");
        return Ok(());
    }
    anyhow::bail!("in 3 tries, no compile of the Python module was seen under way")
}
