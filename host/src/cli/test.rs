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

use super::{CliError, engine, to_yaml, yaml_documents};
use crate::contract::{
    Context, Gvk, KindObjects, Operation, ReconcileRequest, Trigger, ValidateRequest,
};
use crate::controller::intents::{self, Grant, ObservedChildren, Primary, Scopes, WellKnownScopes};
use crate::controller::record::RecordedRequest;
use crate::engine::Limits;

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
    /// With --from-cluster: the kubeconfig to use.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
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
            kubeconfig: args.kubeconfig.take(),
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

pub(crate) fn run(args: Args) -> Result<ExitCode, CliError> {
    let bytes = std::fs::read(&args.module).map_err(CliError::read(&args.module))?;
    let limits = Limits {
        deadline: Duration::from_millis(args.deadline_ms),
        memory_bytes: args.memory_mib << 20,
        ..Limits::default()
    };
    let config: Value = serde_json::from_str(&args.config)
        .map_err(|e| CliError::Other(format!("--config is not JSON: {e}")))?;
    let engine = engine(true)?;
    let module = engine
        .load(&bytes, &limits)
        .map_err(|source| CliError::Load {
            path: args.module.clone(),
            source,
        })?;
    let metadata = module.metadata().clone();
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
    if primary.kind != metadata.primary {
        return Err(CliError::Input {
            path: object_path.clone(),
            detail: format!(
                "the object is a {}, but module {} reconciles {}",
                primary.kind, metadata.name, metadata.primary
            ),
        });
    }
    let output = if args.validate {
        let old = args.old.as_deref().map(read_one).transpose()?;
        let request = ValidateRequest {
            operation: if old.is_some() {
                Operation::Update
            } else {
                Operation::Create
            },
            old: old.map(|o| o.to_string()),
            new: primary_value.to_string(),
            config: config.to_string(),
        };
        let verdict = module.validate(request, &limits).result?;
        serde_json::to_value(verdict).map_err(|e| CliError::Other(e.to_string()))?
    } else {
        let mut owned: Vec<KindObjects> = metadata
            .owns
            .iter()
            .map(|k| KindObjects {
                kind: k.clone(),
                objects: Vec::new(),
            })
            .collect();
        let mut related: Vec<KindObjects> = metadata
            .related
            .iter()
            .map(|r| KindObjects {
                kind: r.kind.clone(),
                objects: Vec::new(),
            })
            .collect();
        for path in &args.observed {
            let text = std::fs::read_to_string(path).map_err(CliError::read(path))?;
            for doc in yaml_documents(&text, path)? {
                let kind = kind_of(&doc).ok_or_else(|| CliError::Input {
                    path: path.clone(),
                    detail: "an object has no apiVersion or kind".into(),
                })?;
                // A kind both owned and related goes where the host would put it: owned when
                // the object has a controller ownerReference, related otherwise.
                let related_too = related.iter().any(|g| g.kind == kind);
                let controlled = doc["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["controller"] == true));
                let group = owned
                    .iter_mut()
                    .filter(|_| !related_too || controlled)
                    .chain(related.iter_mut())
                    .find(|g| g.kind == kind)
                    .ok_or_else(|| CliError::Input {
                        path: path.clone(),
                        detail: format!(
                            "observed {kind} is neither owned nor related by module {}",
                            metadata.name
                        ),
                    })?;
                group.objects.push(doc.to_string());
            }
        }
        // A recorded request brings its own objects and context.
        let replay = recorded.as_ref().map(RecordedRequest::to_request);
        if let Some(r) = &replay {
            owned.clone_from(&r.owned);
            related.clone_from(&r.related);
        }
        // The observed owned objects are this primary's children, as the host would see them.
        let children: ObservedChildren = owned
            .iter()
            .flat_map(|g| g.objects.iter().map(move |o| (&g.kind, o)))
            .filter_map(|(kind, o)| {
                let o: serde_json::Value = serde_json::from_str(o).ok()?;
                let name = o.pointer("/metadata/name")?.as_str()?.to_string();
                let namespace = match o.pointer("/metadata/namespace").and_then(|n| n.as_str()) {
                    Some(ns) => Some(ns.to_string()),
                    None if WellKnownScopes.namespaced(kind) == Some(true) => {
                        primary.namespace.clone()
                    }
                    None => None,
                };
                Some((kind.clone(), namespace, name))
            })
            .collect();
        let now = args.now_unix_ms.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or_default()
        });
        let request = ReconcileRequest {
            primary: primary_value.to_string(),
            owned,
            related,
            context: match replay {
                Some(r) => r.context,
                None => Context {
                    reconciler: args.reconciler.clone(),
                    trigger: Trigger::DryRun,
                    attempt: 1,
                    config: config.to_string(),
                    now_unix_ms: now,
                },
            },
        };
        let reconciler = request.context.reconciler.clone();
        let grant = Grant::from_metadata(&metadata);
        let finalize = args.finalize || recorded.as_ref().is_some_and(|r| r.finalize);
        let (done, response) = if finalize {
            let (done, response) = module.finalize(request, &limits).result?.into_response();
            (Some(done), response)
        } else {
            (None, module.reconcile(request, &limits).result?)
        };
        let validated = intents::validate(
            &reconciler,
            &primary,
            &grant,
            &WellKnownScopes,
            &children,
            response,
        )?;
        let mut v = serde_json::to_value(&validated).map_err(|e| CliError::Other(e.to_string()))?;
        if let (Some(done), Some(map)) = (done, v.as_object_mut()) {
            map.insert("done".into(), json!(done));
        }
        v
    };
    let rendered = to_yaml(&output);
    let Some(expect) = &args.expect else {
        print!("{rendered}");
        return Ok(ExitCode::SUCCESS);
    };
    if args.update {
        std::fs::write(expect, &rendered).map_err(|source| CliError::Io {
            action: "cannot write",
            path: expect.clone(),
            source,
        })?;
        eprintln!("wrote {}", expect.display());
        return Ok(ExitCode::SUCCESS);
    }
    let golden = read_one(expect)?;
    if golden == output {
        print!("{rendered}");
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
