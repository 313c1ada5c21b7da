//! Writes that would change nothing, and are therefore not sent.
//!
//! A converged reconciler asks for the same children and the same status on every resync. A
//! forced server-side apply of an unchanged intent is still a PATCH the API server must decode,
//! merge and compare; at thousands of primaries that is a constant write load for nothing. So
//! the host remembers, per primary, a fingerprint of every intent this field manager last
//! applied successfully ([`Applied`]), and skips an apply when both hold:
//! - the intent's fingerprint equals the remembered one (so a field the module stopped sending
//!   is still removed by an apply: its fingerprint differs), and
//! - the observed object already carries every field of the intent with the same value
//!   ([`covers`]), so drift (someone else changed or removed one of our fields) is repaired by
//!   an apply.
//!
//! # Guarantees
//! - A skip never hides a change: if the intent or any of its fields in the cluster differ,
//!   the write is sent. The comparison is conservative: list lengths must match, numbers
//!   compare by value; anything the API server normalises differently is simply written again.
//! - Nothing is remembered before a write succeeded; after a start the memory is empty, so each
//!   child and status is applied once, then only when something changes.
//!
//! # Errors
//! Nothing here fails.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::Value;

use crate::contract::Gvk;

/// What a fingerprint is remembered for: a child (kind, namespace, name) or, with the primary's
/// own kind and name, its status.
pub type Target = (Gvk, Option<String>, String);

/// The fingerprints of the intents this field manager last applied for one primary.
pub type Applied = HashMap<Target, u64>;

/// A stable fingerprint of an intent (object keys in sorted order, whatever the map's order).
pub fn fingerprint(intent: &Value) -> u64 {
    let mut h = DefaultHasher::new();
    hash_value(intent, &mut h);
    h.finish()
}

fn hash_value(v: &Value, h: &mut DefaultHasher) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            0u8.hash(h);
            for k in keys {
                k.hash(h);
                if let Some(x) = m.get(k) {
                    hash_value(x, h);
                }
            }
        }
        Value::Array(a) => {
            (1u8, a.len()).hash(h);
            for x in a {
                hash_value(x, h);
            }
        }
        other => (2u8, other.to_string()).hash(h),
    }
}

/// Whether `have` (an observed object or status) already holds every field of `want` with the
/// same value. Top-level `apiVersion` and `kind` are not compared (list items may lack them).
pub fn covers_object(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(_)) => w
            .iter()
            .filter(|(k, _)| k.as_str() != "apiVersion" && k.as_str() != "kind")
            .all(|(k, v)| field_covered(v, have.get(k))),
        _ => covers(want, have),
    }
}

/// Whether `have` holds every field of `want` with the same value: objects by their keys
/// (extra keys in `have`, such as defaults, are fine), lists element by element with the same
/// length, numbers by value, everything else by equality.
pub fn covers(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w.iter().all(|(k, v)| field_covered(v, h.get(k))),
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| covers(a, b))
        }
        (Value::Number(a), Value::Number(b)) => a == b || a.as_f64() == b.as_f64(),
        _ => want == have,
    }
}

/// A wanted field against the observed one: null and empty values are covered by absence (the
/// API server drops them).
fn field_covered(want: &Value, have: Option<&Value>) -> bool {
    match have {
        Some(h) => covers(want, h) || (is_empty(want) && is_empty(h)),
        None => is_empty(want),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// Whether the write of `intent` for `target` can be skipped: this field manager last applied
/// exactly this intent, and `observed` still holds all of it.
pub fn unchanged(applied: &Applied, target: &Target, intent: &Value, observed: &Value) -> bool {
    applied.get(target) == Some(&fingerprint(intent)) && covers_object(intent, observed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn target() -> Target {
        (
            Gvk::new("apps/v1", "Deployment"),
            Some("demo".into()),
            "web".into(),
        )
    }

    #[test]
    fn defaults_and_extra_fields_in_the_cluster_are_covered() {
        let want = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"a": "1"}},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "app", "image": "nginx"}]}}}});
        let have = json!({
            "metadata": {"name": "web", "labels": {"a": "1"}, "uid": "u", "resourceVersion": "7"},
            "spec": {"replicas": 1, "progressDeadlineSeconds": 600,
                "template": {"spec": {"containers": [{"name": "app", "image": "nginx", "imagePullPolicy": "IfNotPresent"}]}}},
            "status": {"replicas": 1}});
        assert!(covers_object(&want, &have));
    }

    #[test]
    fn a_changed_removed_or_extra_list_item_is_not_covered() {
        let want = json!({"spec": {"replicas": 2, "ports": [{"port": 80}]}});
        assert!(!covers_object(
            &want,
            &json!({"spec": {"replicas": 1, "ports": [{"port": 80}]}})
        ));
        assert!(!covers_object(
            &want,
            &json!({"spec": {"ports": [{"port": 80}]}})
        ));
        assert!(!covers_object(
            &want,
            &json!({"spec": {"replicas": 2, "ports": [{"port": 80}, {"port": 81}]}})
        ));
        assert!(covers_object(
            &want,
            &json!({"spec": {"replicas": 2.0, "ports": [{"port": 80, "protocol": "TCP"}]}})
        ));
    }

    #[test]
    fn empty_and_null_values_are_covered_by_absence() {
        let want = json!({"spec": {"resources": {}, "args": [], "x": null}});
        assert!(covers_object(&want, &json!({"spec": {}})));
    }

    #[test]
    fn a_skip_needs_the_same_intent_applied_before_and_still_in_place() {
        let intent = json!({"spec": {"replicas": 1}});
        let observed = json!({"spec": {"replicas": 1}});
        let mut applied = Applied::new();
        assert!(
            !unchanged(&applied, &target(), &intent, &observed),
            "never applied: write"
        );
        applied.insert(target(), fingerprint(&intent));
        assert!(unchanged(&applied, &target(), &intent, &observed));
        assert!(
            !unchanged(
                &applied,
                &target(),
                &intent,
                &json!({"spec": {"replicas": 3}})
            ),
            "drift is repaired"
        );
        let dropped = json!({"spec": {}});
        assert!(
            !unchanged(&applied, &target(), &dropped, &observed),
            "a field the module stopped sending is removed by an apply"
        );
    }

    #[test]
    fn fingerprints_do_not_depend_on_key_order() {
        let a: Value = serde_json::from_str(r#"{"a":1,"b":{"c":2,"d":3}}"#).unwrap_or_default();
        let b: Value = serde_json::from_str(r#"{"b":{"d":3,"c":2},"a":1}"#).unwrap_or_default();
        assert_eq!(fingerprint(&a), fingerprint(&b));
    }
}
