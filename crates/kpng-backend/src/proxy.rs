//! Proxy facts every dataplane shares, decided once above the backends: how traffic from
//! this node's pods is recognised. (The service CIDRs in force are part of the node state:
//! `LocalNode::service_cidrs`.)

use ipnet::IpNet;
use kpng_model::LocalNode;

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
}
