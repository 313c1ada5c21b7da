//! Recording the exact request of a failed reconcile, to replay it offline with
//! `wasmop test MODULE --request FILE` (opt-in: `wasmop run --record-failures DIR`).
//!
//! A recorded file is YAML: the reconciler, the module's sha256, the error, the call's context
//! and the request itself with every object as a YAML object (not JSON text), so it reads like a
//! fixture and can be edited.
//!
//! # Guarantees
//! - Bounded: at most [`RecordOptions::max_files`] files in the directory (the oldest recordings
//!   are deleted first) and none larger than [`RecordOptions::max_bytes`] (a larger request is
//!   not recorded; the log says so).
//! - Secrets are redacted: every `data` and `stringData` value of a `v1/Secret` among the owned
//!   and related objects becomes `<redacted>`, unless [`RecordOptions::secrets`] allows them.
//! - Recording never fails a reconcile: a write error is logged and the reconcile's own error is
//!   reported as before.
//!
//! # Errors
//! [`RecordError`] says which file could not be read or written, or what is wrong in it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::contract::{Context, Gvk, KindObjects, ReconcileRequest, Trigger};

/// The value redacted Secret data becomes.
pub const REDACTED: &str = "<redacted>";

/// What `--record-failures` configures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordOptions {
    /// The directory (created if missing).
    pub dir: PathBuf,
    /// The most files kept (the oldest go first).
    pub max_files: usize,
    /// The largest file written, in bytes.
    pub max_bytes: usize,
    /// Keep Secret data instead of redacting it.
    pub secrets: bool,
}

/// What can go wrong recording or reading a recording.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// A file or the directory could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The request is larger than the bound.
    #[error("the request is {size} bytes, over the recording limit of {max} bytes; not recorded")]
    TooLarge {
        /// Its size as YAML.
        size: usize,
        /// The bound.
        max: usize,
    },
    /// The file is not a recorded request.
    #[error("{path} is not a recorded request: {detail}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

/// Objects of one kind, as YAML objects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedKind {
    /// The kind.
    pub kind: Gvk,
    /// The objects.
    #[serde(default)]
    pub objects: Vec<Value>,
}

/// A recorded reconcile request, with why it was recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedRequest {
    /// The WasmReconciler.
    pub reconciler: String,
    /// The sha256 of the module that failed.
    #[serde(default)]
    pub module_sha256: String,
    /// The error the reconcile failed with.
    #[serde(default)]
    pub error: String,
    /// Why the reconcile ran.
    pub trigger: Trigger,
    /// Its attempt number.
    pub attempt: u32,
    /// The reconciler's config.
    #[serde(default)]
    pub config: Value,
    /// The time the module saw.
    pub now_unix_ms: u64,
    /// Whether the call was a finalize.
    #[serde(default)]
    pub finalize: bool,
    /// The primary.
    pub primary: Value,
    /// Observed children per owned kind.
    #[serde(default)]
    pub owned: Vec<RecordedKind>,
    /// Related objects per related kind.
    #[serde(default)]
    pub related: Vec<RecordedKind>,
}

fn to_recorded(kinds: &[KindObjects], secrets: bool) -> Vec<RecordedKind> {
    kinds
        .iter()
        .map(|k| RecordedKind {
            kind: k.kind.clone(),
            objects: k
                .objects
                .iter()
                .filter_map(|o| serde_json::from_str::<Value>(o).ok())
                .map(|mut o| {
                    if !secrets && k.kind == Gvk::new("v1", "Secret") {
                        redact(&mut o);
                    }
                    o
                })
                .collect(),
        })
        .collect()
}

fn to_request(kinds: &[RecordedKind]) -> Vec<KindObjects> {
    kinds
        .iter()
        .map(|k| KindObjects {
            kind: k.kind.clone(),
            objects: k.objects.iter().map(Value::to_string).collect(),
        })
        .collect()
}

/// Replaces every value of a Secret's `data` and `stringData` with [`REDACTED`].
pub fn redact(secret: &mut Value) {
    for field in ["data", "stringData"] {
        if let Some(map) = secret.get_mut(field).and_then(Value::as_object_mut) {
            for value in map.values_mut() {
                *value = Value::String(REDACTED.into());
            }
        }
    }
}

