//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go does it: only the holder of
//! the Lease runs reconcilers; every replica serves admission and metrics.
//!
//! The algorithm ([`Elector::try_acquire_or_renew`]): read the Lease; if another identity holds
//! it and its record changed less than `leaseDurationSeconds` ago *as observed by this process*
//! (local monotonic time, so clocks of different nodes never matter), someone else leads.
//! Otherwise write the Lease with this identity, conditioned on the resourceVersion read
//! (`replace`): a 409 means another replica wrote first and won this round.
//!
//! The leader renews every `retry_period`; when no renewal succeeded for `renew_deadline`
//! (shorter than the lease duration, so it stops before anyone else may start), or another
//! identity is seen holding the Lease, leadership is lost: [`Elector::hold`] returns and the
//! host exits non-zero without writing anything more (a restart begins clean, as
//! controller-runtime does). [`Elector::release`] empties the holder on graceful shutdown so a
//! follower takes over at its next retry instead of waiting out the lease.
//!
//! Why not a crate: `kube-leader-election` (0.44) and `kube-coordinate` (2.0.0-rc) need older kube
//! majors; `kube-lease-manager` (0.13) supports kube 5 but acquires with server-side-apply field
//! conflicts and renews without a resourceVersion precondition, and has no renew deadline.
//!
//! # Guarantees
//! - At most one replica believes it leads at any instant, provided the renew deadline is shorter
//!   than the lease duration and the process pauses no longer than their difference.
//! - A write of the Lease never overwrites a change this process has not read (resourceVersion).
//!
//! # Errors
//! [`LeaderError`] when the Lease cannot be read or written (retried until the renew deadline).

use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

/// Where the in-cluster ServiceAccount namespace is mounted.
pub const SA_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// How to elect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderConfig {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity (unique per process).
    pub identity: String,
    /// How long a Lease is valid after its last renewal (default 15 s).
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up (default 10 s).
    pub renew_deadline: Duration,
    /// How often candidates try to acquire and the leader renews (default 2 s).
    pub retry_period: Duration,
}

impl LeaderConfig {
    /// The defaults: Lease `wasmop-leader` in the pod's namespace (or `default`), 15 s / 10 s /
    /// 2 s, identity from the host name and a random suffix.
    pub fn new(namespace: Option<String>, name: Option<String>) -> Self {
        LeaderConfig {
            namespace: namespace.unwrap_or_else(default_namespace),
            name: name.unwrap_or_else(|| "wasmop-leader".into()),
            identity: identity(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// The in-cluster ServiceAccount's namespace, else `default`.
pub fn default_namespace() -> String {
    std::fs::read_to_string(SA_NAMESPACE_FILE)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into())
}

/// The host name and a random suffix: `host-1a2b3c4d`.
pub fn identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "wasmop".into());
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    format!("{host}-{:08x}", h.finish() as u32)
}

/// A failure to read or write the Lease.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The API server refused or could not be reached.
    #[error("lease {namespace}/{name}: {source}")]
    Api {
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
        /// The error.
        source: kube::Error,
    },
    /// Leadership was lost (another holder, or no renewal within the renew deadline).
    #[error("lost leadership of lease {namespace}/{name}: {reason}")]
    Lost {
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
        /// Why.
        reason: String,
    },
}

/// One attempt's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// This replica holds the Lease now.
    Leading,
    /// Another identity holds a valid Lease.
    HeldBy(String),
    /// Another replica wrote the Lease first (409).
    Conflict,
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX).max(1)
}

/// A new Lease held by `me`.
fn fresh_spec(me: &str, now: MicroTime, duration: Duration) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(seconds(duration)),
        acquire_time: Some(now.clone()),
        renew_time: Some(now),
        lease_transitions: Some(0),
        ..LeaseSpec::default()
    }
}

/// What to write, given the Lease read (None: it does not exist yet). `expired`: its record has
/// not changed for its lease duration, as observed here. Returns None when someone else leads.
pub fn next_spec(
    current: Option<&LeaseSpec>,
    me: &str,
    expired: bool,
    now: MicroTime,
    duration: Duration,
) -> Result<LeaseSpec, String> {
    let seconds = seconds(duration);
    let Some(cur) = current else {
        return Ok(fresh_spec(me, now, duration));
    };
    let holder = cur.holder_identity.as_deref().filter(|h| !h.is_empty());
    let mine = holder == Some(me);
    if let Some(h) = holder
        && !mine
        && !expired
    {
        return Err(h.to_string());
    }
    let transitions = cur.lease_transitions.unwrap_or(0);
    Ok(LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(seconds),
        acquire_time: if mine {
            cur.acquire_time.clone()
        } else {
            Some(now.clone())
        },
        renew_time: Some(now),
        lease_transitions: Some(if mine {
            transitions
        } else {
            transitions.saturating_add(1)
        }),
        ..cur.clone()
    })
}

