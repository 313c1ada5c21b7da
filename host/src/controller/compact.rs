//! A primary as the controller's store holds it: typed metadata and the object's JSON text.
//!
//! kube-runtime's `Controller` reads its primaries from a reflector `Store<K>`, so the
//! primaries cannot live in a [`super::cache::Cache`]. A `DynamicObject` there costs several
//! times its JSON text (every JSON object of its `serde_json::Value` is a B-tree with its own
//! allocations); a [`Compact`] keeps what kube-runtime and the host read without parsing (the
//! metadata, the fingerprint of the changes that call for a reconcile, see
//! [`super::predicate::Changes`]) and the rest as text, parsed back once per reconcile.
//!
//! # Guarantees
//! - [`Compact::object`] returns the object [`Compact::new`] was given (the same JSON value).
//! - Its `kube::Resource` implementation is `DynamicObject`'s: the kind comes from the
//!   `ApiResource` the store and the controller are built with.
//!
//! # Errors
//! [`Compact::new`] and [`Compact::object`] fail with serde_json's error when the object does
//! not serialize or its text does not parse (neither happens to an object that came from JSON).

use std::borrow::Cow;
use std::sync::Arc;

use kube::Resource;
use kube::core::{ApiResource, DynamicObject, DynamicResourceScope, ObjectMeta};

use super::predicate::Changes;

/// One primary: its metadata, its predicate fingerprint and its JSON text.
#[derive(Clone, Debug)]
pub struct Compact {
    metadata: ObjectMeta,
    fingerprint: Option<u64>,
    json: Arc<str>,
}

impl Compact {
    /// The compact form of `o`, fingerprinted for the `changes` that call for a reconcile.
    pub fn new(o: &DynamicObject, changes: Changes) -> Result<Self, serde_json::Error> {
        Ok(Compact {
            metadata: o.metadata.clone(),
            fingerprint: changes.fingerprint(o),
            json: serde_json::to_string(o)?.into(),
        })
    }

    /// The object, parsed back from its text.
    pub fn object(&self) -> Result<DynamicObject, serde_json::Error> {
        crate::object::parse(&self.json)
    }

    /// The object's JSON text: what [`Compact::object`] parses, and what serializing that
    /// object gives back.
    pub fn json(&self) -> &Arc<str> {
        &self.json
    }

    /// [`Changes::fingerprint`] of the object, computed once.
    pub fn fingerprint(&self) -> Option<u64> {
        self.fingerprint
    }
}

/// As `DynamicObject`'s (kube-runtime's `Controller` needs `K: DeserializeOwned`; the host
/// never has it deserialize one: its primaries come from the host's own watch, made with
/// [`Compact::new`]), fingerprinted for [`Changes::OutsideStatus`].
impl<'de> serde::Deserialize<'de> for Compact {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let o = DynamicObject::deserialize(d)?;
        Compact::new(&o, Changes::OutsideStatus).map_err(serde::de::Error::custom)
    }
}

impl Resource for Compact {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;
    use serde_json::json;

    #[test]
    fn a_compact_primary_gives_back_the_object_and_its_fingerprint() {
        let sent = json!({
            "apiVersion": "example.wasmop.dev/v1", "kind": "App",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                         "generation": 2, "finalizers": ["wasmop.dev/x"]},
            "spec": {"image": "i:1", "replicas": 1, "ratio": 0.1, "big": 12345678901234_u64,
                     "note": "é \"q\"\n", "labels": {"z": "1", "a": "2"}, "empty": {}},
            "status": {"conditions": [{"type": "Available", "status": "True"}]}
        });
        let o: DynamicObject =
            serde_json::from_value(sent.clone()).unwrap_or_else(|e| panic!("literal: {e}"));
        let c = Compact::new(&o, Changes::OutsideStatus).unwrap_or_else(|e| panic!("compact: {e}"));
        assert_eq!(
            (c.namespace(), c.name_any()),
            (Some("ns".into()), "a".into())
        );
        assert_eq!(c.resource_version().as_deref(), Some("7"));
        assert_eq!(c.fingerprint(), super::super::predicate::outside_status(&o));
        let with_status =
            Compact::new(&o, Changes::WithStatus).unwrap_or_else(|e| panic!("compact: {e}"));
        assert_eq!(
            with_status.fingerprint(),
            super::super::predicate::with_status(&o)
        );
        assert_ne!(
            with_status.fingerprint(),
            c.fingerprint(),
            "the status counts"
        );
        let back = c.object().unwrap_or_else(|e| panic!("parse: {e}"));
        assert_eq!(
            serde_json::to_value(&back).unwrap_or_else(|e| panic!("value: {e}")),
            sent
        );
        assert_eq!(
            serde_json::to_string(&back).unwrap_or_else(|e| panic!("text: {e}")),
            &**c.json(),
            "the text a module is sent is the parsed object's, serialized again"
        );
        let via_serde: Compact =
            serde_json::from_value(sent).unwrap_or_else(|e| panic!("deserialize: {e}"));
        assert_eq!(&*via_serde.json, &*c.json);
    }
}
