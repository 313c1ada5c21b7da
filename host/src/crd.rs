//! The `WasmReconciler` custom resource (cluster-scoped, `wasmop.dev/v1alpha1`): an
//! administrator's registration of a module for a kind, with its grant, identity and limits.
//!
//! The module's metadata is the *request* (which kinds it wants to own and read); the spec's
//! `owns` and `related` are the *grant*. The host uses what both allow and reports the rest in
//! `status.ungranted`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::contract::Gvk;

/// The finalizer every reconciler shared before finalizers were named per reconciler.
///
/// Still recognised for migration: a reconciler treats it as its own (the host refuses two
/// reconcilers of one kind in overlapping namespaces, so it belongs to the one serving the
/// primary), replaces it with [`finalizer_for`] on the next reconcile, and removes it when it
/// releases the primary. New code names finalizers with [`finalizer_for`].
pub const FINALIZER: &str = "wasmop.dev/finalizer";

/// The field manager of the host's own writes (WasmReconciler status, webhook configurations,
/// module copies).
pub const FIELD_MANAGER: &str = "wasmop";

/// The finalizer the host keeps on every WasmReconciler, so that deleting one first releases
/// the finalizers it holds on primaries ([`crate::manager::release`]).
pub const RECONCILER_FINALIZER: &str = "host.wasmop.dev/release-primaries";

/// The longest name part of a qualified name (`prefix/name`), which finalizers must be.
const MAX_NAME_PART: usize = 63;

/// The finalizer reconciler `reconciler` keeps on primaries whose module implements finalize:
/// `wasmop.dev/<reconciler>`.
///
/// # Guarantees
/// - A valid qualified name for every valid WasmReconciler name: a name longer than 63
///   characters is cut to 46 and suffixed with 16 hex digits of its sha256, so distinct
///   reconcilers get distinct finalizers.
/// - Deterministic: every replica and every restart computes the same name.
pub fn finalizer_for(reconciler: &str) -> String {
    if reconciler.len() <= MAX_NAME_PART {
        return format!("wasmop.dev/{reconciler}");
    }
    let digest = crate::engine::sha256_hex(reconciler.as_bytes());
    let mut head = &reconciler[..46];
    head = head.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("wasmop.dev/{head}-{}", &digest[..16])
}

/// Whether `finalizer` is reconciler `reconciler`'s: its own name or the legacy shared one.
pub fn is_finalizer_of(finalizer: &str, reconciler: &str) -> bool {
    finalizer == FINALIZER || finalizer == finalizer_for(reconciler)
}

/// A module registered for a kind.
// Several printcolumn(...) entries repeat `type_ = "string"`, which is not a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[kube(
    group = "wasmop.dev",
    version = "v1alpha1",
    kind = "WasmReconciler",
    plural = "wasmreconcilers",
    shortname = "wr",
    category = "wasmop",
    status = "WasmReconcilerStatus",
    doc = "A Wasm reconcile module registered for a kind: where the module is, what it may own and read, whose identity it writes with, and its limits.",
    printcolumn(name = "Primary", type_ = "string", json_path = ".spec.primary.kind"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Module",
        type_ = "string",
        json_path = ".status.activeModule.version"
    ),
    printcolumn(
        name = "Digest",
        type_ = "string",
        json_path = ".status.activeModule.sha256",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = kubernetes_formats)]
