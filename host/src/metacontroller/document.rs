//! The documents a hook receives, made from wasmop's reconcile request: `parent`,
//! `children` keyed as the hook version says, `related` and `finalizing`.
//!
//! # Guarantees
//! - Children are grouped by `Kind.apiVersion` (`Pod.v1`, `ReplicaSet.apps/v1`), every child
//!   kind of the controller present (maybe empty), then keyed by object: hook v1 uses the name,
//!   or `namespace/name` for a namespaced child of a cluster-scoped parent; hook v2 uses
//!   `namespace/name` for every namespaced child and the name for cluster-scoped ones.
//! - The objects are the ones wasmop's caches hold (the children whose controller
//!   ownerReference is the parent), whole.

use serde_json::{Map, Value, json};

use std::collections::BTreeMap;

use crate::contract::{Gvk, ReconcileRequest, Selector};
use crate::crd::{HookSpec, HookVersion};

/// Objects grouped by kind.
pub type Groups = Vec<(Gvk, Vec<Value>)>;

/// A request's objects, parsed: the parent and the observed children per child kind.
#[derive(Debug, Clone)]
pub struct Observed {
    /// The parent.
    pub parent: Value,
    /// The observed children, per child kind of the controller (in its order).
    pub children: Vec<(Gvk, Vec<Value>)>,
    /// The objects of the related resources the customize hook may name (all of them: its
    /// answer selects).
    pub related: Vec<(Gvk, Vec<Value>)>,
    /// A decorator's parent's children that are not its attachments (another decorator's, or
    /// the parent's own controller's), per child kind: neither shown to the hook nor touched.
    pub foreign: Vec<(Gvk, Vec<Value>)>,
}

impl Observed {
    /// Parses `request`'s objects.
    ///
    /// # Errors
    /// A message when the host handed over text that is not JSON (never expected).
    pub fn of(request: &ReconcileRequest, spec: &HookSpec) -> Result<Observed, String> {
        let parse = |text: &str| serde_json::from_str::<Value>(text).map_err(|e| e.to_string());
        let parent = parse(&request.primary)?;
        let of = |groups: &[crate::contract::KindObjects], kind: Gvk| {
            let objects = groups
                .iter()
                .filter(|o| o.kind == kind)
                .flat_map(|o| o.objects.iter())
                .map(|o| parse(o))
                .collect::<Result<Vec<_>, _>>()?;
            Ok::<_, String>((kind, objects))
        };
        let children: Vec<(Gvk, Vec<Value>)> = spec
            .children
            .iter()
            .map(|c| of(&request.owned, c.gvk()))
            .collect::<Result<_, _>>()?;
        let (children, foreign) = attachments(spec, children);
        let related = spec
            .related
            .iter()
            .map(|r| of(&request.related, r.gvk()))
            .collect::<Result<_, _>>()?;
        Ok(Observed {
            parent,
            children,
            related,
            foreign,
        })
    }

    /// Whether `parents` selects the parent.
    pub fn selected(&self, parents: &Parents) -> bool {
        let map = |field: &str| -> BTreeMap<String, String> {
            self.parent
                .pointer(&format!("/metadata/{field}"))
                .and_then(|l| serde_json::from_value(l.clone()).ok())
                .unwrap_or_default()
        };
        parents.selects(&map("labels"), &map("annotations"))
    }

    /// The parent's namespace (None: cluster-scoped).
    pub fn parent_namespace(&self) -> Option<&str> {
        self.parent
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
    }
}

/// The annotation on a DecoratorController's attachments: the controller's name. Only the
/// attachments that carry it are the decorator's (Metacontroller's rule too).
pub const DECORATOR_ANNOTATION: &str = "metacontroller.k8s.io/decorator-controller";

