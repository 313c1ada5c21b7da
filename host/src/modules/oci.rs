//! A module's OCI artifact: pulling a module out of a registry, and pushing one.
//!
//! The artifact follows the CNCF Wasm OCI layout: an image manifest whose config has media type
//! [`WASM_CONFIG`] and whose only layer has media type [`WASM_LAYER`] (the older
//! `application/vnd.wasm.content.layer.v1+wasm` layer and `application/vnd.wasm.config.v1+json`
//! config, which oci-client's own wasm example writes, are accepted too).
//!
//! # Guarantees
//! - A module is pulled by manifest digest only: a tag reference must come with the digest it
//!   is required to resolve to ([`OciModule::digest`]), and the manifest served must hash to it.
//! - The layer is streamed into one buffer, refused as soon as it passes the cap, and its
//!   sha256 is checked against the manifest while it streams (oci-client's verifying stream):
//!   the module is never held twice.
//! - Each pull builds its own client, so a changed pull Secret or CA bundle takes effect on the
//!   next try.
//!
//! # Errors
//! [`OciError`]: each variant says which reference and what to do, and maps to the condition
//! reason the WasmReconciler reports ([`OciError::reason`]).

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};
use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::{OciDescriptor, OciImageManifest, OciManifest};
use oci_client::{Reference, errors::OciDistributionError};

use crate::crd::OciModule;
use crate::modules::reader::{ReadError, Reader, json_error_text, registry_text};
pub use crate::modules::registry::{Access, Pinned};
use crate::modules::signature::{self, SignatureError, TrustedKey};
use crate::reasons;

/// The config media type of a Wasm artifact.
pub const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of a Wasm artifact.
pub const WASM_LAYER: &str = "application/wasm";
/// Media types written by older tools, still accepted.
const LEGACY_LAYER: &str = oci_client::manifest::WASM_LAYER_MEDIA_TYPE;
const LEGACY_CONFIG: &str = oci_client::manifest::WASM_CONFIG_MEDIA_TYPE;

/// The default cap on a module pulled from a registry.
pub const DEFAULT_MAX_MODULE_BYTES: u64 = 64 << 20;
/// The default deadline of a whole pull (tag, signatures, manifest and layer).
pub const DEFAULT_PULL_DEADLINE: Duration = Duration::from_secs(180);

/// The host-wide settings of OCI module sources.
#[derive(Debug, Clone)]
pub struct OciOptions {
    /// The host's namespace, where pull Secrets and CA ConfigMaps are read (default: the pod's
    /// namespace, else `default`).
    pub namespace: Option<String>,
    /// The largest module pulled.
    pub max_module_bytes: u64,
    /// The key every module must be signed with (`--require-signed-modules`), besides the one
    /// a WasmReconciler's `spec.module.oci.verify` names.
    pub required_key: Option<TrustedKey>,
    /// How long a whole pull may take ([`fetch`]).
    pub pull_deadline: Duration,
}

impl Default for OciOptions {
    fn default() -> Self {
        OciOptions {
            namespace: None,
            max_module_bytes: DEFAULT_MAX_MODULE_BYTES,
            required_key: None,
            pull_deadline: DEFAULT_PULL_DEADLINE,
        }
    }
}

impl OciOptions {
    /// The namespace pull Secrets and CA ConfigMaps are read from.
    pub fn namespace(&self) -> String {
        self.namespace
            .clone()
            .or_else(crate::modules::copy::host_namespace)
            .unwrap_or_else(|| "default".into())
    }
}

