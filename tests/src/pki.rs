//! The certificates and keys of a throwaway cluster.
//!
//! One CA signs the apiserver's serving certificate (SANs `localhost`, `127.0.0.1`, and the
//! in-cluster `kubernetes.default*` names) and an admin client certificate in group
//! `system:masters`. A separate key signs service-account tokens. A second CA, trusted by
//! nothing of the cluster's own, signs the client certificate the apiserver presents to
//! admission webhooks ([`WEBHOOK_CLIENT_NAME`]): a webhook that trusts that CA knows the caller
//! is the apiserver, and the cluster's own client certificates (the admin's) do not pass for it.
//! All keys are ECDSA P-256.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::error::{Error, Result};

/// The common name of the client certificate the apiserver presents to admission webhooks.
pub const WEBHOOK_CLIENT_NAME: &str = "kube-apiserver-webhook-client";

/// Paths of the PEM files written by [`Pki::write`].
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA certificate clients and servers trust.
    pub ca_cert: PathBuf,
    /// The CA's private key (lets tests sign more client certificates).
    pub ca_key: PathBuf,
    /// The apiserver's serving certificate.
    pub server_cert: PathBuf,
    /// The apiserver's serving key.
    pub server_key: PathBuf,
    /// The admin client certificate (`system:masters`).
    pub admin_cert: PathBuf,
    /// The admin client key.
    pub admin_key: PathBuf,
    /// The service-account token signing key.
    pub service_account_key: PathBuf,
    /// Its public half, with which the apiserver verifies tokens.
    pub service_account_pub: PathBuf,
    /// The CA of [`Pki::webhook_client_cert`] (a webhook's `--webhook-client-ca`).
    pub webhook_client_ca: PathBuf,
    /// The client certificate the apiserver presents to admission webhooks (CN
    /// [`WEBHOOK_CLIENT_NAME`]).
    pub webhook_client_cert: PathBuf,
    /// Its key.
    pub webhook_client_key: PathBuf,
}

impl Pki {
    /// Generates every key and certificate and writes them as PEM files into `dir`.
    ///
    /// # Errors
    /// [`Error::Pki`] if generation fails, [`Error::Io`] if a file cannot be written.
    pub fn write(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).map_err(Error::io("creating", dir))?;
        let write = |name: &str, pem: String| -> Result<PathBuf> {
            let path = dir.join(name);
            fs::write(&path, pem).map_err(Error::io("writing", &path))?;
            Ok(path)
        };

        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "wasmop-testenv-ca");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca_cert_path = write("ca.crt", ca_cert.pem())?;
        let ca_key_path = write("ca.key", ca_key.serialize_pem())?;
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate()?;
        let mut server_params = CertificateParams::new(vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
            "kubernetes.default.svc.cluster.local".to_string(),
        ])?;
        server_params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        server_params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let server_cert = server_params.signed_by(&server_key, &issuer)?;

        let (admin_cert, admin_key) = client_cert(&issuer, "wasmop-admin", &["system:masters"])?;

        let (webhook_ca, webhook_cert, webhook_key) = webhook_client()?;
        let sa_key = KeyPair::generate()?;
        Ok(Pki {
            ca_cert: ca_cert_path,
            ca_key: ca_key_path,
            server_cert: write("apiserver.crt", server_cert.pem())?,
            server_key: write("apiserver.key", server_key.serialize_pem())?,
            admin_cert: write("admin.crt", admin_cert)?,
            admin_key: write("admin.key", admin_key)?,
            service_account_key: write("service-account.key", sa_key.serialize_pem())?,
            service_account_pub: write("service-account.pub", sa_key.public_key_pem())?,
            webhook_client_ca: write("webhook-client-ca.crt", webhook_ca)?,
            webhook_client_cert: write("webhook-client.crt", webhook_cert)?,
            webhook_client_key: write("webhook-client.key", webhook_key)?,
        })
    }
}

/// A CA of its own and the apiserver's webhook client certificate signed by it; returns (CA
/// PEM, cert PEM, key PEM). The CA's key is dropped: nothing else is ever signed with it.
fn webhook_client() -> Result<(String, String, String)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "wasmop-testenv-webhook-client-ca");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = params.self_signed(&key)?;
    let issuer = Issuer::new(params, key);
    let (cert, key) = client_cert(&issuer, WEBHOOK_CLIENT_NAME, &[])?;
    Ok((ca.pem(), cert, key))
}

/// Issues a client certificate for user `common_name` in `groups`; returns (cert PEM, key PEM).
fn client_cert(
    issuer: &Issuer<'_, KeyPair>,
    common_name: &str,
    groups: &[&str],
) -> Result<(String, String)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    for group in groups {
        params
            .distinguished_name
            .push(DnType::OrganizationName, *group);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}
