//! Metacontroller's `CompositeController` (`metacontroller.k8s.io/v1alpha1`, cluster-scoped),
//! as wasmop serves it: Metacontroller's fields, plus `spec.wasmop`, which names the module
//! that runs the hooks and the identity it writes with.
//!
//! The schema accepts every field of Metacontroller v4.17's CRD (the webhook's connection
//! settings are kept as they are and not used), so a controller's YAML applies unchanged.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::crd::{ModuleSource, ReconcilerLimits, ServiceAccountRef};

/// A Metacontroller CompositeController.
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[kube(
    group = "metacontroller.k8s.io",
    version = "v1alpha1",
    kind = "CompositeController",
    plural = "compositecontrollers",
    shortname = "cc",
    shortname = "cctl",
    category = "metacontroller",
    status = "ControllerStatus",
    doc = "A Metacontroller CompositeController: a parent resource, its child resources and the hooks that compute the children; with spec.wasmop, wasmop runs the hooks as a Wasm module."
)]
#[serde(rename_all = "camelCase")]
pub struct CompositeControllerSpec {
    /// The parent resource.
    pub parent_resource: ParentResource,
    /// The child resources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub child_resources: Vec<ChildResource>,
    /// The hooks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<Hooks>,
    /// Metacontroller's per-host webhook settings (unused by wasmop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crd::preserve_unknown_list")]
    pub endpoint_configs: Option<serde_json::Value>,
    /// How often every parent is synced even if nothing changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync_period_seconds: Option<i32>,
    /// Whether the parent's selector is generated (Metacontroller's `controller-uid` label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_selector: Option<bool>,
    /// wasmop's addition: the module that runs the hooks. A controller without it is left to
    /// Metacontroller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wasmop: Option<WasmopHooks>,
}

/// A resource by apiVersion and plural name.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParentResource {
    /// `ctl.enisoc.com/v1`.
    pub api_version: String,
    /// `catsets`.
    pub resource: String,
    /// Metacontroller's revision history (not kept by wasmop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crd::preserve_unknown")]
    pub revision_history: Option<serde_json::Value>,
    /// Only parents with matching labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crd::preserve_unknown")]
    pub label_selector: Option<serde_json::Value>,
    /// Whether changes of the parent's status alone trigger no sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_status_changes: Option<bool>,
}

/// A child resource and its update strategy.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChildResource {
    /// `v1`.
    pub api_version: String,
    /// `pods`.
    pub resource: String,
    /// How existing children are updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
}

/// A child update strategy.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateStrategy {
    /// `OnDelete` (default), `Recreate`, `InPlace`, `RollingRecreate`, `RollingInPlace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// What a rolling update waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_checks: Option<StatusChecks>,
}

/// A rolling update's checks.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusChecks {
    /// Conditions every child must have.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<crate::crd::ConditionCheck>,
}

/// The hooks of a CompositeController.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hooks {
    /// Computes the children and status from the parent and the observed children.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<Hook>,
    /// Called instead of sync while the parent is being deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalize: Option<Hook>,
    /// Names the related objects sync receives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub customize: Option<Hook>,
    /// Metacontroller's pre-update child hook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_update_child: Option<Hook>,
    /// Metacontroller's post-update child hook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_update_child: Option<Hook>,
}

/// One hook.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// `v1` (default) or `v2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The webhook; with `spec.wasmop`, only the path of its `url` (or its `path`) is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<Webhook>,
}

/// A hook's webhook: the fields wasmop reads; the others are kept.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct Webhook {
    /// `http://catset-controller.metacontroller/sync`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The path, with `service`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The call's timeout (Go duration; Metacontroller's default 10s): with `spec.wasmop`, the
    /// module call's deadline unless `spec.wasmop.limits` sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// `loose` or `strict` reading of the response.
    #[serde(
        default,
        rename = "responseUnMarshallMode",
        skip_serializing_if = "Option::is_none"
    )]
    pub response_unmarshall_mode: Option<String>,
    /// The rest (service, etag, TLS, authorization), unused by wasmop.
    #[serde(flatten)]
    #[schemars(skip)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

/// wasmop's block: the module that runs the hooks, its identity and limits.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WasmopHooks {
    /// The hook module (world `hook`), as a WasmReconciler's `spec.module`.
    pub module: ModuleSource,
    /// The ServiceAccount whose identity every write uses.
    pub service_account: ServiceAccountRef,
    /// Per-call limits (default: a WasmReconciler's, with the sync webhook's timeout as the
    /// deadline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ReconcilerLimits>,
    /// Namespaces whose parents are served; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// The resources the customize hook may name. wasmop watches them (read-only, with the
    /// ServiceAccount's rights checked first) and hands each sync the objects its customize
    /// answer selects; a resource the answer names that is not listed here fails the sync.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub related: Vec<RelatedResource>,
}

/// A resource by apiVersion and plural name.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelatedResource {
    /// `v1`.
    pub api_version: String,
    /// `configmaps`.
    pub resource: String,
}

/// The status wasmop writes on a controller it serves.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControllerStatus {
    /// `Ready`: served (with the WasmReconciler that runs it), or why not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The WasmReconciler that serves the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciler: Option<String>,
}

/// A Metacontroller DecoratorController.
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[kube(
    group = "metacontroller.k8s.io",
    version = "v1alpha1",
    kind = "DecoratorController",
    plural = "decoratorcontrollers",
    shortname = "dec",
    shortname = "decorators",
    category = "metacontroller",
    status = "ControllerStatus",
    doc = "A Metacontroller DecoratorController: resources to decorate, the attachments the hooks add to them and the hooks; with spec.wasmop, wasmop runs the hooks as a Wasm module."
)]
#[serde(rename_all = "camelCase")]
pub struct DecoratorControllerSpec {
    /// The resources decorated (wasmop serves one per controller).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<DecoratedResource>,
    /// The attachments' resources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    /// The hooks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<Hooks>,
    /// How often every decorated object is synced even if nothing changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync_period_seconds: Option<i32>,
    /// wasmop's addition: the module that runs the hooks. A controller without it is left to
    /// Metacontroller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wasmop: Option<WasmopHooks>,
}

/// A decorated resource and which of its objects are decorated.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecoratedResource {
    /// `apps/v1`.
    pub api_version: String,
    /// `statefulsets`.
    pub resource: String,
    /// Only objects with matching labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crd::preserve_unknown")]
    pub label_selector: Option<serde_json::Value>,
    /// Only objects with matching annotations (`matchAnnotations`, `matchExpressions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crd::preserve_unknown")]
    pub annotation_selector: Option<serde_json::Value>,
    /// Whether changes of an object's status alone trigger no sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_status_changes: Option<bool>,
}

/// An attachment resource and its update strategy.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// `v1`.
    pub api_version: String,
    /// `services`.
    pub resource: String,
    /// How existing attachments are updated (`OnDelete`, the default, `Recreate` or `InPlace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
}
