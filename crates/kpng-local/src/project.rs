//! Global model → one node's Expected Node-Local State.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use kpng_model::global::{
    Claim, Endpoint, Service, ServicePort, ServiceType, SessionAffinity, TrafficPolicy,
};
use kpng_model::local::{EndpointPort, LocalServicePort, LocalServiceState};
use kpng_model::{
    Family, GlobalModel, LocalEndpoint, LocalNode, LocalOutside, LocalService, LocalState,
    Protocol, ServiceKey,
};

use crate::nodeports::{NodePortSelection, nodeport_addresses};
use crate::select::{NodeView, SetsUsed, select_endpoints};

/// What only the node itself knows: where it accepts NodePorts, its own addresses, and the
/// service CIDRs its options name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeLocal {
    /// The `--nodeport-addresses` option.
    pub nodeports: NodePortSelection,
    /// The node's addresses (only needed for a CIDR selection).
    pub addresses: Vec<IpAddr>,
    /// The `--service-cidr` option: service CIDRs the node enforces besides the ranges of
    /// the cluster's ServiceCIDR objects.
    pub service_cidrs: Vec<IpNet>,
    /// The `--node-ip` option: the node's primary IP of each family given, in place of the
    /// Node object's (kube-proxy's `--bind-address`).
    pub node_ips: Vec<IpAddr>,
}

impl NodeLocal {
    /// Fills in what the node itself decides in `node`: its NodePort addresses, and its own
    /// service CIDRs added to those `node` carries (from ServiceCIDR objects). Completing a
    /// node twice changes nothing more.
    pub fn complete(&self, node: &mut LocalNode) {
        for ip in &self.node_ips {
            node.primary_ips.retain(|p| Family::of(p) != Family::of(ip));
            node.primary_ips.push(*ip);
        }
        if !self.node_ips.is_empty() {
            node.primary_ips.sort_by_key(|ip| Family::of(ip) == Family::V6);
        }
        node.nodeport_addresses =
            nodeport_addresses(&self.nodeports, &node.primary_ips, &self.addresses);
        if !self.service_cidrs.is_empty() {
            let mut cidrs = std::mem::take(&mut node.service_cidrs);
            cidrs.extend_from_slice(&self.service_cidrs);
            node.service_cidrs = normalised(cidrs);
        }
    }
}

/// The ranges of every ServiceCIDR object of `model`, truncated to their network, sorted,
/// without duplicates.
fn cluster_service_cidrs(model: &GlobalModel) -> Vec<IpNet> {
    normalised(model.service_cidrs().flat_map(|c| c.cidrs.iter().copied()).collect())
}

fn normalised(mut cidrs: Vec<IpNet>) -> Vec<IpNet> {
    for cidr in &mut cidrs {
        *cidr = cidr.trunc();
    }
    cidrs.sort();
    cidrs.dedup();
    cidrs
}

/// What the node knows about itself, from its Node object (`None` until the model has one)
/// and the cluster's ServiceCIDRs, with NodePorts on its primary IPs. The primary IPs are
/// those of the Node object, IPv4 first, unless [`NodeLocal::node_ips`] overrides one.
pub fn project_node(model: &GlobalModel, name: &str) -> Option<LocalNode> {
    project_node_with(model, name, &NodeLocal::default())
}

/// [`project_node`], with what only the node knows.
pub fn project_node_with(model: &GlobalModel, name: &str, local: &NodeLocal) -> Option<LocalNode> {
    let node = model.node(name)?;
    let mut projected = LocalNode {
        name: node.name.clone(),
        zone: node.zone().map(str::to_string),
        primary_ips: primary_ips(node),
        pod_cidrs: node.pod_cidrs.clone(),
        draining: node.deleting || node.to_be_deleted,
        nodeport_addresses: Default::default(),
        service_cidrs: cluster_service_cidrs(model),
    };
    local.complete(&mut projected);
    Some(projected)
}

fn primary_ips(node: &kpng_model::Node) -> Vec<IpAddr> {
    Family::ALL.iter().filter_map(|f| node.primary_ip(*f)).collect()
}

/// The whole ENLS of node `name` (NodePorts on its primary IPs).
pub fn project_node_state(model: &GlobalModel, name: &str) -> LocalState {
    project_node_state_with(model, name, &NodeLocal::default())
}

/// [`project_node_state`], with what only the node knows.
pub fn project_node_state_with(model: &GlobalModel, name: &str, local: &NodeLocal) -> LocalState {
    let node = project_node_with(model, name, local);
    let view = NodeView { name, zone: node.as_ref().and_then(|n| n.zone.as_deref()) };
    let keys: Vec<&ServiceKey> = model.services().map(|s| &s.key).collect();
    let threads = kpng_model::parts::threads_for(keys.len());
    let services = project_services_on(model, &keys, &view, threads).into_iter().collect();
    LocalState { node, services }
}

