//! `wasmop test MODULE.wasm --object CR.yaml [--observed FILE.yaml]... [--expect GOLDEN.yaml]`:
//! run a module offline, validate its intents exactly as the host would, print them as YAML and
//! compare them with a golden file.
//!
//! `wasmop test MODULE.wasm --request FILE` replays a request the host recorded
//! (`wasmop run --record-failures`, see [`crate::controller::record`]): the same primary,
//! children, related objects, config, trigger, attempt and time.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::kubeconfig::Connection;
use super::output::{self, Format};
use super::{CliError, engine, to_yaml, yaml_documents};
use crate::contract::{Gvk, KindObjects, Operation, ReconcileRequest, ValidateRequest};
use crate::controller::call;
use crate::controller::intents::{Grant, Primary, WellKnownScopes};
use crate::controller::record::RecordedRequest;
use crate::engine::{Limits, Module};

/// Arguments of `test`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The module (a `.wasm` component).
    pub module: PathBuf,
    /// The primary object (YAML).
    #[arg(long, required_unless_present_any = ["request", "from_cluster"])]
    pub object: Option<PathBuf>,
    /// Capture the case from a live cluster first (`KIND/NAMESPACE/NAME`, or `KIND/NAME` for a
    /// cluster-scoped kind): the primary, its children and related objects as the host would
    /// hand them over under WasmReconciler --reconciler, written as a fixture directory (--out),
    /// then tested.
    #[arg(long, conflicts_with_all = ["object", "request"])]
    pub from_cluster: Option<String>,
    /// With --from-cluster: the fixture directory to write (default: fixtures/NAME).
    #[arg(long, requires = "from_cluster")]
    pub out: Option<PathBuf>,
    /// With --from-cluster: keep Secret data in the fixture (by default every Secret's data,
    /// string data and last-applied annotation is written as `<redacted>`, and the module is
    /// tested on that). The files are owner-readable only either way; do not commit them.
    #[arg(long, requires = "from_cluster")]
    pub keep_secrets: bool,
    /// With --from-cluster: kubectl's connection flags.
    #[command(flatten)]
    pub connection: Connection,
    /// With --from-cluster: the namespace of a `KIND/NAME` primary (default: the context's
    /// namespace, as kubectl's).
    #[arg(short, long, requires = "from_cluster")]
    pub namespace: Option<String>,
    /// Print the intents (or the verdict) as one JSON or YAML document (default: YAML, as the
    /// golden file). The comparison with --expect is the same either way.
    #[arg(short, long, value_enum)]
    pub output: Option<Format>,
    /// Replay a request the host recorded (`wasmop run --record-failures`) instead of
    /// --object and --observed.
    #[arg(long, conflicts_with_all = ["object", "observed", "validate", "config", "reconciler", "now_unix_ms"])]
    pub request: Option<PathBuf>,
    /// Observed objects: owned children or related objects (YAML, several documents allowed).
    #[arg(long)]
    pub observed: Vec<PathBuf>,
    /// The golden file to compare the intents with.
    #[arg(long)]
    pub expect: Option<PathBuf>,
    /// Write the intents to the --expect file instead of comparing.
    #[arg(long, requires = "expect")]
    pub update: bool,
    /// Print, write and compare Secret values (by default the data, string data and
    /// last-applied annotations of Secrets in the intents and the golden file are
    /// `<redacted>`: the golden file is meant to be committed).
    #[arg(long)]
    pub show_secrets: bool,
    /// The reconciler config handed to the module (JSON).
    #[arg(long, default_value = "{}")]
    pub config: String,
    /// The reconciler name (the value of the `wasmop.dev/reconciler` label); with
    /// --from-cluster, the WasmReconciler whose grant decides what is captured.
    #[arg(long, default_value = "test")]
    pub reconciler: String,
    /// Run finalize instead of reconcile.
    #[arg(long, conflicts_with = "validate")]
    pub finalize: bool,
    /// Run validate instead of reconcile: the creation of --object, or with --old a change.
    #[arg(long)]
    pub validate: bool,
    /// With --validate: the object before the change.
    #[arg(long, requires = "validate")]
    pub old: Option<PathBuf>,
    /// The time the module sees, in milliseconds since the Unix epoch (default: now).
    #[arg(long)]
    pub now_unix_ms: Option<u64>,
    /// The call's deadline, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub deadline_ms: u64,
    /// The module's memory cap, in MiB.
    #[arg(long, default_value_t = 64)]
    pub memory_mib: u64,
}

