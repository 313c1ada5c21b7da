//! The host's connections to the API server: HTTP/2 when the server offers it.
//!
//! kube-client's own stack (`kube::Client::try_from`) speaks HTTP/1.1 only, so every watch holds
//! a TLS connection of its own, with its TLS state and read buffers, for as long as it runs: 82
//! connections for a host idle with 20 reconcilers (docs/benchmarks.md, "Idle host memory").
//! [`builder`] makes the same stack (base URI, client-side retries of 429/503/504, credentials,
//! impersonation and extra headers, connect/read/write timeouts) over a connector that offers
//! `h2` and `http/1.1` by ALPN, as client-go does, for the clients that carry the host's watches
//! ([`Traffic::Watches`]): against kube-apiserver, each such client's watches and requests share
//! one HTTP/2 connection (the idle host above: 2 connections). The clients of the modules'
//! writes ([`Traffic::Writes`]) keep HTTP/1.1: with them on HTTP/2 too, 1,000 Apps converged in
//! 43.7-55.8 s against 38.1-39.6 s (docs/benchmarks.md, "HTTP/2 to the API server").
//!
//! # Guarantees
//! - A server that does not choose `h2` at the TLS handshake (a proxy, a plain-HTTP URL) is
//!   spoken to in HTTP/1.1, as before.
//! - An HTTP/2 connection is pinged every [`PING_EVERY`], also while idle, and closed when a ping
//!   goes unanswered for [`PING_TIMEOUT`] (client-go's 30 s and 15 s): an API server that went
//!   away without a FIN or RST is noticed, and every request on it fails and is retried by its
//!   owner (the watches restart), instead of waiting on a dead socket.
//! - Each client keeps its own connections, as before: the liveness client shares nothing with
//!   the work that waits for request tokens ([`super::ratelimit`]).
//!
//! # Caveats
//! - A config with a proxy (`proxy_url`) or an exec credential plugin gets kube-client's own
//!   stack (HTTP/1.1): its proxy tunnels and the expiry of exec-issued client certificates are
//!   kube-client's, not repeated here.
//! - kube-client's per-request debug span (`HTTP`) is not made: the host's spans are per
//!   reconcile (docs/operating.md, "Tracing").
//! - With HTTP/2, one slow or stalled connection holds every request of that client; the
//!   pings above bound how long. A response whose body is never read holds up to its stream's
//!   receive window (2 MiB, hyper's default) of the connection's 5 MiB; the host reads its
//!   watches as their events arrive.

use std::time::Duration;

use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use tower::util::BoxService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

/// How often an HTTP/2 connection to the API server is pinged.
pub const PING_EVERY: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed.
pub const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// The keep-alive pings of an HTTP/2 connection.
#[derive(Clone, Copy, Debug)]
struct Pings {
    every: Duration,
    timeout: Duration,
}

impl Pings {
    /// [`PING_EVERY`], [`PING_TIMEOUT`].
    const DEFAULT: Pings = Pings {
        every: PING_EVERY,
        timeout: PING_TIMEOUT,
    };
}

/// What a client carries, which decides the protocol it offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Traffic {
    /// Long-lived watches and the host's own requests: `h2` offered, one connection for all.
    Watches,
    /// Many short writes at once (a module's applies, status and Events): HTTP/1.1, a
    /// connection per request in flight, as kube-client builds it.
    Writes,
}

/// The service a [`kube::Client`] is built on, as kube-client's own.
pub type Service = BoxService<http::Request<Body>, http::Response<Box<DynBody>>, BoxError>;

/// A client builder for `config` carrying `traffic` (see the module docs).
///
/// # Errors
/// As `kube::Client::try_from`: unusable credentials, certificates or headers.
pub fn builder(
    config: kube::Config,
    traffic: Traffic,
) -> Result<ClientBuilder<Service>, kube::Error> {
    match traffic {
        Traffic::Watches => builder_with(config, Pings::DEFAULT),
        Traffic::Writes => ClientBuilder::try_from(config),
    }
}

