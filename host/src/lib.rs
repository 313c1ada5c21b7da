//! wasmop: a WebAssembly-hosted reconcile runtime for Kubernetes.
//!
//! The host watches custom resources, runs an operator author's reconcile module in a fresh
//! sandbox for every reconcile, validates the intents it returns and applies them.

/// The version of this host, as built.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
