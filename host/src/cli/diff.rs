//! `wasmop diff MODULE.wasm --reconciler WR`: preview a swap. Runs a candidate module against
//! every primary of a live WasmReconciler and prints, per primary, what it would change compared
//! with what is there now, then a summary (changed, unchanged, refused, failed).
//!
//! # Guarantees
//! - Read-only: the requests are built from the cluster as the host builds them
//!   ([`super::capture::observe`]), the intents are validated as the host validates them, and
//!   every child is applied with a server-side **dry run** (with the host's field manager,
//!   `wasmop/<reconciler>`), so defaults and admission apply and nothing is written.
//! - Secret values are not printed: a changed Secret shows which keys changed
//!   (`<redacted: changed>`), not their values, unless `--show-secrets`.
//! - A child is `changed` when the dry-run result differs from the live object outside
//!   `metadata.managedFields`, `resourceVersion`, `generation` and timestamps; `create` when it
//!   does not exist; `prune` when it exists, is controlled by the primary and is not in the
//!   complete set. The status the module reports is compared with the live status fields.
//! - Over many primaries ([`Progress::MANY`] or more) it shows its progress on stderr: one line
//!   rewritten in place when stderr is a terminal (cleared before the report), else a line at
//!   each tenth; stdout carries only the report.
//!
//! # Errors
//! [`CliError::Other`] when the WasmReconciler or the module cannot be read. A primary whose
//! module call or dry run fails is counted `failed`, one whose intents are refused `refused`;
//! the command exits 1 when any primary failed (the preview is incomplete), 0 otherwise.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use serde_json::Value;

use super::CliError;
use super::capture::observe;
use super::kubeconfig::Connection;
use super::output::{self, Format};
use crate::contract::{Gvk, KindObjects, ReconcileRequest};
use crate::controller::call;
use crate::controller::intents::{self, Primary, WellKnownScopes};
use crate::crd::WasmReconciler;
use crate::engine::{Limits, Module};
use crate::modules::slot::Fit;
use crate::object::ObjectKey;

/// Arguments of `diff`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The candidate module (a `.wasm` component).
    pub module: PathBuf,
    /// The live WasmReconciler whose primaries the candidate runs against.
    #[arg(long)]
    pub reconciler: String,
    /// kubectl's connection flags.
    #[command(flatten)]
    pub connection: Connection,
    /// Print the result as one JSON or YAML document (default: text).
    #[arg(short, long, value_enum)]
    pub output: Option<Format>,
    /// Print Secret values in the changes (by default a Secret's data, string data and
    /// last-applied annotation print as `<redacted>`, changed values as `<redacted: changed>`).
    #[arg(long)]
    pub show_secrets: bool,
}

/// What the candidate would do to one primary (serialised as `{outcome, detail}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "lowercase")]
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
    show_secrets: bool,
) -> Result<Option<String>, String> {
    let gvk = GroupVersionKind::gvk(kind.group(), kind.version(), &kind.kind);
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|e| format!("{kind}: {e}"))?;
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let key = ObjectKey::new(namespace.map(str::to_string), name);
    let shown = format!("{} {key}", kind.kind);
    let live = api
        .get_opt(name)
        .await
        .map_err(|e| format!("read {shown}: {e}"))?;
    let params = PatchParams::apply(field_manager).force().dry_run();
    let after = api
        .patch(name, &params, &Patch::Apply(object))
        .await
        .map_err(|e| dry_run_error(kind, &shown, &e, show_secrets))?;
    let Some(live) = live else {
        return Ok(Some(format!("create {shown}")));
    };
    let before = comparable(serde_json::to_value(&live).unwrap_or_default());
    let after = comparable(serde_json::to_value(&after).unwrap_or_default());
    if before == after {
        return Ok(None);
    }
    Ok(Some(format!(
        "update {shown}\n{}",
        render(&before, &after, show_secrets)
    )))
}

/// What `wasmop diff` prints for a refused dry-run apply of `shown` (an object of `kind`).
fn dry_run_error(
    kind: &crate::contract::Gvk,
    shown: &str,
    e: &kube::Error,
    show_secrets: bool,
) -> String {
    let code = match e {
        kube::Error::Api(s) => format!(" (HTTP {})", s.code),
        _ => String::new(),
    };
    let text = crate::controller::apply::write_error_text(kind, e, show_secrets);
    format!("dry-run apply {shown}{code}: {text}")
}

