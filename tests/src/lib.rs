//! A real local Kubernetes control plane for wasmop's end-to-end tests and demo.
//!
//! etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (fake nodes whose pods
//! become Running/Ready), built from pinned Go modules the first time and cached, started on
//! loopback in a temporary directory and torn down with the process that started them.
//!
//! - [`Assets`] finds or builds the binaries.
//! - [`ControlPlane`] starts and stops one cluster.
//! - [`TestEnv`] shares one cluster between the tests of a test binary, a namespace per test;
//!   [`Plane::Own`] gives a group of tests a cluster of their own, [`Turn::Alone`] runs a test
//!   with no other beside it.
//! - [`faults`] kills and restarts components and compacts etcd; [`HostProcess`] runs `wasmop
//!   run` as a child process that a test can SIGKILL and restart.
//! - [`Registry`] runs a real OCI registry (TLS, basic auth) that a test can stop and restart.
//! - [`Collector`] runs a real OpenTelemetry Collector (OTLP receiver) and reads back its spans.
//!
//! [`cargo::command`] runs a nested `cargo build` without the caller's per-package environment.
//!
//! The `testenv` binary offers the same to people: `testenv cluster` (what `make cluster` runs).

pub mod assets;
pub mod cargo;
pub mod collector;
pub mod controlplane;
pub mod error;
pub mod faults;
pub mod host_process;
pub mod pki;
pub mod process;
pub mod registry;
pub mod shared;
pub mod turns;
pub mod wait;

pub use assets::Assets;
pub use collector::Collector;
pub use controlplane::{ControlPlane, Options};
pub use error::{Error, Result};
pub use host_process::HostProcess;
pub use registry::Registry;
pub use shared::{Plane, TestEnv, shared};
pub use turns::{Turn, alone};
pub use wait::eventually;
