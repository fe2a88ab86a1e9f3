//! `metadata`, reduced: names, the labels and annotations a proxy reads, and timestamps.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};

pub use kpng_model::global::{LOAD_BALANCER_ANNOTATION_PREFIX, SERVICE_PROXY_NAME_LABEL};

/// The label that marks a headless Service's objects.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// The label naming an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The annotation that starts the network-programming latency clock.
pub const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// `metadata` of any object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// `metadata.name`.
    pub name: Option<String>,
    /// `metadata.namespace` (absent for cluster-scoped objects).
    pub namespace: Option<String>,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<String>,
    /// `metadata.creationTimestamp`, RFC 3339.
    pub creation_timestamp: Option<String>,
    /// `metadata.deletionTimestamp` is set (its value is not read).
    #[serde(default, deserialize_with = "present")]
    pub deletion_timestamp: bool,
    /// The labels a proxy reads (see [`Labels`]).
    #[serde(default)]
    pub labels: Labels,
    /// The annotations a proxy reads (see [`Annotations`]).
    #[serde(default)]
    pub annotations: Annotations,
}

/// Whether a field holds a value other than `null`.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(Option::<IgnoredAny>::deserialize(deserializer)?.is_some())
}

/// Whether a label can matter to a proxy: the proxy-name, headless and service-name
/// labels of Services and EndpointSlices, and the topology labels of Nodes.
pub fn label_matters(key: &str) -> bool {
    matches!(key, SERVICE_PROXY_NAME_LABEL | HEADLESS_LABEL | SERVICE_NAME_LABEL)
        || key == "kubernetes.io/hostname"
        || key.starts_with("topology.kubernetes.io/")
}

/// The labels of an object that can matter to a proxy (see [`label_matters`]); the others
/// are skipped while parsing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels(pub Vec<(String, String)>);

/// Whether an annotation can matter to a proxy: a slice's trigger time and a Service's
/// kube-nftlb load-balancing settings.
pub fn annotation_matters(key: &str) -> bool {
    key == TRIGGER_TIME_ANNOTATION || key.starts_with(LOAD_BALANCER_ANNOTATION_PREFIX)
}

/// The annotations of an object that a proxy reads (see [`annotation_matters`]), in the
/// object's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Annotations(pub Vec<(String, String)>);

impl Labels {
    /// The value of label `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

impl Annotations {
    /// The value of annotation `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_option(SelectedMap(label_matters)).map(Labels)
    }
}

impl<'de> Deserialize<'de> for Annotations {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_option(SelectedMap(annotation_matters)).map(Annotations)
    }
}

/// A map of strings (or `null`), keeping the entries whose key passes the filter.
struct SelectedMap(fn(&str) -> bool);

impl<'de> Visitor<'de> for SelectedMap {
    type Value = Vec<(String, String)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of strings")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = Vec::new();
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            if (self.0)(&key) {
                kept.push((key.into_owned(), map.next_value::<String>()?));
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(kept)
    }
}

/// A map key, borrowed from the input when it can be (most keys are skipped: no copy).
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_string())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// Just enough of an object to name it, read leniently (any field may be of any type):
/// what an error message says about an object that cannot be parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectHead {
    /// `kind`, when it is a string.
    pub kind: Option<String>,
    /// `metadata.namespace`, when it is a string.
    pub namespace: Option<String>,
    /// `metadata.name`, when it is a string.
    pub name: Option<String>,
    /// `metadata.resourceVersion`, when it is a string.
    pub resource_version: Option<String>,
}

impl ObjectHead {
    /// The head of a JSON value.
    pub fn of_value(value: &serde_json::Value) -> ObjectHead {
        let text = |ptr: &str| value.pointer(ptr).and_then(|v| v.as_str()).map(str::to_string);
        ObjectHead {
            kind: text("/kind"),
            namespace: text("/metadata/namespace"),
            name: text("/metadata/name"),
            resource_version: text("/metadata/resourceVersion"),
        }
    }

    /// The head of JSON text; empty when the text is not a JSON object.
    pub fn of_json(text: &str) -> ObjectHead {
        #[derive(Deserialize)]
        struct Head {
            kind: Option<serde_json::Value>,
            metadata: Option<serde_json::Value>,
        }
        let Ok(head) = serde_json::from_str::<Head>(text) else { return ObjectHead::default() };
        let mut value = serde_json::Map::new();
        value.extend(head.kind.map(|k| ("kind".to_string(), k)));
        value.extend(head.metadata.map(|m| ("metadata".to_string(), m)));
        ObjectHead::of_value(&serde_json::Value::Object(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_labels_that_matter_are_kept_and_null_is_empty() {
        let meta: ObjectMeta = serde_json::from_str(
            r#"{"name": "a", "labels": {"app": "x", "kubernetes.io/service-name": "web",
                "topology.kubernetes.io/zone": "z1"}, "annotations": null,
                "deletionTimestamp": "2026-01-01T00:00:00Z", "managedFields": [{"x": 1}]}"#,
        )
        .unwrap();
        assert_eq!(meta.labels.get("kubernetes.io/service-name"), Some("web"));
        assert_eq!(meta.labels.0.len(), 2, "{:?}", meta.labels);
        assert_eq!(meta.annotations, Annotations::default());
        assert!(meta.deletion_timestamp);
    }

    #[test]
    fn load_balancing_annotations_are_kept_and_others_dropped() {
        let meta: ObjectMeta = serde_json::from_str(
            r#"{"name": "a", "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}",
                "service.kubernetes.io/kube-nftlb-load-balancer-scheduler": "rr"}}"#,
        )
        .unwrap();
        let kept = [(
            "service.kubernetes.io/kube-nftlb-load-balancer-scheduler".to_string(),
            "rr".to_string(),
        )];
        assert_eq!(meta.annotations.0, kept);
    }

    #[test]
    fn a_head_names_an_object_whatever_else_is_wrong() {
        let head = ObjectHead::of_json(
            r#"{"kind": "Service", "metadata": {"name": "a", "namespace": "ns", "labels": 3},
                "spec": {"ports": "notalist"}}"#,
        );
        assert_eq!((head.kind.as_deref(), head.name.as_deref()), (Some("Service"), Some("a")));
        assert_eq!(ObjectHead::of_json("[1, 2]"), ObjectHead::default());
    }
}
