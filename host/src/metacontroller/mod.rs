//! Metacontroller's controllers, run in the sandbox: a `CompositeController` whose
//! `spec.wasmop` names a hook module (world `hook`) is served by a WasmReconciler of its own,
//! and the module's hooks answer Metacontroller's documents.
//!
//! - [`api`]: the CompositeController resource, with wasmop's `spec.wasmop`.
//! - [`spec`]: what is refused, and the WasmReconciler spec that serves the rest.
//! - [`compose`]: the controller that keeps those WasmReconcilers and the `Ready` condition.
//! - [`document`]: the request documents hooks receive.
//! - [`answer`]: hooks' answers as intents, through the children's update strategies.
//! - [`adapter`]: the engine's [`HookAdapter`](crate::engine::HookAdapter) of hook modules,
//!   and [`serve`], which every place that loads a module for a WasmReconciler calls.

pub mod adapter;
pub mod answer;
pub mod api;
pub mod compose;
pub mod document;
pub mod spec;

pub use adapter::serve;

/// The CRD of the CompositeController as wasmop serves it (what `wasmop crdgen metacontroller`
/// prints): Metacontroller's schema plus `spec.wasmop`.
pub fn crds_yaml() -> String {
    use kube::CustomResourceExt;
    let mut crd = api::CompositeController::crd();
    // The API server requires it of a `*.k8s.io` group; Metacontroller's CRD says the same.
    crd.metadata.annotations = Some(
        [(
            "api-approved.kubernetes.io".to_string(),
            "unapproved, request not yet submitted".to_string(),
        )]
        .into(),
    );
    crate::crd::render_crds("wasmop crdgen metacontroller", &[crd])
}
