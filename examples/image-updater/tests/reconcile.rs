//! image-updater, tested natively with the SDK's harness (no Wasm, no cluster).

use image_updater::ImageUpdater;
use wasmop_sdk::k8s::api::apps::v1::Deployment;
use wasmop_sdk::k8s::api::core::v1::Service;
use wasmop_sdk::testing::Harness;
use wasmop_sdk::{Action, ConditionStatus, Propagation, Validation};

const CR: &str = include_str!("../fixtures/cr.yaml");
const DEPLOYMENT: &str = include_str!("../fixtures/observed/deployment.yaml");
const SERVICE: &str = include_str!("../fixtures/observed/service.yaml");

fn harness() -> Harness<ImageUpdater> {
    Harness::new().primary_yaml(CR)
}

#[test]
fn a_new_app_gets_a_deployment_and_a_service() {
    let out = harness().reconcile().expect("reconciles");
    let deployments = out.children::<Deployment>().expect("deployments");
    assert_eq!(deployments.len(), 1);
    let d = &deployments[0];
    assert_eq!(d.metadata.name.as_deref(), Some("web"));
    assert_eq!(d.spec.replicas, Some(3));
    let container = &d.spec.template.spec.as_ref().expect("pod spec").containers[0];
    assert_eq!(container.image.as_deref(), Some("nginx:1.28"));
    let services = out.children::<Service>().expect("services");
    assert_eq!(
        services[0].spec.as_ref().and_then(|s| s.selector.clone()),
        d.spec.selector.match_labels
    );
    assert_eq!(out.events()[0].reason, "Creating");
    let available = out.condition_of("Available").expect("Available");
    assert_eq!(available.status, ConditionStatus::False);
}

#[test]
fn a_changed_image_rolls_out_and_reports_progress() {
    let out = harness()
        .observed_yaml(DEPLOYMENT)
        .observed_yaml(SERVICE)
        .reconcile()
        .expect("reconciles");
    assert_eq!(out.events()[0].reason, "RollingOut");
    assert!(out.events()[0].message.contains("nginx:1.27 -> nginx:1.28"));
    let progressing = out.condition_of("Progressing").expect("Progressing");
    assert_eq!(progressing.status, ConditionStatus::True);
    assert!(out.requeue().is_some(), "checks again while rolling out");
}

#[test]
fn a_finished_rollout_is_available_and_not_progressing() {
    let rolled = DEPLOYMENT.replace("image: nginx:1.27", "image: nginx:1.28");
    let out = harness()
        .observed_yaml(&rolled)
        .reconcile()
        .expect("reconciles");
    assert!(out.events().is_empty(), "{:?}", out.events());
    assert_eq!(
        out.condition_of("Available").map(|c| c.status),
        Some(ConditionStatus::True)
    );
    assert_eq!(
        out.condition_of("Progressing").map(|c| c.status),
        Some(ConditionStatus::False)
    );
    assert_eq!(out.requeue(), None);
}

#[test]
fn deleting_drains_the_service_first() {
    let pending = harness()
        .observed_yaml(SERVICE)
        .finalize()
        .expect("finalizes");
    assert!(!pending.done);
    assert!(matches!(
        &pending.effects.actions()[0],
        Action::Delete { target, propagation: Propagation::Background } if target.kind == "Service" && target.name == "web"
    ));
    let done = harness().finalize().expect("finalizes");
    assert!(done.done);
}

#[test]
fn the_track_cannot_change_but_the_image_can() {
    let h = harness();
    assert!(h.validate_create().is_allowed());
    let other_track = CR.replace("track: stable", "track: canary");
    match h.validate_update_from_yaml(&other_track) {
        Validation::Denied { field, message } => {
            assert_eq!(field.as_deref(), Some("spec.track"));
            assert!(message.contains("immutable"), "{message}");
        }
        allowed => panic!("a track change must be refused, got {allowed:?}"),
    }
    let older_image = CR.replace("nginx:1.28", "nginx:1.27");
    assert!(h.validate_update_from_yaml(&older_image).is_allowed());
    let bad = Harness::<ImageUpdater>::new()
        .primary_yaml(&CR.replace("image: nginx:1.28", "image: \"\""));
    assert!(!bad.validate_create().is_allowed());
}
