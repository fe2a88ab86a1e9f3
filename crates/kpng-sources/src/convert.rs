//! Kubernetes objects ([`crate::schema`]) → model values. The only place that knows what
//! the fields mean.
//!
//! Each function returns [`Converted::Proxied`] with the reduced value,
//! [`Converted::Ignored`] with the key when the object exists but this proxy should not
//! handle it (a source deletes that key, in case it was proxied before), or a
//! [`ConvertError`] naming the object and the field. Doubtful values that are not errors
//! (a cluster IP that cannot be a service address) are pushed to a list of warnings, so a
//! source can report them once.

mod error;
mod load_balancing;
mod node;
mod service;
mod service_cidr;
mod slice;
mod time;

pub use error::{ConvertError, FieldError, printable};
pub use load_balancing::rejected_annotations;
pub use node::convert_node;
pub use service::convert_service;
pub use service_cidr::convert_service_cidr;
pub use slice::convert_slice;
pub use time::unix_seconds;

use kpng_model::ObjectRef;
use kpng_model::global::is_for_proxy;

use crate::schema::meta::Labels;
pub use crate::schema::meta::{
    HEADLESS_LABEL, SERVICE_NAME_LABEL, SERVICE_PROXY_NAME_LABEL, TRIGGER_TIME_ANNOTATION,
};

/// Choices that change what is proxied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConvertOptions {
    /// This proxy's name. `None` (the default proxy): only Services and EndpointSlices
    /// without a `service.kubernetes.io/service-proxy-name` label are proxied. `Some(NAME)`:
    /// only those labelled with NAME (see [`is_for_proxy`]).
    pub service_proxy_name: Option<String>,
}

impl ConvertOptions {
    /// The label selector that makes an API server send only the Services and
    /// EndpointSlices this proxy handles: the same rule as the conversion applies.
    pub fn label_selector(&self) -> String {
        match &self.service_proxy_name {
            Some(name) => format!("!{HEADLESS_LABEL},{SERVICE_PROXY_NAME_LABEL}={name}"),
            None => format!("!{HEADLESS_LABEL},!{SERVICE_PROXY_NAME_LABEL}"),
        }
    }
}

/// Checks a proxy name: it must be a valid label value (it goes into a label selector):
/// 1 to 63 characters, letters, digits, `-`, `_` and `.`, starting and ending with a
/// letter or digit.
pub fn check_proxy_name(name: &str) -> Result<(), String> {
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let ok = (1..=63).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && edge_ok(name.chars().next())
        && edge_ok(name.chars().last());
    match ok {
        true => Ok(()),
        false => Err(format!(
            "{name:?} is not a label value (1-63 letters, digits, '-', '_', '.'; \
             starting and ending with a letter or digit)"
        )),
    }
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

/// Doubtful values found while converting objects, each with the object and field: a
/// source reports them (once per object version).
pub type Warnings = Vec<ConvertError>;

/// Why Services or EndpointSlices carrying these labels are not for this proxy, if they
/// are not.
fn ignored_by_labels(labels: &Labels, options: &ConvertOptions) -> Option<String> {
    if labels.get(HEADLESS_LABEL).is_some() {
        return Some(format!("labelled {HEADLESS_LABEL}"));
    }
    let label = labels.get(SERVICE_PROXY_NAME_LABEL);
    let ours = options.service_proxy_name.as_deref();
    match (is_for_proxy(label, ours), label) {
        (true, _) => None,
        (false, Some(name)) => Some(format!("handled by service proxy {:?}", printable(name))),
        (false, None) => Some("not labelled for this proxy (handled by the default one)".into()),
    }
}

#[cfg(test)]
mod tests;
