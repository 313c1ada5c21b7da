//! image-updater: an `App` (image, replicas, port) becomes a Deployment and a Service.
//!
//! - Changing `spec.image` rolls the Deployment out (the Deployment controller does the rolling).
//! - The status reports the ready replicas and the conditions `Available` and `Progressing`.
//! - `spec.track` is part of the Deployment's selector, which Kubernetes never lets change, so
//!   `validate` refuses to change it (instead of the apply failing later, silently for the user).
//! - Deleting an App drains it first: finalize deletes the Service, waits until it is gone, then
//!   lets the garbage collector remove the Deployment.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wasmop_sdk::k8s::api::apps::v1::{Deployment, DeploymentSpec};
use wasmop_sdk::k8s::api::core::v1::{
    Container, ContainerPort, PodSpec, PodTemplateSpec, Service, ServicePort, ServiceSpec,
};
use wasmop_sdk::k8s::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use wasmop_sdk::k8s::apimachinery::pkg::util::intstr::IntOrString;
use wasmop_sdk::prelude::*;

/// The App's API version.
pub const API_VERSION: &str = "example.wasmop.dev/v1";
/// The App's kind.
pub const KIND: &str = "App";

/// What the user wants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppSpec {
    /// The container image.
    pub image: String,
    /// How many pods.
    #[serde(default = "one")]
    pub replicas: i32,
    /// The port the container listens on; the Service exposes it on port 80.
    #[serde(default = "eighty")]
    pub port: i32,
    /// A label in the Deployment's selector (`stable`, `canary`); immutable.
    #[serde(default = "stable")]
    pub track: String,
}

fn one() -> i32 {
    1
}
fn eighty() -> i32 {
    8080
}
fn stable() -> String {
    "stable".into()
}

/// What the module reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppStatus {
    /// Desired pods.
    pub replicas: i32,
    /// Pods that are Ready.
    pub ready_replicas: i32,
    /// Pods running the current image.
    pub updated_replicas: i32,
    /// The image the Deployment runs.
    pub image: String,
    /// For `kubectl scale`: the selector of the App's pods.
    pub selector: String,
}

/// An App.
pub type App = Object<AppSpec, serde_json::Value>;

/// The module.
#[derive(Debug)]
pub struct ImageUpdater;

/// The labels every child and pod of `app` carries.
fn labels(app: &App) -> BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name".to_string(), app.name().to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "wasmop".to_string(),
        ),
        (
            "example.wasmop.dev/track".to_string(),
            app.spec.track.clone(),
        ),
    ]
    .into()
}

fn selector(app: &App) -> BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name".to_string(), app.name().to_string()),
        (
            "example.wasmop.dev/track".to_string(),
            app.spec.track.clone(),
        ),
    ]
    .into()
}

