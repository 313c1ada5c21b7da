//! primary-replica: a `Database` (replicas, version) becomes an ordered StatefulSet whose first
//! member (`<name>-0`) is the primary and the others are replicas, a headless Service for stable
//! member DNS names, and a ConfigMap naming the role of each member.
//!
//! - **Upgrades roll the replicas first and the primary last.** When `spec.version` changes, the
//!   StatefulSet gets the new pod template with `updateStrategy.rollingUpdate.partition: 1`: the
//!   StatefulSet controller only replaces pods with an ordinal >= 1 (the replicas), highest first.
//!   Once every replica runs the new revision and every member is Ready, the module lowers the
//!   partition to 0 and the primary (ordinal 0) is replaced last. While it waits it asks to be
//!   reconciled again soon (`requeue_after`), besides reacting to the StatefulSet's own changes.
//! - **Deleting a Database deletes its volumes.** PersistentVolumeClaims made from a
//!   StatefulSet's `volumeClaimTemplates` are not garbage-collected with it, so `finalize` deletes
//!   the StatefulSet (its pods go, which releases the claims' `pvc-protection`) and every claim
//!   labelled for this Database (a related kind), and reports done once none is left.
//! - **Unsupported changes are refused** by `validate`, with the offending field: a version
//!   downgrade, scaling to zero, and any change of `spec.storage` (a StatefulSet's
//!   volumeClaimTemplates are immutable). `reconcile` refuses a downgrade too (the StatefulSet
//!   keeps running the newer version and the status says why), for clusters where `validate` is
//!   not served at admission.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wasmop_sdk::SelectorOperator;
use wasmop_sdk::k8s::api::apps::v1::{
    RollingUpdateStatefulSetStrategy, StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy,
};
use wasmop_sdk::k8s::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodSpec,
    PodTemplateSpec, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use wasmop_sdk::k8s::apimachinery::pkg::api::resource::Quantity;
use wasmop_sdk::k8s::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use wasmop_sdk::k8s::apimachinery::pkg::util::intstr::IntOrString;
use wasmop_sdk::prelude::*;

/// The Database's API version.
pub const API_VERSION: &str = "example.wasmop.dev/v1";
/// The Database's kind.
pub const KIND: &str = "Database";
/// The label naming the Database on its pods and volume claims (the StatefulSet copies its
/// selector's labels onto the claims it creates, which is how finalize finds them).
pub const DATABASE_LABEL: &str = "example.wasmop.dev/database";
/// The pod-template annotation holding the version the StatefulSet's template runs.
pub const VERSION_ANNOTATION: &str = "example.wasmop.dev/version";
/// How soon the module looks again while a rollout is in progress.
pub const ROLLOUT_POLL: Duration = Duration::from_secs(2);

/// What the user wants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseSpec {
    /// Members: one primary plus `replicas - 1` replicas. At least 1.
    #[serde(default = "one")]
    pub replicas: i32,
    /// The database version (`15.2`): numeric components separated by dots. It is the image tag.
    pub version: String,
    /// The image repository; the image is `<image>:<version>`.
    #[serde(default = "default_image")]
    pub image: String,
    /// The port the database listens on.
    #[serde(default = "default_port")]
    pub port: i32,
    /// A volume per member, from a volumeClaimTemplate; none when absent (ephemeral storage).
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,
}

/// The volume of each member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// The size of each member's volume (a quantity: `1Gi`).
    pub size: String,
    /// The StorageClass of the claims (the cluster's default class when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

fn one() -> i32 {
    1
}
fn default_image() -> String {
    "postgres".into()
}
fn default_port() -> i32 {
    5432
}

