//! `wasmop test MODULE.wasm --from-cluster KIND/NAMESPACE/NAME --reconciler WR [--out DIR]`:
//! capture a real case from a live cluster as a fixture directory, then test it.
//!
//! What is captured is what the host would hand the module: the primary; its observed children
//! (objects of the kinds both the module asks to own and the WasmReconciler grants, controlled
//! by the primary, the host's own [`controlled_by`] filter); and its related objects (the
//! granted related kinds, narrowed by the WasmReconciler's label selector and the module's own,
//! in the primary's namespace when it is namespaced). The owned and related kinds come from the
//! host's [`Fit::compute`] of the module's metadata and the grant.
//!
//! The directory is what `wasmop test` reads: `cr.yaml`, `observed/<kind>.yaml` per owned kind
//! and `related/<kind>.yaml` per related kind.
//!
//! # Guarantees
//! - Fixtures are meant for commits: every Secret (the primary too) is written redacted
//!   ([`crate::redact`]) unless [`CaptureSpec::keep_secrets`], and every file is owner-readable
//!   only (0600).
//! - Everything is read from the cluster before a file is written: a read that fails leaves
//!   the directory as it was. A capture over an earlier one deletes the earlier file of a kind
//!   that has no objects now.
//!
//! # Caveats
//! - Files of kinds the WasmReconciler no longer grants, and files the author added, stay.
//!
//! # Errors
//! [`CliError::Other`] naming what could not be read from the cluster (and the RBAC to check),
//! [`CliError::Io`] for a file that cannot be written.

use std::path::{Path, PathBuf};

use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams, TypeMeta};
use kube::{Client, ResourceExt};
use serde_json::Value;

use super::kubeconfig::Connection;
use super::{CliError, to_yaml};
use crate::contract::{Gvk, ModuleMetadata};
use crate::controller::apply::controlled_by;
use crate::crd::WasmReconciler;
use crate::modules::slot::Fit;

/// Where a capture comes from and goes to.
#[derive(Debug, Clone)]
pub struct CaptureSpec {
    /// `Kind/namespace/name`, or `Kind/name` (a cluster-scoped primary, or one in
    /// `namespace`).
    pub from: String,
    /// The WasmReconciler whose grant decides what the module sees.
    pub reconciler: String,
    /// The fixture directory to write.
    pub out: Option<PathBuf>,
    /// kubectl's connection flags.
    pub connection: Connection,
    /// The namespace of a namespaced `Kind/name` primary (default: the context's).
    pub namespace: Option<String>,
    /// Keep Secret data (default: redacted).
    pub keep_secrets: bool,
}

/// The files a capture wrote.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    /// The fixture directory.
    pub dir: PathBuf,
    /// `cr.yaml`.
    pub object: PathBuf,
    /// The observed (owned and related) files.
    pub observed: Vec<PathBuf>,
    /// The WasmReconciler's config, as JSON text.
    pub config: String,
}

fn other(what: String) -> impl FnOnce(kube::Error) -> CliError {
    move |e| {
        CliError::Other(format!(
            "{what}: {e} (check the kubeconfig's RBAC: get and list)"
        ))
    }
}

fn parse_from(from: &str) -> Result<(String, Option<String>, String), CliError> {
    let parts: Vec<&str> = from.split('/').collect();
    match parts.as_slice() {
        [kind, ns, name] if !kind.is_empty() && !ns.is_empty() && !name.is_empty() => {
            Ok((kind.to_string(), Some(ns.to_string()), name.to_string()))
        }
        [kind, name] if !kind.is_empty() && !name.is_empty() => {
            Ok((kind.to_string(), None, name.to_string()))
        }
        _ => Err(CliError::Other(format!(
            "--from-cluster {from:?}: expected KIND/NAMESPACE/NAME (or KIND/NAME for a cluster-scoped kind), e.g. App/default/web"
        ))),
    }
}

/// An API for `kind`, namespaced to `namespace` when the kind is namespaced and one is given.
async fn api(
    client: &Client,
    kind: &Gvk,
    namespace: Option<&str>,
) -> Result<(Api<DynamicObject>, bool), CliError> {
    let gvk = GroupVersionKind::gvk(kind.group(), kind.version(), &kind.kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .map_err(other(format!("the cluster does not serve {kind}")))?;
    let namespaced = caps.scope == kube::discovery::Scope::Namespaced;
    let api = match (namespaced, namespace) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        _ => Api::all_with(client.clone(), &resource),
    };
    Ok((api, namespaced))
}