pub struct WasmReconcilerSpec {
    /// Where the module is.
    pub module: ModuleSource,
    /// The kind the module reconciles.
    pub primary: KindRef,
    /// Kinds the module may own (create, update, prune). The module asks in its metadata; only
    /// kinds in both lists are watched and written.
    #[serde(default)]
    pub owns: Vec<KindRef>,
    /// Kinds the module may read and react to (and, where `write` is set, patch, delete or
    /// report Events on).
    #[serde(default)]
    pub related: Vec<RelatedGrant>,
    /// Namespaces whose primaries are reconciled; empty means all namespaces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// The ServiceAccount whose identity every write of the module uses (the host impersonates
    /// it, so its RBAC decides what the module may do).
    pub service_account: ServiceAccountRef,
    /// Per-call and per-reconciler limits.
    #[serde(default)]
    pub limits: ReconcilerLimits,
    /// How often every primary is reconciled even if nothing changes (Go duration, e.g. `10m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync_period: Option<String>,
    /// Automatic rollback of a newly pushed module that fails.
    #[serde(default)]
    pub rollout: RolloutPolicy,
    /// The validating admission webhook the host registers when the module declares
    /// `validates`.
    #[serde(default)]
    pub admission: AdmissionPolicy,
    /// Free-form configuration handed to the module with every call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub config: Option<serde_json::Value>,
    /// Set when this reconciler serves a Metacontroller controller: the module is a hook
    /// (world `hook`), and this is how its calls are made and answered. The host writes it
    /// (from a CompositeController's spec); an administrator does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<HookSpec>,
}

/// How a hook module serves a Metacontroller controller ([`WasmReconcilerSpec::hook`]).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookSpec {
    /// The controller, as its hooks receive it in `controller` (the CompositeController).
    #[schemars(schema_with = "preserve_unknown")]
    pub controller: serde_json::Value,
    /// The hook API version: `v1` or `v2` (children keyed by `namespace/name` always).
    #[serde(default)]
    pub version: HookVersion,
    /// Whether the hook's response is read strictly (unknown fields refused; v2's default).
    #[serde(default)]
    pub strict: bool,
    /// The child kinds and how each is updated.
    #[serde(default)]
    pub children: Vec<HookChild>,
    /// The path of the sync hook (`/sync`).
    pub sync: String,
    /// The path of the finalize hook, if the controller has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalize: Option<String>,
    /// The path of the customize hook, if the controller has one: it names, per parent, the
    /// related objects sync receives (among [`HookSpec::related`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub customize: Option<String>,
    /// The resources the customize hook may name (watched, read-only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub related: Vec<HookResource>,
    /// Only parents whose labels match are synced (`parentResource.labelSelector`); the others
    /// are left alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub parent_selector: Option<serde_json::Value>,
    /// Whether a change of a parent's status alone calls the hook (Metacontroller's default,
    /// `parentResource.ignoreStatusChanges` unset or false): a hook may need to see the status
    /// it wrote. Otherwise, as for every WasmReconciler, only changes outside the status do.
    #[serde(default)]
    pub sync_on_status: bool,
    /// Set for a DecoratorController: its hooks see the parent as `object` and the children as
    /// `attachments`, and may set the parent's labels and annotations. None: a
    /// CompositeController.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decorator: Option<DecoratorHook>,
}

/// What a DecoratorController's hooks add to a [`HookSpec`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecoratorHook {
    /// The DecoratorController's name: its attachments carry it in the annotation
    /// `metacontroller.k8s.io/decorator-controller`, and only those are its own.
    pub name: String,
    /// Only parents whose annotations match are synced (`resources[].annotationSelector`:
    /// `matchAnnotations` and `matchExpressions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub annotation_selector: Option<serde_json::Value>,
}

/// A resource, with the kind that serves it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookResource {
    /// `v1`.
    pub api_version: String,
    /// `configmaps`.
    pub resource: String,
    /// `ConfigMap`.
    pub kind: String,
}

impl HookResource {
    /// As a contract kind.
    pub fn gvk(&self) -> Gvk {
        Gvk::new(self.api_version.clone(), self.kind.clone())
    }
}

/// A hook API version.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, JsonSchema)]
pub enum HookVersion {
    /// Children keyed by name, or `namespace/name` when the parent is cluster-scoped and the
    /// child namespaced.
    #[default]
    #[serde(rename = "v1")]
    V1,
    /// Namespaced children keyed by `namespace/name`, cluster-scoped ones by name.
    #[serde(rename = "v2")]
    V2,
}