fn read_one(path: &Path) -> Result<Value, CliError> {
    let text = std::fs::read_to_string(path).map_err(CliError::read(path))?;
    let mut docs = yaml_documents(&text, path)?;
    if docs.len() != 1 {
        return Err(CliError::Input {
            path: path.to_path_buf(),
            detail: format!("expected one YAML document, found {}", docs.len()),
        });
    }
    Ok(docs.remove(0))
}

fn kind_of(v: &Value) -> Option<Gvk> {
    Some(Gvk::new(
        v.get("apiVersion")?.as_str()?,
        v.get("kind")?.as_str()?,
    ))
}

/// Runs `test`, capturing the case from the cluster first with --from-cluster.
pub(crate) async fn run_with_capture(mut args: Args) -> Result<ExitCode, CliError> {
    if let Some(from) = args.from_cluster.take() {
        let module = args.module.clone();
        let metadata = super::off_runtime(move || {
            let bytes = std::fs::read(&module).map_err(CliError::read(&module))?;
            let loaded = engine(true)?
                .load(&bytes, &Limits::default())
                .map_err(|source| CliError::Load {
                    path: module.clone(),
                    source,
                })?;
            Ok(loaded.metadata().clone())
        })
        .await?;
        let spec = super::capture::CaptureSpec {
            from,
            reconciler: args.reconciler.clone(),
            out: args.out.take(),
            connection: args.connection.clone(),
            namespace: args.namespace.clone(),
            keep_secrets: args.keep_secrets,
        };
        let captured = super::capture::capture(&spec, &metadata).await?;
        eprintln!(
            "captured {} into {} ({} observed files)",
            spec.from,
            captured.dir.display(),
            captured.observed.len()
        );
        args.object = Some(captured.object);
        args.observed.extend(captured.observed);
        if args.config == "{}" {
            args.config = captured.config;
        }
    }
    super::off_runtime(move || run(args)).await
}

/// The case a `test` run reads: the module, its limits, the primary and a recorded request.
struct Case {
    module: Module,
    limits: Limits,
    config: Value,
    recorded: Option<RecordedRequest>,
    /// Where the primary was read from (for messages).
    object_path: PathBuf,
    primary_value: Value,
    primary: Primary,
}

impl Case {
    /// Loads the module and reads the primary (or the recorded request) of `args`.
    fn read(args: &Args) -> Result<Case, CliError> {
        let bytes = std::fs::read(&args.module).map_err(CliError::read(&args.module))?;
        let limits = Limits {
            deadline: Duration::from_millis(args.deadline_ms),
            memory_bytes: args.memory_mib << 20,
            ..Limits::default()
        };
        let config: Value = serde_json::from_str(&args.config)
            .map_err(|e| CliError::Other(format!("--config is not JSON: {e}")))?;
        let module = engine(true)?
            .load(&bytes, &limits)
            .map_err(|source| CliError::Load {
                path: args.module.clone(),
                source,
            })?;
        let recorded = args
            .request
            .as_deref()
            .map(RecordedRequest::read)
            .transpose()
            .map_err(|e| CliError::Other(e.to_string()))?;
        let object_path = args
            .object
            .clone()
            .or(args.request.clone())
            .unwrap_or_default();
        let primary_value = match &recorded {
            Some(r) => r.primary.clone(),
            None => read_one(&object_path)?,
        };
        let primary = Primary::from_object(&primary_value).map_err(|detail| CliError::Input {
            path: object_path.clone(),
            detail,
        })?;
        let case = Case {
            module,
            limits,
            config,
            recorded,
            object_path,
            primary_value,
            primary,
        };
        case.check_kind()?;
        Ok(case)
    }

    /// Refuses a primary of another kind than the module's.
    fn check_kind(&self) -> Result<(), CliError> {
        let metadata = self.module.metadata();
        if self.primary.kind == metadata.primary {
            return Ok(());
        }
        Err(CliError::Input {
            path: self.object_path.clone(),
            detail: format!(
                "the object is a {}, but module {} reconciles {}",
                self.primary.kind, metadata.name, metadata.primary
            ),
        })
    }

    /// Runs the module's `validate` on the creation of the primary, or with `old` its change.
    fn validate(&self, old: Option<&Path>) -> Result<Value, CliError> {
        let old = old.map(read_one).transpose()?;
        let request = ValidateRequest {
            operation: if old.is_some() {
                Operation::Update
            } else {
                Operation::Create
            },
            old: old.map(|o| o.to_string()),
            new: self.primary_value.to_string(),
            config: self.config.to_string(),
        };
        let verdict = self.module.validate(request, &self.limits).result?;
        serde_json::to_value(verdict).map_err(|e| CliError::Other(e.to_string()))
    }

