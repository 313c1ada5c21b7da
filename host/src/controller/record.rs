//! Recording the exact request of a failed reconcile, to replay it offline with
//! `wasmop test MODULE --request FILE` (opt-in: `wasmop run --record-failures DIR`).
//!
//! A recorded file is YAML: the reconciler, the module's sha256, the error, the call's context
//! and the request itself with every object as a YAML object (not JSON text), so it reads like a
//! fixture and can be edited.
//!
//! # Guarantees
//! - Never blocks the reconcile: [`FailureRecorder::record`] only queues the request (a bounded
//!   queue of [`RECORD_QUEUE`]); one writer thread ([`RecordWriter`]) renders and writes the
//!   files. When the queue is full the recording is dropped and counted
//!   ([`FailureRecorder::counts`]), never waited for.
//! - Bounded: at most [`RecordOptions::max_files`] files in the directory (the oldest recordings
//!   are deleted first) and none larger than [`RecordOptions::max_bytes`] (a larger request is
//!   not recorded; the log says so).
//! - Secrets are redacted ([`crate::redact`]): the data, string data and last-applied annotation
//!   of every Secret, the primary included, unless [`RecordOptions::secrets`] allows them; the
//!   files are readable by their owner only (0600).
//! - Recording never fails a reconcile: a write error is logged and counted, and the reconcile's
//!   own error is reported as before.
//!
//! # Errors
//! [`RecordError`] says which file could not be read or written, or what is wrong in it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::contract::{Context, Gvk, KindObjects, ReconcileRequest, Trigger};
pub use crate::redact::REDACTED;

/// How many recordings may wait for the writer; more are dropped and counted.
pub const RECORD_QUEUE: usize = 16;

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
                    if !secrets {
                        hide(&k.kind, &mut o);
                    }
                    o
                })
                .collect(),
        })
        .collect()
}

/// Redacts `object` if it is a Secret: by the kind it was watched as, or by its own type.
fn hide(kind: &Gvk, object: &mut Value) {
    if *kind == Gvk::new("v1", "Secret") {
        crate::redact::redact_secret(object);
    } else {
        crate::redact::redact(object);
    }
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

/// Replaces every value of a Secret's `data` and `stringData`, and its last-applied
/// annotation, with [`REDACTED`] ([`crate::redact::redact_secret`]).
pub fn redact(secret: &mut Value) {
    crate::redact::redact_secret(secret);
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
        let mut primary = serde_json::from_str(&request.primary).unwrap_or(Value::Null);
        if !secrets {
            crate::redact::redact(&mut primary);
        }
        RecordedRequest {
            reconciler: c.reconciler.clone(),
            module_sha256: module_sha256.to_string(),
            error: error.to_string(),
            trigger: c.trigger.clone(),
            attempt: c.attempt,
            config: serde_json::from_str(&c.config).unwrap_or(Value::Null),
            now_unix_ms: c.now_unix_ms,
            finalize,
            primary,
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
        crate::text::from_yaml(&text).map_err(|e| RecordError::Invalid {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })
    }
}

/// Queues recordings for the [`RecordWriter`], never waiting for it.
#[derive(Debug)]
pub struct FailureRecorder {
    options: RecordOptions,
    jobs: SyncSender<Job>,
    seq: AtomicU64,
    counts: Arc<Counters>,
}

/// What a recorder did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordCounts {
    /// Queued for the writer.
    pub queued: u64,
    /// Dropped: the queue was full (or the writer gone).
    pub dropped: u64,
    /// Written.
    pub written: u64,
    /// Not written: too large, or a write error (logged).
    pub failed: u64,
}

#[derive(Debug, Default)]
struct Counters {
    queued: AtomicU64,
    dropped: AtomicU64,
    written: AtomicU64,
    failed: AtomicU64,
}

/// A recording waiting for the writer, or a flush waiting for those queued before it.
#[derive(Debug)]
enum Job {
    Record(Box<Pending>),
    Flush(std::sync::mpsc::Sender<()>),
}

