//! ENLS → kernel elements. Pure: a service (and the slots its endpoints held before) in,
//! the elements and affinity groups it needs out.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use kpng_backend::endpoints::port_sets;
use kpng_backend::proxy::SourceRanges;
use kpng_model::global::{NatMode, PersistenceKey, Scheduler};
use kpng_model::local::{LocalService, LocalServiceState};
use kpng_model::{Family, LocalNode, ServiceKey};

use crate::affinity::{AffinityGroup, GroupPolicy, Stateless};
use crate::objects::{
    BUCKETS, Dest, ElementId, GroupKey, Key, MapName, PickKind, SetKind, TREE_BITS, TREE_COUNTS,
    Value,
};
use kpng_backend::slots::{Target, assign_slots, assign_sticky_slots};

/// The slots a service's endpoints occupy, per group. Holes (`None`) only in affinity
/// groups, where endpoints never move.
pub type Slots = BTreeMap<GroupKey, Vec<Option<Target>>>;

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

/// Node facts (and the backend's options) that shape service elements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// The node's own IPs: a source range containing one also admits the LB IPs themselves.
    pub node_ips: Vec<IpAddr>,
    /// The masquerade mark bit, which the `mode` annotation sets or clears.
    pub masquerade_mark: u32,
    /// `ct helper` objects cannot be created (the kernel is reached through an
    /// aggregator): the `helper` annotation is not enforced.
    pub without_helpers: bool,
}

impl NodeFacts {
    /// Facts from the ENLS node and the masquerade mark bit.
    pub fn from_node(node: Option<&LocalNode>, masquerade_mark: u32) -> Self {
        NodeFacts {
            node_ips: node.map(|n| n.primary_ips.clone()).unwrap_or_default(),
            masquerade_mark,
            without_helpers: false,
        }
    }
}

/// The policy and timeout of a service's groups, when the service needs chains of its own:
/// ClientIP affinity, or load-balancing settings `to-nft` enforces (see [`GroupPolicy`]).
/// The `persistence` annotation wins over ClientIP affinity; `scheduler: hash` hashes it
/// (`srcip` when unset) instead of sticking to it. `mode: stlsdnat` and `mode: dsr` make
/// the groups stateless: every packet is hashed (`symhash`, or `jhash` of the persistence
/// key, source address and port when unset), without stickiness, logging or helper.
pub fn group_policy(svc: &LocalService, facts: &NodeFacts) -> Option<(GroupPolicy, u32)> {
    let lb = &svc.load_balancing;
    let stateless = match lb.mode {
        Some(NatMode::StatelessDnat) => Some(Stateless::Rewrite),
        Some(NatMode::Dsr) => Some(Stateless::DirectReturn),
        _ => None,
    };
    if stateless.is_some() {
        let scheduler = match lb.scheduler {
            Some(Scheduler::SymmetricHash) => Scheduler::SymmetricHash,
            _ => Scheduler::Hash,
        };
        let policy = GroupPolicy {
            sticky: None,
            scheduler: Some(scheduler),
            hash_key: lb.persistence.map_or(PersistenceKey::SrcIpSrcPort, |p| p.key),
            masquerade: None,
            mark: facts.masquerade_mark,
            log: None,
            helper: None,
            stateless,
        };
        return Some((policy, 0));
    }
    let hashed = lb.scheduler == Some(Scheduler::Hash);
    let (sticky, timeout) = match (hashed, lb.persistence, svc.affinity_timeout_seconds) {
        (true, _, _) => (None, 0),
        (false, Some(p), _) => (Some(p.key), p.timeout_seconds),
        (false, None, Some(t)) => (Some(PersistenceKey::SrcIp), t),
        (false, None, None) => (None, 0),
    };
    let masquerade = match lb.mode {
        Some(NatMode::Snat) => Some(true),
        Some(NatMode::Dnat) => Some(false),
        _ => None,
    };
    let policy = GroupPolicy {
        sticky,
        scheduler: lb.scheduler,
        hash_key: lb.persistence.map_or(PersistenceKey::SrcIp, |p| p.key),
        masquerade,
        mark: facts.masquerade_mark,
        log: lb.log.map(|path| (path, format!("kpng {} ", svc.key))),
        helper: lb.helper.filter(|_| !facts.without_helpers),
        stateless: None,
    };
    let plain = policy.sticky.is_none()
        && policy.scheduler.is_none()
        && policy.masquerade.is_none()
        && policy.log.is_none()
        && policy.helper.is_none();
    (!plain).then_some((policy, timeout))
}

