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
//! - [`parse`] returns what `serde_json::from_str::<DynamicObject>` returns for the same text.
//! - [`Unread`] reads nothing of a body but that it is JSON.

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

/// Implements `kube::Resource` for `$t` (a type with a `metadata: ObjectMeta` field) as
/// `DynamicObject` does: the kind comes from the `ApiResource` the `Api` or store is built with.
macro_rules! dynamic_resource {
    ($t:ty) => {
        impl kube::Resource for $t {
            type DynamicType = kube::api::ApiResource;
            type Scope = kube::core::DynamicResourceScope;

            fn group(dt: &kube::api::ApiResource) -> std::borrow::Cow<'_, str> {
                dt.group.as_str().into()
            }

            fn version(dt: &kube::api::ApiResource) -> std::borrow::Cow<'_, str> {
                dt.version.as_str().into()
            }

            fn kind(dt: &kube::api::ApiResource) -> std::borrow::Cow<'_, str> {
                dt.kind.as_str().into()
            }

            fn api_version(dt: &kube::api::ApiResource) -> std::borrow::Cow<'_, str> {
                dt.api_version.as_str().into()
            }

            fn plural(dt: &kube::api::ApiResource) -> std::borrow::Cow<'_, str> {
                dt.plural.as_str().into()
            }

            fn meta(&self) -> &kube::api::ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut kube::api::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use dynamic_resource;

/// The answer to a write whose body the host does not read (a child's apply, a status apply,
/// a patch or delete of an action): `Api<Unread>` makes the request as `Api<DynamicObject>`
/// does, and its answer is skipped through, not built into a `serde_json::Value` tree and
/// dropped (3.5% of a converging host's CPU, docs/benchmarks.md, "Profile").
///
/// # Guarantees
/// - A body that is not JSON is still an error, as for `DynamicObject`; an error answer is
///   kube's error (its `Status` is read by kube, not through this type).
/// - Its `kube::Resource` implementation is `DynamicObject`'s: the kind comes from the
///   `ApiResource` the `Api` is built with. Its metadata is always empty.
#[derive(Clone, Debug, Default)]
pub struct Unread {
    metadata: ObjectMeta,
}

impl<'de> serde::Deserialize<'de> for Unread {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d)?;
        Ok(Unread::default())
    }
}

dynamic_resource!(Unread);

/// The controller ownerReference of an object (the one with `controller: true`), if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// The uid of an object's controller ownerReference.
pub fn controller_uid<K: kube::Resource>(o: &K) -> Option<String> {
    controller_of(o.meta()).map(|r| r.uid.clone())
}

/// Parses an object's JSON text, as `serde_json::from_str::<DynamicObject>` does, without its
/// cost: `DynamicObject`'s two flattened fields make serde buffer the whole object in an
/// intermediate tree before building the `Value` (the host parses its cached children and
/// primary on every reconcile). Text that is not an object with string `apiVersion` and
/// `kind` and an object `metadata` (never the API server's) takes serde's path.
pub fn parse(json: &str) -> serde_json::Result<DynamicObject> {
    use serde_json::Value;
    let Ok(mut map) = serde_json::from_str::<serde_json::Map<String, Value>>(json) else {
        return serde_json::from_str(json);
    };
    let (Some(Value::String(_)), Some(Value::String(_)), Some(Value::Object(_))) =
        (map.get("apiVersion"), map.get("kind"), map.get("metadata"))
    else {
        return serde_json::from_str(json);
    };
    let mut text = |field: &str| match map.remove(field) {
        Some(Value::String(s)) => s,
        _ => String::new(),
    };
    let types = kube::core::TypeMeta {
        api_version: text("apiVersion"),
        kind: text("kind"),
    };
    let metadata = serde_json::from_value(map.remove("metadata").unwrap_or_default())?;
    Ok(DynamicObject {
        types: Some(types),
        metadata,
        data: Value::Object(map),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `parse` and serde's `DynamicObject` agree, error or object.
    fn agrees(json: &str) {
        let serde = serde_json::from_str::<DynamicObject>(json).ok();
        let ours = parse(json).ok();
        assert_eq!(ours, serde, "{json}");
    }

    #[test]
    fn parse_agrees_with_serde() {
        agrees(
            r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"a","namespace":"n",
            "uid":"u","resourceVersion":"7","labels":{"x":"y"},"ownerReferences":[{"apiVersion":"v1",
            "kind":"App","name":"a","uid":"p","controller":true}],"finalizers":["f"]},
            "spec":{"replicas":1,"template":{"spec":{"containers":[{"name":"c","image":"i"}]}}},
            "status":{"readyReplicas":1,"conditions":[{"type":"Available","status":"True"}]}}"#,
        );
        agrees(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{},"data":{"k":"v"}}"#);
        // The shapes that take serde's path.
        agrees(r#"{"kind":"ConfigMap","metadata":{"name":"a"},"data":{}}"#);
        agrees(r#"{"apiVersion":"v1","metadata":{"name":"a"}}"#);
        agrees(r#"{"apiVersion":"v1","kind":"K"}"#);
        agrees(r#"{"apiVersion":1,"kind":"K","metadata":{}}"#);
        agrees(r#"{"apiVersion":"v1","kind":"K","metadata":{"name":7}}"#);
        agrees(r#"{"apiVersion":"v1","kind":"K","metadata":[]}"#);
        agrees("[1]");
        agrees("not json");
    }

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
