//! `wasmop diff MODULE.wasm --reconciler WR`: preview a swap. Runs a candidate module against
//! every primary of a live WasmReconciler and prints, per primary, what it would change compared
//! with what is there now, then a summary (changed, unchanged, refused, failed).
//!
//! # Guarantees
//! - Read-only: the requests are built from the cluster as the host builds them
//!   ([`super::capture::observe`]), the intents are validated as the host validates them, and
//!   every child is applied with a server-side **dry run** (with the host's field manager,
//!   `wasmop/<reconciler>`), so defaults and admission apply and nothing is written.
//! - A child is `changed` when the dry-run result differs from the live object outside
//!   `metadata.managedFields`, `resourceVersion`, `generation` and timestamps; `create` when it
//!   does not exist; `prune` when it exists, is controlled by the primary and is not in the
//!   complete set. The status the module reports is compared with the live status fields.
//!
//! # Errors
//! [`CliError::Other`] when the WasmReconciler or the module cannot be read. A primary whose
//! module call or dry run fails is counted `failed`, one whose intents are refused `refused`;
//! the command exits non-zero only for the first kind of error.

use std::path::PathBuf;
use std::process::ExitCode;

use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::Value;

use super::CliError;
use super::capture::observe;
use crate::contract::{Context, KindObjects, ReconcileRequest, Trigger};
use crate::controller::intents::{self, Primary, WellKnownScopes};
use crate::crd::WasmReconciler;
use crate::engine::{Limits, Module};
use crate::modules::slot::Fit;

/// Arguments of `diff`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The candidate module (a `.wasm` component).
    pub module: PathBuf,
    /// The live WasmReconciler whose primaries the candidate runs against.
    #[arg(long)]
    pub reconciler: String,
    /// The kubeconfig to use.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// What the candidate would do to one primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// These changes.
    Changed(Vec<String>),
    /// Nothing.
    Unchanged,
    /// The host would refuse its intents.
    Refused(String),
    /// The module failed or a dry run failed.
    Failed(String),
}

/// Drops what the API server sets on every write.
fn comparable(mut v: Value) -> Value {
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for f in [
            "managedFields",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "uid",
        ] {
            meta.remove(f);
        }
    }
    if let Some(o) = v.as_object_mut() {
        o.remove("status");
    }
    v
}

async fn dry_run_child(
    client: &Client,
    field_manager: &str,
    kind: &crate::contract::Gvk,
    namespace: Option<&str>,
    name: &str,
    object: &Value,
) -> Result<Option<String>, String> {
    let gvk = GroupVersionKind::gvk(kind.group(), kind.version(), &kind.kind);
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|e| format!("{kind}: {e}"))?;
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let shown = match namespace {
        Some(ns) => format!("{} {ns}/{name}", kind.kind),
        None => format!("{} {name}", kind.kind),
    };
    let live = api
        .get_opt(name)
        .await
        .map_err(|e| format!("read {shown}: {e}"))?;
    let params = PatchParams::apply(field_manager).force().dry_run();
    let after = api
        .patch(name, &params, &Patch::Apply(object))
        .await
        .map_err(|e| format!("dry-run apply {shown}: {e}"))?;
    let Some(live) = live else {
        return Ok(Some(format!("create {shown}")));
    };
    let before = comparable(serde_json::to_value(&live).unwrap_or_default());
    let after = comparable(serde_json::to_value(&after).unwrap_or_default());
    if before == after {
        return Ok(None);
    }
    let (b, a) = (super::to_yaml(&before), super::to_yaml(&after));
    let diff = similar::TextDiff::from_lines(&b, &a)
        .unified_diff()
        .context_radius(1)
        .header("live", "candidate")
        .to_string();
    Ok(Some(format!("update {shown}\n{diff}")))
}

