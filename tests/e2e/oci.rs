//! Modules from a real OCI registry (distribution, TLS, basic auth), end to end: a module pulled
//! by digest reconciles; re-pinning the digest hot-swaps; a wrong digest, wrong credentials and
//! a registry outage each give their condition while the old module keeps serving; a module
//! over the 1 MiB a ConfigMap holds loads from the registry.

use std::collections::BTreeMap;

use crate::support::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
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
    // A hot swap, not a restart.
    wr_event(&env.client, &wr, "ModuleSwapped").await?;
    assert!(app_served(&env, "second").await?, "v2 serves the next App");
    env.passed()
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
    env.passed()
}

#[tokio::test]
async fn a_module_over_one_mib_loads_from_the_registry() -> anyhow::Result<()> {
    let env = TestEnv::get("oci-large").await?;
    let registry = Registry::start().await?;
    let mut bytes = wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER);
    // Pad the component with a custom section of incompressible bytes (xorshift64) past 1 MiB:
    // even gzipped, it does not fit the host's copy (a ConfigMap).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let padding: Vec<u8> = (0u32..(1 << 20) + 4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 56) as u8
        })
        .collect();
    wasm_encoder::CustomSection {
        name: "wasmop-test-padding".into(),
        data: padding.into(),
    }
    .append_to_component(&mut bytes);
    assert!(bytes.len() > 1 << 20);
    let sha = wasmop::engine::sha256_hex(&bytes);
    // Too large for the host's copy (a ConfigMap), decided by the code the host runs: read from
    // the status, an absent copy would prove nothing (it is written after the status).
    let at = wasmop::modules::copy::location("large", &env.namespace);
    assert!(
        matches!(
            wasmop::modules::copy::encode(&at, &bytes, &sha, "v1"),
            Err(wasmop::modules::copy::CopyError::TooLarge { .. })
        ),
        "the module fits the host's copy: this test needs one that does not"
    );
    let d = push(&registry, "mods/large:v1", bytes).await?;
    pull_secret(&env, &registry, "registry", &registry.password).await?;
    let (wr, host) = register(
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
    // Without a copy, a follower pulls it by its pinned digest to judge reviews, and admits
    // every valid one. (The leader stops first: hosts in one process share their serving
    // modules.)
    host.shutdown().await?;
    let ns = env.namespace.clone();
    let follower = follower(&env, |o| o.oci.namespace = Some(ns)).await?;
    let addr = follower
        .webhook_addr
        .ok_or_else(|| anyhow::anyhow!("the follower serves no webhook"))?;
    for i in 0..5 {
        let app: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.wasmop.dev/v1", "kind": "App",
            "metadata": {"name": format!("valid-{i}")},
            "spec": {"image": "nginx:1.27", "replicas": 1, "port": 8080}
        }))?;
        let response = follower_review(addr, &wr, &env.namespace, &app).await?;
        assert_eq!(
            response["response"]["allowed"],
            json!(true),
            "review {i}: the follower judges with the active module: {response}"
        );
        assert!(
            response["response"]["warnings"].is_null(),
            "review {i} was not validated: {response}"
        );
    }
    follower.shutdown().await?;
    env.passed()
}

// Signatures: cosign's key-based format, with the real cosign (v2.6.5, built from Go modules
// and cached like the registry) on the same registry, in both directions.

/// The password of every key cosign generates here.
const KEY_PASSWORD: &str = "e2e-key-password";

/// cosign against the test registry: its binary, a directory for keys, the registry's CA.
struct Cosign {
    bin: std::path::PathBuf,
    dir: tempfile::TempDir,
    ca: std::path::PathBuf,
    username: String,
    password: String,
}

impl Cosign {
    async fn new(registry: &Registry) -> anyhow::Result<Self> {
        let bin = tokio::task::spawn_blocking(wasmop_testenv::assets::cosign_binary).await??;
        let dir = tempfile::tempdir()?;
        let ca = dir.path().join("registry-ca.pem");
        std::fs::write(&ca, &registry.ca_pem)?;
        Ok(Cosign {
            bin,
            dir,
            ca,
            username: registry.username.clone(),
            password: registry.password.clone(),
        })
    }

