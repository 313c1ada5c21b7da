//! A fresh local control plane for one contender, with the App CRD and namespace `demo`.
//!
//! # Guarantees
//! - Every contender gets a control plane started with the same [`wasmop_testenv::Options`].
//! - Its kwok nodes take every pod of the run ([`pods_per_node`]): no App waits on a Pending
//!   pod, so the runs measure convergence, not a requeue loop.
//! - [`Cluster::apply_yaml`] applies a user's manifests as `kubectl apply --server-side` would
//!   (kinds resolved by discovery) and waits until applied CRDs are Established.
//!
//! # Errors
//! [`Error::ControlPlane`] if it does not start; [`Error::Kube`] / [`Error::Other`] for
//! manifests that cannot be read or applied.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::Scope;
use kube::{Client, ResourceExt};
use serde_json::Value;
use wasmop_testenv::{ControlPlane, Options};

use crate::{Error, Result};

/// The namespace the Apps live in (the example's).
pub const NAMESPACE: &str = "demo";

/// A running control plane and an admin client.
pub struct Cluster {
    /// The control plane (dropped: torn down).
    pub plane: ControlPlane,
    /// An admin client.
    pub client: Client,
}

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Reads the YAML documents of a file.
///
/// # Errors
/// If it cannot be read or is not YAML.
pub fn yaml_docs(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).map_err(Error::io("reading", path))?;
    Ok(serde_saphyr::from_str_multiple::<Value, Vec<Value>>(&text)
        .map_err(|e| Error::Other(format!("{}: {e}", path.display())))?
        .into_iter()
        .filter(|d| !d.is_null())
        .collect())
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("plane", &self.plane)
            .finish_non_exhaustive()
    }
}

/// The `pods` capacity each of `nodes` kwok nodes needs so that `pods` pods (and the control
/// plane's own, none here) all fit, with room to spare; never below the kubelet default 110.
pub fn pods_per_node(pods: usize, nodes: usize) -> u32 {
    let each = pods.div_ceil(nodes.max(1)) + 10;
    u32::try_from(each).unwrap_or(u32::MAX).max(110)
}

impl Cluster {
    /// Starts a fresh control plane, installs the App CRD and creates namespace `demo`.
    ///
    /// # Errors
    /// See the module docs.
    pub async fn start() -> Result<Self> {
        Self::start_with(Vec::new(), 0).await
    }

    /// As [`Cluster::start`], with kube-apiserver `feature_gates` on and room for `pods` pods
    /// on its kwok nodes (the same options otherwise).
    ///
    /// # Errors
    /// See the module docs.
    pub async fn start_with(feature_gates: Vec<String>, pods: usize) -> Result<Self> {
        let defaults = Options::default();
        let plane = ControlPlane::start(Options {
            feature_gates,
            pods_per_node: pods_per_node(pods, defaults.nodes),
            ..defaults
        })
        .await?;
        let client = plane.client().await?;
        let cluster = Cluster { plane, client };
        cluster
            .apply_yaml(&repo().join("examples/image-updater/k8s/crd.yaml"))
            .await?;
        cluster
            .apply(vec![serde_json::json!({
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}
            })])
            .await?;
        Ok(cluster)
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        self.plane.kubeconfig()
    }

    /// Creates (applies) these namespaces.
    ///
    /// # Errors
    /// See the module docs.
    pub async fn namespaces(&self, names: &[String]) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let params = PatchParams::apply("wasmop-bench").force();
        futures::future::try_join_all(names.iter().map(|name| {
            let (api, params) = (&api, &params);
            async move {
                let ns = serde_json::json!({
                    "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
                });
                api.patch(name, params, &Patch::Apply(&ns))
                    .await
                    .map_err(Error::kube(format!("creating namespace {name}")))
            }
        }))
        .await?;
        Ok(())
    }

    /// Applies every document of a YAML file.
    ///
    /// # Errors
    /// See the module docs.
    pub async fn apply_yaml(&self, path: &Path) -> Result<()> {
        self.apply(yaml_docs(path)?).await
    }

    /// Applies objects (server-side, field manager `wasmop-bench`), waiting for CRDs.
    ///
    /// # Errors
    /// See the module docs.
    pub async fn apply(&self, docs: Vec<Value>) -> Result<()> {
        for doc in docs {
            let object: DynamicObject = serde_json::from_value(doc)
                .map_err(|e| Error::Other(format!("not a Kubernetes object: {e}")))?;
            let types = object.types.clone().ok_or_else(|| {
                Error::Other(format!("{} has no apiVersion/kind", object.name_any()))
            })?;
            let gvk = GroupVersionKind::try_from(&types)
                .map_err(|e| Error::Other(format!("{}: {e}", object.name_any())))?;
            let (resource, caps) = kube::discovery::pinned_kind(&self.client, &gvk)
                .await
                .map_err(Error::kube(format!("discovering {}", types.kind)))?;
            let api: Api<DynamicObject> = match (&caps.scope, object.namespace()) {
                (Scope::Namespaced, Some(ns)) => {
                    Api::namespaced_with(self.client.clone(), &ns, &resource)
                }
                (Scope::Namespaced, None) => {
                    Api::namespaced_with(self.client.clone(), "default", &resource)
                }
                (Scope::Cluster, _) => Api::all_with(self.client.clone(), &resource),
            };
            let name = object.name_any();
            api.patch(
                &name,
                &PatchParams::apply("wasmop-bench").force(),
                &Patch::Apply(&object),
            )
            .await
            .map_err(Error::kube(format!("applying {} {name}", types.kind)))?;
            if types.kind == "CustomResourceDefinition" {
                self.established(&name).await?;
            }
        }
        Ok(())
    }

    async fn established(&self, name: &str) -> Result<()> {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        wasmop_testenv::eventually(
            &format!("CRD {name} Established"),
            Duration::from_secs(60),
            || {
                let crds = crds.clone();
                async move {
                    let crd = crds.get(name).await?;
                    Ok(crd
                        .status
                        .and_then(|s| s.conditions)
                        .is_some_and(|cs| {
                            cs.iter()
                                .any(|c| c.type_ == "Established" && c.status == "True")
                        })
                        .then_some(()))
                }
            },
        )
        .await
        .map_err(|e| Error::Other(format!("{e:#}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pod_of_a_run_has_a_node() {
        assert_eq!(pods_per_node(50, 2), 110, "the kubelet default at least");
        assert_eq!(pods_per_node(1_000, 2), 510);
        assert_eq!(pods_per_node(10_000, 2), 5_010);
        assert!(u64::from(pods_per_node(10_001, 2)) * 2 >= 10_001);
    }
}