/// A module could not be pulled (or pushed).
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The reference or the digest policy is invalid.
    #[error("spec.module.oci: {0}")]
    InvalidSpec(String),
    /// The pull Secret or the CA bundle cannot be used.
    #[error("{what}: {detail}")]
    Credentials {
        /// Which object.
        what: String,
        /// What is wrong, and what to do.
        detail: String,
    },
    /// The registry did not answer, or answered with a server error.
    #[error(
        "registry {registry} is unreachable for {reference}: {detail} (the active module keeps serving; retrying)"
    )]
    Unreachable {
        /// The registry host.
        registry: String,
        /// The reference.
        reference: String,
        /// What went wrong.
        detail: String,
    },
    /// The registry refused the credentials.
    #[error(
        "registry {registry} refused the credentials for {reference}: {detail} (check spec.module.oci.pullSecret)"
    )]
    Unauthorized {
        /// The registry host.
        registry: String,
        /// The reference.
        reference: String,
        /// What the registry said.
        detail: String,
    },
    /// The manifest or the layer does not exist.
    #[error("{reference}: not found in the registry: {detail} (push it with `wasmop push --oci`)")]
    NotFound {
        /// The reference.
        reference: String,
        /// What the registry said.
        detail: String,
    },
    /// The content does not match its pinned digest.
    #[error("{reference}: digest mismatch: {detail}")]
    DigestMismatch {
        /// The reference.
        reference: String,
        /// Expected and found.
        detail: String,
    },
    /// The artifact is not a Wasm artifact.
    #[error(
        "{reference} is not a Wasm module artifact: {detail} (expected config {WASM_CONFIG} and one {WASM_LAYER} layer, as `wasmop push --oci` writes)"
    )]
    NotWasm {
        /// The reference.
        reference: String,
        /// What is wrong.
        detail: String,
    },
    /// The layer is larger than the cap.
    #[error(
        "{reference}: the module is {size} bytes, more than the host's cap of {cap} bytes (raise --max-module-bytes)"
    )]
    TooLarge {
        /// The reference.
        reference: String,
        /// Its size (or a lower bound).
        size: u64,
        /// The cap.
        cap: u64,
    },
    /// Something else failed talking to the registry.
    #[error("{reference}: {detail}")]
    Registry {
        /// The reference.
        reference: String,
        /// What failed.
        detail: String,
    },
    /// The module's signatures do not satisfy the policy, or its key cannot be used.
    #[error(transparent)]
    Signature(#[from] SignatureError),
}

impl OciError {
    /// The condition reason this failure is reported with.
    pub fn reason(&self) -> &'static str {
        match self {
            OciError::InvalidSpec(_) => reasons::INVALID_SPEC,
            OciError::Credentials { .. } => reasons::REGISTRY_CREDENTIALS_INVALID,
            OciError::Unreachable { .. } => reasons::REGISTRY_UNREACHABLE,
            OciError::Unauthorized { .. } => reasons::REGISTRY_UNAUTHORIZED,
            OciError::NotFound { .. } => reasons::MODULE_NOT_FOUND,
            OciError::DigestMismatch { .. } => reasons::DIGEST_MISMATCH,
            OciError::NotWasm { .. } | OciError::TooLarge { .. } => reasons::MODULE_INVALID,
            OciError::Registry { .. } => reasons::REGISTRY_ERROR,
            OciError::Signature(e) => e.reason(),
        }
    }

    /// Whether trying again later may succeed without the spec changing (the registry comes
    /// back, the Secret or the repository is fixed, a signature is pushed).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            OciError::Unreachable { .. }
                | OciError::Unauthorized { .. }
                | OciError::NotFound { .. }
                | OciError::Credentials { .. }
                | OciError::Registry { .. }
                | OciError::Signature(_)
        )
    }
}

/// Resolves `spec` to the reference by digest that is pulled.
///
/// # Errors
/// [`OciError::InvalidSpec`]: an unparsable reference or digest, a tag without a digest, or a
/// pinned reference whose digest disagrees with `digest`.
pub fn pin(spec: &OciModule) -> Result<Pinned, OciError> {
    let reference: Reference = spec.reference.parse().map_err(|e| {
        OciError::InvalidSpec(format!(
            "reference {:?} cannot be parsed: {e}",
            spec.reference
        ))
    })?;
    if let Some(d) = &spec.digest {
        check_digest(d)?;
    }
    let digest = match (reference.digest(), &spec.digest) {
        (Some(pinned), Some(d)) if pinned != d => {
            return Err(OciError::InvalidSpec(format!(
                "reference {} pins {pinned} but digest says {d}: keep one",
                spec.reference
            )));
        }
        (Some(pinned), _) => pinned.to_string(),
        (None, Some(d)) => d.clone(),
        (None, None) => {
            return Err(OciError::InvalidSpec(format!(
                "reference {} names a tag without a digest: pin it as repository@sha256:<digest>, or set spec.module.oci.digest to the digest the tag must resolve to",
                spec.reference
            )));
        }
    };
    check_digest(&digest)?;
    Ok(Pinned {
        reference: reference.clone_with_digest(digest.clone()),
        digest,
    })
}

fn check_digest(digest: &str) -> Result<(), OciError> {
    let ok = digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    if ok {
        Ok(())
    } else {
        Err(OciError::InvalidSpec(format!(
            "digest {digest:?} is not sha256:<64 lowercase hex digits>"
        )))
    }
}

