//! Membership: every replica holds a member Lease of its own in the host's namespace, renewed
//! like the leader Lease ([`crate::operations::leader`]), that announces it and publishes the
//! ranges it holds.
//!
//! A member Lease is named `<group>-<identity>`, labelled [`GROUP_LABEL`]`=<group>`, has
//! `spec.holderIdentity` = the identity and carries the held ranges in the [`HELD_ANNOTATION`]
//! annotation. Others judge it expired when its resourceVersion has not changed for its
//! `leaseDurationSeconds` plus a margin, *as observed by their own monotonic clock* (the clocks of
//! different nodes never matter). A replica that leaves releases its Lease (no holder, nothing
//! held): the others take its ranges at once and delete it.
//!
//! # Guarantees
//! - Only its owner writes a member Lease while it lives; others delete only Leases they judge
//!   expired or released, conditioned on the resourceVersion they judged.
//! - "Gone" and "no holder" are not "expired": a Lease deleted, or its holder emptied, by
//!   someone else (by hand, a tool) while its replica still reconciles keeps its last ranges
//!   held ([`Member::holds`]) until its duration plus the margin has passed since this process
//!   saw the change, which is longer than the replica's renew deadline: the replica learns of
//!   the deletion at its next renewal and stops, or restores its holder.
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
    /// Whether its `held` ranges are taken (no other member may claim them).
    pub holds: bool,
    /// What it serves and whether it withdrew (see [`super::serving`]).
    pub report: Report,
    /// The Lease's name and resourceVersion; `None` for a Lease gone whose ranges are still
    /// held (see [`Member::holds`]).
    lease: Option<(String, String)>,
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

/// The ranges Lease `name` says its member holds; unreadable ones are taken as the whole space
/// (nobody takes over anything from this member until its Lease expires).
fn held_of(lease: &Lease, name: &str) -> Ranges {
    match lease
        .annotations()
        .get(HELD_ANNOTATION)
        .map(|t| Ranges::parse(t))
    {
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            tracing::warn!(lease = %name, error = %e, "unreadable held ranges");
            Ranges::all()
        }
        None => Ranges::empty(),
    }
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
    /// What this process last read of each Lease, and when.
    observed: Mutex<HashMap<String, Observed>>,
}

/// What this process last read of a member Lease.
#[derive(Debug, Clone)]
struct Observed {
    /// Its resourceVersion, and when this process first saw it.
    rv: String,
    since: Instant,
    /// The last holder seen, the ranges it held and the validity it claimed.
    holder: Option<String>,
    held: Ranges,
    validity: Duration,
    /// When this process first found the Lease gone.
    gone: Option<Instant>,
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

    /// Notes Lease `name` as read now (`rv`, its holder, held ranges and validity); returns
    /// how long it has been unchanged and its last holder seen.
    fn observe(
        &self,
        name: &str,
        rv: &str,
        holder: Option<&str>,
        held: &Ranges,
        validity: Duration,
    ) -> (Duration, Option<String>) {
        let Ok(mut o) = self.observed.lock() else {
            return (Duration::ZERO, holder.map(str::to_string));
        };
        let entry = o.entry(name.to_string()).or_insert_with(|| Observed {
            rv: rv.to_string(),
            since: Instant::now(),
            holder: None,
            held: Ranges::empty(),
            validity,
            gone: None,
        });
        if entry.rv != rv {
            (entry.rv, entry.since) = (rv.to_string(), Instant::now());
        }
        if let Some(h) = holder {
            entry.holder = Some(h.to_string());
        }
        (entry.held, entry.validity, entry.gone) = (held.clone(), validity, None);
        (entry.since.elapsed(), entry.holder.clone())
    }

    /// The Leases seen before and missing from `present`: each holds its last ranges until
    /// its validity plus the margin has passed since this process found it gone.
    fn vanished(&self, present: &[String]) -> Vec<Member> {
        let Ok(mut o) = self.observed.lock() else {
            return Vec::new();
        };
        let margin = self.config.retry_period;
        let mut held = Vec::new();
        o.retain(|name, seen| {
            if present.contains(name) {
                return true;
            }
            let gone = *seen.gone.get_or_insert_with(Instant::now);
            let holds = !seen.held.is_empty() && gone.elapsed() < seen.validity + margin;
            if holds {
                held.push(Member {
                    identity: seen.holder.clone().unwrap_or_else(|| name.clone()),
                    held: seen.held.clone(),
                    live: false,
                    holds: true,
                    report: Report::default(),
                    lease: None,
                });
            }
            holds
        });
        held
    }

