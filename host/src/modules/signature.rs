//! Cosign signatures of OCI modules: checking that a module's manifest digest is signed by the
//! keys a policy requires before the module is pulled, and signing one (`wasmop push --oci
//! --sign`).
//!
//! The format is cosign's key-based one, signed and verified with the sigstore crate
//! (`sigstore::cosign`), read with the host's bounded reads and pushed with oci-client: next to the module, the tag `sha256-<manifest digest>.sig` holds an
//! image manifest whose layers (`application/vnd.dev.cosign.simplesigning.v1+json`) are
//! simple-signing payloads naming the signed manifest digest, each with its signature in the
//! `dev.cosignproject.cosign/signature` annotation. `cosign sign --key` writes exactly this
//! (with `--tlog-upload=false` it needs no transparency log), and `cosign verify --key` accepts
//! what [`sign`] writes. Keyless (Fulcio certificate) signatures and transparency-log bundles
//! are not used: a policy names public keys.
//!
//! sigstore is built with its `rustls-tls` backend (aws-lc-rs) because its crypto needs one of
//! OpenSSL or aws-lc-rs; the host's own TLS stays on ring.
//!
//! # Guarantees
//! - A module passes only when, for every required key, at least one signature layer carries a
//!   payload naming exactly the module's manifest digest (the layer's own digest checked too)
//!   and a signature of that payload that verifies with the key.
//! - The signatures are checked before the module's layer is pulled: an unsigned module is
//!   never downloaded.
//! - Signing ([`sign`]) adds a signature: the ones already at the `.sig` tag (other keys',
//!   cosign's) are kept, byte for byte, with their annotations.
//! - The look-up is bounded by [`LOOKUP_TIMEOUT`]; a registry that stops answering fails the
//!   check, it never hangs the reconciler.
//! - The `.sig` manifest and its layers are read with bounded reads ([`Reader`]): at most
//!   [`MAX_SIGNATURES`] layers of at most [`MAX_SIGNATURE_BYTES`] each; OCI referrers are not
//!   read.
//! - A key held in a ConfigMap or Secret is followed while its reconciler serves
//!   ([`key_changes`]: one watch of that one object), so a rotated key re-checks the serving
//!   module (see `manager::rekey`).
//!
//! # Errors
//! [`SignatureError`]: each variant names the key (its fingerprint and where it came from) and
//! the digest, and maps to the condition reason the WasmReconciler reports
//! ([`SignatureError::reason`]).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use rustls_pki_types::SubjectPublicKeyInfoDer;
use rustls_pki_types::pem::PemObject;
use sigstore::cosign::SignatureLayer;
use sigstore::cosign::constraint::{Constraint, PrivateKeySigner};
use sigstore::cosign::payload::SimpleSigning;
use sigstore::cosign::verification_constraint::{PublicKeyVerifier, VerificationConstraint};
use sigstore::crypto::signing_key::SigStoreKeyPair;
use sigstore::crypto::{CosignVerificationKey, SigningScheme};
use sigstore::registry::OciReference;

use crate::crd::{LocalKey, OciModule, SignaturePolicy, VerifiedKey};
use crate::modules::reader::{Reader, registry_text};
use crate::modules::registry::{Access, Pinned};
use crate::reasons;

/// How long looking up and fetching a module's signatures may take.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(60);
/// The most signature layers a `.sig` manifest may list.
pub const MAX_SIGNATURES: usize = 64;
/// The largest signature layer read (a simple-signing payload is a few hundred bytes).
pub const MAX_SIGNATURE_BYTES: u64 = 64 << 10;
/// The media type of a cosign signature layer.
const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The annotation holding a layer's signature.
const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";

/// The condition reason of a module whose signatures do not satisfy the policy.
pub use crate::reasons::SIGNATURE_INVALID;
/// The condition reason of a policy key that cannot be read or parsed.
pub use crate::reasons::SIGNATURE_KEY_INVALID as KEY_INVALID;