/// The members of the pick structures for `n` endpoints of `kind`: the bit sets of
/// `n - 1` in the tree, or the count set of a count beyond it.
pub fn count_sets(kind: PickKind, n: u32) -> Vec<MapName> {
    if n > TREE_COUNTS {
        return vec![MapName::Count(kind, n)];
    }
    (0..TREE_BITS).filter(|b| (n - 1) >> b & 1 == 1).map(|b| MapName::Bit(kind, b)).collect()
}

struct Out<'a> {
    family: Family,
    elements: Vec<(ElementId, Value)>,
    previous: &'a Slots,
    slots: Slots,
    service: &'a ServiceKey,
    /// The policy and timeout of the service's groups, when it has groups.
    affinity: Option<(GroupPolicy, u32)>,
    /// The current port's ClusterIP destination.
    cluster_dest: Option<Dest>,
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

    /// `key` picks among `slots` of `kind`: it joins the pick structures for their number,
    /// and each live slot is a backends element. For an affinity service, `key` goes to the
    /// affinity chain of its group instead.
    fn pick(&mut self, kind: PickKind, key: Key, slots: &[Option<Target>]) {
        let group = match kind.set_kind() {
            SetKind::Cluster => self.cluster_group.clone(),
            SetKind::Local => self.local_group.clone(),
        };
        if let (Some((policy, timeout)), Some(group)) = (self.affinity.clone(), group) {
            let hash = group.hash(self.service);
            self.put(kind.affinity_map(), key, Value::Affinity(hash));
            if !self.groups.iter().any(|g| g.hash == hash) {
                let protocol = group.protocol;
                let slots = slots.to_vec();
                let stateless = self.cluster_dest.filter(|_| policy.stateless.is_some());
                self.groups.push(AffinityGroup {
                    hash,
                    family: self.family,
                    protocol,
                    timeout,
                    slots,
                    policy,
                    stateless,
                });
            }
        } else {
            for map in count_sets(kind, slots.len() as u32) {
                self.member(map, key);
            }
        }
        // The backends elements: what the pick rules read, and for affinity groups the
        // record of slot positions a restart reads back. Their map is the one of the live
        // count: an affinity group's slots keep holes where endpoints left (its chain picks
        // among the live ones), and a fresh load, which has none, would file them there.
        let live = slots.iter().flatten().count();
        let backends = kind.backends(live as u32);
        for (i, target) in slots.iter().enumerate() {
            if let (Some((ip, port)), Some(slot_key)) = (target, key.slotted(i as u32)) {
                self.put(backends, slot_key, Value::Endpoint(*ip, *port));
            }
        }
    }

    /// Assigns slots for a group and returns them.
    fn slots(&mut self, group: GroupKey, targets: &BTreeSet<Target>) -> Vec<Option<Target>> {
        let previous = self.previous.get(&group).map(Vec::as_slice).unwrap_or_default();
        let slots = if self.affinity.is_some() {
            assign_sticky_slots(previous, targets)
        } else {
            let compact: Vec<Target> = previous.iter().flatten().copied().collect();
            assign_slots(&compact, targets).into_iter().map(Some).collect()
        };
        if !slots.is_empty() {
            self.slots.insert(group, slots.clone());
        }
        slots
    }
}

