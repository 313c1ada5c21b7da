//! Bounded reads from a registry: a manifest, a blob and an error body, each capped.
//!
//! oci-client and sigstore read manifests, signature layers and error bodies whole; a registry
//! (which a WasmReconciler's creator picks, and which every replica pulls from) could fill the
//! host's memory with an endless body. Every read of a pull and of a signature check goes
//! through a [`Reader`] instead; oci-client is kept for the token exchange and for pushes.
//!
//! # Guarantees
//! - A manifest is refused past [`MAX_MANIFEST_BYTES`], a blob past the cap its caller gives;
//!   both as soon as the declared length or the bytes read pass it, never read to the end.
//! - An error body is read up to [`MAX_ERROR_BYTES`]; the registry's text that reaches a
//!   message is made inert and cut to [`MAX_REGISTRY_TEXT`] bytes ([`registry_text`]).
//!
//! # Caveats
//! - The bearer token exchange is oci-client's, which reads the token response whole; the
//!   caller's total deadline bounds it in time.

use oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE,
};
use oci_client::{Reference, RegistryOperation};
use reqwest::header::{ACCEPT, AUTHORIZATION};

use crate::engine::{Digested, Hashing};
use crate::modules::registry::{Access, CONNECT_TIMEOUT, READ_TIMEOUT};

/// The largest manifest read (the distribution spec's recommended minimum a registry accepts).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// How much of an error body is read.
pub const MAX_ERROR_BYTES: u64 = 16 << 10;
/// How much of a registry's text reaches a message.
pub const MAX_REGISTRY_TEXT: usize = 512;

/// A read from a registry failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The registry answered with an error status.
    #[error("{url}: HTTP {status}: {text}")]
    Status {
        /// The URL asked.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The error codes of the OCI error envelope, if any.
        codes: Vec<String>,
        /// The registry's text, inert and cut.
        text: String,
    },
    /// The body is larger than the cap.
    #[error("{what} is larger than the cap of {cap} bytes ({seen})")]
    TooLarge {
        /// What was read.
        what: String,
        /// The cap.
        cap: u64,
        /// What gave it away: the declared length or the bytes read.
        seen: String,
    },
    /// The connection failed or timed out.
    #[error("{0}")]
    Transport(String),
    /// The token exchange failed.
    #[error("{0}")]
    Auth(String),
}

impl ReadError {
    /// Whether the registry said the manifest or blob does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Status { status: 404, .. })
            || matches!(self, ReadError::Status { codes, .. } if codes.iter().any(|c| c.ends_with("_UNKNOWN")))
    }
}

/// The registry's own text (an error body, a message), inert and cut to
/// [`MAX_REGISTRY_TEXT`] bytes, as it may reach a condition.
pub fn registry_text(text: &str) -> String {
    crate::text::cut(crate::text::inert(text).into_owned(), MAX_REGISTRY_TEXT)
}

/// Reads from one registry with one set of credentials.
pub struct Reader {
    http: reqwest::Client,
    access: Access,
    authorization: Option<Option<String>>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No credentials in logs.
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

impl Reader {
    /// A reader trusting `access`'s CA bundle too.
    ///
    /// # Errors
    /// [`ReadError::Transport`] when the CA bundle cannot be used or the client not built.
    pub fn new(access: &Access) -> Result<Reader, ReadError> {
        crate::install_crypto_provider();
        let certs = match &access.ca_pem {
            Some(pem) => reqwest::Certificate::from_pem_bundle(pem.as_bytes())
                .map_err(|e| ReadError::Transport(format!("the CA bundle: {e}")))?,
            None => Vec::new(),
        };
        let http = reqwest::Client::builder()
            .tls_certs_merge(certs)
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .build()
            .map_err(|e| ReadError::Transport(format!("cannot build the client: {e}")))?;
        Ok(Reader {
            http,
            access: access.clone(),
            authorization: None,
        })
    }

    /// The manifest `reference` names (by tag or digest), at most [`MAX_MANIFEST_BYTES`], and
    /// the sha256 digest of its bytes.
    ///
    /// # Errors
    /// See [`ReadError`].
    pub async fn manifest(
        &mut self,
        reference: &Reference,
    ) -> Result<(Vec<u8>, String), ReadError> {
        let tag_or_digest = reference
            .digest()
            .or(reference.tag())
            .unwrap_or("latest")
            .to_string();
        let url = self.url(reference, "manifests", &tag_or_digest);
        let accept = [
            OCI_IMAGE_MEDIA_TYPE,
            IMAGE_MANIFEST_MEDIA_TYPE,
            OCI_IMAGE_INDEX_MEDIA_TYPE,
            IMAGE_MANIFEST_LIST_MEDIA_TYPE,
        ]
        .join(", ");
        let response = self.get(reference, &url, Some(accept.as_str())).await?;
        let body = read_capped(response, MAX_MANIFEST_BYTES, || {
            format!("the manifest {url}")
        })
        .await?;
        let digest = format!("sha256:{}", body.sha256());
        Ok((body.into_bytes(), digest))
    }

