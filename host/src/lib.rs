//! wasmop: a WebAssembly-hosted reconcile runtime for Kubernetes.
//!
//! The host watches custom resources, runs an operator author's reconcile module in a fresh
//! sandbox for every reconcile, validates the intents it returns and applies them.
//!
//! The crate's folders follow the host's architecture:
//! - [`contract`]: the host's types for the `wasmop:reconciler@0.1.0` WIT contract.
//! - [`engine`]: the sandbox (the only module that touches wasmtime).
//! - [`crd`]: the WasmReconciler custom resource.
//! - [`modules`]: where a module comes from ([`modules::source`]), the swappable active module
//!   ([`modules::slot`]) and the host's copy of it ([`modules::copy`]).
//! - [`manager`]: one supervised controller per WasmReconciler, module loading and hot swap.
//! - [`controller`]: the reconcile loop of one WasmReconciler: its watches, the checks of a
//!   module's intents, the writes under the module's identity, conditions, and the rules that keep
//!   one reconciler per primary.
//! - [`admission`]: the validating admission webhook, its configuration and TLS.
//! - [`operations`]: leader election, metrics, probes and readiness, and the servers' limits.
//! - [`sharding`]: replicas sharing every WasmReconciler's primaries (membership Leases, the
//!   handover protocol, sharded watches).
//! - [`host`]: the running host (used by `wasmop run` and the end-to-end tests).
//! - [`discovery`]: resolving kinds to API resources.
//! - [`cli`]: the `wasmop` command.

pub mod admission;
pub mod cli;
pub mod contract;
pub mod controller;
pub mod crd;
pub mod discovery;
pub mod engine;
pub mod host;
pub mod manager;
pub mod modules;
pub mod object;
pub mod operations;
pub mod sharding;

/// The version of this host, as built.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