/// `children` split, for a decorator, into its attachments and the rest ([`Observed::foreign`]);
/// a CompositeController's are all its own.
fn attachments(spec: &HookSpec, children: Groups) -> (Groups, Groups) {
    let Some(decorator) = &spec.decorator else {
        let none = children
            .iter()
            .map(|(k, _)| (k.clone(), Vec::new()))
            .collect();
        return (children, none);
    };
    children
        .into_iter()
        .map(|(kind, objects)| {
            let (ours, theirs): (Vec<Value>, Vec<Value>) = objects.into_iter().partition(|o| {
                o.pointer("/metadata/annotations")
                    .and_then(|a| a.get(DECORATOR_ANNOTATION))
                    .and_then(Value::as_str)
                    == Some(decorator.name.as_str())
            });
            ((kind.clone(), ours), (kind, theirs))
        })
        .unzip()
}

/// Which parents a controller syncs (`labelSelector`, and a decorator's
/// `annotationSelector`), parsed once per adapter.
#[derive(Debug, Clone, PartialEq)]
pub struct Parents {
    labels: Matching,
    annotations: Matching,
}

/// One selector of [`Parents`].
#[derive(Debug, Clone, PartialEq)]
enum Matching {
    /// No selector: every parent.
    All,
    /// Those whose labels (annotations) match.
    Selector(Selector),
    /// A selector that is not one (the controller is refused before it gets here).
    Nothing,
}

impl Matching {
    fn of(selector: Option<Value>) -> Self {
        match selector {
            None => Matching::All,
            Some(v) => serde_json::from_value(v).map_or(Matching::Nothing, Matching::Selector),
        }
    }

    fn matches(&self, map: &BTreeMap<String, String>) -> bool {
        match self {
            Matching::All => true,
            Matching::Selector(s) => s.matches(map),
            Matching::Nothing => false,
        }
    }
}

impl Parents {
    /// The parents `spec` selects.
    pub fn of(spec: &HookSpec) -> Self {
        let annotations = spec
            .decorator
            .as_ref()
            .and_then(|d| d.annotation_selector.as_ref())
            .map(super::decorator::as_label_selector);
        Parents {
            labels: Matching::of(spec.parent_selector.clone()),
            annotations: Matching::of(annotations),
        }
    }

