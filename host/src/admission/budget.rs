//! The admission server's memory budget: the bytes of review bodies held at once, over every
//! connection (`--webhook-max-review-bytes`).
//!
//! A review reserves its body's bytes before the body is read (its `Content-Length`, or a
//! [`STEP`] at a time for a body without one) and keeps them until it is answered; the body is
//! read only into what was reserved.
//!
//! # Guarantees
//! - The bytes reserved over all reviews never exceed the budget. A reservation that cannot be
//!   had within the wait the caller allows is refused, never queued without bound.
//! - A reservation returns to the budget when it is dropped: the review answered, failed, timed
//!   out or its connection gone.
//!
//! # Caveats
//! - A body without `Content-Length` is read a frame at a time: the frame that overruns its
//!   reservation is already in memory when the reservation fails to grow (one frame, at most
//!   hyper's read buffer).
//! - It counts bodies. What a review costs besides (its object's text handed to the module, the
//!   module's own memory, capped by `spec.limits.memory`) is not in it.

use tokio::sync::{Semaphore, SemaphorePermit};

/// The default budget: 64 MiB of review bodies at once.
pub const DEFAULT_BYTES: usize = 64 << 20;

/// How much a body without `Content-Length` reserves at a time.
pub const STEP: usize = 1 << 20;

/// Bytes of review bodies that may be held at once.
#[derive(Debug)]
pub struct ByteBudget {
    permits: Semaphore,
    total: usize,
}

/// Bytes reserved for one review; returned when dropped.
#[derive(Debug)]
pub struct Reservation<'a> {
    budget: &'a ByteBudget,
    permit: SemaphorePermit<'a>,
}

impl ByteBudget {
    /// A budget of `bytes` (at least 1, at most 4 GiB - 1).
    pub fn new(bytes: usize) -> Self {
        let total = bytes.clamp(1, u32::MAX as usize);
        ByteBudget {
            permits: Semaphore::new(total),
            total,
        }
    }

    /// The whole budget.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The bytes not reserved now.
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }

    /// Reserves `bytes`, waiting for them as long as the caller waits; `None` when they exceed
    /// the whole budget (they never could be had).
    pub async fn reserve(&self, bytes: usize) -> Option<Reservation<'_>> {
        let n = u32::try_from(bytes)
            .ok()
            .filter(|n| *n as usize <= self.total)?;
        let permit = self.permits.acquire_many(n).await.ok()?;
        Some(Reservation {
            budget: self,
            permit,
        })
    }
}

impl Reservation<'_> {
    /// The bytes reserved.
    pub fn bytes(&self) -> usize {
        self.permit.num_permits()
    }

    /// Reserves `more` bytes if they are free now; false otherwise (the reservation is unchanged).
    pub fn grow(&mut self, more: usize) -> bool {
        let Ok(n) = u32::try_from(more) else {
            return false;
        };
        match self.budget.permits.try_acquire_many(n) {
            Ok(p) => {
                self.permit.merge(p);
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reservations_never_exceed_the_budget_and_return_when_dropped() {
        let budget = ByteBudget::new(10);
        let Some(mut a) = budget.reserve(6).await else {
            panic!("6 of 10 bytes")
        };
        assert!(budget.reserve(11).await.is_none(), "more than the budget");
        assert!(!a.grow(5), "6 + 5 > 10");
        assert!(a.grow(4));
        assert_eq!((a.bytes(), budget.available()), (10, 0));
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(1), budget.reserve(1));
        assert!(waiting.await.is_err(), "nothing is free");
        drop(a);
        assert_eq!(budget.available(), 10);
    }
}
