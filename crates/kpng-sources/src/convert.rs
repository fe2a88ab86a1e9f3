//! Kubernetes objects → model values. The only place that knows the Kubernetes schema.
//!
//! Each function returns [`Converted::Proxied`] with the reduced value,
//! [`Converted::Ignored`] with the key when the object exists but no proxy of ours should
//! handle it (a source deletes that key, in case it was proxied before), or a
//! [`ConvertError`] naming the object and the field.

mod error;
mod node;
mod service;
mod slice;

pub use error::{ConvertError, FieldError};
pub use node::convert_node;
pub use service::convert_service;
pub use slice::convert_slice;

use kpng_model::ObjectRef;

/// The label that hands a Service or EndpointSlice to a named proxy.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// The label that marks a headless Service's objects.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// The label naming an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The annotation that starts the network-programming latency clock.
pub const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// Choices that change what is proxied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConvertOptions {
    /// This proxy's name: objects labelled `service.kubernetes.io/service-proxy-name` with
    /// this value are proxied; objects with any other value are ignored.
    pub service_proxy_name: Option<String>,
}

/// The outcome of converting one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Converted<T> {
    /// The object is proxied, reduced to this value.
    Proxied(T),
    /// The object is not proxied, for this reason.
    Ignored {
        /// Its key: remove it from the store if it was there.
        key: ObjectRef,
        /// Why it is ignored.
        reason: String,
    },
}

impl<T> Converted<T> {
    /// Converts the proxied value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Converted<U> {
        match self {
            Converted::Proxied(t) => Converted::Proxied(f(t)),
            Converted::Ignored { key, reason } => Converted::Ignored { key, reason },
        }
    }

    /// The proxied value, if the object is proxied.
    pub fn proxied(self) -> Option<T> {
        match self {
            Converted::Proxied(t) => Some(t),
            Converted::Ignored { .. } => None,
        }
    }
}

/// Why objects carrying these labels are not for this proxy, if they are not.
fn ignored_by_labels(
    labels: Option<&std::collections::BTreeMap<String, String>>,
    options: &ConvertOptions,
) -> Option<String> {
    let labels = labels?;
    if labels.contains_key(HEADLESS_LABEL) {
        return Some(format!("labelled {HEADLESS_LABEL}"));
    }
    match (labels.get(SERVICE_PROXY_NAME_LABEL), &options.service_proxy_name) {
        (None, _) => None,
        (Some(name), Some(ours)) if name == ours => None,
        (Some(name), _) => Some(format!("handled by service proxy {name:?}")),
    }
}
