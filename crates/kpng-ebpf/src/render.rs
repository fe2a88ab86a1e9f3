//! ENLS → map elements. Pure: a service (and the slots its groups held before) in, the
//! elements the programs need for it out.
//!
//! Per family in which the service has a cluster IP, and per TCP or UDP port:
//! - the Cluster set and the Local set are endpoint groups (only endpoint port entries in
//!   the set count; an entry in neither set is never chosen);
//! - the cluster IP's frontend points at the Local group under internalTrafficPolicy
//!   Local, else at the Cluster group; when that group is empty, sockets are refused if no
//!   endpoint anywhere serves the port, and left to the packet path (which drops) if some
//!   do;
//! - external IPs, load-balancer IPs and the NodePort on each NodePort address point at the
//!   Cluster group: these frontends only serve sockets of this node, which upstream sends
//!   to the Cluster set even under externalTrafficPolicy Local; an empty Cluster set refuses;
//! - each cluster IP is listed, so a port its service does not define is refused;
//! - a UDP port's frontends carry how long an unconnected socket's flow keeps its endpoint
//!   (conntrack's UDP stream timeout), and each of its groups lists, under
//!   [`GroupId::serving`], the endpoints that still serve the port: a flow keeps its
//!   endpoint while it is listed there, as conntrack keeps a flow to an endpoint that left
//!   the set but still serves (terminating).
//!
//! What the ENLS already decided is taken as it is: the NodePort addresses are the node's
//! (`LocalNode::nodeport_addresses`), an address an older service holds on a port (the
//! port's `yielded`) gets no frontend from this service, and an endpoint port in neither
//! set (a UDP endpoint listed only for conntrack) is never chosen.
//!
//! Left to nftables, which has what a socket hook lacks: load-balancer IPs of a family in
//! which the service has `loadBalancerSourceRanges` (upstream drops pods' connections from
//! outside the ranges too, and the source address is not known at `connect()`); NodePorts
//! of a family accepted on every local address (`--nodeport-addresses 0.0.0.0/0`), which
//! nftables matches by the kernel's routing table of local addresses; SCTP ports.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kpng_backend::endpoints::port_sets;
use kpng_backend::proxy::SourceRanges;
use kpng_model::local::{LocalServicePort, LocalServiceState};
use kpng_model::{Family, NodePortAddresses, Protocol, ServiceKey};

use crate::maps::{Empty, Frontend, GroupId, Key, Target, Value};
use kpng_backend::slots::assign_slots;

/// The slots each group of a service holds.
pub type Slots = BTreeMap<GroupId, Vec<Target>>;

/// A service's elements and the slots its groups use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    /// Every element, by key.
    pub elements: BTreeMap<Key, Value>,
    /// The keys among `elements` that are NodePort frontends only. Such a key gives way to
    /// another service's external, load-balancer or cluster IP frontend on the same
    /// address and port, as nftables matches NodePorts after every service address.
    pub nodeports: BTreeSet<Key>,
    /// The slots of each non-empty group, to keep positions stable at the next render.
    pub slots: Slots,
}

/// Which endpoint set a group holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SetKind {
    Cluster,
    Local,
}

/// The stable id of a group: FNV-1a (64 bits) over the service, port, protocol, family and
/// set. The same service port always gets the same id, so a restart reads its slots back.
pub fn group_id(
    service: &ServiceKey,
    port: &str,
    protocol: Protocol,
    family: Family,
    local: bool,
) -> GroupId {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let fields = [
        &**service.namespace(),
        &**service.name(),
        port,
        protocol.as_str(),
        match family {
            Family::V4 => "4",
            Family::V6 => "6",
        },
        if local { "local" } else { "cluster" },
    ];
    for field in fields {
        // A separator that no field contains keeps ("a/b", "c") apart from ("a", "b/c").
        for byte in field.bytes().chain(std::iter::once(0)) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    GroupId(hash)
}

struct Out<'a> {
    elements: BTreeMap<Key, Value>,
    nodeports: BTreeSet<Key>,
    previous: &'a Slots,
    slots: Slots,
    affinity_seconds: u32,
    /// Seconds a UDP flow keeps its endpoint without sending.
    flow_seconds: u32,
}

