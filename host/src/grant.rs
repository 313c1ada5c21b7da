//! What a reconciler is allowed: the kinds it owns, reads and writes ([`Grant`]), how many intents
//! one response may carry ([`Counts`]), and whether kinds are namespaced ([`Scopes`]).
//!
//! The WasmReconciler's spec ([`crate::crd`]) says these, discovery answers [`Scopes`] online,
//! the active module carries its grant ([`crate::modules::slot`]) and the intent checker
//! ([`crate::controller::intents`]) enforces them: the types live here, below all four.

use std::collections::BTreeSet;

use crate::contract::{Gvk, ModuleMetadata};

/// Whether kinds are namespaced. Online the host asks discovery; offline a table of well-known
/// cluster-scoped kinds is used and any other kind is taken as namespaced.
pub trait Scopes {
    /// `Some(true)` if `kind` is namespaced, `Some(false)` if cluster-scoped, None if unknown.
    fn namespaced(&self, kind: &Gvk) -> Option<bool>;
}

/// The offline table of well-known cluster-scoped kinds.
#[derive(Debug, Clone, Copy, Default)]
pub struct WellKnownScopes;

const CLUSTER_SCOPED: &[(&str, &str)] = &[
    ("v1", "Namespace"),
    ("v1", "Node"),
    ("v1", "PersistentVolume"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
    ("storage.k8s.io/v1", "StorageClass"),
    ("storage.k8s.io/v1", "CSIDriver"),
    ("scheduling.k8s.io/v1", "PriorityClass"),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
    ),
    (
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
    ),
    ("networking.k8s.io/v1", "IngressClass"),
    ("wasmop.dev/v1alpha1", "WasmReconciler"),
];

impl Scopes for WellKnownScopes {
    fn namespaced(&self, kind: &Gvk) -> Option<bool> {
        Some(
            !CLUSTER_SCOPED
                .iter()
                .any(|(v, k)| *v == kind.api_version && *k == kind.kind),
        )
    }
}

/// Default of `spec.limits.children`: children per response, over all child sets.
pub const DEFAULT_MAX_CHILDREN: u32 = 500;
/// Default of `spec.limits.actions`: actions per response.
pub const DEFAULT_MAX_ACTIONS: u32 = 100;
/// Default of `spec.limits.events`: Events per response.
pub const DEFAULT_MAX_EVENTS: u32 = 20;
/// How many intents of each sort one response may carry (`spec.limits`). Each child costs a
/// GET and an apply, each action and Event a request: the caps bound what one reconcile costs
/// the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Children over all child sets.
    pub children: u32,
    /// Actions.
    pub actions: u32,
    /// Events.
    pub events: u32,
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            children: DEFAULT_MAX_CHILDREN,
            actions: DEFAULT_MAX_ACTIONS,
            events: DEFAULT_MAX_EVENTS,
        }
    }
}

/// What the administrator allows a reconciler (the WasmReconciler's grant, intersected with the
/// module's metadata by the caller; offline, the metadata itself).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// Kinds whose objects may be children.
    pub owned: BTreeSet<Gvk>,
    /// Kinds the module reads besides the owned ones; Events may not regard them and they are
    /// not written unless also in `writable`.
    pub related: BTreeSet<Gvk>,
    /// Related kinds the WasmReconciler grants writes to (`spec.related[].write`): their objects
    /// may be patched, deleted and be Event subjects.
    pub writable: BTreeSet<Gvk>,
    /// Count limits of one response.
    pub counts: Counts,
}

impl Grant {
    /// Everything the metadata asks for (offline: related kinds are writable, limits default).
    pub fn from_metadata(m: &ModuleMetadata) -> Self {
        let related: BTreeSet<Gvk> = m.related.iter().map(|r| r.kind.clone()).collect();
        Grant {
            owned: m.owns.iter().cloned().collect(),
            writable: related.clone(),
            related,
            counts: Counts::default(),
        }
    }

    /// Narrows this grant by the WasmReconciler's spec: only granted related kinds in
    /// `writable` become writable, and `counts` limits each response.
    pub fn with_spec(mut self, writable: impl IntoIterator<Item = Gvk>, counts: Counts) -> Self {
        self.writable = writable
            .into_iter()
            .filter(|k| self.related.contains(k))
            .collect();
        self.counts = counts;
        self
    }
}