/// One child kind of a hook's controller.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookChild {
    /// `v1`, `apps/v1`.
    pub api_version: String,
    /// `Pod`.
    pub kind: String,
    /// How existing children are updated.
    #[serde(default)]
    pub method: UpdateMethod,
    /// Conditions every child must have before a rolling update moves to the next one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub status_checks: Vec<ConditionCheck>,
}

impl HookChild {
    /// As a contract kind.
    pub fn gvk(&self) -> Gvk {
        Gvk::new(self.api_version.clone(), self.kind.clone())
    }
}

/// Metacontroller's child update methods.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, JsonSchema)]
pub enum UpdateMethod {
    /// Existing children are never updated (delete one to have it recreated).
    #[default]
    OnDelete,
    /// A child that differs is deleted, and created again by a later sync.
    Recreate,
    /// A child that differs is updated in place.
    InPlace,
    /// As Recreate, one child at a time, while every child passes the status checks.
    RollingRecreate,
    /// As InPlace, one child at a time, while every child passes the status checks.
    RollingInPlace,
}

/// A condition a child must have (`type`, and `status` and `reason` when given).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConditionCheck {
    /// The condition type (`Ready`).
    #[serde(rename = "type")]
    pub type_: String,
    /// The status it must have (`"True"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// The reason it must have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Drops the integer formats schemars derives from unsigned Rust types (`uint16`, `uint32`,
/// ...), which Kubernetes does not know: applying the CRD would print `Warning: unrecognized
/// format "uint32"`. The bounds (`minimum`, `maximum`) stay, so nothing is lost.
///
/// # Guarantees
/// Applied to a container type, it walks every subschema (kube inlines them), so no field keeps
/// a format outside the set Kubernetes recognises.
fn kubernetes_formats(schema: &mut schemars::Schema) {
    if let Some(object) = schema.as_object_mut() {
        let unsigned = object
            .get("format")
            .and_then(|format| format.as_str())
            .is_some_and(|format| format.starts_with("uint"));
        if unsigned {
            object.remove("format");
        }
    }
    schemars::transform::transform_subschemas(&mut kubernetes_formats, schema);
}

pub(crate) fn preserve_unknown_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
    })
}

pub(crate) fn preserve_unknown(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Where a module comes from: exactly one of a key of a ConfigMap (`binaryData`, optionally
/// gzip-compressed) or an OCI artifact in a registry.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.configMap) != has(self.oci)",
    "message": "spec.module names exactly one of configMap or oci"
}]))]
pub struct ModuleSource {
    /// The ConfigMap holding the module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapKey>,
    /// The OCI artifact holding the module (CNCF Wasm artifact layout: config
    /// `application/vnd.wasm.config.v0+json`, one `application/wasm` layer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<OciModule>,
    /// If set, only a module with this sha256 (hex, of the module bytes) is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// Which of its sources a [`ModuleSource`] names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SourceKind<'a> {
    /// A ConfigMap key.
    ConfigMap(&'a ConfigMapKey),
    /// An OCI artifact.
    Oci(&'a OciModule),
}

impl ModuleSource {
    /// The one source named.
    ///
    /// # Errors
    /// A message for the status when none or both are named.
    pub fn kind(&self) -> Result<SourceKind<'_>, String> {
        match (&self.config_map, &self.oci) {
            (Some(cm), None) => Ok(SourceKind::ConfigMap(cm)),
            (None, Some(oci)) => Ok(SourceKind::Oci(oci)),
            (None, None) => Err("spec.module names no source: set configMap or oci".into()),
            (Some(_), Some(_)) => {
                Err("spec.module names both configMap and oci: keep exactly one".into())
            }
        }
    }

    /// A namespace to fall back on for the host's module copy: the ConfigMap's, else `default`.
    pub fn fallback_namespace(&self) -> String {
        self.config_map
            .as_ref()
            .map(|c| c.namespace.clone())
            .unwrap_or_else(|| "default".into())
    }
}

/// A module in an OCI registry.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OciModule {
    /// `registry/repository@sha256:<digest>` (pinned), or `registry/repository:<tag>` together
    /// with `digest`.
    pub reference: String,
    /// The manifest digest (`sha256:<hex>`) a tag reference must resolve to; required with a
    /// tag, and must agree with a pinned reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// A `kubernetes.io/dockerconfigjson` Secret in the host's namespace with the pull
    /// credentials (anonymous pulls without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<String>,
    /// PEM CA certificates trusted for the registry, besides the system roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
    /// A ConfigMap key (in the host's namespace) holding PEM CA certificates trusted for the
    /// registry, besides the system roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_config_map: Option<LocalKey>,
    /// Require a cosign signature by this key on the manifest digest (the `sha256-<digest>.sig`
    /// tag, as `cosign sign --key` and `wasmop push --sign` write it); an unsigned or wrongly
    /// signed module is refused and the active one keeps serving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<SignaturePolicy>,
}

