//! [`Fingerprints`]: what a projector remembers of a node state to tell the next one's
//! differences, without a copy of its services and endpoints.
//!
//! Per service it keeps a 64-bit hash of the service, one per endpoint with the endpoint's
//! address (the address names the endpoint in a delete), which ports lack their NodePort,
//! and the addresses a port yields (few services yield any). The ops a diff makes from
//! them are those it makes from the state itself; two different values with one hash
//! would hide a change, which at 64 bits does not happen in practice.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

use kpng_model::local::LocalServiceState;
use kpng_model::{LocalEndpoint, LocalNode, LocalService, LocalState, ServiceKey};

use crate::diff::{Before, Prior};

/// The hash of `value`: the same in every run of one build (the hasher has fixed keys).
fn fingerprint<T: Hash + ?Sized>(value: &T) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// What is remembered of one service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePrint {
    service: u64,
    /// Bit `i`: port `i` has no NodePort (ports past the 64th are taken to have one).
    without_node_port: u64,
    /// Per port, the addresses it yields; `None` when no port yields any.
    yielded: Option<Box<[Box<[IpAddr]>]>>,
    /// Each endpoint's address and hash (as bytes: no padding beside the address), in
    /// address order.
    endpoints: Box<[(IpAddr, [u8; 8])]>,
}

impl ServicePrint {
    fn of(state: &LocalServiceState) -> Self {
        let ports = &state.service.ports;
        let without_node_port = ports
            .iter()
            .take(64)
            .enumerate()
            .filter(|(_, p)| p.node_port.is_none())
            .fold(0, |bits, (i, _)| bits | 1 << i);
        let yields = ports.iter().any(|p| !p.yielded.is_empty());
        ServicePrint {
            service: fingerprint(&state.service),
            without_node_port,
            yielded: yields.then(|| ports.iter().map(|p| p.yielded.clone()).collect()),
            endpoints: state.endpoints.values().map(|e| (e.ip, endpoint_print(e))).collect(),
        }
    }

    /// How many endpoints the service had.
    pub fn endpoints(&self) -> usize {
        self.endpoints.len()
    }
}

fn endpoint_print(endpoint: &LocalEndpoint) -> [u8; 8] {
    fingerprint(endpoint).to_le_bytes()
}

impl Before for ServicePrint {
    fn same_service(&self, new: &LocalService) -> bool {
        self.service == fingerprint(new)
    }

    fn endpoint_ips(&self) -> Vec<IpAddr> {
        self.endpoints.iter().map(|(ip, _)| *ip).collect()
    }

    fn same_endpoint(&self, new: &LocalEndpoint) -> bool {
        match self.endpoints.binary_search_by(|(ip, _)| ip.cmp(&new.ip)) {
            Ok(i) => self.endpoints[i].1 == endpoint_print(new),
            Err(_) => false,
        }
    }

    fn yields(&self, port: usize, ip: &IpAddr) -> bool {
        let yielded = self.yielded.as_ref().and_then(|y| y.get(port));
        yielded.is_some_and(|y| y.contains(ip))
    }

    fn lacks_node_port(&self, port: usize) -> bool {
        port < 64 && self.without_node_port & (1 << port) != 0
    }
}

/// The fingerprints of a whole node state: the node itself, kept whole (there is one), and
/// each service's [`ServicePrint`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fingerprints {
    pub(crate) node: Option<LocalNode>,
    pub(crate) services: BTreeMap<ServiceKey, ServicePrint>,
    /// The endpoints of every service.
    endpoints: usize,
}

impl Fingerprints {
    /// The fingerprints of `state`, which is dropped a service at a time as they are made:
    /// the two are never held whole together.
    pub fn from_state(state: LocalState) -> Self {
        let node = state.node;
        let mut endpoints = 0;
        let services: BTreeMap<ServiceKey, ServicePrint> = (state.services.into_iter())
            .map(|(key, service)| {
                let print = ServicePrint::of(&service);
                endpoints += print.endpoints();
                (key, print)
            })
            .collect();
        Fingerprints { node, services, endpoints }
    }

    /// Whether these are the fingerprints of `state`, compared a service at a time (no
    /// fingerprints of the whole state are made).
    pub fn matches(&self, state: &LocalState) -> bool {
        self.node == state.node
            && self.services.len() == state.services.len()
            && (self.services.iter().zip(&state.services))
                .all(|((key, print), (k, s))| key == k && *print == ServicePrint::of(s))
    }

    /// How many services the state has.
    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// How many endpoints its services have together.
    pub fn endpoint_count(&self) -> usize {
        self.endpoints
    }

    /// Remembers `new` as service `key` (`None`: the service is gone).
    pub(crate) fn record(&mut self, key: &ServiceKey, new: Option<&LocalServiceState>) {
        let old = match new {
            Some(new) => self.services.insert(key.clone(), ServicePrint::of(new)),
            None => self.services.remove(key),
        };
        self.endpoints -= old.map_or(0, |o| o.endpoints());
        self.endpoints += new.map_or(0, |n| n.endpoints.len());
    }
}

impl Prior for Fingerprints {
    fn node(&self) -> &Option<LocalNode> {
        &self.node
    }

    fn before(&self, key: &ServiceKey) -> Option<&dyn Before> {
        self.services.get(key).map(|p| p as &dyn Before)
    }

    fn keys(&self) -> Box<dyn Iterator<Item = &ServiceKey> + '_> {
        Box::new(self.services.keys())
    }
}
