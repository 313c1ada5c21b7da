//! A CompositeController, as the WasmReconciler that serves it: which of Metacontroller's
//! features wasmop refuses, and the spec it writes for the rest.
//!
//! # Guarantees
//! - A controller is either served as its YAML says or refused with one reason naming the
//!   field: wasmop never serves it in some other way.
//! - Pure: the caller resolves the resources to kinds first ([`Kinds`]).

use crate::crd::{
    HookChild, HookResource, HookSpec, HookVersion, KindRef, ReconcilerLimits, RelatedGrant,
    UpdateMethod, WasmReconcilerSpec,
};

use super::api::{CompositeController, Hook};

/// The kinds behind a controller's resources, resolved by the API server.
#[derive(Debug, Clone, PartialEq)]
pub struct Kinds {
    /// The parent's kind.
    pub parent: KindRef,
    /// The children's kinds, in `childResources` order.
    pub children: Vec<KindRef>,
    /// The related resources' kinds, in `spec.wasmop.related` order.
    pub related: Vec<KindRef>,
}

/// Why a controller is not served: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The field (`spec.hooks.customize`).
    pub field: &'static str,
    /// Why, for the person who wrote it.
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

pub(super) fn refuse(field: &'static str, message: impl Into<String>) -> Refusal {
    Refusal {
        field,
        message: message.into(),
    }
}

/// The longest object name Kubernetes allows.
pub(super) const MAX_NAME: usize = 253;

/// The name of the WasmReconciler serving CompositeController `name`.
pub fn reconciler_name(name: &str) -> String {
    format!("compositecontroller-{name}")
}

/// The first feature of `cc` that wasmop does not serve, if any.
pub fn refusal(cc: &CompositeController) -> Option<Refusal> {
    let name = cc.metadata.name.as_deref().unwrap_or_default();
    let spec = &cc.spec;
    name_refusal(&reconciler_name(name))
        .or_else(|| hooks_refusal("a CompositeController", &spec.hooks, spec.wasmop.as_ref()))
        .or_else(|| {
            selector_refusal(
                "spec.parentResource.labelSelector",
                spec.parent_resource.label_selector.as_ref(),
            )
        })
        .or_else(|| {
            spec.child_resources.iter().find_map(|c| {
                let method = c.update_strategy.as_ref().and_then(|u| u.method.as_deref());
                method_of(CHILD_METHOD, method).err()
            })
        })
}

/// Refuses a WasmReconciler name (`wr`) Kubernetes would refuse.
pub(super) fn name_refusal(wr: &str) -> Option<Refusal> {
    (wr.len() > MAX_NAME).then(|| {
        refuse(
            "metadata.name",
            format!(
                "its WasmReconciler's name, {wr:?}, would be over the {MAX_NAME} characters Kubernetes allows: shorten the controller's name"
            ),
        )
    })
}

