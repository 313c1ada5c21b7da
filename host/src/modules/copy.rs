//! The host's own copy of each reconciler's active module, in a ConfigMap it owns.
//!
//! The module ConfigMap is the author's: after a rollback or a refused push it holds a module
//! that is *not* serving. Whatever must load the serving module without having it in memory (a
//! restarted host, a new leader after a failover, a supervisor restarted by an edit of the
//! WasmReconciler, a follower answering admission reviews) reads this copy instead, found through
//! `status.moduleCopy` and checked against `status.activeModule.sha256`.
//!
//! The copy is ConfigMap `wasmop-module.<reconciler>` (a digest of the name when that is too
//! long) in the host's namespace (`POD_NAMESPACE`, else the pod's ServiceAccount namespace), or,
//! outside a pod, in the module ConfigMap's namespace. It is written as `wasmop push` writes a
//! module (gzip above 512 KiB), with server-side apply, and only when it does not already hold
//! the module.
//!
//! # Guarantees
//! - A copy is only ever used when its sha256 matches the digest asked for: a stale or tampered
//!   copy is refused, never served.
//!
//! # Errors
//! [`CopyError`] says which ConfigMap and what failed; callers report it and go on (the copy is
//! a fallback, never a reason to stop serving).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::crd::{ConfigMapKey, FIELD_MANAGER};
use crate::engine::sha256_hex;
use crate::modules::source::{self, ModuleBytes, SourceError};

/// The annotation holding the copy's digest.
const SHA_ANNOTATION: &str = "wasmop.dev/sha256";
/// The most module bytes a copy stores (what a ConfigMap holds, with room for its metadata).
const MAX_STORED: usize = 1000 << 10;
/// The annotation naming the reconciler a copy belongs to.
const RECONCILER_ANNOTATION: &str = "wasmop.dev/reconciler";
/// The longest object name.
const MAX_NAME: usize = 253;

/// A copy could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The API server refused or could not be reached.
    #[error(
        "cannot write the module copy ConfigMap {namespace}/{name}: {source} (the host needs create and patch on configmaps in {namespace})"
    )]
    Write {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The error.
        source: kube::Error,
    },
    /// The module could not be encoded.
    #[error("cannot encode the module copy: {0}")]
    Encode(#[from] std::io::Error),
    /// The module does not fit a ConfigMap even compressed (a large module from a registry).
    #[error(
        "the module ({bytes} bytes) does not fit a ConfigMap even compressed (about 1 MB), so no copy is kept; a host restarted during a registry outage cannot serve it"
    )]
    TooLarge {
        /// The module's size.
        bytes: usize,
    },
    /// The copy could not be read.
    #[error("{0}")]
    Read(#[from] SourceError),
    /// The copy holds another module.
    #[error("the module copy {namespace}/{name} holds sha256 {found}, not the expected {expected}")]
    Digest {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// What it holds.
        found: String,
        /// What was asked for.
        expected: String,
    },
}