/// A module's signatures do not satisfy the policy, or the policy cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    /// The key cannot be read or is not a public key cosign can verify with.
    #[error("signature key from {origin}: {detail}")]
    Key {
        /// Where the key was read from.
        origin: String,
        /// What is wrong, and what to do.
        detail: String,
    },
    /// No signature at all was found for the digest.
    #[error(
        "{reference}@{digest} is not signed: no cosign signature found (tag {tag}); the policy requires key {fingerprint} ({origin}): sign it with `cosign sign --key KEY {reference}@{digest}` or `wasmop push --oci ... --sign KEY`"
    )]
    Unsigned {
        /// The repository.
        reference: String,
        /// The manifest digest.
        digest: String,
        /// The signature tag looked up.
        tag: String,
        /// The required key's fingerprint.
        fingerprint: String,
        /// Where the key came from.
        origin: String,
    },
    /// Signatures exist, but none verifies with the required key.
    #[error(
        "{reference}@{digest} is not signed by key {fingerprint} ({origin}): none of its {found} signature(s) verifies with that key"
    )]
    WrongKey {
        /// The repository.
        reference: String,
        /// The manifest digest.
        digest: String,
        /// How many signature layers were found.
        found: usize,
        /// The required key's fingerprint.
        fingerprint: String,
        /// Where the key came from.
        origin: String,
    },
    /// The signatures could not be looked up.
    #[error(
        "cannot look up the signatures of {reference}@{digest}: {detail} (the active module keeps serving; retrying)"
    )]
    Lookup {
        /// The repository.
        reference: String,
        /// The manifest digest.
        digest: String,
        /// What failed.
        detail: String,
    },
    /// Signing failed (`wasmop push --sign`).
    #[error("cannot sign {reference}: {detail}")]
    Sign {
        /// What was being signed.
        reference: String,
        /// What failed, and what to do.
        detail: String,
    },
}

impl SignatureError {
    /// The condition reason this failure is reported with.
    pub fn reason(&self) -> &'static str {
        match self {
            SignatureError::Key { .. } => KEY_INVALID,
            SignatureError::Unsigned { .. } | SignatureError::WrongKey { .. } => SIGNATURE_INVALID,
            SignatureError::Lookup { .. } | SignatureError::Sign { .. } => reasons::REGISTRY_ERROR,
        }
    }
}

/// A public key modules must be signed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedKey {
    pem: String,
    /// `sha256:<hex>` of the key's DER SubjectPublicKeyInfo (what
    /// `openssl pkey -pubin -outform der | sha256sum` prints for its PEM).
    pub fingerprint: String,
    /// Where the key came from, for messages.
    pub source: String,
}

/// What is wrong with a PEM text, never quoting it (the parser's own errors quote the line it
/// stopped at: the value of a Secret that holds something else).
fn pem_problem(e: &rustls_pki_types::pem::Error) -> &'static str {
    use rustls_pki_types::pem::Error;
    match e {
        Error::MissingSectionEnd { .. } => "a section has no END line",
        Error::IllegalSectionStart { .. } => "a BEGIN line is malformed",
        Error::Base64Decode(_) => "a section is not base64",
        Error::NoItemsFound => "no PUBLIC KEY section",
        Error::SectionTooLarge => "a section is too large",
        _ => "it cannot be read",
    }
}

impl TrustedKey {
    /// Parses a PEM public key (`cosign.pub`) read from `source`.
    ///
    /// # Errors
    /// [`SignatureError::Key`] when it is not a PEM public key cosign can verify with.
    pub fn from_pem(pem: &str, source: impl Into<String>) -> Result<Self, SignatureError> {
        let source = source.into();
        let bad = |detail: String| SignatureError::Key {
            origin: source.clone(),
            detail,
        };
        let der = SubjectPublicKeyInfoDer::from_pem_slice(pem.as_bytes()).map_err(|e| {
            bad(format!(
                "not a PEM public key (-----BEGIN PUBLIC KEY-----, as in cosign.pub): {}",
                pem_problem(&e)
            ))
        })?;
        CosignVerificationKey::try_from_der(der.as_ref()).map_err(|e| {
            bad(format!(
                "not a key cosign signatures can be verified with: {e}"
            ))
        })?;
        Ok(TrustedKey {
            pem: pem.to_string(),
            fingerprint: format!("sha256:{}", crate::engine::sha256_hex(der.as_ref())),
            source,
        })
    }

    /// How `status.activeModule.verifiedBy` records this key (its fingerprint and where it
    /// came from; never the key's text).
    pub fn recorded(&self) -> VerifiedKey {
        VerifiedKey {
            fingerprint: self.fingerprint.clone(),
            source: self.source.clone(),
        }
    }

    fn verifier(&self) -> Result<PublicKeyVerifier, SignatureError> {
        PublicKeyVerifier::try_from(self.pem.as_bytes()).map_err(|e| SignatureError::Key {
            origin: self.source.clone(),
            detail: e.to_string(),
        })
    }
}

