//! Running the host in production: leader election, Prometheus metrics, health and readiness
//! probes, the API server's health as a readiness component, the connection limits of the
//! host's servers, the client-side rate limit of its API requests, the transport of its watches
//! (HTTP/2) and writes (HTTP/1.1) to the API server, the JSON log's span fields, and traces over
//! OTLP.

pub mod api_health;
pub mod fields;
pub mod json_fields;
pub mod leader;
pub mod metrics;
pub mod probes;
pub mod ratelimit;
pub mod readiness;
pub mod serving;
pub mod tracing;
pub mod transport;