    async fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = tokio::process::Command::new(&self.bin)
            .args(args)
            .env("COSIGN_PASSWORD", KEY_PASSWORD)
            .current_dir(self.dir.path())
            .output()
            .await?;
        output_of(&out, &format!("cosign {}", args.join(" ")))
    }

    /// A new key pair `name`: (private key file, public key PEM file).
    async fn key_pair(
        &self,
        name: &str,
    ) -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf)> {
        let prefix = self.dir.path().join(name);
        self.run(&[
            "generate-key-pair",
            "--output-key-prefix",
            &prefix.display().to_string(),
        ])
        .await?;
        Ok((prefix.with_extension("key"), prefix.with_extension("pub")))
    }

    fn registry_args(&self) -> Vec<String> {
        vec![
            format!("--registry-cacert={}", self.ca.display()),
            format!("--registry-username={}", self.username),
            format!("--registry-password={}", self.password),
        ]
    }

    /// `cosign sign --key` without a transparency log (the test machine has none).
    async fn sign(&self, key: &std::path::Path, reference: &str) -> anyhow::Result<()> {
        let key = key.display().to_string();
        let mut args = vec!["sign", "--yes", "--tlog-upload=false", "--key", &key];
        let registry = self.registry_args();
        args.extend(registry.iter().map(String::as_str));
        args.push(reference);
        self.run(&args).await.map(|_| ())
    }

    /// `cosign verify --key`, offline.
    async fn verify(&self, public: &std::path::Path, reference: &str) -> anyhow::Result<String> {
        let public = public.display().to_string();
        let mut args = vec![
            "verify",
            "--offline=true",
            "--insecure-ignore-tlog=true",
            "--key",
            &public,
        ];
        let registry = self.registry_args();
        args.extend(registry.iter().map(String::as_str));
        args.push(reference);
        self.run(&args).await
    }
}

/// `spec.module` naming `reference` pinned, with `verify`.
fn signed_module(registry: &Registry, reference: &str, verify: Value) -> Value {
    let mut module = oci_module(registry, reference, None, "registry");
    module["oci"]["verify"] = verify;
    module
}

/// The fingerprint the host names a public key by.
fn fingerprint(public: &std::path::Path) -> anyhow::Result<String> {
    let pem = std::fs::read_to_string(public)?;
    Ok(wasmop::modules::signature::TrustedKey::from_pem(&pem, "test")?.fingerprint)
}

/// Runs a `wasmop` command line in this process, as the binary would.
async fn wasmop_cli(args: &[&str]) -> anyhow::Result<()> {
    let cli = <wasmop::cli::Cli as clap::Parser>::try_parse_from(
        std::iter::once("wasmop").chain(args.iter().copied()),
    )?;
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

/// v2 of image-updater made distinct (another digest) by a custom section.
fn distinct(mut bytes: Vec<u8>, tag: &str) -> Vec<u8> {
    wasm_encoder::CustomSection {
        name: "wasmop-test-variant".into(),
        data: tag.as_bytes().to_vec().into(),
    }
    .append_to_component(&mut bytes);
    bytes
}

#[tokio::test]
async fn a_module_signed_by_cosign_loads_and_cosign_verifies_what_wasmop_push_signs()
-> anyhow::Result<()> {
    let env = TestEnv::get("oci-signed").await?;
    let registry = Registry::start().await?;
    let cosign = Cosign::new(&registry).await?;
    let (key, public) = cosign.key_pair("release").await?;
    let public_pem = std::fs::read_to_string(&public)?;
    let repo = format!("{}/mods/signed", registry.host);

    // v1, signed by cosign: the host verifies cosign's signature.
    let v1 = wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER);
    let d1 = push(&registry, "mods/signed:v1", v1).await?;
    cosign.sign(&key, &format!("{repo}@{d1}")).await?;
    pull_secret(&env, &registry, "registry", &registry.password).await?;
    let (wr, _host) = register(
        &env,
        "iu",
        signed_module(
            &registry,
            &format!("{repo}@{d1}"),
            json!({"key": public_pem}),
        ),
    )
    .await?;
    assert!(!app_served(&env, "first").await?, "v1 serves the first App");

    // v2, pushed and signed by `wasmop push --oci --sign` with cosign's encrypted key: cosign
    // verifies wasmop's signature, and the host swaps it in.
    let v2 = wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER_V2);
    let v2_sha = wasmop::engine::sha256_hex(&v2);
    let v2_file = cosign.dir.path().join("v2.wasm");
    std::fs::write(&v2_file, &v2)?;
    wasmop_cli(&[
        "push",
        &v2_file.display().to_string(),
        "--oci",
        &format!("{repo}:v2"),
        "--registry-username",
        &registry.username,
        "--registry-password",
        &registry.password,
        "--ca-bundle",
        &cosign.ca.display().to_string(),
        "--sign",
        &key.display().to_string(),
        "--sign-password",
        KEY_PASSWORD,
    ])
    .await?;
    let access = oci::Access {
        auth: Some((registry.username.clone(), registry.password.clone())),
        ca_pem: Some(registry.ca_pem.clone()),
    };
    let d2 = oci::resolve(&format!("{repo}:v2"), &access).await?;
    let verified = cosign.verify(&public, &format!("{repo}@{d2}")).await?;
    assert!(verified.contains(&d2), "cosign verified: {verified}");

    set_module(
        &env.client,
        &wr,
        signed_module(
            &registry,
            &format!("{repo}@{d2}"),
            json!({"key": public_pem}),
        ),
    )
    .await?;
    eventually("v2 active", WAIT, || async {
        Ok(active(&env.client, &wr)
            .await?
            .filter(|a| a.sha256 == v2_sha))
    })
    .await?;
    assert!(app_served(&env, "second").await?, "v2 serves the next App");
    env.passed()
}