#[derive(Debug)]
struct Pending {
    request: ReconcileRequest,
    module_sha256: String,
    error: String,
    finalize: bool,
    path: PathBuf,
}

impl FailureRecorder {
    /// A recorder writing into `options.dir` from its own thread (`wasmop-recorder`). If the
    /// thread cannot start, the log says so and every recording is dropped.
    pub fn new(options: RecordOptions) -> FailureRecorder {
        let (recorder, writer) = FailureRecorder::paused(options, RECORD_QUEUE);
        let started = std::thread::Builder::new()
            .name("wasmop-recorder".into())
            .spawn(move || writer.run());
        if let Err(e) = started {
            tracing::warn!(error = %e, "cannot start the recording writer; failed requests are not recorded");
        }
        recorder
    }

    /// A recorder with a queue of `capacity` and its writer, not running: run it with
    /// [`RecordWriter::run`] on a thread that may block (or [`RecordWriter::drain`]).
    pub fn paused(options: RecordOptions, capacity: usize) -> (FailureRecorder, RecordWriter) {
        let (jobs, receiver) = std::sync::mpsc::sync_channel(capacity);
        let counts = Arc::new(Counters::default());
        let writer = RecordWriter {
            options: options.clone(),
            jobs: receiver,
            counts: counts.clone(),
        };
        let recorder = FailureRecorder {
            options,
            jobs,
            seq: AtomicU64::new(0),
            counts,
        };
        (recorder, writer)
    }

    /// Its options.
    pub fn options(&self) -> &RecordOptions {
        &self.options
    }

    /// What it did so far.
    pub fn counts(&self) -> RecordCounts {
        let c = &self.counts;
        RecordCounts {
            queued: c.queued.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            written: c.written.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
        }
    }

    /// Whether `request` may fit a recording: its JSON texts are at most twice
    /// [`RecordOptions::max_bytes`] (YAML drops at most about half of JSON's bytes: quotes,
    /// braces and commas). One that does not is neither copied, queued nor rendered.
    pub fn fits(&self, request: &ReconcileRequest) -> bool {
        request_bytes(request) <= self.options.max_bytes.saturating_mul(2)
    }

    /// Queues a failed request; returns the file it is to be written to, or `None` when the
    /// queue is full (the recording is dropped and counted). Never blocks.
    pub fn record(
        &self,
        request: &ReconcileRequest,
        module_sha256: &str,
        error: &str,
        finalize: bool,
    ) -> Option<PathBuf> {
        if !self.fits(request) {
            self.too_large(request_bytes(request));
            return None;
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let path = self.options.dir.join(file_name(request, seq));
        let pending = Pending {
            request: request.clone(),
            module_sha256: module_sha256.to_string(),
            error: error.to_string(),
            finalize,
            path: path.clone(),
        };
        match self.jobs.try_send(Job::Record(Box::new(pending))) {
            Ok(()) => {
                self.counts.queued.fetch_add(1, Ordering::Relaxed);
                Some(path)
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                let dropped = self.counts.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if dropped.is_power_of_two() {
                    tracing::warn!(
                        dropped,
                        "the recording queue is full; failed requests were not recorded"
                    );
                }
                None
            }
        }
    }

    /// Counts a failed request of `bytes` that is not recorded: far over the cap.
    pub fn too_large(&self, bytes: usize) {
        self.counts.failed.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            bytes,
            max_bytes = self.options.max_bytes,
            "the failed request is far larger than a recording may be; it is not recorded"
        );
    }

