//! Metacontroller's controllers, run in the sandbox: a `CompositeController` or
//! `DecoratorController` whose `spec.wasmop` names a hook module (world `hook`) is served by a
//! WasmReconciler of its own, and the module's hooks answer Metacontroller's documents.
//!
//! - [`api`]: the two resources, with wasmop's `spec.wasmop`.
//! - [`spec`]: what is refused of a CompositeController, and the WasmReconciler spec that
//!   serves the rest; [`decorator`]: the same for a DecoratorController.
//! - [`compose`]: the controller that keeps those WasmReconcilers and the `Ready` condition.
//! - [`document`]: the request documents hooks receive.
//! - [`answer`]: hooks' answers as intents, through the children's update strategies.
//! - [`adapter`]: the engine's [`HookAdapter`](crate::engine::HookAdapter) of hook modules,
//!   and [`serve`], which every place that loads a module for a WasmReconciler calls.

pub mod adapter;
pub mod answer;
pub mod api;
pub mod compose;
pub mod decorator;
pub mod document;
pub mod spec;

pub use adapter::serve;

/// The CRDs of the CompositeController and the DecoratorController as wasmop serves them
/// (what `wasmop crdgen --metacontroller` prints): Metacontroller's schemas plus `spec.wasmop`.
pub fn crds_yaml() -> String {
    use kube::CustomResourceExt;
    let crds = [
        api::CompositeController::crd(),
        api::DecoratorController::crd(),
    ]
    .map(|mut crd| {
        // The API server requires it of a `*.k8s.io` group; Metacontroller's CRDs say the same.
        crd.metadata.annotations = Some(
            [(
                "api-approved.kubernetes.io".to_string(),
                "unapproved, request not yet submitted".to_string(),
            )]
            .into(),
        );
        crd
    });
    crate::crd::render_crds("wasmop crdgen metacontroller", &crds)
}