    /// The blob `digest` of `reference`'s repository, at most `cap` bytes, hashed as it arrived
    /// (comparing that with `digest` is the caller's to do).
    ///
    /// # Errors
    /// See [`ReadError`].
    pub async fn blob(
        &mut self,
        reference: &Reference,
        digest: &str,
        cap: u64,
    ) -> Result<Digested, ReadError> {
        let url = self.url(reference, "blobs", digest);
        let response = self.get(reference, &url, None).await?;
        read_capped(response, cap, || format!("blob {digest}")).await
    }

    fn url(&self, reference: &Reference, kind: &str, name: &str) -> String {
        format!(
            "https://{}/v2/{}/{kind}/{name}",
            reference.resolve_registry(),
            reference.repository()
        )
    }

    /// GETs `url`, authorized; an error status becomes [`ReadError::Status`].
    async fn get(
        &mut self,
        reference: &Reference,
        url: &str,
        accept: Option<&str>,
    ) -> Result<reqwest::Response, ReadError> {
        let authorization = self.authorization(reference).await?;
        let mut request = self.http.get(url);
        if let Some(accept) = accept {
            request = request.header(ACCEPT, accept);
        }
        if let Some(value) = authorization {
            request = request.header(AUTHORIZATION, value);
        }
        let response = request.send().await.map_err(transport)?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(status_error(url, response).await)
    }

    /// The `Authorization` header for `reference`'s repository: a bearer token when the
    /// registry asks for one, else the basic credentials, if any.
    async fn authorization(&mut self, reference: &Reference) -> Result<Option<String>, ReadError> {
        if let Some(known) = &self.authorization {
            return Ok(known.clone());
        }
        let auth = self.access.registry_auth();
        let token = self
            .access
            .client()
            .auth(reference, &auth, RegistryOperation::Pull)
            .await
            .map_err(auth_error)?;
        let header = match (token, &self.access.auth) {
            (Some(token), _) => Some(format!("Bearer {token}")),
            (None, Some((user, password))) => {
                use base64::Engine as _;
                let pair = format!("{user}:{password}");
                Some(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                ))
            }
            (None, None) => None,
        };
        self.authorization = Some(header.clone());
        Ok(header)
    }
}

/// A failed token exchange: a connection that failed is the registry being unreachable, not
/// refused credentials (an outage must not read as `RegistryUnauthorized`).
fn auth_error(e: oci_client::errors::OciDistributionError) -> ReadError {
    match e {
        oci_client::errors::OciDistributionError::RequestError(r) => transport(r),
        other => ReadError::Auth(registry_text(&other.to_string())),
    }
}

/// A transport error with its causes (reqwest's own message says little).
fn transport(e: reqwest::Error) -> ReadError {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    ReadError::Transport(registry_text(&text))
}

/// The body of `response`, refused past `cap` bytes, hashed as it arrives.
async fn read_capped(
    mut response: reqwest::Response,
    cap: u64,
    what: impl Fn() -> String,
) -> Result<Digested, ReadError> {
    if let Some(len) = response.content_length()
        && len > cap
    {
        return Err(ReadError::TooLarge {
            what: what(),
            cap,
            seen: format!("it declares {len} bytes"),
        });
    }
    // Room for the declared length, up to the cap (an 18 MB module is not copied as it grows).
    let declared = response.content_length().unwrap_or(0).min(cap);
    let mut body = Hashing::with_capacity(usize::try_from(declared).unwrap_or(0));
    while let Some(chunk) = response.chunk().await.map_err(transport)? {
        if (body.len() + chunk.len()) as u64 > cap {
            return Err(ReadError::TooLarge {
                what: what(),
                cap,
                seen: format!("more than {cap} bytes were sent"),
            });
        }
        body.extend(&chunk);
    }
    Ok(body.finish())
}

/// At most [`MAX_ERROR_BYTES`] of an error body.
async fn read_prefix(mut response: reqwest::Response) -> Vec<u8> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = (MAX_ERROR_BYTES as usize).saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= MAX_ERROR_BYTES as usize {
            break;
        }
    }
    body
}

/// An error status, with the OCI error envelope's codes and messages if the body has one.
async fn status_error(url: &str, response: reqwest::Response) -> ReadError {
    #[derive(serde::Deserialize)]
    struct Envelope {
        errors: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        code: String,
        #[serde(default)]
        message: String,
    }
    let status = response.status().as_u16();
    let body = read_prefix(response).await;
    let (codes, text) = match serde_json::from_slice::<Envelope>(&body) {
        Ok(envelope) => {
            let codes: Vec<String> = envelope.errors.iter().map(|e| e.code.clone()).collect();
            let text = envelope
                .errors
                .iter()
                .map(|e| format!("{}: {}", e.code, e.message))
                .collect::<Vec<_>>()
                .join("; ");
            (codes, text)
        }
        Err(_) => (Vec::new(), String::from_utf8_lossy(&body).into_owned()),
    };
    ReadError::Status {
        url: registry_text(url),
        status,
        codes,
        text: registry_text(&text),
    }
}
