//! Membership: every replica holds a member Lease of its own in the host's namespace, renewed
//! like the leader Lease ([`crate::operations::leader`]), that announces it and publishes the
//! ranges it holds.
//!
//! A member Lease is named `<group>-<identity>`, labelled [`GROUP_LABEL`]`=<group>`, has
//! `spec.holderIdentity` = the identity and carries the held ranges in the [`HELD_ANNOTATION`]
//! annotation. Others judge it expired when its resourceVersion has not changed for its
//! `leaseDurationSeconds` plus a margin, *as observed by their own monotonic clock* (the clocks of
//! different nodes never matter), or when it is gone or has no holder.
//!
//! # Guarantees
//! - Only its owner writes a member Lease while it lives; others delete only Leases they judge
//!   expired, conditioned on the resourceVersion they judged.
//! - A renewal that finds its own Lease deleted fails with [`ShardError::Lost`]: someone judged
//!   this replica dead, so it must stop at once.
//! - [`Membership::members`] reads with a quorum read (no resourceVersion), so what it returns is
//!   at least as new as every write that finished before it.
//!
//! # Errors
//! [`ShardError::Api`] when the API server refuses or cannot be reached.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::ShardError;
use super::ranges::Ranges;
use super::serving::Report;

/// The label that groups the member Leases of one set of replicas.
pub const GROUP_LABEL: &str = "wasmop.dev/shard-group";
/// The annotation with the ranges a member holds (may be reconciling in).
pub const HELD_ANNOTATION: &str = "wasmop.dev/shard-held";

/// The longest validity a member Lease may claim (`leaseDurationSeconds`). Others judge a
/// member by the duration its Lease claims; without a bound, one Lease claiming years would hold
/// its ranges unserved for that long after its replica died. `--shard-lease-duration` is
/// refused above it, so no live member claims more.
pub const MAX_LEASE_DURATION: Duration = crate::operations::leader::MAX_LEASE_DURATION;

/// How a replica takes part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberConfig {
    /// The namespace of the member Leases.
    pub namespace: String,
    /// The group: replicas of one group share the work (`--shard-group`, default `wasmop`).
    pub group: String,
    /// This replica's identity (unique per process).
    pub identity: String,
    /// How long a member Lease is valid after its last renewal (default 15 s).
    pub lease_duration: Duration,
    /// How long a member keeps trying to renew before it stops reconciling (default 10 s).
    pub renew_deadline: Duration,
    /// How often members renew and rebalance (default 2 s); also the margin added to a Lease's
    /// duration before another member takes its ranges.
    pub retry_period: Duration,
}

/// One member as read.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// Its identity.
    pub identity: String,
    /// The ranges it holds.
    pub held: Ranges,
    /// Whether it is live: its Lease has a holder and changed within its duration plus margin.
    pub live: bool,
    /// What it serves and whether it withdrew (see [`super::serving`]).
    pub report: Report,
    /// The Lease's name and resourceVersion.
    lease: (String, String),
}

/// How long a member Lease is valid after its last change: the duration it claims, within
/// 1 s and [`MAX_LEASE_DURATION`]; `own` when it claims none.
fn validity(spec: &LeaseSpec, own: Duration) -> Duration {
    spec.lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(own, Duration::from_secs)
        .clamp(Duration::from_secs(1), MAX_LEASE_DURATION)
}

/// A member Lease name for `identity`: a DNS subdomain (lowercase, `-` for anything else).
pub fn lease_name(group: &str, identity: &str) -> String {
    let clean: String = format!("{group}-{identity}")
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    clean
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .chars()
        .take(253)
        .collect()
}

/// The annotations of a member Lease: `held` and `report`.
fn annotations(held: &Ranges, report: &Report) -> BTreeMap<String, String> {
    let mut all = report.annotations();
    all.insert(HELD_ANNOTATION.to_string(), held.to_string());
    all
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX).max(1)
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// This replica's member Lease and its view of the others.
#[derive(Debug)]
pub struct Membership {
    api: Api<Lease>,
    config: MemberConfig,
    name: String,
    created: Mutex<bool>,
    /// Each Lease's last resourceVersion and when this process first saw it.
    observed: Mutex<HashMap<String, (String, Instant)>>,
}

