//! What this replica may reconcile now: the active ranges, the reconciles running in them, and
//! the notifications that restart the sharded watches.
//!
//! The handover loop ([`super::handover`]) is the only writer of the active ranges; the
//! controllers ask [`Shards::admit`] before every reconcile and hold the returned [`Admitted`]
//! until the reconcile (with its writes) is over.
//!
//! # Guarantees
//! - Admission and deactivation are atomic with respect to each other (one lock): once
//!   [`Shards::set_active`] returned without a range, no reconcile in it is admitted, and
//!   [`Shards::running_in`] counts every admitted one still running there.
//! - Watchers see every change of the active ranges ([`Shards::subscribe`]); the latest value
//!   wins.
//! - Nothing is admitted once the member Lease may have lapsed ([`Shards::renewed`]: the time a
//!   successful renewal was sent, plus the renew deadline), whatever the handover loop is doing:
//!   a replica stuck in an API call stops admitting on time, before another member may take its
//!   ranges (after the lease duration, which is longer).
//!
//! # Errors
//! Nothing here fails; a poisoned lock admits nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::watch;

use super::ranges::Ranges;
use crate::operations::metrics;

#[derive(Debug, Default)]
struct State {
    active: Ranges,
    /// Admitted reconciles still running, by hash.
    running: HashMap<u64, usize>,
    /// Until when the member Lease is surely valid (None: never renewed, nothing admitted).
    valid_until: Option<Instant>,
}

/// The ranges this replica reconciles, shared by the handover loop and every controller.
#[derive(Debug)]
pub struct Shards {
    state: Mutex<State>,
    changed: watch::Sender<Ranges>,
    /// This replica's identity (for logs).
    identity: String,
    /// Whether to try server-side filtering (`--shard-filter auto`) before filtering here.
    server_side: bool,
    /// What this replica serves (reported by the manager, published by the handover).
    serving: super::serving::Serving,
    /// The listed ranges of each reconciler's watches, told of every change of the active ones.
    listeds: Mutex<Vec<std::sync::Weak<super::listed::Listed>>>,
}

/// Why a reconcile was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its range is not active here (another member's, or being released).
    NotHere,
    /// The member Lease may have lapsed: no renewal vouches for it now.
    Lapsed,
}

/// A reconcile admitted in an active range; dropping it marks the reconcile finished.
#[derive(Debug)]
pub struct Admitted {
    shards: Arc<Shards>,
    hash: u64,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Ok(mut s) = self.shards.state.lock()
            && let Some(n) = s.running.get_mut(&self.hash)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.running.remove(&self.hash);
            }
        }
    }
}

impl Shards {
    /// No active range yet. `server_side`: try the API server's shard selector first.
    pub fn new(identity: &str, server_side: bool) -> Arc<Self> {
        Arc::new(Shards {
            state: Mutex::default(),
            changed: watch::channel(Ranges::empty()).0,
            identity: identity.to_string(),
            server_side,
            serving: super::serving::Serving::new(identity),
            listeds: Mutex::default(),
        })
    }

    /// What this replica serves, and whether it withdrew (see [`super::serving`]).
    pub fn serving(&self) -> &super::serving::Serving {
        &self.serving
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Whether the API server's shard selector may be used (when it honours it).
    pub fn server_side(&self) -> bool {
        self.server_side
    }

    /// The active ranges.
    pub fn active(&self) -> Ranges {
        self.changed.borrow().clone()
    }

    /// Follows the active ranges.
    pub fn subscribe(&self) -> watch::Receiver<Ranges> {
        self.changed.subscribe()
    }

    /// Makes `ranges` the active ones: reconciles outside them are no longer admitted.
    pub fn set_active(&self, ranges: Ranges) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        if s.active == ranges {
            return;
        }
        s.active = ranges.clone();
        metrics::global().shards().held(&ranges);
        // Synchronously: a range lost and gained again between two of a watch's reports is
        // never taken as still listed.
        if let Ok(mut listeds) = self.listeds.lock() {
            listeds.retain(|l| match l.upgrade() {
                Some(listed) => {
                    listed.active(&ranges);
                    true
                }
                None => false,
            });
        }
        // Under the lock, so a watcher never sees an older value after a newer one.
        self.changed.send_replace(ranges);
    }

