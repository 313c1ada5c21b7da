//! A real OTLP receiver for the tests: the OpenTelemetry Collector ([`OTELCOL_VERSION`], the
//! core `otlp` receiver and the `file` exporter), built from Go modules and cached like the
//! control-plane binaries, listening on loopback for OTLP over gRPC and over HTTP, and writing
//! every span it receives to a file as OTLP JSON lines, which [`Collector::spans`] reads back.
//!
//! # Guarantees
//! - [`Collector::start`] returns once both OTLP endpoints accept connections.
//! - The process never outlives the test process (a [`Reaper`] of its own), and its directory
//!   (configuration, output, log) is removed with it.
//! - [`Collector::spans`] returns every span of every complete line written so far, flattened,
//!   with the `service.name` of its resource; a line still being written is skipped (it is read
//!   whole on a later call).
//!
//! # Errors
//! [`Error`]: the binary cannot be found or built, a file cannot be written, the collector does
//! not come up (with the tail of its log).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::assets::{OTELCOL_VERSION, otelcol_binary};
use crate::error::{Error, Result};
use crate::process::{Process, Reaper};

/// How long the collector may take to accept connections.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A running collector.
#[derive(Debug)]
pub struct Collector {
    dir: PathBuf,
    output: PathBuf,
    /// `http://127.0.0.1:<port>`: OTLP over gRPC.
    pub grpc_endpoint: String,
    /// `http://127.0.0.1:<port>`: OTLP over HTTP (`/v1/traces`).
    pub http_endpoint: String,
    process: Process,
    _reaper: Reaper,
}

/// One received span, flattened out of its resource and scope.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// The `service.name` attribute of the span's resource.
    pub service: String,
    /// Every attribute of the span's resource, as JSON values.
    pub resource: BTreeMap<String, Value>,
    /// The span's name.
    pub name: String,
    /// Hex trace id.
    pub trace_id: String,
    /// Hex span id.
    pub span_id: String,
    /// Hex id of the parent span (empty for a root span).
    pub parent_span_id: String,
    /// The span's attributes, as JSON values (integers as numbers).
    pub attributes: BTreeMap<String, Value>,
    /// The names of the span's events.
    pub events: Vec<String>,
    /// Start time (ns since the epoch).
    pub start_ns: u64,
    /// End time (ns since the epoch).
    pub end_ns: u64,
    /// The status code: `STATUS_CODE_UNSET` (0), `OK` (1) or `ERROR` (2).
    pub status: u64,
}

impl Span {
    /// A string attribute.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).and_then(Value::as_str)
    }

    /// An integer attribute.
    pub fn int(&self, key: &str) -> Option<i64> {
        self.attributes.get(key).and_then(Value::as_i64)
    }
}

impl Collector {
    /// Builds (first time only) and starts a collector in a new temporary directory.
    ///
    /// # Errors
    /// See the module docs.
    pub async fn start() -> Result<Self> {
        let binary = tokio::task::spawn_blocking(otelcol_binary)
            .await
            .map_err(|e| Error::Fault {
                action: "providing the collector binary".into(),
                detail: e.to_string(),
            })??;
        let dir = std::env::temp_dir().join(format!(
            "wasmop-otelcol-{}-{}",
            std::process::id(),
            unique()
        ));
        fs::create_dir_all(&dir).map_err(Error::io("creating", &dir))?;
        let reaper = Reaper::start(&dir)?;
        let (grpc, http) = (free_port()?, free_port()?);
        let output = dir.join("spans.jsonl");
        let config = dir.join("config.yaml");
        fs::write(&config, config_yaml(grpc, http, &output))
            .map_err(Error::io("writing", &config))?;
        let mut reaper = reaper;
        let process = Process::spawn(
            "otelcol",
            &binary,
            &["--config".to_string(), config.display().to_string()],
            &dir,
            &mut reaper,
        )?;
        let mut collector = Collector {
            dir,
            output,
            grpc_endpoint: format!("http://127.0.0.1:{grpc}"),
            http_endpoint: format!("http://127.0.0.1:{http}"),
            process,
            _reaper: reaper,
        };
        collector.wait_ready(&[grpc, http]).await?;
        Ok(collector)
    }