/// The public key an OCI module must be signed with: exactly one of `key`, `keyConfigMap` or
/// `keySecret`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "(has(self.key) ? 1 : 0) + (has(self.keyConfigMap) ? 1 : 0) + (has(self.keySecret) ? 1 : 0) == 1",
    "message": "spec.module.oci.verify names exactly one of key, keyConfigMap or keySecret"
}]))]
pub struct SignaturePolicy {
    /// The public key, PEM (`cosign.pub`, as `cosign generate-key-pair` writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A ConfigMap key (in the host's namespace) holding the PEM public key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_config_map: Option<LocalKey>,
    /// A Secret key (in the host's namespace) holding the PEM public key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_secret: Option<LocalKey>,
}

/// A key of a ConfigMap or Secret in the host's namespace.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalKey {
    /// The object's name.
    pub name: String,
    /// The key.
    pub key: String,
}

/// A key of a ConfigMap.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKey {
    /// The ConfigMap's namespace.
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
    /// The `binaryData` key: `module.wasm`, or `module.wasm.gz` for a gzip-compressed module.
    /// When unset, `module.wasm` is used, else `module.wasm.gz`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// A kind, by apiVersion and kind.
#[derive(
    Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct KindRef {
    /// `apps/v1`, `v1`, `example.com/v1alpha1`.
    pub api_version: String,
    /// `Deployment`.
    pub kind: String,
}

impl KindRef {
    /// As a contract kind.
    pub fn gvk(&self) -> Gvk {
        Gvk::new(self.api_version.clone(), self.kind.clone())
    }
}

/// A related kind the module may read, optionally narrowed by the administrator.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelatedGrant {
    /// `v1`, `apps/v1`.
    pub api_version: String,
    /// `Namespace`, `Pod`.
    pub kind: String,
    /// Only objects matching this label selector (API syntax, e.g. `env=prod`) are watched;
    /// the module's own selector narrows further.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Whether the module may patch and delete objects of this kind and report Events on them
    /// (default false: related kinds are read-only). The ServiceAccount's RBAC must allow the
    /// writes too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub write: bool,
}

impl RelatedGrant {
    /// As a contract kind.
    pub fn gvk(&self) -> Gvk {
        Gvk::new(self.api_version.clone(), self.kind.clone())
    }
}

/// A ServiceAccount.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl ServiceAccountRef {
    /// The user name Kubernetes gives it: `system:serviceaccount:<ns>:<name>`.
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

