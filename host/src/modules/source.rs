//! A module's ConfigMap: reading a module out of it, and building one.
//!
//! A module is stored under a `binaryData` key: `module.wasm` as is, or `module.wasm.gz`
//! gzip-compressed (so modules larger than the ~1 MiB object limit still fit).
//!
//! # Errors
//! [`SourceError`] says which ConfigMap and key, and what to do.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::{Api, Client};

use crate::crd::ConfigMapKey;

/// The plain key.
pub const PLAIN_KEY: &str = "module.wasm";
/// The gzip key.
pub const GZIP_KEY: &str = "module.wasm.gz";
/// Largest module accepted after decompression (guards against gzip bombs).
pub const MAX_MODULE_BYTES: u64 = 64 << 20;

/// A module could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The ConfigMap does not exist.
    #[error(
        "ConfigMap {namespace}/{name} does not exist: push the module with `wasmop push MODULE.wasm --name {name} -n {namespace}`"
    )]
    NotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The key is missing.
    #[error(
        "ConfigMap {namespace}/{name} has no binaryData key {key} (it has: {present}); push the module with `wasmop push`"
    )]
    MissingKey {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The key looked for.
        key: String,
        /// The keys present.
        present: String,
    },
    /// The gzip data is corrupt or too large.
    #[error("ConfigMap {namespace}/{name} key {key}: {detail}")]
    Decompress {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Key.
        key: String,
        /// What went wrong.
        detail: String,
    },
    /// The API server could not be asked.
    #[error("cannot read ConfigMap {namespace}/{name}: {source}")]
    Api {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The error.
        source: kube::Error,
    },
}

/// The module bytes, with where they came from.
#[derive(Debug, Clone)]
pub struct ModuleBytes {
    /// The module (decompressed), hashed once as read.
    pub bytes: crate::engine::Digested,
    /// The key read.
    pub key: String,
    /// The ConfigMap's resourceVersion.
    pub resource_version: String,
}

/// Extracts the module from a ConfigMap.
///
/// # Errors
/// [`SourceError::MissingKey`] or [`SourceError::Decompress`].
pub fn from_config_map(cm: &ConfigMap, source: &ConfigMapKey) -> Result<ModuleBytes, SourceError> {
    let empty = BTreeMap::new();
    let binary = cm.binary_data.as_ref().unwrap_or(&empty);
    let key = match &source.key {
        Some(k) => k.clone(),
        None if binary.contains_key(PLAIN_KEY) => PLAIN_KEY.to_string(),
        None => GZIP_KEY.to_string(),
    };
    let Some(data) = binary.get(&key) else {
        return Err(SourceError::MissingKey {
            namespace: source.namespace.clone(),
            name: source.name.clone(),
            key,
            present: binary.keys().cloned().collect::<Vec<_>>().join(", "),
        });
    };
    let bytes = if key.ends_with(".gz") {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&data.0[..])
            .take(MAX_MODULE_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(|e| SourceError::Decompress {
                namespace: source.namespace.clone(),
                name: source.name.clone(),
                key: key.clone(),
                detail: format!("not valid gzip data: {e}"),
            })?;
        if out.len() as u64 > MAX_MODULE_BYTES {
            return Err(SourceError::Decompress {
                namespace: source.namespace.clone(),
                name: source.name.clone(),
                key,
                detail: format!("decompresses to more than {MAX_MODULE_BYTES} bytes"),
            });
        }
        out
    } else {
        data.0.clone()
    };
    Ok(ModuleBytes {
        bytes: crate::engine::Digested::new(bytes),
        key,
        resource_version: cm.metadata.resource_version.clone().unwrap_or_default(),
    })
}

/// Reads the module from the cluster.
///
/// # Errors
/// See [`SourceError`].
pub async fn fetch(client: &Client, source: &ConfigMapKey) -> Result<ModuleBytes, SourceError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &source.namespace);
    match api.get_opt(&source.name).await {
        Ok(Some(cm)) => from_config_map(&cm, source),
        Ok(None) => Err(SourceError::NotFound {
            namespace: source.namespace.clone(),
            name: source.name.clone(),
        }),
        Err(e) => Err(SourceError::Api {
            namespace: source.namespace.clone(),
            name: source.name.clone(),
            source: e,
        }),
    }
}

/// Modules larger than this are gzip-compressed (a ConfigMap holds at most 1 MiB).
pub const GZIP_ABOVE: usize = 512 << 10;

/// Builds the ConfigMap that holds `bytes` (checked by the caller), gzipped above
/// [`GZIP_ABOVE`]: what `wasmop push` writes and the host's module copy keeps.
///
/// # Errors
/// Only when compressing fails (an I/O error of the in-memory encoder).
pub fn to_config_map(
    name: &str,
    namespace: &str,
    bytes: &[u8],
    module_name: &str,
    version: &str,
    sha256: &str,
) -> Result<ConfigMap, std::io::Error> {
    to_config_map_within(
        name,
        namespace,
        bytes,
        module_name,
        version,
        sha256,
        usize::MAX,
    )?
    .ok_or_else(|| std::io::Error::other("unbounded encoding stopped"))
}

/// [`to_config_map`], but gives up (`Ok(None)`) as soon as the stored module would exceed
/// `max_stored` bytes, so a module that cannot fit is not compressed to the end.
///
/// # Errors
/// Only if compression fails.
pub fn to_config_map_within(
    name: &str,
    namespace: &str,
    bytes: &[u8],
    module_name: &str,
    version: &str,
    sha256: &str,
    max_stored: usize,
) -> Result<Option<ConfigMap>, std::io::Error> {
    let (key, data) = if bytes.len() > GZIP_ABOVE {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        for chunk in bytes.chunks(256 << 10) {
            gz.write_all(chunk)?;
            if gz.get_ref().len() > max_stored {
                return Ok(None);
            }
        }
        (GZIP_KEY, gz.finish()?)
    } else {
        (PLAIN_KEY, bytes.to_vec())
    };
    if data.len() > max_stored {
        return Ok(None);
    }
    Ok(Some(ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                "wasmop.dev/module".to_string(),
                module_name.to_string(),
            )])),
            annotations: Some(BTreeMap::from([
                ("wasmop.dev/sha256".to_string(), sha256.to_string()),
                ("wasmop.dev/version".to_string(), version.to_string()),
            ])),
            ..ObjectMeta::default()
        },
        binary_data: Some(BTreeMap::from([(key.to_string(), ByteString(data))])),
        ..ConfigMap::default()
    }))
}
