//! networking.k8s.io/v1 `ServiceCIDR`, reduced.

use serde::Deserialize;

use super::ObjectMeta;

/// A networking.k8s.io/v1 ServiceCIDR.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ServiceCidr {
    /// `metadata`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `spec`.
    pub spec: Option<ServiceCidrSpec>,
}

/// `spec` of a ServiceCIDR.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ServiceCidrSpec {
    /// `cidrs`: one range per family.
    pub cidrs: Option<Vec<String>>,
}
