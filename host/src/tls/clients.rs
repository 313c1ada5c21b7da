//! Who may call the admission webhook. With `--webhook-client-ca`, only a client presenting a
//! certificate signed by a CA of that PEM file: the API server, which presents one when its
//! admission configuration's webhook kubeconfig holds it (docs/operating.md, "Authenticating
//! the API server"). With `--webhook-client-name`, that certificate must also carry one of the
//! names, as its common name or a DNS name of its subjectAltName.
//!
//! # Guarantees
//! - A client without such a certificate fails the TLS handshake: the server reads no request
//!   of it and judges nothing.
//! - The certificate must be valid now, chain to a CA of the file and allow client
//!   authentication (extended key usage `clientAuth`); the chain is checked by webpki.
//! - The CA file is read again on the first handshake after it changed (its inode, size or
//!   modification time, as the serving certificate's files are): a new CA bundle applies to new
//!   connections without a restart. A file that does not load (empty, half written, gone) is
//!   logged and the CAs last read keep being used.
//!
//! # Caveats
//! - The certificate request hints no CA names (the list would change with the file): a client
//!   sends the certificate it has, and the API server has one for the webhooks it matches.
//! - No revocation lists: to shut out a leaked client key, replace the CA (and the API server's
//!   certificate), or list only the new certificate's name in `--webhook-client-name`.
//! - Without `--webhook-client-name` every certificate the CA signed for client authentication
//!   passes: use a CA that signs nothing but the API server's webhook certificate, not the
//!   cluster's client CA (which signs every user's and node's certificate).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::UnixTime;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::{Stamp, TlsError, stamp};

/// The clients the webhook accepts: certificates signed by a CA of `ca_file`, carrying one of
/// `names` when it is not empty.
#[derive(Debug, Clone)]
pub struct ClientAuth {
    /// A PEM file of CA certificates.
    pub ca_file: PathBuf,
    /// Common names or DNS subjectAltNames accepted (empty: any).
    pub names: Vec<String>,
}

impl ClientAuth {
    /// The verifier for a server configuration: reads the CA file now (so a bad one stops the
    /// start) and again whenever it changes.
    ///
    /// # Errors
    /// [`TlsError::Read`] or [`TlsError::Pem`] when the file holds no usable CA.
    pub fn verifier(
        &self,
        provider: &Arc<CryptoProvider>,
    ) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
        let inner = webpki_verifier(&self.ca_file, provider)?;
        Ok(Arc::new(Verifier {
            auth: self.clone(),
            provider: provider.clone(),
            state: Mutex::new((stamp(&self.ca_file), inner)),
        }))
    }
}

/// webpki's verifier for the CAs in `file`.
fn webpki_verifier(
    file: &Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let what = || format!("the webhook client CA {}", file.display());
    let pem = std::fs::read(file).map_err(|source| TlsError::Read {
        path: file.to_path_buf(),
        source,
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| TlsError::Pem {
            what: what(),
            detail: e.to_string(),
        })?;
        roots.add(cert)?;
    }
    if roots.is_empty() {
        return Err(TlsError::Pem {
            what: what(),
            detail: "no CERTIFICATE block".into(),
        });
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .clear_root_hint_subjects()
        .build()
        .map_err(|e| TlsError::Pem {
            what: what(),
            detail: e.to_string(),
        })
}

/// Checks client certificates with the CAs last read from the file, and their names.
#[derive(Debug)]
struct Verifier {
    auth: ClientAuth,
    provider: Arc<CryptoProvider>,
    /// The file's stamp last read, and the verifier of the last good CAs.
    state: Mutex<(Stamp, Arc<dyn ClientCertVerifier>)>,
}

impl Verifier {
    /// The verifier of the file's newest CAs that load.
    fn current(&self) -> Result<Arc<dyn ClientCertVerifier>, rustls::Error> {
        let now = stamp(&self.auth.ca_file);
        let mut state = self
            .state
            .lock()
            .map_err(|_| rustls::Error::General("the client CA lock is poisoned".into()))?;
        if state.0 != now {
            // Read once per change: a bad file is not read again until it changes again.
            state.0 = now;
            let file = self.auth.ca_file.display();
            match webpki_verifier(&self.auth.ca_file, &self.provider) {
                Ok(v) => {
                    tracing::info!(file = %file, "using the changed webhook client CA");
                    state.1 = v;
                }
                Err(e) => {
                    tracing::warn!(file = %file, error = %e, "the webhook client CA changed but does not load; using the previous one");
                }
            }
        }
        Ok(state.1.clone())
    }

    /// Refuses a certificate without one of the accepted names (when any are set).
    fn check_name(&self, end_entity: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        if self.auth.names.is_empty() {
            return Ok(());
        }
        let presented = names_of(end_entity);
        let known = presented
            .iter()
            .any(|p| self.auth.names.iter().any(|n| n.eq_ignore_ascii_case(p)));
        if known {
            return Ok(());
        }
        tracing::debug!(presented = ?presented, "a webhook client certificate without an accepted name");
        Err(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName,
        ))
    }
}

