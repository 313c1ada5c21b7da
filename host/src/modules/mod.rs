//! Modules: where a module comes from, the active module a controller calls, and the host's copy
//! of it that keeps rollbacks and followers independent of the author's source.
//!
//! - [`source`]: reading a module from its ConfigMap.
//! - [`oci`]: pulling a module from an OCI registry (and pushing one).
//! - [`registry`]: reaching a registry (the pinned reference, credentials and CA bundle).
//! - [`reader`]: bounded reads from a registry (manifests, blobs, error bodies).
//! - [`signature`]: cosign signatures of OCI modules (verifying and signing).
//! - [`slot`]: the swappable active module of one reconciler.
//! - [`copy`]: the host-owned copy of the active module (`wasmop-module.<reconciler>`).

pub mod copy;
#[cfg(test)]
pub(crate) mod hostile;
pub mod oci;
pub mod reader;
pub mod registry;
pub mod signature;
pub mod slot;
pub mod source;
