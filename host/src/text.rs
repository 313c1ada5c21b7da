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

/// Parses one YAML document (see [`yaml_options`]).
///
/// # Errors
/// serde-saphyr's, when it is not valid YAML of a `T`.
pub fn from_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_saphyr::Error> {
    serde_saphyr::from_str_with_options(text, yaml_options(text.len()))
}

/// Parses YAML documents (see [`yaml_options`]).
///
/// # Errors
/// serde-saphyr's, when it is not valid YAML.
pub fn from_yaml_documents(text: &str) -> Result<Vec<serde_json::Value>, serde_saphyr::Error> {
    serde_saphyr::from_str_multiple_with_options(text, yaml_options(text.len()))
}

/// serde-saphyr's options for a text of `len` bytes: its default budget (aliases, anchors,
/// depth: what guards against a YAML bomb), with the counts that only grow with the text
/// (documents, nodes, scalar bytes) scaled to it, so a file is never refused for its size
/// alone (wasmop writes captures of thousands of objects and recordings of any size).
pub fn yaml_options(len: usize) -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_documents = budget.max_documents.max(len / 4);
    budget.max_nodes = budget.max_nodes.max(len / 2);
    budget.max_events = budget.max_events.max(len);
    budget.max_total_scalar_bytes = budget.max_total_scalar_bytes.max(len);
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
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

    /// What wasmop writes, wasmop reads: a capture of 1,100 ConfigMaps (one document each)
    /// and a recording of 260,000 nodes (130,000 labels) passed serde-saphyr's default budget (1,024
    /// documents, 250,000 nodes) on the way out and not on the way back.
    #[test]
    fn many_documents_and_nodes_written_here_read_back() {
        let docs: Vec<String> = (0..1100)
            .map(|i| to_yaml(&serde_json::json!({"kind": "ConfigMap", "metadata": {"name": format!("c{i}")}})))
            .collect();
        let text = docs.join("---\n");
        let read = from_yaml_documents(&text).map(|d| d.len());
        assert_eq!(read.ok(), Some(1100));
        let labels: serde_json::Map<String, serde_json::Value> = (0..130_000)
            .map(|i| (format!("l{i}"), serde_json::json!(i)))
            .collect();
        let text = to_yaml(&serde_json::json!({"metadata": {"labels": labels}}));
        let read: Result<serde_json::Value, _> = from_yaml(&text);
        assert!(read.is_ok(), "{:?}", read.err().map(|e| e.to_string()));
    }

    #[test]
    fn to_yaml_of_a_scalar_is_one_line() {
        assert_eq!(to_yaml(&"plain"), "plain\n");
    }
}
