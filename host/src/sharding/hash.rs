//! The shard key of an object: the 64-bit FNV-1a hash the API server computes for
//! `shardRange()` (KEP-5866), so client-side and server-side filtering agree.
//!
//! - Namespaced primaries (and, through them, their children and related objects, which live in
//!   the primary's namespace) hash by `metadata.namespace`.
//! - Cluster-scoped primaries hash by `metadata.uid`; their children hash by the uid of their
//!   controller ownerReference, i.e. by their primary's uid.
//!
//! # Guarantees
//! - [`fnv1a64`] equals Go's `hash/fnv.New64a` over the same bytes (what the API server uses).
//! - An object and its primary always get the same hash under [`Key`].
//!
//! # Errors
//! Nothing here fails; an object without the field hashes the empty string (as the server does).

use std::hash::Hasher;

use kube::Resource;

/// FNV-1a, 64 bits, over `text`'s bytes.
pub fn fnv1a64(text: &str) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(text.as_bytes());
    h.finish()
}

/// Which field an object's shard hash is taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// `metadata.namespace` (namespaced primaries, their children and related objects).
    Namespace,
    /// `metadata.uid` (cluster-scoped primaries).
    Uid,
    /// The uid of the controller ownerReference (children of cluster-scoped primaries).
    ControllerUid,
}

impl Key {
    /// The key of a reconciler's primaries.
    pub fn of_primary(namespaced: bool) -> Key {
        if namespaced { Key::Namespace } else { Key::Uid }
    }

    /// The key of a reconciler's children (they follow their primary).
    pub fn of_children(primary_namespaced: bool) -> Key {
        if primary_namespaced {
            Key::Namespace
        } else {
            Key::ControllerUid
        }
    }

    /// The field a server-side selector names, when the server can filter by this key.
    pub fn server_field(self) -> Option<&'static str> {
        match self {
            Key::Namespace => Some("object.metadata.namespace"),
            Key::Uid => Some("object.metadata.uid"),
            Key::ControllerUid => None,
        }
    }

    /// The hash of `o` under this key.
    pub fn hash(self, o: &impl Resource) -> u64 {
        let meta = o.meta();
        let field = match self {
            Key::Namespace => meta.namespace.as_deref(),
            Key::Uid => meta.uid.as_deref(),
            Key::ControllerUid => crate::object::controller_of(meta).map(|r| r.uid.as_str()),
        };
        fnv1a64(field.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::DynamicObject;

    #[test]
    fn matches_the_reference_fnv1a_64_values() {
        // The published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn children_follow_their_primary() {
        let primary: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "example.dev/v1", "kind": "Cluster",
            "metadata": {"name": "c", "uid": "u-1"}
        }))
        .unwrap_or_else(|e| panic!("literal: {e}"));
        let child: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": "ns", "uid": "u-2", "ownerReferences": [
                {"apiVersion": "example.dev/v1", "kind": "Cluster", "name": "c", "uid": "u-1", "controller": true}
            ]}
        }))
        .unwrap_or_else(|e| panic!("literal: {e}"));
        assert_eq!(
            Key::of_primary(false).hash(&primary),
            Key::of_children(false).hash(&child)
        );
        assert_eq!(Key::of_primary(true).hash(&child), fnv1a64("ns"));
    }
}