    /// Whether a parent with `labels` and `annotations` is selected (by both selectors).
    pub fn selects(
        &self,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> bool {
        self.labels.matches(labels) && self.annotations.matches(annotations)
    }
}

/// `Pod.v1`: how Metacontroller names a kind's group of children.
pub fn group_key(kind: &Gvk) -> String {
    format!("{}.{}", kind.kind, kind.api_version)
}

/// The key of `child` in its group, for hook `version` under a parent in `parent_namespace`.
pub fn child_key(version: HookVersion, parent_namespace: Option<&str>, child: &Value) -> String {
    let name = child
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let namespace = child.pointer("/metadata/namespace").and_then(Value::as_str);
    match (version, namespace, parent_namespace) {
        (HookVersion::V1, Some(ns), None) | (HookVersion::V2, Some(ns), _) => {
            format!("{ns}/{name}")
        }
        _ => name.to_string(),
    }
}

/// The children map of a request document.
fn children_map(spec: &HookSpec, observed: &Observed) -> Value {
    let parent_ns = observed.parent_namespace();
    let groups: Map<String, Value> = observed
        .children
        .iter()
        .map(|(kind, objects)| {
            let keyed: Map<String, Value> = objects
                .iter()
                .map(|o| (child_key(spec.version, parent_ns, o), o.clone()))
                .collect();
            (group_key(kind), Value::Object(keyed))
        })
        .collect();
    Value::Object(groups)
}

/// The sync (or, with `finalizing`, finalize) request document, with `related` (the map
/// [`related_map`] made, or `{}`).
pub fn sync_document(
    spec: &HookSpec,
    observed: &Observed,
    related: Value,
    finalizing: bool,
) -> Value {
    let (parent, children) = match spec.decorator {
        None => ("parent", "children"),
        Some(_) => ("object", "attachments"),
    };
    json!({
        "controller": spec.controller,
        parent: observed.parent,
        children: children_map(spec, observed),
        "related": related,
        "finalizing": finalizing,
    })
}

/// The customize request document.
pub fn customize_document(spec: &HookSpec, observed: &Observed) -> Value {
    json!({"controller": spec.controller, "parent": observed.parent})
}

/// The related map of a sync request: the objects the customize hook's answer (`body`)
/// selects, grouped and keyed as children are; every related resource has a group.
///
/// # Errors
/// Why the answer is refused: not JSON, a resource `spec.wasmop.related` does not list, a
/// selector that is not one, or a `namespaceSelector` (not served).
pub fn related_map(spec: &HookSpec, observed: &Observed, body: &str) -> Result<Value, String> {
    related_rules(spec, observed, body).map_err(|e| crate::text::inert(&e).into_owned())
}

fn related_rules(spec: &HookSpec, observed: &Observed, body: &str) -> Result<Value, String> {
    let answer: Value = serde_json::from_str(body)
        .map_err(|e| format!("the customize hook's answer is not JSON: {e}"))?;
    let rules = match answer.get("relatedResources") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(rules)) => rules.clone(),
        Some(_) => return Err("the customize hook's relatedResources is not a list".into()),
    };
    let parent_ns = observed.parent_namespace();
    let mut groups: Map<String, Value> = observed
        .related
        .iter()
        .map(|(k, _)| (group_key(k), json!({})))
        .collect();
    for (i, rule) in rules.iter().enumerate() {
        let text = |f: &str| rule.get(f).and_then(Value::as_str).unwrap_or_default();
        let Some(((kind, objects), _)) =
            observed.related.iter().zip(&spec.related).find(|(_, r)| {
                r.api_version == text("apiVersion") && r.resource == text("resource")
            })
        else {
            return Err(format!(
                "relatedResources[{i}] names {} in {}, which spec.wasmop.related does not list",
                text("resource"),
                text("apiVersion")
            ));
        };
        if rule.get("namespaceSelector").is_some_and(|v| !v.is_null()) {
            return Err(format!(
                "relatedResources[{i}]: namespaceSelector is not served by wasmop"
            ));
        }
        let selector = match rule.get("labelSelector") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                serde_json::from_value::<Selector>(v.clone())
                    .map_err(|e| format!("relatedResources[{i}].labelSelector: {e}"))?,
            ),
        };
        let names: Vec<&str> = rule
            .get("names")
            .and_then(Value::as_array)
            .map(|n| n.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let namespace = rule
            .get("namespace")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty());
        let group = groups.entry(group_key(kind)).or_insert_with(|| json!({}));
        for o in objects
            .iter()
            .filter(|o| selects(o, namespace, &names, selector.as_ref()))
        {
            if let Some(map) = group.as_object_mut() {
                map.insert(child_key(spec.version, parent_ns, o), o.clone());
            }
        }
    }
    Ok(Value::Object(groups))
}

