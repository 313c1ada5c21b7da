//! A DecoratorController, as the WasmReconciler that serves it: which of its features wasmop
//! refuses, and the spec it writes for the rest (see [`super::spec`] for CompositeControllers).
//!
//! # Guarantees
//! - A controller is either served as its YAML says or refused with one reason naming the
//!   field.
//! - Its WasmReconciler's primary is the decorated resource, its owned kinds the attachments';
//!   `spec.hook.decorator` tells the adapter to speak the decorator's documents.
//!
//! # Caveats
//! - One resource per controller: Metacontroller lets `spec.resources` list several, wasmop
//!   refuses that (one WasmReconciler serves one primary kind); split the controller in one per
//!   resource, which the same module serves.

use crate::crd::{DecoratorHook, WasmReconcilerSpec};

use super::api::{DecoratedResource, DecoratorController};
use super::spec::{
    ATTACHMENT_METHOD, Kinds, Parts, Refusal, build, controller_document, hooks_refusal,
    name_refusal, refuse, selector_refusal,
};

/// The name of the WasmReconciler serving DecoratorController `name`.
pub fn reconciler_name(name: &str) -> String {
    format!("decoratorcontroller-{name}")
}

/// The first feature of `dc` that wasmop does not serve, if any.
pub fn refusal(dc: &DecoratorController) -> Option<Refusal> {
    let name = dc.metadata.name.as_deref().unwrap_or_default();
    let spec = &dc.spec;
    name_refusal(&reconciler_name(name))
        .or_else(|| resources_refusal(&spec.resources))
        .or_else(|| hooks_refusal("a DecoratorController", &spec.hooks, spec.wasmop.as_ref()))
        .or_else(|| {
            spec.attachments.iter().find_map(|a| {
                let strategy = a.update_strategy.as_ref();
                match strategy.and_then(|u| u.method.as_deref()) {
                    None | Some("" | "OnDelete" | "Recreate" | "InPlace") => None,
                    Some(other) => Some(refuse(
                        ATTACHMENT_METHOD,
                        format!(
                            "{other:?} is not an attachment update method (OnDelete, Recreate, InPlace)"
                        ),
                    )),
                }
            })
        })
}

fn resources_refusal(resources: &[DecoratedResource]) -> Option<Refusal> {
    let [resource] = resources else {
        return Some(refuse(
            "spec.resources",
            format!(
                "lists {} resources: wasmop serves one resource per DecoratorController (split it into one controller per resource; the same module can serve them all)",
                resources.len()
            ),
        ));
    };
    selector_refusal(
        "spec.resources[0].labelSelector",
        resource.label_selector.as_ref(),
    )
    .or_else(|| {
        let annotations = resource.annotation_selector.as_ref()?;
        selector_refusal(
            "spec.resources[0].annotationSelector",
            Some(&as_label_selector(annotations)),
        )
    })
}

/// An annotation selector (`matchAnnotations`, `matchExpressions`) in a label selector's shape
/// (`matchLabels`), to be parsed and matched like one.
pub fn as_label_selector(annotations: &serde_json::Value) -> serde_json::Value {
    let mut selector = annotations.clone();
    if let Some(map) = selector.as_object_mut()
        && let Some(exact) = map.remove("matchAnnotations")
    {
        map.insert("matchLabels".into(), exact);
    }
    selector
}

