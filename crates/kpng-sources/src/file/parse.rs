//! Manifests text → model objects: multi-document YAML, JSON (one or more documents, or
//! an array), and `kind: List` documents such as `kubectl get ... -o yaml` prints.

use std::fmt;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use kpng_model::Object;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::convert::{
    ConvertError, ConvertOptions, Converted, convert_node, convert_service, convert_slice,
};

/// A document of the input that cannot be used, with where it is and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentError {
    /// The document's position in the input, from 1.
    pub document: usize,
    /// The line the document starts on, from 1.
    pub line: usize,
    /// The position within a `List` document's `items`, from 0.
    pub item: Option<usize>,
    /// The object's kind, when known.
    pub kind: Option<String>,
    /// The object's `namespace/name` (or name), when known.
    pub object: Option<String>,
    /// The offending field, when known.
    pub field: Option<String>,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {} (line {})", self.document, self.line)?;
        if let Some(item) = self.item {
            write!(f, ", item {item}")?;
        }
        match (&self.kind, &self.object) {
            (Some(kind), Some(object)) => write!(f, ", {kind} {object}")?,
            (Some(kind), None) => write!(f, ", {kind}")?,
            _ => {}
        }
        if let Some(field) = &self.field {
            write!(f, ", field {field}")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for DocumentError {}

/// Where an object sits in the input.
#[derive(Debug, Clone, Copy)]
struct Position {
    document: usize,
    line: usize,
    item: Option<usize>,
}

impl Position {
    fn error(
        &self,
        value: Option<&Value>,
        field: Option<String>,
        reason: impl fmt::Display,
    ) -> DocumentError {
        let text =
            |v: &Value, ptr: &str| v.pointer(ptr).and_then(Value::as_str).map(str::to_string);
        let kind = value.and_then(|v| text(v, "/kind"));
        let name = value.and_then(|v| text(v, "/metadata/name"));
        let namespace = value.and_then(|v| text(v, "/metadata/namespace"));
        let object = match (namespace, name) {
            (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
            (None, Some(name)) => Some(name),
            _ => None,
        };
        DocumentError {
            document: self.document,
            line: self.line,
            item: self.item,
            kind,
            object,
            field,
            reason: reason.to_string(),
        }
    }
}

/// Splits YAML text into documents at `---` lines, with the line each starts on.
fn yaml_documents(text: &str) -> Vec<(usize, String)> {
    let mut docs = vec![(1, String::new())];
    for (n, line) in text.lines().enumerate() {
        let is_marker = |m: &str| {
            line == m || line.starts_with(&format!("{m} ")) || line.starts_with(&format!("{m}\t"))
        };
        if is_marker("---") {
            let rest = line[3..].trim();
            docs.push((n + 1, if rest.is_empty() { String::new() } else { format!("{rest}\n") }));
        } else if is_marker("...") {
            docs.push((n + 2, String::new()));
        } else if let Some((_, doc)) = docs.last_mut() {
            doc.push_str(line);
            doc.push('\n');
        }
    }
    docs
}

/// Parses the documents of `text` into JSON values, with their positions.
fn documents(text: &str) -> Result<Vec<(Position, Value)>, Vec<DocumentError>> {
    let at = |document, line| Position { document, line, item: None };
    if text.trim_start().starts_with(['{', '[']) {
        let mut out = Vec::new();
        for (i, value) in serde_json::Deserializer::from_str(text).into_iter::<Value>().enumerate()
        {
            match value {
                Ok(Value::Array(items)) => out.extend(
                    items
                        .into_iter()
                        .enumerate()
                        .map(|(j, v)| (Position { item: Some(j), ..at(i + 1, 1) }, v)),
                ),
                Ok(value) => out.push((at(i + 1, 1), value)),
                Err(e) => {
                    return Err(vec![at(i + 1, e.line()).error(
                        None,
                        None,
                        format!("invalid JSON: {e}"),
                    )]);
                }
            }
        }
        return Ok(out);
    }
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (i, (line, doc)) in yaml_documents(text).into_iter().enumerate() {
        if doc.lines().all(|l| l.trim().is_empty() || l.trim_start().starts_with('#')) {
            continue;
        }
        match serde_saphyr::from_str::<Value>(&doc) {
            Ok(value) => out.push((at(i + 1, line), value)),
            Err(e) => errors.push(at(i + 1, line).error(None, None, format!("invalid YAML: {e}"))),
        }
    }
    if errors.is_empty() { Ok(out) } else { Err(errors) }
}

/// Parses manifests and converts every Service, EndpointSlice and Node in them. Other kinds
/// are skipped (logged at debug level), and so are objects no proxy of ours handles. Any
/// invalid document fails the whole input, with one error per invalid document.
pub fn parse_manifests(
    text: &str,
    options: &ConvertOptions,
) -> Result<Vec<Object>, Vec<DocumentError>> {
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    for (position, value) in documents(text)? {
        match value {
            Value::Null => {}
            Value::Object(_) if is_list(&value) => {
                let items =
                    value.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
                for (i, item) in items.into_iter().enumerate() {
                    let position = Position { item: Some(i), ..position };
                    convert_value(position, item, options, &mut objects, &mut errors);
                }
            }
            value => convert_value(position, value, options, &mut objects, &mut errors),
        }
    }
    if errors.is_empty() { Ok(objects) } else { Err(errors) }
}

fn is_list(value: &Value) -> bool {
    value.get("kind").and_then(Value::as_str).is_some_and(|k| k.ends_with("List"))
        && value.get("items").is_some()
}

fn convert_value(
    position: Position,
    value: Value,
    options: &ConvertOptions,
    objects: &mut Vec<Object>,
    errors: &mut Vec<DocumentError>,
) {
    let text =
        |ptr: &str| value.pointer(ptr).and_then(Value::as_str).unwrap_or_default().to_string();
    if !value.is_object() {
        errors.push(position.error(None, None, "not a Kubernetes object (expected a mapping)"));
        return;
    }
    let (api_version, kind) = (text("/apiVersion"), text("/kind"));
    if kind.is_empty() {
        errors.push(position.error(Some(&value), Some("kind".into()), "missing"));
        return;
    }
    let result = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Service") => typed::<core::Service>(&position, &value)
            .and_then(|s| reported(&position, &value, convert_service(&s, options)))
            .map(|c| c.map(Object::Service)),
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            typed::<discovery::EndpointSlice>(&position, &value)
                .and_then(|s| reported(&position, &value, convert_slice(&s, options)))
                .map(|c| c.map(Object::EndpointSlice))
        }
        ("v1", "Node") => typed::<core::Node>(&position, &value)
            .and_then(|n| reported(&position, &value, convert_node(&n)))
            .map(|c| c.map(Object::Node)),
        _ => {
            tracing::debug!(document = position.document, %api_version, %kind, "skipping object of a kind kpng does not use");
            return;
        }
    };
    match result {
        Ok(Some(object)) => objects.push(object),
        Ok(None) => {}
        Err(e) => errors.push(e),
    }
}

fn typed<T: DeserializeOwned>(position: &Position, value: &Value) -> Result<T, DocumentError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        let field = (field != ".").then_some(field);
        position.error(Some(value), field, e.into_inner())
    })
}

fn reported<T>(
    position: &Position,
    value: &Value,
    result: Result<Converted<T>, ConvertError>,
) -> Result<Option<T>, DocumentError> {
    match result {
        Ok(Converted::Proxied(t)) => Ok(Some(t)),
        Ok(Converted::Ignored { key, reason }) => {
            tracing::debug!(document = position.document, object = %key, %reason, "not proxied");
            Ok(None)
        }
        Err(e) => Err(position.error(Some(value), Some(e.error.field), e.error.reason)),
    }
}

#[cfg(test)]
mod tests;
