//! Text the host shows people: YAML rendering of values.
//!
//! A floor-1 module: it imports nothing else of the crate, so the controller, the manager and
//! the `wasmop` command can all use it without reaching up to one another.

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
