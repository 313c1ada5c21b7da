//! An AdmissionReview as the webhook reads it: the request's header fields typed, its `object`
//! and `oldObject` kept as their JSON text in the body, not parsed into trees.
//!
//! A review's objects are only handed on to the module, as text. Parsing them into a
//! `DynamicObject` and printing them back cost about 19 times the body (a 7 MiB review grew the
//! host by 120-136 MiB); here the body is checked once by serde (syntax, the header fields,
//! duplicate fields refused) and the objects are located in it, so a review holds its body and,
//! while the module runs, one copy of each object's text.
//!
//! # Guarantees
//! - [`parse`] accepts exactly what serde accepts for the header fields; the object texts are
//!   the exact bytes the API server sent (valid JSON, UTF-8).
//! - No recursion: the objects are located by an iterative scan, whatever their depth.
//!
//! # Errors
//! [`parse`] returns serde's message for a body that is not an AdmissionReview.

use std::ops::Range;

use kube::api::GroupVersionKind;
use kube::core::TypeMeta;
use kube::core::admission::Operation;
use serde::Deserialize;
use serde::de::IgnoredAny;

/// A parsed review: its header fields and its body, with where the objects are in it.
#[derive(Debug)]
pub struct Review {
    /// `apiVersion` and `kind` of the review, echoed in the response.
    pub types: TypeMeta,
    /// The request's uid.
    pub uid: String,
    /// The object's kind.
    pub kind: GroupVersionKind,
    /// The object's name (empty for a `generateName` create).
    pub name: String,
    /// The object's namespace.
    pub namespace: Option<String>,
    /// CREATE, UPDATE, DELETE or CONNECT.
    pub operation: Operation,
    body: Vec<u8>,
    object: Option<Range<usize>>,
    old_object: Option<Range<usize>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    request: Option<Head>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Head {
    uid: String,
    kind: GroupVersionKind,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    operation: Operation,
    #[serde(default)]
    object: Option<IgnoredAny>,
    #[serde(default)]
    old_object: Option<IgnoredAny>,
}

/// Parses `body` (an `admission.k8s.io/v1` AdmissionReview with a request).
///
/// # Errors
/// serde's message, or that the review has no request.
pub fn parse(body: Vec<u8>) -> Result<Review, String> {
    let envelope: Envelope = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    let head = envelope
        .request
        .ok_or("the AdmissionReview has no request")?;
    let request = member(&body, 0, "request").ok_or("the request cannot be located")?;
    let locate = |present: bool, key: &str| -> Result<Option<Range<usize>>, String> {
        if !present {
            return Ok(None);
        }
        let span = member(&body, request.start, key)
            .ok_or_else(|| format!("request.{key} cannot be located"))?;
        std::str::from_utf8(body.get(span.clone()).unwrap_or_default())
            .map_err(|e| format!("request.{key}: {e}"))?;
        Ok(Some(span))
    };
    let object = locate(head.object.is_some(), "object")?;
    let old_object = locate(head.old_object.is_some(), "oldObject")?;
    Ok(Review {
        types: TypeMeta {
            api_version: envelope.api_version,
            kind: envelope.kind,
        },
        uid: head.uid,
        kind: head.kind,
        name: head.name,
        namespace: head.namespace,
        operation: head.operation,
        body,
        object,
        old_object,
    })
}

impl Review {
    /// The text of `object`, if the review has one.
    pub fn object(&self) -> Option<&str> {
        self.text(self.object.clone())
    }

    /// The text of `oldObject`, if the review has one.
    pub fn old_object(&self) -> Option<&str> {
        self.text(self.old_object.clone())
    }

