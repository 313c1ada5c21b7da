//! Bounded reads from a registry: a manifest, a blob and an error body, each capped.
//!
//! oci-client and sigstore read manifests, signature layers and error bodies whole; a registry
//! (which a WasmReconciler's creator picks, and which every replica pulls from) could fill the
//! host's memory with an endless body. Every read of a pull and of a signature check goes
//! through a [`Reader`] instead, the bearer token exchange included (oci-client's reads the
//! token answer whole, from a realm the registry names); oci-client is kept for pushes.
//!
//! # Guarantees
//! - A manifest is refused past [`MAX_MANIFEST_BYTES`], a blob past the cap its caller gives, a
//!   token answer past [`MAX_TOKEN_BYTES`]; each as soon as the declared length or the bytes
//!   read pass it, never read to the end.
//! - An error body is read up to [`MAX_ERROR_BYTES`]; the registry's text that reaches a
//!   message is made inert and cut to [`MAX_REGISTRY_TEXT`] bytes ([`registry_text`]).
//! - The body of the `/v2/` probe that asks for the challenge is never read.
//! - The pull Secret's credentials go to a token realm only over HTTPS; a realm that fails
//!   (5xx, 429) is told from one that refuses ([`ReadError::Realm`]).

use oci_client::Reference;
use oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE,
};
use reqwest::header::{ACCEPT, AUTHORIZATION, WWW_AUTHENTICATE};

use crate::engine::{Digested, Hashing};
use crate::modules::registry::{Access, CONNECT_TIMEOUT, READ_TIMEOUT};

/// The largest manifest read (the distribution spec's recommended minimum a registry accepts).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// How much of an error body is read.
pub const MAX_ERROR_BYTES: u64 = 16 << 10;
/// The largest token answer read (registries' tokens are a few KiB).
pub const MAX_TOKEN_BYTES: u64 = 256 << 10;
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
    /// The token realm answered with an error status.
    #[error("{text}")]
    Realm {
        /// The HTTP status.
        status: u16,
        /// What the realm said, inert and cut.
        text: String,
    },
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
            .redirect(reqwest::redirect::Policy::custom(https_only))
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
        let header = match self.token(reference).await? {
            Some(token) => Some(format!("Bearer {token}")),
            None => self.access.auth.as_ref().map(|(user, password)| {
                use base64::Engine as _;
                let pair = format!("{user}:{password}");
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                )
            }),
        };
        self.authorization = Some(header.clone());
        Ok(header)
    }

    /// The bearer token for pulls of `reference`'s repository, when the registry's `/v2/`
    /// answers with a `Bearer` challenge (the distribution spec's token flow, as oci-client's
    /// `Client::auth` does it): the challenge's realm is asked for the `pull` scope with the
    /// basic credentials, if any, and its answer read up to [`MAX_TOKEN_BYTES`].
    async fn token(&self, reference: &Reference) -> Result<Option<String>, ReadError> {
        let probe = format!("https://{}/v2/", reference.resolve_registry());
        // Only the header is wanted: the body is dropped unread.
        let answer = self.http.get(&probe).send().await.map_err(transport)?;
        let Some(challenge) = answer
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_challenge)
        else {
            return Ok(None);
        };
        drop(answer);
        let scope = format!("repository:{}:pull", reference.repository());
        let mut query = vec![("scope", scope.as_str())];
        if let Some(service) = &challenge.service {
            query.push(("service", service));
        }
        let url = reqwest::Url::parse_with_params(&challenge.realm, &query).map_err(|e| {
            ReadError::Auth(registry_text(&format!(
                "the token realm {:?} is not a URL: {e}",
                challenge.realm
            )))
        })?;
        if url.scheme() != "https" && self.access.auth.is_some() {
            return Err(ReadError::Auth(registry_text(&format!(
                "the token realm {} is not https: the pull Secret's credentials are not sent in clear",
                challenge.realm
            ))));
        }
        let mut request = self.http.get(url);
        if let Some((user, password)) = &self.access.auth {
            request = request.basic_auth(user, Some(password));
        }
        let answer = request.send().await.map_err(transport)?;
        if !answer.status().is_success() {
            let status = answer.status().as_u16();
            let body = read_prefix(answer).await;
            let text = String::from_utf8_lossy(&body);
            return Err(ReadError::Realm {
                status,
                text: registry_text(&format!(
                    "the token realm {} answered HTTP {status}: {text}",
                    challenge.realm
                )),
            });
        }
        let body = read_capped(answer, MAX_TOKEN_BYTES, || {
            format!("the token answer of {}", challenge.realm)
        })
        .await?;
        token_of(body.bytes()).map(Some)
    }
}

