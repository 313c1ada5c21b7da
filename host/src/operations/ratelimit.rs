//! The client-side rate limit of every request the host sends to the API server
//! (`--kube-qps`, `--kube-burst`).
//!
//! kube-rs has no client-side limiter (client-go's QPS/burst), and tower's `RateLimitLayer`
//! keeps its budget per service instance: every clone of a kube [`Client`], and every client
//! the host builds (its own, one impersonating each module's ServiceAccount), would get a budget
//! of its own. The host needs one budget for the whole process, so the limiter is one
//! [`governor`] token bucket (GCRA: `qps` tokens a second, at most `burst` saved up) shared by a
//! small tower layer, [`RateLimitLayer`], that every client of the host is built with
//! ([`client`]).
//!
//! # Guarantees
//! - Over any window, the host starts at most `burst + qps * window` requests, over all its
//!   clients together (watches count once, when they start, as in client-go).
//! - A request waits for its token before it is handed to the connection, in the order the
//!   client's buffer hands them over; nothing is dropped or failed by the limit.
//! - `qps` 0 (the flag `--kube-qps 0`) turns the limit off.
//!
//! Liveness traffic (the leader Lease's renewals, the shard membership Leases, the API-server
//! readiness probe) does not share that budget: it goes through [`liveness_client`], with a
//! small budget of its own and its own connections, so that no amount of work waiting for
//! tokens can hold back a Lease renewal or `/readyz` (a replica that stops renewing loses its
//! Lease and its shards; a replica whose probe waits reports 503 and its webhook loses its
//! endpoints).
//!
//! # Errors
//! [`RateLimitError`] for a `qps` or `burst` that cannot make a bucket; [`client`] fails as
//! `kube::Client::try_from` does.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use kube::Client;

use super::transport::Traffic;

/// The default `--kube-qps` (see docs/operating.md, "Scale", for how it was chosen).
pub const DEFAULT_QPS: f64 = 500.0;
/// The default `--kube-burst`.
pub const DEFAULT_BURST: u32 = 1000;

/// The budget of the liveness client: a Lease renewal every 2 s, shard membership and a probe
/// every 2 s need a few requests a second; this is ten times that, and a bound if they loop.
pub const LIVENESS_QPS: f64 = 20.0;
/// The liveness client's burst.
pub const LIVENESS_BURST: u32 = 40;

/// A `qps` or `burst` that cannot make a bucket.
#[derive(Debug, thiserror::Error)]
pub enum RateLimitError {
    /// Not a finite, non-negative number of requests per second, or too small to refill.
    #[error(
        "--kube-qps {0}: must be 0 (no limit) or a number of requests per second from 0.001 to 1000000"
    )]
    Qps(f64),
    /// A burst of 0 with a limit on.
    #[error("--kube-burst must be at least 1 when --kube-qps is not 0")]
    Burst,
}

/// The process-wide request budget; clones share it.
#[derive(Clone)]
pub struct RateLimit {
    limiter: Arc<DefaultDirectRateLimiter>,
    qps: f64,
    burst: u32,
}

impl std::fmt::Debug for RateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("qps", &self.qps)
            .field("burst", &self.burst)
            .finish()
    }
}

impl RateLimit {
    /// A budget of `qps` requests a second with bursts of `burst`; `None` when `qps` is 0.
    ///
    /// # Errors
    /// See [`RateLimitError`].
    pub fn new(qps: f64, burst: u32) -> Result<Option<Self>, RateLimitError> {
        if qps == 0.0 {
            return Ok(None);
        }
        if !qps.is_finite() || !(1e-3..=1e6).contains(&qps) {
            return Err(RateLimitError::Qps(qps));
        }
        let burst_nz = NonZeroU32::new(burst).ok_or(RateLimitError::Burst)?;
        let quota = Quota::with_period(Duration::from_secs_f64(1.0 / qps))
            .ok_or(RateLimitError::Qps(qps))?
            .allow_burst(burst_nz);
        Ok(Some(RateLimit {
            limiter: Arc::new(RateLimiter::direct(quota)),
            qps,
            burst,
        }))
    }

    /// The layer that makes a client's requests take their token from this budget.
    pub fn layer(&self) -> RateLimitLayer {
        RateLimitLayer {
            limiter: self.limiter.clone(),
        }
    }
}