    /// The owned and related objects of the request: the --observed files sorted as the host
    /// would hand them over, or the recorded request's.
    fn observed(
        &self,
        files: &[PathBuf],
    ) -> Result<(Vec<KindObjects>, Vec<KindObjects>), CliError> {
        if let Some(r) = &self.recorded {
            let replay = r.to_request();
            return Ok((replay.owned, replay.related));
        }
        let metadata = self.module.metadata();
        let empty = |kind: &Gvk| KindObjects {
            kind: kind.clone(),
            objects: Vec::new(),
        };
        let mut owned: Vec<KindObjects> = metadata.owns.iter().map(empty).collect();
        let mut related: Vec<KindObjects> =
            metadata.related.iter().map(|r| empty(&r.kind)).collect();
        for path in files {
            let text = std::fs::read_to_string(path).map_err(CliError::read(path))?;
            for doc in yaml_documents(&text, path)? {
                let group = group_of(&doc, path, &mut owned, &mut related, &metadata.name)?;
                group.objects.push(doc.to_string());
            }
        }
        Ok((owned, related))
    }

    /// Runs `reconcile` (or `finalize`) on the request the host would build, and validates
    /// the intents as the host does ([`call::run_blocking`]).
    fn reconcile(&self, args: &Args) -> Result<Value, CliError> {
        let (owned, related) = self.observed(&args.observed)?;
        // The observed owned objects are this primary's children, as the host would see them.
        let children =
            call::children_in(&owned, self.primary.namespace.as_deref(), &WellKnownScopes);
        let context = match &self.recorded {
            // A recorded request brings its own context.
            Some(r) => r.to_request().context,
            None => {
                let now = args.now_unix_ms.unwrap_or_else(now_unix_ms);
                call::dry_run_context(&args.reconciler, &self.config.to_string(), now)
            }
        };
        let request = ReconcileRequest {
            primary: self.primary_value.to_string(),
            owned,
            related,
            context,
        };
        let reconciler = request.context.reconciler.clone();
        let grant = Grant::from_metadata(self.module.metadata());
        let finalize = args.finalize || self.recorded.as_ref().is_some_and(|r| r.finalize);
        let check = call::Check {
            reconciler: &reconciler,
            primary: &self.primary,
            grant: &grant,
            scopes: &WellKnownScopes,
            children: &children,
        };
        let export = call::Export::of(finalize);
        let checked = call::run_blocking(&self.module, export, request, &self.limits, &check)
            .map_err(|failure| match failure {
                call::Failure::Call(e) => CliError::Call(e),
                call::Failure::Rejected(r) => CliError::Rejected(r),
                call::Failure::Join(e) => CliError::Other(e),
            })?;
        let mut v =
            serde_json::to_value(&checked.validated).map_err(|e| CliError::Other(e.to_string()))?;
        if let (Some(done), Some(map)) = (checked.done, v.as_object_mut()) {
            map.insert("done".into(), json!(done));
        }
        Ok(v)
    }
}

