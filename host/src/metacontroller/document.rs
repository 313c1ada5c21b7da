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

use crate::contract::{Gvk, ReconcileRequest};
use crate::crd::{HookSpec, HookVersion};

/// A request's objects, parsed: the parent and the observed children per child kind.
#[derive(Debug, Clone)]
pub struct Observed {
    /// The parent.
    pub parent: Value,
    /// The observed children, per child kind of the controller (in its order).
    pub children: Vec<(Gvk, Vec<Value>)>,
}

impl Observed {
    /// Parses `request`'s objects.
    ///
    /// # Errors
    /// A message when the host handed over text that is not JSON (never expected).
    pub fn of(request: &ReconcileRequest, spec: &HookSpec) -> Result<Observed, String> {
        let parse = |text: &str| serde_json::from_str::<Value>(text).map_err(|e| e.to_string());
        let parent = parse(&request.primary)?;
        let mut children = Vec::new();
        for child in &spec.children {
            let kind = child.gvk();
            let objects = request
                .owned
                .iter()
                .filter(|o| o.kind == kind)
                .flat_map(|o| o.objects.iter())
                .map(|o| parse(o))
                .collect::<Result<Vec<_>, _>>()?;
            children.push((kind, objects));
        }
        Ok(Observed { parent, children })
    }

    /// The parent's namespace (None: cluster-scoped).
    pub fn parent_namespace(&self) -> Option<&str> {
        self.parent
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
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

/// The sync (or, with `finalizing`, finalize) request document.
pub fn sync_document(spec: &HookSpec, observed: &Observed, finalizing: bool) -> Value {
    json!({
        "controller": spec.controller,
        "parent": observed.parent,
        "children": children_map(spec, observed),
        "related": {},
        "finalizing": finalizing,
    })
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
        };
        let doc = sync_document(&spec, &observed, true);
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