/// A client for `config` carrying `traffic` ([`super::transport`]) whose requests are counted
/// against `limit` (None: unlimited).
///
/// # Errors
/// As `kube::Client::try_from`.
pub fn client(
    config: kube::Config,
    traffic: Traffic,
    limit: Option<&RateLimit>,
) -> Result<Client, kube::Error> {
    let builder = super::transport::builder(config, traffic)?;
    Ok(match limit {
        Some(limit) => builder.with_layer(&limit.layer()).build(),
        None => builder.build(),
    })
}

/// The client for liveness traffic only (Lease renewals, shard membership, the API-server
/// probe): its own budget ([`LIVENESS_QPS`], [`LIVENESS_BURST`]) and its own connections,
/// whatever `--kube-qps` says and however much work waits for its tokens.
///
/// # Errors
/// As `kube::Client::try_from`.
pub fn liveness_client(config: kube::Config) -> Result<Client, kube::Error> {
    // Valid constants (`the_liveness_budget_is_valid`): the `None` arm is never taken.
    let limit = RateLimit::new(LIVENESS_QPS, LIVENESS_BURST).ok().flatten();
    client(config, Traffic::Watches, limit.as_ref())
}

/// Makes a service take a token of a shared [`RateLimit`] before each request.
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer").finish_non_exhaustive()
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            limiter: self.limiter.clone(),
            waiting: None,
            token: false,
        }
    }
}

type Wait = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A service whose requests each wait for a token (see [`RateLimitLayer`]).
///
/// The token is taken in `poll_ready`, so the service only reports ready with a token in hand
/// (tower's readiness contract: `call` follows a ready `poll_ready`); `call` spends it.
pub struct RateLimited<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
    waiting: Option<Wait>,
    token: bool,
}

impl<S> std::fmt::Debug for RateLimited<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimited")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl<S, R> tower::Service<R> for RateLimited<S>
where
    S: tower::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.token {
            let waiting = self.waiting.get_or_insert_with(|| {
                let limiter = self.limiter.clone();
                Box::pin(async move { limiter.until_ready().await })
            });
            match waiting.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) => {
                    self.waiting = None;
                    self.token = true;
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.token = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::{Layer, Service, ServiceExt};

    /// A service that counts the requests it was handed.
    #[derive(Clone, Default)]
    struct Counting(Arc<AtomicUsize>);

    impl Service<()> for Counting {
        type Response = ();
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<(), Self::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, (): ()) -> Self::Future {
            self.0.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(()))
        }
    }

    #[test]
    fn zero_qps_is_no_limit_and_bad_values_are_refused() {
        assert!(matches!(RateLimit::new(0.0, 0), Ok(None)));
        assert!(matches!(
            RateLimit::new(-1.0, 10),
            Err(RateLimitError::Qps(_))
        ));
        assert!(matches!(
            RateLimit::new(f64::NAN, 10),
            Err(RateLimitError::Qps(_))
        ));
        assert!(matches!(RateLimit::new(5.0, 0), Err(RateLimitError::Burst)));
        assert!(matches!(RateLimit::new(5.0, 10), Ok(Some(_))));
    }

    #[test]
    fn the_liveness_budget_is_valid() {
        assert!(matches!(
            RateLimit::new(LIVENESS_QPS, LIVENESS_BURST),
            Ok(Some(_))
        ));
    }

    /// Two services (two clients) built with the same budget admit `burst` requests together,
    /// then nothing until the bucket refills (one token per 1,000 s here: never during the test).
    #[tokio::test(flavor = "current_thread")]
    async fn clients_share_one_budget_and_wait_beyond_the_burst() {
        let Ok(Some(limit)) = RateLimit::new(0.001, 3) else {
            panic!("a valid limit");
        };
        async fn send(svc: &mut RateLimited<Counting>) {
            let Ok(ready) = ServiceExt::<()>::ready(svc).await;
            let Ok(()) = ready.call(()).await;
        }
        let counted = Counting::default();
        let mut a = limit.layer().layer(counted.clone());
        let mut b = limit.layer().layer(counted.clone());
        send(&mut a).await;
        send(&mut b).await;
        send(&mut a).await;
        assert_eq!(counted.0.load(Ordering::SeqCst), 3, "the burst is admitted");

        // The fourth request, on either client, is not admitted: its readiness stays pending.
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        for svc in [&mut a, &mut b] {
            for _ in 0..10 {
                assert!(
                    Service::<()>::poll_ready(svc, &mut cx).is_pending(),
                    "a request beyond the burst was admitted"
                );
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(counted.0.load(Ordering::SeqCst), 3);
    }
}