    fn member(&self, lease: &Lease) -> Member {
        let name = lease.name_any();
        let rv = lease.resource_version().unwrap_or_default();
        let spec = lease.spec.clone().unwrap_or_default();
        let duration = validity(&spec, self.config.lease_duration);
        let holder = spec.holder_identity.filter(|h| !h.is_empty());
        let held = held_of(lease, &name);
        let (unchanged, last_holder) = self.observe(&name, &rv, holder.as_deref(), &held, duration);
        let current = unchanged < duration + self.config.retry_period;
        let is_me = holder.as_deref() == Some(self.config.identity.as_str());
        // Live: in the ring. No holder (a released Lease, or one emptied by hand): out of the
        // ring, its last ranges held until it expires.
        let live = holder.is_some() && (is_me || current);
        Member {
            live,
            holds: live || (current && !held.is_empty()),
            report: Report::read(lease.annotations()),
            identity: holder.or(last_holder).unwrap_or_else(|| name.clone()),
            held,
            lease: Some((name, rv)),
        }
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
        let mut members: Vec<Member> = list.items.iter().map(|l| self.member(l)).collect();
        let present: Vec<String> = list.items.iter().map(ResourceExt::name_any).collect();
        members.extend(self.vanished(&present));
        Ok(members)
    }

    /// Deletes the Leases of members judged expired or released (their ranges are free
    /// already), each conditioned on the resourceVersion judged. Failures are only logged.
    pub async fn forget_expired(&self, members: &[Member]) {
        let expired = members.iter().filter(|m| !m.live && !m.holds);
        for (m, (name, rv)) in expired.filter_map(|m| Some((m, m.lease.as_ref()?))) {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(rv.clone()),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            match self.api.delete(name, &dp).await {
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

    /// Leaves the group: releases this replica's Lease (no holder, nothing held), so the
    /// others take its ranges at once and delete it. The caller has no reconcile running.
    ///
    /// *Caveat:* not a deletion, which the others read as a Lease deleted by hand (its ranges
    /// held for a lease duration).
    ///
    /// # Errors
    /// [`ShardError::Api`].
    pub async fn leave(&self) -> Result<(), ShardError> {
        let patch = json!({
            "metadata": {"annotations": {HELD_ANNOTATION: Ranges::empty().to_string()}},
            "spec": {"holderIdentity": null, "renewTime": now()}
        });
        let pp = PatchParams::default();
        match self.api.patch(&self.name, &pp, &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.api_error(&format!("releasing member Lease {}", self.name), e)),
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
            holds: live,
            report: Report::default(),
            lease: Some((identity.to_string(), "1".to_string())),
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

    use crate::modules::hostile::{self, Answer, Body};
    use serde_json::Value;
    use std::sync::Arc;

    /// An API server answering member Lease lists with what `leases` holds at each list, and
    /// recording every other request (method, path, body).
    struct Server {
        _h: hostile::Hostile,
        leases: Arc<Mutex<Vec<Value>>>,
        requests: Arc<Mutex<Vec<(String, String, String)>>>,
        membership: Membership,
    }

    fn lease(name: &str, holder: Option<&str>, held: &Ranges, seconds: i32, rv: &str) -> Value {
        json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv,
                "labels": {GROUP_LABEL: "g"}, "annotations": {HELD_ANNOTATION: held.to_string()}},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": seconds}
        })
    }

    /// Membership of `me` in group `g` (lease `lease`, retry period 100 ms) on a server.
    async fn server(lease: Duration) -> Server {
        let leases = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (l, r) = (leases.clone(), requests.clone());
        let h = hostile::start(move |q| {
            if q.method == "GET" {
                let items = l.lock().map(|l| l.clone()).unwrap_or_default();
                let list = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                    "metadata": {"resourceVersion": "1"}, "items": items});
                return Answer::ok(list.to_string().as_bytes());
            }
            if let Ok(mut r) = r.lock() {
                let body = String::from_utf8_lossy(&q.body).into_owned();
                r.push((q.method.clone(), q.path.clone(), body));
            }
            Answer::with(
                404,
                Body::Bytes(br#"{"kind":"Status","code":404}"#.to_vec()),
            )
        })
        .await;
        let (client, _) = h.kube_client();
        let config = MemberConfig {
            namespace: "ns".into(),
            group: "g".into(),
            identity: "me".into(),
            lease_duration: lease,
            renew_deadline: lease / 2,
            retry_period: Duration::from_millis(100),
        };
        Server {
            _h: h,
            leases,
            requests,
            membership: Membership::new(client, config),
        }
    }

    impl Server {
        fn list(&self, leases: Vec<Value>) {
            if let Ok(mut l) = self.leases.lock() {
                *l = leases;
            }
        }

        async fn members(&self) -> Vec<Member> {
            self.membership
                .members()
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        }

        fn requests(&self) -> Vec<(String, String, String)> {
            self.requests.lock().map(|r| r.clone()).unwrap_or_default()
        }
    }