/// Refuses what `hooks` ask that wasmop does not serve (`what`: `a CompositeController`).
pub(super) fn hooks_refusal(
    what: &str,
    hooks: &Option<super::api::Hooks>,
    wasmop: Option<&super::api::WasmopHooks>,
) -> Option<Refusal> {
    let hooks = hooks.clone().unwrap_or_default();
    let related = wasmop.is_some_and(|w| !w.related.is_empty());
    let checks: [(bool, &'static str, String); 4] = [
        (
            hooks.sync.is_none(),
            "spec.hooks.sync",
            format!("{what} needs a sync hook"),
        ),
        (
            hooks.customize.is_some() && !related,
            "spec.wasmop.related",
            "the customize hook names related resources: list the ones it may name here (apiVersion and resource), so wasmop watches them".into(),
        ),
        (
            hooks.pre_update_child.is_some(),
            "spec.hooks.preUpdateChild",
            "not served by wasmop".into(),
        ),
        (
            hooks.post_update_child.is_some(),
            "spec.hooks.postUpdateChild",
            "not served by wasmop".into(),
        ),
    ];
    if let Some((_, field, message)) = checks.into_iter().find(|(bad, _, _)| *bad) {
        return Some(refuse(field, message));
    }
    [
        ("spec.hooks.sync", &hooks.sync),
        ("spec.hooks.finalize", &hooks.finalize),
        ("spec.hooks.customize", &hooks.customize),
    ]
    .into_iter()
    .find_map(|(field, hook)| hook.as_ref().and_then(|h| hook_refusal(field, h)))
    .or_else(|| mixed_versions_refusal(&hooks))
}

/// Refuses hooks whose versions or response modes differ from the sync hook's: wasmop speaks
/// the sync hook's to every hook, where Metacontroller speaks each hook's own (a v1 finalize
/// hook beside a v2 sync hook would get children keyed as it does not expect).
fn mixed_versions_refusal(hooks: &super::api::Hooks) -> Option<Refusal> {
    let version = |h: &Hook| h.version.clone().unwrap_or_else(|| "v1".into());
    let mode = |h: &Hook| {
        h.webhook
            .as_ref()
            .and_then(|w| w.response_unmarshall_mode.clone())
    };
    let sync = hooks.sync.as_ref()?;
    [
        ("spec.hooks.finalize", &hooks.finalize),
        ("spec.hooks.customize", &hooks.customize),
    ]
    .into_iter()
    .find_map(|(field, hook)| {
        let hook = hook.as_ref()?;
        (version(hook) != version(sync) || mode(hook) != mode(sync)).then(|| {
            refuse(
                field,
                "its version or responseUnMarshallMode differs from the sync hook's: wasmop serves one for every hook of a controller",
            )
        })
    })
}

/// Refuses a label selector (in `field`) that is not one.
pub(super) fn selector_refusal(
    field: &'static str,
    selector: Option<&serde_json::Value>,
) -> Option<Refusal> {
    let e = serde_json::from_value::<crate::contract::Selector>(selector?.clone()).err()?;
    Some(refuse(field, format!("not a label selector: {e}")))
}

pub(super) fn hook_refusal(field: &'static str, hook: &Hook) -> Option<Refusal> {
    match hook.version.as_deref() {
        None | Some("v1" | "v2") => {}
        Some(other) => return Some(refuse(field, format!("hook version {other:?}: v1 or v2"))),
    }
    let mode = hook
        .webhook
        .as_ref()
        .and_then(|w| w.response_unmarshall_mode.as_deref());
    match mode {
        None | Some("loose" | "strict") => None,
        Some(other) => Some(refuse(
            field,
            format!("responseUnMarshallMode {other:?}: loose or strict"),
        )),
    }
}

/// The field of a child resource's update method.
const CHILD_METHOD: &str = "spec.childResources[].updateStrategy.method";

/// The field of an attachment resource's update method.
pub(super) const ATTACHMENT_METHOD: &str = "spec.attachments[].updateStrategy.method";

/// The update method `method` names (in `field`).
pub(super) fn method_of(
    field: &'static str,
    method: Option<&str>,
) -> Result<UpdateMethod, Refusal> {
    Ok(match method {
        None | Some("" | "OnDelete") => UpdateMethod::OnDelete,
        Some("Recreate") => UpdateMethod::Recreate,
        Some("InPlace") => UpdateMethod::InPlace,
        Some("RollingRecreate") => UpdateMethod::RollingRecreate,
        Some("RollingInPlace") => UpdateMethod::RollingInPlace,
        Some(other) => {
            return Err(refuse(
                field,
                format!(
                    "{other:?} is not a Metacontroller update method (OnDelete, Recreate, InPlace, RollingRecreate, RollingInPlace)"
                ),
            ));
        }
    })
}

/// The path a hook is called with: its webhook's `path`, else the path of its `url`, else
/// `/<default>`.
pub fn hook_path(hook: &Hook, default: &str) -> String {
    let webhook = hook.webhook.as_ref();
    if let Some(path) = webhook.and_then(|w| w.path.clone()) {
        return path;
    }
    let from_url = webhook
        .and_then(|w| w.url.as_deref())
        .and_then(|u| u.split_once("://").map(|(_, rest)| rest))
        .and_then(|rest| rest.find('/').map(|i| rest[i..].to_string()));
    from_url.unwrap_or_else(|| format!("/{default}"))
}

/// The spec of the WasmReconciler serving `cc` (which [`refusal`] passed), or why not.
///
/// # Errors
/// A [`Refusal`] when `cc` has no `spec.wasmop`, or a child kind is the parent's.
pub fn reconciler_spec(
    cc: &CompositeController,
    kinds: &Kinds,
) -> Result<WasmReconcilerSpec, Refusal> {
    let parent = &cc.spec.parent_resource;
    build(
        Parts {
            controller: controller_document("CompositeController", &cc.metadata, &cc.spec),
            wasmop: cc.spec.wasmop.as_ref(),
            hooks: cc.spec.hooks.clone().unwrap_or_default(),
            strategies: (
                "spec.childResources",
                cc.spec
                    .child_resources
                    .iter()
                    .map(|c| c.update_strategy.clone())
                    .collect(),
            ),
            parent_selector: parent.label_selector.clone(),
            ignore_status_changes: parent.ignore_status_changes,
            resync_period_seconds: cc.spec.resync_period_seconds,
            decorator: None,
        },
        kinds,
    )
}

/// A controller, as its WasmReconciler's spec is made from it.
pub(super) struct Parts<'a> {
    /// What hooks receive in `controller`.
    pub controller: serde_json::Value,
    /// `spec.wasmop`.
    pub wasmop: Option<&'a super::api::WasmopHooks>,
    /// `spec.hooks`.
    pub hooks: super::api::Hooks,
    /// The field of the child (attachment) resources, and their update strategies in order.
    pub strategies: (&'static str, Vec<Option<super::api::UpdateStrategy>>),
    /// The parents' label selector.
    pub parent_selector: Option<serde_json::Value>,
    /// `ignoreStatusChanges`.
    pub ignore_status_changes: Option<bool>,
    /// `resyncPeriodSeconds`.
    pub resync_period_seconds: Option<i32>,
    /// A DecoratorController's part of the hook spec.
    pub decorator: Option<crate::crd::DecoratorHook>,
}

/// The WasmReconciler spec of a controller's `parts`, its resources resolved to `kinds`.
///
/// # Errors
/// A [`Refusal`] when there is no `spec.wasmop`, a child kind is the parent's, or an update
/// method is not one.
pub(super) fn build(parts: Parts<'_>, kinds: &Kinds) -> Result<WasmReconcilerSpec, Refusal> {
    let wasmop = parts
        .wasmop
        .ok_or_else(|| refuse("spec.wasmop", "absent: the controller is Metacontroller's"))?;
    let (children_field, strategies) = parts.strategies;
    if kinds.children.contains(&kinds.parent) {
        return Err(refuse(
            children_field,
            "a child resource is the parent resource",
        ));
    }
    let hooks = parts.hooks;
    let sync = hooks.sync.clone().unwrap_or_default();
    let version = match sync.version.as_deref() {
        Some("v2") => HookVersion::V2,
        _ => HookVersion::V1,
    };
    let mode = sync
        .webhook
        .as_ref()
        .and_then(|w| w.response_unmarshall_mode.as_deref());
    let strict = mode.map_or(version == HookVersion::V2, |m| m == "strict");
    let method_field = if parts.decorator.is_some() {
        ATTACHMENT_METHOD
    } else {
        CHILD_METHOD
    };
    let mut children = Vec::new();
    for (strategy, kind) in strategies.into_iter().zip(&kinds.children) {
        let strategy = strategy.unwrap_or_default();
        children.push(HookChild {
            api_version: kind.api_version.clone(),
            kind: kind.kind.clone(),
            method: method_of(method_field, strategy.method.as_deref())?,
            status_checks: strategy
                .status_checks
                .map(|s| s.conditions)
                .unwrap_or_default(),
        });
    }
    let hook = HookSpec {
        controller: parts.controller,
        version,
        strict,
        children,
        sync: hook_path(&sync, "sync"),
        finalize: hooks.finalize.as_ref().map(|h| hook_path(h, "finalize")),
        customize: hooks.customize.as_ref().map(|h| hook_path(h, "customize")),
        related: wasmop
            .related
            .iter()
            .zip(&kinds.related)
            .map(|(r, k)| HookResource {
                api_version: r.api_version.clone(),
                resource: r.resource.clone(),
                kind: k.kind.clone(),
            })
            .collect(),
        parent_selector: parts.parent_selector,
        sync_on_status: parts.ignore_status_changes != Some(true),
        decorator: parts.decorator,
    };
    Ok(WasmReconcilerSpec {
        module: wasmop.module.clone(),
        primary: kinds.parent.clone(),
        owns: kinds.children.clone(),
        related: kinds
            .related
            .iter()
            .map(|k| RelatedGrant {
                api_version: k.api_version.clone(),
                kind: k.kind.clone(),
                selector: None,
                write: false,
            })
            .collect(),
        namespaces: wasmop.namespaces.clone(),
        service_account: wasmop.service_account.clone(),
        limits: limits(wasmop.limits.clone(), &sync),
        resync_period: parts
            .resync_period_seconds
            .filter(|s| *s > 0)
            .map(|s| format!("{s}s")),
        rollout: Default::default(),
        admission: Default::default(),
        config: None,
        hook: Some(hook),
    })
}

/// The controller as hooks receive it: apiVersion, kind, name, uid and spec (without
/// `spec.wasmop`, which is wasmop's and says where the module is, not what it does).
pub(super) fn controller_document(
    kind: &str,
    meta: &kube::api::ObjectMeta,
    spec: &impl serde::Serialize,
) -> serde_json::Value {
    let mut spec = serde_json::to_value(spec).unwrap_or_default();
    if let Some(map) = spec.as_object_mut() {
        map.remove("wasmop");
    }
    serde_json::json!({
        "apiVersion": "metacontroller.k8s.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": meta.name, "uid": meta.uid},
        "spec": spec,
    })
}