/// The services `keys` projected on `threads` threads (see [`kpng_model::parts`]), in the
/// order of `keys`.
fn project_services_on(
    model: &GlobalModel,
    keys: &[&ServiceKey],
    view: &NodeView<'_>,
    threads: usize,
) -> Vec<(ServiceKey, LocalServiceState)> {
    kpng_model::parts::filter_map_in_parts(keys, threads, |key| {
        project_service(model, key, view).map(|state| ((*key).clone(), state))
    })
}

/// One service as `node` must enforce it, with the endpoints that are in one of its sets;
/// `None` if the model does not hold the service.
pub fn project_service(
    model: &GlobalModel,
    key: &ServiceKey,
    node: &NodeView<'_>,
) -> Option<LocalServiceState> {
    let service = model.service(key)?;
    let mut local = local_service(model, service);
    // Each endpoint's preferred copy, and every (endpoint, port) it serves: one list for
    // the service, not one per endpoint.
    let mut endpoints: BTreeMap<IpAddr, &Endpoint> = BTreeMap::new();
    let mut served: Vec<(IpAddr, EndpointPort)> = Vec::new();

    for family in Family::ALL {
        if service.cluster_ip(family).is_none() {
            continue;
        }
        let external_addresses = service.load_balancer_vips(family).next().is_some()
            || service.external_ips_of(family).next().is_some();
        for (port, local_port) in service.ports.iter().zip(&mut local.ports) {
            let candidates = port_candidates(model, key, family, port);
            let accessible = port.node_port.is_some() || external_addresses;
            let used = sets_used(service, accessible);
            let refs: Vec<&Endpoint> = candidates.iter().map(|(e, _)| *e).collect();
            let selection = select_endpoints(&refs, node, used);
            *local_port.has_endpoints.get_mut(family) = selection.has_endpoints;
            // The model's copy of the port's name, for all its endpoints.
            let name = &port.name;
            for (i, (endpoint, number)) in candidates.iter().enumerate() {
                let (cluster, local) = (selection.cluster[i], selection.local[i]);
                // A UDP endpoint this node does not pick but that still serves stays in
                // the state: its conntrack entries must outlive topology and policy changes.
                let serving =
                    port.protocol == Protocol::Udp && (endpoint.ready || endpoint.serving);
                if !(cluster || local || serving) {
                    continue;
                }
                let preferred = endpoints.entry(endpoint.address).or_insert(endpoint);
                // Endpoint-level conditions come from a non-terminating copy when there is one.
                if preferred.terminating && !endpoint.terminating {
                    *preferred = endpoint;
                }
                let port = EndpointPort {
                    name: name.clone(),
                    protocol: port.protocol,
                    port: *number,
                    cluster,
                    local,
                };
                served.push((endpoint.address, port));
            }
        }
    }

    served.sort_unstable();
    served.dedup();
    let mut lists = PortLists::default();
    let mut rest = &served[..];
    let endpoints = endpoints
        .into_values()
        .map(|e| {
            // `served` is sorted by address, as `endpoints` is, and each endpoint serves at
            // least one port.
            let count = rest.iter().take_while(|(ip, _)| *ip == e.address).count();
            let (ports, tail) = rest.split_at(count);
            rest = tail;
            LocalEndpoint {
                ip: e.address,
                local: node.is_local(e),
                ready: e.ready,
                serving: e.serving,
                terminating: e.terminating,
                pod_name: e.pod_name.clone(),
                ports: lists.share(ports.iter().map(|(_, port)| port)),
            }
        })
        .collect();
    Some(LocalServiceState { service: local, endpoints })
}

/// The sets a port uses, as kube-proxy's `UsesClusterEndpoints` / `UsesLocalEndpoints`.
fn sets_used(service: &Service, externally_accessible: bool) -> SetsUsed {
    let internal_local = service.internal_traffic_policy == TrafficPolicy::Local;
    let external_local = service.external_traffic_policy == TrafficPolicy::Local;
    SetsUsed {
        cluster: !internal_local || externally_accessible,
        local: internal_local || (external_local && externally_accessible),
    }
}

/// Up to how many candidates [`port_candidates`] scans for copies of an endpoint.
const SCANNED_CANDIDATES: usize = 32;