    /// Waits until every recording queued before it is written (or failed), at most
    /// `within` (a stalled disk, a queue of large renderings); false when it gave up. Blocks:
    /// call it off the async workers.
    pub fn flush(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let (done, wait) = std::sync::mpsc::channel();
        let mut job = Job::Flush(done);
        loop {
            match self.jobs.try_send(job) {
                Ok(()) => break,
                Err(TrySendError::Disconnected(_)) => return true,
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    job = back;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(TrySendError::Full(_)) => return false,
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        !matches!(wait.recv_timeout(left), Err(RecvTimeoutError::Timeout))
    }
}

/// Writes what a [`FailureRecorder`] queued, in order, within the directory's bounds.
#[derive(Debug)]
pub struct RecordWriter {
    options: RecordOptions,
    jobs: Receiver<Job>,
    counts: Arc<Counters>,
}

impl RecordWriter {
    /// Writes until the recorder is dropped. Blocks.
    pub fn run(self) {
        while let Ok(job) = self.jobs.recv() {
            self.handle(job);
        }
    }

    /// Writes what is queued now, then returns.
    pub fn drain(&self) {
        while let Ok(job) = self.jobs.try_recv() {
            self.handle(job);
        }
    }

    fn handle(&self, job: Job) {
        match job {
            Job::Flush(done) => {
                let _ = done.send(());
            }
            Job::Record(pending) => match self.write(&pending) {
                Ok(()) => {
                    self.counts.written.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    self.counts.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "cannot record the failed request");
                }
            },
        }
    }

    /// Renders and writes one recording, owner-readable only.
    fn write(&self, p: &Pending) -> Result<(), RecordError> {
        let secrets = self.options.secrets;
        let recorded =
            RecordedRequest::new(&p.request, &p.module_sha256, &p.error, p.finalize, secrets);
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
        crate::files::write_private(&p.path, text.as_bytes()).map_err(io("cannot write", &p.path))
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

/// Queues `request` for recording (if recording is on) and returns what the Warning Event
/// adds: `; request recorded in <file>`, or nothing (recording off, or its queue full).
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
        Some(path) => format!("; request recorded in {}", path.display()),
        None => String::new(),
    }
}

/// The bytes of `request`'s JSON texts: the primary, its children and related objects.
pub fn request_bytes(request: &ReconcileRequest) -> usize {
    let objects = request.owned.iter().chain(&request.related);
    objects
        .flat_map(|k| k.objects.iter())
        .map(String::len)
        .fold(request.primary.len(), usize::saturating_add)
}

/// The primary's name and namespace, read without the rest of it.
#[derive(Deserialize, Default)]
struct Named {
    #[serde(default)]
    metadata: NamedMeta,
}

#[derive(Deserialize, Default)]
struct NamedMeta {
    name: Option<String>,
    namespace: Option<String>,
}

/// `failed-<ms, 16 digits>-<seq>-<reconciler>-<namespace>-<name>.yaml`, with only characters
/// safe in a file name.
fn file_name(request: &ReconcileRequest, seq: u64) -> String {
    let named: Named = serde_json::from_str(&request.primary).unwrap_or_default();
    let meta = named.metadata;
    let parts = [
        request.context.reconciler.as_str(),
        meta.namespace.as_deref().unwrap_or("_"),
        meta.name.as_deref().unwrap_or("_"),
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
        request.context.now_unix_ms,
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

    use crate::files::temp_dir;

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
        let (_tmp, dir) = temp_dir();
        let recorder = FailureRecorder::new(options(&dir, 10, false));
        let path = recorder.record(&request(SECRET), "abc", "boom", false);
        recorder.flush(Duration::from_secs(60));
        let read = path.as_ref().map(|p| RecordedRequest::read(p));
        let Some(Ok(read)) = read else {
            panic!("no recording: {path:?} {read:?}");
        };
        let text = path.map(std::fs::read_to_string);
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
        let (_tmp, dir) = temp_dir();
        let recorder = FailureRecorder::new(options(&dir, 2, true));
        let mut last = None;
        for _ in 0..5 {
            last = recorder.record(&request(SECRET), "abc", "boom", false);
            recorder.flush(Duration::from_secs(60));
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

    /// A Secret made with `kubectl apply`: its data also sits in the last-applied annotation.
    const APPLIED_SECRET: &str = r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"data\":{\"password\":\"aHVudGVyMg==\"}}"}},"data":{"password":"aHVudGVyMg=="}}"#;