/// Whether one rule of a customize answer selects `object`.
fn selects(
    object: &Value,
    namespace: Option<&str>,
    names: &[&str],
    selector: Option<&Selector>,
) -> bool {
    let text = |p: &str| object.pointer(p).and_then(Value::as_str);
    let labels: BTreeMap<String, String> = object
        .pointer("/metadata/labels")
        .and_then(|l| serde_json::from_value(l.clone()).ok())
        .unwrap_or_default();
    namespace.is_none_or(|n| text("/metadata/namespace") == Some(n))
        && (names.is_empty() || text("/metadata/name").is_some_and(|n| names.contains(&n)))
        && selector.is_none_or(|s| s.matches(&labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: Option<&str>, name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}})
    }

    #[test]
    fn keys_follow_the_hook_version_and_the_scopes() {
        let p = pod(Some("ns"), "web-0");
        assert_eq!(child_key(HookVersion::V1, Some("ns"), &p), "web-0");
        assert_eq!(child_key(HookVersion::V1, None, &p), "ns/web-0");
        assert_eq!(child_key(HookVersion::V2, Some("ns"), &p), "ns/web-0");
        let cluster = json!({"metadata": {"name": "role"}});
        assert_eq!(child_key(HookVersion::V2, None, &cluster), "role");
        assert_eq!(child_key(HookVersion::V1, None, &cluster), "role");
        assert_eq!(
            group_key(&Gvk::new("apps/v1", "ReplicaSet")),
            "ReplicaSet.apps/v1"
        );
    }

    #[test]
    fn every_child_kind_has_a_group_even_when_empty() {
        let spec: HookSpec = serde_json::from_value(json!({
            "controller": {"kind": "CompositeController"},
            "children": [{"apiVersion": "v1", "kind": "Pod"}, {"apiVersion": "v1", "kind": "PersistentVolumeClaim"}],
            "sync": "/sync"
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let observed = Observed {
            parent: json!({"metadata": {"name": "cs", "namespace": "ns"}}),
            children: vec![
                (Gvk::new("v1", "Pod"), vec![pod(Some("ns"), "cs-0")]),
                (Gvk::new("v1", "PersistentVolumeClaim"), vec![]),
            ],
            related: Vec::new(),
            foreign: Vec::new(),
        };
        let doc = sync_document(&spec, &observed, json!({}), true);
        assert_eq!(
            doc["children"]["Pod.v1"]["cs-0"]["metadata"]["name"],
            "cs-0"
        );
        assert_eq!(doc["children"]["PersistentVolumeClaim.v1"], json!({}));
        assert_eq!(doc["finalizing"], true);
        assert_eq!(doc["related"], json!({}));
        assert_eq!(doc["controller"]["kind"], "CompositeController");
    }
}

#[cfg(test)]
mod related_tests {
    use super::*;

    fn spec() -> HookSpec {
        serde_json::from_value(json!({
            "controller": {},
            "children": [{"apiVersion": "v1", "kind": "ConfigMap"}],
            "sync": "/sync", "customize": "/customize",
            "related": [{"apiVersion": "v1", "resource": "configmaps", "kind": "ConfigMap"}],
            "parentSelector": {"matchLabels": {"version": "v1"}}
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn cm(ns: &str, name: &str, label: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, "labels": {"l": label}}})
    }

    fn observed(version: &str) -> Observed {
        Observed {
            parent: json!({"metadata": {"name": "p", "labels": {"version": version}}}),
            children: vec![(Gvk::new("v1", "ConfigMap"), vec![])],
            related: vec![(
                Gvk::new("v1", "ConfigMap"),
                vec![
                    cm("a", "settings", "x"),
                    cm("b", "settings", "y"),
                    cm("a", "other", "x"),
                ],
            )],
            foreign: Vec::new(),
        }
    }

    #[test]
    fn the_customize_answer_selects_by_namespace_names_and_labels() {
        let by_name = json!({"relatedResources": [{"apiVersion": "v1", "resource": "configmaps", "namespace": "a", "names": ["settings"]}]});
        let map = related_map(&spec(), &observed("v1"), &by_name.to_string())
            .unwrap_or_else(|e| panic!("{e}"));
        let keys: Vec<&String> = map["ConfigMap.v1"]
            .as_object()
            .map(|m| m.keys().collect())
            .unwrap_or_default();
        // A cluster-scoped parent (hook v1): namespaced objects keyed namespace/name.
        assert_eq!(keys, ["a/settings"]);
        let by_label = json!({"relatedResources": [{"apiVersion": "v1", "resource": "configmaps", "labelSelector": {"matchLabels": {"l": "x"}}}]});
        let map = related_map(&spec(), &observed("v1"), &by_label.to_string())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(map["ConfigMap.v1"].as_object().map(|m| m.len()), Some(2));
        let none = related_map(&spec(), &observed("v1"), "{}").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            none,
            json!({"ConfigMap.v1": {}}),
            "every related resource has a group"
        );
    }

    #[test]
    fn a_resource_not_listed_or_a_namespace_selector_is_refused() {
        let secrets = json!({"relatedResources": [{"apiVersion": "v1", "resource": "secrets"}]});
        assert!(related_map(&spec(), &observed("v1"), &secrets.to_string()).is_err());
        let ns_sel = json!({"relatedResources": [{"apiVersion": "v1", "resource": "configmaps", "namespaceSelector": {}}]});
        assert!(related_map(&spec(), &observed("v1"), &ns_sel.to_string()).is_err());
    }

    #[test]
    fn only_parents_matching_the_label_selector_are_selected() {
        let parents = Parents::of(&spec());
        assert!(observed("v1").selected(&parents));
        assert!(!observed("v2").selected(&parents));
    }
}
