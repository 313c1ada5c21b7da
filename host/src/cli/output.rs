//! `-o json|yaml`: machine-readable output of the subcommands that print objects or results.
//!
//! # Guarantees
//! The document printed is the serde serialisation of the very value the default (human)
//! output is rendered from; without `-o` the output is unchanged.

use serde::Serialize;

use super::{CliError, to_yaml};

/// A machine-readable format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One JSON document (pretty-printed).
    Json,
    /// One YAML document.
    Yaml,
}

/// Renders `value` in `format`, ending with a newline.
///
/// # Errors
/// [`CliError::Other`] when the value cannot be serialised (a map with non-string keys).
pub fn render(format: Format, value: &impl Serialize) -> Result<String, CliError> {
    match format {
        Format::Json => serde_json::to_string_pretty(value)
            .map(|s| s + "\n")
            .map_err(|e| CliError::Other(format!("cannot write JSON: {e}"))),
        Format::Yaml => Ok(to_yaml(value)),
    }
}