    fn held_by_others(members: &[Member]) -> Ranges {
        members
            .iter()
            .filter(|m| m.holds && m.identity != "me")
            .fold(Ranges::empty(), |acc, m| acc.union(&m.held))
    }

    /// A member Lease deleted by hand (or by a tool) while its replica still reconciles: the
    /// replica learns it only at its next renewal and may reconcile until its renew deadline;
    /// the others must not take its ranges at once ("gone" is not "expired").
    #[tokio::test]
    async fn a_member_lease_deleted_by_hand_holds_its_ranges_for_a_lease_duration() {
        let s = server(Duration::from_secs(300)).await;
        let theirs = Ranges::from_ranges([(0, 1 << 40)]);
        s.list(vec![lease("g-a", Some("a"), &theirs, 300, "7")]);
        assert_eq!(held_by_others(&s.members().await), theirs);
        s.list(Vec::new());
        let members = s.members().await;
        assert_eq!(held_by_others(&members), theirs, "{members:?}");
        assert!(members.iter().all(|m| !m.live), "{members:?}");
        s.membership.forget_expired(&members).await;
        assert_eq!(s.requests(), Vec::new(), "nothing to delete");
    }

    /// A member Lease whose holder was emptied by hand: its replica restores the holder at its
    /// next renewal, and its ranges stay held meanwhile (and until it expires, if it is dead).
    #[tokio::test]
    async fn a_member_lease_whose_holder_was_emptied_holds_its_ranges_until_it_expires() {
        let s = server(Duration::from_secs(300)).await;
        let theirs = Ranges::from_ranges([(0, 1 << 40)]);
        s.list(vec![lease("g-a", None, &theirs, 300, "8")]);
        let members = s.members().await;
        assert_eq!(held_by_others(&members), theirs, "{members:?}");
        assert!(
            members.iter().all(|m| !m.live),
            "not in the ring: {members:?}"
        );
    }

    /// A vanished member's ranges are free once its lease duration (plus one retry period)
    /// has passed since this replica found it gone.
    #[tokio::test]
    async fn a_vanished_members_ranges_are_free_after_its_lease_duration() {
        let s = server(Duration::from_secs(1)).await;
        let theirs = Ranges::from_ranges([(0, 1 << 40)]);
        s.list(vec![lease("g-a", Some("a"), &theirs, 1, "9")]);
        s.members().await;
        s.list(Vec::new());
        assert_eq!(held_by_others(&s.members().await), theirs);
        // 1 s + 100 ms of validity and margin: 1.5 s is past it, whatever the scheduling.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(held_by_others(&s.members().await), Ranges::empty());
    }

    /// A replica that leaves (its reconciles finished) releases its Lease: no holder, nothing
    /// held. The others take its ranges at once and delete the released Lease; a deletion by
    /// the leaving replica would read as a Lease deleted by hand (held for a lease duration).
    #[tokio::test]
    async fn leaving_releases_the_lease_and_the_others_take_it_over_at_once() {
        let s = server(Duration::from_secs(300)).await;
        s.membership.leave().await.unwrap_or_else(|e| panic!("{e}"));
        let requests = s.requests();
        let [(method, path, body)] = requests.as_slice() else {
            panic!("one request: {requests:?}")
        };
        assert_eq!(method, "PATCH", "{path} {body}");
        let at = path.split('?').next().unwrap_or_default();
        assert!(at.ends_with("/namespaces/ns/leases/g-me"), "{path}");
        let patch: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(patch["spec"]["holderIdentity"], Value::Null, "{patch}");
        assert_eq!(
            patch["metadata"]["annotations"][HELD_ANNOTATION],
            json!(""),
            "{patch}"
        );
        let mine = Ranges::from_ranges([(0, 1 << 40)]);
        s.list(vec![lease("g-a", Some("a"), &mine, 300, "5")]);
        s.members().await;
        s.list(vec![lease("g-a", None, &Ranges::empty(), 300, "6")]);
        let members = s.members().await;
        assert_eq!(held_by_others(&members), Ranges::empty(), "{members:?}");
        s.membership.forget_expired(&members).await;
        let deleted: Vec<_> = s
            .requests()
            .into_iter()
            .filter(|r| r.0 == "DELETE")
            .collect();
        assert!(
            matches!(deleted.as_slice(), [(_, p, _)] if p.contains("/leases/g-a")),
            "{deleted:?}"
        );
    }

    #[test]
    fn lease_names_are_dns_subdomains() {
        assert_eq!(lease_name("wasmop", "Host_1-ab12"), "wasmop-host-1-ab12");
        assert_eq!(lease_name("g", "a.b"), "g-a.b");
    }
}
