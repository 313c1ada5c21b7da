//! Status writes held back while a primary is in flux (issue 27).
//!
//! A reconcile's status is the module's view at that moment. While children are being created
//! or rolled out, the next reconcile comes within seconds and computes a newer status; writing
//! each in-between view costs a request for a value that is overwritten at once. So a status
//! that would be written may be held back ([`StatusHold`]):
//! - once in a row, when the reconcile created children: their creation events call for the
//!   next reconcile, which sees them;
//! - while the module is in flux: it asked to look again sooner than the resync (its
//!   requeue-after), and the first status held back is younger than the debounce
//!   (`--status-debounce`). The next reconcile is then due by the end of the debounce at the
//!   latest ([`due_within`]), and it writes whatever it computes.
//!
//! # Guarantees
//! - A held status is never written later: every reconcile computes its own, and the first one
//!   not held writes it. With a debounce, a reconcile that writes comes at most the debounce
//!   after the first status held back (the host shortens the next schedule to that deadline);
//!   a status computed with no requeue (the module sees nothing left to do) is never held for
//!   being in flux.
//! - A status that acknowledges a new generation of a primary that already had a status (its
//!   `observedGeneration` moves) is written at once: a spec change is acknowledged without
//!   delay.
//! - `finalize` never holds a status.
//!
//! # Caveats
//! A module that keeps its own progress in its status and advances it on each requeue sees
//! the status it last wrote, so while in flux it advances at most once per debounce;
//! `--status-debounce 0` writes every status at once (a status is then held only after
//! children were created, as before).

use std::time::{Duration, Instant};

use serde_json::Value;

/// `--status-debounce`'s default.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_secs(5);

/// What a reconcile may hold back of the status it computed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatusHold {
    /// Held when this reconcile created children.
    pub if_created: bool,
    /// Held whatever it wrote: the module is in flux within the debounce.
    pub in_flux: bool,
}

impl StatusHold {
    /// Never hold the status.
    pub const NEVER: StatusHold = StatusHold {
        if_created: false,
        in_flux: false,
    };

    /// What a `reconcile` (not a `finalize`) may hold back, its status held since
    /// `held_since` (None: the last status was not held), the module asking for a requeue
    /// after `requeue`, with resync `resync` and debounce `debounce`, at `now`.
    pub fn of(
        held_since: Option<Instant>,
        requeue: Option<Duration>,
        (resync, debounce): (Duration, Duration),
        now: Instant,
    ) -> StatusHold {
        let young = held_since.is_none_or(|since| now.saturating_duration_since(since) < debounce);
        StatusHold {
            if_created: held_since.is_none(),
            in_flux: !debounce.is_zero() && young && requeue.is_some_and(|d| d < resync),
        }
    }

    /// Whether a status that would change the primary's is held back: `created` when this
    /// apply created children; `previous` is the primary's status, `generation` its generation.
    pub fn holds(&self, created: bool, previous: Option<&Value>, generation: i64) -> bool {
        (self.in_flux || (self.if_created && created)) && !acknowledges(previous, generation)
    }
}

/// Whether writing a status at `generation` moves the `observedGeneration` of an existing one.
fn acknowledges(previous: Option<&Value>, generation: i64) -> bool {
    previous
        .and_then(|s| s.get("observedGeneration"))
        .and_then(Value::as_i64)
        .is_some_and(|g| g != generation)
}

/// When the next reconcile is due at the latest after a status held since `since`, with
/// debounce `debounce`, at `now` (None without a debounce: the children's events call for it).
pub fn due_within(since: Instant, debounce: Duration, now: Instant) -> Option<Duration> {
    if debounce.is_zero() {
        return None;
    }
    let left = (since + debounce).saturating_duration_since(now);
    // Not in a tight loop: the reconcile that comes at the deadline writes.
    Some(left.max(Duration::from_millis(100)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const RESYNC: Duration = Duration::from_secs(600);
    const DEBOUNCE: Duration = Duration::from_secs(5);

    #[test]
    fn a_new_status_is_held_once_after_children_were_created() {
        let now = Instant::now();
        let first = StatusHold::of(None, None, (RESYNC, DEBOUNCE), now);
        assert!(first.holds(true, None, 1));
        assert!(
            !first.holds(false, None, 1),
            "nothing created, nothing to wait for"
        );
        let second = StatusHold::of(Some(now), None, (RESYNC, DEBOUNCE), now);
        assert!(!second.holds(true, None, 1), "not twice in a row");
    }

    #[test]
    fn a_status_in_flux_waits_for_the_debounce_at_most() {
        let since = Instant::now();
        let requeue = Some(Duration::from_secs(5));
        let at = |secs| since + Duration::from_secs(secs);
        assert!(StatusHold::of(None, requeue, (RESYNC, DEBOUNCE), since).holds(false, None, 1));
        assert!(
            StatusHold::of(Some(since), requeue, (RESYNC, DEBOUNCE), at(4)).holds(false, None, 1)
        );
        assert!(
            !StatusHold::of(Some(since), requeue, (RESYNC, DEBOUNCE), at(5)).holds(false, None, 1),
            "the debounce is over: written"
        );
        assert_eq!(
            due_within(since, DEBOUNCE, at(1)),
            Some(Duration::from_secs(4))
        );
        assert_eq!(
            due_within(since, DEBOUNCE, at(9)),
            Some(Duration::from_millis(100))
        );
    }

    #[test]
    fn a_settled_status_a_new_generation_and_no_debounce_are_written_at_once() {
        let now = Instant::now();
        let settled = StatusHold::of(None, None, (RESYNC, DEBOUNCE), now);
        assert!(
            !settled.holds(false, None, 1),
            "no requeue: nothing in flux"
        );
        let far = StatusHold::of(None, Some(RESYNC), (RESYNC, DEBOUNCE), now);
        assert!(
            !far.holds(false, None, 1),
            "a requeue no sooner than the resync"
        );
        let flux = StatusHold::of(None, Some(Duration::from_secs(1)), (RESYNC, DEBOUNCE), now);
        let old = json!({"observedGeneration": 1, "phase": "Ready"});
        assert!(flux.holds(false, Some(&old), 1));
        assert!(
            !flux.holds(false, Some(&old), 2),
            "generation 2 is acknowledged at once"
        );
        let off = StatusHold::of(
            None,
            Some(Duration::from_secs(1)),
            (RESYNC, Duration::ZERO),
            now,
        );
        assert!(!off.holds(false, None, 1));
        assert_eq!(due_within(now, Duration::ZERO, now), None);
        assert!(StatusHold::NEVER == StatusHold::default());
    }
}