/// The keys the module `spec` must be signed with: the host-wide key, if any, and the one
/// `spec.verify` names, read from namespace `namespace` (the host's).
///
/// # Errors
/// [`SignatureError::Key`] when a named ConfigMap, Secret or key is missing or not a public
/// key.
pub async fn required_keys(
    client: &Client,
    namespace: &str,
    spec: &OciModule,
    host_key: Option<&TrustedKey>,
) -> Result<Vec<TrustedKey>, SignatureError> {
    let mut keys: Vec<TrustedKey> = host_key.into_iter().cloned().collect();
    if let Some(policy) = &spec.verify {
        keys.push(policy_key(client, namespace, policy).await?);
    }
    Ok(keys)
}

async fn policy_key(
    client: &Client,
    namespace: &str,
    policy: &SignaturePolicy,
) -> Result<TrustedKey, SignatureError> {
    match (&policy.key, &policy.key_config_map, &policy.key_secret) {
        (Some(pem), None, None) => TrustedKey::from_pem(pem, "spec.module.oci.verify.key"),
        (None, Some(key), None) => {
            let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
                .get_opt(&key.name)
                .await;
            config_map_key(cm, namespace, key)
        }
        (None, None, Some(key)) => {
            let secret = Api::<Secret>::namespaced(client.clone(), namespace)
                .get_opt(&key.name)
                .await;
            secret_key(secret, namespace, key)
        }
        _ => Err(SignatureError::Key {
            origin: "spec.module.oci.verify".into(),
            detail: "names none or several of key, keyConfigMap and keySecret: keep exactly one"
                .into(),
        }),
    }
}

/// The key `key` names in ConfigMap `got` (of `namespace`).
fn config_map_key(
    got: Result<Option<ConfigMap>, kube::Error>,
    namespace: &str,
    key: &LocalKey,
) -> Result<TrustedKey, SignatureError> {
    let source = format!("ConfigMap {namespace}/{} key {}", key.name, key.key);
    let pem = lookup(got, &source, |cm| {
        cm.data.as_ref().and_then(|d| d.get(&key.key)).cloned()
    })?;
    TrustedKey::from_pem(&pem, source)
}

/// The key `key` names in Secret `got` (of `namespace`).
fn secret_key(
    got: Result<Option<Secret>, kube::Error>,
    namespace: &str,
    key: &LocalKey,
) -> Result<TrustedKey, SignatureError> {
    let source = format!("Secret {namespace}/{} key {}", key.name, key.key);
    let pem = lookup(got, &source, |s| secret_text(s, key))?;
    TrustedKey::from_pem(&pem, source)
}

/// What a change of the object holding a policy's key says: the key it holds now, or why it
/// holds none (deleted, no such key, not a public key).
pub type KeyChange = Result<TrustedKey, SignatureError>;

/// The changes of the ConfigMap or Secret (in `namespace`) holding `policy`'s key, each as the
/// key it then holds: a watch of that one object (a field selector on its name), which lists it
/// first. Never ends; a key written in the spec is handed over once (it changes with the spec:
/// the supervisor asks again for each spec).
///
/// Caveats: an object deleted while the watch relists (after the watch expired) is not seen
/// until it is created again or the reconciler is set up again.
pub fn key_changes(
    client: &Client,
    namespace: &str,
    policy: &SignaturePolicy,
) -> BoxStream<'static, KeyChange> {
    let ns = namespace.to_string();
    match (&policy.key, &policy.key_config_map, &policy.key_secret) {
        (None, Some(key), None) => {
            let key = key.clone();
            let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
            object_changes(api, &key.name.clone(), move |cm| {
                config_map_key(Ok(cm), &ns, &key)
            })
        }
        (None, None, Some(key)) => {
            let key = key.clone();
            let api = Api::<Secret>::namespaced(client.clone(), namespace);
            object_changes(api, &key.name.clone(), move |s| {
                secret_key(Ok(s), &ns, &key)
            })
        }
        // A key written in the spec changes with the spec: handed over once, when the
        // supervisor follows this spec.
        (Some(pem), None, None) => {
            let key = TrustedKey::from_pem(pem, "spec.module.oci.verify.key");
            futures::stream::once(std::future::ready(key))
                .chain(futures::stream::pending())
                .boxed()
        }
        _ => futures::stream::pending().boxed(),
    }
}

