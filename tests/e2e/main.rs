//! wasmop's end-to-end tests: one test binary, a module per suite (the way wasmtime keeps its
//! integration tests), so the host and its dependencies are linked once.
//!
//! Run one suite or one test with a name filter:
//! `cargo test -p wasmop-testenv --test e2e -- lifecycle::` (see tests/README.md).
//!
//! # Control planes and turns
//! Most tests share one control plane, a namespace each ([`wasmop_testenv::TestEnv::get`]).
//! The others say why where they ask for more ([`wasmop_testenv::Plane`],
//! [`wasmop_testenv::Turn`]):
//! - `faults` breaks its control plane (the API server down for 20 s, etcd compacted): a plane of
//!   its own, and each test alone;
//! - `deploy` installs deploy/ and runs a host serving every WasmReconciler: a plane of its own
//!   (and the Helm chart of the same image on a fresh plane, `chart::install_upgrade_uninstall`);
//! - `scale` counts the API server's writes and open watches: a fresh plane per test;
//! - `servers` measures this process's memory and process-wide server metrics: alone;
//! - `sharding` starts a fresh plane per scenario with four host processes: alone.

mod support;

mod author;
mod chart;
mod clientauth;
mod deploy;
mod examples;
mod faults;
mod host;
mod hotswap;
mod intents;
mod lifecycle;
mod metacontroller;
mod monitoring;
mod oci;
mod production;
mod python;
mod sandbox;
mod scale;
mod servers;
mod sharding;
mod smoke;
mod startup;
mod tracing;