/// What [`signed_v1`] sets up.
struct SignedV1 {
    registry: Registry,
    cosign: Cosign,
    /// The cosign key pair that signed v1: private and public key files.
    key: std::path::PathBuf,
    public: std::path::PathBuf,
    /// v1's sha256 and manifest digest.
    sha: String,
    digest: String,
}

/// A registry holding image-updater as `<repository>:v1`, signed by a new cosign key pair
/// `key_name`, and the test's pull Secret `registry` for it.
async fn signed_v1(env: &TestEnv, repository: &str, key_name: &str) -> anyhow::Result<SignedV1> {
    let registry = Registry::start().await?;
    let cosign = Cosign::new(&registry).await?;
    let (key, public) = cosign.key_pair(key_name).await?;
    let v1 = wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER);
    let sha = wasmop::engine::sha256_hex(&v1);
    let digest = push(&registry, &format!("{repository}:v1"), v1).await?;
    cosign
        .sign(&key, &format!("{}/{repository}@{digest}", registry.host))
        .await?;
    pull_secret(env, &registry, "registry", &registry.password).await?;
    Ok(SignedV1 {
        registry,
        cosign,
        key,
        public,
        sha,
        digest,
    })
}

#[tokio::test]
async fn unsigned_and_wrongly_signed_modules_are_refused_and_the_old_keeps_serving()
-> anyhow::Result<()> {
    let env = TestEnv::get("oci-unsigned").await?;
    let SignedV1 {
        registry,
        cosign,
        key,
        public,
        sha: v1_sha,
        digest: d1,
    } = signed_v1(&env, "mods/policy", "trusted").await?;
    let (other_key, _) = cosign.key_pair("other").await?;
    let trusted = fingerprint(&public)?;
    // The key lives in a ConfigMap of the host's namespace.
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = env.api();
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "module-keys"},
        "data": {"cosign.pub": std::fs::read_to_string(&public)?},
    }))?;
    cms.create(&PostParams::default(), &cm).await?;
    let verify = json!({"keyConfigMap": {"name": "module-keys", "key": "cosign.pub"}});
    let repo = format!("{}/mods/policy", registry.host);
    let (wr, _host) = register(
        &env,
        "iu",
        signed_module(&registry, &format!("{repo}@{d1}"), verify.clone()),
    )
    .await?;
    assert!(!app_served(&env, "before").await?, "v1 serves");

    // Unsigned: refused, naming the key and the digest; v1 keeps serving.
    let v2 = wasmop_test_modules::bytes(wasmop_test_modules::IMAGE_UPDATER_V2);
    let d2 = push(&registry, "mods/policy:v2", v2.clone()).await?;
    set_module(
        &env.client,
        &wr,
        signed_module(&registry, &format!("{repo}@{d2}"), verify.clone()),
    )
    .await?;
    let message = refused_with(&env.client, &wr, "SignatureInvalid").await?;
    assert!(
        message.contains(&d2) && message.contains(&trusted) && message.contains("not signed"),
        "{message}"
    );
    assert!(!app_served(&env, "unsigned").await?, "v1 keeps serving");
    // A Warning Event on the reconciler.
    wr_event(&env.client, &wr, "SignatureInvalid").await?;

    // Signed, but with another key: refused too.
    let v3 = distinct(v2, "other-key");
    let v3_sha = wasmop::engine::sha256_hex(&v3);
    let d3 = push(&registry, "mods/policy:v3", v3).await?;
    cosign.sign(&other_key, &format!("{repo}@{d3}")).await?;
    set_module(
        &env.client,
        &wr,
        signed_module(&registry, &format!("{repo}@{d3}"), verify.clone()),
    )
    .await?;
    let message = eventually("refused for the other key's signature", WAIT, || async {
        Ok(wr_condition(&env.client, &wr, "ModuleLoaded")
            .await?
            .filter(|(s, r, m)| s == "False" && r == "SignatureInvalid" && m.contains(&d3))
            .map(|(_, _, m)| m))
    })
    .await?;
    assert!(
        message.contains(&trusted) && message.contains("not signed by key"),
        "{message}"
    );
    assert!(!app_served(&env, "other-key").await?, "v1 keeps serving");
    assert_eq!(
        active(&env.client, &wr).await?.map(|a| a.sha256),
        Some(v1_sha)
    );

    // The trusted key signs it too (cosign adds its signature): retried, it swaps in without
    // a change to the spec.
    cosign.sign(&key, &format!("{repo}@{d3}")).await?;
    eventually("v3 active once signed", WAIT * 2, || async {
        Ok(active(&env.client, &wr)
            .await?
            .filter(|a| a.sha256 == v3_sha))
    })
    .await?;
    assert!(app_served(&env, "signed").await?, "v3 serves");
    env.passed()
}