async fn list(
    api: &Api<DynamicObject>,
    kind: &Gvk,
    labels: Option<&str>,
) -> Result<Vec<DynamicObject>, CliError> {
    let mut params = ListParams::default();
    if let Some(labels) = labels {
        params = params.labels(labels);
    }
    let mut items = api
        .list(&params)
        .await
        .map_err(other(format!("cannot list {kind}")))?
        .items;
    typed(&mut items, kind);
    items.sort_by_key(|o| (o.namespace(), o.name_any()));
    Ok(items)
}

/// Gives listed `items` of `kind` their type: list items may come without it (kube's lists of
/// `DynamicObject` leave it empty; the API server sends none for built-in kinds), and the host
/// hands objects over with it.
pub(crate) fn typed(items: &mut [DynamicObject], kind: &Gvk) {
    for o in items {
        o.types.get_or_insert_with(|| TypeMeta {
            api_version: kind.api_version.clone(),
            kind: kind.kind.clone(),
        });
    }
}

/// Writes `docs` as one YAML file, owner-readable only, Secrets redacted unless `keep_secrets`.
fn write(path: &Path, docs: &[Value], keep_secrets: bool) -> Result<(), CliError> {
    let io = |source| CliError::Io {
        action: "cannot write",
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let text: Vec<String> = docs
        .iter()
        .map(|doc| {
            let mut doc = doc.clone();
            if !keep_secrets {
                crate::redact::redact(&mut doc);
            }
            to_yaml(&doc)
        })
        .collect();
    crate::files::write_private(path, text.join("---\n").as_bytes()).map_err(io)
}

fn file_of(kind: &Gvk) -> String {
    let group = kind.group();
    if group.is_empty() {
        format!("{}.yaml", kind.kind.to_ascii_lowercase())
    } else {
        format!("{}.{group}.yaml", kind.kind.to_ascii_lowercase())
    }
}

fn value(o: &DynamicObject) -> Value {
    serde_json::to_value(o).unwrap_or_default()
}

/// Objects of one kind.
pub type KindValues = Vec<(Gvk, Vec<Value>)>;

/// What the host would hand the module with `primary`: its children per owned kind of `fit`,
/// and its related objects per related kind of `fit`, read from the cluster. `scope` is the
/// primary's namespace when the primary is namespaced.
///
/// # Errors
/// [`CliError::Other`] naming the kind that cannot be read.
pub async fn observe(
    client: &Client,
    wr: &WasmReconciler,
    fit: &Fit,
    primary: &DynamicObject,
    scope: Option<&str>,
) -> Result<(KindValues, KindValues), CliError> {
    let uid = primary.uid().unwrap_or_default();
    let mut owned = Vec::new();
    for kind in &fit.grant.owned {
        let (api, _) = api(client, kind, scope).await?;
        let children: Vec<Value> = list(&api, kind, None)
            .await?
            .iter()
            .filter(|o| controlled_by(o, &uid))
            .map(value)
            .collect();
        owned.push((kind.clone(), children));
    }
    let mut related = Vec::new();
    for rk in &fit.related {
        let labels = wr
            .spec
            .related
            .iter()
            .find(|g| g.gvk() == rk.kind)
            .and_then(|g| g.selector.clone());
        let (api, _) = api(client, &rk.kind, scope).await?;
        let objects: Vec<Value> = list(&api, &rk.kind, labels.as_deref())
            .await?
            .iter()
            .filter(|o| rk.selector.matches(o.labels()))
            .map(value)
            .collect();
        related.push((rk.kind.clone(), objects));
    }
    Ok((owned, related))
}

/// Reads the case from the cluster and writes the fixture directory.
///
/// # Errors
/// See the module documentation.
pub async fn capture(spec: &CaptureSpec, metadata: &ModuleMetadata) -> Result<Captured, CliError> {
    let (kind, namespace, name) = parse_from(&spec.from)?;
    let (client, _, default_namespace) = spec.connection.client(spec.namespace.as_deref()).await?;
    // `Kind/name` of a namespaced kind is in -n's namespace, or the context's (as kubectl's).
    let namespace = namespace.or(Some(default_namespace));
    let wr = Api::<WasmReconciler>::all(client.clone())
        .get(&spec.reconciler)
        .await
        .map_err(other(format!(
            "cannot read WasmReconciler {}",
            spec.reconciler
        )))?;
    let primary_kind = wr.spec.primary.gvk();
    if primary_kind.kind != kind {
        return Err(CliError::Other(format!(
            "WasmReconciler {} reconciles {primary_kind}, not {kind}",
            spec.reconciler
        )));
    }
    let owned: Vec<Gvk> = wr.spec.owns.iter().map(|k| k.gvk()).collect();
    let related: Vec<Gvk> = wr.spec.related.iter().map(|k| k.gvk()).collect();
    let fit = Fit::compute(metadata, &primary_kind, &owned, &related).map_err(CliError::Other)?;
    let (primaries, namespaced) = api(&client, &primary_kind, namespace.as_deref()).await?;
    let primary = primaries
        .get(&name)
        .await
        .map_err(other(format!("cannot read {}", spec.from)))?;
    let scope = if namespaced {
        namespace.as_deref()
    } else {
        None
    };
    let dir = spec
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("fixtures").join(&name));
    let mut captured = Captured {
        object: dir.join("cr.yaml"),
        dir: dir.clone(),
        config: wr
            .spec
            .config
            .clone()
            .unwrap_or_else(|| serde_json::json!({}))
            .to_string(),
        observed: Vec::new(),
    };
    // Everything is read before anything is written: a read that fails leaves the fixture
    // directory as it was.
    let (owned, related) = observe(&client, &wr, &fit, &primary, scope).await?;
    write_fixture(
        &mut captured,
        &value(&primary),
        [owned, related],
        spec.keep_secrets,
    )?;
    Ok(captured)
}

