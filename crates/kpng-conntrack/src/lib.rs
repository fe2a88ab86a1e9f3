//! UDP flow cleanup, the same for every dataplane, and conntrack tuning at start-up.
//!
//! UDP has no connection teardown, so a conntrack entry keeps sending a client's datagrams
//! to the endpoint it first chose, even after that endpoint is gone (the classic DNS
//! blackhole); with socket-level translation (`to-ebpf`) a connected UDP socket is itself
//! pointed at the endpoint. After every state the dataplanes apply, a [`FlowCleaner`]
//! removes the flows of a [`FlowTable`] (conntrack's: [`FlowCleaner::conntrack`]) that head
//! for whose original destination is a service address and port (ClusterIP,
//! external IP, LB IP, or a NodePort on a NodePort address) and whose reply source is not
//! an endpoint that still serves that port — serving anywhere, whether or not this node
//! picks it now (topology hints, a traffic-policy switch, terminating fallback all keep
//! their flows). That covers removed endpoints, endpoints that stopped serving, services
//! scaled to zero, and entries created before the rules existed (their reply source is the
//! service address itself). TCP and SCTP flows are never touched. [`StaleChecks`] answers
//! the question for one flow, for tables that are not dumped by destination.
//!
//! # Layout
//! - this module: which UDP flows are stale ([`udp_checks`], [`stale`], [`StaleChecks`]).
//! - `cleaner`: [`FlowCleaner`], the backend that follows the dataplanes and removes stale
//!   flows on a thread of its own, retrying with backoff; [`CleanerMetrics`].
//! - `table`: [`FlowTable`], where flows are removed, and conntrack's: [`ConntrackTable`],
//!   [`Ctnetlink`].
//! - [`tuning`]: conntrack's sysctls at start-up, as kube-proxy sets them.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kpng_model::local::LocalServiceState;
use kpng_model::{Family, Protocol};

mod cleaner;
mod table;
pub mod tuning;

pub use cleaner::{CleanerMetrics, CleanerStats, FlowCleaner};
pub use table::{ConntrackTable, Ctnetlink, FlowError, FlowTable, Removed};

/// A UDP destination whose entries are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UdpTarget {
    /// A service address and port.
    Dest(SocketAddr),
    /// A NodePort of a family, on any NodePort address.
    NodePort(Family, u16),
}

/// A target and the endpoints that may answer for it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpCheck {
    /// The destination clients use.
    pub target: UdpTarget,
    /// The endpoints serving it (`ip:port` on the endpoint).
    pub serving: Serving,
}

/// Endpoint addresses (`ip:port`), sorted and shared: the checks of one service port on
/// several destinations (cluster IP, external IPs, NodePort) hold one copy, kept by the
/// cleaner for every UDP destination of the node. IPv4 addresses (the checks of an IPv4
/// destination) are kept as 6 bytes each, their octets and port, which sort as the
/// addresses do; any other list as the addresses themselves (32 bytes each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serving(Addresses);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Addresses {
    /// IPv4 addresses only (none included).
    V4(Arc<[[u8; 6]]>),
    /// Any other.
    Any(Arc<[SocketAddr]>),
}

/// An IPv4 address and port as bytes, in the order addresses sort.
fn v4_bytes(address: &SocketAddr) -> Option<[u8; 6]> {
    let SocketAddr::V4(v4) = address else { return None };
    let [a, b, c, d] = v4.ip().octets();
    let [high, low] = v4.port().to_be_bytes();
    Some([a, b, c, d, high, low])
}

fn v4_address(bytes: &[u8; 6]) -> SocketAddr {
    let [a, b, c, d, high, low] = *bytes;
    SocketAddr::from(([a, b, c, d], u16::from_be_bytes([high, low])))
}

impl Default for Serving {
    fn default() -> Self {
        Serving(Addresses::V4(Arc::new([])))
    }
}

