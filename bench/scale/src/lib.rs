//! `make bench-scale`: how long N image-updater Apps take to converge, and what the controller
//! costs, for wasmop and for what users would pick instead, each on a fresh local control plane.
//!
//! Contenders ([`contenders::Contender`]):
//! - `wasmop`: `wasmop run` as a child process with the image-updater module, registered by the
//!   example's WasmReconciler.
//! - `kube-rs`: the same logic (the image-updater crate as an rlib, called through
//!   `wasmop_sdk::Reconciler`) driven by kube-runtime's `Controller` (the `scale-kube-rs` binary).
//! - `controller-runtime`: the same logic as a small Go operator (bench/controller-runtime),
//!   built once and cached under `~/.cache/wasmop/bin`.
//! - `floor`: a bare client that applies the N Deployments and N Services and writes the N
//!   statuses (the `scale-floor` binary), the best of a few concurrency settings.
//! - `wasmop-sharded` (rows `wasmop x1`, `x2`, `x3`): k `wasmop run --shards auto` replicas
//!   sharing Apps spread over namespaces, on a control plane with `ShardedListAndWatch` on;
//!   measured per replica.
//! - `wasmop-metacontroller`: `wasmop run` as for `wasmop` (same binary, same flags), serving the
//!   same logic written as a Metacontroller sync hook in JavaScript (bench/scale/hooks), built
//!   with `scripts/js-module.sh hook`, pushed to a registry of the run's own and served through a
//!   CompositeController with `spec.wasmop`: what Metacontroller compatibility costs.
//!
//! For each: time from the first create to convergence (seen through watches of Apps,
//! Deployments and Services), peak RSS (of start-up, and of the work after it: the peak is reset
//! before the Apps are created) and CPU seconds of the controller process (from /proc),
//! API requests by verb and resource during convergence and while idle (from the API server's
//! `apiserver_request_total`). Over time, for the charts: converged Apps (from the same watches)
//! and the controller's RSS (from /proc), drawn as `<target>/bench/scale-N<n>-converged.svg`
//! and `scale-N<n>-memory.svg`.
//!
//! - [`settings`]: what the environment asks for.
//! - [`native`]: the image-updater logic called natively, shared by the kube-rs and floor binaries.
//! - [`cluster`]: a fresh control plane with the App CRD and namespace.
//! - [`apimetrics`]: the API server's request counters.
//! - [`procstat`]: peak RSS and CPU seconds of a process.
//! - [`replicametrics`]: what a wasmop host reports on its `/metrics` (caches, its slice).
//! - [`converge`]: creating Apps and watching them converge.
//! - [`contenders`]: starting each controller.
//! - [`run`]: one contender's run (and its series over time), [`report`]: the tables and the
//!   final line, and [`chart`]: the SVG charts of converged Apps and memory over time.
//! - [`idle`]: the memory of an idle host with many loaded modules (`make bench-idle-host`).

pub mod apimetrics;
pub mod chart;
pub mod cluster;
pub mod contenders;
pub mod converge;
pub mod error;
pub mod idle;
pub mod native;
pub mod procstat;
pub mod replicametrics;
pub mod report;
pub mod run;
pub mod settings;

pub use contenders::wasmop::binary as wasmop_binary;
pub use error::{Error, Result};
