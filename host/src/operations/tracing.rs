//! Traces over OTLP: the `tracing` spans of every reconcile (see [`crate::controller`]), exported
//! to an OpenTelemetry Collector when the standard OTLP settings ask for it.
//!
//! The host reads the OpenTelemetry SDK's environment variables:
//! - `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`: where to send spans.
//!   Without either (or with `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true`) nothing
//!   is exported and no exporter thread exists.
//! - `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or `OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf`
//!   (the default) or `grpc`.
//! - `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`: the resource (service name `wasmop`
//!   unless set); `OTEL_EXPORTER_OTLP_*_HEADERS`, `*_TIMEOUT` and `OTEL_BSP_*` as the SDK
//!   documents them.
//!
//! # Guarantees
//! - Only the host's own spans (target `wasmop`) are exported, not those of its libraries.
//! - Spans are batched and sent from the SDK's own thread: a slow or absent collector never
//!   blocks a reconcile; spans that do not fit the SDK's queue are dropped, not buffered
//!   without bound.
//! - [`shutdown`] (on SIGTERM, after the running reconciles finished) flushes what is queued,
//!   waiting at most [`SHUTDOWN_WITHIN`].
//!
//! # Errors
//! [`TracingError`]: a protocol the host does not speak, or an exporter that cannot be built
//! (e.g. a malformed endpoint). The host refuses to start rather than run without the traces it
//! was asked for.

use std::sync::Mutex;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::registry::LookupSpan;

/// The instrumentation scope of the host's spans, and the only target exported.
pub const SCOPE: &str = "wasmop";

/// How long [`shutdown`] waits for queued spans to be sent.
pub const SHUTDOWN_WITHIN: Duration = Duration::from_secs(5);

/// The service name when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` gives one.
pub const DEFAULT_SERVICE_NAME: &str = "wasmop";

/// What can stop tracing from being set up as configured.
#[derive(Debug, thiserror::Error)]
pub enum TracingError {
    /// The protocol is not one the host speaks.
    #[error(
        "{var}={value:?}: wasmop exports traces over OTLP with `http/protobuf` (the default) or `grpc`; set one of those"
    )]
    Protocol {
        /// The variable that named it.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The exporter could not be built from the settings.
    #[error("cannot set up the OTLP span exporter ({settings}): {detail}")]
    Exporter {
        /// The settings it was built from.
        settings: String,
        /// Why.
        detail: String,
    },
}

/// How spans are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`, port 4318 by convention).
    HttpProtobuf,
    /// OTLP/gRPC (`grpc`, port 4317 by convention).
    Grpc,
}

/// Where and how spans go, as the environment says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The endpoint variable's value (the SDK reads the variables itself; this is for logs).
    pub endpoint: String,
    /// The transport.
    pub transport: Transport,
}

/// The settings the environment `env` asks for, `None` when tracing is off.
///
/// # Errors
/// [`TracingError::Protocol`] for a protocol other than `http/protobuf` and `grpc`.
pub fn settings(env: impl Fn(&str) -> Option<String>) -> Result<Option<Settings>, TracingError> {
    let var = |name: &str| {
        env(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
    {
        return Ok(None);
    }
    let Some(endpoint) =
        var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT"))
    else {
        return Ok(None);
    };
    let (name, protocol) = match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
        Some(p) => ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", Some(p)),
        None => (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            var("OTEL_EXPORTER_OTLP_PROTOCOL"),
        ),
    };
    let transport = match protocol.as_deref() {
        None | Some("http/protobuf") => Transport::HttpProtobuf,
        Some("grpc") => Transport::Grpc,
        Some(other) => {
            return Err(TracingError::Protocol {
                var: name,
                value: other.to_string(),
            });
        }
    };
    Ok(Some(Settings {
        endpoint,
        transport,
    }))
}

/// The provider of the running process, kept for [`shutdown`].
static PROVIDER: Mutex<Option<SdkTracerProvider>> = Mutex::new(None);

/// The layer that exports the host's spans over OTLP, when the environment asks for it (see
/// the module docs); `None` otherwise. Call it inside the Tokio runtime (the gRPC transport
/// needs one) and at most once.
///
/// # Errors
/// See the module docs.
pub fn layer<S>() -> Result<Option<(impl Layer<S>, Settings)>, TracingError>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let Some(settings) = settings(|k| std::env::var(k).ok())? else {
        return Ok(None);
    };
    let provider = provider(&settings)?;
    let tracer = provider.tracer(SCOPE);
    if let Ok(mut slot) = PROVIDER.lock() {
        *slot = Some(provider);
    }
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(Targets::new().with_target(SCOPE, LevelFilter::INFO));
    Ok(Some((layer, settings)))
}

