//! Modules from a real OCI registry (distribution, TLS, basic auth), end to end: a module pulled
//! by digest reconciles; re-pinning the digest hot-swaps; a wrong digest, wrong credentials and
//! a registry outage each give their condition while the old module keeps serving; a module
//! over the 1 MiB a ConfigMap holds loads from the registry.

mod support;

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::*;
use wasm_encoder::ComponentSection;
use wasmop::crd::{ActiveModule, WasmReconciler};
use wasmop::modules::oci;
use wasmop_testenv::{Registry, TestEnv, eventually};

/// Pushes `bytes` as `repository:tag` (as `wasmop push --oci` does); returns the manifest
/// digest.
async fn push(registry: &Registry, repo_tag: &str, bytes: Vec<u8>) -> anyhow::Result<String> {
    let access = oci::Access {
        auth: Some((registry.username.clone(), registry.password.clone())),
        ca_pem: Some(registry.ca_pem.clone()),
    };
    let reference = format!("{}/{repo_tag}", registry.host);
    Ok(oci::push(&reference, bytes, BTreeMap::new(), &access).await?)
}

/// Creates the pull Secret `name` with `password`.
async fn pull_secret(
    env: &TestEnv,
    registry: &Registry,
    name: &str,
    password: &str,
) -> anyhow::Result<()> {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/dockerconfigjson".into()),
        data: Some(BTreeMap::from([(
            ".dockerconfigjson".to_string(),
            ByteString(registry.docker_config_json(password).into_bytes()),
        )])),
        ..Default::default()
    };
    let api: Api<Secret> = env.api();
    api.patch(
        name,
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&secret),
    )
    .await?;
    Ok(())
}

/// The `spec.module` naming `reference` (by digest or by tag with `digest`).
fn oci_module(registry: &Registry, reference: &str, digest: Option<&str>, secret: &str) -> Value {
    let mut oci = json!({
        "reference": reference,
        "pullSecret": secret,
        "caBundle": registry.ca_pem,
    });
    if let Some(d) = digest {
        oci["digest"] = json!(d);
    }
    json!({"oci": oci})
}

/// Registers the image-updater reconciler `<ns>-<name>` with module `module` and starts a host
/// reading pull Secrets from the test's namespace; returns once the reconciler is Ready.
async fn register(
    env: &TestEnv,
    name: &str,
    module: Value,
) -> anyhow::Result<(String, wasmop::host::Host)> {
    install_crds(&env.client).await?;
    service_account(&env.client, &env.namespace, name, image_updater_rules(true)).await?;
    let wr = format!("{}-{name}", env.namespace);
    let mut spec = reconciler(
        env,
        &wr,
        "unused",
        ("example.wasmop.dev/v1", "App"),
        &[("apps/v1", "Deployment"), ("v1", "Service")],
        name,
        json!({}),
    );
    spec["spec"]["module"] = module;
    apply_reconciler(&env.client, &spec).await?;
    let ns = env.namespace.clone();
    let host = start_host_with(env, |o| o.oci.namespace = Some(ns)).await?;
    // Ready and the active module are written together, after the controller starts: a child
    // can exist before them.
    wait_wr_ready(&env.client, &wr).await?;
    Ok((wr, host))
}

async fn set_module(client: &Client, wr: &str, mut module: Value) -> anyhow::Result<()> {
    // A merge patch keeps fields it does not name: clear a digest the new module does not set.
    if module["oci"].get("digest").is_none() {
        module["oci"]["digest"] = Value::Null;
    }
    let api: Api<WasmReconciler> = Api::all(client.clone());
    api.patch(
        wr,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"module": module}})),
    )
    .await?;
    Ok(())
}

async fn active(client: &Client, wr: &str) -> anyhow::Result<Option<ActiveModule>> {
    let api: Api<WasmReconciler> = Api::all(client.clone());
    Ok(api.get(wr).await?.status.and_then(|s| s.active_module))
}

/// Creates App `name` and waits for its Deployment; returns whether the Deployment carries the
/// v2 build's revision annotation (which module reconciled it).
async fn app_served(env: &TestEnv, name: &str) -> anyhow::Result<bool> {
    let app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.wasmop.dev/v1", "kind": "App", "metadata": {"name": name},
        "spec": {"image": "nginx:1.27", "replicas": 1}
    }))?;
    apps(&env.client, &env.namespace)
        .create(&PostParams::default(), &app)
        .await?;
    let deployments: Api<Deployment> = env.api();
    let d = eventually(&format!("Deployment {name}"), WAIT, || async {
        Ok(deployments.get_opt(name).await?)
    })
    .await?;
    Ok(d.annotations()
        .contains_key("example.wasmop.dev/module-revision"))
}

/// Waits for ModuleLoaded=False with `reason`; returns its message.
async fn refused_with(client: &Client, wr: &str, reason: &str) -> anyhow::Result<String> {
    eventually(&format!("ModuleLoaded=False {reason}"), WAIT, || async {
        Ok(wr_condition(client, wr, "ModuleLoaded")
            .await?
            .filter(|(s, r, _)| s == "False" && r == reason)
            .map(|(_, _, m)| m))
    })
    .await
}

