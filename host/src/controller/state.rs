//! What one reconciler's controller keeps per primary between its reconciles: failures, what
//! triggered the next reconcile, when it is scheduled, what was applied; and freeing it.
//!
//! # Guarantees
//! - The state of a primary that is gone is freed: on its delete event, after a relist that no
//!   longer holds it, and when a reconcile finds it gone or out of scope ([`tracked_objects`]
//!   counts what is left).
//! - A primary forgotten while its reconcile ran stays forgotten: the end of that reconcile
//!   (success, failure, what it applied) brings no state back.
//! - Freeing a primary also frees its pending work-queue entry (the queue metrics) and its
//!   Forbidden report.
//! - A status held back is remembered with the time it was first held ([`States::held_since`]).
//! - Settled inputs ([`States::settled`]) are forgotten on a failure: a retry calls the module.
//!
//! # Caveats
//! [`tracked_objects`] reads a process-wide registry, by reconciler name: two hosts in one
//! process running reconcilers of the same name share an entry.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use kube::runtime::reflector::Store;
use kube::runtime::watcher;

use super::cache::KindTexts;
use super::compact::Compact;
use super::expect::Expected;
use super::health::Health;
use super::{noop, priority};
use crate::contract::Trigger;
use crate::object::ObjectKey;
use crate::operations::metrics::Queue;

/// What the host keeps for one primary.
#[derive(Debug, Default)]
pub(super) struct ObjectState {
    failures: u32,
    last_rv: Option<String>,
    last_module: Option<String>,
    pending: Option<Trigger>,
    scheduled: Option<(Instant, Trigger)>,
    /// What this reconciler's field manager last applied for the primary (see [`noop`]).
    applied: noop::Applied,
    /// Since when the statuses of this primary's reconciles are held back (None: the last
    /// one was not; see [`super::hold`]).
    held_since: Option<Instant>,
    /// The fingerprint of the inputs of the last module call, kept only when that call
    /// succeeded, asked for no requeue and held nothing back: a reconcile with the same
    /// inputs need not call the module (see [`super::inputs`]).
    settled: Option<u64>,
    /// Children the last apply created that the caches had not shown yet (see
    /// [`super::expect`]).
    expected: Option<Expected>,
}

/// The trigger of a reconcile that starts with the object's state `st`, the primary at `rv`
/// and module `module` active: a retry first, then a change of the primary, a noted child or
/// related change, a new module, the scheduled requeue, and else a resync.
pub(super) fn trigger_of(st: &ObjectState, rv: Option<&str>, module: &str) -> Trigger {
    if st.failures > 0 {
        Trigger::Retry
    } else if st.last_rv.as_deref() != rv {
        Trigger::PrimaryChanged
    } else if let Some(p) = &st.pending {
        p.clone()
    } else if st.last_module.as_deref() != Some(module) {
        Trigger::ModuleChanged
    } else if let Some((_, t)) = &st.scheduled {
        t.clone()
    } else {
        Trigger::Resync
    }
}

type Objects = Mutex<HashMap<ObjectKey, ObjectState>>;

/// The per-object state of one reconciler's primaries, with the reports that follow a primary
/// (its work-queue entry, its Forbidden report). Cheap to clone: the clones share the state.
#[derive(Clone)]
pub(super) struct States {
    objects: Arc<Objects>,
    health: Arc<Health>,
    queue: Queue,
}

impl States {
    /// An empty state for reconciler `reconciler`, counted by [`tracked_objects`].
    pub(super) fn new(reconciler: &str, health: Arc<Health>, queue: Queue) -> Self {
        let objects: Arc<Objects> = Arc::default();
        if let Ok(mut t) = tracked().lock() {
            t.retain(|_, w| w.strong_count() > 0);
            t.insert(reconciler.to_string(), Arc::downgrade(&objects));
        }
        States {
            objects,
            health,
            queue,
        }
    }

    /// The reconciler's work-queue metrics.
    pub(super) fn queue(&self) -> &Queue {
        &self.queue
    }

    /// Counts a request for a reconcile of `key` (the queue metrics).
    pub(super) fn requested(&self, key: &ObjectKey) {
        self.queue.requested(key.to_string());
    }