/// The spec of the WasmReconciler serving `dc` (which [`refusal`] passed), or why not.
///
/// # Errors
/// A [`Refusal`] when `dc` has no `spec.wasmop`, or an attachment kind is the decorated one.
pub fn reconciler_spec(
    dc: &DecoratorController,
    kinds: &Kinds,
) -> Result<WasmReconcilerSpec, Refusal> {
    let resource = dc
        .spec
        .resources
        .first()
        .ok_or_else(|| refuse("spec.resources", "lists no resource"))?;
    let strategies = dc
        .spec
        .attachments
        .iter()
        .map(|a| a.update_strategy.clone())
        .collect();
    build(
        Parts {
            controller: controller_document("DecoratorController", &dc.metadata, &dc.spec),
            wasmop: dc.spec.wasmop.as_ref(),
            hooks: dc.spec.hooks.clone().unwrap_or_default(),
            strategies: ("spec.attachments", strategies),
            parent_selector: resource.label_selector.clone(),
            ignore_status_changes: resource.ignore_status_changes,
            resync_period_seconds: dc.spec.resync_period_seconds,
            decorator: Some(DecoratorHook {
                name: dc.metadata.name.clone().unwrap_or_default(),
                annotation_selector: resource.annotation_selector.clone(),
            }),
        },
        kinds,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{KindRef, UpdateMethod};
    use crate::metacontroller::api::DecoratorControllerSpec;

    /// Metacontroller's service-per-pod example, with `spec.wasmop`.
    fn service_per_pod() -> DecoratorController {
        let spec: DecoratorControllerSpec = serde_json::from_value(serde_json::json!({
            "resources": [{"apiVersion": "apps/v1", "resource": "statefulsets",
                "annotationSelector": {"matchExpressions": [
                    {"key": "service-per-pod-label", "operator": "Exists"},
                    {"key": "service-per-pod-ports", "operator": "Exists"}]}}],
            "attachments": [{"apiVersion": "v1", "resource": "services"}],
            "hooks": {
                "sync": {"webhook": {"url": "http://service-per-pod.metacontroller/sync-service-per-pod"}},
                "finalize": {"webhook": {"url": "http://service-per-pod.metacontroller/finalize-service-per-pod"}}},
            "wasmop": {"module": {"configMap": {"namespace": "wasmop-system", "name": "hooks"}},
                "serviceAccount": {"namespace": "wasmop-system", "name": "service-per-pod"}}
        }))
        .unwrap_or_else(|e| panic!("spec: {e}"));
        DecoratorController::new("service-per-pod", spec)
    }

    fn kinds() -> Kinds {
        let k = |a: &str, k: &str| KindRef {
            api_version: a.into(),
            kind: k.into(),
        };
        Kinds {
            parent: k("apps/v1", "StatefulSet"),
            children: vec![k("v1", "Service")],
            related: Vec::new(),
        }
    }

    #[test]
    fn service_per_pod_is_served_as_a_decorator_of_statefulsets() {
        let dc = service_per_pod();
        assert_eq!(refusal(&dc), None);
        let spec = reconciler_spec(&dc, &kinds()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(spec.primary.kind, "StatefulSet");
        assert_eq!(spec.owns, kinds().children);
        let hook = spec.hook.unwrap_or_else(|| panic!("a hook spec"));
        assert_eq!(hook.sync, "/sync-service-per-pod");
        assert_eq!(hook.finalize.as_deref(), Some("/finalize-service-per-pod"));
        assert_eq!(hook.children[0].method, UpdateMethod::OnDelete);
        assert_eq!(hook.controller["kind"], "DecoratorController");
        assert!(hook.controller["spec"].get("wasmop").is_none());
        let decorator = hook.decorator.unwrap_or_else(|| panic!("a decorator"));
        assert_eq!(decorator.name, "service-per-pod");
        assert!(decorator.annotation_selector.is_some());
        assert!(hook.sync_on_status, "Metacontroller's default");
    }

    #[test]
    fn several_resources_rolling_methods_and_bad_selectors_are_refused_naming_the_field() {
        let mut two = service_per_pod();
        let first = two.spec.resources[0].clone();
        two.spec.resources.push(first);
        assert_eq!(refusal(&two).map(|r| r.field), Some("spec.resources"));
        let mut none = service_per_pod();
        none.spec.resources.clear();
        assert_eq!(refusal(&none).map(|r| r.field), Some("spec.resources"));
        let mut rolling = service_per_pod();
        rolling.spec.attachments[0].update_strategy =
            Some(crate::metacontroller::api::UpdateStrategy {
                method: Some("RollingRecreate".into()),
                status_checks: None,
            });
        assert_eq!(refusal(&rolling).map(|r| r.field), Some(ATTACHMENT_METHOD));
        let mut bad = service_per_pod();
        bad.spec.resources[0].annotation_selector =
            Some(serde_json::json!({"matchAnnotations": "not a map"}));
        assert_eq!(
            refusal(&bad).map(|r| r.field),
            Some("spec.resources[0].annotationSelector")
        );
        let mut no_sync = service_per_pod();
        no_sync.spec.hooks = None;
        assert_eq!(refusal(&no_sync).map(|r| r.field), Some("spec.hooks.sync"));
        let mut long = service_per_pod();
        long.metadata.name = Some("x".repeat(240));
        assert_eq!(refusal(&long).map(|r| r.field), Some("metadata.name"));
    }

    #[test]
    fn an_annotation_selector_reads_as_a_label_selector() {
        let selector: crate::contract::Selector = serde_json::from_value(as_label_selector(
            &serde_json::json!({"matchAnnotations": {"a": "b"},
                "matchExpressions": [{"key": "c", "operator": "Exists"}]}),
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let with = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(selector.matches(&with(&[("a", "b"), ("c", "")])));
        assert!(!selector.matches(&with(&[("a", "b")])));
        assert!(!selector.matches(&with(&[("a", "x"), ("c", "")])));
    }
}
