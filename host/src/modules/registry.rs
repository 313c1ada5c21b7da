//! Reaching a registry: the reference a module is pulled by and the credentials and CA bundle
//! used to reach it.
//!
//! Both the OCI puller ([`crate::modules::oci`]) and the signature check
//! ([`crate::modules::signature`]) take these, so they live below both: neither of the two
//! imports the other's types.
//!
//! # Guarantees
//! - Every client built here ([`Access::client`]) uses the host's rustls crypto provider (ring)
//!   and bounded connect and read timeouts: a registry that stops sending fails the pull.

use std::time::Duration;

use oci_client::Reference;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;

/// How long a registry may take to accept a connection, and to send the next bytes.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A reference resolved against its digest policy: the repository and the manifest digest to
/// pull.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinned {
    /// The reference by digest (`registry/repository@sha256:...`).
    pub reference: Reference,
    /// The manifest digest (`sha256:<hex>`).
    pub digest: String,
}

impl Pinned {
    /// Where the module came from, for the status: `oci <registry/repository>@<digest>`.
    pub fn origin(&self) -> String {
        format!(
            "oci {}/{}@{}",
            self.reference.registry(),
            self.reference.repository(),
            self.digest
        )
    }
}

/// How to reach and trust a registry.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// Credentials (anonymous when `None`).
    pub auth: Option<(String, String)>,
    /// Extra PEM CA certificates to trust.
    pub ca_pem: Option<String>,
}

impl Access {
    /// The credentials as oci-client takes them.
    pub(crate) fn registry_auth(&self) -> RegistryAuth {
        match &self.auth {
            Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
            None => RegistryAuth::Anonymous,
        }
    }

    /// A fresh oci-client for HTTPS, trusting the extra CA certificates too.
    pub(crate) fn client(&self) -> oci_client::Client {
        // reqwest is built without a crypto provider of its own: use the host's (ring).
        crate::install_crypto_provider();
        let extra_root_certificates = self
            .ca_pem
            .iter()
            .map(|pem| oci_client::client::Certificate {
                encoding: oci_client::client::CertificateEncoding::Pem,
                data: pem.as_bytes().to_vec(),
            })
            .collect();
        oci_client::Client::new(ClientConfig {
            protocol: ClientProtocol::Https,
            extra_root_certificates,
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            ..ClientConfig::default()
        })
    }
}