/// Each state of object `name` that `api` watches, mapped by `key` (`None`: deleted).
fn object_changes<K>(
    api: Api<K>,
    name: &str,
    key: impl Fn(Option<K>) -> KeyChange + Send + 'static,
) -> BoxStream<'static, KeyChange>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let name = name.to_string();
    watcher(api, config)
        .default_backoff()
        .filter_map(move |event| {
            let change = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => Some(key(Some(o))),
                Ok(watcher::Event::Delete(_)) => Some(key(None)),
                Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
                // The watcher retries with backoff; the key stays as last seen meanwhile.
                Err(e) => {
                    tracing::warn!(object = %name, error = %e, "cannot watch the object holding a signing key (the host needs list and watch on it); a rotated key is seen at the next set-up");
                    None
                }
            };
            futures::future::ready(change)
        })
        .boxed()
}

fn secret_text(secret: &Secret, key: &LocalKey) -> Option<String> {
    let bytes = secret.data.as_ref().and_then(|d| d.get(&key.key))?;
    String::from_utf8(bytes.0.clone()).ok()
}

/// The value `pick` finds in the object `got` returned, or a [`SignatureError::Key`] saying
/// what is missing.
fn lookup<K>(
    got: Result<Option<K>, kube::Error>,
    source: &str,
    pick: impl Fn(&K) -> Option<String>,
) -> Result<String, SignatureError> {
    let bad = |detail: String| SignatureError::Key {
        origin: source.to_string(),
        detail,
    };
    let object = got
        .map_err(|e| {
            bad(format!(
                "cannot be read: {e} (the host needs get on it in its namespace)"
            ))
        })?
        .ok_or_else(|| bad("does not exist".into()))?;
    pick(&object).ok_or_else(|| bad("has no such key (or it is not UTF-8 text)".into()))
}

fn repository(pinned: &Pinned) -> String {
    format!(
        "{}/{}",
        pinned.reference.registry(),
        pinned.reference.repository()
    )
}

/// The tag cosign keeps the signatures of `digest` under: `sha256-<hex>.sig`.
pub fn signature_tag(digest: &str) -> String {
    format!("{}.sig", digest.replace(':', "-"))
}

/// Checks that the module `pinned` names is signed by every key of `keys` (nothing to check
/// when `keys` is empty).
///
/// # Errors
/// [`SignatureError::Unsigned`], [`SignatureError::WrongKey`], or
/// [`SignatureError::Lookup`] when the registry cannot be asked.
pub async fn verify(
    pinned: &Pinned,
    access: &Access,
    keys: &[TrustedKey],
) -> Result<(), SignatureError> {
    let Some(first) = keys.first() else {
        return Ok(());
    };
    let reference = repository(pinned);
    let lookup = |detail: String| SignatureError::Lookup {
        reference: reference.clone(),
        digest: pinned.digest.clone(),
        detail,
    };
    let mut reader = Reader::new(access).map_err(|e| lookup(e.to_string()))?;
    let layers = tokio::time::timeout(LOOKUP_TIMEOUT, signature_layers(&mut reader, pinned))
        .await
        .map_err(|_| lookup(format!("no answer within {LOOKUP_TIMEOUT:?}")))?
        .map_err(lookup)?;
    if layers.is_empty() {
        return Err(SignatureError::Unsigned {
            tag: format!("{reference}:{}", signature_tag(&pinned.digest)),
            reference,
            digest: pinned.digest.clone(),
            fingerprint: first.fingerprint.clone(),
            origin: first.source.clone(),
        });
    }
    for key in keys {
        if !signed_by(&layers, key)? {
            return Err(SignatureError::WrongKey {
                reference,
                digest: pinned.digest.clone(),
                found: layers.len(),
                fingerprint: key.fingerprint.clone(),
                origin: key.source.clone(),
            });
        }
    }
    Ok(())
}

fn signed_by(layers: &[SignatureLayer], key: &TrustedKey) -> Result<bool, SignatureError> {
    let verifier = key.verifier()?;
    Ok(layers
        .iter()
        .any(|layer| verifier.verify(layer).unwrap_or(false)))
}

/// The `.sig` tag of the module `pinned` names.
fn signature_reference(pinned: &Pinned) -> oci_client::Reference {
    oci_client::Reference::with_tag(
        pinned.reference.registry().to_string(),
        pinned.reference.repository().to_string(),
        signature_tag(&pinned.digest),
    )
}