    /// Tells `listed` of every change of the active ranges from now on (for as long as it
    /// lives), starting with the current ones.
    pub fn follow(&self, listed: &Arc<super::listed::Listed>) {
        let Ok(s) = self.state.lock() else {
            return;
        };
        listed.active(&s.active);
        if let Ok(mut listeds) = self.listeds.lock() {
            listeds.push(Arc::downgrade(listed));
        }
    }

    /// Records a successful renewal of the member Lease: reconciles may be admitted until
    /// `valid_until` (the renewal's send time plus the renew deadline).
    pub fn renewed(&self, valid_until: Instant) {
        if let Ok(mut s) = self.state.lock() {
            s.valid_until = Some(s.valid_until.map_or(valid_until, |v| v.max(valid_until)));
        }
    }

    /// Admits a reconcile of an object with `hash` if its range is active and the member
    /// Lease is surely still valid.
    ///
    /// # Errors
    /// [`Refused::NotHere`] outside the active ranges; [`Refused::Lapsed`] while no renewal
    /// vouches for the Lease (try again after the next renewal).
    pub fn admit(self: &Arc<Self>, hash: u64) -> Result<Admitted, Refused> {
        let mut s = self.state.lock().map_err(|_| Refused::NotHere)?;
        if !s.active.contains(hash) {
            return Err(Refused::NotHere);
        }
        if s.valid_until.is_none_or(|v| Instant::now() >= v) {
            return Err(Refused::Lapsed);
        }
        *s.running.entry(hash).or_default() += 1;
        Ok(Admitted {
            shards: self.clone(),
            hash,
        })
    }

    /// How many admitted reconciles are still running in `ranges`.
    pub fn running_in(&self, ranges: &Ranges) -> usize {
        self.state
            .lock()
            .map(|s| {
                s.running
                    .iter()
                    .filter(|(h, _)| ranges.contains(**h))
                    .map(|(_, n)| *n)
                    .sum()
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reliability item 5: the fence held only between iterations of the handover loop; a
    /// replica stuck in an API call kept admitting reconciles after its Lease lapsed.
    #[test]
    fn nothing_is_admitted_once_the_lease_may_have_lapsed() {
        let shards = Shards::new("me", false);
        shards.set_active(Ranges::all());
        assert_eq!(
            shards.admit(5).err(),
            Some(Refused::Lapsed),
            "never renewed"
        );
        let now = Instant::now();
        shards.renewed(now + std::time::Duration::from_secs(3600));
        assert!(shards.admit(5).is_ok(), "renewed: admitted");
        let lapsed = Shards::new("me", false);
        lapsed.set_active(Ranges::all());
        lapsed.renewed(now);
        assert_eq!(
            lapsed.admit(5).err(),
            Some(Refused::Lapsed),
            "past the renew deadline"
        );
    }

    #[test]
    fn admission_follows_the_active_ranges_and_counts_running_reconciles() {
        let shards = Shards::new("me", false);
        shards.renewed(Instant::now() + std::time::Duration::from_secs(3600));
        assert_eq!(
            shards.admit(5).err(),
            Some(Refused::NotHere),
            "nothing is active at first"
        );
        let low = Ranges::from_ranges([(0, 100)]);
        shards.set_active(low.clone());
        let a = shards.admit(5).ok();
        assert!(a.is_some());
        assert!(shards.admit(500).is_err());
        assert_eq!(shards.running_in(&low), 1);
        // Deactivated: no new admission, the running one is still counted until it ends.
        shards.set_active(Ranges::empty());
        assert!(shards.admit(6).is_err());
        assert_eq!(shards.running_in(&low), 1);
        drop(a);
        assert_eq!(shards.running_in(&low), 0);
        assert_eq!(*shards.subscribe().borrow(), Ranges::empty());
    }
}