impl Out<'_> {
    /// The group's elements (count, slots, members), once per render; none when empty.
    fn group(&mut self, id: GroupId, targets: &BTreeSet<Target>) {
        if self.slots.contains_key(&id) || targets.is_empty() {
            return;
        }
        let previous = self.previous.get(&id).map(Vec::as_slice).unwrap_or_default();
        let slots = assign_slots(previous, targets);
        let count = slots.len() as u32;
        self.elements.insert(
            Key::Group(id),
            Value::Group { count, affinity_seconds: self.affinity_seconds },
        );
        for (slot, target) in slots.iter().enumerate() {
            self.elements.insert(Key::Backend(id, slot as u32), Value::Backend(*target));
            if self.affinity_seconds > 0 {
                self.elements.insert(Key::Member(id, *target), Value::Present);
            }
        }
        self.slots.insert(id, slots);
    }

    /// The endpoints that still serve a UDP group's port, under its serving id.
    fn serving(&mut self, id: GroupId, targets: &BTreeSet<Target>) {
        for target in targets {
            self.elements.insert(Key::Member(id.serving(), *target), Value::Present);
        }
    }

    fn frontend(&mut self, frontend: Frontend, group: GroupId, empty: Empty) {
        let flow_seconds = match frontend.protocol {
            Protocol::Udp => self.flow_seconds,
            _ => 0,
        };
        let value = Value::Frontend { group, empty, flow_seconds };
        self.elements.insert(Key::Frontend(frontend), value);
    }
}

/// The addresses of `family` among `ips`.
fn of_family(ips: &[IpAddr], family: Family) -> impl Iterator<Item = IpAddr> + '_ {
    ips.iter().copied().filter(move |ip| Family::of(ip) == family)
}

/// How long an unconnected UDP socket's flow keeps its endpoint without sending, by
/// default: conntrack's UDP stream timeout, as the kernel sets it (120 s).
pub const FLOW_SECONDS: u32 = 120;

/// The elements of one service, given the slots its groups held before, where this node
/// accepts NodePorts, and how long a UDP flow keeps its endpoint ([`FLOW_SECONDS`]).
pub fn render_service(
    state: &LocalServiceState,
    nodeports: &NodePortAddresses,
    previous: &Slots,
    flow_seconds: u32,
) -> Rendered {
    let svc = &state.service;
    let mut out = Out {
        elements: BTreeMap::new(),
        nodeports: BTreeSet::new(),
        previous,
        slots: Slots::new(),
        affinity_seconds: svc.affinity_timeout_seconds.unwrap_or(0),
        flow_seconds,
    };
    for family in Family::ALL {
        let Some(cluster_ip) = svc.cluster_ip(family) else { continue };
        out.elements.insert(Key::ClusterIp(cluster_ip), Value::Present);
        let firewalled = SourceRanges::of(svc, family, &[]).any();
        let lb_ips = of_family(svc.load_balancer_ips(), family).filter(|_| !firewalled);
        let addresses = Addresses {
            family,
            cluster_ip,
            externals: of_family(svc.external_ips(), family).chain(lb_ips).collect(),
            nodeports: of_family(&nodeports.addresses, family).collect(),
        };
        for port in svc.ports.iter().filter(|p| p.protocol != Protocol::Sctp) {
            render_port(&mut out, state, &addresses, port);
        }
    }
    Rendered { elements: out.elements, nodeports: out.nodeports, slots: out.slots }
}

/// A service's addresses in one family.
struct Addresses {
    family: Family,
    cluster_ip: IpAddr,
    /// External IPs, and load-balancer IPs that sockets may reach through eBPF.
    externals: Vec<IpAddr>,
    /// Where the node accepts NodePorts.
    nodeports: Vec<IpAddr>,
}