/// The simple-signing layers stored at the `.sig` tag of the module `pinned` names (descriptor
/// and content, the content's digest checked), read with bounded reads: none when the tag does
/// not exist.
///
/// # Errors
/// What failed, naming the cap when the manifest, the number of layers or a layer is over it.
async fn stored_signatures(
    reader: &mut Reader,
    pinned: &Pinned,
) -> Result<Vec<(OciDescriptor, Vec<u8>)>, String> {
    let tag = signature_reference(pinned);
    let body = match reader.manifest(&tag).await {
        Ok((body, _)) => body,
        Err(e) if e.is_not_found() => return Ok(Vec::new()),
        Err(e) => return Err(e.to_string()),
    };
    let manifest: OciImageManifest = serde_json::from_slice(&body)
        .map_err(|e| format!("the signature manifest {tag} is not an image manifest: {e}"))?;
    if manifest.layers.len() > MAX_SIGNATURES {
        return Err(format!(
            "the signature manifest {tag} lists {} layers, more than the cap of {MAX_SIGNATURES} signatures",
            manifest.layers.len()
        ));
    }
    let mut stored = Vec::new();
    for descriptor in manifest.layers {
        if descriptor.media_type != SIMPLE_SIGNING {
            continue;
        }
        if descriptor.size < 0 || descriptor.size as u64 > MAX_SIGNATURE_BYTES {
            return Err(format!(
                "signature layer {} declares {} bytes, more than the cap of {MAX_SIGNATURE_BYTES} bytes",
                descriptor.digest, descriptor.size
            ));
        }
        let data = reader
            .blob(&tag, &descriptor.digest, MAX_SIGNATURE_BYTES)
            .await
            .map_err(|e| e.to_string())?;
        if format!("sha256:{}", data.sha256()) == descriptor.digest {
            stored.push((descriptor, data.into_bytes()));
        }
    }
    Ok(stored)
}

/// The signature layers of the module `pinned` names ([`stored_signatures`]); layers whose
/// payload does not name the module's digest, or that carry no signature, are skipped.
///
/// # Errors
/// See [`stored_signatures`].
async fn signature_layers(
    reader: &mut Reader,
    pinned: &Pinned,
) -> Result<Vec<SignatureLayer>, String> {
    let stored = stored_signatures(reader, pinned).await?;
    Ok(stored
        .into_iter()
        .filter_map(|(descriptor, data)| signature_layer(&descriptor, data, &pinned.digest))
        .collect())
}

/// The layer `descriptor` names, when `data` is its content, a simple-signing payload naming
/// `digest`, with a signature annotation.
fn signature_layer(
    descriptor: &OciDescriptor,
    data: Vec<u8>,
    digest: &str,
) -> Option<SignatureLayer> {
    let simple_signing: SimpleSigning = serde_json::from_slice(&data).ok()?;
    if !simple_signing.satisfies_manifest_digest(digest) {
        return None;
    }
    let signature = descriptor.annotations.as_ref()?.get(SIGNATURE_ANNOTATION)?;
    Some(SignatureLayer {
        simple_signing,
        oci_digest: descriptor.digest.clone(),
        certificate_signature: None,
        bundle: None,
        signature: Some(signature.clone()),
        raw_data: data,
    })
}

/// A private key to sign with: cosign's encrypted format (`cosign generate-key-pair`, opened
/// with `password`) or an unencrypted PKCS#8 PEM key; ECDSA P-256 (cosign's default).
#[derive(Debug)]
pub struct SigningKey {
    signer: PrivateKeySigner,
    /// The fingerprint of its public key (as [`TrustedKey::fingerprint`]).
    pub fingerprint: String,
}

