//! networking.k8s.io/v1 ServiceCIDR → [`ServiceCidr`].

use kpng_model::ServiceCidr;
use kpng_model::net::parse_cidr;

use super::{ConvertError, Converted, FieldError};
use crate::schema::ServiceCidr as ServiceCidrObject;

/// Converts a ServiceCIDR. ServiceCIDRs are never ignored; one without ranges holds none.
pub fn convert_service_cidr(
    cidr: &ServiceCidrObject,
) -> Result<Converted<ServiceCidr>, ConvertError> {
    let name = cidr.metadata.name.clone().unwrap_or_default();
    let error = |error: FieldError| ConvertError {
        kind: "ServiceCIDR",
        namespace: None,
        name: name.clone(),
        error,
    };
    if name.is_empty() {
        return Err(error(FieldError::new("metadata.name", "missing")));
    }
    let texts = cidr.spec.as_ref().and_then(|s| s.cidrs.as_deref()).unwrap_or_default();
    let nets = texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            parse_cidr(text).map_err(|e| error(FieldError::new(format!("spec.cidrs[{i}]"), e)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Converted::Proxied(ServiceCidr::new(name.clone(), nets)))
}