/// What the module reports (besides `conditions` and `observedGeneration`, set by the host).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseStatus {
    /// The primary member's pod (`<name>-0`).
    #[serde(default)]
    pub primary: String,
    /// Every member's pod, the primary first.
    #[serde(default)]
    pub members: Vec<String>,
    /// Desired members.
    #[serde(default)]
    pub replicas: i32,
    /// Members that are Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Members running the StatefulSet's newest revision.
    #[serde(default)]
    pub updated_replicas: i32,
    /// The version the primary runs ("" until the first rollout completes).
    #[serde(default)]
    pub current_version: String,
    /// The version being rolled out (equal to `currentVersion` when nothing rolls).
    #[serde(default)]
    pub target_version: String,
    /// The StatefulSet's rolling-update partition: members with an ordinal >= it are updated.
    #[serde(default)]
    pub partition: i32,
    /// `Creating`, `Starting`, `UpgradingReplicas`, `UpgradingPrimary`, `Ready` or
    /// `DowngradeRefused`.
    #[serde(default)]
    pub phase: String,
}

/// A Database.
pub type Database = Object<DatabaseSpec, DatabaseStatus>;

/// A version made of numeric components (`15`, `15.2`, `15.2.1`), compared component by
/// component with missing components read as 0 (`15` == `15.0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version(Vec<u64>);

impl Version {
    /// Parses `15.2`.
    ///
    /// # Errors
    /// A message saying what a version looks like.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let bad = || {
            format!(
                "{text:?} is not a version: use 1 to 4 numeric components separated by dots, such as 15.2"
            )
        };
        let parts: Vec<&str> = text.split('.').collect();
        if text.is_empty() || parts.len() > 4 {
            return Err(bad());
        }
        parts
            .iter()
            .map(|p| {
                if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                p.parse::<u64>().map_err(|_| bad())
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map(Version)
    }

    /// The first component.
    pub fn major(&self) -> u64 {
        self.0.first().copied().unwrap_or_default()
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        let n = self.0.len().max(other.0.len());
        (0..n)
            .map(|i| {
                let a = self.0.get(i).copied().unwrap_or_default();
                let b = other.0.get(i).copied().unwrap_or_default();
                a.cmp(&b)
            })
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&parts.join("."))
    }
}

/// Where a Database's rollout stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No StatefulSet yet.
    Creating,
    /// The StatefulSet runs the wanted version, but not every member is Ready yet.
    Starting,
    /// A new version is rolling out to the replicas (partition 1); the primary waits.
    UpgradingReplicas,
    /// The replicas run the new version; the primary is being replaced (partition 0).
    UpgradingPrimary,
    /// Every member runs the wanted version and is Ready.
    Ready,
    /// `spec.version` is older than what runs; nothing changes until it is raised again.
    DowngradeRefused,
}

impl Phase {
    /// The phase's name, as written in the status (and used as a condition reason).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Creating => "Creating",
            Phase::Starting => "Starting",
            Phase::UpgradingReplicas => "UpgradingReplicas",
            Phase::UpgradingPrimary => "UpgradingPrimary",
            Phase::Ready => "Ready",
            Phase::DowngradeRefused => "DowngradeRefused",
        }
    }
}

/// What the StatefulSet should look like next, decided from the Database and the observed
/// StatefulSet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The version the StatefulSet's pod template runs.
    pub template_version: String,
    /// The rolling-update partition.
    pub partition: i32,
    /// Where the rollout stands.
    pub phase: Phase,
    /// The version the primary runs, if known.
    pub current_version: Option<String>,
    /// The version the StatefulSet's template ran before this reconcile, when it changes now.
    pub upgrade_from: Option<String>,
}

/// The labels every child and member of `db` carries.
fn labels(db: &Database) -> BTreeMap<String, String> {
    let mut l = selector(db);
    l.insert(
        "app.kubernetes.io/managed-by".to_string(),
        "wasmop".to_string(),
    );
    l
}

/// The StatefulSet's selector (also copied by the StatefulSet controller onto volume claims).
fn selector(db: &Database) -> BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name".to_string(), "database".to_string()),
        (DATABASE_LABEL.to_string(), db.name().to_string()),
    ]
    .into()
}