fn provider(settings: &Settings) -> Result<SdkTracerProvider, TracingError> {
    // The HTTP transport's reqwest is built without a crypto provider of its own: the host's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let built = match settings.transport {
        Transport::HttpProtobuf => SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build(),
        Transport::Grpc => SpanExporter::builder().with_tonic().build(),
    };
    let exporter = built.map_err(|e| TracingError::Exporter {
        settings: format!("{:?} to {}", settings.transport, settings.endpoint),
        detail: e.to_string(),
    })?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource(|k| std::env::var(k).ok()))
        .build())
}

/// The resource: what the SDK reads from `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`,
/// the service name `wasmop` when neither names one, and the host's version.
fn resource(env: impl Fn(&str) -> Option<String>) -> Resource {
    let named = env("OTEL_SERVICE_NAME").is_some_and(|v| !v.trim().is_empty())
        || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|v| {
            v.split(',')
                .any(|kv| kv.split('=').next().map(str::trim) == Some("service.name"))
        });
    let builder = Resource::builder();
    let builder = if named {
        builder
    } else {
        builder.with_service_name(DEFAULT_SERVICE_NAME)
    };
    builder
        .with_attribute(KeyValue::new("service.version", crate::VERSION))
        .build()
}

/// Sends what is queued and stops the exporter (at most [`SHUTDOWN_WITHIN`]); does nothing
/// when tracing is off or already shut down. Blocks: call it off the async runtime's workers.
pub fn shutdown() {
    let provider = PROVIDER.lock().ok().and_then(|mut slot| slot.take());
    if let Some(provider) = provider {
        match provider.shutdown_with_timeout(SHUTDOWN_WITHIN) {
            Ok(()) => tracing::info!("traces flushed"),
            Err(e) => tracing::warn!(error = %e, "cannot flush the traces"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn off_without_an_endpoint_or_when_disabled() {
        assert_eq!(settings(env(&[])).ok().flatten(), None);
        assert_eq!(
            settings(env(&[("OTEL_SERVICE_NAME", "x")])).ok().flatten(),
            None
        );
        assert_eq!(
            settings(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]))
                .ok()
                .flatten(),
            None
        );
        for off in [
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_SDK_DISABLED", "true"),
        ] {
            assert_eq!(
                settings(env(&[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    off
                ]))
                .ok()
                .flatten(),
                None
            );
        }
    }

    #[test]
    fn protocol_defaults_to_http_protobuf_and_the_traces_variables_win() {
        let s = settings(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]))
            .ok()
            .flatten();
        assert_eq!(
            s.map(|s| (s.endpoint, s.transport)),
            Some(("http://c:4318".to_string(), Transport::HttpProtobuf))
        );
        let s = settings(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ]))
        .ok()
        .flatten();
        assert_eq!(
            s.map(|s| (s.endpoint, s.transport)),
            Some(("http://t:4317".to_string(), Transport::Grpc))
        );
    }

    #[test]
    fn an_unknown_protocol_is_refused_with_the_variable_named() {
        let e = settings(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ]));
        let text = e.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && text.contains("http/json"),
            "{text}"
        );
    }

    #[test]
    fn the_service_is_named_wasmop_unless_the_environment_names_it() {
        let name = |vars: &[(&str, &str)]| {
            resource(env(vars))
                .get(&opentelemetry::Key::new("service.name"))
                .map(|v| v.to_string())
        };
        assert_eq!(name(&[]).as_deref(), Some("wasmop"));
    }
}
