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
