//! An object as the host's watches deliver it: typed metadata, and the rest as the JSON text the
//! API server sent (without `managedFields`), never a `serde_json::Value` tree.
//!
//! The watches of primaries, children and related objects keep their objects as text (the
//! caches, [`crate::controller`]'s `Compact`), and read nothing of them but metadata. Decoded
//! as `DynamicObject`s, every watch event was built into a `Value` tree (through serde's
//! flatten buffer, a second tree), stripped, serialized back to text and dropped: 7% of a
//! converging host's CPU (docs/benchmarks.md, "Profile"). A [`Lean`] is made from the text in
//! one pass that splits it into its fields without building them, and a typed parse of the
//! metadata alone.
//!
//! # Guarantees
//! - [`Lean::json`] is the object's text as sent, with `metadata.managedFields` removed (the
//!   host never reads them; they are often several times the size of the rest); any other
//!   field's text is kept byte for byte, in the order sent.
//! - [`Lean::parse`] accepts what `serde_json::from_str::<DynamicObject>` accepts from the API
//!   server (a JSON object with an object `metadata`), and [`crate::object::parse`] of
//!   [`Lean::json`] is that `DynamicObject` without its `managedFields`.
//! - Its `kube::Resource` implementation is `DynamicObject`'s: the kind comes from the
//!   `ApiResource` the `Api` or store is built with.
//!
//! # Errors
//! [`Lean::parse`] fails with serde_json's error when the text is not a JSON object, has no
//! object `metadata`, or its metadata does not parse as `ObjectMeta`.

use std::borrow::Cow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use kube::api::ObjectMeta;
use serde::Deserialize;
use serde::de::{MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

/// One watched object: its metadata (without `managedFields`) and its JSON text.
#[derive(Clone, Debug)]
pub struct Lean {
    metadata: ObjectMeta,
    json: Arc<str>,
}

impl Lean {
    /// The object of JSON text `text`, without its `managedFields`.
    pub fn parse(text: &str) -> serde_json::Result<Self> {
        let fields: Fields<'_> = serde_json::from_str(text)?;
        let meta = fields
            .get("metadata")
            .ok_or_else(|| serde::de::Error::missing_field("metadata"))?;
        let meta_fields: Fields<'_> = serde_json::from_str(meta.get())?;
        if meta_fields.get("managedFields").is_none() {
            return Ok(Lean {
                metadata: serde_json::from_str(meta.get())?,
                json: text.into(),
            });
        }
        let stripped = meta_fields.write(|k| k != "managedFields", None)?;
        Ok(Lean {
            metadata: serde_json::from_str(&stripped)?,
            json: fields.write(|_| true, Some(&stripped))?.into(),
        })
    }

    /// The object `o`, as the API server would have sent it (tests and stand-ins).
    pub fn of(o: &kube::api::DynamicObject) -> serde_json::Result<Self> {
        Lean::parse(&serde_json::to_string(o)?)
    }

    /// An object known only by its key (a stand-in for one deleted before anything else was
    /// seen of it): its text is its metadata.
    pub fn named(namespace: Option<String>, name: &str) -> Self {
        let metadata = ObjectMeta {
            name: Some(name.to_string()),
            namespace,
            ..Default::default()
        };
        let json = serde_json::json!({ "metadata": &metadata }).to_string();
        Lean {
            metadata,
            json: json.into(),
        }
    }

    /// The object with `kind` and `apiVersion` in its text, written first when it had neither.
    ///
    /// The API server leaves them out of the items of a list of a built-in kind (a
    /// `ConfigMapList`'s items), and writes them first in every watch event (`kind`, then
    /// `apiVersion`). Typed so, an object relisted unchanged has the text its watch event had
    /// (the caches compare texts to tell a relist from a change), and a module sees every
    /// object with its type, whichever way it came.
    ///
    /// # Caveats
    /// A text that starts with either field is taken as it is (the API server writes both or
    /// neither; checked without a parse, as most objects are); otherwise only a missing field
    /// is added.
    pub fn with_type(self, api_version: &str, kind: &str) -> Self {
        let text: &str = &self.json;
        if text.starts_with(r#"{"kind":"#) || text.starts_with(r#"{"apiVersion":"#) {
            return self;
        }
        let Ok(fields) = serde_json::from_str::<Fields<'_>>(text) else {
            return self;
        };
        let missing = |key: &str, value: &str| {
            fields
                .get(key)
                .is_none()
                .then(|| format!("{}:{}", Value::from(key), Value::from(value)))
        };
        let added: Vec<String> = [missing("kind", kind), missing("apiVersion", api_version)]
            .into_iter()
            .flatten()
            .collect();
        let (Some(rest), false) = (text.strip_prefix('{'), added.is_empty()) else {
            return self;
        };
        let sep = if fields.0.is_empty() { "" } else { "," };
        let json = format!("{{{}{sep}{rest}", added.join(","));
        Lean {
            metadata: self.metadata,
            json: json.into(),
        }
    }

    /// The object's JSON text (without `managedFields`).
    pub fn json(&self) -> &Arc<str> {
        &self.json
    }

    /// The object of `metadata` and `json`, taken as they are (`json` is the text of an object
    /// with that metadata).
    pub fn from_parts(metadata: ObjectMeta, json: Arc<str>) -> Self {
        Lean { metadata, json }
    }

    /// Feeds the object's text to `h` field by field, leaving out the top-level fields `skip`
    /// names and the metadata fields `skip_meta` names: each key and its value's text as the
    /// API server sent it (nothing parsed, nothing copied).
    pub fn hash_fields<H: Hasher>(
        &self,
        (skip, skip_meta): (&[&str], &[&str]),
        h: &mut H,
    ) -> serde_json::Result<()> {
        let fields: Fields<'_> = serde_json::from_str(&self.json)?;
        for (k, v) in fields.0.iter().filter(|(k, _)| !skip.contains(&k.as_ref())) {
            k.hash(h);
            if k != "metadata" {
                v.get().hash(h);
                continue;
            }
            let meta: Fields<'_> = serde_json::from_str(v.get())?;
            for (mk, mv) in meta
                .0
                .iter()
                .filter(|(k, _)| !skip_meta.contains(&k.as_ref()))
            {
                mk.hash(h);
                mv.get().hash(h);
            }
        }
        Ok(())
    }
}

