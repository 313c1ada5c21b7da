//! What each replica can serve: the WasmReconcilers it has set up and those whose set-up failed
//! on it, published in its member Lease. A replica that cannot set up a reconciler that a
//! healthy member serves (a registry unreachable from its node, a memory budget too small for
//! the reconciler's limits) **withdraws**: it takes no ranges, so the others serve every
//! primary instead of ~1/k of them going unserved, and it writes no failure into a status the
//! others report Ready. It rejoins once every reconciler is set up on it.
//!
//! # Guarantees
//! - A replica withdraws only while every reconciler failing on it is served by another live
//!   member that has not withdrawn and on which nothing fails (a healthy member). A healthy
//!   member never withdraws, so withdrawals never leave the group without a server while one
//!   healthy member lives; a failure on every replica (a broken module, a registry down for
//!   all) withdraws nobody and is reported as before.
//! - What is published is bounded: at most [`MAX_LIST_BYTES`] per list. A `serves` list over it
//!   is cut (others then count fewer reconcilers as served: fewer withdrawals), a `failing` list
//!   over it is published as [`UNKNOWN`] (the member is not healthy). Lists read from others are
//!   bounded the same way; an unreadable one counts as serving nothing and failing something.
//!
//! # Caveats
//! Two replicas each failing a different reconciler, with no healthy member, both keep their
//! ranges (neither is healthy): their failing reconcilers' primaries in their ranges wait.
//!
//! # Errors
//! Nothing here fails; a poisoned lock reports nothing served and withdraws nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

/// The annotation listing the reconcilers a member serves (comma-separated names).
pub const SERVES_ANNOTATION: &str = "wasmop.dev/shard-serves";
/// The annotation listing the reconcilers whose set-up failed on a member.
pub const FAILING_ANNOTATION: &str = "wasmop.dev/shard-failing";
/// The annotation a withdrawn member carries (`"true"`): it takes no ranges.
pub const WITHDRAWN_ANNOTATION: &str = "wasmop.dev/shard-withdrawn";
/// The most bytes of one published list.
pub const MAX_LIST_BYTES: usize = 64 * 1024;
/// A `failing` list too long to publish: the member fails something.
pub const UNKNOWN: &str = "*";

/// What one member reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Reconcilers set up and serving.
    pub serves: BTreeSet<String>,
    /// Reconcilers whose set-up failed.
    pub failing: BTreeSet<String>,
    /// Whether the member takes no ranges.
    pub withdrawn: bool,
}

impl Report {
    /// Whether nothing fails on the member.
    pub fn healthy(&self) -> bool {
        self.failing.is_empty()
    }

    /// The annotations that publish this report.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        let (serves, _) = joined_within(&self.serves, MAX_LIST_BYTES);
        let failing = match joined_within(&self.failing, MAX_LIST_BYTES) {
            (f, n) if n == self.failing.len() => f,
            _ => UNKNOWN.into(),
        };
        BTreeMap::from([
            (SERVES_ANNOTATION.to_string(), serves),
            (FAILING_ANNOTATION.to_string(), failing),
            (WITHDRAWN_ANNOTATION.to_string(), self.withdrawn.to_string()),
        ])
    }

    /// The report a member's Lease annotations publish (see the module's guarantees).
    pub fn read(annotations: &BTreeMap<String, String>) -> Report {
        let list = |key: &str| -> Option<BTreeSet<String>> {
            let text = annotations.get(key).map_or("", String::as_str);
            (text.len() <= MAX_LIST_BYTES).then(|| {
                text.split(',')
                    .filter(|n| !n.is_empty())
                    .map(str::to_string)
                    .collect()
            })
        };
        let unreadable = BTreeSet::from([UNKNOWN.to_string()]);
        Report {
            serves: list(SERVES_ANNOTATION).unwrap_or_default(),
            failing: list(FAILING_ANNOTATION).unwrap_or(unreadable),
            withdrawn: annotations.get(WITHDRAWN_ANNOTATION).map(String::as_str) == Some("true"),
        }
    }
}

/// `names`, comma-separated, with as many whole names as fit in `max` bytes, and how many.
fn joined_within(names: &BTreeSet<String>, max: usize) -> (String, usize) {
    let mut out = String::new();
    let mut count = 0;
    for name in names {
        let extra = name.len() + usize::from(!out.is_empty());
        if out.len() + extra > max {
            break;
        }
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(name);
        count += 1;
    }
    (out, count)
}

#[derive(Debug, Default)]
struct State {
    mine: Report,
    /// What the live members other than this one that have not withdrawn report, by identity.
    others: Vec<(String, Report)>,
    /// Whether the others' reports were read at least once.
    judged: bool,
}

