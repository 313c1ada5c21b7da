//! When a primary is reconciled again without any change: the resync period, jittered.
//!
//! Every primary that reconciled successfully is requeued after the resync period. Without
//! jitter, primaries listed together at start (or re-reconciled together after a module swap)
//! would resync together, in one burst per period, forever. Each delay is drawn uniformly from
//! `[period - 10%, period]`, so bursts spread out over a few periods and stay spread.
//!
//! # Guarantees
//! - A resync never comes later than the configured period (the period stays an upper bound of
//!   how long a missed event can go unnoticed), and never earlier than 90% of it.
//!
//! # Errors
//! Nothing here fails.

use std::time::Duration;

/// The share of the period by which a resync may come early.
pub const JITTER: f64 = 0.1;

/// The delay of the next resync for a period of `period`: uniform in
/// `[period * (1 - JITTER), period]`.
pub fn jittered(period: Duration) -> Duration {
    jittered_with(period, fastrand::f64())
}

/// [`jittered`] with the random draw `unit` in `[0, 1)` given.
pub fn jittered_with(period: Duration, unit: f64) -> Duration {
    let early = period.mul_f64(JITTER * unit.clamp(0.0, 1.0));
    period.saturating_sub(early)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resync_comes_within_the_last_tenth_of_the_period() {
        let period = Duration::from_secs(600);
        assert_eq!(jittered_with(period, 0.0), period);
        assert_eq!(jittered_with(period, 1.0), Duration::from_secs(540));
        for _ in 0..1000 {
            let d = jittered(period);
            assert!(
                d <= period && d >= Duration::from_secs(540),
                "{d:?} outside [540s, 600s]"
            );
        }
    }

    #[test]
    fn resyncs_of_many_primaries_spread_over_the_window() {
        let period = Duration::from_secs(600);
        // 1,000 primaries listed together: their resyncs fall into all ten 6 s slots of the
        // 60 s window, none holding more than a fifth of them.
        let mut slots = [0usize; 10];
        for _ in 0..1000 {
            let early = period - jittered(period);
            let slot = (early.as_secs_f64() / 6.0) as usize;
            slots[slot.min(9)] += 1;
        }
        assert!(
            slots.iter().all(|n| *n > 0 && *n < 200),
            "resyncs bunch up: {slots:?}"
        );
    }
}
