//! {{name}}: a `{{Kind}}` ({{group}}/v1) becomes a ConfigMap holding its `spec.message`.
//!
//! Start here: change the spec, the children and the status to what your operator manages.
//! The host hands [`Reconciler::reconcile`] the primary (desired state) and the children it
//! observes (actual state); the module answers with intents. `Response::complete` makes every
//! owned kind a complete set: children not added again are pruned.

use serde::{Deserialize, Serialize};
use wasmop_sdk::k8s::api::core::v1::ConfigMap;
use wasmop_sdk::k8s::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use wasmop_sdk::prelude::*;

/// The primary's API version.
pub const API_VERSION: &str = "{{group}}/v1";
/// The primary's kind.
pub const KIND: &str = "{{Kind}}";

/// What the user wants (`spec`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct {{Kind}}Spec {
    /// The text the ConfigMap carries.
    pub message: String,
}

/// What the module reports (`status`; the host adds `conditions` and `observedGeneration`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct {{Kind}}Status {
    /// The name of the ConfigMap.
    pub config_map: String,
}

/// A {{Kind}}.
pub type {{Kind}} = Object<{{Kind}}Spec, {{Kind}}Status>;

/// The module.
pub struct {{Kind}}Reconciler;

impl Reconciler for {{Kind}}Reconciler {
    fn metadata() -> Metadata {
        Metadata::new("{{name}}", env!("CARGO_PKG_VERSION"))
            .primary(Gvk::new(API_VERSION, KIND))
            .owns::<ConfigMap>()
    }

    fn reconcile(req: &Request) -> Result<Response> {
        let primary: {{Kind}} = req.primary()?;
        let name = primary.name().to_string();
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            data: Some([("message".to_string(), primary.spec.message.clone())].into()),
            ..ConfigMap::default()
        };
        Ok(Response::complete(req)
            .child(&config_map)
            .status(&{{Kind}}Status { config_map: name })
            .condition(Condition::new("Ready", true).reason("Rendered")))
    }
}

wasmop_sdk::export!({{Kind}}Reconciler);
