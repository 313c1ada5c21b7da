//! primary-replica, tested natively with the SDK's harness (no Wasm, no cluster): creation, the
//! steady state, every phase of an upgrade (replicas first, primary last), finalize and validate.

use primary_replica::{DATABASE_LABEL, PrimaryReplica, VERSION_ANNOTATION};
use serde_json::{Value, json};
use wasmop_sdk::k8s::api::apps::v1::StatefulSet;
use wasmop_sdk::k8s::api::core::v1::{ConfigMap, Service};
use wasmop_sdk::testing::{Harness, yaml_documents};
use wasmop_sdk::{Action, ConditionStatus, EventType, Propagation, Response, Validation};

const CR: &str = include_str!("../fixtures/cr.yaml");
const STATEFULSET: &str = include_str!("../fixtures/observed/statefulset.yaml");
const PVCS: &str = include_str!("../fixtures/observed/pvcs.yaml");

fn harness() -> Harness<PrimaryReplica> {
    Harness::new().primary_yaml(CR)
}

/// The CR with its recorded status phase and current version replaced.
fn cr_with_status(phase: &str, current: &str) -> Harness<PrimaryReplica> {
    let mut cr = yaml_documents(CR).remove(0);
    cr["status"]["phase"] = json!(phase);
    cr["status"]["currentVersion"] = json!(current);
    Harness::new().primary(&cr)
}

/// The observed StatefulSet in some state of a rollout.
struct Sts {
    version: &'static str,
    partition: i32,
    generation: i64,
    observed_generation: i64,
    ready: i32,
    updated: i32,
    same_revision: bool,
}

impl Sts {
    fn settled(version: &'static str) -> Self {
        Sts {
            version,
            partition: 0,
            generation: 1,
            observed_generation: 1,
            ready: 3,
            updated: 3,
            same_revision: true,
        }
    }

    fn value(&self) -> Value {
        let mut v = yaml_documents(STATEFULSET).remove(0);
        v["metadata"]["generation"] = json!(self.generation);
        v["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(self.partition);
        v["spec"]["template"]["metadata"]["annotations"][VERSION_ANNOTATION] = json!(self.version);
        v["spec"]["template"]["spec"]["containers"][0]["image"] =
            json!(format!("postgres:{}", self.version));
        let status = &mut v["status"];
        status["observedGeneration"] = json!(self.observed_generation);
        status["readyReplicas"] = json!(self.ready);
        status["updatedReplicas"] = json!(self.updated);
        status["currentReplicas"] = json!(3 - self.updated);
        if !self.same_revision {
            status["updateRevision"] = json!("orders-5c4b3a291");
        }
        v
    }
}

fn the_statefulset(out: &Response) -> StatefulSet {
    let mut sets = out.children::<StatefulSet>().expect("statefulsets");
    assert_eq!(sets.len(), 1);
    sets.remove(0)
}

fn partition(sts: &StatefulSet) -> Option<i32> {
    sts.spec
        .update_strategy
        .as_ref()
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.partition)
}

fn image(sts: &StatefulSet) -> Option<String> {
    sts.spec.template.spec.as_ref()?.containers[0].image.clone()
}

fn status_field(out: &Response, field: &str) -> Value {
    out.status_ref().expect("a status").fields[field].clone()
}

fn condition(out: &Response, type_: &str) -> (ConditionStatus, String) {
    let c = out.condition_of(type_).expect("the condition");
    (c.status, c.reason.clone())
}

fn reasons(out: &Response) -> Vec<&str> {
    out.events().iter().map(|e| e.reason.as_str()).collect()
}