impl SigningKey {
    /// Opens `pem` (read from `source`) with `password` (ignored for an unencrypted key).
    ///
    /// # Errors
    /// [`SignatureError::Key`] when the key cannot be opened or is not ECDSA P-256.
    pub fn from_pem(pem: &[u8], password: &[u8], source: &str) -> Result<Self, SignatureError> {
        let bad = |detail: String| SignatureError::Key {
            origin: source.to_string(),
            detail,
        };
        let encrypted = String::from_utf8_lossy(pem).contains("-----BEGIN ENCRYPTED");
        let pair = if encrypted {
            SigStoreKeyPair::from_encrypted_pem(pem, password).map_err(|e| {
                bad(format!(
                    "cannot open the encrypted key (is COSIGN_PASSWORD right?): {e}"
                ))
            })?
        } else {
            SigStoreKeyPair::from_pem(pem)
                .map_err(|e| bad(format!("not a PKCS#8 PEM private key: {e}")))?
        };
        let der = pair
            .public_key_to_der()
            .map_err(|e| bad(format!("cannot derive its public key: {e}")))?;
        let signer = pair
            .to_sigstore_signer(&SigningScheme::ECDSA_P256_SHA256_ASN1)
            .map_err(|e| bad(format!("not an ECDSA P-256 key (cosign's default): {e}")))?;
        Ok(SigningKey {
            signer: PrivateKeySigner::new_with_signer(signer),
            fingerprint: format!("sha256:{}", crate::engine::sha256_hex(&der)),
        })
    }
}

/// Signs the module `pinned` names with `key` and adds the signature to its `.sig` tag, keeping
/// the signatures already there (of other keys, or cosign's); returns that tag's reference.
///
/// # Errors
/// [`SignatureError::Sign`] when signing, reading the signatures there or pushing fails, or
/// when the tag already holds [`MAX_SIGNATURES`] signatures.
pub async fn sign(
    pinned: &Pinned,
    key: &SigningKey,
    access: &Access,
) -> Result<String, SignatureError> {
    let reference = format!("{}@{}", repository(pinned), pinned.digest);
    let failed = |detail: String| SignatureError::Sign {
        reference: reference.clone(),
        detail,
    };
    let image = OciReference::with_digest(
        pinned.reference.registry().to_string(),
        pinned.reference.repository().to_string(),
        pinned.digest.clone(),
    );
    let mut layer =
        SignatureLayer::new_unsigned(&image, &pinned.digest).map_err(|e| failed(e.to_string()))?;
    let signed = key
        .signer
        .add_constraint(&mut layer)
        .map_err(|e| failed(e.to_string()))?;
    let Some(signature) = layer.signature.filter(|_| signed) else {
        return Err(failed("the signer produced no signature".into()));
    };
    let new = ImageLayer::new(
        layer.raw_data,
        SIMPLE_SIGNING.to_string(),
        Some(BTreeMap::from([(
            SIGNATURE_ANNOTATION.to_string(),
            signature,
        )])),
    );
    let target = signature_reference(pinned);
    tokio::time::timeout(LOOKUP_TIMEOUT, add_signature(pinned, access, &target, new))
        .await
        .map_err(|_| {
            failed(format!(
                "the registry did not answer within {LOOKUP_TIMEOUT:?}"
            ))
        })?
        .map_err(failed)?;
    Ok(target.to_string())
}