    /// Every span received so far (see the module docs).
    ///
    /// # Errors
    /// [`Error::Io`] if the output exists but cannot be read.
    pub fn spans(&self) -> Result<Vec<Span>> {
        let text = match fs::read_to_string(&self.output) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("reading", &self.output)(e)),
        };
        Ok(text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .flat_map(|request| spans_of(&request))
            .collect())
    }

    /// The collector's log file.
    pub fn log(&self) -> PathBuf {
        self.process.log.clone()
    }

    /// The collector's directory (configuration, output, log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    async fn wait_ready(&mut self, ports: &[u16]) -> Result<()> {
        let started = Instant::now();
        let mut last = String::from("not tried");
        'wait: while started.elapsed() < READY_WITHIN {
            self.process.check_running()?;
            for port in ports {
                if let Err(e) = tokio::net::TcpStream::connect(("127.0.0.1", *port)).await {
                    last = format!("127.0.0.1:{port}: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue 'wait;
                }
            }
            return Ok(());
        }
        Err(Error::NotReady {
            what: format!("otelcol {OTELCOL_VERSION}"),
            seconds: READY_WITHIN.as_secs(),
            last,
            logs: self.dir.clone(),
        })
    }
}

/// The spans of one OTLP JSON `ExportTraceServiceRequest`.
fn spans_of(request: &Value) -> Vec<Span> {
    let mut out = Vec::new();
    for rs in array(&request["resourceSpans"]) {
        let resource = attributes(&rs["resource"]["attributes"]);
        let service = resource
            .get("service.name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        for ss in array(&rs["scopeSpans"]) {
            for s in array(&ss["spans"]) {
                let text = |k: &str| s[k].as_str().unwrap_or_default().to_string();
                let nanos = |k: &str| s[k].as_str().and_then(|v| v.parse().ok()).unwrap_or(0);
                out.push(Span {
                    service: service.clone(),
                    resource: resource.clone(),
                    name: text("name"),
                    trace_id: text("traceId"),
                    span_id: text("spanId"),
                    parent_span_id: text("parentSpanId"),
                    attributes: attributes(&s["attributes"]),
                    events: array(&s["events"])
                        .iter()
                        .filter_map(|e| e["name"].as_str().map(str::to_string))
                        .collect(),
                    start_ns: nanos("startTimeUnixNano"),
                    end_ns: nanos("endTimeUnixNano"),
                    status: s["status"]["code"].as_u64().unwrap_or(0),
                });
            }
        }
    }
    out
}

fn array(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// OTLP JSON `KeyValue`s as a map of plain JSON values (OTLP JSON writes 64-bit integers as
/// strings; they become numbers here).
fn attributes(list: &Value) -> BTreeMap<String, Value> {
    array(list)
        .iter()
        .filter_map(|kv| {
            let key = kv["key"].as_str()?.to_string();
            let v = &kv["value"];
            let value = if let Some(s) = v.get("stringValue") {
                s.clone()
            } else if let Some(i) = v.get("intValue") {
                i.as_str()
                    .and_then(|s| s.parse::<i64>().ok())
                    .map(Value::from)
                    .unwrap_or_else(|| i.clone())
            } else if let Some(b) = v.get("boolValue") {
                b.clone()
            } else if let Some(d) = v.get("doubleValue") {
                d.clone()
            } else {
                v.clone()
            };
            Some((key, value))
        })
        .collect()
}

fn config_yaml(grpc: u16, http: u16, output: &Path) -> String {
    format!(
        r#"receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{grpc}
      http:
        endpoint: 127.0.0.1:{http}
exporters:
  file:
    path: {output}
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
"#,
        output = output.display(),
    )
}

fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(Error::io("binding", Path::new("127.0.0.1:0")))?;
    let port = listener
        .local_addr()
        .map_err(Error::io("binding", Path::new("127.0.0.1:0")))?
        .port();
    Ok(port)
}

fn unique() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.process.stop(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_json_lines_flatten_into_spans() {
        let line = serde_json::json!({"resourceSpans": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
            "scopeSpans": [{"scope": {}, "spans": [{
                "traceId": "ab", "spanId": "cd", "parentSpanId": "ef", "name": "reconcile",
                "startTimeUnixNano": "1", "endTimeUnixNano": "3", "status": {"code": 2},
                "attributes": [
                    {"key": "attempt", "value": {"intValue": "2"}},
                    {"key": "object", "value": {"stringValue": "ns/a"}}
                ],
                "events": [{"name": "reconcile failed"}]
            }]}]
        }]});
        let spans = spans_of(&line);
        assert_eq!(spans.len(), 1);
        let s = &spans[0];
        assert_eq!(
            (s.service.as_str(), s.name.as_str(), s.status),
            ("svc", "reconcile", 2)
        );
        assert_eq!((s.int("attempt"), s.str("object")), (Some(2), Some("ns/a")));
        assert_eq!((s.start_ns, s.end_ns), (1, 3));
        assert_eq!(s.events, vec!["reconcile failed".to_string()]);
    }
}