/// `spec.wasmop.limits`, else a WasmReconciler's defaults with the sync webhook's timeout
/// (Metacontroller's default 10s) as the deadline and 128Mi of memory (a JavaScript or Python
/// interpreter with its heap).
pub(super) fn limits(given: Option<ReconcilerLimits>, sync: &Hook) -> ReconcilerLimits {
    given.unwrap_or_else(|| {
        let timeout = sync.webhook.as_ref().and_then(|w| w.timeout.clone());
        ReconcilerLimits {
            deadline: timeout.unwrap_or_else(|| "10s".into()),
            memory: "128Mi".into(),
            ..ReconcilerLimits::default()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metacontroller::api::CompositeControllerSpec;

    fn catset() -> CompositeController {
        let spec: CompositeControllerSpec = serde_json::from_value(serde_json::json!({
            "parentResource": {"apiVersion": "ctl.enisoc.com/v1", "resource": "catsets",
                "revisionHistory": {"fieldPaths": ["spec.template"]}},
            "childResources": [
                {"apiVersion": "v1", "resource": "pods", "updateStrategy": {"method": "RollingRecreate",
                    "statusChecks": {"conditions": [{"type": "Ready", "status": "True"}]}}},
                {"apiVersion": "v1", "resource": "persistentvolumeclaims"}],
            "hooks": {"sync": {"webhook": {"url": "http://catset-controller.metacontroller/sync"}},
                "finalize": {"webhook": {"url": "http://catset-controller.metacontroller/sync"}}},
            "wasmop": {"module": {"configMap": {"namespace": "wasmop-system", "name": "catset-hook"}},
                "serviceAccount": {"namespace": "wasmop-system", "name": "catset-hook"}}
        }))
        .unwrap_or_else(|e| panic!("spec: {e}"));
        CompositeController::new("catset-controller", spec)
    }

    fn kinds() -> Kinds {
        let k = |a: &str, k: &str| KindRef {
            api_version: a.into(),
            kind: k.into(),
        };
        Kinds {
            parent: k("ctl.enisoc.com/v1", "CatSet"),
            children: vec![k("v1", "Pod"), k("v1", "PersistentVolumeClaim")],
            related: Vec::new(),
        }
    }

    #[test]
    fn catset_is_served_with_its_strategies_paths_and_a_finalizer() {
        let cc = catset();
        assert_eq!(refusal(&cc), None);
        let spec = reconciler_spec(&cc, &kinds()).unwrap_or_else(|e| panic!("{e}"));
        let hook = spec.hook.unwrap_or_else(|| panic!("a hook spec"));
        assert_eq!(hook.sync, "/sync");
        assert_eq!(hook.finalize.as_deref(), Some("/sync"));
        assert_eq!(hook.version, HookVersion::V1);
        assert!(!hook.strict);
        assert_eq!(hook.children[0].method, UpdateMethod::RollingRecreate);
        assert_eq!(hook.children[0].status_checks[0].type_, "Ready");
        assert_eq!(hook.children[1].method, UpdateMethod::OnDelete);
        assert_eq!(spec.owns, kinds().children);
        assert_eq!(spec.limits.deadline, "10s");
        assert!(hook.controller.pointer("/spec/wasmop").is_none());
        assert_eq!(
            hook.controller["spec"]["parentResource"]["resource"],
            "catsets"
        );
    }

    /// Metacontroller syncs a parent when its status changes, unless the controller says
    /// `parentResource.ignoreStatusChanges: true` (daemonjob's hook relies on it).
    #[test]
    fn status_changes_sync_unless_the_controller_ignores_them() {
        let sync_on_status = |ignore: Option<bool>| {
            let mut cc = catset();
            cc.spec.parent_resource.ignore_status_changes = ignore;
            let spec = reconciler_spec(&cc, &kinds()).unwrap_or_else(|e| panic!("{e}"));
            spec.hook
                .unwrap_or_else(|| panic!("a hook spec"))
                .sync_on_status
        };
        assert!(sync_on_status(None), "Metacontroller's default");
        assert!(sync_on_status(Some(false)));
        assert!(!sync_on_status(Some(true)));
    }

    /// Metacontroller speaks each hook's own version; wasmop the sync hook's to all: a
    /// controller whose hooks differ is refused (naming the hook), not served wrongly.
    #[test]
    fn hooks_of_different_versions_are_refused() {
        let mut cc = catset();
        if let Some(h) = cc.spec.hooks.as_mut() {
            h.finalize = Some(Hook {
                version: Some("v2".into()),
                ..Hook::default()
            });
        }
        assert_eq!(refusal(&cc).map(|r| r.field), Some("spec.hooks.finalize"));
        if let Some(h) = cc.spec.hooks.as_mut()
            && let Some(sync) = h.sync.as_mut()
        {
            sync.version = Some("v2".into());
        }
        assert_eq!(refusal(&cc), None);
    }

    #[test]
    fn what_wasmop_does_not_serve_is_refused_naming_the_field() {
        let mut cc = catset();
        cc.metadata.name = Some("c".repeat(240));
        assert_eq!(refusal(&cc).map(|r| r.field), Some("metadata.name"));
        let mut cc = catset();
        if let Some(h) = cc.spec.hooks.as_mut() {
            h.customize = Some(Hook::default());
        }
        assert_eq!(refusal(&cc).map(|r| r.field), Some("spec.wasmop.related"));
        if let Some(w) = cc.spec.wasmop.as_mut() {
            w.related = vec![super::super::api::RelatedResource {
                api_version: "v1".into(),
                resource: "configmaps".into(),
            }];
        }
        assert_eq!(refusal(&cc), None);
        cc.spec.parent_resource.label_selector = Some(serde_json::json!({"matchLabels": "v1"}));
        assert_eq!(
            refusal(&cc).map(|r| r.field),
            Some("spec.parentResource.labelSelector")
        );
        let mut cc = catset();
        cc.spec.child_resources[1].update_strategy = Some(super::super::api::UpdateStrategy {
            method: Some("Sometimes".into()),
            status_checks: None,
        });
        let r = refusal(&cc).unwrap_or_else(|| panic!("refused"));
        assert!(r.message.contains("Sometimes"), "{r}");
        let mut cc = catset();
        cc.spec.wasmop = None;
        assert!(reconciler_spec(&cc, &kinds()).is_err());
    }

    #[test]
    fn paths_come_from_path_then_url_then_the_hook_name() {
        let hook = |w: serde_json::Value| -> Hook {
            serde_json::from_value(serde_json::json!({"webhook": w}))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        assert_eq!(
            hook_path(
                &hook(serde_json::json!({"url": "http://x.y:80/a/b"})),
                "sync"
            ),
            "/a/b"
        );
        assert_eq!(
            hook_path(
                &hook(serde_json::json!({"path": "/p", "url": "http://x/q"})),
                "sync"
            ),
            "/p"
        );
        assert_eq!(
            hook_path(&hook(serde_json::json!({"url": "http://x"})), "finalize"),
            "/finalize"
        );
        assert_eq!(hook_path(&Hook::default(), "sync"), "/sync");
    }
}
