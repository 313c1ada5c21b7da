//! The handover protocol: which ranges this replica reconciles, changed so that two replicas
//! never reconcile one primary at once.
//!
//! Every retry period a member:
//! 1. **renews** its Lease, publishing `held` (the ranges it may be reconciling in);
//! 2. reads every member Lease (a quorum read) and computes its `desired` ranges from the live
//!    members ([`super::ring`]);
//! 3. **releases** `held − desired`: stops admitting reconciles there at once, waits (tick by
//!    tick, renewing meanwhile) until the running ones there have finished, then publishes
//!    `held` without them;
//! 4. **claims** `desired − held − (what any other live member holds)`: publishes `held ∪ claim`,
//!    reads every member Lease again and keeps only the part no other live member holds or
//!    claims; only then starts reconciling it (and withdraws the rest).
//!
//! Why this is safe: a member reconciles in a range only after its claim was written *and* a
//! later quorum read showed no other claim there. Of two members claiming one range, the one
//! whose read comes second sees the other's earlier write and backs off (both may back off;
//! they retry next period). A member that stops renewing is taken over only after its Lease has
//! been unchanged for its duration plus one retry period, as observed by the taker; it stops
//! itself (fencing, like the leader) once no renewal succeeded for the renew deadline, which is
//! shorter than the lease duration.
//!
//! # Guarantees
//! - Every membership call (renewal, list, publish) is bounded by the time left to the renew
//!   deadline, and [`Shards::admit`] refuses once a renewal's send time plus the renew deadline
//!   has passed, whatever this loop is doing.
//! - Never two members admitting reconciles in one range, provided renew deadline < lease
//!   duration and a process pauses no longer than their difference plus one retry period.
//! - A handover costs at most: the loser's running reconciles (drain) + two retry periods when
//!   both are alive; lease duration + retry period + one retry period when the loser died; then
//!   the gainer's relist of its watches and one reconcile of every gained primary.
//! - The ring is over the live members that have not withdrawn ([`super::serving`]): a member
//!   that cannot serve what a healthy member serves releases its share like a member leaving,
//!   through the same drain and claim steps (exclusivity does not depend on who withdrew).
//!
//! # Errors
//! [`ShardError::Lost`] when no renewal succeeded within the renew deadline (or this member's
//! Lease was deleted): the host stops at once.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use super::ShardError;
use super::assignment::Shards;
use super::membership::{Member, Membership};
use super::ranges::Ranges;
use super::ring;
use crate::operations::metrics;

/// One replica's side of the protocol.
#[derive(Debug)]
pub struct Handover {
    membership: Membership,
    shards: Arc<Shards>,
    /// Ranges this replica may be reconciling in (published).
    held: Ranges,
    /// Part of `held` being drained before it is released.
    releasing: Ranges,
    /// Whether this replica coordinates the group's shared writes (webhook configurations):
    /// true on the live member whose identity sorts first.
    coordinator: watch::Sender<bool>,
}

/// The identities of the live members, `me` included, sorted.
fn live_members(members: &[Member], me: &str) -> Vec<String> {
    let mut live: Vec<String> = members
        .iter()
        .filter(|m| m.live)
        .map(|m| m.identity.clone())
        .collect();
    if !live.iter().any(|m| m == me) {
        live.push(me.to_string());
    }
    live.sort();
    live
}

/// The live members the ring is over: those that did not withdraw (`me` as just judged, the
/// others as they published).
fn ring_members(live: &[String], members: &[Member], me: &str, withdrawn: bool) -> Vec<String> {
    let published = |id: &str| {
        members
            .iter()
            .any(|m| m.identity == id && m.report.withdrawn)
    };
    live.iter()
        .filter(|id| {
            if *id == me {
                !withdrawn
            } else {
                !published(id)
            }
        })
        .cloned()
        .collect()
}

/// The ranges the members other than `me` hold: the live ones', and those of a Lease gone or
/// without a holder that has not expired yet ([`Member::holds`]).
fn others_held(members: &[Member], me: &str) -> Ranges {
    members
        .iter()
        .filter(|m| m.holds && m.identity != me)
        .fold(Ranges::empty(), |acc, m| acc.union(&m.held))
}

impl Handover {
    /// A member holding nothing yet.
    pub fn new(membership: Membership, shards: Arc<Shards>) -> Self {
        Handover {
            membership,
            shards,
            held: Ranges::empty(),
            releasing: Ranges::empty(),
            coordinator: watch::channel(false).0,
        }
    }

    /// Follows whether this replica coordinates the group's shared writes.
    pub fn coordinator(&self) -> watch::Receiver<bool> {
        self.coordinator.subscribe()
    }

    fn me(&self) -> &str {
        &self.membership.config().identity
    }