/// This replica's report, and what it knows of the others'.
#[derive(Debug, Default)]
pub struct Serving {
    /// This replica's identity (its member Lease's holder).
    identity: String,
    state: Mutex<State>,
}

impl Serving {
    /// Nothing served yet, for the member `identity`.
    pub fn new(identity: &str) -> Self {
        Serving {
            identity: identity.to_string(),
            state: Mutex::default(),
        }
    }

    /// Reconciler `name` is set up and serving here.
    pub fn serves(&self, name: &str) {
        self.update(|s| {
            s.mine.failing.remove(name);
            s.mine.serves.insert(name.to_string());
        });
    }

    /// Reconciler `name` could not be set up here.
    pub fn fails(&self, name: &str) {
        self.update(|s| {
            s.mine.serves.remove(name);
            s.mine.failing.insert(name.to_string());
        });
    }

    /// Reconciler `name` is no longer supervised here.
    pub fn forget(&self, name: &str) {
        self.update(|s| {
            s.mine.serves.remove(name);
            s.mine.failing.remove(name);
        });
    }

    fn update(&self, change: impl FnOnce(&mut State)) {
        if let Ok(mut s) = self.state.lock() {
            change(&mut s);
        }
    }

    /// Takes the others' reports (live members other than this one) and decides whether this
    /// replica withdraws; returns the report to publish.
    pub fn judge(&self, others: Vec<(String, Report)>) -> Report {
        let Ok(mut s) = self.state.lock() else {
            return Report::default();
        };
        s.others = others.into_iter().filter(|(_, o)| !o.withdrawn).collect();
        s.judged = true;
        let withdraw = !s.mine.failing.is_empty()
            && s.mine
                .failing
                .iter()
                .all(|n| served_by_healthy(&s.others, n));
        if withdraw != s.mine.withdrawn {
            tracing::info!(withdraw, failing = ?s.mine.failing, "shard membership: {}", if withdraw {
                "reconcilers failing here are served by a healthy member: withdrawing this replica's share"
            } else {
                "rejoining: every reconciler is set up here, or one failing here has no other server"
            });
        }
        s.mine.withdrawn = withdraw;
        s.mine.clone()
    }

    /// This replica's report as last judged.
    pub fn report(&self) -> Report {
        self.state
            .lock()
            .map(|s| s.mine.clone())
            .unwrap_or_default()
    }

    /// Whether this replica withdrew while a healthy member other than this one serves
    /// reconciler `name` (its failure here is then this replica's alone: not reported in the
    /// shared status); false when every other member that did not withdraw fails it too (or
    /// there is none). None while that is not known: before the others' reports were read
    /// once, while one of them reports neither serving nor failing it (still setting it up),
    /// or while a healthy member serves it but this replica has not withdrawn yet (the next
    /// judgement decides).
    pub fn served_elsewhere(&self, name: &str) -> Option<bool> {
        let s = self.state.lock().ok()?;
        if !s.judged {
            return None;
        }
        if served_by_healthy(&s.others, name) {
            return s.mine.withdrawn.then_some(true);
        }
        let undecided = s.others.iter().any(|(_, o)| {
            !o.serves.contains(name) && !o.failing.contains(name) && !o.failing.contains(UNKNOWN)
        });
        (!undecided).then_some(false)
    }

    /// Whether this replica takes the group's decisions about reconciler `name`'s module
    /// (swaps and the host's copy): it serves `name`, and no member that did not withdraw and
    /// serves `name` too has a smaller identity. A withdrawn replica decides only while no
    /// other member serves `name`. The others follow what the decider records in the status.
    ///
    /// Caveats: before the others' reports were read once, every replica decides (as a
    /// replica alone does); two replicas may then decide the same change, each recording the
    /// same outcome.
    pub fn decides(&self, name: &str) -> bool {
        let Ok(s) = self.state.lock() else {
            return true;
        };
        let mut servers = s.others.iter().filter(|(_, o)| o.serves.contains(name));
        match s.mine.withdrawn {
            true => servers.next().is_none(),
            false => servers.all(|(identity, _)| *identity > self.identity),
        }
    }
}

