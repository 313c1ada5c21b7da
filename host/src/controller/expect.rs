//! Children a reconcile created that the watch caches have not shown yet: the next reconcile
//! of their primary waits for them (controller-runtime's "expectations"), so the module is
//! never called on a view that lacks what the host itself has just written.
//!
//! Without the wait, a reconcile triggered by the first created child's event (the Deployment)
//! could run before the watch of another (the Service) had delivered it: the module asked for
//! the Service again, its create-only apply met 409, the holder was read and the Service applied
//! again, three requests for nothing (seen under load by e2e
//! `scale::converging_apps_reads_nothing_and_writes_each_child_once`: 22 Service applies and a
//! GET for 20 Apps).
//!
//! # Guarantees
//! - A reconcile waits only for children whose creation by the last apply succeeded, and at
//!   most [`EXPECT_FOR`] after it: a watch event that never comes costs a delay, never a stuck
//!   primary. The child's own creation event ends the wait (it triggers the next reconcile).
//! - `finalize` never waits (see [`super::reconcile`]).
//!
//! # Caveats
//! - A child deleted by someone else before the cache ever showed it is waited for until
//!   [`EXPECT_FOR`] has passed, then recreated.

use std::time::{Duration, Instant};

use super::cache::KindTexts;
use super::noop::Target;

/// The longest a reconcile waits for the children the previous one created.
pub const EXPECT_FOR: Duration = Duration::from_secs(30);

/// Children created by a primary's last apply, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    since: Instant,
    children: Vec<Target>,
}

impl Expected {
    /// The expectation of `children` created at `now` (None when none was created).
    pub fn new(children: Vec<Target>, now: Instant) -> Option<Expected> {
        (!children.is_empty()).then_some(Expected {
            since: now,
            children,
        })
    }

    /// How much longer a reconcile at `now` should wait: None when `cached` (the primary's
    /// children in the caches) holds every expected child, or the wait is over.
    pub fn wait(&self, cached: &[KindTexts], now: Instant) -> Option<Duration> {
        let left = EXPECT_FOR.checked_sub(now.saturating_duration_since(self.since))?;
        let missing = self.children.iter().any(|child| !holds(cached, child));
        (missing && !left.is_zero()).then_some(left)
    }
}

/// Whether `cached` holds `child`.
fn holds(cached: &[KindTexts], (kind, namespace, name): &Target) -> bool {
    cached
        .iter()
        .filter(|c| &c.kind == kind)
        .flat_map(|c| &c.objects)
        .any(|(key, _)| &key.name == name && &key.namespace == namespace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Gvk;
    use crate::object::ObjectKey;

    fn target(kind: &str, name: &str) -> Target {
        (Gvk::new("v1", kind), Some("ns".into()), name.into())
    }

    fn observed(children: &[(&str, &str)]) -> Vec<KindTexts> {
        children
            .iter()
            .map(|(kind, name)| KindTexts {
                kind: Gvk::new("v1", *kind),
                objects: vec![(ObjectKey::new(Some("ns".into()), *name), "{}".into())],
            })
            .collect()
    }

    #[test]
    fn a_reconcile_waits_until_the_caches_show_every_child_the_last_one_created() {
        let t0 = Instant::now();
        let created = vec![target("Deployment", "web"), target("Service", "web")];
        let expected = Expected::new(created, t0).unwrap_or_else(|| panic!("children created"));
        let later = t0 + Duration::from_secs(1);
        // The Deployment's event came first: the Service is not in its cache yet.
        assert_eq!(
            expected.wait(&observed(&[("Deployment", "web")]), later),
            Some(EXPECT_FOR - Duration::from_secs(1))
        );
        // Another name or kind is not the expected child.
        let others = observed(&[("Deployment", "web"), ("Service", "db"), ("Secret", "web")]);
        assert!(expected.wait(&others, later).is_some());
        let both = observed(&[("Deployment", "web"), ("Service", "web")]);
        assert_eq!(expected.wait(&both, later), None);
    }

    #[test]
    fn the_wait_ends_after_its_bound_and_nothing_created_expects_nothing() {
        let t0 = Instant::now();
        let expected = Expected::new(vec![target("Service", "web")], t0)
            .unwrap_or_else(|| panic!("children created"));
        assert_eq!(expected.wait(&[], t0 + EXPECT_FOR), None);
        assert_eq!(expected.wait(&[], t0 + EXPECT_FOR * 2), None);
        assert_eq!(Expected::new(Vec::new(), t0), None);
    }
}
