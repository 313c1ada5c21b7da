//! Text the host shows people: outside text made inert, cut to a size, short digests, and YAML.
//!
//! A low module: it imports nothing of the crate but the engine's text helpers, so the
//! controller, the manager and the `wasmop` command can all use it without reaching up to one
//! another. [`inert`], [`cut`], [`short_sha`] and [`short_hex`] are the engine's
//! ([`crate::engine::text`], which sanitizes a module's logs and errors before the host sees
//! them): one implementation, one escape set for every outside text.

pub use crate::engine::text::{cut, inert, is_unsafe_char, short_hex, short_sha};

/// Renders a value as YAML, ending with a newline.
///
/// # Caveats
/// A value serde_saphyr cannot render comes out as a one-line YAML comment saying why, not as an
/// error: every caller prints or stores the text as is.
pub fn to_yaml(value: &impl serde::Serialize) -> String {
    let mut text =
        serde_saphyr::to_string(value).unwrap_or_else(|e| format!("# cannot render YAML: {e}"));
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_yaml_ends_with_a_newline() {
        let text = to_yaml(&serde_json::json!({"a": 1, "b": ["x"]}));
        assert!(text.ends_with('\n'), "{text:?}");
        assert!(text.contains("a: 1"), "{text:?}");
        let back: serde_json::Value = serde_saphyr::from_str(&text).unwrap_or_default();
        assert_eq!(back, serde_json::json!({"a": 1, "b": ["x"]}));
    }

    #[test]
    fn to_yaml_of_a_scalar_is_one_line() {
        assert_eq!(to_yaml(&"plain"), "plain\n");
    }
}