/// A candidate for the Lease.
#[derive(Debug)]
pub struct Elector {
    api: Api<Lease>,
    config: LeaderConfig,
    /// The last resourceVersion read and when it was first seen.
    observed: Mutex<Option<(String, Instant)>>,
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

impl Elector {
    /// A candidate with `config`.
    pub fn new(client: Client, config: LeaderConfig) -> Self {
        Elector {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: Mutex::new(None),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LeaderConfig {
        &self.config
    }

    fn api_error(&self, source: kube::Error) -> LeaderError {
        LeaderError::Api {
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            source,
        }
    }

    /// Notes `rv` as read now; returns how long the record has been unchanged.
    fn observe(&self, rv: &str) -> Duration {
        let Ok(mut o) = self.observed.lock() else {
            return Duration::ZERO;
        };
        match &*o {
            Some((seen, at)) if seen == rv => at.elapsed(),
            _ => {
                *o = Some((rv.to_string(), Instant::now()));
                Duration::ZERO
            }
        }
    }

    /// One round: acquire or renew the Lease.
    ///
    /// # Errors
    /// [`LeaderError::Api`] when the Lease cannot be read or written.
    pub async fn try_acquire_or_renew(&self) -> Result<Attempt, LeaderError> {
        let me = &self.config.identity;
        let Some(lease) = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.api_error(e))?
        else {
            let spec = fresh_spec(me, now(), self.config.lease_duration);
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(l) => {
                    self.observe(&l.resource_version().unwrap_or_default());
                    Ok(Attempt::Leading)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Conflict),
                Err(e) => Err(self.api_error(e)),
            };
        };
        let rv = lease.resource_version().unwrap_or_default();
        let unchanged_for = self.observe(&rv);
        let spec = lease.spec.clone().unwrap_or_default();
        let duration = claimed_duration(&spec, self.config.lease_duration);
        let next = match next_spec(
            Some(&spec),
            me,
            unchanged_for >= duration,
            now(),
            self.config.lease_duration,
        ) {
            Ok(n) => n,
            Err(holder) => return Ok(Attempt::HeldBy(holder)),
        };
        let updated = Lease {
            metadata: lease.metadata.clone(),
            spec: Some(next),
        };
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &updated)
            .await
        {
            Ok(l) => {
                self.observe(&l.resource_version().unwrap_or_default());
                Ok(Attempt::Leading)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Conflict),
            Err(e) => Err(self.api_error(e)),
        }
    }

    /// Tries every retry period until this replica leads; returns when the winning attempt was
    /// sent (what [`Elector::hold`] counts the renew deadline from).
    pub async fn acquire(&self) -> Instant {
        let mut last_holder: Option<String> = None;
        loop {
            let sent = Instant::now();
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => {
                    tracing::info!(identity = %self.config.identity, lease = %self.config.name, "acquired leadership");
                    return sent;
                }
                Ok(Attempt::HeldBy(h)) => {
                    if last_holder.as_ref() != Some(&h) {
                        tracing::info!(leader = %h, identity = %self.config.identity, "following; another replica leads");
                        last_holder = Some(h);
                    }
                }
                Ok(Attempt::Conflict) => {}
                Err(e) => tracing::warn!(error = %e, "trying to acquire leadership"),
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// Renews every retry period while leading, the last successful renewal sent at `since`
    /// (from [`Elector::acquire`]); returns why leadership was lost.
    ///
    /// # Guarantees
    /// The renew deadline counts from when the last successful write was *sent*, not from
    /// when its answer came: the API server may have stored it (and the other replicas started
    /// counting its lease duration) up to the whole wait for the answer earlier.
    pub async fn hold(&self, since: Instant) -> LeaderError {
        let mut last_renewed = since;
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            let left = self
                .config
                .renew_deadline
                .saturating_sub(last_renewed.elapsed());
            let sent = Instant::now();
            let attempt = tokio::time::timeout(left, self.try_acquire_or_renew()).await;
            let lost = |reason: String| LeaderError::Lost {
                namespace: self.config.namespace.clone(),
                name: self.config.name.clone(),
                reason,
            };
            match attempt {
                Ok(Ok(Attempt::Leading)) => last_renewed = sent,
                Ok(Ok(Attempt::HeldBy(h))) => return lost(format!("{h} holds it")),
                Ok(Ok(Attempt::Conflict)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "renewing leadership"),
                Err(_) => {}
            }
            if last_renewed.elapsed() >= self.config.renew_deadline {
                return lost(format!(
                    "not renewed within the renew deadline of {:?}",
                    self.config.renew_deadline
                ));
            }
        }
    }

    /// Gives the Lease up (holder emptied) so another replica takes over at once. Does nothing
    /// when another identity holds it.
    ///
    /// # Errors
    /// [`LeaderError::Api`].
    pub async fn release(&self) -> Result<(), LeaderError> {
        let Some(lease) = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.api_error(e))?
        else {
            return Ok(());
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(&self.config.identity) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now());
        let updated = Lease {
            metadata: lease.metadata.clone(),
            spec: Some(spec),
        };
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => {
                tracing::info!(identity = %self.config.identity, "released leadership");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(self.api_error(e)),
        }
    }
}