#[test]
fn a_new_database_gets_roles_a_headless_service_and_an_ordered_statefulset() {
    let out = harness().reconcile().expect("reconciles");
    // The children, in the order they are applied: roles and Service before the members.
    let kinds: Vec<String> = out
        .child_sets()
        .iter()
        .map(|(k, _)| k.kind.clone())
        .collect();
    assert_eq!(kinds, ["ConfigMap", "Service", "StatefulSet"]);

    let roles = &out.children::<ConfigMap>().expect("configmaps")[0];
    assert_eq!(roles.metadata.name.as_deref(), Some("orders-roles"));
    let data = roles.data.clone().unwrap_or_default();
    assert_eq!(data["orders-0"], "primary");
    assert_eq!(data["orders-1"], "replica");
    assert_eq!(data["orders-2"], "replica");
    assert_eq!(data["primary"], "orders-0");
    assert_eq!(data["primaryHost"], "orders-0.orders.demo.svc");

    let svc = &out.children::<Service>().expect("services")[0];
    let spec = svc.spec.clone().unwrap_or_default();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"), "headless");

    let sts = the_statefulset(&out);
    assert_eq!(sts.spec.replicas, Some(3));
    assert_eq!(sts.spec.service_name.as_deref(), Some("orders"));
    assert_eq!(
        sts.spec.pod_management_policy.as_deref(),
        Some("OrderedReady")
    );
    assert_eq!(partition(&sts), Some(0));
    assert_eq!(image(&sts).as_deref(), Some("postgres:15.3"));
    assert_eq!(spec.selector, sts.spec.selector.match_labels);
    let claims = sts.spec.volume_claim_templates.clone().unwrap_or_default();
    assert_eq!(claims.len(), 1);
    assert_eq!(
        claims[0]
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(DATABASE_LABEL))
            .map(String::as_str),
        Some("orders")
    );

    assert_eq!(status_field(&out, "primary"), "orders-0");
    assert_eq!(status_field(&out, "phase"), "Creating");
    assert_eq!(
        condition(&out, "Progressing"),
        (ConditionStatus::True, "Creating".into())
    );
    assert_eq!(condition(&out, "Ready").0, ConditionStatus::False);
    assert!(out.requeue().is_some(), "looks again while members start");
}

#[test]
fn without_storage_there_is_no_volume_claim_template() {
    let mut cr = yaml_documents(CR).remove(0);
    cr["spec"].as_object_mut().expect("spec").remove("storage");
    let out = Harness::<PrimaryReplica>::new()
        .primary(&cr)
        .reconcile()
        .expect("reconciles");
    assert_eq!(the_statefulset(&out).spec.volume_claim_templates, None);
}

#[test]
fn a_settled_database_is_ready_and_quiet() {
    let out = cr_with_status("Ready", "15.3")
        .observed(&Sts::settled("15.3").value())
        .reconcile()
        .expect("reconciles");
    let sts = the_statefulset(&out);
    assert_eq!(partition(&sts), Some(0));
    assert_eq!(image(&sts).as_deref(), Some("postgres:15.3"));
    assert_eq!(
        condition(&out, "Ready"),
        (ConditionStatus::True, "AllMembersReady".into())
    );
    assert_eq!(condition(&out, "Progressing").0, ConditionStatus::False);
    assert_eq!(status_field(&out, "currentVersion"), "15.3");
    assert_eq!(status_field(&out, "readyReplicas"), 3);
    assert!(out.events().is_empty(), "{:?}", out.events());
    assert_eq!(out.requeue(), None);
}

#[test]
fn an_upgrade_starts_with_the_replicas_partition_1() {
    // The fixtures: spec.version 15.3, the StatefulSet on 15.2.
    let out = harness()
        .observed_yaml(STATEFULSET)
        .reconcile()
        .expect("reconciles");
    let sts = the_statefulset(&out);
    assert_eq!(image(&sts).as_deref(), Some("postgres:15.3"));
    assert_eq!(partition(&sts), Some(1), "ordinal 0, the primary, waits");
    assert_eq!(reasons(&out), ["UpgradingReplicas"]);
    assert!(out.events()[0].message.contains("15.2 -> 15.3"));
    assert_eq!(status_field(&out, "phase"), "UpgradingReplicas");
    assert_eq!(status_field(&out, "currentVersion"), "15.2");
    assert_eq!(status_field(&out, "targetVersion"), "15.3");
    assert_eq!(
        condition(&out, "Progressing"),
        (ConditionStatus::True, "UpgradingReplicas".into())
    );
    assert_eq!(out.requeue(), Some(primary_replica::ROLLOUT_POLL));
}

#[test]
fn the_primary_waits_while_replicas_are_not_all_updated_and_ready() {
    for (observed_generation, ready, updated) in [(1, 3, 3), (2, 2, 1), (2, 2, 2), (2, 3, 1)] {
        let out = cr_with_status("UpgradingReplicas", "15.2")
            .observed(
                &Sts {
                    version: "15.3",
                    partition: 1,
                    generation: 2,
                    observed_generation,
                    ready,
                    updated,
                    same_revision: false,
                }
                .value(),
            )
            .reconcile()
            .expect("reconciles");
        assert_eq!(
            partition(&the_statefulset(&out)),
            Some(1),
            "generation seen {observed_generation}, ready {ready}, updated {updated}"
        );
        assert_eq!(status_field(&out, "phase"), "UpgradingReplicas");
        assert!(out.events().is_empty());
        assert!(out.requeue().is_some());
    }
}

