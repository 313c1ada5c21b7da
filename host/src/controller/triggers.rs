//! Which primaries a change of an owned or related object calls for (kube-runtime's
//! `trigger_owners` and `trigger_others`, with the trigger noted for the module's context).
//!
//! # Guarantees
//! - A child calls for the primary named by its controller ownerReference, and only when that
//!   reference is of the primary kind.
//! - A related object calls for the primaries the active module's related kinds map it to
//!   (each once), with a namespaced primary only those of the object's namespace.
//! - Every primary called for is counted as requested (the queue metrics) and gets the change
//!   noted as the trigger of its next reconcile (unless another is already noted).

use std::sync::Arc;

use kube::Resource;
use kube::ResourceExt;
use kube::api::ApiResource;
use kube::runtime::reflector::{ObjectRef as KubeRef, Store};

use super::cache::Index;
use super::compact::Compact;
use super::state::States;
use crate::contract::{Gvk, Mapping, ObjectRef, RelatedKind, Trigger};
use crate::lean::Lean;
use crate::modules::slot::ModuleSlot;
use crate::object::{ObjectKey, controller_of};

/// The reference kube-runtime's controller queues for primary `key` of resource `ar`.
pub(super) fn primary_ref<K: kube::Resource<DynamicType = ApiResource>>(
    ar: &ApiResource,
    key: &ObjectKey,
) -> KubeRef<K> {
    let r = KubeRef::new_with(&key.name, ar.clone());
    match &key.namespace {
        Some(ns) => r.within(ns),
        None => r,
    }
}

/// Object `o` of `kind`, as the module's context names it.
pub(super) fn object_ref_of<K: kube::Resource>(kind: &Gvk, o: &K) -> ObjectRef {
    ObjectRef {
        api_version: kind.api_version.clone(),
        kind: kind.kind.clone(),
        namespace: o.namespace(),
        name: o.name_any(),
    }
}

/// The primary (of `primary`, namespaced or not) that controls `child`, if any.
pub(super) fn owner_of(primary: &Gvk, namespaced: bool, child: &Lean) -> Option<ObjectKey> {
    let owner = controller_of(child.meta())
        .filter(|o| o.kind == primary.kind && o.api_version == primary.api_version)?;
    let namespace = child.namespace().filter(|_| namespaced);
    Some(ObjectKey::new(namespace, owner.name.clone()))
}

/// Maps a changed child of one owned kind to its primary.
pub(super) struct Owners {
    /// The primary kind.
    pub primary: Gvk,
    /// The primary's resource.
    pub resource: ApiResource,
    /// Whether the primary kind is namespaced.
    pub namespaced: bool,
    /// The owned kind.
    pub kind: Gvk,
    /// Where the trigger is noted.
    pub states: States,
}

impl Owners {
    /// The primary `child` calls for (see [`owner_of`]), with the child's change noted.
    pub(super) fn map(&self, child: Lean) -> Option<KubeRef<Compact>> {
        let key = owner_of(&self.primary, self.namespaced, &child)?;
        self.states.requested(&key);
        let trigger = Trigger::ChildChanged(object_ref_of(&self.kind, &child));
        self.states.note_trigger(key.clone(), trigger);
        Some(primary_ref(&self.resource, &key))
    }
}

/// The primaries the related kinds `rules` map `other` (of `kind`) to, sorted, each once.
/// `of_namespace` lists the primaries of a namespace, `all` every primary.
pub(super) fn targets_of(
    rules: &[RelatedKind],
    kind: &Gvk,
    namespaced: bool,
    other: &Lean,
    of_namespace: impl Fn(&str) -> Vec<ObjectKey>,
    all: impl Fn() -> Vec<ObjectKey>,
) -> Vec<ObjectKey> {
    let labels = other.labels();
    let namespace = other.namespace().filter(|_| namespaced);
    let mut targets: Vec<ObjectKey> = Vec::new();
    for rk in rules
        .iter()
        .filter(|r| r.kind == *kind && r.selector.matches(labels))
    {
        match &rk.maps_to {
            // A namespaced primary sees related objects of its own namespace only.
            Mapping::AllPrimaries if namespaced => {
                targets.extend(of_namespace(&other.namespace().unwrap_or_default()))
            }
            Mapping::AllPrimaries => targets.extend(all()),
            Mapping::PrimaryNamedByLabel(l) => {
                if let Some(n) = labels.get(l) {
                    targets.push(ObjectKey::new(namespace.clone(), n.clone()));
                }
            }
            Mapping::SameName => targets.push(ObjectKey::new(namespace.clone(), other.name_any())),
        }
    }
    targets.sort();
    targets.dedup();
    targets
}

/// Maps a changed object of one related kind to the primaries that care about it.
#[derive(Clone)]
pub(super) struct Related {
    /// The primary's resource.
    pub resource: ApiResource,
    /// Whether the primary kind is namespaced.
    pub namespaced: bool,
    /// The related kind.
    pub kind: Gvk,
    /// The primaries (for `AllPrimaries` of a cluster-scoped primary).
    pub primaries: Store<Compact>,
    /// The primaries by namespace (for `AllPrimaries` of a namespaced primary).
    pub by_namespace: Arc<Index>,
    /// The active module, whose related kinds decide the mapping.
    pub slot: ModuleSlot,
    /// Where the trigger is noted.
    pub states: States,
}

impl Related {
    /// The primaries `other` calls for (see [`targets_of`]), with the change noted.
    pub(super) fn map(&self, other: Lean) -> Vec<KubeRef<Compact>> {
        // The active module's selectors and mappings decide which primaries care.
        let active = self.slot.active();
        let targets = targets_of(
            &active.fit.related,
            &self.kind,
            self.namespaced,
            &other,
            |ns| self.by_namespace.keys(ns),
            || {
                self.primaries
                    .state()
                    .iter()
                    .map(|p| ObjectKey::of(&**p))
                    .collect()
            },
        );
        let trigger = Trigger::RelatedChanged(object_ref_of(&self.kind, &other));
        targets
            .into_iter()
            .map(|key| {
                self.states.requested(&key);
                self.states.note_trigger(key.clone(), trigger.clone());
                primary_ref(&self.resource, &key)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(v: serde_json::Value) -> Lean {
        serde_json::from_value(v).unwrap_or_else(|e| panic!("literal: {e}"))
    }

    fn app() -> Gvk {
        Gvk::new("example.dev/v1", "App")
    }

    #[test]
    fn a_child_calls_for_its_controller_of_the_primary_kind() {
        let child = object(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "ns", "ownerReferences": [
                {"apiVersion": "example.dev/v1", "kind": "App", "name": "a", "uid": "u", "controller": true}
            ]}
        }));
        assert_eq!(
            owner_of(&app(), true, &child),
            Some(ObjectKey::new(Some("ns".into()), "a"))
        );
        assert_eq!(
            owner_of(&app(), false, &child),
            Some(ObjectKey::new(None, "a"))
        );
        assert_eq!(owner_of(&Gvk::new("v1", "Other"), true, &child), None);
    }

    #[test]
    fn a_child_without_a_controller_calls_for_nothing() {
        let child = object(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "ns", "ownerReferences": [
                {"apiVersion": "example.dev/v1", "kind": "App", "name": "a", "uid": "u"}
            ]}
        }));
        assert_eq!(owner_of(&app(), true, &child), None);
    }
}