/// As `DynamicObject`'s. From serde_json's own deserializer (kube's watch events and lists)
/// the object's text is taken as it is, as a `RawValue` is, and split by [`Lean::parse`]. Any
/// other deserializer (serde's buffer, when a watch event's `object` comes before its `type`; a
/// `serde_json::Value`) gives a value, written back to text first.
impl<'de> Deserialize<'de> for Lean {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_newtype_struct(RAW_VALUE_TOKEN, LeanVisitor)
    }
}

/// The name under which serde_json hands a value's text to a `RawValue` (its
/// `serde_json::raw::TOKEN`, not public): serde_json's deserializers answer a newtype struct of
/// this name with a map of one entry, this name to the text.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

struct LeanVisitor;

impl LeanVisitor {
    fn from_value<E: serde::de::Error>(v: serde_json::Value) -> Result<Lean, E> {
        Lean::parse(&v.to_string()).map_err(E::custom)
    }
}

impl<'de> Visitor<'de> for LeanVisitor {
    type Value = Lean;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Lean, A::Error> {
        let Some(Key(first)) = map.next_key()? else {
            return Err(serde::de::Error::missing_field("metadata"));
        };
        if first == RAW_VALUE_TOKEN {
            let Key(text) = map.next_value()?;
            return Lean::parse(&text).map_err(serde::de::Error::custom);
        }
        // A deserializer that gives the object's fields: collect them.
        let mut fields = serde_json::Map::new();
        fields.insert(first.into_owned(), map.next_value()?);
        while let Some((k, v)) = map.next_entry::<String, serde_json::Value>()? {
            fields.insert(k, v);
        }
        Self::from_value(serde_json::Value::Object(fields))
    }

    fn visit_newtype_struct<D: serde::Deserializer<'de>>(self, d: D) -> Result<Lean, D::Error> {
        Self::from_value(serde_json::Value::deserialize(d)?)
    }
}

crate::object::dynamic_resource!(Lean);

/// A JSON object's fields, each as its text, in order (nothing parsed but the keys).
struct Fields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// The object's text with the fields `keep` keeps, `metadata` replaced when given.
    fn write(
        &self,
        keep: impl Fn(&str) -> bool,
        metadata: Option<&str>,
    ) -> serde_json::Result<String> {
        let mut out = String::with_capacity(
            self.0
                .iter()
                .map(|(k, v)| k.len() + v.get().len() + 4)
                .sum(),
        );
        out.push('{');
        for (k, v) in self.0.iter().filter(|(k, _)| keep(k)) {
            if out.len() > 1 {
                out.push(',');
            }
            out.push_str(&serde_json::to_string(k.as_ref())?);
            out.push(':');
            out.push_str(match (k.as_ref(), metadata) {
                ("metadata", Some(m)) => m,
                _ => v.get(),
            });
        }
        out.push('}');
        Ok(out)
    }
}

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(FieldsVisitor)
    }
}