/// Pushes the `.sig` manifest `target` with the simple-signing layers stored there and `new`.
async fn add_signature(
    pinned: &Pinned,
    access: &Access,
    target: &oci_client::Reference,
    new: ImageLayer,
) -> Result<(), String> {
    let mut reader = Reader::new(access).map_err(|e| e.to_string())?;
    let stored = stored_signatures(&mut reader, pinned).await?;
    if stored.len() >= MAX_SIGNATURES {
        return Err(format!(
            "{target} holds {} signatures already: hosts read at most {MAX_SIGNATURES}",
            stored.len()
        ));
    }
    let mut layers: Vec<ImageLayer> = stored
        .into_iter()
        .map(|(d, data)| ImageLayer::new(data, SIMPLE_SIGNING.to_string(), d.annotations))
        .collect();
    layers.push(new);
    let config = Config::oci_v1(b"{}".to_vec(), None);
    let mut manifest = OciImageManifest::build(&layers, &config, None);
    manifest.media_type = Some(oci_client::manifest::OCI_IMAGE_MEDIA_TYPE.to_string());
    access
        .client()
        .push(
            target,
            &layers,
            config,
            &access.registry_auth(),
            Some(manifest),
        )
        .await
        .map_err(|e| format!("pushing {target}: {}", registry_text(&e.to_string())))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key Secret holding something else (a private key kept on one line with literal
    /// `\n`s, as `.env` files make them): the PEM parser's error quotes the line it choked on,
    /// i.e. the Secret's value; the refusal (a condition, an Event, a log) must not.
    #[test]
    fn a_key_that_is_not_one_is_refused_without_quoting_it() {
        let one_line = "-----BEGIN PRIVATE KEY-----\\nc2VjcmV0\\n-----END PRIVATE KEY-----";
        let torn = "-----BEGIN PUBLIC KEY-----\nc2VjcmV0c2VjcmV0\n";
        for text in [one_line, torn, "-----BEGIN PUBLIC KEY c2VjcmV0\n"] {
            let Err(e) = TrustedKey::from_pem(text, "Secret ops/k key k") else {
                panic!("{text:?} is no key")
            };
            let message = e.to_string();
            for secret in ["c2VjcmV0", "99, 50, 86"] {
                assert!(!message.contains(secret), "{message}");
            }
            assert!(message.contains("Secret ops/k key k"), "{message}");
        }
    }

    /// A key written in the spec is handed over once, when its supervisor follows the spec
    /// (its set-up, or a change of the spec): so every replica, followers included, checks
    /// the serving module against a policy added or changed inline, as it does for a key in a
    /// ConfigMap or Secret (whose watch lists it first). It was never handed over: a follower
    /// kept serving a module the new inline key refuses.
    #[tokio::test]
    async fn a_key_written_in_the_spec_is_handed_over_once() {
        use futures::StreamExt as _;
        crate::install_crypto_provider();
        let Ok(url) = "http://127.0.0.1:9".parse() else {
            panic!("a URL")
        };
        let Ok(client) = Client::try_from(kube::Config::new(url)) else {
            panic!("a client")
        };
        let (pem, _) = key_pem();
        let policy = SignaturePolicy {
            key: Some(pem),
            key_config_map: None,
            key_secret: None,
        };
        let mut changes = key_changes(&client, "ops", &policy);
        let first = tokio::time::timeout(std::time::Duration::from_secs(60), changes.next()).await;
        assert!(matches!(first, Ok(Some(Ok(_)))), "no key handed over");
        let second =
            tokio::time::timeout(std::time::Duration::from_millis(100), changes.next()).await;
        assert!(second.is_err(), "handed over once");
    }

    // A P-256 public key (from rcgen), and a second one.
    fn key_pem() -> (String, String) {
        let pair = rcgen::KeyPair::generate().ok();
        let pem = pair.map(|p| p.public_key_pem()).unwrap_or_default();
        let other = rcgen::KeyPair::generate()
            .ok()
            .map(|p| p.public_key_pem())
            .unwrap_or_default();
        (pem, other)
    }

    #[test]
    fn keys_are_fingerprinted_and_garbage_is_refused() {
        let (a, b) = key_pem();
        let ka = TrustedKey::from_pem(&a, "test a");
        let kb = TrustedKey::from_pem(&b, "test b");
        let (Ok(ka), Ok(kb)) = (ka, kb) else {
            panic!("P-256 public keys parse")
        };
        assert!(ka.fingerprint.starts_with("sha256:") && ka.fingerprint.len() == 71);
        assert_ne!(ka.fingerprint, kb.fingerprint);
        let bad = TrustedKey::from_pem("not a key", "spec.module.oci.verify.key");
        assert!(
            matches!(&bad, Err(SignatureError::Key { origin, .. }) if origin == "spec.module.oci.verify.key"),
            "{bad:?}"
        );
        assert_eq!(bad.map(|_| ()).err().map(|e| e.reason()), Some(KEY_INVALID));
    }

    #[test]
    fn the_signature_tag_is_cosigns() {
        assert_eq!(
            signature_tag("sha256:abcd"),
            "sha256-abcd.sig",
            "cosign's triangulation"
        );
    }

    #[test]
    fn a_pkcs8_private_key_signs_and_its_public_key_verifies() {
        let Ok(pair) = rcgen::KeyPair::generate() else {
            panic!("a key pair")
        };
        let key = SigningKey::from_pem(pair.serialize_pem().as_bytes(), b"", "test");
        let trusted = TrustedKey::from_pem(&pair.public_key_pem(), "test");
        let (Ok(key), Ok(trusted)) = (key, trusted) else {
            panic!("the key pair opens")
        };
        assert_eq!(key.fingerprint, trusted.fingerprint);
        let Ok(image) = "127.0.0.1:5000/mods/a@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef".parse::<OciReference>() else {
            panic!("a reference")
        };
        let digest = image.digest().unwrap_or_default().to_string();
        let mut layer = SignatureLayer::new_unsigned(&image, &digest).ok();
        let signed = layer
            .as_mut()
            .map(|l| key.signer.add_constraint(l).unwrap_or(false));
        assert_eq!(signed, Some(true));
        let layers: Vec<SignatureLayer> = layer.into_iter().collect();
        assert_eq!(signed_by(&layers, &trusted).ok(), Some(true));
        let other = rcgen::KeyPair::generate()
            .ok()
            .and_then(|p| TrustedKey::from_pem(&p.public_key_pem(), "other").ok());
        let Some(other) = other else {
            panic!("another key")
        };
        assert_eq!(signed_by(&layers, &other).ok(), Some(false));
    }

    /// Item 2 of the reliability issue: a `.sig` manifest with too many layers, or a layer
    /// without end.
    #[tokio::test]
    async fn signature_layers_are_capped_in_count_and_size() {
        use crate::modules::hostile::{self, Answer, Body};
        let Ok(pair) = rcgen::KeyPair::generate() else {
            panic!("a key pair")
        };
        let Ok(trusted) = TrustedKey::from_pem(&pair.public_key_pem(), "test") else {
            panic!("a key")
        };
        let digest = format!("sha256:{}", "ab".repeat(32));
        let layer = serde_json::json!({
            "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
            "digest": format!("sha256:{}", "cd".repeat(32)),
            "size": 300,
            "annotations": {"dev.cosignproject.cosign/signature": "c2ln"},
        });
        for (count, want) in [(1000, "cap of 64 signatures"), (1, "cap of 65536 bytes")] {
            let manifest = serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": format!("sha256:{}", "ef".repeat(32)), "size": 2},
                "layers": vec![layer.clone(); count],
            })
            .to_string();
            let h = hostile::start(move |request| {
                if request.path.ends_with(".sig") {
                    Answer::ok(manifest.as_bytes())
                } else {
                    Answer::with(
                        200,
                        Body::Endless {
                            declared: None,
                            limit: 64 << 20,
                        },
                    )
                }
            })
            .await;
            let Ok(reference) =
                format!("{}/mods/a@{digest}", h.addr).parse::<oci_client::Reference>()
            else {
                panic!("a reference")
            };
            let pinned = Pinned {
                reference,
                digest: digest.clone(),
            };
            let access = Access {
                auth: None,
                ca_pem: Some(h.ca_pem.clone()),
            };
            let got = verify(&pinned, &access, std::slice::from_ref(&trusted)).await;
            let message = got
                .map(|()| String::new())
                .unwrap_or_else(|e| e.to_string());
            assert!(message.contains(want), "{count} layers: {message:?}");
            let blobs = h.paths().iter().filter(|p| p.contains("/blobs/")).count();
            assert!(blobs <= 1, "{count} layers: {blobs} blobs asked for");
            assert!(
                h.sent() < 32 << 20,
                "{count} layers: {} bytes sent",
                h.sent()
            );
        }
    }

    /// Item 24 of the reliability issue: `push --sign` erased other keys' signatures.
    #[tokio::test]
    async fn signing_keeps_the_signatures_of_other_keys() {
        use crate::modules::hostile::{self, Registry};
        let registry = Registry::default();
        let served = registry.clone();
        let h = hostile::start(move |request| served.answer(request)).await;
        let image = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.wasm.config.v0+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[]}"#;
        let digest = registry.put_manifest("mods/a", image);
        let Ok(reference) = format!("{}/mods/a@{digest}", h.addr).parse::<oci_client::Reference>()
        else {
            panic!("a reference")
        };
        let pinned = Pinned {
            reference,
            digest: digest.clone(),
        };
        let access = Access {
            auth: None,
            ca_pem: Some(h.ca_pem.clone()),
        };
        let mut trusted = Vec::new();
        for name in ["first", "second"] {
            let Ok(pair) = rcgen::KeyPair::generate() else {
                panic!("a key pair")
            };
            let key = SigningKey::from_pem(pair.serialize_pem().as_bytes(), b"", name);
            let public = TrustedKey::from_pem(&pair.public_key_pem(), name);
            let (Ok(key), Ok(public)) = (key, public) else {
                panic!("the key pair opens")
            };
            let signed = sign(&pinned, &key, &access).await;
            assert!(signed.is_ok(), "signing with the {name} key: {signed:?}");
            trusted.push(public);
        }
        let verified = verify(&pinned, &access, &trusted).await;
        assert!(verified.is_ok(), "both keys' signatures: {verified:?}");
    }
}
