//! wasmop: a WebAssembly-hosted reconcile runtime for Kubernetes.
//!
//! The host watches custom resources, runs an operator author's reconcile module in a fresh
//! sandbox for every reconcile, validates the intents it returns and applies them.
//!
//! The crate's folders follow the host's architecture:
//! - [`contract`]: the host's types for the `wasmop:reconciler@0.1.0` WIT contract.
//! - [`engine`]: the sandbox, re-exported from the `wasmop-engine` crate (the only crate that
//!   depends on wasmtime).
//! - [`crd`]: the WasmReconciler custom resource.
//! - [`grant`]: what a reconciler is allowed (kinds, counts of intents, scopes).
//! - [`modules`]: where a module comes from ([`modules::source`]), the swappable active module
//!   ([`modules::slot`]) and the host's copy of it ([`modules::copy`]).
//! - [`manager`]: one supervised controller per WasmReconciler, module loading and hot swap,
//!   its status and conditions, and the release of its finalizers.
//! - [`metacontroller`]: Metacontroller's CompositeControllers served with hook modules.
//! - [`conflict`]: the rule that keeps one reconciler per primary (the manager and the
//!   finalizer webhook both apply it).
//! - [`controller`]: the reconcile loop of one WasmReconciler: its watches, the checks of a
//!   module's intents, the writes under the module's identity.
//! - [`admission`]: the validating admission webhook, the finalizer webhook, their
//!   configurations and TLS.
//! - [`operations`]: leader election, metrics, probes and readiness, and the servers' limits.
//! - [`sharding`]: replicas sharing every WasmReconciler's primaries (membership Leases, the
//!   handover protocol, sharded watches).
//! - [`host`]: the running host (used by `wasmop run` and the end-to-end tests).
//! - [`discovery`]: resolving kinds to API resources.
//! - [`lean`]: objects as the watches keep them (metadata and text, never a `Value` tree).
//! - [`cli`]: the `wasmop` command.
//! - [`text`]: the text helpers every layer shares (inert outside text, cut, short digests, YAML).
//! - [`reasons`]: every condition type and reason the host writes.
//! - [`redact`]: keeping Secret data out of recordings, fixtures and printed diffs.

pub mod admission;
pub mod cli;
pub mod conflict;
pub mod controller;
pub mod crd;
pub mod discovery;
pub mod files;
pub mod grant;
pub mod host;
pub mod lean;
pub mod manager;
pub mod metacontroller;
pub mod modules;
pub mod object;
pub mod operations;
pub mod reasons;
pub mod redact;
pub mod sharding;
pub mod text;
pub mod tls;

/// The sandbox, its own crate ([`wasmop_engine`]): the only one that depends on wasmtime.
pub use wasmop_engine as engine;
/// The host's types for the WIT contract, defined beside the sandbox that converts them.
pub use wasmop_engine::contract;

/// The version of this host, as built.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Makes ring the process's rustls crypto provider, once (later calls do nothing).
///
/// rustls is compiled with two providers: ring (the host's choice: kube, admission, OCI pulls)
/// and aws-lc-rs (which sigstore's `rustls-tls` backend brings in for its crypto). With two,
/// rustls cannot pick a default itself and kube's `ClientConfig::builder()` would panic, so
/// every entry point (`wasmop::cli::run`, [`host::Host::start`], the OCI and signature clients)
/// calls this before building a client.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