/// Limits of one reconciler.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReconcilerLimits {
    /// Wall-clock deadline of one module call (Go duration; default `2s`).
    #[serde(default = "default_deadline")]
    pub deadline: String,
    /// Linear-memory cap of one module call (quantity; default `64Mi`).
    #[serde(default = "default_memory")]
    pub memory: String,
    /// How many primaries are reconciled at once (default 4).
    #[serde(default = "default_concurrency")]
    #[schemars(range(min = 1, max = 256))]
    pub concurrency: u16,
    /// Most children one response may carry, over all child sets (default 500); a response
    /// with more is refused whole before any request.
    #[serde(default = "default_children")]
    #[schemars(range(min = 0, max = 10000))]
    pub children: u32,
    /// Most actions (patches, deletes) one response may carry (default 100).
    #[serde(default = "default_actions")]
    #[schemars(range(min = 0, max = 10000))]
    pub actions: u32,
    /// Most Events one response may carry (default 20).
    #[serde(default = "default_events")]
    #[schemars(range(min = 0, max = 1000))]
    pub events: u32,
}

impl ReconcilerLimits {
    /// The count limits of one response.
    pub fn counts(&self) -> crate::grant::Counts {
        crate::grant::Counts {
            children: self.children,
            actions: self.actions,
            events: self.events,
        }
    }
}

fn default_deadline() -> String {
    "2s".into()
}
fn default_memory() -> String {
    "64Mi".into()
}
fn default_concurrency() -> u16 {
    4
}
fn default_children() -> u32 {
    crate::grant::DEFAULT_MAX_CHILDREN
}
fn default_actions() -> u32 {
    crate::grant::DEFAULT_MAX_ACTIONS
}
fn default_events() -> u32 {
    crate::grant::DEFAULT_MAX_EVENTS
}

impl Default for ReconcilerLimits {
    fn default() -> Self {
        ReconcilerLimits {
            deadline: default_deadline(),
            memory: default_memory(),
            concurrency: default_concurrency(),
            children: default_children(),
            actions: default_actions(),
            events: default_events(),
        }
    }
}

/// The most reconciles of a new module `spec.rollout.watchReconciles` may watch.
pub const MAX_WATCH_RECONCILES: u32 = 1_000_000;

/// When a newly activated module is rolled back to the previous one.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPolicy {
    /// How many reconciles of a new module are watched (0 disables rollback).
    #[serde(default = "default_watch", deserialize_with = "at_most_watch")]
    #[schemars(range(min = 0, max = MAX_WATCH_RECONCILES))]
    pub watch_reconciles: u32,
    /// The failure rate, in percent, over those reconciles that triggers a rollback.
    #[serde(default = "default_threshold")]
    #[schemars(range(min = 1, max = 100))]
    pub failure_threshold_percent: u32,
}

fn default_watch() -> u32 {
    10
}

/// `watchReconciles` as stored, read at most [`MAX_WATCH_RECONCILES`]: one stored before the
/// schema bounded it (up to int64) must not fail the decode of every WasmReconciler list.
fn at_most_watch<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = u64::deserialize(d)?;
    Ok(u32::try_from(n)
        .unwrap_or(u32::MAX)
        .min(MAX_WATCH_RECONCILES))
}
fn default_threshold() -> u32 {
    50
}

impl Default for RolloutPolicy {
    fn default() -> Self {
        RolloutPolicy {
            watch_reconciles: default_watch(),
            failure_threshold_percent: default_threshold(),
        }
    }
}

/// How the module's `validate` is served at admission.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionPolicy {
    /// How long the API server waits for the webhook, in seconds (1 to 30, default 5). The
    /// module's `validate` call gets this less a margin, capped by `limits.deadline`.
    #[serde(default = "default_admission_timeout")]
    #[schemars(range(min = 1, max = 30))]
    pub timeout_seconds: i32,
    /// What happens when the module fails, times out or the host cannot be reached: `Fail`
    /// (refuse the change; the default) or `Ignore` (let it through).
    #[serde(default)]
    pub failure_policy: FailurePolicy,
}

fn default_admission_timeout() -> i32 {
    5
}

impl Default for AdmissionPolicy {
    fn default() -> Self {
        AdmissionPolicy {
            timeout_seconds: default_admission_timeout(),
            failure_policy: FailurePolicy::default(),
        }
    }
}