    /// Notes what asks for the next reconcile of `key`, unless something already did.
    pub(super) fn note_trigger(&self, key: ObjectKey, trigger: Trigger) {
        if let Ok(mut objects) = self.objects.lock() {
            objects
                .entry(key)
                .or_default()
                .pending
                .get_or_insert(trigger);
        }
    }

    /// The lane a reconcile of `key` (at `rv`, module `module` active) waits in: what
    /// [`States::begin`] would pick now, without recording anything.
    pub(super) fn lane(&self, key: &ObjectKey, rv: Option<&str>, module: &str) -> priority::Lane {
        let default = ObjectState::default();
        let Ok(objects) = self.objects.lock() else {
            return priority::Lane::Reactive;
        };
        let st = objects.get(key).unwrap_or(&default);
        priority::Lane::of(&trigger_of(st, rv, module))
    }

    /// Picks the trigger and attempt number of a reconcile that starts now, and records that it
    /// started.
    pub(super) fn begin(&self, key: &ObjectKey, rv: Option<&str>, module: &str) -> (Trigger, u32) {
        let Ok(mut objects) = self.objects.lock() else {
            return (Trigger::PrimaryChanged, 1);
        };
        let st = objects.entry(key.clone()).or_default();
        let attempt = st.failures + 1;
        let trigger = trigger_of(st, rv, module);
        st.pending = None;
        st.scheduled = None;
        st.last_rv = rv.map(str::to_string);
        st.last_module = Some(module.to_string());
        (trigger, attempt)
    }

    /// What this reconciler last applied for `key` (empty when nothing is remembered).
    pub(super) fn applied(&self, key: &ObjectKey) -> noop::Applied {
        self.objects
            .lock()
            .ok()
            .and_then(|o| o.get(key).map(|st| st.applied.clone()))
            .unwrap_or_default()
    }

    /// Since when the statuses of `key` are held back (None: the last was not).
    pub(super) fn held_since(&self, key: &ObjectKey) -> Option<Instant> {
        self.objects
            .lock()
            .ok()
            .and_then(|o| o.get(key).and_then(|st| st.held_since))
    }

    /// Records whether the last reconcile of `key` held its status back (the first of a
    /// series keeps its time).
    pub(super) fn status_held(&self, key: &ObjectKey, held: bool) {
        if let Ok(mut objects) = self.objects.lock()
            && let Some(st) = objects.get_mut(key)
        {
            st.held_since = if held {
                st.held_since.or_else(|| Some(Instant::now()))
            } else {
                None
            };
        }
    }

    /// Whether the module's last call for `key` had exactly the inputs `fingerprint` and left
    /// nothing to do (see [`ObjectState::settled`]).
    pub(super) fn settled(&self, key: &ObjectKey, fingerprint: u64) -> bool {
        self.objects
            .lock()
            .ok()
            .is_some_and(|o| o.get(key).is_some_and(|st| st.settled == Some(fingerprint)))
    }

    /// Records the inputs of a call for `key` that left nothing to do (Some), or that the last
    /// call did not (None).
    pub(super) fn settle(&self, key: &ObjectKey, fingerprint: Option<u64>) {
        if let Ok(mut objects) = self.objects.lock()
            && let Some(st) = objects.get_mut(key)
        {
            st.settled = fingerprint;
        }
    }

    /// Remembers what is now applied for `key` (not for a primary forgotten meanwhile).
    pub(super) fn remember(&self, key: &ObjectKey, applied: noop::Applied) {
        if let Ok(mut objects) = self.objects.lock()
            && let Some(st) = objects.get_mut(key)
        {
            st.applied = applied;
        }
    }

    /// Records the children the last apply of `key` created (see [`super::expect`]).
    pub(super) fn expect(&self, key: &ObjectKey, expected: Option<Expected>) {
        if let Ok(mut objects) = self.objects.lock()
            && let Some(st) = objects.get_mut(key)
        {
            st.expected = expected;
        }
    }