impl RecordedRequest {
    /// The recording of `request`, which failed with `error`.
    pub fn new(
        request: &ReconcileRequest,
        module_sha256: &str,
        error: &str,
        finalize: bool,
        secrets: bool,
    ) -> RecordedRequest {
        let c = &request.context;
        RecordedRequest {
            reconciler: c.reconciler.clone(),
            module_sha256: module_sha256.to_string(),
            error: error.to_string(),
            trigger: c.trigger.clone(),
            attempt: c.attempt,
            config: serde_json::from_str(&c.config).unwrap_or(Value::Null),
            now_unix_ms: c.now_unix_ms,
            finalize,
            primary: serde_json::from_str(&request.primary).unwrap_or(Value::Null),
            owned: to_recorded(&request.owned, secrets),
            related: to_recorded(&request.related, secrets),
        }
    }

    /// The request to replay.
    pub fn to_request(&self) -> ReconcileRequest {
        ReconcileRequest {
            primary: self.primary.to_string(),
            owned: to_request(&self.owned),
            related: to_request(&self.related),
            context: Context {
                reconciler: self.reconciler.clone(),
                trigger: self.trigger.clone(),
                attempt: self.attempt,
                config: match &self.config {
                    Value::Null => "{}".into(),
                    config => config.to_string(),
                },
                now_unix_ms: self.now_unix_ms,
            },
        }
    }

    /// Reads a recording.
    ///
    /// # Errors
    /// [`RecordError::Io`] or [`RecordError::Invalid`], naming the file.
    pub fn read(path: &Path) -> Result<RecordedRequest, RecordError> {
        let text = std::fs::read_to_string(path).map_err(|source| RecordError::Io {
            action: "cannot read",
            path: path.to_path_buf(),
            source,
        })?;
        serde_saphyr::from_str(&text).map_err(|e| RecordError::Invalid {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })
    }
}

/// Writes recordings into one directory, within its bounds.
#[derive(Debug)]
pub struct FailureRecorder {
    options: RecordOptions,
    // One writer at a time, so the count bound holds under concurrent reconciles.
    lock: Mutex<u64>,
}

impl FailureRecorder {
    /// A recorder writing into `options.dir`.
    pub fn new(options: RecordOptions) -> FailureRecorder {
        FailureRecorder {
            options,
            lock: Mutex::new(0),
        }
    }

    /// Its options.
    pub fn options(&self) -> &RecordOptions {
        &self.options
    }

    /// Records a failed request and returns the file's path.
    ///
    /// # Errors
    /// [`RecordError::TooLarge`] over the size bound, [`RecordError::Io`] if the directory or
    /// the file cannot be written.
    pub fn record(
        &self,
        request: &ReconcileRequest,
        module_sha256: &str,
        error: &str,
        finalize: bool,
    ) -> Result<PathBuf, RecordError> {
        let recorded = RecordedRequest::new(
            request,
            module_sha256,
            error,
            finalize,
            self.options.secrets,
        );
        let text = format!(
            "# A failed reconcile recorded by wasmop; replay it with\n#   wasmop test MODULE.wasm --request THIS_FILE\n{}",
            crate::text::to_yaml(&recorded)
        );
        if text.len() > self.options.max_bytes {
            return Err(RecordError::TooLarge {
                size: text.len(),
                max: self.options.max_bytes,
            });
        }
        let mut seq = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        *seq += 1;
        let dir = &self.options.dir;
        let io = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| RecordError::Io {
                action,
                path,
                source,
            }
        };
        std::fs::create_dir_all(dir).map_err(io("cannot create", dir))?;
        self.make_room(dir)?;
        let name = file_name(&recorded, *seq);
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(io("cannot write", &path))?;
        Ok(path)
    }

    /// Deletes the oldest recordings until one more fits the count bound.
    fn make_room(&self, dir: &Path) -> Result<(), RecordError> {
        let entries = std::fs::read_dir(dir).map_err(|source| RecordError::Io {
            action: "cannot list",
            path: dir.to_path_buf(),
            source,
        })?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("failed-") && n.ends_with(".yaml"))
            })
            .collect();
        // Names start with a zero-padded time: sorting by name is sorting by age.
        files.sort();
        let keep = self.options.max_files.saturating_sub(1);
        let excess = files.len().saturating_sub(keep);
        for old in files.into_iter().take(excess) {
            if let Err(e) = std::fs::remove_file(&old) {
                tracing::warn!(file = %old.display(), error = %e, "cannot delete an old recording");
            }
        }
        Ok(())
    }
}

/// Records `request` (if recording is on) and returns what the Warning Event adds:
/// `; request recorded in <file>`, or nothing. A recording that cannot be written is logged.
pub fn note(
    recorder: Option<&FailureRecorder>,
    request: Option<&ReconcileRequest>,
    module_sha256: &str,
    error: &str,
    finalize: bool,
) -> String {
    let (Some(recorder), Some(request)) = (recorder, request) else {
        return String::new();
    };
    match recorder.record(request, module_sha256, error, finalize) {
        Ok(path) => format!("; request recorded in {}", path.display()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot record the failed request");
            String::new()
        }
    }
}