/// The admission failure policy (Kubernetes' `failurePolicy`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, JsonSchema)]
pub enum FailurePolicy {
    /// Refuse the change.
    #[default]
    Fail,
    /// Let the change through.
    Ignore,
}

impl FailurePolicy {
    /// As Kubernetes spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Fail => "Fail",
            FailurePolicy::Ignore => "Ignore",
        }
    }
}

/// What the host reports.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = kubernetes_formats)]
pub struct WasmReconcilerStatus {
    /// `Ready`, `ModuleLoaded`, `Degraded`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The module serving now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_module: Option<ActiveModule>,
    // Honoured across restarts, failovers and edits: not served again until the ConfigMap
    // holds another module.
    /// A module digest that was rolled back and is not retried until the ConfigMap changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected_sha256: Option<String>,
    /// What the module asked for that the spec does not grant (not watched, not writable).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ungranted: Vec<String>,
    // A restart, a failover or a follower loads it from there when the module ConfigMap holds
    // another (refused or rolled-back) module; see `crate::modules::copy`.
    /// Where the host keeps a copy of the active module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_copy: Option<ConfigMapKey>,
}

/// The module serving a reconciler.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveModule {
    /// The module's sha256 (hex).
    pub sha256: String,
    /// The module's name, from its metadata.
    pub name: String,
    /// The module's version, from its metadata.
    pub version: String,
    /// When it was activated.
    pub loaded_at: Time,
    /// `compiled` or `cache`.
    pub source: String,
    /// Where the module came from: `configMap <namespace>/<name>` or
    /// `oci <repository>@<manifest digest>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// The keys whose signatures verified the module under the signing policy in force (the
    /// host's `--require-signed-modules` key and `spec.module.oci.verify`'s), re-checked when
    /// a key's ConfigMap or Secret changes; empty when no signature is required.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verified_by: Vec<VerifiedKey>,
}

/// A public key that verified the active module's signature.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerifiedKey {
    /// `sha256:<hex>` of the key's DER SubjectPublicKeyInfo.
    pub fingerprint: String,
    /// Where the key was read from: `spec.module.oci.verify.key`, `ConfigMap <ns>/<name> key
    /// <key>`, `Secret <ns>/<name> key <key>` or `--require-signed-modules <path>`.
    pub source: String,
}

/// The longest `spec.limits.deadline` accepted: a module call is meant to be short, and a longer
/// deadline only holds a pool slot and a thread longer.
pub const MAX_DEADLINE: Duration = Duration::from_secs(5 * 60);

/// The longest `spec.resyncPeriod` (and `--resync`) accepted: 7 days. Longer periods only
/// overflow timers; a reconciler that never wants a resync can use this one.
pub const MAX_RESYNC: Duration = Duration::from_secs(7 * 24 * 3600);

/// The longest duration [`parse_duration`] returns (100 years): far beyond any limit above,
/// far below what a timer can hold.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Parses a Go-style duration: `500ms`, `2s`, `1m30s`, `1h`.
///
/// # Errors
/// A message naming the bad input: not a duration, a negative, infinite or NaN value, or more
/// than [`MAX_DURATION`]. Never panics, whatever the input.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    // Hostile input can be long: quote only its start.
    let shown: String = text.chars().take(40).collect();
    let shown = if shown.len() < text.len() {
        format!("{shown:?}...")
    } else {
        format!("{shown:?}")
    };
    let bad = || format!("{shown} is not a duration (use e.g. 500ms, 2s, 1m30s, 1h)");
    let too_long = || format!("{shown} is longer than the maximum of {MAX_DURATION:?}");
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let value: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        let part = Duration::try_from_secs_f64(value * unit).map_err(|_| too_long())?;
        total = total
            .checked_add(part)
            .filter(|t| *t <= MAX_DURATION)
            .ok_or_else(too_long)?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// Parses `text` as a duration of at most `max`, for the spec field `field`.