impl Serving {
    /// Whether `address` is among them.
    pub fn contains(&self, address: &SocketAddr) -> bool {
        match &self.0 {
            Addresses::V4(all) => v4_bytes(address).is_some_and(|b| all.binary_search(&b).is_ok()),
            Addresses::Any(all) => all.binary_search(address).is_ok(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        match &self.0 {
            Addresses::V4(all) => all.len(),
            Addresses::Any(all) => all.len(),
        }
    }

    /// The addresses, in order.
    pub fn iter(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        let (v4, any): (&[[u8; 6]], &[SocketAddr]) = match &self.0 {
            Addresses::V4(all) => (all, &[]),
            Addresses::Any(all) => (&[], all),
        };
        v4.iter().map(v4_address).chain(any.iter().copied())
    }

    /// Whether every one of them is also in `other`.
    pub fn is_subset(&self, other: &Serving) -> bool {
        self.iter().all(|address| other.contains(&address))
    }
}

impl FromIterator<SocketAddr> for Serving {
    fn from_iter<I: IntoIterator<Item = SocketAddr>>(addresses: I) -> Self {
        let mut addresses: Vec<SocketAddr> = addresses.into_iter().collect();
        addresses.sort_unstable();
        addresses.dedup();
        let v4: Option<Vec<[u8; 6]>> = addresses.iter().map(v4_bytes).collect();
        match v4 {
            Some(v4) => Serving(Addresses::V4(v4.into())),
            None => Serving(Addresses::Any(addresses.into())),
        }
    }
}

/// Every UDP destination of a service, with the endpoints (of the destination's family)
/// that serve its port.
pub fn udp_checks(state: &LocalServiceState) -> Vec<UdpCheck> {
    let svc = &state.service;
    let mut checks = Vec::new();
    for port in svc.ports.iter().filter(|p| p.protocol == Protocol::Udp) {
        for family in Family::ALL {
            if svc.cluster_ip(family).is_none() {
                continue;
            }
            let serving: Serving = state
                .endpoints
                .values()
                .filter(|e| Family::of(&e.ip) == family && (e.ready || e.serving))
                .flat_map(|e| {
                    e.ports
                        .iter()
                        .filter(|p| *p.name == *port.name && p.protocol == port.protocol)
                        .map(move |p| SocketAddr::new(e.ip, p.port))
                })
                .collect();
            for ip in svc.destinations(port, family) {
                let target = UdpTarget::Dest(SocketAddr::new(ip, port.port));
                checks.push(UdpCheck { target, serving: serving.clone() });
            }
            if let Some(node_port) = port.node_port {
                let target = UdpTarget::NodePort(family, node_port);
                checks.push(UdpCheck { target, serving: serving.clone() });
            }
        }
    }
    // Kept by the cleaner for every service: no spare room.
    checks.shrink_to_fit();
    checks
}

/// One conntrack entry, as far as cleanup cares.
pub use kpng_netlink::ctnetlink::Entry;

/// Whether a flow towards `dest` goes to `target` (NodePorts: on one of `nodeport_addrs`).
fn heads_for(target: &UdpTarget, dest: SocketAddr, nodeport_addrs: &[IpAddr]) -> bool {
    match *target {
        UdpTarget::Dest(d) => d == dest,
        UdpTarget::NodePort(_, port) => dest.port() == port && nodeport_addrs.contains(&dest.ip()),
    }
}

/// The entries among `entries` (already those towards the target's port) that are stale.
/// NodePort targets match entries towards one of `nodeport_addrs`.
pub fn stale(entries: &[Entry], check: &UdpCheck, nodeport_addrs: &[IpAddr]) -> Vec<Entry> {
    entries
        .iter()
        .filter(|e| heads_for(&check.target, e.orig_dst, nodeport_addrs))
        .filter(|e| !check.serving.contains(&e.reply_src))
        .copied()
        .collect()
}

/// Checks indexed by destination, for deciding flow by flow.
#[derive(Debug)]
pub struct StaleChecks<'a> {
    dests: HashMap<SocketAddr, &'a Serving>,
    node_ports: HashMap<u16, Vec<&'a UdpCheck>>,
    nodeport_addrs: &'a [IpAddr],
}

impl<'a> StaleChecks<'a> {
    /// `checks` (NodePort ones towards one of `nodeport_addrs`), indexed.
    pub fn new(checks: &'a [UdpCheck], nodeport_addrs: &'a [IpAddr]) -> Self {
        let mut index =
            StaleChecks { dests: HashMap::new(), node_ports: HashMap::new(), nodeport_addrs };
        for check in checks {
            match check.target {
                UdpTarget::Dest(dest) => {
                    index.dests.insert(dest, &check.serving);
                }
                UdpTarget::NodePort(_, port) => {
                    index.node_ports.entry(port).or_default().push(check)
                }
            }
        }
        index
    }

    /// Whether a flow towards `dest`, answered by `endpoint`, is stale: a check covers
    /// `dest` and `endpoint` does not serve it. A flow no check covers is left alone.
    pub fn stale(&self, dest: SocketAddr, endpoint: SocketAddr) -> bool {
        if let Some(serving) = self.dests.get(&dest) {
            return !serving.contains(&endpoint);
        }
        self.node_ports.get(&dest.port()).into_iter().flatten().any(|check| {
            heads_for(&check.target, dest, self.nodeport_addrs)
                && !check.serving.contains(&endpoint)
        })
    }
}

#[cfg(test)]
mod tests;