    fn text(&self, span: Option<Range<usize>>) -> Option<&str> {
        std::str::from_utf8(self.body.get(span?)?).ok()
    }
}

/// Where the value of member `key` is in the JSON object at `at` (valid JSON: [`parse`] checked
/// it with serde first).
fn member(json: &[u8], at: usize, key: &str) -> Option<Range<usize>> {
    let mut i = skip_ws(json, at);
    if json.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        i = skip_ws(json, i);
        match json.get(i)? {
            b'}' => return None,
            b',' => i = skip_ws(json, i + 1),
            _ => {}
        }
        let name_end = skip_string(json, i)?;
        let name = json.get(i..name_end)?;
        i = skip_ws(json, name_end);
        if json.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(json, i + 1);
        let end = skip_value(json, start)?;
        if name_is(name, key) {
            return Some(start..end);
        }
        i = end;
    }
}

/// A member name (with its quotes) is `key`, escapes decoded.
fn name_is(raw: &[u8], key: &str) -> bool {
    if raw.contains(&b'\\') {
        serde_json::from_slice::<String>(raw).is_ok_and(|k| k == key)
    } else {
        raw.get(1..raw.len().saturating_sub(1)) == Some(key.as_bytes())
    }
}

fn skip_ws(json: &[u8], mut i: usize) -> usize {
    while matches!(json.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// The end of the string starting at `i`.
fn skip_string(json: &[u8], i: usize) -> Option<usize> {
    if json.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    loop {
        match json.get(j)? {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
}

/// The end of the value starting at `i`.
fn skip_value(json: &[u8], i: usize) -> Option<usize> {
    match json.get(i)? {
        b'"' => skip_string(json, i),
        b'{' | b'[' => {
            let (mut depth, mut j) = (0usize, i);
            loop {
                match json.get(j)? {
                    b'"' => {
                        j = skip_string(json, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let mut j = i;
            while !matches!(
                json.get(j),
                None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            ) {
                j += 1;
            }
            Some(j)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REVIEW: &str = r#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1",
      "request":{"uid":"u-1","kind":{"group":"g","version":"v1","kind":"K"},
        "resource":{"group":"g","version":"v1","resource":"ks"},"name":"n","namespace":"ns",
        "userInfo":{"username":"a"},"operation":"UPDATE","dryRun":false,
        "options":{"kind":"UpdateOptions","object":{"x":1}},
        "obj\u0065ct" : {"metadata":{"name":"n"},"spec":{"s":"a \"}\" ] [ {","l":[1,{"a":[]},null,true,-1.5e3]}},
        "oldObject":{"spec":{}}}}"#;

    #[test]
    fn the_objects_are_the_exact_text_sent_and_the_header_is_typed() {
        let r = parse(REVIEW.as_bytes().to_vec()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (r.uid.as_str(), r.name.as_str(), r.namespace.as_deref()),
            ("u-1", "n", Some("ns"))
        );
        assert_eq!(
            (r.kind.kind.as_str(), &r.operation),
            ("K", &Operation::Update)
        );
        assert_eq!(r.types.kind, "AdmissionReview");
        assert_eq!(
            r.object(),
            Some(
                r#"{"metadata":{"name":"n"},"spec":{"s":"a \"}\" ] [ {","l":[1,{"a":[]},null,true,-1.5e3]}}"#
            )
        );
        assert_eq!(r.old_object(), Some(r#"{"spec":{}}"#));
    }

    #[test]
    fn null_or_missing_objects_are_none_and_duplicates_or_garbage_are_refused() {
        let create = r#"{"request":{"uid":"u","kind":{"group":"","version":"v1","kind":"K"},"operation":"CREATE","object":{},"oldObject":null}}"#;
        let r = parse(create.as_bytes().to_vec()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((r.object(), r.old_object()), (Some("{}"), None));
        let twice = create.replace(r#""object":{}"#, r#""object":{},"object":{"a":1}"#);
        assert!(parse(twice.into_bytes()).is_err(), "a duplicate object");
        assert!(parse(b"{\"request\":".to_vec()).is_err());
        assert!(parse(b"{}".to_vec()).is_err(), "no request");
    }
}