/// A certificate's common names and the DNS names of its subjectAltName (none when it does not
/// parse; webpki has parsed it already).
fn names_of(der: &[u8]) -> Vec<String> {
    use x509_cert::der::Decode as _;
    use x509_cert::ext::pkix::SubjectAltName;
    use x509_cert::ext::pkix::name::GeneralName;
    let Ok(cert) = x509_cert::Certificate::from_der(der) else {
        return Vec::new();
    };
    let tbs = cert.tbs_certificate();
    let mut names = Vec::new();
    if let Ok(Some(cn)) = tbs.subject().common_name() {
        names.push(cn.value().into_owned());
    }
    if let Ok(Some((_, san))) = tbs.get_extension::<SubjectAltName>() {
        names.extend(san.0.iter().filter_map(|g| match g {
            GeneralName::DnsName(d) => Some(d.as_str().to_string()),
            _ => None,
        }));
    }
    names
}

impl ClientCertVerifier for Verifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .current()?
            .verify_client_cert(end_entity, intermediates, now)?;
        self.check_name(end_entity)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::ServingCert;
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };

    fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
        r.unwrap_or_else(|e| panic!("{e}"))
    }

    /// A CA: its PEM and its issuer.
    fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
        let key = ok(KeyPair::generate());
        let mut params = ok(CertificateParams::new(Vec::<String>::new()));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let cert = ok(params.self_signed(&key));
        (cert.pem(), Issuer::new(params, key))
    }

    /// A certificate `issuer` signed for common name `cn`, DNS names `dns` and `usage`: its
    /// chain and key for a client.
    fn leaf(
        issuer: &Issuer<'_, KeyPair>,
        cn: &str,
        dns: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> (
        Vec<CertificateDer<'static>>,
        rustls_pki_types::PrivateKeyDer<'static>,
    ) {
        let key = ok(KeyPair::generate());
        let names: Vec<String> = dns.iter().map(|d| d.to_string()).collect();
        let mut params = ok(CertificateParams::new(names));
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        let cert = ok(params.signed_by(&key, issuer));
        let der = rustls_pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
        (vec![cert.der().clone()], der.into())
    }

    fn client_leaf(issuer: &Issuer<'_, KeyPair>, cn: &str) -> Client {
        Some(leaf(issuer, cn, &[], ExtendedKeyUsagePurpose::ClientAuth))
    }

    type Client = Option<(
        Vec<CertificateDer<'static>>,
        rustls_pki_types::PrivateKeyDer<'static>,
    )>;

    /// A full handshake in memory between `server` and a client presenting `client` (or no
    /// certificate): the first error of either side.
    fn handshake(
        server: &Arc<rustls::ServerConfig>,
        serving: &ServingCert,
        client: Client,
    ) -> Result<(), rustls::Error> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(serving.ca_pem.as_bytes()) {
            ok(roots.add(ok(c)));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ok(rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions())
        .with_root_certificates(roots);
        let config = match client {
            Some((chain, key)) => ok(builder.with_client_auth_cert(chain, key)),
            None => builder.with_no_client_auth(),
        };
        let name = ok("localhost".try_into());
        let mut client = ok(rustls::ClientConnection::new(Arc::new(config), name));
        let mut server = ok(rustls::ServerConnection::new(server.clone()));
        for _ in 0..10 {
            let mut wire = Vec::new();
            ok(client.write_tls(&mut wire));
            let mut input = &wire[..];
            while !input.is_empty() {
                ok(server.read_tls(&mut input));
                server.process_new_packets()?;
            }
            let mut wire = Vec::new();
            ok(server.write_tls(&mut wire));
            let mut input = &wire[..];
            while !input.is_empty() {
                ok(client.read_tls(&mut input));
                client.process_new_packets()?;
            }
            if !server.is_handshaking() && !client.is_handshaking() {
                return Ok(());
            }
        }
        Err(rustls::Error::General(
            "the handshake did not finish".into(),
        ))
    }

    fn server(dir: &Path, serving: &ServingCert, names: &[&str]) -> Arc<rustls::ServerConfig> {
        let auth = ClientAuth {
            ca_file: dir.join("clients.pem"),
            names: names.iter().map(|n| n.to_string()).collect(),
        };
        ok(serving.server_config_for(Some(&auth)))
    }

    #[test]
    fn only_clients_with_a_certificate_of_the_ca_finish_the_handshake() {
        let dir = ok(tempfile::tempdir());
        let serving = ok(ServingCert::generate(&["localhost".into()]));
        let (api_ca, api) = ca("apiserver-clients");
        let (_, other) = ca("someone-else");
        ok(std::fs::write(dir.path().join("clients.pem"), &api_ca));
        let server = server(dir.path(), &serving, &[]);
        assert!(handshake(&server, &serving, client_leaf(&api, "kube-apiserver")).is_ok());
        let none = handshake(&server, &serving, None);
        assert!(
            matches!(none, Err(rustls::Error::NoCertificatesPresented)),
            "{none:?}"
        );
        let stranger = handshake(&server, &serving, client_leaf(&other, "kube-apiserver"));
        assert!(
            matches!(stranger, Err(rustls::Error::InvalidCertificate(_))),
            "{stranger:?}"
        );
        // A certificate of the CA for servers only is no client certificate.
        let serving_only = leaf(
            &api,
            "kube-apiserver",
            &[],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        assert!(handshake(&server, &serving, Some(serving_only)).is_err());
    }

    #[test]
    fn with_names_the_certificate_must_carry_one_as_common_name_or_dns_name() {
        let dir = ok(tempfile::tempdir());
        let serving = ok(ServingCert::generate(&["localhost".into()]));
        let (api_ca, api) = ca("cluster-clients");
        ok(std::fs::write(dir.path().join("clients.pem"), &api_ca));
        let server = server(
            dir.path(),
            &serving,
            &["kube-apiserver", "apiserver.example"],
        );
        assert!(handshake(&server, &serving, client_leaf(&api, "kube-apiserver")).is_ok());
        let by_dns = leaf(
            &api,
            "x",
            &["apiserver.example"],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        assert!(handshake(&server, &serving, Some(by_dns)).is_ok());
        // Another client of the same CA (a user, a node) is refused.
        let user = handshake(&server, &serving, client_leaf(&api, "jane"));
        assert!(
            matches!(
                user,
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                ))
            ),
            "{user:?}"
        );
    }

    #[test]
    fn a_changed_ca_file_applies_to_new_handshakes_and_a_broken_one_is_ignored() {
        let dir = ok(tempfile::tempdir());
        let file = dir.path().join("clients.pem");
        let serving = ok(ServingCert::generate(&["localhost".into()]));
        let (first_ca, first) = ca("first");
        let (second_ca, second) = ca("second");
        ok(std::fs::write(&file, &first_ca));
        let server = server(dir.path(), &serving, &[]);
        assert!(handshake(&server, &serving, client_leaf(&first, "a")).is_ok());
        assert!(handshake(&server, &serving, client_leaf(&second, "a")).is_err());
        // Rotated: written to a new file and renamed over the old one.
        let tmp = dir.path().join(".clients.pem.tmp");
        ok(std::fs::write(&tmp, &second_ca));
        ok(std::fs::rename(&tmp, &file));
        assert!(handshake(&server, &serving, client_leaf(&second, "a")).is_ok());
        assert!(handshake(&server, &serving, client_leaf(&first, "a")).is_err());
        // Half written: the CAs last read stay in use.
        ok(std::fs::write(&file, "-----BEGIN CERTIFICATE-----\nMII"));
        assert!(handshake(&server, &serving, client_leaf(&second, "a")).is_ok());
        assert!(handshake(&server, &serving, client_leaf(&first, "a")).is_err());
    }

    #[test]
    fn a_file_without_a_ca_stops_the_start() {
        let dir = ok(tempfile::tempdir());
        let serving = ok(ServingCert::generate(&["localhost".into()]));
        let auth = |name: &str| ClientAuth {
            ca_file: dir.path().join(name),
            names: Vec::new(),
        };
        ok(std::fs::write(dir.path().join("empty.pem"), ""));
        assert!(matches!(
            serving.server_config_for(Some(&auth("missing.pem"))),
            Err(TlsError::Read { .. })
        ));
        assert!(matches!(
            serving.server_config_for(Some(&auth("empty.pem"))),
            Err(TlsError::Pem { .. })
        ));
    }
}
