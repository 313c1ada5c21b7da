//! Sets of ranges of the 64-bit hash space: what a replica holds, wants, releases or claims.
//!
//! A range is `[start, end)` with `end <= 2^64` (so the whole space is one range); a [`Ranges`]
//! is a sorted list of disjoint, non-adjacent ranges, so two sets that hold the same hashes are
//! equal. The text form (a member Lease's annotation) is `0x<16 hex>-0x<16 or 17 hex>` joined by
//! commas, and [`Ranges::selector`] renders the server-side `shardSelector` of KEP-5866.
//!
//! # Guarantees
//! - Every operation returns a normalized set; `contains` agrees with the set operations.
//! - [`Ranges::parse`] accepts exactly what [`Ranges`]'s `Display` writes (and normalizes it).
//!
//! # Errors
//! [`RangeError`] when a published set cannot be parsed.

use std::fmt;

/// `2^64`: the exclusive end of the hash space.
pub const SPACE_END: u128 = 1 << 64;

/// The most ranges a text form may hold ([`Ranges::parse`]): a member's held ranges come from
/// its Lease, which anyone who may write Leases in the namespace can write. A ring of k members
/// gives each about k ranges.
pub const MAX_PARSED_RANGES: usize = 1024;

/// A published set of ranges that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("not a set of hash ranges ({reason}): {text:?}")]
pub struct RangeError {
    /// The text.
    pub text: String,
    /// What is wrong.
    pub reason: String,
}

/// A normalized set of `[start, end)` ranges of the hash space.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Ranges(Vec<(u128, u128)>);

impl Ranges {
    /// The empty set.
    pub fn empty() -> Self {
        Ranges(Vec::new())
    }

    /// The whole hash space.
    pub fn all() -> Self {
        Ranges(vec![(0, SPACE_END)])
    }

    /// The set of the given ranges (empty or reversed ones are dropped, the rest merged).
    pub fn from_ranges(ranges: impl IntoIterator<Item = (u128, u128)>) -> Self {
        let mut v: Vec<(u128, u128)> = ranges
            .into_iter()
            .map(|(s, e)| (s.min(SPACE_END), e.min(SPACE_END)))
            .filter(|(s, e)| s < e)
            .collect();
        v.sort_unstable();
        let mut out: Vec<(u128, u128)> = Vec::with_capacity(v.len());
        for (s, e) in v {
            match out.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        Ranges(out)
    }

    /// The ranges, in order.
    pub fn ranges(&self) -> &[(u128, u128)] {
        &self.0
    }

    /// Whether no hash is in the set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `hash` is in the set.
    pub fn contains(&self, hash: u64) -> bool {
        let h = u128::from(hash);
        let i = self.0.partition_point(|&(_, e)| e <= h);
        self.0.get(i).is_some_and(|&(s, _)| s <= h)
    }

    /// The hashes in either set.
    pub fn union(&self, other: &Ranges) -> Ranges {
        Ranges::from_ranges(self.0.iter().chain(other.0.iter()).copied())
    }

    /// The hashes in both sets.
    pub fn intersection(&self, other: &Ranges) -> Ranges {
        let mut out = Vec::new();
        let (mut i, mut j) = (0, 0);
        while let (Some(&(a0, a1)), Some(&(b0, b1))) = (self.0.get(i), other.0.get(j)) {
            let (s, e) = (a0.max(b0), a1.min(b1));
            if s < e {
                out.push((s, e));
            }
            if a1 <= b1 {
                i += 1;
            } else {
                j += 1;
            }
        }
        Ranges::from_ranges(out)
    }

    /// The hashes in `self` and not in `other`.
    pub fn difference(&self, other: &Ranges) -> Ranges {
        Ranges::from_ranges(
            self.0
                .iter()
                .flat_map(|&r| subtract(r, &other.0).into_iter()),
        )
    }

    /// Whether some hash is in both sets.
    pub fn overlaps(&self, other: &Ranges) -> bool {
        !self.intersection(other).is_empty()
    }

    /// The share of the hash space the set covers, in `[0, 1]`.
    pub fn fraction(&self) -> f64 {
        let covered: u128 = self.0.iter().map(|(s, e)| e - s).sum();
        covered as f64 / SPACE_END as f64
    }

    /// The KEP-5866 shard selector of this set over `field` (`object.metadata.namespace` or
    /// `object.metadata.uid`); None for the empty set (which no selector expresses).
    pub fn selector(&self, field: &str) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        Some(
            self.0
                .iter()
                .map(|&(s, e)| format!("shardRange({field}, '{}', '{}')", hex(s), hex(e)))
                .collect::<Vec<_>>()
                .join(" || "),
        )
    }

