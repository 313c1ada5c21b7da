//! Cosign signatures of OCI modules: checking that a module's manifest digest is signed by the
//! keys a policy requires before the module is pulled, and signing one (`wasmop push --oci
//! --sign`).
//!
//! The format is cosign's key-based one, read and written with the sigstore crate
//! (`sigstore::cosign`): next to the module, the tag `sha256-<manifest digest>.sig` holds an
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
//! - The look-up is bounded by [`LOOKUP_TIMEOUT`]; a registry that stops answering fails the
//!   check, it never hangs the reconciler.
//!
//! # Errors
//! [`SignatureError`]: each variant names the key (its fingerprint and where it came from) and
//! the digest, and maps to the condition reason the WasmReconciler reports
//! ([`SignatureError::reason`]).

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};
use rustls_pki_types::SubjectPublicKeyInfoDer;
use rustls_pki_types::pem::PemObject;
use sigstore::cosign::constraint::{Constraint, PrivateKeySigner};
use sigstore::cosign::verification_constraint::{PublicKeyVerifier, VerificationConstraint};
use sigstore::cosign::{ClientBuilder, CosignCapabilities, SignatureLayer};
use sigstore::crypto::signing_key::SigStoreKeyPair;
use sigstore::crypto::{CosignVerificationKey, SigningScheme};
use sigstore::registry::{Auth, Certificate, CertificateEncoding, ClientConfig, OciReference};

use crate::crd::{LocalKey, OciModule, SignaturePolicy};
use crate::modules::registry::{Access, Pinned};
use crate::reasons;

/// How long looking up and fetching a module's signatures may take.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(60);

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
        "{reference}@{digest} is not signed: no cosign signature found (tag {tag}); the policy requires key {fingerprint} ({origin}): sign it with `cosign sign --key KEY {reference}@{digest}` or `wasmop push --oci ... --sign KEY` (the active module keeps serving)"
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
        "{reference}@{digest} is not signed by key {fingerprint} ({origin}): none of its {found} signature(s) verifies with that key (the active module keeps serving)"
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
                "not a PEM public key (-----BEGIN PUBLIC KEY-----, as in cosign.pub): {e}"
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
            let source = format!("ConfigMap {namespace}/{} key {}", key.name, key.key);
            let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
                .get_opt(&key.name)
                .await;
            let pem = lookup(cm, &source, |cm| {
                cm.data.as_ref().and_then(|d| d.get(&key.key)).cloned()
            })?;
            TrustedKey::from_pem(&pem, source)
        }
        (None, None, Some(key)) => {
            let source = format!("Secret {namespace}/{} key {}", key.name, key.key);
            let secret = Api::<Secret>::namespaced(client.clone(), namespace)
                .get_opt(&key.name)
                .await;
            let pem = lookup(secret, &source, |s| secret_text(s, key))?;
            TrustedKey::from_pem(&pem, source)
        }
        _ => Err(SignatureError::Key {
            origin: "spec.module.oci.verify".into(),
            detail: "names none or several of key, keyConfigMap and keySecret: keep exactly one"
                .into(),
        }),
    }
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

fn client(access: &Access) -> Result<sigstore::cosign::Client, String> {
    // sigstore's registry client shares the host's reqwest build (two rustls providers).
    crate::install_crypto_provider();
    let config = ClientConfig {
        extra_root_certificates: access
            .ca_pem
            .iter()
            .map(|pem| Certificate {
                encoding: CertificateEncoding::Pem,
                data: pem.as_bytes().to_vec(),
            })
            .collect(),
        ..ClientConfig::default()
    };
    ClientBuilder::default()
        .with_oci_client_config(config)
        .build()
        .map_err(|e| e.to_string())
}

fn auth(access: &Access) -> Auth {
    match &access.auth {
        Some((user, password)) => Auth::Basic(user.clone(), password.clone()),
        None => Auth::Anonymous,
    }
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
    let image = OciReference::with_digest(
        pinned.reference.registry().to_string(),
        pinned.reference.repository().to_string(),
        pinned.digest.clone(),
    );
    let mut client = client(access).map_err(lookup)?;
    let layers = tokio::time::timeout(
        LOOKUP_TIMEOUT,
        client.trusted_signature_layers(&auth(access), &image),
    )
    .await
    .map_err(|_| lookup(format!("no answer within {LOOKUP_TIMEOUT:?}")))?
    .map_err(|e| lookup(e.to_string()))?;
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

/// Signs the module `pinned` names with `key` and pushes the signature to its `.sig` tag (which
/// it replaces); returns that tag's reference.
///
/// # Errors
/// [`SignatureError::Sign`] when signing or pushing fails.
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
    if !signed {
        return Err(failed("the signer produced no signature".into()));
    }
    let target = OciReference::with_tag(
        pinned.reference.registry().to_string(),
        pinned.reference.repository().to_string(),
        signature_tag(&pinned.digest),
    );
    let mut client = client(access).map_err(&failed)?;
    tokio::time::timeout(
        LOOKUP_TIMEOUT,
        client.push_signature(None, &auth(access), &target, vec![layer]),
    )
    .await
    .map_err(|_| {
        failed(format!(
            "the registry did not answer within {LOOKUP_TIMEOUT:?}"
        ))
    })?
    .map_err(|e| failed(format!("pushing {target}: {e}")))?;
    Ok(target.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