#[tokio::test]
async fn a_signing_policy_added_to_a_serving_module_stops_it_until_it_is_signed()
-> anyhow::Result<()> {
    let env = TestEnv::get("oci-revoke").await?;
    let SignedV1 {
        registry,
        cosign,
        sha: v1_sha,
        digest: d1,
        ..
    } = signed_v1(&env, "mods/revoke", "first").await?;
    let (other_key, other_public) = cosign.key_pair("other").await?;
    let reference = format!("{}/mods/revoke@{d1}", registry.host);
    let (wr, _host) = register(
        &env,
        "iu",
        oci_module(&registry, &reference, None, "registry"),
    )
    .await?;
    // It serves with no policy. A policy whose key did not sign it: it stops serving.
    let verify = json!({"key": std::fs::read_to_string(&other_public)?});
    set_module(
        &env.client,
        &wr,
        signed_module(&registry, &reference, verify),
    )
    .await?;
    let (_, _, message) = eventually("Ready=False SignatureInvalid", WAIT, || async {
        Ok(wr_condition(&env.client, &wr, "Ready")
            .await?
            .filter(|(s, r, _)| s == "False" && r == "SignatureInvalid"))
    })
    .await?;
    assert!(message.contains(&d1), "{message}");
    // Signed with that key, it serves again, with no change to the spec.
    cosign.sign(&other_key, &reference).await?;
    eventually("Ready again once signed", WAIT * 2, || async {
        Ok(wr_condition(&env.client, &wr, "Ready")
            .await?
            .filter(|(s, _, _)| s == "True"))
    })
    .await?;
    assert_eq!(
        active(&env.client, &wr).await?.map(|a| a.sha256),
        Some(v1_sha)
    );
    assert!(!app_served(&env, "signed").await?, "v1 serves again");
    env.passed()
}

