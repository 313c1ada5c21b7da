//! How the host names a Kubernetes object: its key (namespace and name) and its controller.
//!
//! A low floor: it imports nothing of the host, so the caches, the controller and sharding
//! can all use it.
//!
//! # Guarantees
//! - [`ObjectKey`] orders and hashes as the pair (namespace, name), cluster-scoped objects
//!   (no namespace) first.
//! - [`controller_of`] finds the one ownerReference with `controller: true` (the API server
//!   allows at most one).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::DynamicObject;

/// An object's key: its namespace (None for a cluster-scoped object) and its name.
///
/// Displayed as `ns/name`, or `name` for a cluster-scoped object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ObjectKey {
    /// The namespace (None: cluster-scoped).
    pub namespace: Option<String>,
    /// The name.
    pub name: String,
}

impl ObjectKey {
    /// The key of `name` in `namespace`.
    pub fn new(namespace: Option<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            namespace,
            name: name.into(),
        }
    }

    /// The key of object `o`.
    pub fn of<K: kube::Resource>(o: &K) -> Self {
        use kube::ResourceExt;
        ObjectKey::new(o.namespace(), o.name_any())
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// The controller ownerReference of an object (the one with `controller: true`), if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// The uid of an object's controller ownerReference.
pub fn controller_uid(o: &DynamicObject) -> Option<String> {
    controller_of(&o.metadata).map(|r| r.uid.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_displays_as_namespace_slash_name() {
        assert_eq!(ObjectKey::new(Some("ns".into()), "a").to_string(), "ns/a");
        assert_eq!(ObjectKey::new(None, "a").to_string(), "a");
    }

    #[test]
    fn keys_order_as_the_namespace_name_pair() {
        let mut keys = [
            ObjectKey::new(Some("b".into()), "a"),
            ObjectKey::new(Some("a".into()), "b"),
            ObjectKey::new(None, "z"),
        ];
        keys.sort();
        let pairs: Vec<(Option<&str>, &str)> = keys
            .iter()
            .map(|k| (k.namespace.as_deref(), k.name.as_str()))
            .collect();
        assert_eq!(pairs, [(None, "z"), (Some("a"), "b"), (Some("b"), "a")]);
    }

    #[test]
    fn the_controller_is_the_reference_marked_controller() {
        let o: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "ownerReferences": [
                {"apiVersion": "v1", "kind": "A", "name": "a", "uid": "u-a"},
                {"apiVersion": "v1", "kind": "B", "name": "b", "uid": "u-b", "controller": true}
            ]}
        }))
        .unwrap_or_else(|e| panic!("literal: {e}"));
        assert_eq!(
            controller_of(&o.metadata).map(|r| r.name.as_str()),
            Some("b")
        );
        assert_eq!(controller_uid(&o).as_deref(), Some("u-b"));
    }
}
