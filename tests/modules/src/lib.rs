//! Paths of the example and test guest modules, built for `wasm32-wasip2` by this crate's build
//! script (so a bare `cargo test` has them).
//!
//! - [`IMAGE_UPDATER`], [`IMAGE_UPDATER_V2`]: the image-updater example, and a build of it that
//!   annotates its children (for hot swaps).
//! - [`PRIMARY_REPLICA`]: the primary-replica example (a Database as an ordered StatefulSet).
//! - [`CONFIGMAP_PROPAGATOR`]: the configmap-propagator example (a cluster-scoped
//!   ConfigMapPropagation copying a ConfigMap into matching Namespaces).
//! - [`MISBEHAVE`]: a guest whose config picks a misbehaviour; [`MISBEHAVE_FRAGILE`] a build of
//!   it that fails for Widgets labelled `test.wasmop.dev/fragile`; [`MISBEHAVE_HUGE_METADATA`]
//!   a build whose `metadata()` returns a 2 MiB name.
//! - [`WRONG_VERSION`]: a module for `wasmop:reconciler@0.2.0`.
//! - [`HOSTILE`]: a guest that tries to touch what it does not own (see tests/guests/hostile).

include!(concat!(env!("OUT_DIR"), "/modules.rs"));

/// Reads a module's bytes.
///
/// # Panics
/// If the file is missing (the build script failed to produce it): this is test support.
pub fn bytes(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read the test module {path}: {e}"))
}