#[tokio::test]
async fn a_module_from_the_registry_reconciles_and_a_repinned_digest_hot_swaps()
-> anyhow::Result<()> {
    let env = TestEnv::get("oci-swap").await?;
    let registry = Registry::start().await?;
    let v1 = wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER);
    let v2 = wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER_V2);
    let (v1_sha, v2_sha) = (
        wasmop::engine::sha256_hex(&v1),
        wasmop::engine::sha256_hex(&v2),
    );
    let d1 = push(&registry, "mods/image-updater:v1", v1).await?;
    let d2 = push(&registry, "mods/image-updater:v2", v2).await?;
    pull_secret(&env, &registry, "registry", &registry.password).await?;
    let repo = format!("{}/mods/image-updater", registry.host);
    let (wr, _host) = register(
        &env,
        "iu",
        oci_module(&registry, &format!("{repo}@{d1}"), None, "registry"),
    )
    .await?;

    assert!(!app_served(&env, "first").await?, "v1 serves the first App");
    let a = active(&env.client, &wr).await?;
    assert_eq!(a.as_ref().map(|a| a.sha256.as_str()), Some(v1_sha.as_str()));
    assert_eq!(
        a.and_then(|a| a.origin),
        Some(format!("oci {repo}@{d1}")),
        "the status names where the module came from"
    );

    // Re-pinned by tag plus the digest it must resolve to: swapped in place.
    set_module(
        &env.client,
        &wr,
        oci_module(&registry, &format!("{repo}:v2"), Some(&d2), "registry"),
    )
    .await?;
    eventually("v2 active", WAIT, || async {
        Ok(active(&env.client, &wr)
            .await?
            .filter(|a| a.sha256 == v2_sha))
    })
    .await?;
    let swapped = cluster_events(&env.client, &wr).await?;
    assert!(
        swapped
            .iter()
            .any(|e| e.reason.as_deref() == Some("ModuleSwapped")),
        "a hot swap, not a restart: {swapped:?}"
    );
    assert!(app_served(&env, "second").await?, "v2 serves the next App");
    Ok(())
}

#[tokio::test]
async fn wrong_digest_wrong_credentials_and_an_outage_keep_the_old_module_serving()
-> anyhow::Result<()> {
    let env = TestEnv::get("oci-faults").await?;
    let mut registry = Registry::start().await?;
    let v1 = wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER);
    let v2 = wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER_V2);
    let v1_sha = wasmop::engine::sha256_hex(&v1);
    let v2_sha = wasmop::engine::sha256_hex(&v2);
    let d1 = push(&registry, "mods/iu:v1", v1).await?;
    let d2 = push(&registry, "mods/iu:v2", v2).await?;
    pull_secret(&env, &registry, "good", &registry.password).await?;
    pull_secret(&env, &registry, "bad", "not-the-password").await?;
    let repo = format!("{}/mods/iu", registry.host);
    let (wr, _host) = register(
        &env,
        "iu",
        oci_module(&registry, &format!("{repo}@{d1}"), None, "good"),
    )
    .await?;
    assert!(!app_served(&env, "before").await?);

    // The tag v2 does not resolve to the digest required.
    set_module(
        &env.client,
        &wr,
        oci_module(&registry, &format!("{repo}:v2"), Some(&d1), "good"),
    )
    .await?;
    let message = refused_with(&env.client, &wr, "DigestMismatch").await?;
    assert!(message.contains(&d1) && message.contains(&d2), "{message}");
    assert!(!app_served(&env, "after-digest").await?, "v1 keeps serving");

    // Wrong credentials.
    set_module(
        &env.client,
        &wr,
        oci_module(&registry, &format!("{repo}@{d2}"), None, "bad"),
    )
    .await?;
    let message = refused_with(&env.client, &wr, "RegistryUnauthorized").await?;
    assert!(message.contains(&registry.host), "{message}");
    assert!(
        !app_served(&env, "after-credentials").await?,
        "v1 keeps serving"
    );

    // The registry goes away; the right credentials cannot help until it is back.
    registry.stop();
    set_module(
        &env.client,
        &wr,
        oci_module(&registry, &format!("{repo}@{d2}"), None, "good"),
    )
    .await?;
    refused_with(&env.client, &wr, "RegistryUnreachable").await?;
    assert!(
        !app_served(&env, "during-outage").await?,
        "v1 keeps serving"
    );
    assert_eq!(
        active(&env.client, &wr).await?.map(|a| a.sha256),
        Some(v1_sha)
    );

    registry.restart().await?;
    eventually("v2 active once the registry is back", WAIT, || async {
        Ok(active(&env.client, &wr)
            .await?
            .filter(|a| a.sha256 == v2_sha))
    })
    .await?;
    assert!(app_served(&env, "after-outage").await?, "v2 serves");
    Ok(())
}

#[tokio::test]
async fn a_module_over_one_mib_loads_from_the_registry() -> anyhow::Result<()> {
    let env = TestEnv::get("oci-large").await?;
    let registry = Registry::start().await?;
    let mut bytes = wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER);
    // Pad the component with a custom section of incompressible bytes past 1 MiB.
    let padding: Vec<u8> = (0u32..(1 << 20) + 4096)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    wasm_encoder::CustomSection {
        name: "wasmop-test-padding".into(),
        data: padding.into(),
    }
    .append_to_component(&mut bytes);
    assert!(bytes.len() > 1 << 20);
    let sha = wasmop::engine::sha256_hex(&bytes);
    let d = push(&registry, "mods/large:v1", bytes).await?;
    pull_secret(&env, &registry, "registry", &registry.password).await?;
    let (wr, _host) = register(
        &env,
        "large",
        oci_module(
            &registry,
            &format!("{}/mods/large@{d}", registry.host),
            None,
            "registry",
        ),
    )
    .await?;
    assert!(!app_served(&env, "large").await?);
    eventually("the padded module recorded as active", WAIT, || async {
        Ok(active(&env.client, &wr).await?.filter(|a| a.sha256 == sha))
    })
    .await?;
    Ok(())
}
