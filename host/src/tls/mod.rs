//! The admission webhook's serving certificate: generated at start (a fresh CA and a leaf for the
//! names the API server uses to reach the host) or read from a directory (cert-manager style
//! `tls.crt`, `tls.key`, `ca.crt`).
//!
//! # Guarantees
//! - A generated CA lives only in this process; its certificate is what the host puts in each
//!   webhook's `caBundle`. Several replicas behind one Service must share files
//!   (`--webhook-cert-dir`), since each would otherwise generate its own CA.
//! - The TLS server offers HTTP/1.1 only (ALPN `http/1.1`), TLS 1.2 and 1.3 (ring provider).
//! - Certificates read from a directory are read again when its files change (cert-manager
//!   renews, the kubelet updates the mounted Secret): each new connection is served the newest
//!   pair that loads and matches; a pair that does not (half updated) is logged and the last
//!   good one is served.
//!
//! - The serving certificate's expiry, each time a certificate is loaded (at start and when the
//!   directory's files changed, on the next handshake), is exported as
//!   `wasmop_webhook_certificate_expiry_timestamp_seconds`.
//!
//! - With a [`ClientAuth`] (`--webhook-client-ca`), the server asks every client for a
//!   certificate and ends the handshake of one without an accepted certificate ([`clients`]).
//!
//! # Caveats
//! - The `caBundle` written into the webhook configurations is `ca.crt` as read at start: a
//!   rotated serving certificate signed by the same CA is served at once; a new CA needs a
//!   restart (or a CA injector that keeps `caBundle` in sync).
//!
//! # Errors
//! [`TlsError`] names the file or the step that failed.

pub mod clients;

pub use clients::ClientAuth;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
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
    /// The directory it was read from (read again when its files change).
    dir: Option<PathBuf>,
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
            dir: None,
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
            dir: Some(dir.to_path_buf()),
        })
    }

    /// The rustls server configuration: serving this certificate, or, when it was read from a
    /// directory, the directory's newest; any client may connect.
    ///
    /// # Errors
    /// [`TlsError::Pem`] or [`TlsError::Rustls`].
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        self.server_config_for(None)
    }

    /// As [`ServingCert::server_config`], accepting only the clients `clients` allows (None:
    /// any client).
    ///
    /// # Errors
    /// [`TlsError::Pem`] or [`TlsError::Rustls`]; [`TlsError::Read`] when the client CA file
    /// cannot be read.
    pub fn server_config_for(
        &self,
        clients: Option<&ClientAuth>,
    ) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = Arc::new(self.certified_key(&provider)?);
        let resolver: Arc<dyn ResolvesServerCert> = match &self.dir {
            Some(dir) => Arc::new(Reloading {
                dir: dir.clone(),
                provider: provider.clone(),
                state: Mutex::new((dir_stamp(dir), key)),
            }),
            None => Arc::new(Fixed(key)),
        };
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match clients {
            Some(c) => builder.with_client_cert_verifier(c.verifier(&provider)?),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(resolver);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// The chain and its key, checked to match.
    fn certified_key(&self, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
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
        if let Some(expiry) = not_after(&chain[0]) {
            crate::operations::metrics::global().webhook_certificate_expiry(expiry);
        }
        Ok(CertifiedKey::from_der(chain, key, provider)?)
    }
}

/// When a certificate expires, in Unix seconds (None when it does not parse; rustls then
/// refuses it anyway).
fn not_after(cert: &CertificateDer<'_>) -> Option<i64> {
    use x509_cert::der::Decode as _;
    let cert = x509_cert::Certificate::from_der(cert.as_ref()).ok()?;
    let at = cert
        .tbs_certificate()
        .validity()
        .not_after
        .to_unix_duration();
    i64::try_from(at.as_secs()).ok()
}

/// A certificate that never changes (generated).
#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// What identifies a version of a file: its inode, size and modification time.
type Stamp = Option<(u64, u64, SystemTime)>;

fn stamp(file: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(file).ok()?;
    Some((m.ino(), m.len(), m.modified().ok()?))
}

/// The stamps of a certificate directory's pair.
fn dir_stamp(dir: &Path) -> [Stamp; 2] {
    [stamp(&dir.join("tls.crt")), stamp(&dir.join("tls.key"))]
}

