//! A hostile registry for tests: HTTPS on 127.0.0.1 (its own CA), answering each request as the
//! test says (endless bodies, lying lengths, one byte at a time), counting what it sent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::tls::ServingCert;

/// What the server sends after the status line and headers.
#[derive(Clone)]
pub(crate) enum Body {
    /// These bytes, with their length.
    Bytes(Vec<u8>),
    /// Filler until `limit` bytes or the client goes away, declaring `declared` bytes (none:
    /// read until close).
    Endless { declared: Option<u64>, limit: u64 },
    /// One byte every `every`, declaring 1000 bytes, `count` bytes in all.
    Trickle { every: Duration, count: u64 },
}

/// An answer: status, extra headers and body.
#[derive(Clone)]
pub(crate) struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

impl Answer {
    pub(crate) fn ok(body: &[u8]) -> Answer {
        Answer::with(200, Body::Bytes(body.to_vec()))
    }

    /// 200 with a body trickled a byte every 0.5 s, 1000 bytes: a read that takes ~8 minutes.
    pub(crate) fn trickle() -> Answer {
        Answer::with(
            200,
            Body::Trickle {
                every: Duration::from_millis(500),
                count: 1000,
            },
        )
    }

    pub(crate) fn with(status: u16, body: Body) -> Answer {
        Answer {
            status,
            headers: Vec::new(),
            body,
        }
    }

    pub(crate) fn header(mut self, name: &str, value: String) -> Answer {
        self.headers.push((name.to_string(), value));
        self
    }
}

/// A request: method, path (with its query), `Authorization` header and body (up to 1 MiB, by
/// its Content-Length).
pub(crate) struct Request {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
    pub body: Vec<u8>,
}

/// A running hostile registry.
pub(crate) struct Hostile {
    /// `127.0.0.1:<port>`.
    pub addr: String,
    /// The CA its certificate is signed by.
    pub ca_pem: String,
    /// Body bytes sent so far.
    pub sent: Arc<AtomicU64>,
    /// The paths asked for.
    pub paths: Arc<Mutex<Vec<String>>>,
    /// Notified at each request.
    pub requested: Arc<tokio::sync::Notify>,
}

impl Hostile {
    /// A kube client whose API server is this one (trusting its CA).
    pub(crate) fn kube_client(&self) -> (kube::Client, kube::Config) {
        use rustls_pki_types::pem::PemObject;
        crate::install_crypto_provider();
        let Ok(uri) = format!("https://{}", self.addr).parse() else {
            panic!("a URI")
        };
        let mut config = kube::Config::new(uri);
        let ca = rustls_pki_types::CertificateDer::from_pem_slice(self.ca_pem.as_bytes());
        config.root_cert = Some(ca.into_iter().map(|c| c.to_vec()).collect());
        let Ok(client) = kube::Client::try_from(config.clone()) else {
            panic!("a client")
        };
        (client, config)
    }

    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    pub(crate) fn paths(&self) -> Vec<String> {
        self.paths.lock().map(|p| p.clone()).unwrap_or_default()
    }
}

/// Starts a server answering `route(path)`; `/v2/` answers 200 without a challenge.
pub(crate) async fn start(route: impl Fn(&Request) -> Answer + Send + Sync + 'static) -> Hostile {
    serve(route, None).await
}

/// Starts a server answering `route(path)` that asks for a bearer token: `/v2/` answers 401
/// with `WWW-Authenticate: Bearer realm="https://<addr>/token",service="hostile"` (the realm
/// is routed too).
pub(crate) async fn start_bearer(
    route: impl Fn(&Request) -> Answer + Send + Sync + 'static,
) -> Hostile {
    start_bearer_at(|addr| format!("https://{addr}/token"), route).await
}

/// As [`start_bearer`], with the challenge's realm `realm(addr)`.
pub(crate) async fn start_bearer_at(
    realm: impl Fn(&str) -> String,
    route: impl Fn(&Request) -> Answer + Send + Sync + 'static,
) -> Hostile {
    serve(route, Some(&realm)).await
}

async fn serve(
    route: impl Fn(&Request) -> Answer + Send + Sync + 'static,
    realm: Option<&dyn Fn(&str) -> String>,
) -> Hostile {
    let cert = ServingCert::generate(&["127.0.0.1".to_string()]);
    let Ok(cert) = cert else {
        panic!("a test certificate")
    };
    let Ok(config) = cert.server_config() else {
        panic!("a server config")
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let Ok(listener) = TcpListener::bind("127.0.0.1:0").await else {
        panic!("a listener")
    };
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let sent = Arc::new(AtomicU64::new(0));
    let paths = Arc::new(Mutex::new(Vec::new()));
    let requested = Arc::new(tokio::sync::Notify::new());
    let route = Arc::new(route);
    let bearer = realm.is_some();
    let realm = realm.map(|r| r(&addr)).unwrap_or_default();
    let challenge = format!(r#"Bearer realm="{realm}",service="hostile""#);
    let (s, p, r) = (sent.clone(), paths.clone(), requested.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, route, s, p, r, challenge) = (
                acceptor.clone(),
                route.clone(),
                s.clone(),
                p.clone(),
                r.clone(),
                challenge.clone(),
            );
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Some(request) = read_request(&mut tls).await else {
                    return;
                };
                if let Ok(mut p) = p.lock() {
                    p.push(request.path.clone());
                }
                r.notify_one();
                let answer = if request.path == "/v2/" && bearer {
                    Answer::with(401, Body::Bytes(b"{}".to_vec()))
                        .header("WWW-Authenticate", challenge)
                } else if request.path == "/v2/" {
                    Answer::ok(b"{}")
                } else {
                    route(&request)
                };
                let _ = answer_with(&mut tls, answer, &s).await;
            });
        }
    });
    Hostile {
        addr,
        ca_pem: cert.ca_pem,
        sent,
        paths,
        requested,
    }
}

