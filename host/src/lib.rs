//! wasmop: a WebAssembly-hosted reconcile runtime for Kubernetes.
//!
//! The host watches custom resources, runs an operator author's reconcile module in a fresh
//! sandbox for every reconcile, validates the intents it returns and applies them.
//!
//! - [`contract`]: the host's types for the `wasmop:reconciler@0.1.0` WIT contract.
//! - [`engine`]: the sandbox (the only module that touches wasmtime).
//! - [`intents`]: checks a module's intents before anything is sent to a cluster.
//! - [`cli`]: the `wasmop` command.

pub mod cli;
pub mod contract;
pub mod engine;
pub mod intents;

/// The version of this host, as built.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
