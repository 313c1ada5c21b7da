//! Text that comes from outside (a module's logs, stderr, errors and intents): made inert, cut to
//! a size, and short names for module digests.
//!
//! The engine is the first to see a module's text, so these helpers live here, below everything
//! else; the host re-exports them as `wasmop::text`.
//!
//! # Guarantees
//! - One escape set for every outside text ([`is_unsafe_char`]): a log line, an Event note and
//!   a condition message are sanitized by the same rule.

use std::borrow::Cow;

/// Whether `c` must not reach a log line, a terminal or an Event unescaped: control characters
/// (C0, DEL, C1: newline, ESC, NUL...), the Unicode line and paragraph separators (U+2028,
/// U+2029), the bidirectional marks (LRM, RLM, ALM) and the bidirectional overrides and
/// isolates that make text read differently than it is.
pub fn is_unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{061c}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// `text` with every unsafe character ([`is_unsafe_char`]) escaped as Rust does (`\n`, `\r`,
/// `\t`, `\u{1b}`, `\u{202e}`); borrowed when nothing needed escaping. Everything else, including
/// other non-ASCII text, is kept.
///
/// # Guarantees
/// The result holds no unsafe character, so it cannot break a log line, forge terminal output
/// or reorder how the text around it reads.
pub fn inert(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_unsafe_char(c) {
            // For these characters escape_default writes `\n`, `\r`, `\t` or `\u{..}`.
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` cut to at most `max` bytes at a character boundary, ending with `...` when cut.
///
/// # Guarantees
/// The result is at most `max` bytes long (`...` included) and valid UTF-8; text that fits is
/// returned unchanged.
///
/// # Caveats
/// With `max` under 3 a cut text is `...`, longer than `max`.
pub fn cut(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut at = max.saturating_sub(3);
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    text.truncate(at);
    text.push_str("...");
    text
}

/// The first 12 hex digits of a sha256 digest (`sha256:` prefix, if any, dropped): how logs and
/// messages name a module.
pub fn short_hex(sha256: &str) -> &str {
    let hex = sha256.strip_prefix("sha256:").unwrap_or(sha256);
    hex.get(..12).unwrap_or(hex)
}

/// A digest's short name: `sha256:` and its first 12 hex digits ([`short_hex`]).
pub fn short_sha(sha256: &str) -> String {
    format!("sha256:{}", short_hex(sha256))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inert_escapes_controls_separators_and_bidi_marks() {
        let forged = "a\nb\r\t\u{1b}[2J\0\u{7f}\u{85}";
        assert_eq!(inert(forged), "a\\nb\\r\\t\\u{1b}[2J\\u{0}\\u{7f}\\u{85}");
        let bidi = "\u{2028}\u{2029}\u{200e}\u{200f}\u{061c}\u{202a}\u{202e}\u{2066}\u{2069}";
        assert_eq!(
            inert(bidi),
            "\\u{2028}\\u{2029}\\u{200e}\\u{200f}\\u{61c}\\u{202a}\\u{202e}\\u{2066}\\u{2069}"
        );
        assert!(!inert(bidi).chars().any(is_unsafe_char));
    }

    #[test]
    fn inert_keeps_ordinary_text_without_copying() {
        assert!(matches!(inert("réconcilié 3 objets ✓"), Cow::Borrowed(_)));
        assert!(matches!(inert(""), Cow::Borrowed(_)));
        // Zero-width joiners and other format characters that do not reorder text are kept.
        assert_eq!(inert("a\u{200d}b"), "a\u{200d}b");
    }

    #[test]
    fn cut_stays_within_max_at_a_char_boundary() {
        assert_eq!(cut("short".into(), 5), "short");
        assert_eq!(cut("abcdefgh".into(), 6), "abc...");
        // "é" is two bytes: the cut backs off to the boundary before it.
        let cut_text = cut("aaééé".into(), 6);
        assert_eq!(cut_text, "aa...");
        assert!(cut_text.len() <= 6);
        // Below 3 bytes only the ellipsis is left (see the caveat).
        assert_eq!(cut("abcdef".into(), 2), "...");
    }

    #[test]
    fn short_sha_is_sha256_and_12_hex_digits() {
        let hex = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        assert_eq!(short_hex(hex), "0123456789ab");
        assert_eq!(short_sha(hex), "sha256:0123456789ab");
        assert_eq!(short_sha(&format!("sha256:{hex}")), "sha256:0123456789ab");
        assert_eq!(short_sha("abc"), "sha256:abc");
    }
}