/// The unified diff of a child's live and candidate YAML. A Secret's values are shown as
/// `<redacted>` (the candidate's as `<redacted: changed>` where they differ) unless
/// `show_secrets`.
fn render(before: &Value, after: &Value, show_secrets: bool) -> String {
    let (mut before, mut after) = (before.clone(), after.clone());
    if !show_secrets {
        hide_secret_values(&mut before, &mut after);
    }
    let (b, a) = (super::to_yaml(&before), super::to_yaml(&after));
    similar::TextDiff::from_lines(&b, &a)
        .unified_diff()
        .context_radius(1)
        .header("live", "candidate")
        .to_string()
}

/// Redacts a live and a candidate Secret, marking the candidate's values that differ.
fn hide_secret_values(before: &mut Value, after: &mut Value) {
    let mut changed = Vec::new();
    for field in ["data", "stringData"] {
        if let Some(values) = after.get(field).and_then(Value::as_object) {
            for (key, value) in values {
                if before.get(field).and_then(|b| b.get(key)) != Some(value) {
                    changed.push((field, key.clone()));
                }
            }
        }
    }
    let secret = crate::redact::redact(before) | crate::redact::redact(after);
    if !secret {
        return;
    }
    for (field, key) in changed {
        if let Some(value) = after.get_mut(field).and_then(|m| m.get_mut(&key)) {
            *value = Value::String(format!("{}: changed", crate::redact::REDACTED));
        }
    }
}

/// One owned or related kind's objects, as [`observe`] reads them.
type Observed = (Gvk, Vec<Value>);

/// The request the host would build for `primary` (its children and related objects as
/// `observe` read them), with a dry run's context.
fn request_for(
    wr: &WasmReconciler,
    primary: &Value,
    (owned, related): (&[Observed], &[Observed]),
) -> ReconcileRequest {
    let objects = |kinds: &[Observed]| -> Vec<KindObjects> {
        kinds
            .iter()
            .map(|(kind, objects)| KindObjects {
                kind: kind.clone(),
                objects: objects.iter().map(Value::to_string).collect(),
            })
            .collect()
    };
    let name = wr.metadata.name.clone().unwrap_or_default();
    let config = wr
        .spec
        .config
        .clone()
        .unwrap_or_else(|| serde_json::json!({}))
        .to_string();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default();
    ReconcileRequest {
        primary: primary.to_string(),
        owned: objects(owned),
        related: objects(related),
        context: call::dry_run_context(&name, &config, now),
    }
}

/// The owned objects `observe` read, as `(kind, namespace, name)`.
fn existing_children(owned: &[Observed]) -> Vec<(Gvk, Option<String>, String)> {
    owned
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
        .collect()
}