    #[test]
    fn a_recording_hides_a_secret_primary_and_last_applied_data_and_is_private() {
        let (_tmp, dir) = temp_dir();
        let recorder = FailureRecorder::new(options(&dir, 10, false));
        let mut secret_primary = request(APPLIED_SECRET);
        secret_primary.primary = APPLIED_SECRET.into();
        let path = recorder.record(&secret_primary, "abc", "boom", false);
        recorder.flush(Duration::from_secs(60));
        let path = path.unwrap_or_else(|| panic!("not queued: {:?}", recorder.counts()));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            !text.contains("aHVudGVyMg"),
            "a Secret's data is kept:\n{text}"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode.ok(), Some(0o600), "a recording others can read");
    }

    #[test]
    fn an_oversized_request_is_not_recorded() {
        let (_tmp, dir) = temp_dir();
        let mut o = options(&dir, 2, false);
        // The request's texts (205 bytes) may fit twice the cap; its YAML does not fit once.
        o.max_bytes = 110;
        let (recorder, writer) = FailureRecorder::paused(o, 4);
        assert!(recorder.fits(&request(SECRET)));
        let path = recorder.record(&request(SECRET), "abc", "boom", false);
        writer.drain();
        assert!(path.is_some_and(|p| !p.exists()));
        let counts = recorder.counts();
        assert_eq!((counts.written, counts.failed), (0, 1), "{counts:?}");
    }

    #[test]
    fn a_full_queue_drops_and_counts_recordings_and_never_waits() {
        let (_tmp, dir) = temp_dir();
        // The writer is not running: a recorder that waited for it would hang here.
        let (recorder, writer) = FailureRecorder::paused(options(&dir, 10, false), 2);
        let queued: Vec<Option<PathBuf>> = (0..5)
            .map(|_| recorder.record(&request(SECRET), "abc", "boom", false))
            .collect();
        assert_eq!(queued.iter().filter(|p| p.is_some()).count(), 2);
        let counts = recorder.counts();
        assert_eq!((counts.queued, counts.dropped, counts.written), (2, 3, 0));
        assert_eq!(
            note(
                Some(&recorder),
                Some(&request(SECRET)),
                "abc",
                "boom",
                false
            ),
            ""
        );
        // Once the writer runs, what was queued is written, in order.
        writer.drain();
        let counts = recorder.counts();
        assert_eq!((counts.written, counts.dropped), (2, 4), "{counts:?}");
        assert!(queued.iter().flatten().all(|p| p.exists()));
    }

    /// A request far over the cap is refused before it is copied into the queue or rendered:
    /// its related objects are bounded only by the module's memory (64 MiB here), and each
    /// failure held a copy, 16 in the queue, then a YAML rendering of it, before the size
    /// check refused it.
    #[test]
    fn a_request_far_over_the_cap_is_refused_before_it_is_queued() {
        let (_tmp, dir) = temp_dir();
        let mut o = options(&dir, 2, false);
        o.max_bytes = 1024;
        let (recorder, _writer) = FailureRecorder::paused(o, 4);
        let mut big = request(SECRET);
        big.related[0].objects = vec![format!(r#"{{"pad":"{}"}}"#, "p".repeat(8 << 20))];
        assert!(!recorder.fits(&big));
        assert!(recorder.fits(&request(SECRET)));
        assert_eq!(recorder.record(&big, "abc", "boom", false), None);
        let counts = recorder.counts();
        assert_eq!((counts.queued, counts.failed), (0, 1), "{counts:?}");
    }

    /// Shutdown waits for the queued recordings at most its bound: a writer that never
    /// answers (a stalled disk) must not hold the shutdown (and the Leases it gives up after).
    #[test]
    fn a_flush_gives_up_at_its_bound_when_the_writer_does_not_answer() {
        let (_tmp, dir) = temp_dir();
        // The writer is not running, and the queue (2) is full.
        let (recorder, writer) = FailureRecorder::paused(options(&dir, 10, false), 2);
        for _ in 0..2 {
            assert!(
                recorder
                    .record(&request(SECRET), "abc", "boom", false)
                    .is_some()
            );
        }
        assert!(!recorder.flush(Duration::from_millis(200)));
        writer.drain();
        assert_eq!(recorder.counts().written, 2);
    }
}