/// The host's namespace when it runs in a pod.
pub(crate) fn host_namespace() -> Option<String> {
    std::env::var("POD_NAMESPACE")
        .ok()
        .or_else(|| std::fs::read_to_string(crate::operations::leader::SA_NAMESPACE_FILE).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The copy's name for reconciler `reconciler`: `wasmop-module.<reconciler>`, or for a name
/// too long for that `wasmop-module-sha.<32 hex of its sha256>`, which no plain name gives.
pub fn name_for(reconciler: &str) -> String {
    let name = format!("wasmop-module.{reconciler}");
    if name.len() <= MAX_NAME {
        return name;
    }
    format!(
        "wasmop-module-sha.{}",
        &sha256_hex(reconciler.as_bytes())[..32]
    )
}

/// Where reconciler `reconciler`'s copy goes: the host's namespace, else `fallback_namespace` (the
/// module ConfigMap's).
pub fn location(reconciler: &str, fallback_namespace: &str) -> ConfigMapKey {
    ConfigMapKey {
        namespace: host_namespace().unwrap_or_else(|| fallback_namespace.to_string()),
        name: name_for(reconciler),
        key: None,
    }
}

/// The copy at `at` of `bytes` (whose sha256 is `sha`), as [`save`] writes it, without the
/// reconciler's annotation and label.
///
/// # Errors
/// [`CopyError::TooLarge`] when it does not fit a ConfigMap even compressed (given up as soon as
/// it cannot fit); [`CopyError::Encode`].
pub fn encode(
    at: &ConfigMapKey,
    bytes: &[u8],
    sha: &str,
    version: &str,
) -> Result<ConfigMap, CopyError> {
    crate::modules::source::to_config_map_within(
        &at.name,
        &at.namespace,
        bytes,
        "copy",
        version,
        sha,
        MAX_STORED,
    )?
    .ok_or(CopyError::TooLarge { bytes: bytes.len() })
}

/// Makes `at` hold `bytes` (whose sha256 is `sha`), unless it does already.
///
/// # Errors
/// [`CopyError::Write`] or [`CopyError::Encode`].
pub async fn save(
    client: &Client,
    at: &ConfigMapKey,
    reconciler: &str,
    bytes: std::sync::Arc<Vec<u8>>,
    sha: &str,
    version: &str,
) -> Result<(), CopyError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &at.namespace);
    let write = |source: kube::Error| CopyError::Write {
        namespace: at.namespace.clone(),
        name: at.name.clone(),
        source,
    };
    // Skipped only when the copy's bytes are the module's (not by its annotation alone: a
    // copy overwritten with its annotation kept would be refused when read, for ever).
    if holds(client, at, sha).await? && load(client, at, sha).await.is_ok() {
        return Ok(());
    }
    // Compressing a large module takes a while: off the async threads, and given up as soon as
    // it cannot fit.
    let (at_owned, sha_owned, version) = (at.clone(), sha.to_string(), version.to_string());
    let mut cm =
        tokio::task::spawn_blocking(move || encode(&at_owned, &bytes, &sha_owned, &version))
            .await
            .map_err(std::io::Error::other)??;
    cm.annotations_mut()
        .insert(RECONCILER_ANNOTATION.into(), reconciler.into());
    cm.labels_mut()
        .insert("app.kubernetes.io/managed-by".into(), "wasmop".into());
    api.patch(
        &at.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&cm),
    )
    .await
    .map_err(write)?;
    Ok(())
}

/// Whether the copy at `at` holds the module with sha256 `sha`, by its annotation (one GET).
///
/// # Errors
/// [`CopyError::Write`] when it cannot be read.
pub async fn holds(client: &Client, at: &ConfigMapKey, sha: &str) -> Result<bool, CopyError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &at.namespace);
    let existing = api
        .get_opt(&at.name)
        .await
        .map_err(|source| CopyError::Write {
            namespace: at.namespace.clone(),
            name: at.name.clone(),
            source,
        })?;
    Ok(existing
        .as_ref()
        .and_then(|cm| cm.annotations().get(SHA_ANNOTATION))
        .is_some_and(|s| s == sha))
}

/// Reads the copy at `at`, which must hold the module with sha256 `expected`.
///
/// # Errors
/// [`CopyError::Read`] or [`CopyError::Digest`].
pub async fn load(
    client: &Client,
    at: &ConfigMapKey,
    expected: &str,
) -> Result<ModuleBytes, CopyError> {
    let bytes = source::fetch(client, at).await?;
    let found = bytes.bytes.sha256().to_string();
    if !found.eq_ignore_ascii_case(expected) {
        return Err(CopyError::Digest {
            namespace: at.namespace.clone(),
            name: at.name.clone(),
            found,
            expected: expected.to_string(),
        });
    }
    Ok(bytes)
}