/// The group an --observed object goes in: a kind both owned and related goes where the host
/// would put it, owned when the object has a controller ownerReference, related otherwise.
fn group_of<'a>(
    doc: &Value,
    path: &Path,
    owned: &'a mut [KindObjects],
    related: &'a mut [KindObjects],
    module: &str,
) -> Result<&'a mut KindObjects, CliError> {
    let kind = kind_of(doc).ok_or_else(|| CliError::Input {
        path: path.to_path_buf(),
        detail: "an object has no apiVersion or kind".into(),
    })?;
    let related_too = related.iter().any(|g| g.kind == kind);
    let controlled = doc["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|refs| refs.iter().any(|r| r["controller"] == true));
    owned
        .iter_mut()
        .filter(|_| !related_too || controlled)
        .chain(related.iter_mut())
        .find(|g| g.kind == kind)
        .ok_or_else(|| CliError::Input {
            path: path.to_path_buf(),
            detail: format!("observed {kind} is neither owned nor related by module {module}"),
        })
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

pub(crate) fn run(args: Args) -> Result<ExitCode, CliError> {
    let case = Case::read(&args)?;
    let output = if args.validate {
        case.validate(args.old.as_deref())?
    } else {
        case.reconcile(&args)?
    };
    compare(&args, &output)
}

/// Prints `output`, or writes it to the --expect file with --update, or compares it with
/// that golden file (printing the differences).
fn compare(args: &Args, output: &Value) -> Result<ExitCode, CliError> {
    let shown_output;
    let output = if args.show_secrets {
        output
    } else {
        shown_output = redacted(output);
        &shown_output
    };
    let rendered = to_yaml(output);
    let shown = match args.output {
        Some(format) => output::render(format, output)?,
        None => rendered.clone(),
    };
    let Some(expect) = &args.expect else {
        print!("{shown}");
        return Ok(ExitCode::SUCCESS);
    };
    if args.update {
        crate::files::write_whole(expect, rendered.as_bytes()).map_err(|source| CliError::Io {
            action: "cannot write",
            path: expect.clone(),
            source,
        })?;
        eprintln!("wrote {}", expect.display());
        return Ok(ExitCode::SUCCESS);
    }
    let mut golden = read_one(expect)?;
    if !args.show_secrets {
        crate::redact::redact_nested(&mut golden);
    }
    if golden == *output {
        print!("{shown}");
        eprintln!("ok: the intents match {}", expect.display());
        return Ok(ExitCode::SUCCESS);
    }
    let want = to_yaml(&golden);
    let diff = similar::TextDiff::from_lines(&want, &rendered);
    print!(
        "{}",
        diff.unified_diff()
            .context_radius(3)
            .header(&expect.display().to_string(), "actual")
    );
    Err(CliError::Differs(expect.clone()))
}

/// `output` with the Secrets in it redacted.
fn redacted(output: &Value) -> Value {
    let mut output = output.clone();
    crate::redact::redact_nested(&mut output);
    output
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    /// A golden file's path in a temporary directory (kept while the first value lives).
    fn golden_path() -> (Option<tempfile::TempDir>, std::path::PathBuf) {
        let (tmp, dir) = crate::files::temp_dir();
        (tmp, dir.join("expect.yaml"))
    }

    /// `--update` rewrites a golden file meant for commits: a write interrupted half-way (a
    /// full disk, Ctrl-C, which exits at once) must not leave it empty or cut, and it stays
    /// readable as the author made it.
    #[test]
    fn an_updated_golden_file_is_replaced_whole_and_keeps_its_mode() {
        use std::io::Read;
        let (_tmp, golden) = golden_path();
        assert!(std::fs::write(&golden, "old: text\n").is_ok());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let readable = std::fs::Permissions::from_mode(0o644);
            assert!(std::fs::set_permissions(&golden, readable).is_ok());
        }
        let mut before = std::fs::File::open(&golden).map_err(|e| e.to_string());
        let argv = [
            "wasmop-test",
            "m.wasm",
            "--object",
            "o.yaml",
            "--update",
            "--expect",
        ];
        let cli = Cli::try_parse_from(argv.iter().copied().chain([golden.to_str().unwrap_or("")]));
        let Ok(cli) = cli else {
            panic!("arguments: {:?}", cli.err())
        };
        let wrote = compare(&cli.args, &serde_json::json!({"new": 1}));
        assert!(wrote.is_ok(), "{:?}", wrote.err());
        let mut old = String::new();
        let read = before.as_mut().map(|f| f.read_to_string(&mut old));
        assert!(read.is_ok_and(|r| r.is_ok()));
        assert_eq!(old, "old: text\n", "the golden file was rewritten in place");
        assert_eq!(
            std::fs::read_to_string(&golden).ok().as_deref(),
            Some("new: 1\n")
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&golden).map(|m| m.permissions().mode() & 0o777);
            assert_eq!(mode.ok(), Some(0o644), "the golden file's mode changed");
        }
    }

    /// A module's Secret children (their values from a `--keep-secrets` fixture or a recorded
    /// request) reach the printed intents and the golden file, which is 0644 and committed: by
    /// default their data is redacted on both sides of the comparison.
    #[test]
    fn a_secret_child_is_redacted_in_the_golden_file_unless_asked() {
        let (_tmp, golden) = golden_path();
        let intents = serde_json::json!({"children": [{"kind": {"apiVersion": "v1", "kind": "Secret"},
            "objects": [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                "stringData": {"password": "hunter2"}}]}]});
        let args = |extra: &[&str]| {
            let argv = ["wasmop-test", "m.wasm", "--object", "o.yaml", "--expect"];
            let golden = golden.to_str().unwrap_or("");
            let all = argv
                .iter()
                .copied()
                .chain([golden])
                .chain(extra.iter().copied());
            Cli::try_parse_from(all)
                .unwrap_or_else(|e| panic!("{e}"))
                .args
        };
        assert!(compare(&args(&["--update"]), &intents).is_ok());
        let written = std::fs::read_to_string(&golden).unwrap_or_default();
        assert!(!written.contains("hunter2"), "{written}");
        assert!(written.contains("password"), "the keys stay: {written}");
        // The redacted golden file matches; another value is not told apart without the flag.
        assert!(compare(&args(&[]), &intents).is_ok());
        assert!(compare(&args(&["--update", "--show-secrets"]), &intents).is_ok());
        let shown = std::fs::read_to_string(&golden).unwrap_or_default();
        assert!(shown.contains("hunter2"), "{shown}");
    }
}
