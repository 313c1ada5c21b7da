//! Recording several fields of a span at once.
//!
//! The JSON log (`tracing_subscriber`'s JSON formatter, with the current span on every line)
//! keeps each span's fields as JSON text, and every `Span::record` call parses that text and
//! writes it again. A reconcile span has some twenty fields: recorded one by one, their
//! re-encoding was ~5% of a converging host's CPU (`docs/benchmarks.md`, the profile). One
//! [`record`] call re-encodes them once. (The log's span fields are now appended to, not
//! re-encoded: [`super::json_fields`]; one call is still one `on_record` for every layer.)
//!
//! # Guarantees
//! - The span ends up with the same field values as `span.record(name, value)` for each pair,
//!   in one `record_all` (what every layer sees as one `on_record`).
//! - A name the span does not declare is ignored, as `Span::record` ignores it; a disabled span
//!   records nothing.

use tracing::field::{Field, Value};

/// Records each `(name, value)` on `span` in one call.
pub fn record<const N: usize>(span: &tracing::Span, values: [(&str, &dyn Value); N]) {
    let Some(metadata) = span.metadata() else {
        return;
    };
    let fields = metadata.fields();
    let found: [Option<Field>; N] = std::array::from_fn(|i| fields.field(values[i].0));
    let Some(first) = found.iter().flatten().next() else {
        return;
    };
    // A name the span lacks becomes a pair without a value for a field it has (skipped).
    let pairs: [(&Field, Option<&dyn Value>); N] = std::array::from_fn(|i| match &found[i] {
        Some(field) => (field, Some(values[i].1)),
        None => (first, None),
    });
    span.record_all(&fields.value_set(&pairs));
}

/// A layer that keeps every `on_record` it sees, for tests of what a span records.
#[cfg(test)]
pub(crate) mod recorded {
    use std::sync::{Arc, Mutex};
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing_subscriber::layer::Context;

    /// The fields of one `on_record`, as (name, value) pairs.
    pub(crate) type Recorded = Vec<(String, String)>;

    /// Every `on_record` the layer saw.
    #[derive(Clone, Default)]
    pub(crate) struct Records(Arc<Mutex<Vec<Recorded>>>);

    impl Records {
        /// What was recorded so far, one entry per `on_record`.
        pub(crate) fn seen(&self) -> Vec<Recorded> {
            self.0.lock().map(|r| r.clone()).unwrap_or_default()
        }
    }

    struct Fields(Recorded);
    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0
                .push((field.name().to_string(), format!("{value:?}")));
        }
    }

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Records {
        fn on_new_span(&self, _: &Attributes<'_>, _: &Id, _: Context<'_, S>) {}
        fn on_record(&self, _: &Id, values: &Record<'_>, _: Context<'_, S>) {
            let mut fields = Fields(Vec::new());
            values.record(&mut fields);
            if let Ok(mut records) = self.0.lock() {
                records.push(fields.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::recorded::Records;
    use super::*;
    use tracing::field::Empty;
    use tracing_subscriber::layer::SubscriberExt as _;

    #[test]
    fn every_value_arrives_in_one_record_and_unknown_names_are_skipped() {
        let records = Records::default();
        let subscriber = tracing_subscriber::registry().with(records.clone());
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("s", a = Empty, b = Empty, c = Empty);
            record(&span, [("a", &1_i64), ("nope", &"x"), ("c", &true)]);
        });
        let seen = records.seen();
        assert_eq!(
            seen,
            [vec![("a".into(), "1".into()), ("c".into(), "true".into())]]
        );
    }

    #[test]
    fn a_span_without_any_named_field_records_nothing() {
        let records = Records::default();
        let subscriber = tracing_subscriber::registry().with(records.clone());
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("s", a = Empty);
            record(&span, [("nope", &1_i64)]);
            record(&tracing::Span::none(), [("a", &1_i64)]);
        });
        assert!(records.seen().is_empty());
    }
}
