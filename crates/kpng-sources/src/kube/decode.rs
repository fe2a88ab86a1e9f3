//! List pages and watch events → store events, one object at a time.
//!
//! A page is parsed only as far as its metadata and the text of each item; each item is
//! then parsed into kpng's own types and converted on its own, so one malformed object is
//! one skipped object, not a failed list. A malformed object is reported once per version
//! (kind, namespace/name, field) and becomes [`SourceEvent::Kept`]: whatever the store
//! holds for it stays in force.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash, Hasher};

use kpng_model::{Kind, Object, ObjectRef, ServiceKey, SliceKey};
use kpng_store::SourceEvent;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::convert::{ConvertOptions, Converted, printable};
use crate::object::{Input, ObjectError, read_object};
use crate::schema::ObjectHead;

/// A list page: its metadata, and the text of each item.
#[derive(Debug, Deserialize)]
pub struct Page<'a> {
    /// `metadata`.
    #[serde(default)]
    pub metadata: ListMeta,
    /// `items`, unparsed.
    #[serde(borrow, default)]
    pub items: Option<Vec<&'a RawValue>>,
}

/// A list's `metadata`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    /// The version the list reflects; a watch continues from it.
    pub resource_version: Option<String>,
    /// The token of the next page, if any.
    #[serde(rename = "continue")]
    pub continue_token: Option<String>,
}

/// A watch event, its object unparsed.
#[derive(Debug, Deserialize)]
pub struct WatchEvent<'a> {
    /// `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK` or `ERROR`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The object (a `Status` for `ERROR`).
    #[serde(borrow)]
    pub object: &'a RawValue,
}

/// At most this many unnamed malformed objects are remembered as reported.
const UNNAMED_REPORTS: usize = 100;

/// Reads the objects of one kind, remembering which malformed ones were reported.
pub struct Reader {
    kind: Kind,
    options: ConvertOptions,
    /// Objects reported as malformed or doubtful, with the version reported.
    reported: HashMap<ObjectRef, Option<String>>,
    /// Reports about objects without a usable name.
    unnamed: HashSet<String>,
}

impl Reader {
    /// A reader of `kind` objects.
    pub fn new(kind: Kind, options: ConvertOptions) -> Reader {
        Reader { kind, options, reported: HashMap::new(), unnamed: HashSet::new() }
    }

    /// The store event for an object that exists (a list item, an `ADDED` or `MODIFIED`
    /// event): applied, deleted (not for this proxy), kept (malformed), or none (malformed
    /// and unnamed).
    pub fn object(&mut self, text: &str) -> Option<SourceEvent> {
        let mut warnings = Vec::new();
        let read = read_object(self.kind, Input::Json(text), &self.options, &mut warnings);
        let event = match read {
            Ok(Converted::Proxied(object)) => SourceEvent::Applied(object),
            Ok(Converted::Ignored { key, reason }) => {
                tracing::debug!(object = %printable(&key.to_string()), %reason, "not proxied");
                SourceEvent::Deleted(key)
            }
            Err(error) => return self.malformed(text, &error),
        };
        if !warnings.is_empty() {
            let head = ObjectHead::of_json(text);
            if let Some(key) = event_key(&event)
                && self.first_report(key, head.resource_version)
            {
                for w in &warnings {
                    tracing::warn!(kind = %self.kind, "{w}");
                }
            }
        } else if !self.reported.is_empty()
            && let Some(key) = event_key(&event)
        {
            self.reported.remove(&key);
        }
        Some(event)
    }

    /// The store event for a `DELETED` event: only the object's name is read.
    pub fn deleted(&mut self, text: &str) -> Option<SourceEvent> {
        let head = ObjectHead::of_json(text);
        let Some(key) = self.key(&head) else {
            tracing::warn!(kind = %self.kind, "a DELETED event without a name: ignored");
            return None;
        };
        self.reported.remove(&key);
        Some(SourceEvent::Deleted(key))
    }

