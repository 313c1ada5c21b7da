//! What the sharded watches of one reconciler have listed: a primary is reconciled only in
//! ranges that every one of its watches (primary, owned, related) has listed since they became
//! active here, and a range that becomes covered reconciles only the primaries in it.
//!
//! At start every watch lists once before anything is reconciled (the controller's sync gate).
//! With sharding the active ranges change at every join and leave, and each watch lists the
//! ranges it gained on its own schedule: without this, a gained primary could be reconciled (or
//! finalized) while its children or related objects were not in the caches yet, and the module
//! would prune or forget them. Each watch reports the ranges it is listing ([`Lister::listing`])
//! and, once its cache holds that list, that it is done ([`Lister::listed`]).
//!
//! # Guarantees
//! - [`Listed::covers`] is true for a hash only if every registered watch has finished a list
//!   that included it and has not started a list without it since.
//! - Every growth of the covered ranges is sent once, as the ranges newly covered (a range lost
//!   and covered again is sent again); shrinking sends nothing. The receiver reconciles the
//!   primaries in them: those gained, never those held all along.
//!
//! # Caveats
//! Watches must be registered ([`Listed::watch`]) before any of them reports, which the
//! controller does while it builds its watches: a watch registered later starts with nothing
//! listed, which only narrows the covered ranges until it lists.

use std::sync::{Arc, Mutex};

use futures::channel::mpsc;

use super::ranges::Ranges;

#[derive(Debug, Default)]
struct State {
    /// Per watch: what it listed and still holds.
    listed: Vec<Ranges>,
    /// Per watch: the ranges of the list it is running, until it is done.
    listing: Vec<Option<Ranges>>,
    /// The intersection of `listed`.
    covered: Ranges,
}

impl State {
    fn recompute(&mut self) -> Ranges {
        let covered = self
            .listed
            .iter()
            .cloned()
            .reduce(|a, b| a.intersection(&b))
            .unwrap_or_default();
        let gained = covered.difference(&self.covered);
        self.covered = covered;
        gained
    }
}

/// The listed ranges of one reconciler's sharded watches.
#[derive(Debug)]
pub struct Listed {
    state: Mutex<State>,
    gained: mpsc::UnboundedSender<Ranges>,
}

/// One watch's handle on [`Listed`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Lister {
    listed: Arc<Listed>,
    index: usize,
}

impl Listed {
    /// Nothing listed yet; each growth of the covered ranges is sent to the returned receiver.
    pub fn new() -> (Arc<Self>, mpsc::UnboundedReceiver<Ranges>) {
        let (gained, rx) = mpsc::unbounded();
        let listed = Listed {
            state: Mutex::default(),
            gained,
        };
        (Arc::new(listed), rx)
    }

    /// Registers one more watch (with nothing listed).
    pub fn watch(self: &Arc<Self>) -> Lister {
        let index = match self.state.lock() {
            Ok(mut s) => {
                s.listed.push(Ranges::empty());
                s.listing.push(None);
                s.covered = Ranges::empty();
                s.listed.len() - 1
            }
            Err(_) => usize::MAX,
        };
        Lister {
            listed: self.clone(),
            index,
        }
    }

    /// The active ranges are now `ranges` (called by [`super::Shards::set_active`], see
    /// [`super::Shards::follow`]): what every watch listed or is listing outside them is no
    /// longer listed, even by a watch that reports nothing (in backoff), so that a range lost
    /// and gained again is covered only once every watch listed it again.
    pub fn active(&self, ranges: &Ranges) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        for i in 0..s.listed.len() {
            s.listed[i] = s.listed[i].intersection(ranges);
            s.listing[i] = s.listing[i].as_ref().map(|l| l.intersection(ranges));
        }
        // Only shrinks: nothing gained to send.
        s.recompute();
    }

    /// Whether every watch has listed `hash`.
    pub fn covers(&self, hash: u64) -> bool {
        self.state
            .lock()
            .is_ok_and(|s| !s.listed.is_empty() && s.covered.contains(hash))
    }

    fn update(&self, index: usize, change: impl FnOnce(&mut State, usize)) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        if index >= s.listed.len() {
            return;
        }
        change(&mut s, index);
        let gained = s.recompute();
        if !gained.is_empty() {
            // Under the lock: growths arrive in order.
            let _ = self.gained.unbounded_send(gained);
        }
    }
}