/// The Deployment an App wants.
pub fn deployment(app: &App) -> Deployment {
    Deployment {
        metadata: ObjectMeta {
            name: Some(app.name().to_string()),
            labels: Some(labels(app)),
            annotations: revision_annotation(),
            ..Default::default()
        },
        spec: DeploymentSpec {
            replicas: Some(app.spec.replicas),
            selector: LabelSelector {
                match_labels: Some(selector(app)),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(app)),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "app".into(),
                        image: Some(app.spec.image.clone()),
                        ports: Some(vec![ContainerPort {
                            container_port: app.spec.port,
                            name: Some("http".into()),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The Service an App wants.
pub fn service(app: &App) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(app.name().to_string()),
            labels: Some(labels(app)),
            annotations: revision_annotation(),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(selector(app)),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(IntOrString::String("http".into())),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Built with the `revision-annotation` feature, the module marks its children (used to show a
/// hot swap from one build of the module to another).
fn revision_annotation() -> Option<BTreeMap<String, String>> {
    if cfg!(feature = "revision-annotation") {
        Some(
            [(
                "example.wasmop.dev/module-revision".to_string(),
                "2".to_string(),
            )]
            .into(),
        )
    } else {
        None
    }
}

fn condition_of<'a>(d: &'a Deployment, type_: &str) -> Option<&'a str> {
    d.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_.as_deref() == Some(type_))
        .and_then(|c| c.status.as_deref())
}

/// The status and its conditions, from the observed Deployment.
fn status(app: &App, observed: Option<&Deployment>, response: Response) -> Response {
    let ds = observed.and_then(|d| d.status.clone()).unwrap_or_default();
    let status = AppStatus {
        replicas: app.spec.replicas,
        ready_replicas: ds.ready_replicas.unwrap_or(0),
        updated_replicas: ds.updated_replicas.unwrap_or(0),
        image: app.spec.image.clone(),
        selector: selector(app)
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(","),
    };
    let (available, progressing) = match observed {
        None => (
            Condition::new("Available", false)
                .reason("DeploymentCreating")
                .message("the Deployment is being created"),
            Condition::new("Progressing", true)
                .reason("DeploymentCreating")
                .message("the Deployment is being created"),
        ),
        Some(d) => {
            let generation = d.metadata.generation.unwrap_or(0);
            let seen = ds.observed_generation.unwrap_or(0);
            let current_image = d
                .spec
                .template
                .spec
                .as_ref()
                .and_then(|p| p.containers.first())
                .and_then(|c| c.image.as_deref())
                == Some(app.spec.image.as_str());
            let rolled_out = current_image
                && seen >= generation
                && status.updated_replicas >= app.spec.replicas
                && status.ready_replicas >= app.spec.replicas
                && ds.replicas.unwrap_or(0) == app.spec.replicas;
            let available = if condition_of(d, "Available") == Some("True") {
                Condition::new("Available", true)
                    .reason("MinimumReplicasAvailable")
                    .message(format!(
                        "{}/{} replicas ready",
                        status.ready_replicas, app.spec.replicas
                    ))
            } else {
                Condition::new("Available", false)
                    .reason("MinimumReplicasUnavailable")
                    .message(format!(
                        "{}/{} replicas ready",
                        status.ready_replicas, app.spec.replicas
                    ))
            };
            let progressing = if rolled_out {
                Condition::new("Progressing", false)
                    .reason("RolloutComplete")
                    .message(format!("all replicas run {}", app.spec.image))
            } else {
                Condition::new("Progressing", true)
                    .reason("RollingOut")
                    .message(format!(
                        "{}/{} replicas updated to {}",
                        status.updated_replicas, app.spec.replicas, app.spec.image
                    ))
            };
            (available, progressing)
        }
    };
    response
        .status(&status)
        .condition(available)
        .condition(progressing)
}

impl Reconciler for ImageUpdater {
    fn metadata() -> Metadata {
        Metadata::new("image-updater", env!("CARGO_PKG_VERSION"))
            .primary(Gvk::new(API_VERSION, KIND))
            .owns::<Deployment>()
            .owns::<Service>()
            .finalizes()
            .validates()
    }

    fn reconcile(req: &Request) -> Result<Response> {
        let app: App = req.primary()?;
        let observed = req.owned::<Deployment>()?.into_iter().next();
        let want = deployment(&app);
        let mut response = Response::complete(req).child(&want).child(&service(&app));
        if let Some(d) = &observed {
            let running = d
                .spec
                .template
                .spec
                .as_ref()
                .and_then(|p| p.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_default();
            if running != app.spec.image {
                wasmop_sdk::log::info(format!(
                    "rolling {} from {running} to {}",
                    app.name(),
                    app.spec.image
                ));
                response = response.event(
                    Event::normal(
                        "RollingOut",
                        format!("image {running} -> {}", app.spec.image),
                    )
                    .action("Rollout"),
                );
            }
        } else {
            response = response.event(
                Event::normal(
                    "Creating",
                    format!("creating Deployment and Service {}", app.name()),
                )
                .action("Create"),
            );
        }
        let response = status(&app, observed.as_ref(), response);
        // While a rollout is in progress, look again soon even if no event arrives.
        let progressing = response
            .condition_of("Progressing")
            .is_some_and(|c| c.status == wasmop_sdk::ConditionStatus::True);
        Ok(if progressing {
            response.requeue_after(Duration::from_secs(5))
        } else {
            response
        })
    }

    fn finalize(req: &Request) -> Result<Finalized> {
        let app: App = req.primary()?;
        let services = req.owned::<Service>()?;
        if services.is_empty() {
            return Ok(Finalized::done().with(
                Response::new().event(
                    Event::normal(
                        "Drained",
                        format!(
                            "{} has no Service left; the Deployment goes with the App",
                            app.name()
                        ),
                    )
                    .action("Finalize"),
                ),
            ));
        }
        let mut effects = Response::new().requeue_after(Duration::from_millis(500));
        for s in &services {
            effects = effects
                .delete(ObjectRef::from_object(s), Propagation::Background)
                .event(
                    Event::normal(
                        "Draining",
                        format!(
                            "deleting Service {} before the App goes",
                            s.metadata.name.as_deref().unwrap_or_default()
                        ),
                    )
                    .action("Finalize"),
                );
        }
        Ok(Finalized::pending().with(effects))
    }

    fn validate(req: &ValidateRequest) -> Validation {
        let new: App = match req.new_object() {
            Ok(app) => app,
            Err(e) => return Validation::deny(format!("not an App: {e}")),
        };
        if new.spec.image.trim().is_empty() || new.spec.image.contains(char::is_whitespace) {
            return Validation::deny_field(
                "spec.image",
                "spec.image must be a container image reference, without spaces",
            );
        }
        if new.spec.replicas < 0 {
            return Validation::deny_field("spec.replicas", "spec.replicas cannot be negative");
        }
        if !(1..=65535).contains(&new.spec.port) {
            return Validation::deny_field("spec.port", "spec.port must be between 1 and 65535");
        }
        if let Ok(Some(old)) = req.old::<App>()
            && old.spec.track != new.spec.track
        {
            return Validation::deny_field(
                "spec.track",
                format!(
                    "spec.track is immutable (it is part of the Deployment's selector, which Kubernetes cannot change): it stays {:?}; create a new App for track {:?}",
                    old.spec.track, new.spec.track
                ),
            );
        }
        let mut v = Validation::allow();
        if new.spec.image.ends_with(":latest") || !new.spec.image.contains(':') {
            v = v.warn(
                "spec.image has no pinned tag; rollouts are only triggered by changing spec.image",
            );
        }
        v
    }
}

wasmop_sdk::export!(ImageUpdater);
