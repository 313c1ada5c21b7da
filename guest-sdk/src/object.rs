//! A typed custom resource.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// A custom resource with a typed `spec` and `status`: `type App = Object<AppSpec, AppStatus>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Object<Spec, Status = serde_json::Value> {
    /// `group/version`.
    pub api_version: String,
    /// The kind.
    pub kind: String,
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The desired state.
    pub spec: Spec,
    /// The observed state, as last written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

impl<Spec, Status> Object<Spec, Status> {
    /// `metadata.name`, or "" when absent.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// `metadata.namespace`, or None for cluster-scoped objects.
    pub fn namespace(&self) -> Option<&str> {
        self.metadata.namespace.as_deref()
    }

    /// `metadata.generation`, or 0.
    pub fn generation(&self) -> i64 {
        self.metadata.generation.unwrap_or_default()
    }

    /// Whether the object is being deleted.
    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// The object's labels as `(key, value)` pairs.
    pub fn labels(&self) -> impl Iterator<Item = (&str, &str)> + Clone {
        self.metadata
            .labels
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }
}