struct FieldsVisitor;

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Fields<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(8));
        while let Some(Key(k)) = map.next_key()? {
            fields.push((k, map.next_value::<&'de RawValue>()?));
        }
        Ok(Fields(fields))
    }
}

/// A key, borrowed from the text unless it holds escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Key(Cow::Borrowed(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Key(Cow::Owned(v.to_string())))
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Key(Cow::Owned(v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::DynamicObject;
    use kube::{Resource, ResourceExt};
    use serde_json::json;

    fn deployment() -> serde_json::Value {
        json!({
            "kind": "Deployment", "apiVersion": "apps/v1",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                         "labels": {"app": "a"},
                         "managedFields": [{"manager": "kcm", "operation": "Update",
                                            "fieldsType": "FieldsV1",
                                            "fieldsV1": {"f:status": {"f:replicas": {}}}}],
                         "ownerReferences": [{"apiVersion": "example.wasmop.dev/v1", "kind": "App",
                                              "name": "a", "uid": "p1", "controller": true}]},
            "spec": {"replicas": 1, "note": "é \"q\"\n", "big": 12345678901234_u64},
            "status": {"observedGeneration": 1}
        })
    }

    #[test]
    fn a_lean_object_is_the_text_sent_without_managed_fields() {
        let text = deployment().to_string();
        let lean = Lean::parse(&text).expect("parses");
        assert!(!lean.json().contains("managedFields"), "{}", lean.json());
        assert_eq!(lean.meta().managed_fields, None);
        assert_eq!(lean.name_any(), "a");
        assert_eq!(lean.namespace().as_deref(), Some("ns"));
        assert_eq!(lean.labels().get("app").map(String::as_str), Some("a"));
        let mut expected: DynamicObject = serde_json::from_str(&text).expect("parses");
        expected.metadata.managed_fields = None;
        let back = crate::object::parse(lean.json()).expect("the text parses back");
        assert_eq!(
            serde_json::to_value(&back).ok(),
            serde_json::to_value(&expected).ok()
        );
    }

    #[test]
    fn the_fields_keep_their_order_and_text() {
        let text = r#"{"kind":"D","apiVersion":"v1","metadata":{"name":"a","managedFields":[{"manager":"m"}],"uid":"u"},"spec":{ "z": 1.50, "a": [1, 2] }}"#;
        let lean = Lean::parse(text).expect("parses");
        assert_eq!(
            &**lean.json(),
            r#"{"kind":"D","apiVersion":"v1","metadata":{"name":"a","uid":"u"},"spec":{ "z": 1.50, "a": [1, 2] }}"#
        );
    }

    #[test]
    fn a_watch_events_object_is_taken_as_its_text() {
        let line =
            r#"{"type":"ADDED","object":{"kind":"D","metadata":{"name":"a"},"spec":{"z": 1.50}}}"#;
        let event: kube::core::WatchEvent<Lean> = serde_json::from_str(line).expect("decodes");
        let kube::core::WatchEvent::Added(o) = event else {
            panic!("not an ADDED event");
        };
        assert_eq!(
            &**o.json(),
            r#"{"kind":"D","metadata":{"name":"a"},"spec":{"z": 1.50}}"#,
            "not built into a value and written back"
        );
    }

    #[test]
    fn an_object_without_managed_fields_keeps_its_text() {
        let text = r#"{"kind":"Service", "metadata":{"name":"s"},"spec":{ "a" : 1 }}"#;
        let lean = Lean::parse(text).expect("parses");
        assert_eq!(&**lean.json(), text);
    }

    #[test]
    fn escaped_keys_and_values_survive() {
        let text = r#"{"metadata":{"name":"s","managedFields":[],"annotations":{"a\"b":"c\u00e9"}},"sp\u0065c":{"x\\y":"\n"}}"#;
        let lean = Lean::parse(text).expect("parses");
        let back: serde_json::Value = serde_json::from_str(lean.json()).expect("JSON");
        assert_eq!(
            back,
            json!({"metadata": {"name": "s", "annotations": {"a\"b": "cé"}}, "spec": {"x\\y": "\n"}})
        );
        assert_eq!(
            lean.annotations().get("a\"b").map(String::as_str),
            Some("cé")
        );
    }

    #[test]
    fn what_is_not_an_object_with_metadata_is_an_error() {
        for bad in [
            "[]",
            "1",
            r#"{"kind":"X"}"#,
            r#"{"metadata":[]}"#,
            r#"{"metadata":{"name":1}}"#,
            "{",
        ] {
            assert!(Lean::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn watch_events_and_lists_decode_as_kube_reads_them() {
        let object = deployment().to_string();
        // As the API server writes them (`type` first: serde_json hands over the text), and
        // with `object` first (serde buffers it: a value, written back).
        for line in [
            format!(r#"{{"type":"MODIFIED","object":{object}}}"#),
            format!(r#"{{"object":{object},"type":"MODIFIED"}}"#),
        ] {
            let event: kube::core::WatchEvent<Lean> = serde_json::from_str(&line).expect("decodes");
            let kube::core::WatchEvent::Modified(o) = event else {
                panic!("not a MODIFIED event");
            };
            assert_eq!(o.resource_version().as_deref(), Some("7"));
            assert!(!o.json().contains("managedFields"));
            assert_eq!(o.labels().get("app").map(String::as_str), Some("a"));
        }
        let list = json!({"kind": "DeploymentList", "apiVersion": "apps/v1",
                          "metadata": {"resourceVersion": "9"}, "items": [deployment(), deployment()]})
        .to_string();
        let list: kube::core::ObjectList<Lean> = serde_json::from_str(&list).expect("decodes");
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.metadata.resource_version.as_deref(), Some("9"));
        let from_value: Lean = serde_json::from_value(deployment()).expect("decodes from a Value");
        assert_eq!(from_value.name_any(), "a");
    }

    #[test]
    fn fields_hash_as_sent_but_what_is_left_out() {
        let hash = |text: &str, skip: &[&str]| {
            let mut h = std::hash::DefaultHasher::new();
            let lean = Lean::parse(text).expect("parses");
            lean.hash_fields((skip, &["resourceVersion", "managedFields"]), &mut h)
                .expect("hashes");
            h.finish()
        };
        let a = r#"{"kind":"A","metadata":{"name":"a","resourceVersion":"1"},"spec":{"x":1},"status":{"s":1}}"#;
        let later = r#"{"kind":"A","metadata":{"name":"a","resourceVersion":"2","managedFields":[{}]},"spec":{"x":1},"status":{"s":2}}"#;
        let changed = r#"{"kind":"A","metadata":{"name":"a","resourceVersion":"2"},"spec":{"x":2},"status":{"s":1}}"#;
        assert_eq!(hash(a, &["status"]), hash(later, &["status"]));
        assert_ne!(
            hash(a, &[]),
            hash(later, &[]),
            "the status counts unless left out"
        );
        assert_ne!(hash(a, &["status"]), hash(changed, &["status"]));
        let named = Lean::named(Some("ns".into()), "gone");
        assert_eq!(
            (named.namespace(), named.name_any()),
            (Some("ns".into()), "gone".into())
        );
        assert_eq!(
            Lean::parse(named.json())
                .map(|o| o.name_any())
                .ok()
                .as_deref(),
            Some("gone")
        );
    }

    /// The finding of 2026-11-30: a list's item of a built-in kind has no `kind` or
    /// `apiVersion`, its watch event has both, and the owned caches took every child relisted
    /// unchanged (a sharded replica gaining ranges) as changed. Typed, the two texts are one.
    #[test]
    fn a_list_item_typed_has_its_watch_events_text() {
        let event = r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"n","resourceVersion":"5"},"data":{"k":"v"}}"#;
        let item =
            r#"{"metadata":{"name":"a","namespace":"n","resourceVersion":"5"},"data":{"k":"v"}}"#;
        let typed = |text: &str| {
            Lean::parse(text)
                .expect("object")
                .with_type("v1", "ConfigMap")
        };
        assert_eq!(typed(item).json(), typed(event).json());
        assert_eq!(
            &**typed(event).json(),
            event,
            "a typed text is taken as it is"
        );
        // A custom resource's list item (sorted keys, `apiVersion` first) is kept as it is.
        let sorted = r#"{"apiVersion":"x.dev/v1","kind":"W","metadata":{"name":"a"}}"#;
        assert_eq!(&**typed(sorted).json(), sorted);
        // Only a missing field is added, wherever the other stands.
        let late = r#"{"metadata":{"name":"a"},"kind":"Other"}"#;
        assert_eq!(
            &**typed(late).json(),
            r#"{"apiVersion":"v1","metadata":{"name":"a"},"kind":"Other"}"#
        );
        let parsed: DynamicObject = crate::object::parse(typed(item).json()).expect("parses");
        assert_eq!(parsed.types.map(|t| t.kind).as_deref(), Some("ConfigMap"));
        assert_eq!(parsed.metadata.resource_version.as_deref(), Some("5"));
    }
}