/// [`builder`] for [`Traffic::Watches`], with `pings`.
fn builder_with(config: kube::Config, pings: Pings) -> Result<ClientBuilder<Service>, kube::Error> {
    if config.proxy_url.is_some() || config.auth_info.exec.is_some() {
        return ClientBuilder::try_from(config);
    }
    let client: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(pings.every)
            .http2_keep_alive_timeout(pings.timeout)
            .http2_keep_alive_while_idle(true)
            .build(connector(&config)?);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| tower::retry::RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(client)
        .map_response(|r: http::Response<hyper::body::Incoming>| r.map(to_dyn_body))
        .boxed();
    Ok(ClientBuilder::new(service, config.default_namespace))
}

/// A response body as kube-client's own stack boxes it.
fn to_dyn_body(body: hyper::body::Incoming) -> Box<DynBody> {
    Box::new(http_body_util::BodyExt::map_err(body, BoxError::from))
}

/// TLS (offering `h2` and `http/1.1`) or plain TCP, with `config`'s timeouts.
fn connector(
    config: &kube::Config,
) -> Result<TimeoutConnector<hyper_rustls::HttpsConnector<HttpConnector>>, kube::Error> {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    let tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    let tls = match &config.tls_server_name {
        Some(name) => {
            let name = rustls_pki_types::ServerName::try_from(name.clone()).map_err(|e| {
                kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e))
            })?;
            tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => tls,
    };
    let mut connector =
        TimeoutConnector::new(tls.enable_http1().enable_http2().wrap_connector(tcp));
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    Ok(connector)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use http_body_util::Full;
    use hyper::body::{Bytes, Incoming};
    use hyper_util::rt::TokioIo;
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    use tokio::net::TcpListener;
    use tokio::sync::Barrier;

    use super::*;
    use crate::tls::ServingCert;

    /// Requests sent at once: each is answered only when all have arrived.
    const AT_ONCE: usize = 3;

    /// What a test API server saw.
    #[derive(Default)]
    struct Seen {
        /// Connections accepted so far.
        connections: AtomicUsize,
        /// Each request's protocol and the connection (by its order of acceptance) it came on.
        requests: Mutex<Vec<(http::Version, usize)>>,
    }

    impl Seen {
        fn versions(&self) -> Vec<http::Version> {
            let requests = self.requests.lock().map(|r| r.clone()).unwrap_or_default();
            requests.into_iter().map(|(v, _)| v).collect()
        }

        /// How many connections carried requests (a client whose concurrent first requests
        /// race to connect may open more, and close all but the one that won).
        fn connections_used(&self) -> usize {
            let requests = self.requests.lock().map(|r| r.clone()).unwrap_or_default();
            let used: std::collections::BTreeSet<usize> =
                requests.into_iter().map(|(_, c)| c).collect();
            used.len()
        }
    }

    /// A TLS listener on 127.0.0.1 (its own CA) choosing among `alpn`: its URL, CA, socket and
    /// acceptor.
    async fn listen(alpn: &[&[u8]]) -> (String, String, TcpListener, tokio_rustls::TlsAcceptor) {
        let Ok(cert) = ServingCert::generate(&["127.0.0.1".to_string()]) else {
            panic!("a test certificate")
        };
        let Ok(config) = cert.server_config() else {
            panic!("a server config")
        };
        let mut config = (*config).clone();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let Ok(listener) = TcpListener::bind("127.0.0.1:0").await else {
            panic!("a listener")
        };
        let addr = listener
            .local_addr()
            .map_or(String::new(), |a| a.to_string());
        (format!("https://{addr}"), cert.ca_pem, listener, acceptor)
    }

    /// A TLS server offering `alpn`, answering `{}` to each request once [`AT_ONCE`] requests
    /// are in; its URL, CA and what it saw.
    async fn server(alpn: &[&[u8]]) -> (String, String, Arc<Seen>) {
        let (url, ca, listener, acceptor) = listen(alpn).await;
        let (seen, barrier) = (Arc::new(Seen::default()), Arc::new(Barrier::new(AT_ONCE)));
        let s = seen.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let connection = s.connections.fetch_add(1, Ordering::SeqCst);
                let serving = serve(
                    acceptor.clone(),
                    tcp,
                    s.clone(),
                    barrier.clone(),
                    connection,
                );
                tokio::spawn(serving);
            }
        });
        (url, ca, seen)
    }

    /// One connection, in the protocol its TLS handshake chose.
    async fn serve(
        acceptor: tokio_rustls::TlsAcceptor,
        tcp: tokio::net::TcpStream,
        seen: Arc<Seen>,
        barrier: Arc<Barrier>,
        connection: usize,
    ) {
        let Ok(tls) = acceptor.accept(tcp).await else {
            return;
        };
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
            let (seen, barrier) = (seen.clone(), barrier.clone());
            async move {
                if let Ok(mut r) = seen.requests.lock() {
                    r.push((req.version(), connection));
                }
                barrier.wait().await;
                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"{}"))))
            }
        });
        let io = TokioIo::new(tls);
        let _ = if h2 {
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(io, service)
                .await
        } else {
            hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await
        };
    }

    /// A config for the server at `url` whose certificate `ca` signed.
    fn config_for(url: &str, ca: &str) -> kube::Config {
        crate::install_crypto_provider();
        let Ok(uri) = url.parse() else {
            panic!("a URI")
        };
        let mut config = kube::Config::new(uri);
        config.root_cert = Some(
            CertificateDer::pem_slice_iter(ca.as_bytes())
                .filter_map(Result::ok)
                .map(|c| c.to_vec())
                .collect(),
        );
        config
    }

    /// `GET /version`.
    fn version() -> http::Request<Vec<u8>> {
        let Ok(req) = http::Request::get("/version").body(Vec::new()) else {
            panic!("a request")
        };
        req
    }

    /// Sends [`AT_ONCE`] requests at once through a client made by [`builder`] for `traffic`;
    /// what the server saw.
    async fn requests_at_once(alpn: &[&[u8]], traffic: Traffic) -> Arc<Seen> {
        let (url, ca, seen) = server(alpn).await;
        let client = match builder(config_for(&url, &ca), traffic) {
            Ok(b) => b.build(),
            Err(e) => panic!("a client: {e}"),
        };
        let calls = (0..AT_ONCE).map(|_| client.request_text(version()));
        for answer in futures::future::join_all(calls).await {
            assert_eq!(answer.ok().as_deref(), Some("{}"));
        }
        seen
    }

    #[tokio::test]
    async fn an_api_server_offering_h2_gets_concurrent_requests_on_one_http2_connection() {
        let seen = requests_at_once(&[b"h2", b"http/1.1"], Traffic::Watches).await;
        assert_eq!(seen.versions(), vec![http::Version::HTTP_2; AT_ONCE]);
        assert_eq!(seen.connections_used(), 1);
    }

    #[tokio::test]
    async fn a_client_of_writes_keeps_http1_and_a_connection_per_request_in_flight() {
        let seen = requests_at_once(&[b"h2", b"http/1.1"], Traffic::Writes).await;
        assert_eq!(seen.versions(), vec![http::Version::HTTP_11; AT_ONCE]);
        assert_eq!(seen.connections_used(), AT_ONCE);
    }

    #[tokio::test]
    async fn a_server_without_h2_is_spoken_to_in_http1() {
        let seen = requests_at_once(&[], Traffic::Watches).await;
        assert_eq!(seen.versions(), vec![http::Version::HTTP_11; AT_ONCE]);
        assert_eq!(seen.connections_used(), AT_ONCE);
    }

    #[tokio::test]
    async fn a_request_on_an_http2_connection_whose_peer_went_silent_fails_after_an_unanswered_ping()
     {
        // A peer that chose h2, then never reads nor answers: gone without a FIN or RST.
        let (url, ca, listener, acceptor) = listen(&[b"h2"]).await;
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((tcp, _)) = listener.accept().await {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    held.push(tls);
                }
            }
        });
        let pings = Pings {
            every: Duration::from_millis(200),
            timeout: Duration::from_millis(500),
        };
        let client = match builder_with(config_for(&url, &ca), pings) {
            Ok(b) => b.build(),
            Err(e) => panic!("a client: {e}"),
        };
        // Far above the pings' 0.7 s: a loaded machine's delays must not fail it; without the
        // pings the request waits forever and this bound is what ends it.
        let bound = Duration::from_secs(60);
        let answer = tokio::time::timeout(bound, client.request_text(version())).await;
        silent.abort();
        assert!(
            matches!(answer, Ok(Err(_))),
            "the request failed when its connection's ping went unanswered: {answer:?}"
        );
    }
}
