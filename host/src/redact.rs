//! Keeping Secret data out of what the host writes or prints for people: recordings of failed
//! requests, fixtures captured from a cluster, `wasmop diff` output. (The files themselves are
//! written owner-only and whole by [`crate::files`].)
//!
//! # Guarantees
//! - [`redact`] replaces every value of a `v1` Secret's `data` and `stringData`, and every
//!   annotation that copies or digests them ([`derived_from_data`]: any tool's
//!   `last-applied-configuration`, which holds the whole Secret for anything made with
//!   `kubectl apply` or Metacontroller; any JSON object with `data` or `stringData`; wasmop's
//!   digest of what a hook asked for), with [`REDACTED`]; the keys stay, so a reader still sees
//!   the Secret's shape. Other objects are left alone.

use serde_json::Value;

/// The value redacted Secret data becomes.
pub const REDACTED: &str = "<redacted>";

/// The annotation `kubectl apply` stores the applied object in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The annotation in which wasmop's Metacontroller mode keeps the digest of what a hook asked
/// for (of a Secret: a hash of its data).
pub const DESIRED_DIGEST: &str = "metacontroller.wasmop.dev/desired";

/// Whether annotation `key` = `value` of a Secret may copy or digest its data.
fn derived_from_data(key: &str, value: &Value) -> bool {
    if key.ends_with("last-applied-configuration") || key == DESIRED_DIGEST {
        return true;
    }
    let Some(text) = value.as_str().filter(|t| t.trim_start().starts_with('{')) else {
        return false;
    };
    serde_json::from_str::<serde_json::Map<String, Value>>(text)
        .is_ok_and(|m| m.contains_key("data") || m.contains_key("stringData"))
}

/// Whether `object` is a core `v1` Secret (by its own `apiVersion` and `kind`).
pub fn is_secret(object: &Value) -> bool {
    object.get("apiVersion").and_then(Value::as_str) == Some("v1")
        && object.get("kind").and_then(Value::as_str) == Some("Secret")
}

/// Redacts `object` if it is a Secret (see the module documentation); returns whether it was.
pub fn redact(object: &mut Value) -> bool {
    if !is_secret(object) {
        return false;
    }
    redact_secret(object);
    true
}

/// Redacts every Secret inside `value` (an object, or any array or object holding some).
pub fn redact_nested(value: &mut Value) {
    if redact(value) {
        return;
    }
    match value {
        Value::Array(items) => items.iter_mut().for_each(redact_nested),
        Value::Object(fields) => fields.values_mut().for_each(redact_nested),
        _ => {}
    }
}

/// Redacts `secret`'s data and the annotations derived from it, whatever its `kind` field says (for
/// objects known to be Secrets from their watch, which may omit their type).
pub fn redact_secret(secret: &mut Value) {
    for field in ["data", "stringData"] {
        if let Some(map) = secret.get_mut(field).and_then(Value::as_object_mut) {
            for value in map.values_mut() {
                *value = Value::String(REDACTED.into());
            }
        }
    }
    let annotations = secret
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut);
    for (key, value) in annotations.into_iter().flatten() {
        if derived_from_data(key, value) {
            *value = Value::String(REDACTED.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secrets_values_and_last_applied_copy_are_redacted_keys_stay() {
        let mut secret = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "annotations": {
                LAST_APPLIED: "{\"data\":{\"password\":\"aHVudGVyMg==\"}}", "team": "a"
            }},
            "data": {"password": "aHVudGVyMg=="}, "stringData": {"token": "t"},
        });
        assert!(redact(&mut secret));
        let text = secret.to_string();
        assert!(
            !text.contains("aHVudGVyMg") && !text.contains("\"t\""),
            "{text}"
        );
        assert_eq!(secret["data"]["password"], REDACTED);
        assert_eq!(secret["stringData"]["token"], REDACTED);
        assert_eq!(secret["metadata"]["annotations"][LAST_APPLIED], REDACTED);
        assert_eq!(secret["metadata"]["annotations"]["team"], "a");
    }

    /// Other tools keep a copy of what they applied too: Metacontroller's
    /// `metacontroller.k8s.io/last-applied-configuration` holds the whole Secret (for Secrets
    /// a composite controller made before it moved to wasmop); any annotation holding a JSON
    /// object with `data` or `stringData` is such a copy; wasmop's own digest of what a hook
    /// asked for is a hash of the data (a weak value could be guessed from it).
    #[test]
    fn every_copy_or_digest_of_a_secrets_data_in_its_annotations_is_redacted() {
        let mut secret = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "annotations": {
                "metacontroller.k8s.io/last-applied-configuration":
                    "{\"data\":{\"password\":\"aHVudGVyMg==\"}}",
                "example.com/applied": "{\"stringData\":{\"password\":\"hunter2\"}}",
                "metacontroller.wasmop.dev/desired": "5e884898da28047151d0e56f8dc6292773603d0d",
                "team": "a"
            }},
            "data": {"password": "aHVudGVyMg=="},
        });
        assert!(redact(&mut secret));
        let text = secret.to_string();
        for secret in ["aHVudGVyMg", "hunter2", "5e884898"] {
            assert!(!text.contains(secret), "{text}");
        }
        assert_eq!(secret["metadata"]["annotations"]["team"], "a");
    }

    #[test]
    fn other_objects_are_left_alone() {
        let config_map = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
            "data": {"password": "not a secret"},
        });
        let mut copy = config_map.clone();
        assert!(!redact(&mut copy));
        assert_eq!(copy, config_map);
        let mut foreign = serde_json::json!({"apiVersion": "example.com/v1", "kind": "Secret", "data": {"a": "b"}});
        assert!(!redact(&mut foreign));
    }
}