impl Lister {
    /// The watch starts a list of `ranges` (replacing its cache when done): what it listed
    /// outside them is no longer listed.
    pub fn listing(&self, ranges: &Ranges) {
        let ranges = ranges.clone();
        self.listed.update(self.index, |s, i| {
            s.listed[i] = s.listed[i].intersection(&ranges);
            s.listing[i] = Some(ranges);
        });
    }

    /// The watch's cache now holds its last list.
    pub fn listed(&self) {
        self.listed.update(self.index, |s, i| {
            if let Some(done) = s.listing[i].take() {
                s.listed[i] = done;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review of item 6: a watch in backoff reports nothing while its range is lost and gained
    /// again; what it listed before the loss must not cover the range.
    #[test]
    fn a_range_lost_and_gained_again_is_covered_only_once_listed_again() {
        let shards = super::super::Shards::new("me", false);
        let (listed, _gained) = Listed::new();
        let watch = listed.watch();
        shards.follow(&listed);
        let all = Ranges::all();
        shards.set_active(all.clone());
        watch.listing(&all);
        watch.listed();
        assert!(listed.covers(7));
        shards.set_active(Ranges::empty());
        shards.set_active(all.clone());
        assert!(!listed.covers(7), "lost and gained again: not listed since");
        watch.listing(&all);
        watch.listed();
        assert!(listed.covers(7));
    }

    fn drain(rx: &mut mpsc::UnboundedReceiver<Ranges>) -> Vec<Ranges> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    /// Reliability item 6: a gained range is admitted only once every watch listed it.
    #[test]
    fn a_range_is_covered_only_once_every_watch_listed_it() {
        let (listed, mut gained) = Listed::new();
        let (primary, owned) = (listed.watch(), listed.watch());
        let low = Ranges::from_ranges([(0, 100)]);
        primary.listing(&low);
        owned.listing(&low);
        primary.listed();
        assert!(!listed.covers(5), "the owned watch has not listed yet");
        assert!(drain(&mut gained).is_empty());
        owned.listed();
        assert!(listed.covers(5));
        assert!(!listed.covers(500));
        assert_eq!(drain(&mut gained), vec![low.clone()]);
    }

    /// Reliability item 8: a range change reconciles what was gained, not what was held.
    #[test]
    fn only_the_newly_covered_ranges_are_sent() {
        let (listed, mut gained) = Listed::new();
        let watches = [listed.watch(), listed.watch()];
        let low = Ranges::from_ranges([(0, 100)]);
        let wider = Ranges::from_ranges([(0, 200)]);
        for w in &watches {
            w.listing(&low);
            w.listed();
        }
        drain(&mut gained);
        for w in &watches {
            w.listing(&wider);
        }
        assert!(listed.covers(5), "held ranges stay covered while relisting");
        assert!(!listed.covers(150), "gained, not listed yet");
        for w in &watches {
            w.listed();
        }
        assert!(listed.covers(150));
        assert_eq!(drain(&mut gained), vec![Ranges::from_ranges([(100, 200)])]);
        // Losing a range sends nothing; covering it again sends it again.
        for w in &watches {
            w.listing(&low);
            w.listed();
        }
        assert!(!listed.covers(150));
        assert!(drain(&mut gained).is_empty());
        for w in &watches {
            w.listing(&wider);
            w.listed();
        }
        assert_eq!(drain(&mut gained), vec![Ranges::from_ranges([(100, 200)])]);
    }

    #[test]
    fn nothing_is_covered_without_watches_or_before_a_list() {
        let (listed, _gained) = Listed::new();
        assert!(!listed.covers(5));
        let w = listed.watch();
        w.listing(&Ranges::all());
        assert!(!listed.covers(5));
        w.listed();
        assert!(listed.covers(5));
    }
}