async fn one(
    client: &Client,
    wr: &WasmReconciler,
    fit: &Fit,
    module: &Module,
    primary: &DynamicObject,
) -> Outcome {
    let name = wr.metadata.name.clone().unwrap_or_default();
    let scope = primary.namespace();
    let (owned, related) = match observe(client, wr, fit, primary, scope.as_deref()).await {
        Ok(o) => o,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    let objects = |kinds: &[(crate::contract::Gvk, Vec<Value>)]| -> Vec<KindObjects> {
        kinds
            .iter()
            .map(|(kind, objects)| KindObjects {
                kind: kind.clone(),
                objects: objects.iter().map(Value::to_string).collect(),
            })
            .collect()
    };
    let primary_value = serde_json::to_value(primary).unwrap_or_default();
    let request = ReconcileRequest {
        primary: primary_value.to_string(),
        owned: objects(&owned),
        related: objects(&related),
        context: Context {
            reconciler: name.clone(),
            trigger: Trigger::DryRun,
            attempt: 1,
            config: wr
                .spec
                .config
                .clone()
                .unwrap_or_else(|| serde_json::json!({}))
                .to_string(),
            now_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or_default(),
        },
    };
    let call = module.clone();
    let response = match super::off_runtime(move || {
        call.reconcile(request, &Limits::default())
            .result
            .map_err(CliError::from)
    })
    .await
    {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(format!("the module failed: {e}")),
    };
    let info = match Primary::from_object(&primary_value) {
        Ok(p) => p,
        Err(e) => return Outcome::Failed(e),
    };
    let existing: Vec<(crate::contract::Gvk, Option<String>, String)> = owned
        .iter()
        .flat_map(|(kind, objects)| {
            objects.iter().filter_map(move |o| {
                let name = o.pointer("/metadata/name")?.as_str()?.to_string();
                let ns = o
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                Some((kind.clone(), ns, name))
            })
        })
        .collect();
    let children: intents::ObservedChildren = existing.iter().cloned().collect();
    let validated = match intents::validate(
        &name,
        &info,
        &fit.grant,
        &WellKnownScopes,
        &children,
        response,
    ) {
        Ok(v) => v,
        Err(rejected) => return Outcome::Refused(rejected.to_string()),
    };
    let field_manager = format!("wasmop/{name}");
    let mut changes = Vec::new();
    for set in &validated.children {
        for child in &set.objects {
            match dry_run_child(
                client,
                &field_manager,
                &set.kind,
                child.namespace.as_deref(),
                &child.name,
                &child.object,
            )
            .await
            {
                Ok(Some(change)) => changes.push(change),
                Ok(None) => {}
                Err(e) => return Outcome::Failed(e),
            }
        }
        let kept: Vec<(Option<String>, &str)> = set
            .objects
            .iter()
            .map(|c| (c.namespace.clone(), c.name.as_str()))
            .collect();
        for (kind, ns, child) in existing.iter().filter(|(k, _, _)| *k == set.kind) {
            if !kept.contains(&(ns.clone(), child.as_str())) {
                changes.push(format!("prune {} {}", kind.kind, child));
            }
        }
    }
    if let Some(status) = &validated.status {
        let live = primary_value.get("status").cloned().unwrap_or_default();
        let wanted: Value = serde_json::to_value(status).unwrap_or_default();
        let fields = wanted.get("fields").and_then(Value::as_object);
        let differs =
            fields.is_some_and(|fields| fields.iter().any(|(k, v)| live.get(k) != Some(v)));
        if differs {
            changes.push(format!(
                "status fields {}",
                fields
                    .map(|f| Value::Object(f.clone()).to_string())
                    .unwrap_or_default()
            ));
        }
    }
    if changes.is_empty() {
        Outcome::Unchanged
    } else {
        Outcome::Changed(changes)
    }
}

/// Runs the candidate against every primary; returns each primary (`Kind ns/name`) with its
/// outcome, in name order.
///
/// # Errors
/// See the module documentation.
pub async fn preview(args: &Args) -> Result<Vec<(String, Outcome)>, CliError> {
    let config = crate::host::kube_config(args.kubeconfig.as_ref())
        .await
        .map_err(|e| CliError::Other(e.to_string()))?;
    let client = Client::try_from(config).map_err(|e| CliError::Other(e.to_string()))?;
    let wr = Api::<WasmReconciler>::all(client.clone())
        .get(&args.reconciler)
        .await
        .map_err(|e| {
            CliError::Other(format!(
                "cannot read WasmReconciler {}: {e}",
                args.reconciler
            ))
        })?;
    let path = args.module.clone();
    let module = super::off_runtime(move || {
        let bytes = std::fs::read(&path).map_err(CliError::read(&path))?;
        super::engine(true)?
            .load(&bytes, &Limits::default())
            .map_err(|source| CliError::Load { path, source })
    })
    .await?;
    let primary_kind = wr.spec.primary.gvk();
    let owned: Vec<_> = wr.spec.owns.iter().map(|k| k.gvk()).collect();
    let related: Vec<_> = wr.spec.related.iter().map(|k| k.gvk()).collect();
    let fit = Fit::compute(module.metadata(), &primary_kind, &owned, &related)
        .map_err(CliError::Other)?;
    let gvk = GroupVersionKind::gvk(
        primary_kind.group(),
        primary_kind.version(),
        &primary_kind.kind,
    );
    let (resource, _) = kube::discovery::pinned_kind(&client, &gvk)
        .await
        .map_err(|e| CliError::Other(format!("the cluster does not serve {primary_kind}: {e}")))?;
    let mut primaries = Vec::new();
    let scopes: Vec<Option<String>> = if wr.spec.namespaces.is_empty() {
        vec![None]
    } else {
        wr.spec.namespaces.iter().cloned().map(Some).collect()
    };
    for ns in scopes {
        let api: Api<DynamicObject> = match &ns {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| CliError::Other(format!("cannot list {primary_kind}: {e}")))?;
        primaries.extend(list.items);
    }
    primaries.sort_by_key(|p| (p.namespace(), p.name_any()));
    let mut outcomes = Vec::new();
    for p in &primaries {
        let shown = match p.namespace() {
            Some(ns) => format!("{} {ns}/{}", primary_kind.kind, p.name_any()),
            None => format!("{} {}", primary_kind.kind, p.name_any()),
        };
        outcomes.push((shown, one(&client, &wr, &fit, &module, p).await));
    }
    Ok(outcomes)
}

pub(crate) async fn run(args: Args) -> Result<ExitCode, CliError> {
    let outcomes = preview(&args).await?;
    let (mut changed, mut unchanged, mut refused, mut failed) = (0, 0, 0, 0);
    for (shown, outcome) in &outcomes {
        match outcome {
            Outcome::Changed(changes) => {
                changed += 1;
                println!("{shown}: changed");
                for c in changes {
                    println!("  {}", c.replace('\n', "\n    ").trim_end());
                }
            }
            Outcome::Unchanged => {
                unchanged += 1;
                println!("{shown}: unchanged");
            }
            Outcome::Refused(why) => {
                refused += 1;
                println!("{shown}: refused: {why}");
            }
            Outcome::Failed(why) => {
                failed += 1;
                println!("{shown}: failed: {why}");
            }
        }
    }
    println!(
        "summary: {} primaries, {changed} changed, {unchanged} unchanged, {refused} refused, {failed} failed",
        outcomes.len()
    );
    Ok(ExitCode::SUCCESS)
}