/// `failed-<ms, 16 digits>-<seq>-<reconciler>-<namespace>-<name>.yaml`, with only characters
/// safe in a file name.
fn file_name(recorded: &RecordedRequest, seq: u64) -> String {
    let meta = &recorded.primary["metadata"];
    let parts = [
        recorded.reconciler.as_str(),
        meta["namespace"].as_str().unwrap_or("_"),
        meta["name"].as_str().unwrap_or("_"),
    ];
    let safe: Vec<String> = parts
        .iter()
        .map(|p| {
            p.chars()
                .take(63)
                .map(|c| {
                    if c.is_ascii_alphanumeric() || matches!(c, '-' | '.') {
                        c
                    } else {
                        '_'
                    }
                })
                .collect()
        })
        .collect();
    format!(
        "failed-{:016}-{seq:06}-{}.yaml",
        recorded.now_unix_ms,
        safe.join("-")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(secret: &str) -> ReconcileRequest {
        ReconcileRequest {
            primary: r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"p/../x","namespace":"ns"}}"#.into(),
            owned: vec![],
            related: vec![KindObjects {
                kind: Gvk::new("v1", "Secret"),
                objects: vec![secret.into()],
            }],
            context: Context {
                reconciler: "r".into(),
                trigger: Trigger::Resync,
                attempt: 3,
                config: r#"{"a":1}"#.into(),
                now_unix_ms: 42,
            },
        }
    }

    const SECRET: &str = r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"password":"aHVudGVyMg=="},"stringData":{"token":"t"}}"#;

    fn options(dir: &Path, max_files: usize, secrets: bool) -> RecordOptions {
        RecordOptions {
            dir: dir.to_path_buf(),
            max_files,
            max_bytes: 64 << 10,
            secrets,
        }
    }

    #[test]
    fn a_recording_round_trips_with_secrets_redacted() {
        let dir = tempfile::tempdir().map_err(|e| e.to_string());
        let dir = dir
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .unwrap_or_default();
        let recorder = FailureRecorder::new(options(&dir, 10, false));
        let path = recorder.record(&request(SECRET), "abc", "boom", false);
        let read = path.as_ref().ok().map(|p| RecordedRequest::read(p));
        let Some(Ok(read)) = read else {
            panic!("no recording: {path:?} {read:?}");
        };
        let text = path.ok().map(std::fs::read_to_string);
        assert!(!format!("{text:?}").contains("aHVudGVyMg"), "{text:?}");
        assert_eq!(read.related[0].objects[0]["data"]["password"], REDACTED);
        assert_eq!(read.related[0].objects[0]["stringData"]["token"], REDACTED);
        let replay = read.to_request();
        assert_eq!(replay.context.attempt, 3);
        assert_eq!(replay.context.config, r#"{"a":1}"#);
        assert_eq!(replay.primary, request(SECRET).primary);
    }

    #[test]
    fn secrets_stay_when_allowed_and_the_count_is_bounded() {
        let dir = tempfile::tempdir().map_err(|e| e.to_string());
        let dir = dir
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .unwrap_or_default();
        let recorder = FailureRecorder::new(options(&dir, 2, true));
        let mut last = None;
        for _ in 0..5 {
            last = recorder.record(&request(SECRET), "abc", "boom", false).ok();
        }
        let files = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
        assert_eq!(files, 2);
        let read = last.map(|p| RecordedRequest::read(&p));
        assert!(
            matches!(&read, Some(Ok(r)) if r.related[0].objects[0]["data"]["password"] == "aHVudGVyMg==")
        );
        // No path escapes the directory.
        assert!(std::fs::read_dir(&dir).is_ok_and(|mut d| {
            d.all(|e| e.is_ok_and(|e| !e.file_name().to_string_lossy().contains('/')))
        }));
    }

    #[test]
    fn an_oversized_request_is_not_recorded() {
        let dir = tempfile::tempdir().map_err(|e| e.to_string());
        let dir = dir
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .unwrap_or_default();
        let mut o = options(&dir, 2, false);
        o.max_bytes = 100;
        let recorder = FailureRecorder::new(o);
        let result = recorder.record(&request(SECRET), "abc", "boom", false);
        assert!(
            matches!(result, Err(RecordError::TooLarge { .. })),
            "{result:?}"
        );
    }
}