/// The destinations of one service port in `family` that the service holds: the cluster
/// IP, external and LB IPs, and the NodePort, without those an older service holds (their
/// elements are that service's).
fn port_keys(
    state: &LocalServiceState,
    family: Family,
    port: &kpng_model::local::LocalServicePort,
) -> Vec<Key> {
    let svc = &state.service;
    if svc.cluster_ip(family).is_none() {
        return Vec::new();
    }
    svc.destinations(port, family)
        .map(|ip| Key::Dest(Dest { ip, protocol: port.protocol, port: port.port }))
        .chain(port.node_port.map(|np| Key::NodePort(port.protocol, np)))
        .collect()
}

/// The slots a service's groups hold in an existing table, read through `lookup` (the
/// backends elements): for each group, the slots under the first of its destinations that
/// has any. Used after a restart so that re-rendering keeps the kernel's slot positions.
/// Affinity groups are better seeded from their chains ([`crate::memory`] and the kernel
/// read them back), which also know their holes.
pub fn seed_slots(
    state: &LocalServiceState,
    lookup: impl Fn(&ElementId) -> Option<Value>,
) -> Slots {
    let mut slots = Slots::new();
    for family in Family::ALL {
        for port in &state.service.ports {
            let keys = port_keys(state, family, port);
            for (kind, by_dest, by_nodeport) in [
                (SetKind::Cluster, PickKind::Cluster, PickKind::NodePortCluster),
                (SetKind::Local, PickKind::Local, PickKind::NodePortLocal),
            ] {
                let found = keys.iter().find_map(|key| {
                    let pick = if matches!(key, Key::NodePort(..)) { by_nodeport } else { by_dest };
                    // The slots are in the map of their count's bucket, whichever it was.
                    (0..BUCKETS).find_map(|bucket| {
                        let map = MapName::Backends(pick, bucket);
                        let list = slots_in(&lookup, family, map, key);
                        (!list.is_empty()).then_some(list)
                    })
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

/// The endpoints at slots `0, 1, ...` of `key` in `map`, up to the first slot without one.
fn slots_in(
    lookup: &impl Fn(&ElementId) -> Option<Value>,
    family: Family,
    map: MapName,
    key: &Key,
) -> Vec<Option<Target>> {
    let at = |i: u32| match lookup(&ElementId { family, map, key: key.slotted(i)? }) {
        Some(Value::Endpoint(ip, port)) => Some(Some((ip, port))),
        _ => None,
    };
    (0..).map_while(at).collect()
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
        affinity: group_policy(svc, node),
        cluster_dest: None,
        cluster_group: None,
        local_group: None,
        groups: Vec::new(),
    };
    for family in Family::ALL {
        let Some(cluster_ip) = svc.cluster_ip(family) else { continue };
        out.family = family;
        out.put(MapName::ClusterIps, Key::Addr(cluster_ip), Value::None);
        // A pod reaching itself through the service is masqueraded, whichever node the
        // slice says it runs on.
        let picked =
            state.endpoints.values().filter(|e| e.ports.iter().any(|p| p.cluster || p.local));
        for endpoint in picked.filter(|e| Family::of(&e.ip) == family) {
            out.put(MapName::Hairpin, Key::AddrPair(endpoint.ip, endpoint.ip), Value::None);
        }
        for port in &svc.ports {
            render_port(&mut out, state, node, family, port);
        }
    }
    let mut elements = out.elements;
    elements.sort();
    elements.dedup();
    Rendered { elements, slots: out.slots, affinity: out.groups }
}

fn render_port(
    out: &mut Out<'_>,
    state: &LocalServiceState,
    node: &NodeFacts,
    family: Family,
    port: &kpng_model::local::LocalServicePort,
) {
    let svc = &state.service;
    let (cluster, local) = port_sets(state, family, &port.name, port.protocol);
    let has_endpoints = *port.has_endpoints.get(family);
    let group = |kind| GroupKey { family, port: port.name.clone(), protocol: port.protocol, kind };
    let cluster_slots = out.slots(group(SetKind::Cluster), &cluster);
    let local_slots = out.slots(group(SetKind::Local), &local);
    out.cluster_group = Some(group(SetKind::Cluster));
    out.local_group = Some(group(SetKind::Local));
    let of_family = |ips: &[IpAddr]| -> Vec<IpAddr> {
        ips.iter().copied().filter(|ip| Family::of(ip) == family).collect()
    };
    let lb_ips = of_family(svc.load_balancer_ips());

    // ClusterIP.
    let Some(cluster_ip) = svc.cluster_ip(family) else { return };
    let dest = Dest { ip: cluster_ip, protocol: port.protocol, port: port.port };
    out.cluster_dest = Some(dest);
    // A stateless service's endpoints answer as its ClusterIP whatever the client asked
    // for: its other destinations cannot be served, and say so.
    let stateless = out.affinity.as_ref().is_some_and(|(policy, _)| policy.stateless.is_some());
    let (kind, dests, slots) = if svc.internal_local {
        (PickKind::Local, MapName::LocalDests, &local_slots)
    } else {
        (PickKind::Cluster, MapName::ClusterDests, &cluster_slots)
    };
    if !port.holds(&cluster_ip) {
        // An older service holds this destination.
    } else if slots.is_empty() {
        let verdict = if has_endpoints { MapName::DropDests } else { MapName::RejectDests };
        out.member(verdict, Key::Dest(dest));
    } else {
        out.member(dests, Key::Dest(dest));
        out.pick(kind, Key::Dest(dest), slots);
    }

    // External IPs and load-balancer IPs.
    for ip in of_family(svc.external_ips()).iter().chain(&lb_ips).filter(|ip| port.holds(ip)) {
        let key = Key::Dest(Dest { ip: *ip, protocol: port.protocol, port: port.port });
        if stateless {
            out.member(MapName::RejectDests, key);
            continue;
        }
        external(out, svc.external_local, key, &cluster_slots, &local_slots, has_endpoints);
    }
    let SourceRanges { ranges, node_in_range } = SourceRanges::of(svc, family, &node.node_ips);
    if !ranges.is_empty() {
        for ip in lb_ips.iter().filter(|ip| port.holds(ip)) {
            let dest = Dest { ip: *ip, protocol: port.protocol, port: port.port };
            out.member(MapName::FirewallDests, Key::Dest(dest));
            for range in &ranges {
                out.member(MapName::FirewallAllow, Key::DestSource(dest, *range));
            }
            if node_in_range {
                for own in &lb_ips {
                    out.member(MapName::FirewallAllow, Key::DestSource(dest, IpNet::from(*own)));
                }
            }
        }
    }

    // NodePort.
    if let Some(node_port) = port.node_port {
        let key = Key::NodePort(port.protocol, node_port);
        if stateless {
            out.member(MapName::RejectNodePorts, key);
            return;
        }
        external(out, svc.external_local, key, &cluster_slots, &local_slots, has_endpoints);
    }
}

/// Elements of an external destination (`Key::Dest`) or a NodePort (`Key::NodePort`).
fn external(
    out: &mut Out<'_>,
    external_local: bool,
    key: Key,
    cluster: &[Option<Target>],
    local: &[Option<Target>],
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

/// The node-level elements: the addresses that carry NodePorts.
pub fn render_node(addresses: &[IpAddr]) -> Vec<(ElementId, Value)> {
    let mut elements: Vec<(ElementId, Value)> = addresses
        .iter()
        .map(|ip| {
            let id = ElementId {
                family: Family::of(ip),
                map: MapName::NodePortAddrs,
                key: Key::Addr(*ip),
            };
            (id, Value::None)
        })
        .collect();
    elements.sort();
    elements.dedup();
    elements
}

#[cfg(test)]
mod tests;
