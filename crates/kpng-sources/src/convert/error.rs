//! Conversion errors that name the object and the field.

use std::borrow::Cow;
use std::fmt;

/// A field of an object that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    /// The field path, as in the manifest (`spec.ports[0].protocol`).
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl FieldError {
    /// An error at `field`.
    pub fn new(field: impl Into<String>, reason: impl fmt::Display) -> Self {
        FieldError { field: field.into(), reason: reason.to_string() }
    }
}

/// An object that cannot be converted (or, as a warning, a doubtful field of one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {}: {error}", object_name(.namespace, .name))]
pub struct ConvertError {
    /// The object's kind.
    pub kind: &'static str,
    /// Its namespace, if namespaced.
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// The offending field.
    #[source]
    pub error: FieldError,
}

impl ConvertError {
    /// The object's `namespace/name` (or name), control characters escaped.
    pub fn object(&self) -> String {
        object_name(&self.namespace, &self.name)
    }
}

fn object_name(namespace: &Option<String>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{}/{}", printable(ns), printable(name)),
        None => printable(name).into_owned(),
    }
}

/// `text` fit for a log line or a message: control characters (a newline, an escape
/// sequence that would drive a terminal) are written as escapes (`\n`, `\u{1b}`).
/// Kubernetes never allows them in names; a manifest or a hostile server might.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c.is_control() {
            true => out.extend(c.escape_default()),
            false => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_in_names_are_escaped() {
        assert_eq!(printable("web"), "web");
        assert_eq!(printable("a\nb\u{1b}[31m"), "a\\nb\\u{1b}[31m");
        let e = ConvertError {
            kind: "Service",
            namespace: Some("ns\r".into()),
            name: "x\u{7}".into(),
            error: FieldError::new("spec.type", "bad"),
        };
        assert_eq!(e.to_string(), "Service ns\\r/x\\u{7}: spec.type: bad");
    }
}
