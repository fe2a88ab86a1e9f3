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
//! - each cluster IP is listed, so a port its service does not define is refused.
//!
//! Load-balancer IPs of a family in which the service has `loadBalancerSourceRanges` get
//! no frontend: upstream drops pods' connections from outside the ranges too, and the
//! source address is not known at `connect()`, so they stay with nftables, which checks.
//!
//! SCTP ports get nothing: they stay on the nftables path.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kpng_model::local::LocalServiceState;
use kpng_model::{Family, LocalNode, Protocol, ServiceKey};

use crate::maps::{Empty, Frontend, GroupId, Key, Target, Value};
use crate::slots::assign_slots;

/// The slots each group of a service holds.
pub type Slots = BTreeMap<GroupId, Vec<Target>>;

/// A service's elements and the slots its groups use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    /// Every element, by key.
    pub elements: BTreeMap<Key, Value>,
    /// The slots of each non-empty group, to keep positions stable at the next render.
    pub slots: Slots,
}

/// The addresses that carry NodePorts for sockets of this node: the node's primary IPs.
/// The one place that decides it, so it can follow the node's configured NodePort
/// addresses once the ENLS carries them.
pub fn nodeport_addresses(node: Option<&LocalNode>) -> Vec<IpAddr> {
    node.map(|n| n.primary_ips.clone()).unwrap_or_default()
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
        service.namespace.as_str(),
        service.name.as_str(),
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

/// Endpoints of `family` in the Cluster and Local sets of one service port.
fn port_sets(
    state: &LocalServiceState,
    family: Family,
    name: &str,
    protocol: Protocol,
) -> (BTreeSet<Target>, BTreeSet<Target>) {
    let (mut cluster, mut local) = (BTreeSet::new(), BTreeSet::new());
    for endpoint in state.endpoints.values().filter(|e| Family::of(&e.ip) == family) {
        for p in endpoint.ports.iter().filter(|p| p.name == name && p.protocol == protocol) {
            if p.cluster {
                cluster.insert((endpoint.ip, p.port));
            }
            if p.local {
                local.insert((endpoint.ip, p.port));
            }
        }
    }
    (cluster, local)
}

struct Out<'a> {
    elements: BTreeMap<Key, Value>,
    previous: &'a Slots,
    slots: Slots,
    affinity_seconds: u32,
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

    fn frontend(&mut self, frontend: Frontend, group: GroupId, empty: Empty) {
        self.elements.insert(Key::Frontend(frontend), Value::Frontend { group, empty });
    }
}

/// The elements of one service, given the slots its groups held before and the addresses
/// that carry NodePorts.
pub fn render_service(
    state: &LocalServiceState,
    nodeport_addrs: &[IpAddr],
    previous: &Slots,
) -> Rendered {
    let svc = &state.service;
    let mut out = Out {
        elements: BTreeMap::new(),
        previous,
        slots: Slots::new(),
        affinity_seconds: svc.affinity_timeout_seconds.unwrap_or(0),
    };
    for family in Family::ALL {
        let Some(cluster_ip) = svc.cluster_ip(family) else { continue };
        out.elements.insert(Key::ClusterIp(cluster_ip), Value::Present);
        let of_family = |ips: &[IpAddr]| -> Vec<IpAddr> {
            ips.iter().copied().filter(|ip| Family::of(ip) == family).collect()
        };
        let firewalled =
            svc.load_balancer_source_ranges.iter().any(|r| Family::of_net(r) == family);
        let lb_ips = if firewalled { Vec::new() } else { of_family(&svc.load_balancer_ips) };
        let externals: Vec<IpAddr> =
            of_family(&svc.external_ips).into_iter().chain(lb_ips).collect();
        let nodeports = of_family(nodeport_addrs);
        for port in svc.ports.iter().filter(|p| p.protocol != Protocol::Sctp) {
            let (cluster, local) = port_sets(state, family, &port.name, port.protocol);
            let id = |kind| {
                group_id(&svc.key, &port.name, port.protocol, family, kind == SetKind::Local)
            };
            let (cluster_id, local_id) = (id(SetKind::Cluster), id(SetKind::Local));

            // The cluster IP: the internal set; an empty one rejects or drops.
            let (internal_id, internal) =
                if svc.internal_local { (local_id, &local) } else { (cluster_id, &cluster) };
            out.group(internal_id, internal);
            let empty = if *port.has_endpoints.get(family) { Empty::Drop } else { Empty::Reject };
            let at = |ip| Frontend { ip, protocol: port.protocol, port: port.port };
            out.frontend(at(cluster_ip), internal_id, empty);

            // Addresses reachable from outside, as sockets of this node reach them.
            let outside = externals
                .iter()
                .map(|ip| at(*ip))
                .chain(port.node_port.filter(|np| *np != 0).into_iter().flat_map(|np| {
                    nodeports.iter().map(move |ip| Frontend {
                        ip: *ip,
                        protocol: port.protocol,
                        port: np,
                    })
                }))
                .collect::<Vec<_>>();
            if !outside.is_empty() {
                out.group(cluster_id, &cluster);
            }
            for frontend in outside {
                out.frontend(frontend, cluster_id, Empty::Reject);
            }
        }
    }
    Rendered { elements: out.elements, slots: out.slots }
}

/// The slots a service's groups hold in the maps, read through `lookup`: slots `0..count`
/// of each group its render uses. Used after a restart, so that the first render keeps the
/// kernel's positions and changes nothing that is already right.
pub fn seed_slots(
    state: &LocalServiceState,
    nodeport_addrs: &[IpAddr],
    lookup: impl Fn(&Key) -> Option<Value>,
) -> Slots {
    let groups: BTreeSet<GroupId> = render_service(state, nodeport_addrs, &Slots::new())
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