    /// Runs the protocol until `leave` resolves, then stops admitting reconciles and leaves
    /// the group (the caller has stopped its controllers by then).
    ///
    /// # Errors
    /// [`ShardError::Lost`] (fencing); nothing is admitted any more when it returns.
    pub async fn run(
        mut self,
        leave: impl std::future::Future<Output = ()>,
    ) -> Result<(), ShardError> {
        let config = self.membership.config().clone();
        let mut last_renewed = Instant::now();
        tokio::pin!(leave);
        loop {
            let left = config.renew_deadline.saturating_sub(last_renewed.elapsed());
            let sent = Instant::now();
            let report = self.shards.serving().report();
            match tokio::time::timeout(left, self.membership.publish(&self.held, &report)).await {
                Ok(Ok(())) => {
                    last_renewed = sent;
                    self.shards.renewed(sent + config.renew_deadline);
                }
                Ok(Err(e @ ShardError::Lost(_))) => return Err(self.fence(e)),
                Ok(Err(e)) => tracing::warn!(error = %e, "renewing the member Lease"),
                Err(_) => {}
            }
            if last_renewed.elapsed() >= config.renew_deadline {
                let e = ShardError::Lost(format!(
                    "the member Lease was not renewed within the renew deadline of {:?}",
                    config.renew_deadline
                ));
                return Err(self.fence(e));
            }
            // Bounded like the renewal: a stalled list or publish never holds the loop (and
            // its next renewal) past the renew deadline.
            let left = config.renew_deadline.saturating_sub(last_renewed.elapsed());
            match tokio::time::timeout(left, self.rebalance()).await {
                Ok(Ok(())) => {}
                Ok(Err(e @ ShardError::Lost(_))) => return Err(self.fence(e)),
                Ok(Err(e)) => tracing::warn!(error = %e, "rebalancing shard ranges"),
                Err(_) => tracing::warn!(
                    "rebalancing shard ranges did not finish within the renew deadline"
                ),
            }
            tokio::select! {
                _ = &mut leave => break,
                _ = tokio::time::sleep(config.retry_period) => {}
            }
        }
        self.shards.set_active(Ranges::empty());
        if !self.drained(config.renew_deadline).await {
            tracing::warn!(
                "reconciles still running after the shutdown; not releasing the member Lease: the others wait for it to expire"
            );
            return Ok(());
        }
        self.membership.leave().await?;
        tracing::info!(identity = %self.me(), "left the shard group");
        Ok(())
    }

    /// Whether every admitted reconcile has finished, waiting at most `bound` (a reconcile the
    /// shutdown grace gave up on may still be writing: its ranges are not released under it).
    async fn drained(&self, bound: std::time::Duration) -> bool {
        let until = Instant::now() + bound;
        while self.shards.running_in(&Ranges::all()) > 0 {
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        true
    }

    /// Stops admitting reconciles at once.
    fn fence(&self, e: ShardError) -> ShardError {
        self.shards.set_active(Ranges::empty());
        let _ = self.coordinator.send_replace(false);
        tracing::error!(error = %e, "shard membership lost; stopping reconcilers at once");
        e
    }

    /// Steps 2 to 4 of the protocol (see the module docs).
    async fn rebalance(&mut self) -> Result<(), ShardError> {
        let members = self.membership.members().await?;
        self.membership.forget_expired(&members).await;
        let me = self.me().to_string();
        let live = live_members(&members, &me);
        let _ = self
            .coordinator
            .send_if_modified(|c| std::mem::replace(c, live.first() == Some(&me)) != *c);
        metrics::global().shards().members(live.len());
        // A replica that cannot serve what a healthy member serves takes no ranges; the ring
        // is over the members that did not withdraw (as each published it).
        let others = members
            .iter()
            .filter(|m| m.live && m.identity != me)
            .map(|m| (m.identity.clone(), m.report.clone()))
            .collect();
        let withdrawn = self.shards.serving().judge(others).withdrawn;
        let desired = ring::assignment(&ring_members(&live, &members, &me, withdrawn), &me);
        self.release(&desired).await?;
        let claim = desired
            .difference(&self.held)
            .difference(&others_held(&members, &me));
        if !claim.is_empty() {
            self.claim(claim).await?;
        }
        Ok(())
    }

    async fn release(&mut self, desired: &Ranges) -> Result<(), ShardError> {
        let losing = self.held.difference(desired).difference(&self.releasing);
        if !losing.is_empty() {
            self.releasing = self.releasing.union(&losing);
            self.shards
                .set_active(self.held.difference(&self.releasing));
            tracing::info!(identity = %self.me(), ranges = %losing, "releasing shard ranges: draining their reconciles");
        }
        if self.releasing.is_empty() || self.shards.running_in(&self.releasing) > 0 {
            return Ok(());
        }
        let held = self.held.difference(&self.releasing);
        let report = self.shards.serving().report();
        self.membership.publish(&held, &report).await?;
        tracing::info!(identity = %self.me(), ranges = %self.releasing, fraction = held.fraction(), "released shard ranges");
        metrics::global().shards().handover("released");
        self.held = held;
        self.releasing = Ranges::empty();
        Ok(())
    }

    async fn claim(&mut self, claim: Ranges) -> Result<(), ShardError> {
        let report = self.shards.serving().report();
        self.membership
            .publish(&self.held.union(&claim), &report)
            .await?;
        let members = self.membership.members().await?;
        let me = self.me().to_string();
        let won = claim.difference(&others_held(&members, &me));
        if won != claim {
            tracing::info!(identity = %me, ranges = %claim.difference(&won), "another member claims these ranges too; backing off");
            self.membership
                .publish(&self.held.union(&won), &report)
                .await?;
        }
        if won.is_empty() {
            return Ok(());
        }
        self.held = self.held.union(&won);
        self.shards
            .set_active(self.held.difference(&self.releasing));
        tracing::info!(identity = %me, ranges = %won, fraction = self.held.fraction(), "acquired shard ranges");
        metrics::global().shards().handover("gained");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_holding_others_block_a_claim() {
        let a = Ranges::from_ranges([(0, 10)]);
        let b = Ranges::from_ranges([(20, 30)]);
        let members = vec![
            Member::for_test("me", Ranges::all(), true),
            Member::for_test("a", a.clone(), true),
            Member::for_test("dead", b, false),
        ];
        assert_eq!(others_held(&members, "me"), a);
    }
}