/// The request: its head (up to 16 KiB), then its body by Content-Length (up to 1 MiB).
async fn read_request(tls: &mut (impl AsyncReadExt + Unpin)) -> Option<Request> {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if data.len() > 16 << 10 {
            return None;
        }
        let n = tls.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&data[..end]).into_owned();
    let mut words = head.split_whitespace();
    let method = words.next()?.to_string();
    let path = words.next()?.to_string();
    let length = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0)
        .min(1 << 20);
    let authorization = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.trim().to_string());
    let mut body = data[end..].to_vec();
    while body.len() < length {
        let n = tls.read(&mut buf).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&buf[..n]);
    }
    Some(Request {
        method,
        path,
        authorization,
        body,
    })
}

async fn answer_with(
    out: &mut (impl AsyncWrite + Unpin),
    answer: Answer,
    sent: &AtomicU64,
) -> std::io::Result<()> {
    let length = match &answer.body {
        Body::Bytes(b) => Some(b.len() as u64),
        Body::Endless { declared, .. } => *declared,
        Body::Trickle { .. } => Some(1000),
    };
    let mut head = format!(
        "HTTP/1.1 {} X\r\nContent-Type: application/json\r\nConnection: close\r\n",
        answer.status
    );
    for (name, value) in &answer.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(n) = length {
        head.push_str(&format!("Content-Length: {n}\r\n"));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes()).await?;
    match answer.body {
        Body::Bytes(b) => {
            out.write_all(&b).await?;
            sent.fetch_add(b.len() as u64, Ordering::SeqCst);
        }
        Body::Endless { limit, .. } => {
            let chunk = vec![b'x'; 64 << 10];
            let mut total = 0;
            while total < limit {
                out.write_all(&chunk).await?;
                total += chunk.len() as u64;
                sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            }
        }
        Body::Trickle { every, count } => {
            for _ in 0..count {
                out.write_all(b"{").await?;
                out.flush().await?;
                sent.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(every).await;
            }
        }
    }
    out.flush().await?;
    out.shutdown().await
}

/// An in-memory registry that stores what is pushed (chunked blob uploads, manifests) and
/// serves it back: a well-behaved registry, for pushes.
#[derive(Clone, Default)]
pub(crate) struct Registry {
    state: Arc<Mutex<Stored>>,
}

#[derive(Default)]
struct Stored {
    uploads: std::collections::HashMap<String, Vec<u8>>,
    blobs: std::collections::HashMap<String, Vec<u8>>,
    manifests: std::collections::HashMap<String, Vec<u8>>,
    next: u64,
}

fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", crate::engine::sha256_hex(bytes))
}

impl Registry {
    /// Stores `body` as a manifest of `repository`, and returns its digest.
    pub(crate) fn put_manifest(&self, repository: &str, body: &[u8]) -> String {
        let digest = digest_of(body);
        if let Ok(mut s) = self.state.lock() {
            s.manifests
                .insert(format!("{repository}/{digest}"), body.to_vec());
        }
        digest
    }

    /// The answer to `request`.
    pub(crate) fn answer(&self, request: &Request) -> Answer {
        let not_found = || {
            Answer::with(
                404,
                Body::Bytes(
                    br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}"#.to_vec(),
                ),
            )
        };
        let Ok(mut s) = self.state.lock() else {
            return not_found();
        };
        let (path, query) = request
            .path
            .split_once('?')
            .unwrap_or((request.path.as_str(), ""));
        let Some(rest) = path.strip_prefix("/v2/") else {
            return not_found();
        };
        let method = request.method.as_str();
        if let Some((repository, _)) = rest.split_once("/blobs/uploads/") {
            let location = |id: &str| format!("/v2/{repository}/blobs/uploads/{id}");
            let id = rest.rsplit('/').next().unwrap_or_default().to_string();
            return match method {
                "POST" => {
                    s.next += 1;
                    let id = s.next.to_string();
                    s.uploads.insert(id.clone(), Vec::new());
                    Answer::with(202, Body::Bytes(Vec::new())).header("Location", location(&id))
                }
                "PATCH" => {
                    s.uploads
                        .entry(id.clone())
                        .or_default()
                        .extend_from_slice(&request.body);
                    Answer::with(202, Body::Bytes(Vec::new())).header("Location", location(&id))
                }
                _ => {
                    let mut data = s.uploads.remove(&id).unwrap_or_default();
                    data.extend_from_slice(&request.body);
                    let digest = query
                        .strip_prefix("digest=")
                        .unwrap_or_default()
                        .replace("%3A", ":");
                    s.blobs.insert(digest.clone(), data);
                    Answer::with(201, Body::Bytes(Vec::new()))
                        .header("Location", format!("/v2/{repository}/blobs/{digest}"))
                }
            };
        }
        if let Some((_, digest)) = rest.split_once("/blobs/") {
            return match s.blobs.get(digest) {
                Some(b) => Answer::ok(b),
                None => not_found(),
            };
        }
        let Some((repository, name)) = rest.split_once("/manifests/") else {
            return not_found();
        };
        if method == "PUT" {
            let digest = digest_of(&request.body);
            for key in [name, digest.as_str()] {
                s.manifests
                    .insert(format!("{repository}/{key}"), request.body.clone());
            }
            return Answer::with(201, Body::Bytes(Vec::new()))
                .header("Location", format!("/v2/{repository}/manifests/{digest}"))
                .header("Docker-Content-Digest", digest);
        }
        match s.manifests.get(&format!("{repository}/{name}")) {
            Some(body) => Answer::ok(body).header("Docker-Content-Digest", digest_of(body)),
            None => not_found(),
        }
    }
}
