//! Manifests text → model objects: multi-document YAML, JSON (one or more documents, or
//! an array), and `kind: List` documents such as `kubectl get ... -o yaml` prints.
//!
//! Documents are parsed one by one, and a `List`'s items one by one as the parser reaches
//! them: no document is ever held whole as a tree, so memory follows the objects kept,
//! not the size of the text. YAML limits (nodes, depth, aliases) grow with each document's
//! size (see [`limits`]), so any real cluster's listing loads while a small document cannot
//! expand into a large one.

mod limits;
mod loader;
mod stream;

use std::fmt;

use serde::de::DeserializeSeed;
use serde_json::value::RawValue;

pub use limits::YamlLimits;
pub use loader::Manifests;

use crate::convert::{ConvertOptions, printable};
use crate::schema::ObjectHead;
use loader::Loader;
use stream::DocumentSeed;

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
        let position = Position { document: self.document, line: self.line, item: self.item };
        write!(f, "{position}")?;
        match (&self.kind, &self.object) {
            (Some(kind), Some(object)) => write!(f, ", {} {}", printable(kind), object)?,
            (Some(kind), None) => write!(f, ", {}", printable(kind))?,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The document, from 1.
    pub document: usize,
    /// The line the document starts on, from 1.
    pub line: usize,
    /// The item within a `List` document (or a JSON array), from 0.
    pub item: Option<usize>,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {} (line {})", self.document, self.line)?;
        match self.item {
            Some(item) => write!(f, ", item {item}"),
            None => Ok(()),
        }
    }
}

impl Position {
    fn at(document: usize, line: usize) -> Position {
        Position { document, line, item: None }
    }

    /// An error about the object `head` names (if any) at this position.
    fn error(
        &self,
        head: Option<&ObjectHead>,
        field: Option<String>,
        reason: impl fmt::Display,
    ) -> DocumentError {
        let head = head.cloned().unwrap_or_default();
        let object = match (head.namespace, head.name) {
            (Some(ns), Some(name)) => Some(format!("{}/{}", printable(&ns), printable(&name))),
            (None, Some(name)) => Some(printable(&name).into_owned()),
            _ => None,
        };
        DocumentError {
            document: self.document,
            line: self.line,
            item: self.item,
            kind: head.kind,
            object,
            field,
            reason: reason.to_string(),
        }
    }
}

/// Parses manifests and converts every Service, EndpointSlice, Node and ServiceCIDR in
/// them. Other kinds are skipped (logged at debug level), and so are objects this proxy
/// does not handle. Any invalid document fails the whole input, with one error per invalid
/// document (or `List` item).
pub fn parse_manifests(
    text: &str,
    options: &ConvertOptions,
) -> Result<Manifests, Vec<DocumentError>> {
    let mut loader = Loader::new(options);
    if text.trim_start().starts_with(['{', '[']) {
        json_documents(text, &mut loader);
    } else {
        let documents = yaml_documents(text).into_iter().filter(|(_, d)| !is_blank(d));
        for (i, (line, document)) in documents.enumerate() {
            yaml_document(Position::at(i + 1, line), document, &mut loader);
        }
    }
    loader.finish()
}

/// Splits YAML text into documents at `---` and `...` lines, with the line each starts on.
/// Each document is a slice of the text (its `---` line included): nothing is copied.
fn yaml_documents(text: &str) -> Vec<(usize, &str)> {
    let is_marker = |line: &str, m: &str| {
        line.strip_prefix(m).is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
    };
    let mut documents = Vec::new();
    let (mut start, mut start_line, mut offset) = (0, 1, 0);
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let bare = line.trim_end_matches(['\n', '\r']);
        if is_marker(bare, "---") {
            documents.push((start_line, &text[start..offset]));
            (start, start_line) = (offset, n + 1);
        } else if is_marker(bare, "...") {
            documents.push((start_line, &text[start..offset + line.len()]));
            (start, start_line) = (offset + line.len(), n + 2);
        }
        offset += line.len();
    }
    documents.push((start_line, &text[start..]));
    documents
}

/// Whether a YAML document holds nothing but markers and comments: it is not counted.
fn is_blank(document: &str) -> bool {
    document.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#') || l == "---" || l == "..."
    })
}

/// Parses one YAML document into `loader`.
fn yaml_document(position: Position, document: &str, loader: &mut Loader) {
    let limits = YamlLimits::for_document(document.len());
    let seed = DocumentSeed { loader: &mut *loader, position };
    let parsed = serde_saphyr::with_deserializer_from_str_with_options(
        document,
        limits.options(),
        |deserializer| seed.deserialize(deserializer),
    );
    if let Err(e) = parsed {
        let reason = format!("invalid YAML: {}", limits.explain(&e));
        loader.document_failed(position.error(None, None, reason));
    }
}

/// Parses JSON text (one or more documents) into `loader`.
fn json_documents(text: &str, loader: &mut Loader) {
    let stream = serde_json::Deserializer::from_str(text).into_iter::<&RawValue>();
    for (i, raw) in stream.enumerate() {
        let raw = match raw {
            Ok(raw) => raw,
            Err(e) => {
                let reason = format!("invalid JSON: {e}");
                loader.document_failed(Position::at(i + 1, e.line()).error(None, None, reason));
                return;
            }
        };
        let start = raw.get().as_ptr() as usize - text.as_ptr() as usize;
        let line = 1 + text[..start].bytes().filter(|b| *b == b'\n').count();
        let position = Position::at(i + 1, line);
        let mut deserializer = serde_json::Deserializer::from_str(raw.get());
        let seed = DocumentSeed { loader: &mut *loader, position };
        if let Err(e) = seed.deserialize(&mut deserializer) {
            let reason = format!("invalid JSON: {}", limits::explain_json(&e));
            loader.document_failed(position.error(None, None, reason));
        }
    }
}

#[cfg(test)]
mod tests;