#[test]
fn once_the_replicas_run_the_new_version_the_primary_goes_last_partition_0() {
    let out = cr_with_status("UpgradingReplicas", "15.2")
        .observed(
            &Sts {
                version: "15.3",
                partition: 1,
                generation: 2,
                observed_generation: 2,
                ready: 3,
                updated: 2,
                same_revision: false,
            }
            .value(),
        )
        .reconcile()
        .expect("reconciles");
    assert_eq!(partition(&the_statefulset(&out)), Some(0));
    assert_eq!(reasons(&out), ["UpgradingPrimary"]);
    assert_eq!(status_field(&out, "phase"), "UpgradingPrimary");
    assert_eq!(
        status_field(&out, "currentVersion"),
        "15.2",
        "the primary still runs 15.2"
    );
    assert!(out.requeue().is_some());
}

#[test]
fn while_the_primary_rolls_the_current_version_is_the_old_one() {
    let out = cr_with_status("UpgradingPrimary", "15.2")
        .observed(
            &Sts {
                version: "15.3",
                partition: 0,
                generation: 3,
                observed_generation: 3,
                ready: 2,
                updated: 2,
                same_revision: false,
            }
            .value(),
        )
        .reconcile()
        .expect("reconciles");
    assert_eq!(partition(&the_statefulset(&out)), Some(0));
    assert_eq!(status_field(&out, "phase"), "UpgradingPrimary");
    assert_eq!(status_field(&out, "currentVersion"), "15.2");
    assert!(out.events().is_empty());
}

#[test]
fn a_completed_upgrade_is_ready_on_the_new_version() {
    let out = cr_with_status("UpgradingPrimary", "15.2")
        .observed(&Sts::settled("15.3").value())
        .reconcile()
        .expect("reconciles");
    assert_eq!(status_field(&out, "phase"), "Ready");
    assert_eq!(status_field(&out, "currentVersion"), "15.3");
    assert_eq!(reasons(&out), ["Ready"]);
    assert_eq!(condition(&out, "Ready").0, ConditionStatus::True);
    assert_eq!(out.requeue(), None);
}

#[test]
fn a_single_member_upgrades_its_primary_at_once() {
    let mut cr = yaml_documents(CR).remove(0);
    cr["spec"]["replicas"] = json!(1);
    let out = Harness::<PrimaryReplica>::new()
        .primary(&cr)
        .observed_yaml(STATEFULSET)
        .reconcile()
        .expect("reconciles");
    assert_eq!(partition(&the_statefulset(&out)), Some(0));
    assert_eq!(status_field(&out, "phase"), "UpgradingPrimary");
}

#[test]
fn reconcile_refuses_a_downgrade_and_keeps_the_running_version() {
    let mut cr = yaml_documents(CR).remove(0);
    cr["spec"]["version"] = json!("15.1");
    let out = Harness::<PrimaryReplica>::new()
        .primary(&cr)
        .observed_yaml(STATEFULSET)
        .reconcile()
        .expect("reconciles");
    let sts = the_statefulset(&out);
    assert_eq!(image(&sts).as_deref(), Some("postgres:15.2"));
    assert_eq!(partition(&sts), Some(0));
    assert_eq!(reasons(&out), ["DowngradeRefused"]);
    assert_eq!(out.events()[0].type_, EventType::Warning);
    assert_eq!(
        condition(&out, "Ready"),
        (ConditionStatus::False, "DowngradeRefused".into())
    );
    assert_eq!(out.requeue(), None);
}

#[test]
fn an_invalid_spec_touches_no_child_and_says_why() {
    let mut cr = yaml_documents(CR).remove(0);
    cr["spec"]["version"] = json!("latest");
    let out = Harness::<PrimaryReplica>::new()
        .primary(&cr)
        .observed_yaml(STATEFULSET)
        .reconcile()
        .expect("reconciles");
    assert!(
        out.child_sets().is_empty(),
        "no complete set, so nothing is pruned"
    );
    assert_eq!(
        condition(&out, "Ready"),
        (ConditionStatus::False, "InvalidSpec".into())
    );
    assert!(out.events()[0].message.contains("spec.version"));
}