/// The longest validity a Lease may claim (`leaseDurationSeconds`), the leader's and, with
/// sharding, a member's ([`crate::sharding::membership`] uses it): others judge a Lease by the
/// duration it claims, and one claiming years would stop them for years.
/// `--leader-election-lease-duration` and `--shard-lease-duration` are refused above it.
pub const MAX_LEASE_DURATION: Duration = Duration::from_secs(300);

/// How long the Lease `spec` may go unrenewed before it counts as expired: its claimed
/// `leaseDurationSeconds` (`own` when it claims none), between 1 s and the bound a member
/// Lease's claim has ([`MAX_LEASE_DURATION`]): whoever may write
/// the Lease must not make every replica wait for decades.
fn claimed_duration(spec: &LeaseSpec, own: Duration) -> Duration {
    spec.lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(own, Duration::from_secs)
        .clamp(Duration::from_secs(1), MAX_LEASE_DURATION)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whoever may write the Lease (or a replica once run with a huge flag) must not make every
    /// replica wait for decades: a claimed duration counts at most as long as a member Lease's.
    #[test]
    fn a_huge_claimed_lease_duration_counts_at_most_the_bound() {
        let claimed = |seconds: i32| LeaseSpec {
            holder_identity: Some("ghost".into()),
            lease_duration_seconds: Some(seconds),
            ..LeaseSpec::default()
        };
        let own = Duration::from_secs(15);
        assert_eq!(
            claimed_duration(&claimed(i32::MAX), own),
            MAX_LEASE_DURATION
        );
        assert_eq!(claimed_duration(&claimed(0), own), Duration::from_secs(1));
        assert_eq!(claimed_duration(&claimed(20), own), Duration::from_secs(20));
        assert_eq!(claimed_duration(&LeaseSpec::default(), own), own);
    }

    fn at(secs: i64) -> MicroTime {
        MicroTime(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default())
    }

    #[test]
    fn a_missing_or_released_lease_is_taken_and_a_valid_one_is_respected() {
        let d = Duration::from_secs(15);
        let first = next_spec(None, "a", false, at(10), d);
        assert_eq!(
            first.as_ref().map(|s| s.holder_identity.clone()),
            Ok(Some("a".into()))
        );
        let held = first.unwrap_or_default();
        // b must wait while a's record is fresh...
        assert_eq!(
            next_spec(Some(&held), "b", false, at(11), d),
            Err("a".into())
        );
        // ...and takes over once it expired, counting a transition.
        let taken = next_spec(Some(&held), "b", true, at(30), d).unwrap_or_default();
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
        assert_eq!(taken.lease_transitions, Some(1));
        assert_eq!(taken.acquire_time, Some(at(30)));
        // a renewal keeps the acquire time and the transitions.
        let renewed = next_spec(Some(&taken), "b", false, at(32), d).unwrap_or_default();
        assert_eq!(renewed.acquire_time, Some(at(30)));
        assert_eq!(renewed.renew_time, Some(at(32)));
        assert_eq!(renewed.lease_transitions, Some(1));
        // an emptied holder (a release) is free at once.
        let released = LeaseSpec {
            holder_identity: None,
            ..renewed
        };
        assert!(next_spec(Some(&released), "c", false, at(33), d).is_ok());
    }

    #[test]
    fn identities_differ_per_call() {
        assert_ne!(identity(), identity());
    }
}