    /// How long a reconcile of `key` at `now` still waits for children the last one created
    /// (None: go on; the expectation is then dropped).
    pub(super) fn awaiting(
        &self,
        key: &ObjectKey,
        cached: &[KindTexts],
        now: Instant,
    ) -> Option<Duration> {
        let mut objects = self.objects.lock().ok()?;
        let st = objects.get_mut(key)?;
        let wait = st.expected.as_ref()?.wait(cached, now);
        if wait.is_none() {
            st.expected = None;
        }
        wait
    }

    /// Records a successful reconcile of `key`, the next one due after `next`.
    pub(super) fn succeeded(&self, key: &ObjectKey, next: (Duration, Trigger)) {
        // `get_mut`: a primary deleted meanwhile was forgotten and stays so.
        if let Ok(mut objects) = self.objects.lock()
            && let Some(st) = objects.get_mut(key)
        {
            st.failures = 0;
            let (after, trigger) = next;
            st.scheduled = Instant::now().checked_add(after).map(|at| (at, trigger));
        }
    }

    /// Records a failed reconcile of `key`; returns its failures in a row.
    pub(super) fn failed(&self, key: &ObjectKey) -> u32 {
        match self.objects.lock() {
            Ok(mut objects) => match objects.get_mut(key) {
                Some(st) => {
                    st.settled = None;
                    st.failures = st.failures.saturating_add(1);
                    st.failures
                }
                // Forgotten meanwhile (deleted): a retry finds it gone.
                None => 1,
            },
            Err(_) => 1,
        }
    }

    /// Reports (Some) or clears (None) a Forbidden write of `key` to the manager.
    pub(super) fn set_forbidden(&self, key: &ObjectKey, message: Option<String>) {
        let name = key.to_string();
        let changed = match self.health.forbidden.lock() {
            Ok(mut f) => match message {
                Some(m) => f.insert(name, m.clone()).as_ref() != Some(&m),
                None => f.remove(&name).is_some(),
            },
            Err(_) => false,
        };
        if changed {
            self.health.changed.notify_one();
        }
    }

    /// Frees everything the host keeps per primary `key`: its state, its pending work-queue
    /// entry and its Forbidden report.
    pub(super) fn forget(&self, key: &ObjectKey) {
        if let Ok(mut objects) = self.objects.lock() {
            objects.remove(key);
        }
        self.queue.started(&key.to_string());
        let changed = self
            .health
            .forbidden
            .lock()
            .is_ok_and(|mut f| f.remove(&key.to_string()).is_some());
        if changed {
            self.health.changed.notify_one();
        }
    }