    /// Reports a malformed object (once per version) and keeps its last good version.
    fn malformed(&mut self, text: &str, error: &ObjectError) -> Option<SourceEvent> {
        let head = ObjectHead::of_json(text);
        let key = self.key(&head);
        let first = match &key {
            Some(key) => self.first_report(key.clone(), head.resource_version.clone()),
            None => self.unnamed.len() < UNNAMED_REPORTS && self.unnamed.insert(error.to_string()),
        };
        let object = key.as_ref().map_or("(no name)".to_string(), object_name);
        let field = error.field().unwrap_or("(unknown)");
        if first {
            tracing::warn!(kind = %self.kind, %object, field, error = %error.reason(), "skipping a malformed object; its last good version, if any, stays in force");
        } else {
            tracing::debug!(kind = %self.kind, %object, field, error = %error.reason(), "malformed object (reported before)");
        }
        key.map(SourceEvent::Kept)
    }

    /// Records a report about `key` at `version`; true if it was not reported before.
    fn first_report(&mut self, key: ObjectRef, version: Option<String>) -> bool {
        self.reported.insert(key, version.clone()) != Some(version)
    }

    /// The store key an object head names, if it names one.
    fn key(&self, head: &ObjectHead) -> Option<ObjectRef> {
        let name = head.name.clone().filter(|n| !n.is_empty())?;
        let namespace = || head.namespace.clone().unwrap_or_else(|| "default".into());
        Some(match self.kind {
            Kind::Service => ObjectRef::Service(ServiceKey::new(namespace(), name)),
            Kind::EndpointSlice => ObjectRef::EndpointSlice(SliceKey::new(namespace(), name)),
            Kind::Node => ObjectRef::Node(name),
            Kind::ServiceCidr => ObjectRef::ServiceCidr(name),
        })
    }
}

/// An object's name for a log line: `namespace/name` or `name`, control characters escaped.
fn object_name(key: &ObjectRef) -> String {
    let text = match key {
        ObjectRef::Service(k) => k.to_string(),
        ObjectRef::EndpointSlice(k) => k.to_string(),
        ObjectRef::Node(n) | ObjectRef::ServiceCidr(n) => n.clone(),
    };
    printable(&text).into_owned()
}

/// The key an object event is about (`None` for list events).
pub fn event_key(event: &SourceEvent) -> Option<ObjectRef> {
    match event {
        SourceEvent::Applied(object) => Some(object.object_ref()),
        SourceEvent::Deleted(key) | SourceEvent::Kept(key) => Some(key.clone()),
        SourceEvent::ListStarted(_) | SourceEvent::ListDone(_) => None,
    }
}

/// The `metadata.resourceVersion` of an object's JSON, read leniently.
pub fn resource_version(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Versioned {
        metadata: Option<Metadata>,
    }
    #[derive(Deserialize)]
    struct Metadata {
        #[serde(rename = "resourceVersion")]
        resource_version: Option<serde_json::Value>,
    }
    let versioned: Versioned = serde_json::from_str(text).ok()?;
    match versioned.metadata?.resource_version? {
        serde_json::Value::String(version) => Some(version),
        _ => None,
    }
}

/// A hash of the key a store event is about, without copying it: what a list remembers to
/// notice an object listed twice.
pub fn event_key_hash(hasher: &impl BuildHasher, event: &SourceEvent) -> u64 {
    let mut h = hasher.build_hasher();
    match event {
        SourceEvent::Applied(Object::Service(s)) => s.key.hash(&mut h),
        SourceEvent::Applied(Object::EndpointSlice(s)) => s.key.hash(&mut h),
        SourceEvent::Applied(Object::Node(n)) => n.name.hash(&mut h),
        SourceEvent::Applied(Object::ServiceCidr(c)) => c.name.hash(&mut h),
        SourceEvent::Deleted(key) | SourceEvent::Kept(key) => match key {
            ObjectRef::Service(k) => k.hash(&mut h),
            ObjectRef::EndpointSlice(k) => k.hash(&mut h),
            ObjectRef::Node(n) | ObjectRef::ServiceCidr(n) => n.hash(&mut h),
        },
        SourceEvent::ListStarted(k) | SourceEvent::ListDone(k) => k.hash(&mut h),
    }
    h.finish()
}
