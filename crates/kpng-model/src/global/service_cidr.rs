//! ServiceCIDRs (`networking.k8s.io/v1`): the ranges cluster IPs are allocated from.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// A ServiceCIDR, reduced to its ranges. A proxy may treat an address inside them that no
/// service holds as unallocated (upstream drops traffic to it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServiceCidr {
    /// The object's name (ServiceCIDRs are cluster-scoped).
    pub name: String,
    /// `spec.cidrs`, truncated to their network, sorted, without duplicates.
    pub cidrs: Vec<IpNet>,
}

impl ServiceCidr {
    /// A ServiceCIDR named `name` over `cidrs`, normalised: each network truncated, then
    /// sorted and deduplicated.
    pub fn new(name: impl Into<String>, cidrs: impl IntoIterator<Item = IpNet>) -> Self {
        let mut cidrs: Vec<IpNet> = cidrs.into_iter().map(|c| c.trunc()).collect();
        cidrs.sort();
        cidrs.dedup();
        cidrs.shrink_to_fit();
        ServiceCidr { name: name.into(), cidrs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::global::{GlobalModel, Object, ObjectRef, Touched};

    #[test]
    fn a_change_to_any_service_cidr_touches_the_set() {
        let mut model = GlobalModel::new();
        let cidr = ServiceCidr::new("kubernetes", ["10.96.0.0/16".parse().unwrap()]);
        let touched = model.apply(Object::ServiceCidr(cidr.clone()));
        assert_eq!(touched, Some(vec![Touched::ServiceCidrs]));
        assert_eq!(model.apply(Object::ServiceCidr(cidr.clone())), None, "equal: no change");
        assert_eq!(model.service_cidrs().collect::<Vec<_>>(), [&cidr]);
        let key = ObjectRef::ServiceCidr("kubernetes".into());
        assert_eq!(model.delete(&key), Some(vec![Touched::ServiceCidrs]));
        assert_eq!(model.delete(&key), None);
        assert!(model.is_empty());
    }

    #[test]
    fn networks_are_truncated_sorted_and_unique() {
        let nets = ["fd00:96::1/112", "10.96.3.4/16", "10.96.0.0/16"].map(|n| n.parse().unwrap());
        let cidr = ServiceCidr::new("kubernetes", nets);
        let shown: Vec<String> = cidr.cidrs.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["10.96.0.0/16", "fd00:96::/112"]);
    }
}