#[tokio::test]
async fn a_host_requiring_signatures_refuses_configmap_modules_and_loads_signed_ones()
-> anyhow::Result<()> {
    let env = TestEnv::get("oci-required").await?;
    let SignedV1 {
        registry,
        cosign: _cosign,
        key: _,
        public,
        sha: v1_sha,
        digest: d1,
    } = signed_v1(&env, "mods/required", "host").await?;
    let host_key = wasmop::modules::signature::TrustedKey::from_pem(
        &std::fs::read_to_string(&public)?,
        "--require-signed-modules",
    )?;

    // A ConfigMap module cannot carry a signature: refused.
    install_crds(&env.client).await?;
    service_account(&env.client, &env.namespace, "iu", image_updater_rules(true)).await?;
    push_module(
        &env.client,
        &env.namespace,
        "iu-module",
        wasmop_test_modules::IMAGE_UPDATER,
    )
    .await?;
    let wr = format!("{}-iu", env.namespace);
    let spec = reconciler(
        &env,
        &wr,
        "iu-module",
        ("example.wasmop.dev/v1", "App"),
        &[("apps/v1", "Deployment"), ("v1", "Service")],
        "iu",
        json!({}),
    );
    apply_reconciler(&env.client, &spec).await?;
    let ns = env.namespace.clone();
    let _host = start_host_with(&env, |o| {
        o.oci.namespace = Some(ns);
        o.oci.required_key = Some(host_key.clone());
    })
    .await?;
    let message = refused_with(&env.client, &wr, "SignatureRequired").await?;
    assert!(message.contains(&host_key.fingerprint), "{message}");

    // The same module from the registry, signed by the host's key, loads (no key in the spec).
    let api: Api<WasmReconciler> = Api::all(env.client.clone());
    api.patch(
        &wr,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"module": {
            "configMap": null,
            "oci": oci_module(&registry, &format!("{}/mods/required@{d1}", registry.host), None, "registry")["oci"],
        }}})),
    )
    .await?;
    eventually("the signed module active", WAIT, || async {
        Ok(active(&env.client, &wr)
            .await?
            .filter(|a| a.sha256 == v1_sha))
    })
    .await?;
    assert!(
        !app_served(&env, "signed").await?,
        "the signed module serves"
    );
    env.passed()
}

/// A registry that answers every request with a body that never ends: TLS as a real registry
/// (its own CA), then a 200 with one byte every 5 s (well inside the host's 30 s per-read
/// timeout), so only the pull's total deadline (3 minutes) ends a pull. Connections are counted.
struct Tarpit {
    addr: std::net::SocketAddr,
    ca_pem: String,
    accepted: tokio::sync::watch::Receiver<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl Tarpit {
    async fn start() -> anyhow::Result<Tarpit> {
        let cert = wasmop::tls::ServingCert::generate(&["127.0.0.1".to_string()])?;
        let acceptor = tokio_rustls::TlsAcceptor::from(cert.server_config()?);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (count, accepted) = tokio::sync::watch::channel(0usize);
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                count.send_modify(|n| *n += 1);
                tokio::spawn(Tarpit::trickle(acceptor.clone(), socket));
            }
        });
        Ok(Tarpit {
            addr,
            ca_pem: cert.ca_pem,
            accepted,
            task,
        })
    }

    /// Answers one connection: reads the request, then trickles a body until the client goes.
    async fn trickle(acceptor: tokio_rustls::TlsAcceptor, socket: tokio::net::TcpStream) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(mut tls) = acceptor.accept(socket).await else {
            return;
        };
        let mut request = [0u8; 4096];
        if tls.read(&mut request).await.unwrap_or(0) == 0 {
            return;
        }
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n";
        if tls.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        loop {
            if tls.write_all(b" ").await.is_err() || tls.flush().await.is_err() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        }
    }

    /// Waits until at least `n` connections came in.
    async fn accepted(&mut self, n: usize) -> anyhow::Result<()> {
        tokio::time::timeout(WAIT, self.accepted.wait_for(|c| *c >= n))
            .await
            .map_err(|_| anyhow::anyhow!("no pull reached the tarpit within {WAIT:?}"))??;
        Ok(())
    }

    /// The `spec.module` of a module on this registry (pinned: the host pulls only pinned
    /// references; nothing is ever delivered to check the digest against).
    fn module(&self, repository: &str) -> Value {
        let digest = format!("sha256:{}", "0".repeat(64));
        json!({"oci": {
            "reference": format!("{}/{repository}@{digest}", self.addr),
            "caBundle": self.ca_pem,
        }})
    }
}

