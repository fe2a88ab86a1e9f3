//! Proxy facts every dataplane shares, decided once above the backends: how traffic from
//! this node's pods is recognised, and which sources a load-balancer IP admits. (The
//! service CIDRs in force are part of the node state: `LocalNode::service_cidrs`.)

use std::net::IpAddr;

use ipnet::IpNet;
use kpng_model::local::LocalService;
use kpng_model::{Family, LocalNode};

/// The sources a service's load-balancer IPs of one family admit
/// (`loadBalancerSourceRanges`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRanges {
    /// The ranges of the family, as given.
    pub ranges: Vec<IpNet>,
    /// Whether one of them holds an address of this node: traffic that the node's own
    /// load-balancer IPs forward (hairpinned through the node) is then admitted too, as
    /// upstream admits the load-balancer IPs as sources.
    pub node_in_range: bool,
}

impl SourceRanges {
    /// `service`'s ranges of `family`, for a node of addresses `node_ips`.
    pub fn of(service: &LocalService, family: Family, node_ips: &[IpAddr]) -> SourceRanges {
        let ranges: Vec<IpNet> = service
            .load_balancer_source_ranges()
            .iter()
            .copied()
            .filter(|r| Family::of_net(r) == family)
            .collect();
        let node_in_range = node_ips.iter().any(|ip| ranges.iter().any(|r| r.contains(ip)));
        SourceRanges { ranges, node_in_range }
    }

    /// Whether the load-balancer IPs are firewalled at all.
    pub fn any(&self) -> bool {
        !self.ranges.is_empty()
    }
}

/// How traffic from this node's pods is recognised (kube-proxy's `--detect-local-mode`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum LocalDetection {
    /// `--cluster-cidr` when given, else the Node's `podCIDRs` (the default).
    #[default]
    Auto,
    /// Sources inside `--cluster-cidr` (`ClusterCIDR`).
    ClusterCidr,
    /// Sources inside the Node's `podCIDRs` (`NodeCIDR`).
    NodeCidr,
    /// Packets arriving on `--pod-bridge-interface` (`BridgeInterface`).
    BridgeInterface(String),
    /// Packets arriving on an interface named `--pod-interface-name-prefix*`
    /// (`InterfaceNamePrefix`).
    InterfaceNamePrefix(String),
}

/// Traffic from local pods, as a dataplane must match it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum LocalTraffic {
    /// Not recognised: ClusterIP traffic is not masqueraded for coming from elsewhere, and
    /// pods are not short-circuited under externalTrafficPolicy Local.
    #[default]
    Unknown,
    /// Sources inside these networks.
    Cidrs(Vec<IpNet>),
    /// Packets that arrive on this interface.
    Interface(String),
    /// Packets that arrive on an interface whose name starts so.
    InterfacePrefix(String),
}

impl LocalDetection {
    /// The matcher for `node`, given `--cluster-cidr`.
    pub fn resolve(&self, node: Option<&LocalNode>, cluster_cidrs: &[IpNet]) -> LocalTraffic {
        let cidrs = |nets: &[IpNet]| match nets.is_empty() {
            true => LocalTraffic::Unknown,
            false => LocalTraffic::Cidrs(nets.to_vec()),
        };
        let node_cidrs = || node.map(|n| n.pod_cidrs.clone()).unwrap_or_default();
        match self {
            LocalDetection::Auto if !cluster_cidrs.is_empty() => cidrs(cluster_cidrs),
            LocalDetection::Auto | LocalDetection::NodeCidr => cidrs(&node_cidrs()),
            LocalDetection::ClusterCidr => cidrs(cluster_cidrs),
            LocalDetection::BridgeInterface(name) => LocalTraffic::Interface(name.clone()),
            LocalDetection::InterfaceNamePrefix(prefix) => {
                LocalTraffic::InterfacePrefix(prefix.clone())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(pod: &str) -> LocalNode {
        LocalNode {
            name: "a".into(),
            zone: None,
            primary_ips: vec![],
            pod_cidrs: vec![pod.parse().unwrap()],
            draining: false,
            nodeport_addresses: Default::default(),
            service_cidrs: Vec::new(),
        }
    }

    #[test]
    fn detection_modes_resolve_as_kube_proxy_does() {
        let n = node("10.244.1.0/24");
        let cluster: Vec<IpNet> = vec!["10.244.0.0/16".parse().unwrap()];
        let resolve = |d: LocalDetection, c: &[IpNet]| d.resolve(Some(&n), c);
        assert_eq!(resolve(LocalDetection::Auto, &cluster), LocalTraffic::Cidrs(cluster.clone()));
        assert_eq!(resolve(LocalDetection::Auto, &[]), LocalTraffic::Cidrs(n.pod_cidrs.clone()));
        assert_eq!(
            resolve(LocalDetection::NodeCidr, &cluster),
            LocalTraffic::Cidrs(n.pod_cidrs.clone())
        );
        assert_eq!(resolve(LocalDetection::ClusterCidr, &[]), LocalTraffic::Unknown);
        assert_eq!(
            resolve(LocalDetection::InterfaceNamePrefix("veth".into()), &[]),
            LocalTraffic::InterfacePrefix("veth".into())
        );
    }

    #[test]
    fn source_ranges_are_per_family_and_know_when_they_hold_the_node() {
        let service = LocalService {
            service_type: kpng_model::global::ServiceType::LoadBalancer,
            outside: kpng_model::LocalOutside {
                load_balancer_source_ranges: vec![
                    "192.0.2.0/24".parse().unwrap(),
                    "2001:db8::/32".parse().unwrap(),
                ]
                .into(),
                ..Default::default()
            }
            .boxed(),
            ..crate::bare_service("a", "lb")
        };
        let node: Vec<IpAddr> = vec!["192.0.2.7".parse().unwrap()];
        let v4 = SourceRanges::of(&service, Family::V4, &node);
        assert_eq!(v4.ranges, vec!["192.0.2.0/24".parse::<IpNet>().unwrap()]);
        assert!(v4.any() && v4.node_in_range);
        let v6 = SourceRanges::of(&service, Family::V6, &node);
        assert_eq!(v6.ranges.len(), 1);
        assert!(!v6.node_in_range, "the node has no address in the IPv6 range");
        assert!(!SourceRanges::of(&service, Family::V4, &[]).node_in_range);
    }
}