/// The certificate in a directory, read again on the first handshake after its files changed.
#[derive(Debug)]
struct Reloading {
    dir: PathBuf,
    provider: Arc<CryptoProvider>,
    /// The files' stamp last read, and the last good key.
    state: Mutex<([Stamp; 2], Arc<CertifiedKey>)>,
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let now = dir_stamp(&self.dir);
        let mut state = self.state.lock().ok()?;
        if state.0 != now {
            // Read once per change: a bad pair is not read again until the files change again.
            state.0 = now;
            match ServingCert::load(&self.dir).and_then(|c| c.certified_key(&self.provider)) {
                Ok(key) => {
                    tracing::info!(dir = %self.dir.display(), "serving the renewed webhook certificate");
                    state.1 = Arc::new(key);
                }
                Err(e) => {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "the webhook certificate changed but does not load; serving the previous one");
                }
            }
        }
        Some(state.1.clone())
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

    /// Writes `cert` into `dir` the way the kubelet updates a Secret volume: new files renamed
    /// over the old ones.
    fn write(dir: &Path, cert: &ServingCert) {
        for (name, pem) in [
            ("tls.crt", &cert.cert_pem),
            ("tls.key", &cert.key_pem),
            ("ca.crt", &cert.ca_pem),
        ] {
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, pem).unwrap_or_else(|e| panic!("{e}"));
            std::fs::rename(&tmp, dir.join(name)).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    fn der(pem: &str) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The leaf a new connection to `server` is served, trusting `cas`, after a handshake in
    /// memory.
    fn served(server: &Arc<rustls::ServerConfig>, cas: &[&ServingCert]) -> Vec<u8> {
        let mut roots = rustls::RootCertStore::empty();
        for ca in cas {
            roots.add_parsable_certificates(der(&ca.ca_pem));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap_or_else(|e| panic!("{e}"))
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = "localhost".try_into().unwrap_or_else(|e| panic!("{e}"));
        let mut client =
            rustls::ClientConnection::new(Arc::new(client), name).unwrap_or_else(|e| panic!("{e}"));
        let mut server =
            rustls::ServerConnection::new(server.clone()).unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..10 {
            let mut to_server = Vec::new();
            client
                .write_tls(&mut to_server)
                .unwrap_or_else(|e| panic!("{e}"));
            let mut input = &to_server[..];
            while !input.is_empty() {
                server
                    .read_tls(&mut input)
                    .unwrap_or_else(|e| panic!("{e}"));
                server
                    .process_new_packets()
                    .unwrap_or_else(|e| panic!("server: {e}"));
            }
            let mut to_client = Vec::new();
            server
                .write_tls(&mut to_client)
                .unwrap_or_else(|e| panic!("{e}"));
            let mut input = &to_client[..];
            while !input.is_empty() {
                client
                    .read_tls(&mut input)
                    .unwrap_or_else(|e| panic!("{e}"));
                client
                    .process_new_packets()
                    .unwrap_or_else(|e| panic!("client: {e}"));
            }
        }
        assert!(!client.is_handshaking(), "the handshake did not finish");
        client
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.to_vec())
            .unwrap_or_default()
    }

    #[test]
    fn a_certificate_rotated_on_disk_is_served_to_new_connections() -> Result<(), TlsError> {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let first = ServingCert::generate(&["localhost".into()])?;
        write(dir.path(), &first);
        let server = ServingCert::load(dir.path())?.server_config()?;
        let both = [&first, &first];
        assert_eq!(served(&server, &both), der(&first.cert_pem)[0].to_vec());
        // cert-manager renews: the Secret, and so the mounted files, change.
        let renewed = ServingCert::generate(&["localhost".into()])?;
        write(dir.path(), &renewed);
        let both = [&first, &renewed];
        assert!(
            served(&server, &both) == der(&renewed.cert_pem)[0].to_vec(),
            "a new connection is still served the certificate read at start"
        );
        // A half-written pair (a new certificate, the old key) is not served: the last good one is.
        let next = ServingCert::generate(&["localhost".into()])?;
        std::fs::write(dir.path().join("tls.crt"), &next.cert_pem)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(served(&server, &both), der(&renewed.cert_pem)[0].to_vec());
        Ok(())
    }
}