/// Reads the pull credentials and CA bundle `spec` names, from namespace `namespace` (the
/// host's).
///
/// # Errors
/// [`OciError::Credentials`] when a named object is missing or malformed, or cannot be read.
pub async fn access(
    client: &Client,
    namespace: &str,
    spec: &OciModule,
    registry: &str,
) -> Result<Access, OciError> {
    let mut access = Access {
        ca_pem: spec.ca_bundle.clone(),
        ..Access::default()
    };
    if let Some(name) = &spec.pull_secret {
        let what = format!("pull Secret {namespace}/{name}");
        let bad = |detail: String| OciError::Credentials {
            what: what.clone(),
            detail,
        };
        let secret = Api::<Secret>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| {
                bad(format!(
                    "cannot be read: {e} (the host needs get on secrets in its namespace)"
                ))
            })?
            .ok_or_else(|| {
                bad("does not exist: create it with `kubectl create secret docker-registry`".into())
            })?;
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(".dockerconfigjson"))
            .ok_or_else(|| {
                bad("has no .dockerconfigjson key (type kubernetes.io/dockerconfigjson)".into())
            })?;
        access.auth = Some(docker_config_auth(&data.0, registry).map_err(bad)?);
    }
    if let Some(key) = &spec.ca_config_map {
        let what = format!("CA ConfigMap {namespace}/{}", key.name);
        let bad = |detail: String| OciError::Credentials {
            what: what.clone(),
            detail,
        };
        let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .get_opt(&key.name)
            .await
            .map_err(|e| bad(format!("cannot be read: {e}")))?
            .ok_or_else(|| bad("does not exist".into()))?;
        let pem = cm
            .data
            .as_ref()
            .and_then(|d| d.get(&key.key))
            .ok_or_else(|| bad(format!("has no data key {}", key.key)))?;
        let mut all = access.ca_pem.take().unwrap_or_default();
        all.push('\n');
        all.push_str(pem);
        access.ca_pem = Some(all);
    }
    Ok(access)
}

