//! Where a node accepts NodePorts (`--nodeport-addresses`), as kube-proxy decides it per
//! family: `primary` means the Node object's primary IP; a list of CIDRs means the node's
//! local addresses inside them, or every local address when one of them is a zero CIDR
//! (`0.0.0.0/0`, `::/0`); a family without any CIDR in the list falls back to its primary
//! IP, and a family without a primary IP (the Node object lists none) to every local
//! address, as kube-proxy does. Loopback addresses never carry NodePorts.

use std::net::IpAddr;

use ipnet::IpNet;
use kpng_model::{Family, NodePortAddresses, PerFamily};

/// The `--nodeport-addresses` option.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum NodePortSelection {
    /// The Node object's primary IPs (the default).
    #[default]
    Primary,
    /// Local addresses inside these networks.
    Cidrs(Vec<IpNet>),
}

impl NodePortSelection {
    /// Whether the node's own addresses matter (so they should be watched).
    pub fn needs_local_addresses(&self) -> bool {
        matches!(self, NodePortSelection::Cidrs(_))
    }
}

/// The NodePort addresses of a node with `primary` IPs and `local` addresses.
pub fn nodeport_addresses(
    selection: &NodePortSelection,
    primary: &[IpAddr],
    local: &[IpAddr],
) -> NodePortAddresses {
    let mut out = NodePortAddresses::default();
    for family in Family::ALL {
        let primary_ip: Vec<IpAddr> =
            primary.iter().copied().filter(|ip| Family::of(ip) == family).collect();
        let cidrs: Vec<IpNet> = match selection {
            NodePortSelection::Primary => Vec::new(),
            NodePortSelection::Cidrs(all) => {
                all.iter().copied().filter(|c| Family::of_net(c) == family).collect()
            }
        };
        if cidrs.is_empty() && primary_ip.is_empty() {
            *out.all_local.get_mut(family) = true;
        } else if cidrs.is_empty() {
            out.addresses.extend(primary_ip);
        } else if cidrs.iter().any(|c| c.prefix_len() == 0) {
            *out.all_local.get_mut(family) = true;
        } else {
            out.addresses.extend(local.iter().copied().filter(|ip| {
                Family::of(ip) == family
                    && !ip.is_loopback()
                    && cidrs.iter().any(|c| c.contains(ip))
            }));
        }
    }
    out.addresses.sort();
    out.addresses.dedup();
    out.addresses.shrink_to_fit();
    out
}

/// Whether every family accepts NodePorts everywhere.
pub fn all_families_local(addresses: &NodePortAddresses) -> bool {
    addresses.all_local == PerFamily { v4: true, v6: true }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn cidrs(list: &[&str]) -> NodePortSelection {
        NodePortSelection::Cidrs(list.iter().map(|s| s.parse().unwrap()).collect())
    }

    #[test]
    fn selection_follows_kube_proxy_per_family() {
        let primary = ips(&["192.168.10.1", "fd00:10::1"]);
        let local =
            ips(&["127.0.0.1", "192.168.10.1", "192.168.10.50", "10.0.0.1", "fd00:10::1", "::1"]);
        let got = nodeport_addresses(&NodePortSelection::Primary, &primary, &local);
        assert_eq!(got.addresses, primary);
        // A v4 list: the v4 addresses inside it; v6 falls back to its primary IP.
        let got = nodeport_addresses(&cidrs(&["192.168.10.0/24"]), &primary, &local);
        assert_eq!(got.addresses, ips(&["192.168.10.1", "192.168.10.50", "fd00:10::1"]));
        // A zero CIDR: every local address of that family, by rule.
        let got = nodeport_addresses(&cidrs(&["0.0.0.0/0"]), &primary, &local);
        assert!(got.all_local.v4 && !got.all_local.v6);
        assert_eq!(got.addresses, ips(&["fd00:10::1"]));
        let got = nodeport_addresses(&cidrs(&["0.0.0.0/0", "::/0"]), &primary, &local);
        assert!(all_families_local(&got) && got.addresses.is_empty());
        // Loopback never carries NodePorts.
        let got = nodeport_addresses(&cidrs(&["127.0.0.0/8"]), &primary, &local);
        assert_eq!(got.addresses, ips(&["fd00:10::1"]));
        // A family without a primary IP, and without a CIDR: every local address of it.
        let v4_only = ips(&["192.168.10.1"]);
        let got = nodeport_addresses(&NodePortSelection::Primary, &v4_only, &local);
        assert_eq!(got.addresses, v4_only);
        assert!(got.all_local.v6 && !got.all_local.v4);
        let got = nodeport_addresses(&cidrs(&["192.168.10.0/24"]), &[], &local);
        assert_eq!(got.addresses, ips(&["192.168.10.1", "192.168.10.50"]));
        assert!(got.all_local.v6 && !got.all_local.v4);
    }
}
