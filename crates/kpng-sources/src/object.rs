//! One Kubernetes object to a model value: parsed into the [`crate::schema`] types (from
//! JSON text for API pages and watch events, from a JSON value for manifests) and
//! converted ([`crate::convert`]). Both sources read objects through [`read_object`].

use kpng_model::{Kind, Object};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::convert::{
    ConvertError, ConvertOptions, Converted, Warnings, convert_node, convert_service,
    convert_service_cidr, convert_slice,
};
use crate::schema;

/// The kind of object an `apiVersion` and `kind` name, if kpng reads it.
pub fn kind_of(api_version: &str, kind: &str) -> Option<Kind> {
    match (api_version, kind) {
        ("v1", "Service") => Some(Kind::Service),
        ("discovery.k8s.io/v1", "EndpointSlice") => Some(Kind::EndpointSlice),
        ("v1", "Node") => Some(Kind::Node),
        ("networking.k8s.io/v1", "ServiceCIDR") => Some(Kind::ServiceCidr),
        _ => None,
    }
}

/// Why an object could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// The object does not fit the schema (a field of the wrong type, a list that is not a
    /// list), at `field` when the parser knows where.
    #[error("{}{reason}", .field.as_ref().map(|f| format!("field {f}: ")).unwrap_or_default())]
    Parse {
        /// The offending field's path (`spec.ports[1].port`).
        field: Option<String>,
        /// The parser's message.
        reason: String,
    },
    /// The object parsed but a value is invalid.
    #[error("field {}: {}", .0.error.field, .0.error.reason)]
    Convert(ConvertError),
}

impl ObjectError {
    /// The offending field, when known.
    pub fn field(&self) -> Option<&str> {
        match self {
            ObjectError::Parse { field, .. } => field.as_deref(),
            ObjectError::Convert(e) => Some(&e.error.field),
        }
    }

    /// What is wrong, without the field.
    pub fn reason(&self) -> &str {
        match self {
            ObjectError::Parse { reason, .. } => reason,
            ObjectError::Convert(e) => &e.error.reason,
        }
    }
}

/// An object to read: JSON text (API pages and events) or a JSON value (manifests).
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// JSON text.
    Json(&'a str),
    /// A parsed value.
    Value(&'a Value),
}

/// Reads one object of `kind`: parsed, then converted. Doubtful values are pushed to
/// `warnings`.
pub fn read_object(
    kind: Kind,
    input: Input<'_>,
    options: &ConvertOptions,
    warnings: &mut Warnings,
) -> Result<Converted<Object>, ObjectError> {
    let converted = match kind {
        Kind::Service => {
            let svc: schema::Service = parse(input)?;
            convert_service(&svc, options, warnings).map(|c| c.map(Object::Service))
        }
        Kind::EndpointSlice => {
            let slice: schema::EndpointSlice = parse(input)?;
            convert_slice(&slice, options).map(|c| c.map(Object::EndpointSlice))
        }
        Kind::Node => {
            let node: schema::Node = parse(input)?;
            convert_node(&node).map(|c| c.map(Object::Node))
        }
        Kind::ServiceCidr => {
            let cidr: schema::ServiceCidr = parse(input)?;
            convert_service_cidr(&cidr).map(|c| c.map(Object::ServiceCidr))
        }
    };
    converted.map_err(ObjectError::Convert)
}

/// Parses `input`. Tracking the path costs time on every field, so it is done only when
/// the plain parse fails, to name the field.
fn parse<T: DeserializeOwned>(input: Input<'_>) -> Result<T, ObjectError> {
    let plain = match input {
        Input::Json(text) => serde_json::from_str(text).ok(),
        Input::Value(value) => T::deserialize(value).ok(),
    };
    if let Some(parsed) = plain {
        return Ok(parsed);
    }
    let tracked = match input {
        Input::Json(text) => {
            serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(text))
        }
        Input::Value(value) => serde_path_to_error::deserialize(value),
    };
    tracked.map_err(|e| {
        let field = e.path().to_string();
        let field = (field != ".").then_some(field);
        ObjectError::Parse { field, reason: e.into_inner().to_string() }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_field_is_named_by_its_path() {
        let text = r#"{"metadata": {"name": "a"}, "spec": {"ports": "notalist"}}"#;
        let options = ConvertOptions::default();
        let error =
            read_object(Kind::Service, Input::Json(text), &options, &mut Vec::new()).unwrap_err();
        assert_eq!(error.field(), Some("spec.ports"));
        assert!(error.reason().contains("expected a sequence"), "{error}");
        assert!(error.to_string().starts_with("field spec.ports: invalid type"), "{error}");
    }
}
