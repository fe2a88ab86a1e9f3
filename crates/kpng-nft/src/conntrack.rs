//! UDP conntrack cleanup: which entries to delete after a sync.
//!
//! UDP has no connection teardown, so a conntrack entry keeps sending a client's datagrams
//! to the endpoint it first chose, even after that endpoint is gone (the classic DNS
//! blackhole). After every successful sync kpng deletes the UDP entries whose original
//! destination is a service address and port (ClusterIP, external IP, LB IP, or a NodePort
//! on a NodePort address) and whose reply source is not one of the endpoints this node uses
//! for that port now: that covers removed endpoints, services scaled to zero, and entries
//! created before the rules existed (their reply source is the service address itself).
//! TCP and SCTP entries are never touched.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use kpng_model::local::LocalServiceState;
use kpng_model::{Family, Protocol};

use crate::netlink::ctnetlink::Entry;

/// A UDP destination whose entries are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UdpTarget {
    /// A service address and port.
    Dest(SocketAddr),
    /// A NodePort of a family, on any NodePort address.
    NodePort(Family, u16),
}

/// A target and the endpoints that may answer for it now.
pub type UdpCheck = (UdpTarget, BTreeSet<SocketAddr>);

/// Every UDP destination of a service, with the endpoints (of the destination's family)
/// that serve its port on this node.
pub fn udp_checks(state: &LocalServiceState) -> Vec<UdpCheck> {
    let svc = &state.service;
    let mut checks = Vec::new();
    for port in svc.ports.iter().filter(|p| p.protocol == Protocol::Udp) {
        for family in Family::ALL {
            let Some(cluster_ip) = svc.cluster_ip(family) else { continue };
            let serving: BTreeSet<SocketAddr> = state
                .endpoints
                .values()
                .filter(|e| Family::of(&e.ip) == family)
                .flat_map(|e| {
                    e.ports
                        .iter()
                        .filter(|p| p.name == port.name && p.protocol == port.protocol)
                        .map(move |p| SocketAddr::new(e.ip, p.port))
                })
                .collect();
            let addresses = std::iter::once(cluster_ip)
                .chain(svc.external_ips.iter().copied())
                .chain(svc.load_balancer_ips.iter().copied())
                .filter(|ip| Family::of(ip) == family);
            for ip in addresses {
                checks.push((UdpTarget::Dest(SocketAddr::new(ip, port.port)), serving.clone()));
            }
            if let Some(node_port) = port.node_port {
                checks.push((UdpTarget::NodePort(family, node_port), serving.clone()));
            }
        }
    }
    checks
}

/// The entries among `entries` (already those towards the target's port) that are stale.
pub fn stale(
    entries: &[Entry],
    target: &UdpTarget,
    serving: &BTreeSet<SocketAddr>,
    nodeport_addrs: &[IpAddr],
) -> Vec<Entry> {
    entries
        .iter()
        .filter(|e| match target {
            UdpTarget::Dest(dest) => e.orig_dst == *dest,
            UdpTarget::NodePort(_, port) => {
                e.orig_dst.port() == *port && nodeport_addrs.contains(&e.orig_dst.ip())
            }
        })
        .filter(|e| !serving.contains(&e.reply_src))
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(src: &str, dst: &str, reply: &str) -> Entry {
        Entry {
            orig_src: src.parse().unwrap(),
            orig_dst: dst.parse().unwrap(),
            reply_src: reply.parse().unwrap(),
            zone: 0,
        }
    }

    #[test]
    fn stale_entries_answer_from_elsewhere() {
        let target = UdpTarget::Dest("10.96.0.10:53".parse().unwrap());
        let serving: BTreeSet<SocketAddr> = ["10.244.0.5:53".parse().unwrap()].into();
        let entries = [
            entry("10.244.0.9:4000", "10.96.0.10:53", "10.244.0.5:53"), // current endpoint: kept
            entry("10.244.0.9:4001", "10.96.0.10:53", "10.244.1.7:53"), // removed endpoint
            entry("10.244.0.9:4002", "10.96.0.10:53", "10.96.0.10:53"), // created before the rules
            entry("10.244.0.9:4003", "10.96.0.11:53", "10.244.1.7:53"), // another service
        ];
        let got: Vec<u16> =
            stale(&entries, &target, &serving, &[]).iter().map(|e| e.orig_src.port()).collect();
        assert_eq!(got, [4001, 4002]);
        // Scaled to zero: everything towards the service goes.
        assert_eq!(stale(&entries, &target, &BTreeSet::new(), &[]).len(), 3);
    }

    #[test]
    fn node_ports_only_on_node_port_addresses() {
        let target = UdpTarget::NodePort(Family::V4, 30053);
        let entries = [
            entry("192.168.10.100:4000", "192.168.10.1:30053", "10.244.1.7:53"),
            entry("192.168.10.100:4001", "172.17.0.1:30053", "172.17.0.1:30053"),
        ];
        let got = stale(&entries, &target, &BTreeSet::new(), &["192.168.10.1".parse().unwrap()]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].orig_src.port(), 4000);
    }
}