/// Writes the fixture of `primary` with its children `owned` and related objects `related`
/// into `captured.dir`, noting the files in `captured`. A kind with no objects has no file:
/// one an earlier capture wrote is deleted.
fn write_fixture(
    captured: &mut Captured,
    primary: &Value,
    [owned, related]: [KindValues; 2],
    keep: bool,
) -> Result<(), CliError> {
    write(&captured.object, std::slice::from_ref(primary), keep)?;
    for (folder, kinds) in [("observed", owned), ("related", related)] {
        for (kind, objects) in &kinds {
            let path = captured.dir.join(folder).join(file_of(kind));
            if objects.is_empty() {
                remove_stale(&path)?;
                continue;
            }
            write(&path, objects, keep)?;
            captured.observed.push(path);
        }
    }
    Ok(())
}

/// Deletes `path` if it exists.
fn remove_stale(path: &Path) -> Result<(), CliError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CliError::Io {
            action: "cannot delete the earlier capture of a kind with no objects now,",
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::files::temp_dir;

    /// A capture over an earlier one: a kind that has no objects now must not keep the earlier
    /// run's file, or the fixture shows children (or related Secrets, kept with
    /// `--keep-secrets` then) that no longer exist.
    #[test]
    fn a_kind_with_no_objects_now_leaves_no_file_of_an_earlier_capture() {
        let (_tmp, dir) = temp_dir();
        let deployment = Gvk::new("apps/v1", "Deployment");
        let secret = Gvk::new("v1", "Secret");
        let old = [
            dir.join("observed").join(file_of(&deployment)),
            dir.join("related").join(file_of(&secret)),
        ];
        for path in &old {
            assert!(write(path, &[serde_json::json!({"old": true})], true).is_ok());
        }
        let mut captured = Captured {
            object: dir.join("cr.yaml"),
            dir: dir.clone(),
            ..Captured::default()
        };
        let primary = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap"});
        let written = write_fixture(
            &mut captured,
            &primary,
            [vec![(deployment, vec![])], vec![(secret, vec![])]],
            false,
        );
        assert!(written.is_ok(), "{written:?}");
        assert!(captured.object.exists());
        for path in &old {
            assert!(!path.exists(), "{} is left from before", path.display());
        }
    }

    #[test]
    fn a_captured_secret_is_redacted_and_the_file_is_private() {
        let (_tmp, dir) = temp_dir();
        let secret = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"password\":\"aHVudGVyMg==\"}}"
            }},
            "data": {"password": "aHVudGVyMg=="},
        });
        let path = dir.join("related").join("secret.yaml");
        let written = write(&path, &[secret], false);
        assert!(written.is_ok(), "{written:?}");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            !text.contains("aHVudGVyMg"),
            "a fixture with Secret data:\n{text}"
        );
        assert!(text.contains("password"), "the keys stay: {text}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode.ok(), Some(0o600), "a fixture others can read");
    }
}
