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
//! - [`Compact::json`] is the text of the [`Lean`] object [`Compact::new`] was given (as the
//!   API server sent it, without `managedFields`); [`Compact::object`] parses it.
//! - Its `kube::Resource` implementation is `DynamicObject`'s: the kind comes from the
//!   `ApiResource` the store and the controller are built with.
//!
//! # Errors
//! [`Compact::object`] fails with serde_json's error when its text does not parse as a
//! `DynamicObject` (never for a text that came from the API server).

use std::sync::Arc;

use kube::Resource;
use kube::core::{DynamicObject, ObjectMeta};

use super::predicate::Changes;
use crate::lean::Lean;

/// One primary: its metadata, its predicate fingerprint and its JSON text.
#[derive(Clone, Debug)]
pub struct Compact {
    metadata: ObjectMeta,
    fingerprint: Option<u64>,
    json: Arc<str>,
}

impl Compact {
    /// The compact form of `o`, fingerprinted for the `changes` that call for a reconcile.
    pub fn new(o: &Lean, changes: Changes) -> Self {
        Compact {
            metadata: o.meta().clone(),
            fingerprint: changes.fingerprint(o),
            json: o.json().clone(),
        }
    }

    /// The object as its watch delivered it (sharing the text).
    pub fn lean(&self) -> Lean {
        Lean::from_parts(self.metadata.clone(), self.json.clone())
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

/// As [`Lean`]'s (kube-runtime's `Controller` needs `K: DeserializeOwned`; the host never has
/// it deserialize one: its primaries come from the host's own watch, made with
/// [`Compact::new`]), fingerprinted for [`Changes::OutsideStatus`].
impl<'de> serde::Deserialize<'de> for Compact {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let o = Lean::deserialize(d)?;
        Ok(Compact::new(&o, Changes::OutsideStatus))
    }
}

crate::object::dynamic_resource!(Compact);

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
        let o: Lean =
            serde_json::from_value(sent.clone()).unwrap_or_else(|e| panic!("literal: {e}"));
        let c = Compact::new(&o, Changes::OutsideStatus);
        assert_eq!(
            (c.namespace(), c.name_any()),
            (Some("ns".into()), "a".into())
        );
        assert_eq!(c.resource_version().as_deref(), Some("7"));
        assert_eq!(c.fingerprint(), super::super::predicate::outside_status(&o));
        let with_status = Compact::new(&o, Changes::WithStatus);
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
            c.json(),
            o.json(),
            "the text a module is sent is the watched object's"
        );
        assert_eq!(c.lean().json(), c.json());
        let via_serde: Compact =
            serde_json::from_value(sent).unwrap_or_else(|e| panic!("deserialize: {e}"));
        assert_eq!(&*via_serde.json, &*c.json);
    }
}
