//! Conversion errors that name the object and the field.

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

/// An object that cannot be converted.
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

fn object_name(namespace: &Option<String>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}