fn served_by_healthy(others: &[(String, Report)], name: &str) -> bool {
    others
        .iter()
        .any(|(_, o)| o.healthy() && o.serves.contains(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn other(r: Report) -> (String, Report) {
        ("other".to_string(), r)
    }

    fn report(serves: &[&str], failing: &[&str]) -> Report {
        Report {
            serves: serves.iter().map(|s| s.to_string()).collect(),
            failing: failing.iter().map(|s| s.to_string()).collect(),
            withdrawn: false,
        }
    }

    /// Reliability item 7: a replica that cannot set a reconciler up withdraws when a healthy
    /// member serves it, and only then.
    #[test]
    fn a_replica_withdraws_only_while_a_healthy_member_serves_what_fails_on_it() {
        let serving = Serving::new("b");
        serving.serves("a");
        serving.fails("b");
        assert_eq!(
            serving.served_elsewhere("b"),
            None,
            "not known before a read"
        );
        serving.judge(vec![other(report(&["a"], &[]))]);
        assert_eq!(
            serving.served_elsewhere("b"),
            None,
            "the other is still setting b up"
        );
        assert!(!serving.judge(vec![]).withdrawn, "alone: keeps its share");
        assert!(
            !serving.judge(vec![other(report(&["a"], &["b"]))]).withdrawn,
            "b fails everywhere: nobody withdraws"
        );
        assert_eq!(serving.served_elsewhere("b"), Some(false), "reported here");
        assert!(
            !serving
                .judge(vec![other(report(&["a", "b"], &["c"]))])
                .withdrawn,
            "the other serves b but is not healthy"
        );
        let withdrawn = serving.judge(vec![other(report(&["a", "b"], &[]))]);
        assert!(withdrawn.withdrawn);
        assert_eq!(serving.served_elsewhere("b"), Some(true));
        let mut gone = report(&["a", "b"], &[]);
        gone.withdrawn = true;
        assert!(
            !serving.judge(vec![other(gone)]).withdrawn,
            "a withdrawn member serves nothing"
        );
        serving.serves("b");
        assert!(
            !serving
                .judge(vec![other(report(&["a", "b"], &[]))])
                .withdrawn,
            "set up again: rejoins"
        );
    }

    /// Review of item 7: before this replica withdrew, its failure is not left to the others
    /// to report (it is reported if it stays).
    #[test]
    fn a_failure_is_left_to_the_others_only_once_withdrawn() {
        let serving = Serving::new("b");
        serving.judge(vec![other(report(&["x"], &[]))]);
        serving.fails("x");
        assert_eq!(serving.served_elsewhere("x"), None, "not withdrawn yet");
        assert!(serving.judge(vec![other(report(&["x"], &[]))]).withdrawn);
        assert_eq!(serving.served_elsewhere("x"), Some(true));
    }

    /// Item 7: one member decides each reconciler's module for the group.
    #[test]
    fn one_member_decides_for_each_reconciler() {
        let b = Serving::new("b");
        b.serves("x");
        b.serves("y");
        assert!(b.decides("x"), "alone, before a read");
        b.judge(vec![
            ("a".into(), report(&["x"], &[])),
            ("c".into(), report(&["x", "y"], &[])),
        ]);
        assert!(!b.decides("x"), "a serves x and comes first");
        assert!(b.decides("y"), "b comes before c");
        let mut gone = report(&["x"], &[]);
        gone.withdrawn = true;
        b.judge(vec![("a".into(), gone)]);
        assert!(b.decides("x"), "a withdrew");
        b.fails("z");
        let withdrawn = b.judge(vec![("c".into(), report(&["x", "z"], &[]))]);
        assert!(withdrawn.withdrawn);
        assert!(!b.decides("x"), "withdrawn, while c serves x");
    }

    #[test]
    fn reports_round_trip_and_stay_bounded() {
        let mut r = report(&["a", "b"], &["c"]);
        r.withdrawn = true;
        assert_eq!(Report::read(&r.annotations()), r);
        let long: Vec<String> = (0..10_000).map(|i| format!("reconciler-{i:05}")).collect();
        let big = Report {
            serves: long.iter().cloned().collect(),
            failing: long.iter().cloned().collect(),
            withdrawn: false,
        };
        let published = big.annotations();
        assert!(published[SERVES_ANNOTATION].len() <= MAX_LIST_BYTES);
        assert_eq!(published[FAILING_ANNOTATION], UNKNOWN);
        let back = Report::read(&published);
        assert!(!back.healthy(), "a cut failing list is not healthy");
        let hostile = BTreeMap::from([(
            FAILING_ANNOTATION.to_string(),
            "x".repeat(MAX_LIST_BYTES + 1),
        )]);
        assert!(
            !Report::read(&hostile).healthy(),
            "an oversized list is unreadable"
        );
        assert!(
            Report::read(&BTreeMap::new()).healthy(),
            "an old member reports nothing"
        );
    }
}