/// The user name and password for `registry` in a `.dockerconfigjson` document.
///
/// # Errors
/// A message saying what is missing or malformed; it quotes no value of the document (the
/// message reaches conditions, Events and the log).
pub fn docker_config_auth(json: &[u8], registry: &str) -> Result<(String, String), String> {
    #[derive(serde::Deserialize)]
    struct DockerConfig {
        #[serde(default)]
        auths: BTreeMap<String, Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        username: Option<String>,
        password: Option<String>,
        auth: Option<String>,
    }
    let config: DockerConfig = serde_json::from_slice(json)
        .map_err(|e| format!(".dockerconfigjson is not valid: {}", json_error_text(&e)))?;
    let matches = |key: &str| {
        let host = key
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        host.split('/').next() == Some(registry)
    };
    let entry = config
        .auths
        .iter()
        .find(|(k, _)| matches(k))
        .map(|(_, e)| e)
        .ok_or_else(|| {
            format!(
                ".dockerconfigjson has no entry for registry {registry} (it has: {})",
                config.auths.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })?;
    if let (Some(u), Some(p)) = (&entry.username, &entry.password) {
        return Ok((u.clone(), p.clone()));
    }
    let encoded = entry.auth.as_ref().ok_or_else(|| {
        format!("the entry for {registry} has neither username/password nor auth")
    })?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        // The decoder's error names the offending byte: a byte of the credential.
        .map_err(|_| format!("the auth of {registry} is not base64"))?;
    let text =
        String::from_utf8(decoded).map_err(|_| format!("the auth of {registry} is not UTF-8"))?;
    let (u, p) = text
        .split_once(':')
        .ok_or_else(|| format!("the auth of {registry} is not user:password"))?;
    Ok((u.to_string(), p.to_string()))
}

/// The module pulled, with its manifest.
#[derive(Debug)]
pub struct Pulled {
    /// The module, with the digest it was checked by.
    pub bytes: crate::engine::Digested,
    /// The layer's digest (`sha256:<hex>`, the module's sha256).
    pub layer_digest: String,
    /// The manifest digest.
    pub manifest_digest: String,
    /// Where it came from, for the status ([`Pinned::origin`]).
    pub origin: String,
    /// The keys whose signatures it was checked against (all of them verified it); empty when
    /// no signature is required.
    pub verified_by: Vec<TrustedKey>,
}

/// Pulls the module `spec` names, with the credentials and trust it names (read from the
/// host's namespace) and the host's cap.
///
/// # Guarantees
/// - With a tag and a digest policy, the tag is resolved first and must point at the digest.
/// - When a signature is required (`spec.verify` or the host's key), the manifest digest's
///   cosign signatures are checked before the layer is pulled ([`signature::verify`]).
///
/// # Errors
/// See [`OciError`].
pub async fn fetch(
    client: &Client,
    options: &OciOptions,
    spec: &OciModule,
) -> Result<Pulled, OciError> {
    let deadline = options.pull_deadline;
    match tokio::time::timeout(deadline, fetch_within(client, options, spec)).await {
        Ok(pulled) => pulled,
        Err(_) => {
            let reference = spec.reference.clone();
            Err(OciError::Unreachable {
                registry: reference.split('/').next().unwrap_or_default().to_string(),
                reference,
                detail: format!("the pull did not finish within its deadline of {deadline:?}"),
            })
        }
    }
}

async fn fetch_within(
    client: &Client,
    options: &OciOptions,
    spec: &OciModule,
) -> Result<Pulled, OciError> {
    let pinned = pin(spec)?;
    let registry = pinned.reference.resolve_registry().to_string();
    let access = access(client, &options.namespace(), spec, &registry).await?;
    let tagged: Reference = spec
        .reference
        .parse()
        .map_err(|e| OciError::InvalidSpec(format!("reference {:?}: {e}", spec.reference)))?;
    let keys = signature::required_keys(
        client,
        &options.namespace(),
        spec,
        options.required_key.as_ref(),
    )
    .await?;
    // The tag, or the pinned manifest, is asked for first: an outage or refused credentials
    // are reported as such rather than as a missing signature.
    let resolved = if tagged.digest().is_none() || !keys.is_empty() {
        let asked = if tagged.digest().is_none() {
            &tagged
        } else {
            &pinned.reference
        };
        let mut reader = Reader::new(&access).map_err(|e| read_error(asked, e))?;
        let (_, digest) = reader
            .manifest(asked)
            .await
            .map_err(|e| read_error(asked, e))?;
        Some(digest)
    } else {
        None
    };
    if let Some(resolved) = resolved
        && resolved != pinned.digest
    {
        return Err(OciError::DigestMismatch {
            reference: spec.reference.clone(),
            detail: format!(
                "the tag resolves to {resolved}, but spec.module.oci.digest requires {}",
                pinned.digest
            ),
        });
    }
    signature::verify(&pinned, &access, &keys).await?;
    let mut pulled = pull(&pinned, &access, options.max_module_bytes).await?;
    pulled.verified_by = keys;
    Ok(pulled)
}

/// Pulls the module `pinned` names, refusing layers over `cap` bytes.
///
/// # Errors
/// See [`OciError`].
pub async fn pull(pinned: &Pinned, access: &Access, cap: u64) -> Result<Pulled, OciError> {
    let reference = &pinned.reference;
    let mut reader = Reader::new(access).map_err(|e| read_error(reference, e))?;
    let (body, digest) = reader
        .manifest(reference)
        .await
        .map_err(|e| read_error(reference, e))?;
    if digest != pinned.digest {
        return Err(OciError::DigestMismatch {
            reference: reference.whole(),
            detail: format!(
                "the registry served manifest {digest}, the reference pins {}",
                pinned.digest
            ),
        });
    }
    let manifest: OciManifest = serde_json::from_slice(&body).map_err(|e| OciError::NotWasm {
        reference: reference.whole(),
        detail: format!("its manifest cannot be parsed: {e}"),
    })?;
    let layer = wasm_layer(reference, &manifest)?;
    if layer.size < 0 || layer.size as u64 > cap {
        return Err(OciError::TooLarge {
            reference: reference.whole(),
            size: layer.size.max(0) as u64,
            cap,
        });
    }
    let bytes = reader
        .blob(reference, &layer.digest, layer.size as u64)
        .await
        .map_err(|e| match e {
            ReadError::TooLarge { .. } => OciError::DigestMismatch {
                reference: reference.whole(),
                detail: format!(
                    "layer {} is longer than the {} bytes its manifest declares",
                    layer.digest, layer.size
                ),
            },
            e => read_error(reference, e),
        })?;
    let found = format!("sha256:{}", bytes.sha256());
    if found != layer.digest {
        return Err(OciError::DigestMismatch {
            reference: reference.whole(),
            detail: format!("layer {} hashes to {found}", layer.digest),
        });
    }
    Ok(Pulled {
        bytes,
        layer_digest: layer.digest,
        manifest_digest: digest,
        origin: pinned.origin(),
        verified_by: Vec::new(),
    })
}

/// Maps a bounded read's failure onto what the user can act on.
fn read_error(reference: &Reference, e: ReadError) -> OciError {
    let registry = reference.resolve_registry().to_string();
    let whole = reference.whole();
    let detail = e.to_string();
    match &e {
        ReadError::Status { status, codes, .. }
            if *status == 401
                || *status == 403
                || codes.iter().any(|c| c == "UNAUTHORIZED" || c == "DENIED") =>
        {
            OciError::Unauthorized {
                registry,
                reference: whole,
                detail,
            }
        }
        _ if e.is_not_found() => OciError::NotFound {
            reference: whole,
            detail,
        },
        ReadError::Status { status, .. } if *status >= 500 => OciError::Unreachable {
            registry,
            reference: whole,
            detail,
        },
        ReadError::Transport(_) => OciError::Unreachable {
            registry,
            reference: whole,
            detail,
        },
        ReadError::Realm { status, .. } if *status >= 500 || *status == 429 => {
            OciError::Unreachable {
                registry,
                reference: whole,
                detail,
            }
        }
        ReadError::Auth(_) | ReadError::Realm { .. } => OciError::Unauthorized {
            registry,
            reference: whole,
            detail,
        },
        ReadError::Status { .. } | ReadError::TooLarge { .. } => OciError::Registry {
            reference: whole,
            detail,
        },
    }
}

/// The manifest's one Wasm layer.
fn wasm_layer(reference: &Reference, manifest: &OciManifest) -> Result<OciDescriptor, OciError> {
    let not_wasm = |detail: String| OciError::NotWasm {
        reference: reference.whole(),
        detail,
    };
    let OciManifest::Image(image) = manifest else {
        return Err(not_wasm(
            "it is an image index, not an image manifest".into(),
        ));
    };
    if image.config.media_type != WASM_CONFIG && image.config.media_type != LEGACY_CONFIG {
        return Err(not_wasm(format!(
            "its config has media type {}",
            image.config.media_type
        )));
    }
    match image.layers.as_slice() {
        [layer] if layer.media_type == WASM_LAYER || layer.media_type == LEGACY_LAYER => {
            Ok(layer.clone())
        }
        [layer] => Err(not_wasm(format!(
            "its layer has media type {}",
            layer.media_type
        ))),
        layers => Err(not_wasm(format!("it has {} layers", layers.len()))),
    }
}

/// Maps an oci-client error onto what the user can act on.
fn classify(reference: &Reference, e: OciDistributionError) -> OciError {
    let registry = reference.resolve_registry().to_string();
    let whole = reference.whole();
    match e {
        OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::AuthenticationFailure(_) => OciError::Unauthorized {
            registry,
            reference: whole,
            detail: registry_text(&e.to_string()),
        },
        OciDistributionError::ServerError { code, .. } if code == 401 || code == 403 => {
            OciError::Unauthorized {
                registry,
                reference: whole,
                detail: registry_text(&e.to_string()),
            }
        }
        OciDistributionError::ServerError { code, .. } if code >= 500 => OciError::Unreachable {
            registry,
            reference: whole,
            detail: registry_text(&e.to_string()),
        },
        OciDistributionError::ServerError { code: 404, .. }
        | OciDistributionError::ImageManifestNotFoundError(_) => OciError::NotFound {
            reference: whole,
            detail: registry_text(&e.to_string()),
        },
        OciDistributionError::RegistryError { ref envelope, .. } => {
            let codes: Vec<String> = envelope
                .errors
                .iter()
                .map(|x| format!("{:?}", x.code))
                .collect();
            let text = registry_text(&e.to_string());
            if codes.iter().any(|c| c == "Unauthorized" || c == "Denied") {
                OciError::Unauthorized {
                    registry,
                    reference: whole,
                    detail: text,
                }
            } else if codes.iter().any(|c| c.contains("Unknown")) {
                OciError::NotFound {
                    reference: whole,
                    detail: text,
                }
            } else {
                OciError::Registry {
                    reference: whole,
                    detail: text,
                }
            }
        }
        OciDistributionError::DigestError(_) => OciError::DigestMismatch {
            reference: whole,
            detail: registry_text(&e.to_string()),
        },
        OciDistributionError::RequestError(ref r) => OciError::Unreachable {
            registry,
            reference: whole,
            detail: registry_text(&format!("{e}{}", source_chain(r))),
        },
        other => OciError::Registry {
            reference: whole,
            detail: registry_text(&other.to_string()),
        },
    }
}

/// The causes of `e`, for messages (reqwest's own message says little: "error sending request").
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = String::new();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// The manifest digest `reference` (a tag or a digest) resolves to now.
///
/// # Errors
/// See [`OciError`].
pub async fn resolve(reference: &str, access: &Access) -> Result<String, OciError> {
    let reference: Reference = reference
        .parse()
        .map_err(|e| OciError::InvalidSpec(format!("reference {reference:?}: {e}")))?;
    access
        .client()
        .fetch_manifest_digest(&reference, &access.registry_auth())
        .await
        .map_err(|e| classify(&reference, e))
}

/// Pushes `module` to `reference` as a Wasm artifact and returns the manifest digest to pin.
///
/// # Errors
/// See [`OciError`].
pub async fn push(
    reference: &str,
    module: Vec<u8>,
    annotations: BTreeMap<String, String>,
    access: &Access,
) -> Result<String, OciError> {
    let reference: Reference = reference
        .parse()
        .map_err(|e| OciError::InvalidSpec(format!("reference {reference:?}: {e}")))?;
    let client = access.client();
    let layer = ImageLayer::new(module, WASM_LAYER.to_string(), None);
    let config = Config::new(b"{}".to_vec(), WASM_CONFIG.to_string(), None);
    let mut manifest = OciImageManifest::build(std::slice::from_ref(&layer), &config, None);
    manifest.artifact_type = None;
    manifest.annotations = Some(annotations);
    let response = client
        .push(
            &reference,
            &[layer],
            config,
            &access.registry_auth(),
            Some(manifest),
        )
        .await
        .map_err(|e| classify(&reference, e))?;
    tracing::debug!(url = %response.manifest_url, "pushed");
    client
        .fetch_manifest_digest(&reference, &access.registry_auth())
        .await
        .map_err(|e| classify(&reference, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(reference: &str, digest: Option<&str>) -> OciModule {
        OciModule {
            reference: reference.into(),
            digest: digest.map(Into::into),
            pull_secret: None,
            ca_bundle: None,
            ca_config_map: None,
            verify: None,
        }
    }

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_tag_needs_a_digest() {
        let err = pin(&spec("127.0.0.1:5000/mods/a:v1", None)).err();
        assert!(
            matches!(err, Some(OciError::InvalidSpec(m)) if m.contains("tag without a digest"))
        );
        let pinned = pin(&spec("127.0.0.1:5000/mods/a:v1", Some(D))).ok();
        assert_eq!(pinned.map(|p| p.digest), Some(D.to_string()));
    }

    #[test]
    fn a_pinned_reference_must_agree_with_digest() {
        let r = format!("127.0.0.1:5000/mods/a@{D}");
        assert_eq!(pin(&spec(&r, None)).ok().map(|p| p.digest), Some(D.into()));
        let other = D.replace("0123", "4567");
        assert!(matches!(
            pin(&spec(&r, Some(&other))),
            Err(OciError::InvalidSpec(_))
        ));
        assert!(matches!(
            pin(&spec("127.0.0.1:5000/a:v1", Some("sha256:XYZ"))),
            Err(OciError::InvalidSpec(_))
        ));
    }

    #[test]
    fn docker_config_entries() {
        let json = br#"{"auths":{"https://reg.example:5000":{"username":"u","password":"p"},
            "other":{"auth":"dXNlcjpwYXNz"}}}"#;
        assert_eq!(
            docker_config_auth(json, "reg.example:5000"),
            Ok(("u".into(), "p".into()))
        );
        assert_eq!(
            docker_config_auth(json, "other"),
            Ok(("user".into(), "pass".into()))
        );
        assert!(docker_config_auth(json, "missing").is_err());
        assert!(docker_config_auth(b"nope", "x").is_err());
    }

    /// A pull Secret's errors reach the WasmReconciler's conditions, its Events and the log:
    /// they name what is wrong, never a value of the document (a credential).
    #[test]
    fn a_malformed_docker_config_is_reported_without_its_values() {
        let cases: [&[u8]; 4] = [
            br#"{"auths":{"reg":"dXNlcjpodW50ZXIy"}}"#,
            br#"{"auths":{"reg":{"username":"u","password":12345678}}}"#,
            br#"{"auths":{"reg":{"username":"u","password":"hunter2"},}}"#,
            br#"{"auths":{"reg":{"auth":"dXNlcjpod%W50ZXIy"}}}"#,
        ];
        for json in cases {
            let Err(message) = docker_config_auth(json, "reg") else {
                panic!("{} is refused", String::from_utf8_lossy(json))
            };
            for secret in ["dXNlcjpodW50ZXIy", "12345678", "hunter2", "%", "37"] {
                assert!(!message.contains(secret), "{message}");
            }
        }
    }

    use crate::modules::hostile::{self, Answer, Body};
    use std::sync::{Arc, Mutex};

    fn hostile_access(h: &hostile::Hostile) -> Access {
        Access {
            auth: None,
            ca_pem: Some(h.ca_pem.clone()),
        }
    }

    /// A pull from `h` of the pinned test module, with the default cap.
    async fn pull_from(h: &hostile::Hostile) -> Result<Pulled, OciError> {
        pull(
            &hostile_pin(h),
            &hostile_access(h),
            DEFAULT_MAX_MODULE_BYTES,
        )
        .await
    }

    fn hostile_pin(h: &hostile::Hostile) -> Pinned {
        let Ok(pinned) = pin(&spec(&format!("{}/mods/a@{D}", h.addr), None)) else {
            panic!("a pinned reference")
        };
        pinned
    }

    /// A registry that asks for a bearer token names the realm to ask: an endless answer
    /// there (a token or an error) is refused at a cap like every other read of a pull.
    #[tokio::test]
    async fn an_endless_token_answer_is_refused_at_a_cap() {
        const LIMIT: u64 = 64 << 20;
        const BOUND: u64 = 8 << 20;
        for status in [200, 401] {
            let h = hostile::start_bearer(move |_| {
                Answer::with(
                    status,
                    Body::Endless {
                        declared: None,
                        limit: LIMIT,
                    },
                )
            })
            .await;
            let got = pull_from(&h).await;
            let Err(e) = got else {
                panic!("a pull whose token answer never ends fails")
            };
            let message = e.to_string();
            assert!(message.len() < 2048, "{status}: {} bytes", message.len());
            assert!(
                h.sent() < BOUND,
                "{status}: the token realm sent {} bytes",
                h.sent()
            );
            assert!(h.paths().iter().any(|p| p.starts_with("/token?")));
        }
    }

    /// The token exchange asks the challenge's realm for the repository's pull scope with the
    /// challenge's service, and the reads that follow carry the token.
    #[tokio::test]
    async fn a_bearer_token_is_asked_for_the_pull_scope_and_sent_with_each_read() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let h = hostile::start_bearer(move |r| {
            if let Ok(mut l) = log.lock() {
                l.push((r.path.clone(), r.authorization.clone()));
            }
            if r.path.starts_with("/token?") {
                return Answer::ok(br#"{"token":"t0ken","expires_in":300}"#);
            }
            Answer::with(
                404,
                Body::Bytes(br#"{"errors":[{"code":"MANIFEST_UNKNOWN"}]}"#.to_vec()),
            )
        })
        .await;
        let got = pull_from(&h).await;
        assert!(
            matches!(&got, Err(e) if e.reason() == reasons::MODULE_NOT_FOUND),
            "{:?}",
            got.err().map(|e| e.to_string())
        );
        let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
        let token = seen.iter().find(|(p, _)| p.starts_with("/token?"));
        let Some((query, None)) = token else {
            panic!("one anonymous token request: {seen:?}")
        };
        assert!(
            query.contains("scope=repository%3Amods%2Fa%3Apull"),
            "{query}"
        );
        assert!(query.contains("service=hostile"), "{query}");
        let manifest = seen.iter().find(|(p, _)| p.contains("/manifests/"));
        assert!(
            matches!(manifest, Some((_, Some(a))) if a == "Bearer t0ken"),
            "{seen:?}"
        );
    }

    /// A registry served over HTTPS names its token realm; a realm in clear would receive the
    /// pull Secret's credentials in clear: the exchange is refused before anything is sent.
    #[tokio::test]
    async fn credentials_are_never_sent_to_a_token_realm_in_clear() {
        let Ok(plain) = tokio::net::TcpListener::bind("127.0.0.1:0").await else {
            panic!("a listener")
        };
        let plain_addr = plain
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let received = Arc::new(Mutex::new(Vec::new()));
        let into = received.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt as _;
            while let Ok((mut tcp, _)) = plain.accept().await {
                let mut buf = vec![0u8; 4096];
                let n = tcp.read(&mut buf).await.unwrap_or(0);
                if let Ok(mut r) = into.lock() {
                    r.extend_from_slice(&buf[..n]);
                }
            }
        });
        let in_clear = format!("http://{plain_addr}/token");
        let redirect = |r: &hostile::Request, to: &str| {
            let location = format!("{to}?{}", r.path.split_once('?').unwrap_or_default().1);
            Answer::with(307, Body::Bytes(Vec::new())).header("Location", location)
        };
        let realm = in_clear.clone();
        let direct = hostile::start_bearer_at(move |_| realm.clone(), |_| Answer::ok(b"{}")).await;
        let redirected = hostile::start_bearer(move |r| redirect(r, &in_clear)).await;
        for h in [direct, redirected] {
            let access = Access {
                auth: Some(("user".into(), "hunter2".into())),
                ca_pem: Some(h.ca_pem.clone()),
            };
            let got = pull(&hostile_pin(&h), &access, DEFAULT_MAX_MODULE_BYTES).await;
            let Err(e) = got else {
                panic!("a pull whose realm is in clear fails")
            };
            assert!(e.to_string().contains("not https"), "{e}");
        }
        let received = received.lock().map(|r| r.clone()).unwrap_or_default();
        assert!(
            received.is_empty(),
            "the realm in clear received {}",
            String::from_utf8_lossy(&received)
        );
    }

    /// A token realm that fails (5xx, 429) is an outage, retried as one; one that refuses
    /// (401, 403) is a credentials problem.
    #[tokio::test]
    async fn a_token_realm_that_fails_reads_as_unreachable_and_one_that_refuses_as_unauthorized() {
        let cases = [
            (503, reasons::REGISTRY_UNREACHABLE),
            (429, reasons::REGISTRY_UNREACHABLE),
            (401, reasons::REGISTRY_UNAUTHORIZED),
            (403, reasons::REGISTRY_UNAUTHORIZED),
        ];
        for (status, reason) in cases {
            let h =
                hostile::start_bearer(move |_| Answer::with(status, Body::Bytes(b"{}".to_vec())))
                    .await;
            let Err(e) = pull_from(&h).await else {
                panic!("{status}: a pull whose realm fails fails")
            };
            assert_eq!(e.reason(), reason, "{status}: {e}");
        }
    }

    /// Item 2 of the reliability issue: a registry serving an endless manifest or error body.
    #[tokio::test]
    async fn a_hostile_registry_cannot_make_the_host_read_without_end() {
        const LIMIT: u64 = 64 << 20;
        const BOUND: u64 = 32 << 20;
        let bodies = [(200, Some(2 << 30)), (200, None), (404, None)];
        for (status, declared) in bodies {
            let h = hostile::start(move |_| {
                Answer::with(
                    status,
                    Body::Endless {
                        declared,
                        limit: LIMIT,
                    },
                )
            })
            .await;
            let got = pull_from(&h).await;
            let Err(e) = got else {
                panic!("a pull of an endless manifest fails")
            };
            let message = e.to_string();
            assert!(
                message.len() < 2048,
                "{status} {declared:?}: the message is {} bytes",
                message.len()
            );
            if status == 200 {
                assert_eq!(e.reason(), reasons::REGISTRY_ERROR, "{message}");
                assert!(
                    message.contains(&crate::modules::reader::MAX_MANIFEST_BYTES.to_string()),
                    "{message}"
                );
            } else {
                assert_eq!(e.reason(), reasons::MODULE_NOT_FOUND, "{message}");
            }
            assert!(
                h.sent() < BOUND,
                "{status} {declared:?}: the registry sent {} bytes",
                h.sent()
            );
        }
    }

    /// Item 1 of the reliability issue: a registry trickling bytes (under the per-read timeout)
    /// keeps a pull alive until its deadline (here 2 s; the trickle lasts 60 s).
    #[tokio::test]
    async fn a_trickling_registry_meets_the_pull_deadline() {
        crate::install_crypto_provider();
        let h = hostile::start(|_| {
            Answer::with(
                200,
                Body::Trickle {
                    every: Duration::from_secs(25),
                    count: 200,
                },
            )
        })
        .await;
        let Ok(uri) = "http://127.0.0.1:9".parse() else {
            panic!("a URI")
        };
        let Ok(client) = Client::try_from(kube::Config::new(uri)) else {
            panic!("a client")
        };
        let options = OciOptions {
            namespace: Some("default".into()),
            pull_deadline: Duration::from_secs(2),
            ..OciOptions::default()
        };
        let mut module = spec(&format!("{}/mods/a@{D}", h.addr), None);
        module.ca_bundle = Some(h.ca_pem.clone());
        let got = fetch(&client, &options, &module).await;
        let Err(e) = got else {
            panic!("a trickled pull fails")
        };
        assert_eq!(e.reason(), reasons::REGISTRY_UNREACHABLE, "{e}");
        assert!(e.to_string().contains("deadline"), "{e}");
        assert!(h.sent() < 120, "the registry trickled {} bytes", h.sent());
    }
}
