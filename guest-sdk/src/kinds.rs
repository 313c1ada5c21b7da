//! Kinds, object references, selectors and the module's metadata.

use serde::{Deserialize, Serialize};

/// A group/version/kind, as written in an object's `apiVersion` and `kind`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gvk {
    /// `v1`, `apps/v1`, `example.com/v1alpha1`.
    pub api_version: String,
    /// `Deployment`.
    pub kind: String,
}

impl Gvk {
    /// A kind from its `apiVersion` and `kind`.
    pub fn new(api_version: impl Into<String>, kind: impl Into<String>) -> Self {
        Gvk {
            api_version: api_version.into(),
            kind: kind.into(),
        }
    }

    /// The kind of a k8s-openapi type.
    pub fn of<K: k8s_openapi::Resource>() -> Self {
        Gvk::new(K::API_VERSION, K::KIND)
    }

    /// Whether this is the kind of `K`.
    pub fn is<K: k8s_openapi::Resource>(&self) -> bool {
        self.api_version == K::API_VERSION && self.kind == K::KIND
    }
}

impl std::fmt::Display for Gvk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.api_version, self.kind)
    }
}

/// A reference to one object, the target of a patch, a delete or an Event.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// The object's `apiVersion`.
    pub api_version: String,
    /// The object's `kind`.
    pub kind: String,
    /// None for cluster-scoped objects, or "the primary's namespace" for namespaced ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
}

impl ObjectRef {
    /// A reference to `kind` `name` (in the primary's namespace, if the kind is namespaced).
    pub fn new(gvk: Gvk, name: impl Into<String>) -> Self {
        ObjectRef {
            api_version: gvk.api_version,
            kind: gvk.kind,
            namespace: None,
            name: name.into(),
        }
    }

    /// A reference to the k8s-openapi kind `K` named `name`.
    pub fn to<K: k8s_openapi::Resource>(name: impl Into<String>) -> Self {
        ObjectRef::new(Gvk::of::<K>(), name)
    }

    /// A reference to a typed object (its namespace and name).
    pub fn from_object<
        K: k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
    >(
        object: &K,
    ) -> Self {
        let meta = object.metadata();
        ObjectRef {
            api_version: K::API_VERSION.to_string(),
            kind: K::KIND.to_string(),
            namespace: meta.namespace.clone(),
            name: meta.name.clone().unwrap_or_default(),
        }
    }

    /// The same reference in namespace `namespace`.
    pub fn in_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The kind of the referenced object.
    pub fn gvk(&self) -> Gvk {
        Gvk::new(self.api_version.clone(), self.kind.clone())
    }
}

/// A label-selector operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SelectorOperator {
    /// The label's value is one of the values.
    In,
    /// The label is absent or its value is none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SelectorRequirement {
    /// The label key.
    pub key: String,
    /// How the values are compared.
    pub operator: SelectorOperator,
    /// The values (empty for Exists and DoesNotExist).
    pub values: Vec<String>,
}

/// A Kubernetes label selector; the default selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Selector {
    /// Labels that must have exactly these values.
    pub match_labels: Vec<(String, String)>,
    /// Further requirements.
    pub match_expressions: Vec<SelectorRequirement>,
}

impl Selector {
    /// Selects everything.
    pub fn everything() -> Self {
        Selector::default()
    }

    /// Adds `key=value`.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.match_labels.push((key.into(), value.into()));
        self
    }

    /// Adds a requirement.
    pub fn requirement(
        mut self,
        key: impl Into<String>,
        operator: SelectorOperator,
        values: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.match_expressions.push(SelectorRequirement {
            key: key.into(),
            operator,
            values: values.into_iter().map(Into::into).collect(),
        });
        self
    }

    /// Whether `labels` match this selector (the same rules as the API server's).
    pub fn matches<'a>(
        &self,
        labels: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
    ) -> bool {
        let get = |key: &str| {
            labels
                .clone()
                .into_iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v)
        };
        self.match_labels
            .iter()
            .all(|(k, v)| get(k) == Some(v.as_str()))
            && self.match_expressions.iter().all(|r| match r.operator {
                SelectorOperator::In => {
                    get(&r.key).is_some_and(|v| r.values.iter().any(|x| x == v))
                }
                SelectorOperator::NotIn => {
                    get(&r.key).is_none_or(|v| !r.values.iter().any(|x| x == v))
                }
                SelectorOperator::Exists => get(&r.key).is_some(),
                SelectorOperator::DoesNotExist => get(&r.key).is_none(),
            })
    }
}

impl TryFrom<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector> for Selector {
    type Error = crate::Error;

    /// Converts a Kubernetes `LabelSelector` (as found in a spec: `namespaceSelector`,
    /// `selector`) into a [`Selector`].
    ///
    /// # Errors
    /// An unknown operator (the API server accepts only `In`, `NotIn`, `Exists`,
    /// `DoesNotExist`).
    fn try_from(
        selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    ) -> crate::Result<Self> {
        let mut out = Selector::everything();
        for (k, v) in selector.match_labels.iter().flatten() {
            out = out.label(k.clone(), v.clone());
        }
        for r in selector.match_expressions.iter().flatten() {
            let operator = match r.operator.as_str() {
                "In" => SelectorOperator::In,
                "NotIn" => SelectorOperator::NotIn,
                "Exists" => SelectorOperator::Exists,
                "DoesNotExist" => SelectorOperator::DoesNotExist,
                other => {
                    return Err(crate::Error::msg(format!(
                        "label selector operator {other:?} for key {:?} is not one of In, NotIn, Exists, DoesNotExist",
                        r.key
                    )));
                }
            };
            out = out.requirement(r.key.clone(), operator, r.values.iter().flatten().cloned());
        }
        Ok(out)
    }
}

