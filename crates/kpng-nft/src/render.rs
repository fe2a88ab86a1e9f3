//! ENLS → kernel elements. Pure: a service (and the slots its endpoints held before) in,
//! the elements it needs out.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use kpng_model::local::LocalServiceState;
use kpng_model::{Family, LocalNode, Protocol, ServiceKey};

use crate::affinity::{AffinityGroup, group_hash};
use crate::objects::{Dest, ElementId, Key, MapName, PickKind, Value};
use crate::slots::{Target, assign_slots};

/// Which endpoint set a group of slots holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetKind {
    /// The Cluster set.
    Cluster,
    /// The Local set.
    Local,
}

/// Identifies the slot list of one service port, family and set.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    /// The family.
    pub family: Family,
    /// The service port's name.
    pub port: String,
    /// The service port's protocol.
    pub protocol: Protocol,
    /// The set.
    pub kind: SetKind,
}

/// The slots a service's endpoints occupy, per group.
pub type Slots = BTreeMap<GroupKey, Vec<Target>>;

/// A service's elements and the slots they use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    /// Every element, sorted, without duplicates.
    pub elements: Vec<(ElementId, Value)>,
    /// The slots, to keep positions stable at the next render.
    pub slots: Slots,
    /// ClientIP affinity groups (affinity services only).
    pub affinity: Vec<AffinityGroup>,
}

/// Node facts that shape service elements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// The node's own IPs: a source range containing one also admits the LB IPs themselves.
    pub node_ips: Vec<IpAddr>,
}

impl NodeFacts {
    /// Facts from the ENLS node.
    pub fn from_node(node: Option<&LocalNode>) -> Self {
        NodeFacts { node_ips: node.map(|n| n.primary_ips.clone()).unwrap_or_default() }
    }
}

struct Out<'a> {
    family: Family,
    elements: Vec<(ElementId, Value)>,
    previous: &'a Slots,
    slots: Slots,
    /// The service, and its affinity timeout when it asks for ClientIP affinity.
    service: &'a ServiceKey,
    affinity: Option<u32>,
    /// The current port's groups, by set.
    cluster_group: Option<GroupKey>,
    local_group: Option<GroupKey>,
    groups: Vec<AffinityGroup>,
}

impl Out<'_> {
    fn put(&mut self, map: MapName, key: Key, value: Value) {
        self.elements.push((ElementId { family: self.family, map, key }, value));
    }

    fn member(&mut self, map: MapName, key: Key) {
        self.put(map, key, Value::None);
    }

    /// `key` picks among `slots` of `kind`: it joins the count set for their number, and
    /// each slot is a backends element. For an affinity service, `key` goes to the
    /// affinity chain of its group instead of a count set.
    fn pick(&mut self, kind: PickKind, key: Key, slots: &[Target]) {
        let group = match kind {
            PickKind::Cluster | PickKind::NodePortCluster => self.cluster_group.clone(),
            PickKind::Local | PickKind::NodePortLocal => self.local_group.clone(),
        };
        if let (Some(timeout), Some(group)) = (self.affinity, group) {
            let hash = group_hash(self.service, &group);
            self.put(kind.affinity_map(), key, Value::Affinity(hash));
            if !self.groups.iter().any(|g| g.hash == hash) {
                let protocol = group.protocol;
                self.groups.push(AffinityGroup {
                    hash,
                    family: self.family,
                    protocol,
                    timeout,
                    slots: slots.to_vec(),
                });
            }
        } else {
            self.member(MapName::Count(kind, slots.len() as u32), key);
        }
        // The backends elements: what the pick rules read, and for affinity groups the
        // record of slot positions that a restart reads back.
        for (i, (ip, port)) in slots.iter().enumerate() {
            let slot_key = match key {
                Key::Dest(dest) => Key::DestSlot(dest, i as u32),
                Key::NodePort(protocol, port) => Key::NodePortSlot(protocol, port, i as u32),
                _ => continue,
            };
            self.put(kind.backends(), slot_key, Value::Endpoint(*ip, *port));
        }
    }

    /// Assigns slots for a group and returns them.
    fn slots(&mut self, group: GroupKey, targets: &BTreeSet<Target>) -> Vec<Target> {
        let previous = self.previous.get(&group).map(Vec::as_slice).unwrap_or_default();
        let slots = assign_slots(previous, targets);
        if !slots.is_empty() {
            self.slots.insert(group, slots.clone());
        }
        slots
    }
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

