//! Two WasmReconcilers may not reconcile the same primaries.
//!
//! Two reconcilers of one primary kind (same API group and kind; the version does not matter:
//! it is the same objects) whose namespaces overlap (an empty `spec.namespaces` means all)
//! would both reconcile every primary in the overlap: their forced applies flip the children
//! back and forth for ever. The host serves only the first of them and refuses the others
//! (`Ready=False`, reason `Conflict`, naming the reconciler that wins).
//!
//! # Guarantees
//! - Deterministic on every replica: the winner is the one created first (`creationTimestamp`),
//!   then the one whose name sorts first; no state, no race on who started first.
//! - A reconciler is refused when *any* earlier reconciler overlaps it, whether that one serves
//!   or is refused itself: the outcome never depends on the order the host learns of them.
//! - A reconciler being deleted still wins until it is gone (it still holds its primaries'
//!   finalizers until it has released them).

use crate::crd::WasmReconciler;
use kube::ResourceExt;

/// The API group of `api_version` (`""` for the core group).
fn group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

/// Whether `a` and `b` claim some primary in common.
pub fn overlaps(a: &WasmReconciler, b: &WasmReconciler) -> bool {
    let (pa, pb) = (&a.spec.primary, &b.spec.primary);
    if pa.kind != pb.kind || group(&pa.api_version) != group(&pb.api_version) {
        return false;
    }
    let (na, nb) = (&a.spec.namespaces, &b.spec.namespaces);
    na.is_empty() || nb.is_empty() || na.iter().any(|n| nb.contains(n))
}

/// Whether `a` comes before `b`: created earlier, or at the same second with a smaller name.
pub fn precedes(a: &WasmReconciler, b: &WasmReconciler) -> bool {
    let key = |w: &WasmReconciler| (w.metadata.creation_timestamp.clone(), w.name_any());
    key(a) < key(b)
}

/// The reconciler `wr` loses to, if any: the first (by [`precedes`]) of those that overlap it
/// and come before it.
pub fn winner_over<'a>(
    wr: &WasmReconciler,
    all: impl IntoIterator<Item = &'a WasmReconciler>,
) -> Option<&'a WasmReconciler> {
    all.into_iter()
        .filter(|other| other.name_any() != wr.name_any())
        .filter(|other| overlaps(other, wr) && precedes(other, wr))
        .min_by(|x, y| {
            if precedes(x, y) {
                std::cmp::Ordering::Less
            } else {
                std::cmp::Ordering::Greater
            }
        })
}

/// The message a refused reconciler reports.
pub fn message(wr: &WasmReconciler, winner: &WasmReconciler) -> String {
    let scope = |w: &WasmReconciler| {
        if w.spec.namespaces.is_empty() {
            "all namespaces".to_string()
        } else {
            format!("namespaces {}", w.spec.namespaces.join(", "))
        }
    };
    format!(
        "WasmReconciler {} already reconciles {} in {} and was created first; this one ({}) would fight it over the same objects: narrow spec.namespaces or delete one of them",
        winner.name_any(),
        wr.spec.primary.kind,
        scope(winner),
        scope(wr)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn wr(name: &str, created: &str, api_version: &str, namespaces: &[&str]) -> WasmReconciler {
        let value = json!({
            "apiVersion": "wasmop.dev/v1alpha1", "kind": "WasmReconciler",
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {
                "module": {"configMap": {"namespace": "m", "name": "m"}},
                "primary": {"apiVersion": api_version, "kind": "App"},
                "namespaces": namespaces,
                "serviceAccount": {"namespace": "m", "name": "m"},
            }
        });
        match serde_json::from_value(value) {
            Ok(w) => w,
            Err(e) => panic!("test WasmReconciler: {e}"),
        }
    }

    const T1: &str = "2026-01-01T00:00:01Z";
    const T2: &str = "2026-01-01T00:00:02Z";

    #[test]
    fn the_earlier_reconciler_wins_then_the_smaller_name() {
        let a = wr("b-first", T1, "example.com/v1", &["x"]);
        let b = wr("a-second", T2, "example.com/v1", &["x", "y"]);
        let all = vec![a.clone(), b.clone()];
        assert_eq!(
            winner_over(&b, &all).map(|w| w.name_any()),
            Some("b-first".into())
        );
        assert!(winner_over(&a, &all).is_none());
        // Same second: the name decides.
        let c = wr("c", T1, "example.com/v1", &["x"]);
        let all = vec![a.clone(), c.clone()];
        assert!(winner_over(&a, &all).is_none());
        assert_eq!(
            winner_over(&c, &all).map(|w| w.name_any()),
            Some("b-first".into())
        );
        assert!(message(&c, &a).contains("b-first"));
    }

    #[test]
    fn only_the_same_kind_in_overlapping_namespaces_conflicts() {
        let a = wr("a", T1, "example.com/v1", &["x"]);
        assert!(!overlaps(&a, &wr("b", T2, "example.com/v1", &["y"])));
        assert!(!overlaps(&a, &wr("b", T2, "other.com/v1", &["x"])));
        assert!(
            overlaps(&a, &wr("b", T2, "example.com/v2", &["x"])),
            "any version"
        );
        assert!(
            overlaps(&a, &wr("b", T2, "example.com/v1", &[])),
            "all namespaces"
        );
        assert!(overlaps(
            &wr("a", T1, "v1", &[]),
            &wr("b", T2, "v1", &["q"])
        ));
    }
}
