//! wasmop: a WebAssembly-hosted reconcile runtime for Kubernetes.
//!
//! The host watches custom resources, runs an operator author's reconcile module in a fresh
//! sandbox for every reconcile, validates the intents it returns and applies them.
//!
//! - [`contract`]: the host's types for the `wasmop:reconciler@0.1.0` WIT contract.
//! - [`engine`]: the sandbox (the only module that touches wasmtime).
//! - [`intents`]: checks a module's intents before anything is sent to a cluster.
//! - [`crd`]: the WasmReconciler custom resource.
//! - [`manager`]: one supervised controller per WasmReconciler, module loading and hot swap.
//! - [`controller`]: the reconcile loop of one WasmReconciler.
//! - [`apply`]: writes a validated response under the module's identity.
//! - [`slot`]: the swappable active module; [`module_copy`]: the host's copy of it.
//! - [`conflict`], [`release`]: one reconciler per primary; releasing finalizers no one serves.
//! - [`host`]: the running host (used by `wasmop run` and the end-to-end tests).
//! - [`metrics`], [`readiness`], [`probes`]: Prometheus metrics, `/healthz` and `/readyz`.
//! - [`serving`]: connection caps and timeouts of the probe and admission servers.
//! - [`leader`]: leader election on a Lease.
//! - [`admission`], [`webhook_config`], [`webhook_tls`]: the validating admission webhook.
//! - [`cli`]: the `wasmop` command.

pub mod access;
pub mod admission;
pub mod api_health;
pub mod apply;
pub mod cli;
pub mod conditions;
pub mod conflict;
pub mod contract;
pub mod controller;
pub mod crd;
pub mod discovery;
pub mod engine;
pub mod host;
pub mod intents;
pub mod leader;
pub mod manager;
pub mod metrics;
pub mod module_copy;
pub mod probes;
pub mod readiness;
pub mod release;
pub mod serving;
pub mod slot;
pub mod source;
pub mod watches;
pub mod webhook_config;
pub mod webhook_tls;

/// The version of this host, as built.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
