//! Who should hold which ranges: a consistent-hash ring over the live members.
//!
//! Every member places [`VNODES`] tokens on the ring at [`token`] positions; the range from
//! one token (inclusive) to the next (exclusive) belongs to the first token's member, and the
//! range before the first token wraps around to the last token's member.
//!
//! Why consistent hashing rather than equal ranges over the sorted names: with equal ranges a
//! member joining shifts every boundary, moving about half the space between members that
//! stay; with a ring a joining member takes only the ranges in front of its own tokens (its
//! share, ~1/k) and a leaving member's ranges go to the next tokens' owners. The API server
//! accepts a union of ranges (`shardRange(..) || shardRange(..)`), so a member's many ranges cost
//! one watch per kind, not one per range.
//!
//! # Guarantees
//! - Deterministic: every replica computes the same assignment from the same member names.
//! - The members' assignments are disjoint and cover the whole space (for at least one member).
//! - Adding a member only moves ranges to it; removing one only moves its ranges away.
//!
//! # Errors
//! Nothing here fails.

use super::hash::fnv1a64;
use super::ranges::{Ranges, SPACE_END};

/// Tokens per member: enough for shares within ~±25% of 1/k, few enough for short selectors.
pub const VNODES: usize = 32;

/// The position of `member`'s `i`-th token: FNV-1a of `<member>#<i>`, mixed (MurmurHash3's
/// 64-bit finalizer), since FNV alone keeps names that differ in their last bytes close together.
fn token(member: &str, i: usize) -> u64 {
    let mut h = fnv1a64(&format!("{member}#{i}"));
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The ranges `member` should hold when `members` are live (empty if it is not among them).
pub fn assignment(members: &[String], member: &str) -> Ranges {
    let mut tokens: Vec<(u64, &str)> = members
        .iter()
        .flat_map(|m| (0..VNODES).map(move |i| (token(m, i), m.as_str())))
        .collect();
    // Ties (never seen in practice) are broken by name, the same way everywhere.
    tokens.sort_unstable();
    tokens.dedup_by_key(|t| t.0);
    let Some(&(_, last_owner)) = tokens.last() else {
        return Ranges::empty();
    };
    let mut mine = Vec::new();
    if last_owner == member {
        mine.push((0, u128::from(tokens[0].0)));
    }
    for (i, &(token, owner)) in tokens.iter().enumerate() {
        if owner != member {
            continue;
        }
        let end = tokens
            .get(i + 1)
            .map_or(SPACE_END, |&(next, _)| u128::from(next));
        mine.push((u128::from(token), end));
    }
    Ranges::from_ranges(mine)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn assignments_partition_the_space() {
        let members = names(&["a", "b", "c"]);
        let parts: Vec<Ranges> = members.iter().map(|m| assignment(&members, m)).collect();
        let all = parts.iter().fold(Ranges::empty(), |acc, p| acc.union(p));
        assert_eq!(all, Ranges::all());
        for (i, p) in parts.iter().enumerate() {
            for q in &parts[i + 1..] {
                assert!(!p.overlaps(q));
            }
            assert!(p.fraction() > 0.15, "a share of {}", p.fraction());
        }
        // Identities that differ only in their last characters spread too.
        let hosts = names(&[
            "wasmop-6d5f-a1b2c3d4",
            "wasmop-6d5f-a1b2c3d5",
            "wasmop-6d5f-a1b2c3d6",
        ]);
        for h in &hosts {
            let share = assignment(&hosts, h).fraction();
            assert!(share > 0.15 && share < 0.55, "{h}: a share of {share}");
        }
        assert_eq!(assignment(&names(&["a"]), "a"), Ranges::all());
        assert!(assignment(&members, "z").is_empty());
        assert!(assignment(&[], "a").is_empty());
    }

    #[test]
    fn a_joining_member_takes_only_its_share() {
        let before = names(&["a", "b", "c"]);
        let after = names(&["a", "b", "c", "d"]);
        let d = assignment(&after, "d");
        for m in ["a", "b", "c"] {
            let old = assignment(&before, m);
            let new = assignment(&after, m);
            // Nothing moves between the members that stay; what a member loses goes to d.
            assert!(new.difference(&old).is_empty(), "{m} gained on a join");
            assert_eq!(old.difference(&new), old.intersection(&d));
        }
        // And a leaving member's ranges go only to the others' gains.
        let without_b = names(&["a", "c"]);
        for m in ["a", "c"] {
            let gained = assignment(&without_b, m).difference(&assignment(&before, m));
            assert!(gained.difference(&assignment(&before, "b")).is_empty());
        }
    }
}