/// The name of member `ordinal`'s pod.
pub fn member(db: &Database, ordinal: i32) -> String {
    format!("{}-{ordinal}", db.name())
}

/// The ConfigMap naming each member's role.
pub fn roles_name(db: &Database) -> String {
    format!("{}-roles", db.name())
}

/// The version the observed StatefulSet's pod template runs: its annotation, else its image tag.
pub fn template_version(sts: &StatefulSet) -> Option<String> {
    let template = sts.spec.template.clone();
    let meta = template.metadata.unwrap_or_default();
    if let Some(v) = meta
        .annotations
        .and_then(|a| a.get(VERSION_ANNOTATION).cloned())
    {
        return Some(v);
    }
    let image = template.spec?.containers.first()?.image.clone()?;
    image.rsplit_once(':').map(|(_, tag)| tag.to_string())
}

fn partition_of(sts: &StatefulSet) -> i32 {
    sts.spec
        .update_strategy
        .as_ref()
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .unwrap_or(0)
}

/// Whether the StatefulSet controller has seen the StatefulSet's latest spec.
fn fresh(sts: &StatefulSet) -> bool {
    let generation = sts.metadata.generation.unwrap_or(0);
    let seen = sts
        .status
        .as_ref()
        .and_then(|s| s.observed_generation)
        .unwrap_or(0);
    seen >= generation
}

/// Decides the next step of the rollout.
pub fn plan(db: &Database, observed: Option<&StatefulSet>) -> Plan {
    let wanted = db.spec.version.clone();
    let previous = db
        .status
        .as_ref()
        .map(|s| s.current_version.clone())
        .filter(|v| !v.is_empty());
    let Some(sts) = observed else {
        return Plan {
            template_version: wanted,
            partition: 0,
            phase: Phase::Creating,
            current_version: previous,
            upgrade_from: None,
        };
    };
    let replicas = db.spec.replicas.max(1);
    let status = sts.status.clone().unwrap_or_default();
    let ready = status.ready_replicas.unwrap_or(0);
    let updated = status.updated_replicas.unwrap_or(0);
    let revisions_equal =
        status.current_revision.is_some() && status.current_revision == status.update_revision;
    let running = template_version(sts);
    let observed_partition = partition_of(sts);

    // A downgrade is refused: keep what runs.
    if let (Some(run), Ok(want)) = (running.as_deref(), Version::parse(&wanted))
        && Version::parse(run).is_ok_and(|r| want < r)
    {
        return Plan {
            template_version: run.to_string(),
            partition: observed_partition,
            phase: Phase::DowngradeRefused,
            current_version: previous,
            upgrade_from: None,
        };
    }
    if running.as_deref() != Some(wanted.as_str()) {
        // A new version: replicas first. With a single member there are no replicas to wait for.
        let (partition, phase) = if replicas > 1 {
            (1, Phase::UpgradingReplicas)
        } else {
            (0, Phase::UpgradingPrimary)
        };
        return Plan {
            template_version: wanted,
            partition,
            phase,
            current_version: previous.or_else(|| running.clone()),
            upgrade_from: running,
        };
    }
    // The template runs the wanted version; how far has it rolled?
    let settled = fresh(sts) && status.replicas == replicas;
    if observed_partition > 0 {
        let replicas_done =
            settled && updated >= replicas - observed_partition.min(replicas) && ready >= replicas;
        return Plan {
            template_version: wanted,
            partition: if replicas_done { 0 } else { observed_partition },
            phase: if replicas_done {
                Phase::UpgradingPrimary
            } else {
                Phase::UpgradingReplicas
            },
            current_version: previous,
            upgrade_from: None,
        };
    }
    let complete = settled && revisions_equal && updated >= replicas && ready >= replicas;
    let phase = if complete {
        Phase::Ready
    } else if settled && !revisions_equal && previous.as_deref() != Some(wanted.as_str()) {
        Phase::UpgradingPrimary
    } else {
        Phase::Starting
    };
    Plan {
        template_version: wanted.clone(),
        partition: 0,
        phase,
        current_version: if complete { Some(wanted) } else { previous },
        upgrade_from: None,
    }
}