/// The endpoints of `family` that serve `port`, one per IP and port number: a copy (in
/// slice order) replaces the one before it unless it is terminating, so a non-terminating
/// copy wins over a terminating one and a terminating copy never replaces another.
fn port_candidates<'m>(
    model: &'m GlobalModel,
    key: &ServiceKey,
    family: Family,
    port: &ServicePort,
) -> Vec<(&'m Endpoint, u16)> {
    let mut candidates: Vec<(&Endpoint, u16)> = Vec::new();
    // Copies are found by a scan while there are few candidates (nearly every service),
    // by an index beyond.
    let mut index: Option<HashMap<(IpAddr, u16), usize>> = None;
    for slice in model.slices_of(key).filter(|s| s.family == family) {
        let numbers =
            slice.ports.iter().filter(|p| p.name == port.name && p.protocol == port.protocol);
        for number in numbers.map(|p| p.port) {
            for endpoint in slice.endpoints.iter().filter(|e| Family::of(&e.address) == family) {
                let copy = match &index {
                    Some(index) => index.get(&(endpoint.address, number)).copied(),
                    None => candidates
                        .iter()
                        .position(|(e, n)| e.address == endpoint.address && *n == number),
                };
                match copy {
                    None => {
                        if let Some(index) = &mut index {
                            index.insert((endpoint.address, number), candidates.len());
                        }
                        candidates.push((endpoint, number));
                        if index.is_none() && candidates.len() > SCANNED_CANDIDATES {
                            let at = candidates.iter().enumerate();
                            index = Some(at.map(|(i, (e, n))| ((e.address, *n), i)).collect());
                        }
                    }
                    Some(i) if !endpoint.terminating => candidates[i] = (endpoint, number),
                    Some(_) => {}
                }
            }
        }
    }
    candidates
}

/// The service-level part of the ENLS.
/// IP lists in the ENLS are sorted (IPv4 first), whatever order the API gave.
fn sorted(ips: &[IpAddr]) -> Box<[IpAddr]> {
    let mut ips = ips.to_vec();
    ips.sort();
    ips.dedup();
    ips.into()
}

/// The addresses of `service` whose destination on `port` an older service holds.
fn yielded(model: &GlobalModel, service: &Service, port: &ServicePort) -> Box<[IpAddr]> {
    let addresses = service
        .cluster_ips
        .iter()
        .copied()
        .chain(service.external_ips().iter().copied())
        .chain(Family::ALL.iter().flat_map(|f| service.load_balancer_vips(*f)));
    let mut yielded: Vec<IpAddr> = addresses
        .filter(|ip| !model.holds(service, &Claim::Address(*ip, port.protocol, port.port)))
        .collect();
    yielded.sort();
    yielded.dedup();
    yielded.into()
}

fn local_service(model: &GlobalModel, service: &Service) -> LocalService {
    let mut load_balancer_ips: Vec<IpAddr> =
        Family::ALL.iter().flat_map(|f| service.load_balancer_vips(*f)).collect();
    load_balancer_ips.sort();
    load_balancer_ips.dedup();
    let externally_accessible = service.ports.iter().any(|p| p.node_port.is_some())
        || !load_balancer_ips.is_empty()
        || !service.external_ips().is_empty();
    let external_local =
        service.external_traffic_policy == TrafficPolicy::Local && externally_accessible;
    LocalService {
        key: service.key.clone(),
        service_type: service.service_type,
        cluster_ips: sorted(&service.cluster_ips),
        outside: LocalOutside {
            external_ips: sorted(service.external_ips()),
            load_balancer_ips: load_balancer_ips.into(),
            load_balancer_source_ranges: service.load_balancer_source_ranges().into(),
        }
        .boxed(),
        ports: service
            .ports
            .iter()
            .map(|p| LocalServicePort {
                name: p.name.clone(),
                protocol: p.protocol,
                port: p.port,
                node_port: p
                    .node_port
                    .filter(|n| model.holds(service, &Claim::NodePort(p.protocol, *n))),
                has_endpoints: Default::default(),
                yielded: yielded(model, service, p),
            })
            .collect(),
        affinity_timeout_seconds: match service.session_affinity {
            SessionAffinity::None => None,
            SessionAffinity::ClientIP { timeout_seconds } => Some(timeout_seconds),
        },
        internal_local: service.internal_traffic_policy == TrafficPolicy::Local,
        external_local,
        health_check_node_port: service
            .health_check_node_port
            .filter(|_| service.service_type == ServiceType::LoadBalancer && external_local),
        load_balancing: service.load_balancing,
    }
}

/// Up to how many distinct port lists [`PortLists`] keeps for a service.
const SHARED_LISTS: usize = 8;

/// The port lists a service's endpoints have: nearly every endpoint of a service serves
/// the same ports in the same sets (a local endpoint's differ when the service uses its
/// Local set), so they share one list instead of each holding its own (at 30,000
/// services, 120,000 lists of one port).
#[derive(Default)]
struct PortLists(Vec<Arc<[EndpointPort]>>);

impl PortLists {
    /// `ports` as a list equal to it that an earlier endpoint has, or as a new one.
    fn share<'p>(
        &mut self,
        ports: impl Iterator<Item = &'p EndpointPort> + Clone,
    ) -> Arc<[EndpointPort]> {
        let equal = |list: &&Arc<[EndpointPort]>| list.iter().eq(ports.clone());
        if let Some(list) = self.0.iter().find(equal) {
            return list.clone();
        }
        let list: Arc<[EndpointPort]> = ports.cloned().collect();
        if self.0.len() < SHARED_LISTS {
            self.0.push(list.clone());
        }
        list
    }
}

#[cfg(test)]
mod tests;
