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
    if holds(client, at, sha).await? {
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

/// Deletes the copy at `at` (the reconciler is gone). A missing copy is not an error.
///
/// # Errors
/// [`CopyError::Write`].
pub async fn delete(client: &Client, at: &ConfigMapKey) -> Result<(), CopyError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &at.namespace);
    match api.delete(&at.name, &DeleteParams::default()).await {
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
}
