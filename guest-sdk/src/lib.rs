//! The wasmop guest SDK: write a Kubernetes reconciler once, ship it as a Wasm component.
//!
//! A module is a type that implements [`Reconciler`], exported with [`export!`] and compiled with
//! `cargo build --release --target wasm32-wasip2`. The host calls it with the desired state (the
//! primary object) and the actual state (its owned children and related objects); it answers with
//! intents: the complete desired set of children per owned kind (server-side applied, the rest
//! pruned), patches, deletes, a status, Events and a requeue delay.
//!
//! ```
//! use wasmop_sdk::prelude::*;
//! use wasmop_sdk::k8s::api::core::v1::ConfigMap;
//!
//! #[derive(serde::Deserialize)]
//! struct GreetingSpec { message: String }
//! type Greeting = Object<GreetingSpec>;
//!
//! struct Greeter;
//! impl Reconciler for Greeter {
//!     fn metadata() -> Metadata {
//!         Metadata::new("greeter", "0.1.0")
//!             .primary(Gvk::new("example.wasmop.dev/v1", "Greeting"))
//!             .owns::<ConfigMap>()
//!     }
//!     fn reconcile(req: &Request) -> Result<Response> {
//!         let greeting: Greeting = req.primary()?;
//!         let mut cm = ConfigMap::default();
//!         cm.metadata.name = Some(format!("{}-greeting", greeting.name()));
//!         cm.data = Some([("message".to_string(), greeting.spec.message.clone())].into());
//!         Ok(Response::complete(req).child(&cm))
//!     }
//! }
//! wasmop_sdk::export!(Greeter);
//!
//! // Natively, without Wasm:
//! let out = wasmop_sdk::testing::Harness::<Greeter>::new()
//!     .primary_json(r#"{"apiVersion": "example.wasmop.dev/v1", "kind": "Greeting",
//!         "metadata": {"name": "hi", "namespace": "default"}, "spec": {"message": "hello"}}"#)
//!     .reconcile()
//!     .unwrap();
//! assert_eq!(out.children::<ConfigMap>().unwrap()[0].metadata.name.as_deref(), Some("hi-greeting"));
//! ```
//!
//! The contract is the WIT package `wasmop:reconciler@0.1.0` (see `wit/reconciler.wit`); this
//! crate wraps its bindings so authors depend on `wasmop-sdk` alone.

// The generated bindings name this crate by its path, also from inside it (Wasm builds).
#[cfg(target_family = "wasm")]
extern crate self as wasmop_sdk;

mod error;
mod kinds;
pub mod log;
mod object;
mod request;
mod response;
#[cfg(feature = "testing")]
pub mod testing;

#[cfg(target_family = "wasm")]
#[doc(hidden)]
pub mod __glue;

pub use error::{Error, Result};
pub use kinds::{
    Gvk, Mapping, Metadata, ObjectRef, RelatedKind, Selector, SelectorOperator, SelectorRequirement,
};
pub use object::Object;
pub use request::{Context, Operation, Request, Trigger, ValidateRequest};
pub use response::{
    Action, Condition, ConditionStatus, Event, EventType, Finalized, Propagation, Response, Status,
    Validation,
};

/// The Kubernetes API types (k8s-openapi), re-exported so modules use the same version.
pub use k8s_openapi as k8s;
/// serde_json, re-exported for `json!` and `Value`.
pub use serde_json;

/// The version of the WIT package this SDK implements.
pub const WIT_PACKAGE: &str = "wasmop:reconciler@0.1.0";

/// A reconcile module: what it is ([`Reconciler::metadata`]) and what it does.
///
/// Every function is a pure function of its arguments: the host calls them in a fresh sandbox
/// each time, with no memory of earlier calls, and may call them again at any time.
pub trait Reconciler {
    /// The module's name and version, the primary kind, the owned and related kinds.
    fn metadata() -> Metadata;

    /// Computes the intents that bring the actual state to the desired state.
    ///
    /// # Errors
    /// An error is shown as a Warning Event on the primary and the host retries with backoff.
    fn reconcile(request: &Request) -> Result<Response>;

    /// Cleans up while the primary is being deleted; called only if the metadata says
    /// [`Metadata::finalizes`]. Return [`Finalized::pending`] to be called again.
    ///
    /// # Errors
    /// As for [`Reconciler::reconcile`]; the finalizer stays until finalize succeeds with done.
    fn finalize(request: &Request) -> Result<Finalized> {
        let _ = request;
        Ok(Finalized::done())
    }

    /// Judges a proposed change of a primary (at admission, and in `wasmop test`); called only if
    /// the metadata says [`Metadata::validates`].
    fn validate(request: &ValidateRequest) -> Validation {
        let _ = request;
        Validation::allow()
    }
}

/// What a module usually needs, in one import.
pub mod prelude {
    pub use crate::{
        Condition, Context, Error, Event, Finalized, Gvk, Mapping, Metadata, Object, ObjectRef,
        Propagation, Reconciler, RelatedKind, Request, Response, Result, Selector, Trigger,
        ValidateRequest, Validation,
    };
}

#[cfg(target_family = "wasm")]
#[doc(hidden)]
pub mod __bindings {
    wit_bindgen::generate!({
        world: "module",
        path: "../wit",
        pub_export_macro: true,
        export_macro_name: "__export_module",
        default_bindings_module: "::wasmop_sdk::__bindings",
        runtime_path: "::wasmop_sdk::__bindings::__rt::rt",
    });
    #[doc(hidden)]
    pub use wit_bindgen as __rt;
}

/// Exports a [`Reconciler`] as the module's implementation of the `wasmop:reconciler` world.
///
/// Use it once, at the crate root of a `cdylib` built for `wasm32-wasip2`. On other targets it
/// expands to nothing, so the same crate can be unit-tested natively.
#[macro_export]
macro_rules! export {
    ($reconciler:ty) => {
        #[cfg(target_family = "wasm")]
        const _: () = {
            struct __WasmopExport;
            impl $crate::__bindings::exports::wasmop::reconciler::guest::Guest for __WasmopExport {
                fn metadata() -> $crate::__bindings::wasmop::reconciler::types::ModuleMetadata {
                    $crate::__glue::metadata::<$reconciler>()
                }
                fn reconcile(
                    request: $crate::__bindings::wasmop::reconciler::types::ReconcileRequest,
                ) -> ::core::result::Result<
                    $crate::__bindings::wasmop::reconciler::types::ReconcileResponse,
                    $crate::__bindings::wasmop::reconciler::types::ReconcileError,
                > {
                    $crate::__glue::reconcile::<$reconciler>(request)
                }
                fn finalize(
                    request: $crate::__bindings::wasmop::reconciler::types::ReconcileRequest,
                ) -> ::core::result::Result<
                    $crate::__bindings::wasmop::reconciler::types::FinalizeResponse,
                    $crate::__bindings::wasmop::reconciler::types::ReconcileError,
                > {
                    $crate::__glue::finalize::<$reconciler>(request)
                }
                fn validate(
                    request: $crate::__bindings::wasmop::reconciler::types::ValidateRequest,
                ) -> $crate::__bindings::wasmop::reconciler::types::ValidateResponse {
                    $crate::__glue::validate::<$reconciler>(request)
                }
            }
    $crate::__bindings::__export_module!(__WasmopExport with_types_in $crate::__bindings);
        };
    };
}
