//! The admission webhook's serving certificate: generated at start (a fresh CA and a leaf for the
//! names the API server uses to reach the host) or read from a directory (cert-manager style
//! `tls.crt`, `tls.key`, `ca.crt`).
//!
//! # Guarantees
//! - A generated CA lives only in this process; its certificate is what the host puts in each
//!   webhook's `caBundle`. Several replicas behind one Service must share files
//!   (`--webhook-cert-dir`), since each would otherwise generate its own CA.
//! - The TLS server offers HTTP/1.1 only (ALPN `http/1.1`), TLS 1.2 and 1.3 (ring provider).
//!
//! # Errors
//! [`TlsError`] names the file or the step that failed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A failure to make or read the serving certificate.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Generating failed.
    #[error("cannot generate the webhook certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A PEM file holds nothing usable.
    #[error("{what}: {detail}")]
    Pem {
        /// Which material.
        what: String,
        /// Why.
        detail: String,
    },
    /// rustls refused the material.
    #[error("cannot configure TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

/// PEM certificate chain, key and the CA that signed them.
#[derive(Clone)]
pub struct ServingCert {
    /// The leaf (and any intermediates), PEM.
    pub cert_pem: String,
    /// The leaf's private key, PEM.
    pub key_pem: String,
    /// The CA certificate for `caBundle`, PEM.
    pub ca_pem: String,
}

impl std::fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert").finish_non_exhaustive()
    }
}

impl ServingCert {
    /// A new CA and a leaf for `names` (DNS names or IP addresses).
    ///
    /// # Errors
    /// [`TlsError::Generate`].
    pub fn generate(names: &[String]) -> Result<Self, TlsError> {
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "wasmop-webhook-ca");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate()?;
        let mut leaf = CertificateParams::new(names.to_vec())?;
        leaf.distinguished_name
            .push(DnType::CommonName, "wasmop-webhook");
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        leaf.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let cert = leaf.signed_by(&key, &issuer)?;
        Ok(ServingCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_pem: ca_cert.pem(),
        })
    }

    /// Reads `tls.crt`, `tls.key` and `ca.crt` (when `ca.crt` is missing, `tls.crt` is the
    /// bundle: a self-signed certificate).
    ///
    /// # Errors
    /// [`TlsError::Read`].
    pub fn load(dir: &Path) -> Result<Self, TlsError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| TlsError::Read { path, source })
        };
        let cert_pem = read("tls.crt")?;
        let key_pem = read("tls.key")?;
        let ca_pem = match read("ca.crt") {
            Ok(ca) => ca,
            Err(_) => cert_pem.clone(),
        };
        Ok(ServingCert {
            cert_pem,
            key_pem,
            ca_pem,
        })
    }

    /// The rustls server configuration.
    ///
    /// # Errors
    /// [`TlsError::Pem`] or [`TlsError::Rustls`].
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| TlsError::Pem {
                    what: "the webhook certificate".into(),
                    detail: e.to_string(),
                })?;
        if chain.is_empty() {
            return Err(TlsError::Pem {
                what: "the webhook certificate".into(),
                detail: "no CERTIFICATE block".into(),
            });
        }
        let key =
            PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(|e| TlsError::Pem {
                what: "the webhook key".into(),
                detail: e.to_string(),
            })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_certificates_configure_a_server() -> Result<(), TlsError> {
        let cert = ServingCert::generate(&["127.0.0.1".into(), "wasmop.example.svc".into()])?;
        assert!(cert.ca_pem.contains("BEGIN CERTIFICATE"));
        cert.server_config()?;
        Ok(())
    }
}
