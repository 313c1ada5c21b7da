//! The plain-HTTP server of every replica: `/metrics` (Prometheus), `/healthz` (the process is
//! alive) and `/readyz` (see [`crate::operations::readiness`]).
//!
//! A minimal hyper 1 server: HTTP/1.1, one task per connection, GET only, with the connection
//! cap and read timeout of [`crate::operations::serving`] (`--metrics-max-connections`,
//! `--metrics-read-timeout`).
//!
//! # Guarantees
//! - `/healthz` answers 200 as long as the async runtime runs, also while other clients hold
//!   half-sent requests (up to the connection cap; each is closed after the read timeout).
//! - `/readyz` answers 200 only when [`crate::operations::readiness::Readiness::check`] is Ok, else 503 with
//!   the pending components in the body.
//! - The server stops accepting when its shutdown future resolves; open connections finish.
//!
//! # Errors
//! [`ServeError`] when the address cannot be bound.

use std::convert::Infallible;
use std::net::SocketAddr;

use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tracing::Instrument;

use crate::operations::serving::{self, ServerLimits};

/// A failure to serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The bound address could not be read.
    #[error("cannot read the bound address: {0}")]
    Local(std::io::Error),
}

/// A text response.
pub(crate) fn text(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

fn route(req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => match crate::operations::metrics::encode() {
            Ok(body) => text(
                StatusCode::OK,
                crate::operations::metrics::CONTENT_TYPE,
                body,
            ),
            Err(e) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("{e}\n"),
            ),
        },
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => match crate::operations::readiness::global().check() {
            Ok(()) => text(StatusCode::OK, "text/plain", "ok\n".into()),
            Err(pending) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("not ready: {}\n", pending.join(", ")),
            ),
        },
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

/// Binds `addr`; returns the bound address and the serving future (run it on a task), which
/// serves with `limits`.
///
/// # Errors
/// [`ServeError`].
pub async fn bind(
    addr: SocketAddr,
    limits: ServerLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, impl std::future::Future<Output = ()> + Send), ServeError> {
    let listener =
        serving::listen(addr, &limits).map_err(|source| ServeError::Bind { addr, source })?;
    let local = listener.local_addr().map_err(ServeError::Local)?;
    let http = serving::http1(&limits);
    let serve = serving::accept_loop("probes", listener, limits, shutdown, move |stream, peer| {
        let connection = http.serve_connection(
            TokioIo::new(stream),
            service_fn(|req: Request<Incoming>| async move { Ok::<_, Infallible>(route(&req)) }),
        );
        async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "probe connection");
            }
        }
    })
    .instrument(tracing::info_span!("probes", addr = %local));
    Ok((local, serve))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A client that pipelines requests and never reads the answers: once the socket buffers
    /// are full the server can neither write nor (hyper waits for its writes) read the next
    /// head, so no read timeout closes it. It must not keep its connection slot: with a cap of
    /// one, the kubelet's `/healthz` gets in once the stuck writes time out.
    #[tokio::test]
    async fn a_client_that_never_reads_its_answers_gives_its_connection_up() {
        let limits = ServerLimits {
            max_connections: 1,
            read_timeout: Duration::from_millis(300),
        };
        let Ok(any) = "127.0.0.1:0".parse() else {
            panic!("an address")
        };
        let Ok((addr, serve)) = bind(any, limits, std::future::pending()).await else {
            panic!("the probe server binds")
        };
        tokio::spawn(serve);
        let Ok(mut stuck) = tokio::net::TcpStream::connect(addr).await else {
            panic!("the stuck client connects")
        };
        let requests = b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n".repeat(200_000);
        let writer = tokio::spawn(async move {
            let _ = stuck.write_all(&requests).await;
            stuck
        });
        // Generous: the stuck writes time out after 300 ms; poll for up to 60 s.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut answered = false;
        while !answered && tokio::time::Instant::now() < deadline {
            answered = healthz(addr).await;
            if !answered {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        writer.abort();
        assert!(
            answered,
            "the client that never reads still holds the only connection"
        );
    }

    /// Whether `GET /healthz` on `addr` answers 200 (within 5 s).
    async fn healthz(addr: SocketAddr) -> bool {
        let attempt = async {
            let mut c = tokio::net::TcpStream::connect(addr).await.ok()?;
            c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await
                .ok()?;
            let mut answer = Vec::new();
            c.read_to_end(&mut answer).await.ok()?;
            Some(answer.starts_with(b"HTTP/1.1 200"))
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(5), attempt).await,
            Ok(Some(true))
        )
    }
}