/// Deletes the copy at `at` of `reconciler` (the reconciler is gone), only if it is that
/// reconciler's copy (the annotation [`save`] writes), as read, conditioned on its uid. A
/// missing copy is not an error; another object at `at` is left (logged).
///
/// # Errors
/// [`CopyError::Write`].
pub async fn delete(client: &Client, at: &ConfigMapKey, reconciler: &str) -> Result<(), CopyError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &at.namespace);
    let write = |source| CopyError::Write {
        namespace: at.namespace.clone(),
        name: at.name.clone(),
        source,
    };
    let Some(existing) = api.get_opt(&at.name).await.map_err(write)? else {
        return Ok(());
    };
    if existing
        .annotations()
        .get(RECONCILER_ANNOTATION)
        .map(String::as_str)
        != Some(reconciler)
    {
        tracing::warn!(namespace = %at.namespace, name = %at.name, %reconciler, "the module copy the status names is not this reconciler's; left as it is");
        return Ok(());
    }
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: existing.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&at.name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(CopyError::Write {
            namespace: at.namespace.clone(),
            name: at.name.clone(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_names_are_valid_object_names() {
        assert_eq!(name_for("web"), "wasmop-module.web");
        let long = "x".repeat(253);
        let n = name_for(&long);
        assert!(n.len() <= MAX_NAME, "{n}");
        assert_ne!(n, name_for(&"y".repeat(253)));
    }

    /// A long name's copy is named by a hash of it: a reconciler named exactly that hash must
    /// not share it (each would overwrite the other's copy, and deleting one would delete the
    /// other's).
    #[test]
    fn a_hashed_copy_name_is_no_plain_one() {
        let long = "x".repeat(253);
        let hash = &sha256_hex(long.as_bytes())[..32];
        assert_ne!(name_for(&long), name_for(hash));
    }

    use crate::modules::hostile::{self, Answer, Body};
    use std::sync::{Arc, Mutex};

    /// An API server serving ConfigMap `cm` at every GET and recording every other request's
    /// method.
    async fn serving(cm: serde_json::Value) -> (hostile::Hostile, Arc<Mutex<Vec<String>>>) {
        let writes = Arc::new(Mutex::new(Vec::new()));
        let w = writes.clone();
        let body = cm.to_string();
        let h = hostile::start(move |r| {
            if r.method == "GET" {
                return Answer::ok(body.as_bytes());
            }
            if let Ok(mut w) = w.lock() {
                w.push(r.method.clone());
            }
            Answer::with(200, Body::Bytes(body.as_bytes().to_vec()))
        })
        .await;
        (h, writes)
    }

    fn at() -> ConfigMapKey {
        ConfigMapKey {
            namespace: "ops".into(),
            name: name_for("web"),
            key: None,
        }
    }

    /// A copy whose data was changed but whose digest annotation was kept (a GitOps tool's
    /// overwrite, a restore) is written again, not skipped for its annotation: `load` refuses
    /// it, so the rollback target would be lost.
    #[tokio::test]
    async fn a_copy_whose_data_does_not_match_its_annotation_is_written_again() {
        let bytes = wasmop_test_modules::bytes(wasmop_test_modules::MISBEHAVE);
        let sha = sha256_hex(&bytes);
        let other = encode(&at(), b"\0asm\x01\0\0\0", &sha, "1").unwrap_or_else(|e| panic!("{e}"));
        let mut cm = serde_json::to_value(&other).unwrap_or_default();
        cm["metadata"]["annotations"][SHA_ANNOTATION] = serde_json::json!(sha);
        let (h, writes) = serving(cm).await;
        let (client, _) = h.kube_client();
        let saved = save(&client, &at(), "web", Arc::new(bytes), &sha, "1").await;
        assert!(saved.is_ok(), "{:?}", saved.err().map(|e| e.to_string()));
        let writes = writes.lock().map(|w| w.clone()).unwrap_or_default();
        assert_eq!(writes, ["PATCH"], "the copy was not written again");
    }

    /// The copy a reconciler's status names is deleted with it only when it is that
    /// reconciler's copy (the annotation `save` writes): anything else is left.
    #[tokio::test]
    async fn only_the_reconcilers_own_copy_is_deleted() {
        let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name_for("web"), "namespace": "ops", "uid": "u1",
                "resourceVersion": "5", "annotations": {RECONCILER_ANNOTATION: "someone-else"}}});
        let (h, writes) = serving(cm).await;
        let (client, _) = h.kube_client();
        assert!(delete(&client, &at(), "web").await.is_ok());
        let writes = writes.lock().map(|w| w.clone()).unwrap_or_default();
        assert_eq!(writes, Vec::<String>::new(), "another's ConfigMap deleted");
    }
}