/// Which primaries a change of a related object re-reconciles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mapping {
    /// Every primary of the reconciler.
    AllPrimaries,
    /// The primary named by the value of this label on the related object.
    PrimaryNamedByLabel(String),
    /// The primary with the related object's namespace and name.
    SameName,
}

/// A kind the module reads but does not own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RelatedKind {
    /// The kind.
    pub kind: Gvk,
    /// Which of its objects are watched and handed over.
    pub selector: Selector,
    /// Which primaries a change re-reconciles.
    pub maps_to: Mapping,
}

impl RelatedKind {
    /// All objects of `kind`; a change re-reconciles every primary.
    pub fn new(kind: Gvk) -> Self {
        RelatedKind {
            kind,
            selector: Selector::everything(),
            maps_to: Mapping::AllPrimaries,
        }
    }

    /// Only objects that match `selector`.
    pub fn selector(mut self, selector: Selector) -> Self {
        self.selector = selector;
        self
    }

    /// Which primaries a change re-reconciles.
    pub fn maps_to(mut self, mapping: Mapping) -> Self {
        self.maps_to = mapping;
        self
    }
}

/// What a module says about itself. The host compares it with the grant in the WasmReconciler
/// and uses what both allow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    /// The module's name.
    pub name: String,
    /// The module's own version.
    pub version: String,
    /// The kind it reconciles.
    pub primary: Gvk,
    /// The kinds it creates and owns.
    pub owns: Vec<Gvk>,
    /// The kinds it reads.
    pub related: Vec<RelatedKind>,
    /// Whether `finalize` does work.
    pub finalizes: bool,
    /// Whether `validate` does work.
    pub validates: bool,
}

impl Metadata {
    /// A module named `name` at `version` (set the primary kind with [`Metadata::primary`]).
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Metadata {
            name: name.into(),
            version: version.into(),
            primary: Gvk::new("", ""),
            owns: Vec::new(),
            related: Vec::new(),
            finalizes: false,
            validates: false,
        }
    }

    /// The kind this module reconciles.
    pub fn primary(mut self, kind: Gvk) -> Self {
        self.primary = kind;
        self
    }

    /// Owns the k8s-openapi kind `K`.
    pub fn owns<K: k8s_openapi::Resource>(self) -> Self {
        self.owns_kind(Gvk::of::<K>())
    }

    /// Owns `kind`.
    pub fn owns_kind(mut self, kind: Gvk) -> Self {
        if !self.owns.contains(&kind) {
            self.owns.push(kind);
        }
        self
    }

    /// Reads a related kind.
    pub fn related(mut self, related: RelatedKind) -> Self {
        self.related.push(related);
        self
    }

    /// `finalize` does work: keep a finalizer on every primary.
    pub fn finalizes(mut self) -> Self {
        self.finalizes = true;
        self
    }

    /// `validate` does work: the host may serve it at admission.
    pub fn validates(mut self) -> Self {
        self.validates = true;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubernetes_label_selector_converts() {
        let k: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector =
            serde_json::from_value(serde_json::json!({
                "matchLabels": {"team": "a"},
                "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]
            }))
            .expect("a label selector");
        let s = Selector::try_from(&k).expect("converts");
        assert!(s.matches([("team", "a"), ("env", "prod")]));
        assert!(!s.matches([("team", "a"), ("env", "dev")]));
        let bad: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector =
            serde_json::from_value(serde_json::json!({
                "matchExpressions": [{"key": "env", "operator": "Like"}]
            }))
            .expect("a label selector");
        let err = Selector::try_from(&bad).expect_err("an unknown operator");
        assert!(err.message().contains("Like"), "{}", err.message());
    }

    #[test]
    fn selectors_match_like_the_api_server() {
        let labels = [("app", "web"), ("tier", "front")];
        assert!(Selector::everything().matches(labels));
        assert!(Selector::everything().label("app", "web").matches(labels));
        assert!(!Selector::everything().label("app", "db").matches(labels));
        let in_ = Selector::everything().requirement("tier", SelectorOperator::In, ["front", "x"]);
        assert!(in_.matches(labels));
        let not_in = Selector::everything().requirement("tier", SelectorOperator::NotIn, ["front"]);
        assert!(!not_in.matches(labels));
        let absent = Selector::everything().requirement("gone", SelectorOperator::NotIn, ["a"]);
        assert!(absent.matches(labels));
        let exists = Selector::everything().requirement("gone", SelectorOperator::Exists, [""; 0]);
        assert!(!exists.matches(labels));
        let dne =
            Selector::everything().requirement("gone", SelectorOperator::DoesNotExist, [""; 0]);
        assert!(dne.matches(labels));
    }
}