///
/// # Errors
/// A message naming the field, the input and the limit.
pub fn parse_bounded_duration(field: &str, text: &str, max: Duration) -> Result<Duration, String> {
    let d = parse_duration(text).map_err(|e| format!("{field}: {e}"))?;
    if d > max {
        return Err(format!(
            "{field}: {d:?} is longer than the maximum of {max:?}"
        ));
    }
    Ok(d)
}

/// Parses a memory quantity: `64Mi`, `1Gi`, `512Ki`, `100M`, `1048576`.
///
/// # Errors
/// A message naming the bad input.
pub fn parse_quantity(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, suffix) = t.split_at(split);
    let shown: String = text.chars().take(40).collect();
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{shown:?} is not a memory quantity (use e.g. 64Mi)"))?;
    let mult: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => {
            return Err(format!(
                "{shown:?} has an unknown unit (use Ki, Mi, Gi, K, M or G)"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{shown:?} is too large"))
}

/// All CRDs the host serves, as YAML documents (what `wasmop crdgen` prints).
pub fn crds_yaml() -> String {
    use kube::CustomResourceExt;
    render_crds("wasmop crdgen", &[WasmReconciler::crd()])
}

/// `crds` as YAML documents, headed by a line naming `command`, which made them.
pub(crate) fn render_crds(
    command: &str,
    crds: &[k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition],
) -> String {
    let mut out =
        format!("# Generated by `{command}`; do not edit. `make test` fails when this drifts.\n");
    for (i, crd) in crds.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        match serde_saphyr::to_string(crd) {
            Ok(yaml) => out.push_str(&yaml),
            Err(e) => out.push_str(&format!("# cannot render YAML: {e}\n")),
        }
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// Labels as a map, for convenience.
pub type Labels = BTreeMap<String, String>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_schemas_use_only_formats_kubernetes_knows() {
        // kubectl warns `unrecognized format "uint32"` for anything else.
        let known = ["int32", "int64", "date-time", "byte", "double", "float"];
        let yaml = crds_yaml();
        let unknown: Vec<&str> = yaml
            .lines()
            .filter_map(|line| line.trim().strip_prefix("format: "))
            .filter(|format| !known.contains(format))
            .collect();
        assert!(
            unknown.is_empty(),
            "formats kubectl warns about: {unknown:?}"
        );
        assert!(yaml.contains("maximum: 10000"), "the bounds stay");
    }

    /// An integer the API server stores but `u32` cannot hold must not fail the decode: one
    /// such WasmReconciler would fail every list of them (kube decodes a list whole), and the
    /// manager and the admission webhook would serve no reconciler at all. New ones are refused
    /// by the schema's bound; one stored before it is read at the bound.
    #[test]
    fn a_watch_count_beyond_its_bound_is_refused_by_the_schema_and_read_at_the_bound() {
        let stored = serde_json::json!({"watchReconciles": 4_294_967_296_u64});
        let policy = serde_json::from_value::<RolloutPolicy>(stored);
        assert!(policy.is_ok(), "{policy:?}");
        assert_eq!(
            policy.ok().map(|p| p.watch_reconciles),
            Some(MAX_WATCH_RECONCILES)
        );
        let yaml = crds_yaml();
        let bounded = yaml
            .split("watchReconciles:")
            .nth(2)
            .map(|schema| schema.lines().take(6).collect::<Vec<_>>().join("\n"))
            .is_some_and(|schema| schema.contains(&format!("maximum: {MAX_WATCH_RECONCILES}")));
        assert!(bounded, "the schema bounds watchReconciles");
    }

    #[test]
    fn durations_and_quantities_parse_like_kubernetes() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("").is_err());
        assert_eq!(parse_quantity("64Mi"), Ok(64 << 20));
        assert_eq!(parse_quantity("1G"), Ok(1_000_000_000));
        assert!(parse_quantity("lots").is_err());
    }

    #[test]
    fn hostile_durations_are_errors_never_panics() {
        for hostile in [
            "99999999999999999999999h",
            "1e400s",
            "18446744073709551616s",
            "9223372036854775807h9223372036854775807h",
            "876001h",
            "1.7976931348623157e308ms",
            "...s",
            "1..2s",
            ".s",
            "-1s",
            "1s-1s",
            "NaNs",
            "infs",
            "1",
            "h",
            "1µs",
            "1 s",
            "\u{0}1s",
        ] {
            assert!(
                parse_duration(hostile).is_err(),
                "{hostile:?} parsed as {:?}",
                parse_duration(hostile)
            );
        }
        // The largest accepted value sums to exactly the maximum.
        assert_eq!(parse_duration("876000h"), Ok(MAX_DURATION));
        assert!(parse_duration("876000h1ms").is_err());
        // A huge input's message quotes only its start.
        let long = "9".repeat(100_000) + "h";
        let e = parse_duration(&long).err().unwrap_or_default();
        assert!(e.len() < 200, "{e}");
    }

    #[test]
    fn bounded_durations_name_the_field_and_the_limit() {
        assert_eq!(
            parse_bounded_duration("spec.resyncPeriod", "10m", MAX_RESYNC),
            Ok(Duration::from_secs(600))
        );
        let e = parse_bounded_duration("spec.resyncPeriod", "200000h", MAX_RESYNC)
            .err()
            .unwrap_or_default();
        assert!(
            e.contains("spec.resyncPeriod") && e.contains("maximum"),
            "{e}"
        );
        let e = parse_bounded_duration(
            "spec.limits.deadline",
            "99999999999999999999999h",
            MAX_DEADLINE,
        )
        .err()
        .unwrap_or_default();
        assert!(e.contains("spec.limits.deadline"), "{e}");
        assert!(parse_bounded_duration("spec.limits.deadline", "6m", MAX_DEADLINE).is_err());
    }

    #[test]
    fn hostile_quantities_are_errors_never_panics() {
        for hostile in [
            "99999999999999999999999Gi",
            "18446744073709551615Gi",
            "-1Mi",
            "1.5Gi",
            "Mi",
            "1Ei",
            "",
        ] {
            assert!(parse_quantity(hostile).is_err(), "{hostile:?}");
        }
    }

    /// A qualified name's name part: at most 63 characters, alphanumeric at both ends, `-`,
    /// `_` and `.` inside.
    fn valid_name_part(s: &str) -> bool {
        let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        s.len() <= 63
            && alnum(s.chars().next())
            && alnum(s.chars().last())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    }

    #[test]
    fn finalizers_are_named_per_reconciler_and_always_valid() {
        assert_eq!(finalizer_for("image-updater"), "wasmop.dev/image-updater");
        assert_ne!(finalizer_for("a"), finalizer_for("b"));
        let long_a = format!("{}.a", "x".repeat(250));
        let long_b = format!("{}.b", "x".repeat(250));
        let (fa, fb) = (finalizer_for(&long_a), finalizer_for(&long_b));
        assert_ne!(fa, fb, "long names that share a prefix stay distinct");
        for f in [
            &fa,
            &fb,
            &finalizer_for(&"y".repeat(63)),
            &finalizer_for("a.b-c"),
        ] {
            let (prefix, name) = f.split_once('/').unwrap_or_default();
            assert_eq!(prefix, "wasmop.dev");
            assert!(valid_name_part(name), "{f}");
        }
        // Cut right after a dot: the name part still ends alphanumeric.
        let dotted = format!("{}.{}", "z".repeat(45), "q".repeat(40));
        let f = finalizer_for(&dotted);
        let (_, name) = f.split_once('/').unwrap_or_default();
        assert!(valid_name_part(name), "{f}");
        assert!(is_finalizer_of(FINALIZER, "anything"));
        assert!(is_finalizer_of("wasmop.dev/web", "web"));
        assert!(!is_finalizer_of("wasmop.dev/web", "other"));
    }
}