/// The slots a service's groups hold in an existing table, read through `lookup`: for each
/// group, the slots under the first of its destinations that has any. Used after a restart
/// so that re-rendering keeps the kernel's slot positions.
pub fn seed_slots(
    state: &LocalServiceState,
    lookup: impl Fn(&ElementId) -> Option<Value>,
) -> Slots {
    let svc = &state.service;
    let mut slots = Slots::new();
    for family in Family::ALL {
        let Some(cluster_ip) = svc.cluster_ip(family) else { continue };
        let extra: Vec<IpAddr> = svc
            .external_ips
            .iter()
            .chain(&svc.load_balancer_ips)
            .copied()
            .filter(|ip| Family::of(ip) == family)
            .collect();
        for port in &svc.ports {
            let dests: Vec<Key> = std::iter::once(cluster_ip)
                .chain(extra.iter().copied())
                .map(|ip| Key::Dest(Dest { ip, protocol: port.protocol, port: port.port }))
                .chain(port.node_port.map(|np| Key::NodePort(port.protocol, np)))
                .collect();
            for (kind, by_dest, by_nodeport) in [
                (SetKind::Cluster, MapName::ClusterBackends, MapName::NodePortClusterBackends),
                (SetKind::Local, MapName::LocalBackends, MapName::NodePortLocalBackends),
            ] {
                let found = dests.iter().find_map(|dest| {
                    let at = |i: u32| {
                        let (map, key) = match dest {
                            Key::Dest(d) => (by_dest, Key::DestSlot(*d, i)),
                            Key::NodePort(p, n) => (by_nodeport, Key::NodePortSlot(*p, *n, i)),
                            _ => return None,
                        };
                        match lookup(&ElementId { family, map, key }) {
                            Some(Value::Endpoint(ip, port)) => Some((ip, port)),
                            _ => None,
                        }
                    };
                    let list: Vec<Target> = (0..).map_while(at).collect();
                    (!list.is_empty()).then_some(list)
                });
                if let Some(list) = found {
                    let group =
                        GroupKey { family, port: port.name.clone(), protocol: port.protocol, kind };
                    slots.insert(group, list);
                }
            }
        }
    }
    slots
}

/// The elements of one service, given the slots it held before.
pub fn render_service(state: &LocalServiceState, node: &NodeFacts, previous: &Slots) -> Rendered {
    let svc = &state.service;
    let mut out = Out {
        family: Family::V4,
        elements: Vec::new(),
        previous,
        slots: Slots::new(),
        service: &svc.key,
        affinity: svc.affinity_timeout_seconds,
        cluster_group: None,
        local_group: None,
        groups: Vec::new(),
    };
    for family in Family::ALL {
        let Some(cluster_ip) = svc.cluster_ip(family) else { continue };
        out.family = family;
        out.put(MapName::ClusterIps, Key::Addr(cluster_ip), Value::None);
        for endpoint in state.endpoints.values().filter(|e| e.local && Family::of(&e.ip) == family)
        {
            out.put(MapName::Hairpin, Key::AddrPair(endpoint.ip, endpoint.ip), Value::None);
        }
        let of_family = |ips: &[IpAddr]| {
            ips.iter().copied().filter(|ip| Family::of(ip) == family).collect::<Vec<_>>()
        };
        let lb_ips = of_family(&svc.load_balancer_ips);
        let external_ips = of_family(&svc.external_ips);
        let ranges: Vec<IpNet> = svc
            .load_balancer_source_ranges
            .iter()
            .copied()
            .filter(|r| Family::of_net(r) == family)
            .collect();

        for port in &svc.ports {
            let (cluster, local) = port_sets(state, family, &port.name, port.protocol);
            let has_endpoints = *port.has_endpoints.get(family);
            let group =
                |kind| GroupKey { family, port: port.name.clone(), protocol: port.protocol, kind };
            let cluster_slots = out.slots(group(SetKind::Cluster), &cluster);
            let local_slots = out.slots(group(SetKind::Local), &local);
            out.cluster_group = Some(group(SetKind::Cluster));
            out.local_group = Some(group(SetKind::Local));

            // ClusterIP.
            let dest = Dest { ip: cluster_ip, protocol: port.protocol, port: port.port };
            let (kind, dests, slots) = if svc.internal_local {
                (PickKind::Local, MapName::LocalDests, &local_slots)
            } else {
                (PickKind::Cluster, MapName::ClusterDests, &cluster_slots)
            };
            if slots.is_empty() {
                out.member(
                    if has_endpoints { MapName::DropDests } else { MapName::RejectDests },
                    Key::Dest(dest),
                );
            } else {
                out.member(dests, Key::Dest(dest));
                out.pick(kind, Key::Dest(dest), slots);
            }

            // External IPs and load-balancer IPs.
            for ip in external_ips.iter().chain(&lb_ips) {
                let dest = Dest { ip: *ip, protocol: port.protocol, port: port.port };
                external(
                    &mut out,
                    svc.external_local,
                    Key::Dest(dest),
                    &cluster_slots,
                    &local_slots,
                    has_endpoints,
                );
            }
            if !ranges.is_empty() {
                let node_in_range =
                    node.node_ips.iter().any(|ip| ranges.iter().any(|r| r.contains(ip)));
                for ip in &lb_ips {
                    let dest = Dest { ip: *ip, protocol: port.protocol, port: port.port };
                    out.put(MapName::FirewallDests, Key::Dest(dest), Value::None);
                    for range in &ranges {
                        out.put(MapName::FirewallAllow, Key::DestSource(dest, *range), Value::None);
                    }
                    if node_in_range {
                        for own in &lb_ips {
                            out.put(
                                MapName::FirewallAllow,
                                Key::DestSource(dest, IpNet::from(*own)),
                                Value::None,
                            );
                        }
                    }
                }
            }

            // NodePort.
            if let Some(node_port) = port.node_port {
                let key = Key::NodePort(port.protocol, node_port);
                external(
                    &mut out,
                    svc.external_local,
                    key,
                    &cluster_slots,
                    &local_slots,
                    has_endpoints,
                );
            }
        }
    }
    let mut elements = out.elements;
    elements.sort();
    elements.dedup();
    Rendered { elements, slots: out.slots, affinity: out.groups }
}