/// What the candidate would do to `primary`: the module runs on the request the host would
/// build, its intents are validated as the host validates them ([`call::run`]), and the
/// children are applied with a dry run.
async fn preview_primary(
    (client, as_module): (&Client, &Client),
    wr: &WasmReconciler,
    fit: &Fit,
    module: &Module,
    primary: &DynamicObject,
    show_secrets: bool,
) -> Outcome {
    let name = wr.metadata.name.clone().unwrap_or_default();
    let scope = primary.namespace();
    let (owned, related) = match observe(client, wr, fit, primary, scope.as_deref()).await {
        Ok(o) => o,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    let primary_value = serde_json::to_value(primary).unwrap_or_default();
    let request = request_for(wr, &primary_value, (&owned, &related));
    let info = match Primary::from_object(&primary_value) {
        Ok(p) => p,
        Err(e) => return Outcome::Failed(e),
    };
    let existing = existing_children(&owned);
    let children: intents::ObservedChildren = existing.iter().cloned().collect();
    let check = call::Check {
        reconciler: &name,
        primary: &info,
        grant: &fit.grant,
        scopes: &WellKnownScopes,
        children: &children,
    };
    let export = call::Export::Reconcile;
    let validated = match call::run(module, export, request, Limits::default(), &check).await {
        Ok(checked) => checked.validated,
        Err(call::Failure::Rejected(rejected)) => return Outcome::Refused(rejected.to_string()),
        Err(call::Failure::Call(e)) => return Outcome::Failed(format!("the module failed: {e}")),
        Err(call::Failure::Join(e)) => {
            return Outcome::Failed(format!(
                "the module failed: the module call's thread failed: {e}"
            ));
        }
    };
    let field_manager = format!("wasmop/{name}");
    let mut changes = match child_changes(
        as_module,
        &field_manager,
        &validated,
        &existing,
        show_secrets,
    )
    .await
    {
        Ok(c) => c,
        Err(e) => return Outcome::Failed(e),
    };
    changes.extend(status_change(&validated, &primary_value));
    if changes.is_empty() {
        Outcome::Unchanged
    } else {
        Outcome::Changed(changes)
    }
}

/// The changes to the children: each child applied with a dry run, then the prunes of the
/// `existing` children no complete set keeps.
async fn child_changes(
    client: &Client,
    field_manager: &str,
    validated: &intents::Validated,
    existing: &[(Gvk, Option<String>, String)],
    show_secrets: bool,
) -> Result<Vec<String>, String> {
    let mut changes = Vec::new();
    for set in &validated.children {
        for child in &set.objects {
            let namespace = child.namespace.as_deref();
            let change = dry_run_child(
                client,
                field_manager,
                &set.kind,
                namespace,
                &child.name,
                &child.object,
                show_secrets,
            )
            .await?;
            changes.extend(change);
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
    Ok(changes)
}

/// The change of the status fields the module reports, compared with the live ones.
fn status_change(validated: &intents::Validated, primary: &Value) -> Option<String> {
    let status = validated.status.as_ref()?;
    let live = primary.get("status").cloned().unwrap_or_default();
    let wanted: Value = serde_json::to_value(status).unwrap_or_default();
    let fields = wanted.get("fields").and_then(Value::as_object);
    let differs = fields.is_some_and(|fields| fields.iter().any(|(k, v)| live.get(k) != Some(v)));
    differs.then(|| {
        format!(
            "status fields {}",
            fields
                .map(|f| Value::Object(f.clone()).to_string())
                .unwrap_or_default()
        )
    })
}

/// Runs the candidate against every primary; returns each primary (`Kind ns/name`) with its
/// outcome, in name order.
///
/// # Errors
/// See the module documentation.
pub async fn preview(args: &Args) -> Result<Vec<(String, Outcome)>, CliError> {
    let (client, config, _) = args.connection.client(None).await?;
    let wr = Api::<WasmReconciler>::all(client.clone())
        .get(&args.reconciler)
        .await
        .map_err(|e| {
            CliError::Other(format!(
                "cannot read WasmReconciler {}: {e}",
                args.reconciler
            ))
        })?;
    // The dry runs write as the host would: as the module's ServiceAccount, so what its RBAC
    // forbids shows as refused here too (the caller needs `impersonate` on it, as the
    // WasmReconciler's creator does).
    let as_module = impersonating(config, &wr)?;
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
        let mut items = list.items;
        super::capture::typed(&mut items, &primary_kind);
        primaries.extend(items);
    }
    primaries.sort_by_key(|p| (p.namespace(), p.name_any()));
    let stderr = std::io::stderr();
    let live = stderr.is_terminal();
    let mut progress = Progress::new(stderr, primaries.len(), live);
    let mut outcomes = Vec::new();
    for p in &primaries {
        let shown = format!("{} {}", primary_kind.kind, ObjectKey::of(p));
        outcomes.push((
            shown,
            preview_primary(
                (&client, &as_module),
                &wr,
                &fit,
                &module,
                p,
                args.show_secrets,
            )
            .await,
        ));
        progress.step(&outcomes);
    }
    progress.finish();
    Ok(outcomes)
}

/// The progress of a preview over many primaries (see the module docs). Errors writing it are
/// ignored: progress is a courtesy, the report is the result.
#[derive(Debug)]
pub struct Progress<W: Write> {
    out: W,
    total: usize,
    live: bool,
    /// The last tenth reported (not live).
    tenth: usize,
}

impl<W: Write> Progress<W> {
    /// Fewer primaries than this preview quickly: no progress is shown.
    pub const MANY: usize = 10;

    /// Progress over `total` primaries, written to `out`; `live`: rewrite one line in place (a
    /// terminal), else a line at each tenth.
    pub fn new(out: W, total: usize, live: bool) -> Self {
        Progress {
            out,
            total,
            live,
            tenth: 0,
        }
    }

    /// After each primary: `outcomes` so far.
    pub fn step(&mut self, outcomes: &[(String, Outcome)]) {
        if self.total < Self::MANY {
            return;
        }
        let done = outcomes.len();
        let count = |f: fn(&Outcome) -> bool| outcomes.iter().filter(|(_, o)| f(o)).count();
        let line = format!(
            "diff: {done} of {} primaries previewed ({} changed, {} refused, {} failed)",
            self.total,
            count(|o| matches!(o, Outcome::Changed(_))),
            count(|o| matches!(o, Outcome::Refused(_))),
            count(|o| matches!(o, Outcome::Failed(_))),
        );
        if self.live {
            let _ = write!(self.out, "\r\x1b[2K{line}");
            let _ = self.out.flush();
            return;
        }
        let tenth = done * 10 / self.total;
        if tenth > self.tenth {
            self.tenth = tenth;
            let _ = writeln!(self.out, "{line}");
        }
    }

    /// After the last primary: clears the live line.
    pub fn finish(&mut self) {
        if self.live && self.total >= Self::MANY {
            let _ = write!(self.out, "\r\x1b[2K");
            let _ = self.out.flush();
        }
    }
}

/// A client of `config` impersonating `wr`'s ServiceAccount.
fn impersonating(mut config: kube::Config, wr: &WasmReconciler) -> Result<Client, CliError> {
    config.auth_info.impersonate = Some(wr.spec.service_account.username());
    Client::try_from(config).map_err(|e| CliError::Other(e.to_string()))
}

/// One primary's line of the report.
#[derive(Debug, Serialize)]
pub struct PrimaryOutcome {
    /// `Kind namespace/name`.
    pub primary: String,
    /// What the candidate would do to it.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// How many primaries ended each way.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    /// Every primary previewed.
    pub primaries: usize,
    /// With changes.
    pub changed: usize,
    /// Without.
    pub unchanged: usize,
    /// Whose intents the host would refuse.
    pub refused: usize,
    /// Whose module call or dry run failed.
    pub failed: usize,
}

/// What `diff` prints: each primary's outcome, then the summary.
#[derive(Debug, Serialize)]
pub struct Report {
    /// In name order.
    pub primaries: Vec<PrimaryOutcome>,
    /// The counts.
    pub summary: Summary,
}

impl Report {
    fn of(outcomes: Vec<(String, Outcome)>) -> Report {
        let mut summary = Summary {
            primaries: outcomes.len(),
            ..Summary::default()
        };
        for (_, outcome) in &outcomes {
            *match outcome {
                Outcome::Changed(_) => &mut summary.changed,
                Outcome::Unchanged => &mut summary.unchanged,
                Outcome::Refused(_) => &mut summary.refused,
                Outcome::Failed(_) => &mut summary.failed,
            } += 1;
        }
        let primaries = outcomes
            .into_iter()
            .map(|(primary, outcome)| PrimaryOutcome { primary, outcome })
            .collect();
        Report { primaries, summary }
    }

    /// The human output.
    fn text(&self) -> String {
        let mut out = String::new();
        for PrimaryOutcome { primary, outcome } in &self.primaries {
            match outcome {
                Outcome::Changed(changes) => {
                    out += &format!("{primary}: changed\n");
                    for c in changes {
                        out += &format!("  {}\n", c.replace('\n', "\n    ").trim_end());
                    }
                }
                Outcome::Unchanged => out += &format!("{primary}: unchanged\n"),
                Outcome::Refused(why) => out += &format!("{primary}: refused: {why}\n"),
                Outcome::Failed(why) => out += &format!("{primary}: failed: {why}\n"),
            }
        }
        let s = &self.summary;
        out += &format!(
            "summary: {} primaries, {} changed, {} unchanged, {} refused, {} failed\n",
            s.primaries, s.changed, s.unchanged, s.refused, s.failed
        );
        out
    }
}

pub(crate) async fn run(args: Args) -> Result<ExitCode, CliError> {
    let outcomes = preview(&args).await?;
    let status = exit_status(&outcomes);
    let report = Report::of(outcomes);
    match args.output {
        Some(format) => print!("{}", output::render(format, &report)?),
        None => print!("{}", report.text()),
    }
    Ok(ExitCode::from(status))
}

/// 1 when a primary could not be previewed (its module call or a dry run failed): the preview
/// is incomplete and must not pass for a clean one in a script. 0 otherwise (changes and
/// refusals are what a preview is for).
fn exit_status(outcomes: &[(String, Outcome)]) -> u8 {
    u8::from(
        outcomes
            .iter()
            .any(|(_, o)| matches!(o, Outcome::Failed(_))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kube's lists leave each item's type empty, and the API server sends none for built-in
    /// kinds: a ConfigMap primary listed by `wasmop diff` must still be a primary.
    #[test]
    fn a_listed_built_in_primary_has_its_type() {
        let item: DynamicObject = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "a", "namespace": "n"}}),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut items = vec![item];
        super::super::capture::typed(&mut items, &Gvk::new("v1", "ConfigMap"));
        let value = serde_json::to_value(&items[0]).unwrap_or_default();
        assert!(Primary::from_object(&value).is_ok(), "{value}");
    }

    /// A refused dry run of a Secret: the API server's message can quote the value it
    /// rejects; `wasmop diff` prints it only with `--show-secrets`, and never raw.
    #[test]
    fn a_refused_secret_dry_run_prints_no_value() {
        let quoting = r#".stringData.password: expected string, got &value.valueUnstructured{Value:[]interface {}{"hunter2"}}"#;
        let status = kube::core::Status::failure(quoting, "InternalError").with_code(500);
        let e = kube::Error::Api(Box::new(status));
        let secret = crate::contract::Gvk::new("v1", "Secret");
        let hidden = dry_run_error(&secret, "Secret ns/s", &e, false);
        assert!(!hidden.contains("hunter2"), "{hidden}");
        assert!(
            hidden.contains("Secret ns/s") && hidden.contains("500"),
            "{hidden}"
        );
        let shown = dry_run_error(&secret, "Secret ns/s", &e, true);
        assert!(shown.contains("hunter2"), "{shown}");
        let forged = kube::core::Status::failure("x\u{1b}[2Jy", "Invalid").with_code(422);
        let text = dry_run_error(
            &secret,
            "Secret ns/s",
            &kube::Error::Api(Box::new(forged)),
            true,
        );
        assert!(!text.contains('\u{1b}'), "{text}");
    }

    #[test]
    fn a_changed_secret_shows_which_keys_changed_not_their_values() {
        let secret = |password: &str| {
            serde_json::json!({
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                "data": {"password": password, "user": "YWRtaW4="},
            })
        };
        let shown = render(
            &secret("b2xkLXNlY3JldA=="),
            &secret("bmV3LXNlY3JldA=="),
            false,
        );
        for value in ["b2xkLXNlY3JldA", "bmV3LXNlY3JldA", "YWRtaW4"] {
            assert!(!shown.contains(value), "{value} is printed:\n{shown}");
        }
        assert!(
            shown
                .lines()
                .any(|l| l.starts_with('+') && l.contains("password")),
            "the changed key is shown:\n{shown}"
        );
    }

    fn progress(total: usize, live: bool) -> String {
        let mut out = Vec::new();
        let mut progress = Progress::new(&mut out, total, live);
        let mut outcomes = Vec::new();
        for i in 0..total {
            let outcome = match i % 4 {
                0 => Outcome::Changed(vec!["create ConfigMap ns/c".into()]),
                1 => Outcome::Refused("intents refused".into()),
                2 => Outcome::Failed("boom".into()),
                _ => Outcome::Unchanged,
            };
            outcomes.push((format!("Widget ns/w{i}"), outcome));
            progress.step(&outcomes);
        }
        progress.finish();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn a_preview_of_many_primaries_shows_its_progress() {
        // Not a terminal: a line at each tenth, the last one the whole count.
        let lines = progress(100, false);
        let lines: Vec<&str> = lines.lines().collect();
        assert_eq!(lines.len(), 10, "{lines:?}");
        assert_eq!(
            lines[0],
            "diff: 10 of 100 primaries previewed (3 changed, 3 refused, 2 failed)"
        );
        assert_eq!(
            lines[9],
            "diff: 100 of 100 primaries previewed (25 changed, 25 refused, 25 failed)"
        );
        // 25 primaries: each tenth that a primary completes, once.
        assert_eq!(progress(25, false).lines().count(), 10);
        // A terminal: one line rewritten in place, cleared at the end.
        let live = progress(12, true);
        assert_eq!(live.matches('\r').count(), 13, "{live:?}");
        assert!(
            live.contains("diff: 12 of 12 primaries previewed"),
            "{live:?}"
        );
        assert!(
            live.ends_with("\r\x1b[2K") && !live.contains('\n'),
            "{live:?}"
        );
        // A few primaries preview quickly: nothing.
        assert_eq!(progress(Progress::<Vec<u8>>::MANY - 1, false), "");
        assert_eq!(progress(3, true), "");
    }

    #[test]
    fn a_preview_with_failed_primaries_exits_non_zero() {
        let outcome = |o: Outcome| ("Widget ns/w".to_string(), o);
        let failed = || outcome(Outcome::Failed("the module failed: boom".into()));
        assert_eq!(
            exit_status(&[failed(), failed()]),
            1,
            "every primary failed"
        );
        assert_eq!(exit_status(&[outcome(Outcome::Unchanged), failed()]), 1);
        let clean = [
            outcome(Outcome::Unchanged),
            outcome(Outcome::Changed(vec!["create ConfigMap ns/c".into()])),
            outcome(Outcome::Refused("intents refused".into())),
        ];
        assert_eq!(exit_status(&clean), 0);
        assert_eq!(exit_status(&[]), 0);
    }
}