fn render_port(
    out: &mut Out<'_>,
    state: &LocalServiceState,
    addresses: &Addresses,
    port: &LocalServicePort,
) {
    let (svc, family) = (&state.service, addresses.family);
    let (cluster, local) = port_sets(state, family, &port.name, port.protocol);
    let serving = match port.protocol {
        Protocol::Udp => serving_targets(state, family, port),
        _ => BTreeSet::new(),
    };
    let id = |kind| group_id(&svc.key, &port.name, port.protocol, family, kind == SetKind::Local);
    let (cluster_id, local_id) = (id(SetKind::Cluster), id(SetKind::Local));
    let at = |ip, port_number| Frontend { ip, protocol: port.protocol, port: port_number };

    // The cluster IP: the internal set; an empty one rejects or drops.
    if port.holds(&addresses.cluster_ip) {
        let (internal_id, internal) =
            if svc.internal_local { (local_id, &local) } else { (cluster_id, &cluster) };
        out.group(internal_id, internal);
        out.serving(internal_id, &serving);
        let empty = if *port.has_endpoints.get(family) { Empty::Drop } else { Empty::Reject };
        out.frontend(at(addresses.cluster_ip, port.port), internal_id, empty);
    }

    // Addresses reachable from outside, as sockets of this node reach them: the Cluster
    // set. A NodePort frontend that is also one of the service's own addresses is that.
    let externals: Vec<Frontend> = addresses
        .externals
        .iter()
        .filter(|ip| port.holds(ip))
        .map(|ip| at(*ip, port.port))
        .collect();
    let on_nodes: Vec<Frontend> = match port.node_port.filter(|np| *np != 0) {
        Some(np) => addresses.nodeports.iter().map(|ip| at(*ip, np)).collect(),
        None => Vec::new(),
    };
    if !externals.is_empty() || !on_nodes.is_empty() {
        out.group(cluster_id, &cluster);
        out.serving(cluster_id, &serving);
    }
    for frontend in on_nodes {
        out.frontend(frontend, cluster_id, Empty::Reject);
        out.nodeports.insert(Key::Frontend(frontend));
    }
    for frontend in externals {
        out.frontend(frontend, cluster_id, Empty::Reject);
        out.nodeports.remove(&Key::Frontend(frontend));
    }
}

/// The endpoints of `port` in `family` that still serve it: every endpoint the node state
/// lists for the port (a UDP port's serving endpoints are listed even outside the sets)
/// that is Ready or Serving.
fn serving_targets(
    state: &LocalServiceState,
    family: Family,
    port: &LocalServicePort,
) -> BTreeSet<Target> {
    let endpoints = state.endpoints.values().filter(|e| Family::of(&e.ip) == family);
    let serving = endpoints.filter(|e| e.ready || e.serving);
    serving
        .flat_map(|e| {
            let ports =
                e.ports.iter().filter(|p| *p.name == *port.name && p.protocol == port.protocol);
            ports.map(|p| (e.ip, p.port))
        })
        .collect()
}

/// The slots a service's groups hold in the maps, read through `lookup`: slots `0..count`
/// of each group its render uses. Used after a restart, so that the first render keeps the
/// kernel's positions and changes nothing that is already right.
pub fn seed_slots(
    state: &LocalServiceState,
    nodeports: &NodePortAddresses,
    lookup: impl Fn(&Key) -> Option<Value>,
) -> Slots {
    let groups: BTreeSet<GroupId> = render_service(state, nodeports, &Slots::new(), 0)
        .elements
        .keys()
        .filter_map(|k| match k {
            Key::Group(id) => Some(*id),
            _ => None,
        })
        .collect();
    let mut slots = Slots::new();
    for id in groups {
        let Some(Value::Group { count, .. }) = lookup(&Key::Group(id)) else { continue };
        let list: Vec<Target> = (0..count)
            .map_while(|slot| match lookup(&Key::Backend(id, slot)) {
                Some(Value::Backend(target)) => Some(target),
                _ => None,
            })
            .collect();
        if !list.is_empty() {
            slots.insert(id, list);
        }
    }
    slots
}

#[cfg(test)]
pub(crate) mod tests;