/// Elements of an external destination (`Key::Dest`) or a NodePort (`Key::NodePort`).
fn external(
    out: &mut Out<'_>,
    external_local: bool,
    key: Key,
    cluster: &[Target],
    local: &[Target],
    has_endpoints: bool,
) {
    let nodeport = matches!(key, Key::NodePort(..));
    let (cluster_kind, local_kind) = if nodeport {
        (PickKind::NodePortCluster, PickKind::NodePortLocal)
    } else {
        (PickKind::Cluster, PickKind::Local)
    };
    let (reject, drop, masq, cluster_dests, local_dests) = if nodeport {
        (
            MapName::RejectNodePorts,
            MapName::DropNodePorts,
            MapName::MasqNodePorts,
            MapName::NodePortClusterDests,
            MapName::NodePortLocalDests,
        )
    } else {
        (
            MapName::RejectDests,
            MapName::DropDests,
            MapName::MasqDests,
            MapName::ClusterDests,
            MapName::ExternalLocalDests,
        )
    };
    if cluster.is_empty() {
        // Nothing anywhere can serve (the Cluster set falls back to terminating endpoints).
        out.member(reject, key);
        return;
    }
    out.pick(cluster_kind, key, cluster);
    if !external_local {
        out.member(masq, key);
        out.member(cluster_dests, key);
        return;
    }
    out.member(local_dests, key);
    if local.is_empty() {
        out.member(if has_endpoints { drop } else { reject }, key);
    } else {
        out.pick(local_kind, key, local);
    }
}

/// The local-traffic detector: `--cluster-cidr` when given, else the node's pod CIDRs.
pub fn local_pods(node: Option<&LocalNode>, cluster_cidrs: &[IpNet]) -> Vec<IpNet> {
    if cluster_cidrs.is_empty() {
        node.map(|n| n.pod_cidrs.clone()).unwrap_or_default()
    } else {
        cluster_cidrs.to_vec()
    }
}

/// Where NodePorts are accepted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NodePortAddresses {
    /// The node's primary IPs (kube-proxy's default).
    #[default]
    Primary,
    /// Local addresses inside these networks.
    Cidrs(Vec<IpNet>),
}

/// The node-level elements: the NodePort addresses.
pub fn render_node(
    node: Option<&LocalNode>,
    nodeports: &NodePortAddresses,
    local_addrs: &[IpAddr],
) -> Vec<(ElementId, Value)> {
    let mut elements = Vec::new();
    let mut put =
        |map, key: Key, family| elements.push((ElementId { family, map, key }, Value::None));
    let addrs: Vec<IpAddr> = match nodeports {
        NodePortAddresses::Primary => node.map(|n| n.primary_ips.clone()).unwrap_or_default(),
        NodePortAddresses::Cidrs(cidrs) => local_addrs
            .iter()
            .copied()
            .filter(|ip| !ip.is_loopback() && cidrs.iter().any(|c| c.contains(ip)))
            .collect(),
    };
    for ip in addrs {
        put(MapName::NodePortAddrs, Key::Addr(ip), Family::of(&ip));
    }
    elements.sort();
    elements.dedup();
    elements
}

#[cfg(test)]
mod tests;