impl Drop for Tarpit {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reliability item 1: a registry that never answers holds one reconciler's set-up, never the
/// host: another reconciler starts, the stuck one can be edited to another module, and the
/// host shuts down within its grace while a swap's pull hangs. Each wait is well under the
/// 3-minute deadline of a pull, so only a host that does not wait for the pull passes.
#[tokio::test]
async fn a_registry_that_never_answers_holds_neither_other_reconcilers_nor_the_shutdown()
-> anyhow::Result<()> {
    const WITHIN: std::time::Duration = std::time::Duration::from_secs(60);
    let env = TestEnv::get("oci-tarpit").await?;
    let mut tarpit = Tarpit::start().await?;
    install_crds(&env.client).await?;
    service_account(&env.client, &env.namespace, "iu", image_updater_rules(true)).await?;
    service_account(&env.client, &env.namespace, "mb", widget_rules()).await?;
    push_module(
        &env.client,
        &env.namespace,
        "iu",
        wasmop_test_modules::IMAGE_UPDATER,
    )
    .await?;
    push_module(
        &env.client,
        &env.namespace,
        "mb",
        wasmop_test_modules::MISBEHAVE,
    )
    .await?;
    let stuck = format!("{}-stuck", env.namespace);
    let app_reconciler = |module: Value| {
        let mut wr = reconciler(
            &env,
            &stuck,
            "iu",
            ("example.wasmop.dev/v1", "App"),
            &[("apps/v1", "Deployment"), ("v1", "Service")],
            "iu",
            json!({}),
        );
        wr["spec"]["module"] = module;
        wr
    };
    apply_reconciler(&env.client, &app_reconciler(tarpit.module("mods/stuck"))).await?;
    let ns = env.namespace.clone();
    let host = start_host_with(&env, |o| o.oci.namespace = Some(ns)).await?;
    tarpit.accepted(1).await?;

    // Another reconciler (of another kind) starts while the first one's pull hangs.
    let other = format!("{}-other", env.namespace);
    let widgets = reconciler(
        &env,
        &other,
        "mb",
        ("test.wasmop.dev/v1", "Widget"),
        &[("v1", "ConfigMap")],
        "mb",
        json!({}),
    );
    apply_reconciler(&env.client, &widgets).await?;
    tokio::time::timeout(WITHIN, wait_wr_ready(&env.client, &other))
        .await
        .map_err(|_| anyhow::anyhow!("{other} not Ready within {WITHIN:?}"))??;

    // The stuck reconciler, edited to a module from a ConfigMap, serves it.
    let configmap = json!({"configMap": {"namespace": env.namespace, "name": "iu"}});
    apply_reconciler(&env.client, &app_reconciler(configmap)).await?;
    tokio::time::timeout(WITHIN, wait_wr_ready(&env.client, &stuck))
        .await
        .map_err(|_| anyhow::anyhow!("{stuck} not Ready within {WITHIN:?} of its edit"))??;

    // Swapped back to the registry: the swap's pull hangs while the host shuts down.
    let before = *tarpit.accepted.borrow();
    apply_reconciler(&env.client, &app_reconciler(tarpit.module("mods/again"))).await?;
    tarpit.accepted(before + 1).await?;
    tokio::time::timeout(WITHIN, host.shutdown())
        .await
        .map_err(|_| anyhow::anyhow!("the host did not shut down within {WITHIN:?}"))??;
    env.passed()
}

/// Writes the public key file `public` into Secret `name`, key `cosign.pub` (the key rotated
/// in place, as an operator would).
async fn key_secret(env: &TestEnv, name: &str, public: &std::path::Path) -> anyhow::Result<()> {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "cosign.pub".to_string(),
            ByteString(std::fs::read(public)?),
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

/// `status.activeModule` as the API server holds it (read untyped: every field it has).
async fn active_raw(client: &Client, wr: &str) -> anyhow::Result<Value> {
    let resource = kube::api::ApiResource::erase::<WasmReconciler>(&());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let object = api.get(wr).await?;
    Ok(object.data["status"]["activeModule"].clone())
}

/// The fingerprints `status.activeModule.verifiedBy` records.
async fn verified_by(client: &Client, wr: &str) -> anyhow::Result<Vec<String>> {
    let active = active_raw(client, wr).await?;
    Ok(active["verifiedBy"]
        .as_array()
        .map(|keys| {
            keys.iter()
                .filter_map(|k| k["fingerprint"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

/// The WasmReconciler's `metadata.generation`.
async fn generation(client: &Client, wr: &str) -> anyhow::Result<Option<i64>> {
    let api: Api<WasmReconciler> = Api::all(client.clone());
    Ok(api.get(wr).await?.metadata.generation)
}

#[tokio::test]
async fn a_rotated_key_rechecks_the_serving_module_and_status_records_the_verifying_key()
-> anyhow::Result<()> {
    let env = TestEnv::get("oci-rotate").await?;
    let SignedV1 {
        registry,
        cosign,
        public,
        sha: v1_sha,
        digest: d1,
        ..
    } = signed_v1(&env, "mods/rotate", "first").await?;
    let (second_key, second_public) = cosign.key_pair("second").await?;
    let (first, second) = (fingerprint(&public)?, fingerprint(&second_public)?);
    key_secret(&env, "module-keys", &public).await?;
    let reference = format!("{}/mods/rotate@{d1}", registry.host);
    let verify = json!({"keySecret": {"name": "module-keys", "key": "cosign.pub"}});
    let (wr, _host) = register(&env, "iu", signed_module(&registry, &reference, verify)).await?;
    let spec_generation = generation(&env.client, &wr).await?;

    // The Secret now holds a key that did not sign v1: it stops serving, the spec untouched.
    key_secret(&env, "module-keys", &second_public).await?;
    let (_, _, message) = eventually("Ready=False SignatureInvalid", WAIT, || async {
        Ok(wr_condition(&env.client, &wr, "Ready")
            .await?
            .filter(|(s, r, _)| s == "False" && r == "SignatureInvalid"))
    })
    .await?;
    assert!(
        message.contains(&d1) && message.contains(&second),
        "{message}"
    );
    assert_eq!(generation(&env.client, &wr).await?, spec_generation);

    // The key rotated back: serving again, verified by the first key.
    key_secret(&env, "module-keys", &public).await?;
    eventually("Ready again with the first key", WAIT, || async {
        Ok(wr_condition(&env.client, &wr, "Ready")
            .await?
            .filter(|(s, _, _)| s == "True"))
    })
    .await?;
    let recorded = eventually("verifiedBy names the first key", WAIT, || async {
        Ok(Some(verified_by(&env.client, &wr).await?).filter(|k| k.contains(&first)))
    })
    .await?;
    assert_eq!(recorded, vec![first.clone()]);
    assert_eq!(
        active(&env.client, &wr).await?.map(|a| a.sha256),
        Some(v1_sha.clone())
    );

    // Signed by the second key too, and the Secret rotated to it: it keeps serving without a
    // swap (activeModule.loadedAt unchanged), now verified by the second key.
    let loaded_at = active_raw(&env.client, &wr).await?["loadedAt"].clone();
    cosign.sign(&second_key, &reference).await?;
    key_secret(&env, "module-keys", &second_public).await?;
    let recorded = eventually("verifiedBy names the second key", WAIT, || async {
        Ok(Some(verified_by(&env.client, &wr).await?).filter(|k| k.contains(&second)))
    })
    .await?;
    assert_eq!(recorded, vec![second]);
    let (ready, _, message) = wr_condition(&env.client, &wr, "Ready")
        .await?
        .unwrap_or_default();
    assert_eq!(ready, "True", "{message}");
    let now = active_raw(&env.client, &wr).await?;
    assert_eq!(now["loadedAt"], loaded_at, "no swap: {now}");
    assert_eq!(now["sha256"], json!(v1_sha));
    assert!(!app_served(&env, "rotated").await?, "v1 serves");
    assert_eq!(generation(&env.client, &wr).await?, spec_generation);
    env.passed()
}