/// The most redirects followed in one read (reqwest's default).
const MAX_REDIRECTS: usize = 10;

/// Follows a redirect only to HTTPS: a registry or realm served over HTTPS must not send a
/// request (a token exchange with credentials, a read with its token) on in clear.
fn https_only(attempt: reqwest::redirect::Attempt<'_>) -> reqwest::redirect::Action {
    if attempt.url().scheme() != "https" {
        let to = registry_text(attempt.url().as_str());
        return attempt.error(format!("the redirect to {to} is not https: not followed"));
    }
    if attempt.previous().len() >= MAX_REDIRECTS {
        return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
    }
    attempt.follow()
}

/// A registry's `Bearer` challenge: where to ask for a token.
struct BearerChallenge {
    realm: String,
    service: Option<String>,
}

/// The first `Bearer` challenge with a realm in a `WWW-Authenticate` value, if any.
fn bearer_challenge(header: &str) -> Option<BearerChallenge> {
    http_auth::ChallengeParser::new(header)
        .filter_map(Result::ok)
        .filter(|c| c.scheme.eq_ignore_ascii_case("Bearer"))
        .find_map(|c| {
            let param = |name: &str| {
                c.params
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.to_unescaped())
            };
            Some(BearerChallenge {
                realm: param("realm")?,
                service: param("service"),
            })
        })
}

/// The token of a token answer (`token`, or OAuth's `access_token`).
fn token_of(body: &[u8]) -> Result<String, ReadError> {
    #[derive(serde::Deserialize)]
    struct Answer {
        token: Option<String>,
        access_token: Option<String>,
    }
    let answer: Answer = serde_json::from_slice(body).map_err(|e| {
        ReadError::Auth(format!(
            "the token answer is not a token: {}",
            json_error_text(&e)
        ))
    })?;
    answer
        .token
        .or(answer.access_token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ReadError::Auth("the token answer holds no token".into()))
}

/// What kind of JSON error `e` is and where, without the value serde_json's own message
/// quotes (``invalid type: string "..."``), which in a token answer or a pull Secret is a
/// credential.
pub(crate) fn json_error_text(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let kind = match e.classify() {
        Category::Io => "a read error",
        Category::Syntax => "not JSON",
        Category::Data => "JSON of the wrong shape",
        Category::Eof => "JSON cut short",
    };
    format!("{kind} at line {} column {}", e.line(), e.column())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_challenge_names_its_realm_and_service_and_basic_is_none() {
        let c = bearer_challenge(
            r#"Basic realm="x", Bearer realm="https://auth.example/token",service="reg.example""#,
        );
        assert_eq!(
            c.map(|c| (c.realm, c.service)),
            Some((
                "https://auth.example/token".to_string(),
                Some("reg.example".to_string())
            ))
        );
        assert!(bearer_challenge(r#"Basic realm="Registry Realm""#).is_none());
        assert!(bearer_challenge(r#"Bearer service="no realm""#).is_none());
        assert!(bearer_challenge("garbage ,,, \"").is_none());
    }

    #[test]
    fn a_token_answer_gives_its_token_and_errors_quote_nothing_of_it() {
        assert_eq!(token_of(br#"{"token":"a"}"#).ok(), Some("a".into()));
        assert_eq!(token_of(br#"{"access_token":"b"}"#).ok(), Some("b".into()));
        assert!(token_of(br#"{"token":""}"#).is_err());
        let wrong = token_of(br#"{"token":["s3cr3t"]}"#)
            .err()
            .map(|e| e.to_string());
        assert!(
            wrong.as_deref().is_some_and(|m| !m.contains("s3cr3t")),
            "{wrong:?}"
        );
    }
}