#[test]
fn finalize_deletes_the_statefulset_and_this_databases_claims_then_is_done() {
    let other_db = PVCS
        .split("---")
        .next()
        .expect("a claim")
        .replace("orders-0", "billing-0")
        .replace("database: orders", "database: billing");
    let pending = harness()
        .observed_yaml(STATEFULSET)
        .observed_yaml(PVCS)
        .observed_yaml(&other_db)
        .finalize()
        .expect("finalizes");
    assert!(!pending.done);
    let deleted: Vec<(String, String)> = pending
        .effects
        .actions()
        .iter()
        .map(|a| match a {
            Action::Delete {
                target,
                propagation: Propagation::Background,
            } => (target.kind.clone(), target.name.clone()),
            other => panic!("only deletes: {other:?}"),
        })
        .collect();
    assert_eq!(
        deleted,
        [
            ("StatefulSet".to_string(), "orders".to_string()),
            ("PersistentVolumeClaim".into(), "data-orders-0".into()),
            ("PersistentVolumeClaim".into(), "data-orders-1".into()),
            ("PersistentVolumeClaim".into(), "data-orders-2".into()),
        ]
    );
    assert!(pending.effects.requeue().is_some());
    assert_eq!(reasons(&pending.effects), ["DeletingVolumes"]);

    // Claims already being deleted are waited for, not deleted again.
    let terminating = PVCS.replace(
        "  namespace: demo\n",
        "  namespace: demo\n  deletionTimestamp: \"2026-01-01T00:00:00Z\"\n",
    );
    let waiting = harness()
        .observed_yaml(&terminating)
        .finalize()
        .expect("finalizes");
    assert!(!waiting.done);
    assert!(waiting.effects.actions().is_empty());

    let done = harness()
        .observed_yaml(&other_db)
        .finalize()
        .expect("finalizes");
    assert!(done.done);
    assert_eq!(reasons(&done.effects), ["VolumesDeleted"]);
}

fn denied(v: Validation) -> (String, String) {
    match v {
        Validation::Denied { field, message } => (field.unwrap_or_default(), message),
        allowed => panic!("must be refused, got {allowed:?}"),
    }
}

#[test]
fn validate_refuses_downgrades_scaling_to_zero_and_storage_changes() {
    let h = harness();
    assert!(h.validate_create().is_allowed());
    // Upgrades, scaling and the same version are fine.
    for old in [
        CR.replace("version: \"15.3\"", "version: \"15.2\""),
        CR.replace("version: \"15.3\"", "version: \"15\""),
        CR.replace("replicas: 3\n  version", "replicas: 5\n  version"),
        CR.to_string(),
    ] {
        assert!(h.validate_update_from_yaml(&old).is_allowed(), "{old}");
    }
    // From 15.10 to 15.3 is a downgrade: components compare as numbers, not text.
    let (field, message) =
        denied(h.validate_update_from_yaml(&CR.replace("version: \"15.3\"", "version: \"15.10\"")));
    assert_eq!(field, "spec.version");
    assert!(
        message.contains("downgrading from 15.10 to 15.3"),
        "{message}"
    );

    let (field, message) =
        denied(h.validate_update_from_yaml(&CR.replace("size: 1Gi", "size: 2Gi")));
    assert_eq!(field, "spec.storage");
    assert!(message.contains("immutable"), "{message}");

    let zero = Harness::<PrimaryReplica>::new()
        .primary_yaml(&CR.replace("replicas: 3\n  version", "replicas: 0\n  version"));
    let (field, message) = denied(zero.validate_update_from_yaml(CR));
    assert_eq!(field, "spec.replicas");
    assert!(message.contains("zero"), "{message}");
    assert_eq!(denied(zero.validate_create()).0, "spec.replicas");

    for (bad, field) in [
        ("version: \"15.3\"", "version: latest"),
        ("size: 1Gi", "size: lots"),
        ("image: postgres", "image: postgres@sha256:abc"),
    ]
    .map(|(from, to)| {
        (
            CR.replace(from, to),
            to.split(':').next().unwrap_or_default().to_string(),
        )
    }) {
        let h = Harness::<PrimaryReplica>::new().primary_yaml(&bad);
        let (f, _) = denied(h.validate_create());
        assert!(f.ends_with(&field), "{f} for {field}");
    }
}

#[test]
fn validate_warns_about_a_major_upgrade() {
    let h = harness();
    let old = CR.replace("version: \"15.3\"", "version: \"14.9\"");
    match h.validate_update_from_yaml(&old) {
        Validation::Allowed(warnings) => {
            assert!(
                warnings.iter().any(|w| w.contains("major upgrade")),
                "{warnings:?}"
            )
        }
        denied => panic!("{denied:?}"),
    }
}