/// The StatefulSet `db` wants, running `plan.template_version` with `plan.partition`.
pub fn stateful_set(db: &Database, plan: &Plan) -> StatefulSet {
    let mut mounts = vec![VolumeMount {
        name: "roles".into(),
        mount_path: "/etc/database/roles".into(),
        read_only: Some(true),
        ..Default::default()
    }];
    let claims = db.spec.storage.as_ref().map(|s| {
        mounts.push(VolumeMount {
            name: "data".into(),
            mount_path: "/var/lib/database".into(),
            ..Default::default()
        });
        vec![PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                labels: Some(labels(db)),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                storage_class_name: s.storage_class_name.clone(),
                resources: Some(VolumeResourceRequirements {
                    requests: Some([("storage".to_string(), Quantity(s.size.clone()))].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]
    });
    StatefulSet {
        metadata: ObjectMeta {
            name: Some(db.name().to_string()),
            labels: Some(labels(db)),
            ..Default::default()
        },
        spec: StatefulSetSpec {
            replicas: Some(db.spec.replicas.max(1)),
            service_name: Some(db.name().to_string()),
            pod_management_policy: Some("OrderedReady".into()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateStatefulSetStrategy {
                    partition: Some(plan.partition),
                    ..Default::default()
                }),
            }),
            selector: LabelSelector {
                match_labels: Some(selector(db)),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(db)),
                    annotations: Some(
                        [(
                            VERSION_ANNOTATION.to_string(),
                            plan.template_version.clone(),
                        )]
                        .into(),
                    ),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "database".into(),
                        image: Some(format!("{}:{}", db.spec.image, plan.template_version)),
                        ports: Some(vec![ContainerPort {
                            name: Some("db".into()),
                            container_port: db.spec.port,
                            ..Default::default()
                        }]),
                        env: Some(vec![EnvVar {
                            // The member reads its role from /etc/database/roles/$POD_NAME.
                            name: "POD_NAME".into(),
                            value_from: Some(EnvVarSource {
                                field_ref: Some(ObjectFieldSelector {
                                    field_path: "metadata.name".into(),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }]),
                        volume_mounts: Some(mounts),
                        ..Default::default()
                    }],
                    volumes: Some(vec![Volume {
                        name: "roles".into(),
                        config_map: Some(ConfigMapVolumeSource {
                            name: roles_name(db),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            },
            volume_claim_templates: claims,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The headless Service giving each member a stable DNS name (`<name>-0.<name>.<namespace>.svc`).
pub fn headless_service(db: &Database) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(db.name().to_string()),
            labels: Some(labels(db)),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            // Members find each other before they are Ready (replicas follow the primary).
            publish_not_ready_addresses: Some(true),
            selector: Some(selector(db)),
            ports: Some(vec![ServicePort {
                name: Some("db".into()),
                port: db.spec.port,
                target_port: Some(IntOrString::String("db".into())),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The ConfigMap naming each member's role: `<name>-0: primary`, `<name>-1: replica`..., plus
/// `primary` (the primary's pod) and `primaryHost` (its stable DNS name).
pub fn roles(db: &Database) -> ConfigMap {
    let mut data: BTreeMap<String, String> = (0..db.spec.replicas.max(1))
        .map(|i| {
            (
                member(db, i),
                if i == 0 { "primary" } else { "replica" }.to_string(),
            )
        })
        .collect();
    data.insert("primary".into(), member(db, 0));
    let host = match db.namespace() {
        Some(ns) => format!("{}.{}.{ns}.svc", member(db, 0), db.name()),
        None => format!("{}.{}", member(db, 0), db.name()),
    };
    data.insert("primaryHost".into(), host);
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(roles_name(db)),
            labels: Some(labels(db)),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    }
}

/// The status and conditions for `plan`, from the observed StatefulSet.
fn status(db: &Database, plan: &Plan, observed: Option<&StatefulSet>) -> DatabaseStatus {
    let ss = observed.and_then(|s| s.status.clone()).unwrap_or_default();
    DatabaseStatus {
        primary: member(db, 0),
        members: (0..db.spec.replicas.max(1))
            .map(|i| member(db, i))
            .collect(),
        replicas: db.spec.replicas.max(1),
        ready_replicas: ss.ready_replicas.unwrap_or(0),
        updated_replicas: ss.updated_replicas.unwrap_or(0),
        current_version: plan.current_version.clone().unwrap_or_default(),
        target_version: plan.template_version.clone(),
        partition: plan.partition,
        phase: plan.phase.as_str().to_string(),
    }
}

fn conditions(db: &Database, plan: &Plan, status: &DatabaseStatus) -> (Condition, Condition) {
    let members = format!(
        "{}/{} members ready",
        status.ready_replicas, status.replicas
    );
    let reason = plan.phase.as_str();
    match plan.phase {
        Phase::Ready => (
            Condition::new("Ready", true)
                .reason("AllMembersReady")
                .message(format!("{members}; every member runs {}", plan.template_version)),
            Condition::new("Progressing", false)
                .reason("UpToDate")
                .message(format!("primary {} runs {}", status.primary, plan.template_version)),
        ),
        Phase::DowngradeRefused => (
            Condition::new("Ready", false).reason(reason).message(format!(
                "spec.version {} is older than the running {}; downgrades are not supported, so the members keep running {}",
                db.spec.version, plan.template_version, plan.template_version
            )),
            Condition::new("Progressing", false)
                .reason(reason)
                .message("nothing rolls until spec.version is at least the running version"),
        ),
        Phase::Creating => (
            Condition::new("Ready", false)
                .reason(reason)
                .message("the StatefulSet is being created"),
            Condition::new("Progressing", true)
                .reason(reason)
                .message("the StatefulSet is being created"),
        ),
        Phase::Starting => (
            Condition::new("Ready", false).reason(reason).message(members.clone()),
            Condition::new("Progressing", true)
                .reason(reason)
                .message(format!("{members}; members start in order, the primary first")),
        ),
        Phase::UpgradingReplicas => (
            Condition::new("Ready", false).reason(reason).message(members.clone()),
            Condition::new("Progressing", true).reason(reason).message(format!(
                "rolling the replicas to {} first (partition {}); the primary {} keeps {} until they are Ready",
                plan.template_version,
                plan.partition,
                status.primary,
                plan.current_version.as_deref().unwrap_or("its version")
            )),
        ),
        Phase::UpgradingPrimary => (
            Condition::new("Ready", false).reason(reason).message(members.clone()),
            Condition::new("Progressing", true).reason(reason).message(format!(
                "the replicas run {}; now the primary {} (partition 0)",
                plan.template_version, status.primary
            )),
        ),
    }
}

/// The module.
#[derive(Debug)]
pub struct PrimaryReplica;

impl Reconciler for PrimaryReplica {
    fn metadata() -> Metadata {
        Metadata::new("primary-replica", env!("CARGO_PKG_VERSION"))
            .primary(Gvk::new(API_VERSION, KIND))
            // Applied in this order: the roles and the Service exist before the members start.
            .owns::<ConfigMap>()
            .owns::<Service>()
            .owns::<StatefulSet>()
            .related(
                RelatedKind::new(Gvk::of::<PersistentVolumeClaim>())
                    .selector(Selector::everything().requirement(
                        DATABASE_LABEL,
                        SelectorOperator::Exists,
                        [""; 0],
                    ))
                    .maps_to(Mapping::PrimaryNamedByLabel(DATABASE_LABEL.into())),
            )
            .finalizes()
            .validates()
    }

    fn reconcile(req: &Request) -> Result<Response> {
        let db: Database = req.primary()?;
        if let Err(problem) = check_spec(&db.spec) {
            // Leave every child as it is (`Response::new`, not `complete`: an empty complete set
            // would prune them) and say what to fix.
            return Ok(Response::new()
                .condition(
                    Condition::new("Ready", false)
                        .reason("InvalidSpec")
                        .message(problem.clone()),
                )
                .event(Event::warning("InvalidSpec", problem)));
        }
        let observed = req.owned::<StatefulSet>()?.into_iter().next();
        let plan = plan(&db, observed.as_ref());
        let status = status(&db, &plan, observed.as_ref());
        let (ready, progressing) = conditions(&db, &plan, &status);
        let mut response = Response::complete(req)
            .child(&roles(&db))
            .child(&headless_service(&db))
            .child(&stateful_set(&db, &plan));
        if let Some(from) = &plan.upgrade_from {
            wasmop_sdk::log::info(format!(
                "upgrading {} from {from} to {}: replicas first",
                db.name(),
                plan.template_version
            ));
            response = response.event(
                Event::normal(
                    "UpgradingReplicas",
                    format!(
                        "{from} -> {}: replicas first, the primary {} last",
                        plan.template_version, status.primary
                    ),
                )
                .action("Upgrade"),
            );
        }
        if let Some(sts) = &observed
            && partition_of(sts) > 0
            && plan.partition == 0
        {
            response = response.event(
                Event::normal(
                    "UpgradingPrimary",
                    format!(
                        "the replicas run {}; upgrading the primary {}",
                        plan.template_version, status.primary
                    ),
                )
                .action("Upgrade"),
            );
        }
        if plan.phase == Phase::DowngradeRefused {
            response = response.event(
                Event::warning(
                    "DowngradeRefused",
                    format!(
                        "spec.version {} is older than the running {}; downgrades are not supported",
                        db.spec.version, plan.template_version
                    ),
                )
                .action("Upgrade"),
            );
        }
        if plan.phase == Phase::Ready
            && db.status.as_ref().map(|s| s.phase.as_str()) != Some(Phase::Ready.as_str())
        {
            response = response.event(
                Event::normal(
                    "Ready",
                    format!(
                        "{} members run {}, primary {}",
                        status.replicas, plan.template_version, status.primary
                    ),
                )
                .action("Rollout"),
            );
        }
        let waiting = !matches!(plan.phase, Phase::Ready | Phase::DowngradeRefused);
        let response = response
            .status(&status)
            .condition(ready)
            .condition(progressing);
        Ok(if waiting {
            response.requeue_after(ROLLOUT_POLL)
        } else {
            response
        })
    }

    fn finalize(req: &Request) -> Result<Finalized> {
        let db: Database = req.primary()?;
        let claims: Vec<PersistentVolumeClaim> = req
            .related::<PersistentVolumeClaim>()?
            .into_iter()
            .filter(|c| {
                c.metadata.namespace.as_deref() == db.namespace()
                    && c.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(DATABASE_LABEL))
                        .map(String::as_str)
                        == Some(db.name())
            })
            .collect();
        let sets = req.owned::<StatefulSet>()?;
        if claims.is_empty() && sets.is_empty() {
            return Ok(Finalized::done().with(
                Response::new().event(
                    Event::normal(
                        "VolumesDeleted",
                        format!("{} has no volume claims left", db.name()),
                    )
                    .action("Finalize"),
                ),
            ));
        }
        // Claims stay while a pod uses them (pvc-protection), and the pods stay while the
        // StatefulSet does: delete both now and look again until nothing is left.
        let mut effects = Response::new().requeue_after(ROLLOUT_POLL);
        for sts in sets
            .iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
        {
            effects = effects.delete(ObjectRef::from_object(sts), Propagation::Background);
        }
        let pending: Vec<&PersistentVolumeClaim> = claims
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .collect();
        for claim in &pending {
            effects = effects.delete(ObjectRef::from_object(*claim), Propagation::Background);
        }
        if !pending.is_empty() {
            let names: Vec<&str> = pending
                .iter()
                .filter_map(|c| c.metadata.name.as_deref())
                .collect();
            effects = effects.event(
                Event::normal(
                    "DeletingVolumes",
                    format!(
                        "deleting the StatefulSet and the volume claims {}",
                        names.join(", ")
                    ),
                )
                .action("Finalize"),
            );
        }
        Ok(Finalized::pending().with(effects))
    }

    fn validate(req: &ValidateRequest) -> Validation {
        let new: Database = match req.new_object() {
            Ok(db) => db,
            Err(e) => return Validation::deny(format!("not a Database: {e}")),
        };
        if new.spec.replicas < 1 {
            return Validation::deny_field(
                "spec.replicas",
                format!(
                    "spec.replicas must be at least 1 (the primary): scaling a Database to zero is not supported, got {}; delete the Database to remove it",
                    new.spec.replicas
                ),
            );
        }
        if let Err(problem) = check_spec(&new.spec) {
            let field = if problem.starts_with("spec.version") {
                "spec.version"
            } else if problem.starts_with("spec.image") {
                "spec.image"
            } else {
                "spec.storage.size"
            };
            return Validation::deny_field(field, problem);
        }
        let mut verdict = Validation::allow();
        let old: Option<Database> = match req.old() {
            Ok(old) => old,
            Err(e) => return Validation::deny(format!("the old object is not a Database: {e}")),
        };
        if let Some(old) = old {
            if old.spec.storage != new.spec.storage {
                return Validation::deny_field(
                    "spec.storage",
                    "spec.storage is immutable: a StatefulSet's volumeClaimTemplates cannot change; create a new Database and migrate the data",
                );
            }
            if let (Ok(from), Ok(to)) = (
                Version::parse(&old.spec.version),
                Version::parse(&new.spec.version),
            ) {
                if to < from {
                    return Validation::deny_field(
                        "spec.version",
                        format!(
                            "downgrading from {from} to {to} is not supported (data files may not be readable by an older version); restore a backup into a new Database instead"
                        ),
                    );
                }
                if to.major() > from.major() {
                    verdict = verdict.warn(format!(
                        "{from} -> {to} is a major upgrade: the replicas are upgraded first, then the primary; make sure {to} reads {from}'s data"
                    ));
                }
            }
            let rolling = old.status.as_ref().is_some_and(|s| {
                !s.current_version.is_empty() && s.current_version != s.target_version
            });
            if rolling && new.spec.version != old.spec.version {
                verdict = verdict.warn(
                    "an upgrade is still rolling out; the new version replaces it, replicas first again",
                );
            }
        }
        verdict
    }
}

/// Checks what the schema cannot: the version's shape, the image, the storage size.
fn check_spec(spec: &DatabaseSpec) -> std::result::Result<(), String> {
    if spec.replicas < 1 {
        return Err(format!(
            "spec.replicas must be at least 1 (the primary), got {}",
            spec.replicas
        ));
    }
    Version::parse(&spec.version).map_err(|e| format!("spec.version: {e}"))?;
    if spec.image.trim().is_empty()
        || spec.image.contains(char::is_whitespace)
        || spec.image.contains('@')
    {
        return Err(format!(
            "spec.image {:?} must be an image repository without a tag or digest (the tag is spec.version)",
            spec.image
        ));
    }
    if let Some(storage) = &spec.storage
        && !is_quantity(&storage.size)
    {
        return Err(format!(
            "spec.storage.size {:?} is not a quantity (use e.g. 1Gi)",
            storage.size
        ));
    }
    Ok(())
}

fn is_quantity(s: &str) -> bool {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0
        && matches!(
            &s[digits..],
            "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "k" | "M" | "G" | "T" | "P"
        )
}

wasmop_sdk::export!(PrimaryReplica);