impl Membership {
    /// Membership in `config.group`.
    pub fn new(client: Client, config: MemberConfig) -> Self {
        Membership {
            api: Api::namespaced(client, &config.namespace),
            name: lease_name(&config.group, &config.identity),
            config,
            created: Mutex::new(false),
            observed: Mutex::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &MemberConfig {
        &self.config
    }

    fn api_error(&self, what: &str, source: kube::Error) -> ShardError {
        ShardError::Api {
            what: format!("{what} in namespace {}", self.config.namespace),
            source,
        }
    }

    /// Creates or renews this replica's Lease, publishing `held` and `report`.
    ///
    /// # Errors
    /// [`ShardError::Lost`] when the Lease was deleted after it was created (another member
    /// judged this one expired); [`ShardError::Api`].
    pub async fn publish(&self, held: &Ranges, report: &Report) -> Result<(), ShardError> {
        let created = self.created.lock().map(|c| *c).unwrap_or(true);
        if !created {
            return self.create(held, report).await;
        }
        let patch = json!({
            "metadata": {"annotations": annotations(held, report)},
            "spec": {
                "holderIdentity": self.config.identity,
                "leaseDurationSeconds": seconds(self.config.lease_duration),
                "renewTime": now(),
            }
        });
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(ShardError::Lost(format!(
                "member Lease {}/{} was deleted: another replica judged this one expired",
                self.config.namespace, self.name
            ))),
            Err(e) => Err(self.api_error(&format!("renewing member Lease {}", self.name), e)),
        }
    }

    async fn create(&self, held: &Ranges, report: &Report) -> Result<(), ShardError> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.config.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    GROUP_LABEL.to_string(),
                    self.config.group.clone(),
                )])),
                annotations: Some(annotations(held, report)),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.config.identity.clone()),
                lease_duration_seconds: Some(seconds(self.config.lease_duration)),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                ..LeaseSpec::default()
            }),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(_) => {}
            // A Lease of this identity exists only if this process made it (identities are
            // unique per process): a lost answer.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => {
                return Err(self.api_error(&format!("creating member Lease {}", self.name), e));
            }
        }
        if let Ok(mut c) = self.created.lock() {
            *c = true;
        }
        Ok(())
    }

    /// Notes `rv` of Lease `name` as read now; returns how long it has been unchanged.
    fn unchanged_for(&self, name: &str, rv: &str) -> Duration {
        let Ok(mut o) = self.observed.lock() else {
            return Duration::ZERO;
        };
        match o.get(name) {
            Some((seen, at)) if seen == rv => at.elapsed(),
            _ => {
                o.insert(name.to_string(), (rv.to_string(), Instant::now()));
                Duration::ZERO
            }
        }
    }

    fn member(&self, lease: &Lease) -> Option<Member> {
        let name = lease.name_any();
        let rv = lease.resource_version().unwrap_or_default();
        let spec = lease.spec.clone().unwrap_or_default();
        let duration = validity(&spec, self.config.lease_duration);
        let identity = spec.holder_identity.filter(|h| !h.is_empty());
        let unchanged = self.unchanged_for(&name, &rv);
        let identity = identity?;
        let held = match lease.annotations().get(HELD_ANNOTATION) {
            Some(text) => match Ranges::parse(text) {
                Ok(r) => r,
                Err(e) => {
                    // Unreadable claims are taken as the whole space: nobody takes over
                    // anything from this member until its Lease expires.
                    tracing::warn!(lease = %name, error = %e, "unreadable held ranges");
                    Ranges::all()
                }
            },
            None => Ranges::empty(),
        };
        let is_me = identity == self.config.identity;
        Some(Member {
            live: is_me || unchanged < duration + self.config.retry_period,
            report: Report::read(lease.annotations()),
            identity,
            held,
            lease: (name, rv),
        })
    }

    /// Every member Lease of the group, as read now (a quorum read).
    ///
    /// # Errors
    /// [`ShardError::Api`].
    pub async fn members(&self) -> Result<Vec<Member>, ShardError> {
        let lp = ListParams::default().labels(&format!("{GROUP_LABEL}={}", self.config.group));
        let list = self
            .api
            .list(&lp)
            .await
            .map_err(|e| self.api_error("listing member Leases", e))?;
        let members: Vec<Member> = list.items.iter().filter_map(|l| self.member(l)).collect();
        if let Ok(mut o) = self.observed.lock() {
            let present: Vec<String> = list.items.iter().map(ResourceExt::name_any).collect();
            o.retain(|name, _| present.contains(name));
        }
        Ok(members)
    }

    /// Deletes the Leases of members judged expired (their ranges are free already), each
    /// conditioned on the resourceVersion judged. Failures are only logged.
    pub async fn forget_expired(&self, members: &[Member]) {
        for m in members.iter().filter(|m| !m.live) {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(m.lease.1.clone()),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            match self.api.delete(&m.lease.0, &dp).await {
                Ok(_) => {
                    tracing::info!(member = %m.identity, "deleted the Lease of an expired member")
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => {
                    tracing::debug!(member = %m.identity, error = %e, "cannot delete an expired member's Lease")
                }
            }
        }
    }

    /// Leaves the group: deletes this replica's Lease so the others take its ranges at once.
    ///
    /// # Errors
    /// [`ShardError::Api`].
    pub async fn leave(&self) -> Result<(), ShardError> {
        match self.api.delete(&self.name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.api_error(&format!("deleting member Lease {}", self.name), e)),
        }
    }
}

#[cfg(test)]
impl Member {
    /// A member as if read from a Lease.
    pub(crate) fn for_test(identity: &str, held: Ranges, live: bool) -> Self {
        Member {
            identity: identity.to_string(),
            held,
            live,
            report: Report::default(),
            lease: (identity.to_string(), "1".to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reliability item 24: a member Lease claiming `leaseDurationSeconds: 2147483647` was
    /// trusted, so its ranges stayed unserved for 68 years after its replica died.
    #[test]
    fn a_member_lease_claims_at_most_the_maximum_validity() {
        let own = Duration::from_secs(15);
        let claiming = |seconds: Option<i32>| LeaseSpec {
            lease_duration_seconds: seconds,
            ..LeaseSpec::default()
        };
        assert_eq!(validity(&claiming(Some(i32::MAX)), own), MAX_LEASE_DURATION);
        assert_eq!(validity(&claiming(Some(20)), own), Duration::from_secs(20));
        assert_eq!(validity(&claiming(None), own), own);
        assert_eq!(validity(&claiming(Some(-5)), own), own);
        assert_eq!(validity(&claiming(Some(0)), own), Duration::from_secs(1));
    }

    #[test]
    fn lease_names_are_dns_subdomains() {
        assert_eq!(lease_name("wasmop", "Host_1-ab12"), "wasmop-host-1-ab12");
        assert_eq!(lease_name("g", "a.b"), "g-a.b");
    }
}