    /// Frees the state of primaries that are gone: deleted ones, and after a (re)list, every one
    /// the list (now in `primaries`) no longer holds (deleted while the watch was down).
    pub(super) fn forget_gone(
        &self,
        event: &Result<watcher::Event<Compact>, watcher::Error>,
        primaries: &Store<Compact>,
    ) {
        match event {
            Ok(watcher::Event::Delete(o)) => self.forget(&ObjectKey::of(o)),
            Ok(watcher::Event::InitDone) => {
                let present: HashSet<ObjectKey> = primaries
                    .state()
                    .iter()
                    .map(|p| ObjectKey::of(&**p))
                    .collect();
                let gone: Vec<ObjectKey> = self
                    .objects
                    .lock()
                    .map(|m| {
                        m.keys()
                            .filter(|k| !present.contains(*k))
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                for key in gone {
                    self.forget(&key);
                }
            }
            _ => {}
        }
    }
}

/// The per-object state of every running controller, by reconciler name (see
/// [`tracked_objects`]).
type Tracked = Mutex<HashMap<String, Weak<Objects>>>;

fn tracked() -> &'static Tracked {
    static TRACKED: OnceLock<Tracked> = OnceLock::new();
    TRACKED.get_or_init(Tracked::default)
}

/// How many primaries reconciler `name`'s running controller keeps state for (None when it
/// is not running). For diagnostics and tests: it returns to 0 once every primary is gone.
pub fn tracked_objects(name: &str) -> Option<usize> {
    let map = tracked().lock().ok()?;
    let objects = map.get(name)?.upgrade()?;
    let n = objects.lock().ok()?.len();
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::ObjectRef;

    fn child() -> Trigger {
        Trigger::ChildChanged(ObjectRef {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("ns".into()),
            name: "c".into(),
        })
    }

    fn seen(rv: &str, module: &str) -> ObjectState {
        ObjectState {
            last_rv: Some(rv.into()),
            last_module: Some(module.into()),
            ..ObjectState::default()
        }
    }

    #[test]
    fn a_first_reconcile_is_a_primary_change() {
        let st = ObjectState::default();
        assert_eq!(trigger_of(&st, Some("1"), "m"), Trigger::PrimaryChanged);
    }

    #[test]
    fn a_retry_comes_before_everything_else() {
        let st = ObjectState {
            failures: 2,
            pending: Some(child()),
            ..ObjectState::default()
        };
        assert_eq!(trigger_of(&st, Some("2"), "other"), Trigger::Retry);
    }

    #[test]
    fn a_noted_change_comes_before_a_new_module_and_the_schedule() {
        let mut st = seen("1", "m");
        st.pending = Some(child());
        st.scheduled = Some((Instant::now(), Trigger::Requeue));
        assert_eq!(trigger_of(&st, Some("1"), "new"), child());
        st.pending = None;
        assert_eq!(trigger_of(&st, Some("1"), "new"), Trigger::ModuleChanged);
        assert_eq!(trigger_of(&st, Some("1"), "m"), Trigger::Requeue);
    }

    #[test]
    fn a_held_status_keeps_the_time_it_was_first_held() {
        let states = States::new(
            "state-test-deferred",
            Arc::new(Health::default()),
            crate::operations::metrics::global().queue("state-test-deferred"),
        );
        let key = ObjectKey::new(Some("ns".into()), "p");
        states.begin(&key, Some("1"), "m");
        assert_eq!(states.held_since(&key), None);
        states.status_held(&key, true);
        let first = states.held_since(&key);
        assert!(first.is_some());
        states.status_held(&key, true);
        assert_eq!(states.held_since(&key), first, "the first hold counts");
        states.status_held(&key, false);
        assert_eq!(states.held_since(&key), None);
    }

    #[test]
    fn settled_inputs_are_forgotten_on_a_failure() {
        let states = States::new(
            "state-test-settled",
            Arc::new(Health::default()),
            crate::operations::metrics::global().queue("state-test-settled"),
        );
        let key = ObjectKey::new(Some("ns".into()), "p");
        states.begin(&key, Some("1"), "m");
        states.settle(&key, Some(7));
        assert!(states.settled(&key, 7));
        assert!(!states.settled(&key, 8));
        states.failed(&key);
        assert!(!states.settled(&key, 7), "a retry calls the module");
    }

    #[test]
    fn nothing_new_is_a_resync() {
        assert_eq!(trigger_of(&seen("1", "m"), Some("1"), "m"), Trigger::Resync);
    }

    #[test]
    fn a_forgotten_primary_stays_forgotten() {
        let states = States::new(
            "state-test-forgotten",
            Arc::new(Health::default()),
            crate::operations::metrics::global().queue("state-test-forgotten"),
        );
        let key = ObjectKey::new(Some("ns".into()), "p");
        let (trigger, attempt) = states.begin(&key, Some("1"), "m");
        assert_eq!((trigger, attempt), (Trigger::PrimaryChanged, 1));
        assert_eq!(tracked_objects("state-test-forgotten"), Some(1));
        states.forget(&key);
        states.succeeded(&key, (Duration::from_secs(1), Trigger::Requeue));
        states.remember(&key, noop::Applied::default());
        assert_eq!(states.failed(&key), 1);
        assert_eq!(tracked_objects("state-test-forgotten"), Some(0));
    }

    #[test]
    fn failures_count_until_a_success() {
        let states = States::new(
            "state-test-failures",
            Arc::new(Health::default()),
            crate::operations::metrics::global().queue("state-test-failures"),
        );
        let key = ObjectKey::new(None, "p");
        states.begin(&key, Some("1"), "m");
        assert_eq!(states.failed(&key), 1);
        assert_eq!(states.failed(&key), 2);
        assert_eq!(states.begin(&key, Some("1"), "m"), (Trigger::Retry, 3));
        states.succeeded(&key, (Duration::from_secs(60), Trigger::Requeue));
        assert_eq!(states.begin(&key, Some("1"), "m"), (Trigger::Requeue, 1));
    }
}
