//! [`Loader`]: what the documents of one input add up to, with duplicates resolved.

use std::collections::HashMap;

use kpng_model::{Object, ObjectRef};
use serde_json::Value;

use super::{DocumentError, Position};
use crate::convert::{ConvertOptions, Converted, printable};
use crate::object::{Input, kind_of, read_object};
use crate::schema::ObjectHead;

/// The objects of an input, ready for the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifests {
    /// Every proxied object, in input order; of two objects with one key, the later.
    pub objects: Vec<Object>,
    /// Documents (or `List` items) that held an object of any kind.
    pub documents: usize,
    /// The input holds a `List` document with no items: it says "nothing" on purpose.
    pub empty_list: bool,
    /// Duplicates and doubtful fields, each with its position.
    pub warnings: Vec<String>,
}

/// What reading one object found.
#[derive(Debug)]
pub(super) enum Outcome {
    /// An object to proxy.
    Proxied(Object),
    /// An object of a kind kpng reads, that this proxy does not handle.
    Ignored(ObjectRef),
    /// An object of a kind kpng does not read.
    Skipped,
}

/// The results of reading some objects (a document, or the items of a `List`), kept apart
/// until the document is complete.
#[derive(Debug, Default)]
pub(super) struct Read {
    pub outcomes: Vec<(Position, Outcome)>,
    pub errors: Vec<DocumentError>,
    pub warnings: Vec<String>,
}

impl Read {
    /// Reads one object, held as a JSON value.
    pub fn object(&mut self, options: &ConvertOptions, position: Position, value: &Value) {
        if !value.is_object() {
            let reason = "not a Kubernetes object (expected a mapping)";
            self.errors.push(position.error(None, None, reason));
            return;
        }
        let head = ObjectHead::of_value(value);
        let text = |ptr: &str| value.pointer(ptr).and_then(Value::as_str).unwrap_or_default();
        let (api_version, kind) = (text("/apiVersion"), text("/kind"));
        if kind.is_empty() {
            self.errors.push(position.error(Some(&head), Some("kind".into()), "missing"));
            return;
        }
        let Some(model_kind) = kind_of(api_version, kind) else {
            tracing::debug!(%position, api_version = %printable(api_version), kind = %printable(kind), "skipping an object of a kind kpng does not use");
            self.outcomes.push((position, Outcome::Skipped));
            return;
        };
        let mut warnings = Vec::new();
        match read_object(model_kind, Input::Value(value), options, &mut warnings) {
            Ok(Converted::Proxied(object)) => {
                self.outcomes.push((position, Outcome::Proxied(object)))
            }
            Ok(Converted::Ignored { key, reason }) => {
                tracing::debug!(%position, object = %printable(&key.to_string()), %reason, "not proxied");
                self.outcomes.push((position, Outcome::Ignored(key)));
            }
            Err(e) => {
                let field = e.field().map(str::to_string);
                self.errors.push(position.error(Some(&head), field, e.reason()));
            }
        }
        self.warnings.extend(warnings.into_iter().map(|w| format!("{position}: {w}")));
    }
}

/// Everything read so far from one input.
pub(super) struct Loader<'o> {
    pub options: &'o ConvertOptions,
    objects: Vec<Option<Object>>,
    /// Every key read so far: where, and its index in `objects` if proxied.
    keys: HashMap<ObjectRef, (Position, Option<usize>)>,
    errors: Vec<DocumentError>,
    warnings: Vec<String>,
    documents: usize,
    empty_list: bool,
}

impl<'o> Loader<'o> {
    pub fn new(options: &'o ConvertOptions) -> Self {
        Loader {
            options,
            objects: Vec::new(),
            keys: HashMap::new(),
            errors: Vec::new(),
            warnings: Vec::new(),
            documents: 0,
            empty_list: false,
        }
    }

    /// Adds what a complete document (or `List`) held. `empty_list`: it was a `List` with
    /// no items.
    pub fn commit(&mut self, read: Read, empty_list: bool) {
        self.empty_list |= empty_list;
        self.errors.extend(read.errors);
        self.warnings.extend(read.warnings);
        for (position, outcome) in read.outcomes {
            self.documents += 1;
            let (key, object) = match outcome {
                Outcome::Proxied(object) => (object.object_ref(), Some(object)),
                Outcome::Ignored(key) => (key, None),
                Outcome::Skipped => continue,
            };
            let index = object.map(|o| {
                self.objects.push(Some(o));
                self.objects.len() - 1
            });
            if let Some((earlier, earlier_index)) = self.keys.insert(key.clone(), (position, index))
            {
                self.warnings.push(format!(
                    "{position}: {} appears again (first in {earlier}); the later one is kept",
                    printable(&key.to_string())
                ));
                if let Some(i) = earlier_index {
                    self.objects[i] = None;
                }
            }
        }
    }

    /// A document that could not be parsed.
    pub fn document_failed(&mut self, error: DocumentError) {
        self.errors.push(error);
    }

    /// The objects, or every error.
    pub fn finish(self) -> Result<Manifests, Vec<DocumentError>> {
        if !self.errors.is_empty() {
            return Err(self.errors);
        }
        Ok(Manifests {
            objects: self.objects.into_iter().flatten().collect(),
            documents: self.documents,
            empty_list: self.empty_list,
            warnings: self.warnings,
        })
    }
}
