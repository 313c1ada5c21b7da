//! A span's fields in the JSON log, appended to as text and never parsed.
//!
//! `tracing_subscriber`'s `JsonFields` keeps each span's fields as a JSON object's text; every
//! `Span::record` parses that text into a map, adds the new fields and serializes the map again.
//! The host records on most of its spans (each reconcile's outcome, each apply's result), so the
//! log layer parsed and re-encoded several spans per reconcile for lines it mostly never writes.
//! [`AppendJsonFields`] writes the object once and appends a record's fields to it.
//!
//! # Guarantees
//! - The text is always one JSON object. An event's line shows the same span fields as with
//!   `JsonFields`: the log's JSON formatter parses the object into a sorted map before it writes
//!   a line, so key order and a field recorded twice (its last value shows) come out the same.
//! - Values are encoded as `JsonFields` encodes them (`Debug` values as strings, bytes as an
//!   array, a non-finite float as `null`); names too (`r#` dropped, `log.` metadata skipped, for
//!   `Debug` values only, as there).
//!
//! # Caveats
//! - A field recorded twice is kept twice in the stored text until a line is written.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::FormattedFields;
use tracing_subscriber::fmt::format::Writer;

/// Formats span fields as a JSON object and appends recorded fields without parsing it.
#[derive(Debug, Clone, Copy, Default)]
pub struct AppendJsonFields;

impl<'w> FormatFields<'w> for AppendJsonFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut object = Object::open(b"{".to_vec());
        fields.record(&mut object);
        writer.write_str(&object.close()?)
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let mut text = std::mem::take(&mut current.fields).into_bytes();
        // The object's closing brace goes; an empty text starts one.
        if text.pop().is_none() {
            text.push(b'{');
        }
        let mut object = Object::open(text);
        fields.record(&mut object);
        current.fields = object.close()?;
        Ok(())
    }
}

/// A JSON object's text being written: everything up to, not including, its closing brace.
struct Object {
    text: Vec<u8>,
    /// Whether the next entry needs a comma before it.
    more: bool,
    failed: bool,
}

impl Object {
    fn open(text: Vec<u8>) -> Self {
        let more = text.last() != Some(&b'{');
        Self {
            text,
            more,
            failed: false,
        }
    }

    fn entry(&mut self, name: &str, value: &(impl serde::Serialize + ?Sized)) {
        if self.more {
            self.text.push(b',');
        }
        self.more = true;
        let written = serde_json::to_writer(&mut self.text, name)
            .and_then(|()| {
                self.text.push(b':');
                serde_json::to_writer(&mut self.text, value)
            })
            .is_ok();
        self.failed |= !written;
    }

    fn close(mut self) -> Result<String, fmt::Error> {
        self.text.push(b'}');
        if self.failed {
            return Err(fmt::Error);
        }
        String::from_utf8(self.text).map_err(|_| fmt::Error)
    }
}

impl Visit for Object {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.entry(field.name(), &value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.entry(field.name(), &value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.entry(field.name(), &value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.entry(field.name(), &value);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.entry(field.name(), value);
    }

    fn record_bytes(&mut self, field: &Field, value: &[u8]) {
        self.entry(field.name(), value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let name = field.name();
        if name.starts_with("log.") {
            return;
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        self.entry(name, &format!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::fmt::format::JsonFields;
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::AppendJsonFields;

    /// Spans with fields of every kind, created, recorded and recorded again, and events in
    /// them.
    fn exercise() {
        let span = tracing::info_span!(
            "reconcile",
            text = "a\"b\\c\nd",
            count = 3_u64,
            delta = -4_i64,
            ratio = 0.5_f64,
            nan = f64::NAN,
            ok = true,
            kind = ?Some("x\ty"),
            r#type = ?"typed",
            bytes = &b"\x00\xffab"[..],
            outcome = tracing::field::Empty,
            later = tracing::field::Empty,
        );
        span.in_scope(|| tracing::info!("created"));
        span.record("outcome", "requeued");
        span.in_scope(|| tracing::info!("recorded once"));
        span.record("outcome", "done");
        span.record("later", tracing::field::debug(vec![1, 2]));
        span.in_scope(|| tracing::info!(field = 1, "recorded twice"));
        let empty = tracing::info_span!("empty", late = tracing::field::Empty);
        empty.in_scope(|| tracing::info!("no fields"));
        empty.record("late", 7_i64);
        empty.in_scope(|| tracing::info!("a late field"));
    }

    /// The lines `exercise` writes through a JSON log layer with span fields formatted by `N`.
    fn lines<N>(fields: N) -> Vec<serde_json::Value>
    where
        N: for<'w> tracing_subscriber::fmt::FormatFields<'w> + Send + Sync + 'static,
    {
        let file = tempfile::NamedTempFile::new().unwrap_or_else(|e| panic!("a file: {e}"));
        let writer = file.reopen().unwrap_or_else(|e| panic!("{e}"));
        let layer = tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .without_time()
            .fmt_fields(fields)
            .with_writer(writer);
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, exercise);
        let text = std::fs::read_to_string(file.path()).unwrap_or_else(|e| panic!("{e}"));
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[test]
    fn every_line_shows_the_span_fields_that_json_fields_shows() {
        let ours = lines(AppendJsonFields);
        let theirs = lines(JsonFields::default());
        assert_eq!(ours.len(), 5, "{ours:#?}");
        assert_eq!(ours, theirs);
        // And what it shows is what was recorded (the comparison above is not of two blanks).
        let last_of_reconcile = &ours[2]["span"];
        assert_eq!(last_of_reconcile["outcome"], "done", "{ours:#?}");
        assert_eq!(last_of_reconcile["text"], "a\"b\\c\nd");
        assert_eq!(last_of_reconcile["type"], "\"typed\"");
        assert_eq!(last_of_reconcile["later"], "[1, 2]");
        assert_eq!(last_of_reconcile["nan"], serde_json::Value::Null);
        assert_eq!(
            last_of_reconcile["bytes"],
            serde_json::json!([0, 255, 97, 98])
        );
        assert_eq!(ours[4]["span"]["late"], 7);
    }
}