    /// Parses the text form (see the module docs); `""` is the empty set.
    ///
    /// # Errors
    /// [`RangeError`] when a part is not `0x<hex>-0x<hex>` within the space.
    pub fn parse(text: &str) -> Result<Ranges, RangeError> {
        let bad = |reason: &str| RangeError {
            text: text.chars().take(200).collect(),
            reason: reason.to_string(),
        };
        // Each range is at most 41 bytes of text ("0x" + 17 hex digits, twice, a dash, a comma).
        if text.len() > MAX_PARSED_RANGES * 42 {
            return Err(bad("more ranges than a member holds"));
        }
        let mut out = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if out.len() == MAX_PARSED_RANGES {
                return Err(bad("more ranges than a member holds"));
            }
            let (s, e) = part
                .split_once('-')
                .ok_or_else(|| bad("a range is start-end"))?;
            let num = |x: &str| {
                x.strip_prefix("0x")
                    .and_then(|h| u128::from_str_radix(h, 16).ok())
                    .filter(|n| *n <= SPACE_END)
                    .ok_or_else(|| bad("a bound is 0x and at most 17 hex digits, up to 2^64"))
            };
            out.push((num(s)?, num(e)?));
        }
        Ok(Ranges::from_ranges(out))
    }
}

/// `[s, e)` minus the sorted disjoint `cuts`.
fn subtract((mut s, e): (u128, u128), cuts: &[(u128, u128)]) -> Vec<(u128, u128)> {
    let mut out = Vec::new();
    for &(c0, c1) in cuts {
        if c1 <= s {
            continue;
        }
        if c0 >= e {
            break;
        }
        if c0 > s {
            out.push((s, c0));
        }
        s = s.max(c1);
        if s >= e {
            return out;
        }
    }
    if s < e {
        out.push((s, e));
    }
    out
}

/// `0x` and 16 lowercase hex digits; 2^64 is `0x10000000000000000` (as the API server wants).
fn hex(n: u128) -> String {
    format!("0x{n:016x}")
}

impl fmt::Display for Ranges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|&(s, e)| format!("{}-{}", hex(s), hex(e)))
            .collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_with_more_ranges_than_a_member_holds_is_refused_unread() {
        let range = |i: u128| format!("0x{:x}-0x{:x}", i * 4, i * 4 + 1);
        let at_cap: Vec<String> = (0..MAX_PARSED_RANGES as u128).map(range).collect();
        assert!(Ranges::parse(&at_cap.join(",")).is_ok());
        let over: Vec<String> = (0..=MAX_PARSED_RANGES as u128).map(range).collect();
        assert!(Ranges::parse(&over.join(",")).is_err());
        let huge = "0x1-0x2,".repeat(1 << 20);
        let err = Ranges::parse(&huge).expect_err("8 MiB of ranges");
        assert!(
            err.text.len() <= 200,
            "the error quotes at most 200 characters"
        );
    }

    #[test]
    fn set_operations_normalize_and_agree_with_contains() {
        let a = Ranges::from_ranges([(10, 20), (15, 30), (40, 50), (50, 60)]);
        assert_eq!(a.ranges(), &[(10, 30), (40, 60)]);
        let b = Ranges::from_ranges([(25, 45)]);
        assert_eq!(a.intersection(&b).ranges(), &[(25, 30), (40, 45)]);
        assert_eq!(a.difference(&b).ranges(), &[(10, 25), (45, 60)]);
        assert_eq!(a.union(&b).ranges(), &[(10, 60)]);
        assert!(a.contains(10) && a.contains(29) && !a.contains(30) && a.contains(59));
        assert!(!a.contains(60) && !a.contains(9));
        assert!(a.overlaps(&b) && !a.overlaps(&Ranges::from_ranges([(30, 40)])));
        assert!(Ranges::all().contains(u64::MAX));
        assert_eq!(Ranges::all().difference(&Ranges::all()), Ranges::empty());
        assert!((Ranges::all().fraction() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn text_and_selector_forms_round_trip() {
        let r = Ranges::from_ranges([(0, 1 << 63), ((3 << 62), SPACE_END)]);
        let text = r.to_string();
        assert_eq!(
            text,
            "0x0000000000000000-0x8000000000000000,0xc000000000000000-0x10000000000000000"
        );
        assert_eq!(Ranges::parse(&text).ok(), Some(r.clone()));
        assert_eq!(Ranges::parse("").ok(), Some(Ranges::empty()));
        assert!(Ranges::parse("0x1").is_err());
        assert!(Ranges::parse("0x0-0x20000000000000000").is_err());
        assert_eq!(
            r.selector("object.metadata.uid").as_deref(),
            Some(
                "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') || shardRange(object.metadata.uid, '0xc000000000000000', '0x10000000000000000')"
            )
        );
        assert_eq!(Ranges::empty().selector("object.metadata.uid"), None);
    }
}
