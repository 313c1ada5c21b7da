//! The author's day (issue 17), end to end on the real local control plane.
//!
//! - `wasmop new`: a generated project builds for wasm32-wasip2, passes `wasmop test` against
//!   its own golden file out of the box, and its `k8s/` files (CRD, RBAC, WasmReconciler) are
//!   enough for the host to reconcile the fixture's object on the cluster (the host impersonates
//!   the generated ServiceAccount, so this proves the generated RBAC too).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use serde_json::{Value, json};
use support::*;
use wasmop::cli::Cli;
use wasmop_testenv::{TestEnv, eventually};

/// Runs a `wasmop` command line in this process, as the binary would.
async fn wasmop(args: &[&str]) -> anyhow::Result<()> {
    let cli = Cli::try_parse_from(std::iter::once("wasmop").chain(args.iter().copied()))?;
    let code = wasmop::cli::run(cli)
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
        if key.starts_with("CARGO_") && key != "CARGO_HOME" || key == "RUSTFLAGS" {
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
    Ok(())
}
