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

/// What is remembered of one service: its hashes and endpoint addresses packed in one
/// allocation, and the addresses its ports yield behind a pointer (few services yield
/// any).
///
/// The bytes: the service's hash, the bits of the ports without a NodePort (bit `i`: port
/// `i`; ports past the 64th are taken to have one) and the number of IPv4 endpoints, then
/// each endpoint in address order (the IPv4 ones first, as addresses sort), as its
/// address's octets and its hash: 12 bytes for an IPv4 endpoint, 24 for an IPv6 one. Four
/// IPv4 endpoints cost 68 bytes, where a list of addresses and hashes would cost 100 and a
/// record of the service's fields 48 more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePrint {
    bytes: Box<[u8]>,
    /// Per port, the addresses it yields; `None` when no port yields any.
    yielded: Option<Box<Yielded>>,
}

/// Per port, the addresses it yields.
type Yielded = Box<[Box<[IpAddr]>]>;

/// The service's hash, the ports without a NodePort, the number of IPv4 endpoints.
const HEAD: usize = 8 + 8 + 4;
/// An IPv4 endpoint's address and hash.
const V4: usize = 4 + 8;
/// An IPv6 endpoint's address and hash.
const V6: usize = 16 + 8;

impl ServicePrint {
    fn of(state: &LocalServiceState) -> Self {
        let ports = &state.service.ports;
        let without_node_port: u64 = ports
            .iter()
            .take(64)
            .enumerate()
            .filter(|(_, p)| p.node_port.is_none())
            .fold(0, |bits, (i, _)| bits | 1 << i);
        let v4 = state.endpoints.values().filter(|e| e.ip.is_ipv4()).count();
        let v6 = state.endpoints.len() - v4;
        let mut bytes = Vec::with_capacity(HEAD + v4 * V4 + v6 * V6);
        bytes.extend_from_slice(&fingerprint(&state.service).to_le_bytes());
        bytes.extend_from_slice(&without_node_port.to_le_bytes());
        // A service has far fewer than 2^32 endpoints (a node's memory would not hold them).
        bytes.extend_from_slice(&u32::try_from(v4).unwrap_or(u32::MAX).to_le_bytes());
        // The endpoints are in address order: every IPv4 address before every IPv6 one.
        for endpoint in state.endpoints.values() {
            match endpoint.ip {
                IpAddr::V4(ip) => bytes.extend_from_slice(&ip.octets()),
                IpAddr::V6(ip) => bytes.extend_from_slice(&ip.octets()),
            }
            bytes.extend_from_slice(&endpoint_print(endpoint));
        }
        let yields = ports.iter().any(|p| !p.yielded.is_empty());
        let yielded = yields.then(|| Box::new(ports.iter().map(|p| p.yielded.clone()).collect()));
        ServicePrint { bytes: bytes.into_boxed_slice(), yielded }
    }

    fn word(&self, at: usize) -> u64 {
        let bytes = self.bytes.get(at..at + 8).and_then(|b| b.try_into().ok());
        u64::from_le_bytes(bytes.unwrap_or_default())
    }

    /// The IPv4 endpoints' records, then the IPv6 ones'.
    fn records(&self) -> (&[[u8; V4]], &[[u8; V6]]) {
        let count = self.bytes.get(16..HEAD).and_then(|b| b.try_into().ok());
        let v4 = u32::from_le_bytes(count.unwrap_or_default()) as usize;
        let rest = self.bytes.get(HEAD..).unwrap_or_default();
        let (v4, v6) = rest.split_at(rest.len().min(v4 * V4));
        (v4.as_chunks().0, v6.as_chunks().0)
    }

    /// How many endpoints the service had.
    pub fn endpoints(&self) -> usize {
        let (v4, v6) = self.records();
        v4.len() + v6.len()
    }

    /// The hash of endpoint `ip`, if the service had it.
    fn endpoint(&self, ip: &IpAddr) -> Option<[u8; 8]> {
        let (v4, v6) = self.records();
        match ip {
            IpAddr::V4(ip) => find::<4, V4>(v4, &ip.octets()),
            IpAddr::V6(ip) => find::<16, V6>(v6, &ip.octets()),
        }
    }
}

/// An endpoint's record split into its address's octets (`A` bytes) and its hash.
fn split<const A: usize, const R: usize>(record: &[u8; R]) -> (&[u8; A], [u8; 8]) {
    let (address, rest) = record.split_first_chunk::<A>().unwrap_or((&[0; A], &[]));
    (address, rest.first_chunk::<8>().copied().unwrap_or_default())
}

/// The hash in the record of `address` among `records` (sorted by address).
fn find<const A: usize, const R: usize>(records: &[[u8; R]], address: &[u8; A]) -> Option<[u8; 8]> {
    let at = records.binary_search_by(|r| split::<A, R>(r).0.cmp(address)).ok()?;
    Some(split::<A, R>(&records[at]).1)
}

fn endpoint_print(endpoint: &LocalEndpoint) -> [u8; 8] {
    fingerprint(endpoint).to_le_bytes()
}

impl Before for ServicePrint {
    fn same_service(&self, new: &LocalService) -> bool {
        self.word(0) == fingerprint(new)
    }

    fn endpoint_ips(&self) -> Vec<IpAddr> {
        let (v4, v6) = self.records();
        let v4 = v4.iter().map(|r| IpAddr::from(*split::<4, V4>(r).0));
        let v6 = v6.iter().map(|r| IpAddr::from(*split::<16, V6>(r).0));
        v4.chain(v6).collect()
    }

    fn same_endpoint(&self, new: &LocalEndpoint) -> bool {
        self.endpoint(&new.ip) == Some(endpoint_print(new))
    }

    fn yields(&self, port: usize, ip: &IpAddr) -> bool {
        let yielded = self.yielded.as_ref().and_then(|y| y.get(port));
        yielded.is_some_and(|y| y.contains(ip))
    }

    fn lacks_node_port(&self, port: usize) -> bool {
        port < 64 && self.word(8) & (1 << port) != 0
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
    /// The fingerprints of `state`, which is then dropped.
    ///
    /// They are made while it is whole, so that they are not made in the space it frees: a
    /// service's print made right after the service was dropped takes a bit of each page
    /// the service held, and the allocator can give none of those pages back. Made first,
    /// the prints at 100,000 services (11 MiB) leave about 13 MiB more to give back.
    pub fn from_state(state: LocalState) -> Self {
        let node = state.node.clone();
        let mut endpoints = 0;
        let prints: Vec<(ServiceKey, ServicePrint)> = (state.services.iter())
            .map(|(key, service)| {
                let print = ServicePrint::of(service);
                endpoints += print.endpoints();
                (key.clone(), print)
            })
            .collect();
        drop(state);
        let services: BTreeMap<ServiceKey, ServicePrint> = prints.into_iter().collect();
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

#[cfg(test)]
mod tests {
    use kpng_model::{GlobalModel, Object, Protocol};
    use kpng_testkit::builders::{endpoint, service, slice};

    use super::*;
    use crate::project_node_state;

    /// A dual-stack service's state, with the endpoints `v4` and `v6`.
    fn state(v4: &[&str], v6: &[&str], node_port: bool) -> LocalServiceState {
        let mut model = GlobalModel::new();
        let ports = [("http", Protocol::Tcp, 80), ("dns", Protocol::Udp, 53)];
        let mut web = service("ns", "web", &["10.96.0.1", "fd00::1"], &ports);
        if node_port {
            web.service_type = kpng_model::global::ServiceType::NodePort;
            web.ports[1].node_port = Some(30053);
        }
        model.apply(Object::Service(web));
        for (name, ips) in [("web-4", v4), ("web-6", v6)] {
            let endpoints = ips.iter().map(|ip| endpoint(ip, "b")).collect();
            model.apply(Object::EndpointSlice(slice("ns", name, "web", &ports, endpoints)));
        }
        let mut state = project_node_state(&model, "a");
        state.services.remove(&ServiceKey::new("ns", "web")).unwrap()
    }

    #[test]
    fn a_print_knows_each_endpoint_by_its_address_in_either_family() {
        let v4 = ["10.0.0.9", "10.0.0.10", "10.0.1.1"];
        let v6 = ["fd00::20", "fd00::3"];
        let web = state(&v4, &v6, true);
        let print = ServicePrint::of(&web);
        assert_eq!(print.endpoints(), 5);
        let ips: Vec<IpAddr> = web.endpoints.keys().copied().collect();
        assert_eq!(print.endpoint_ips(), ips, "in address order");
        assert!(web.endpoints.values().all(|e| print.same_endpoint(e)));
        assert!(print.same_service(&web.service));
        assert!(
            !print.lacks_node_port(1) && print.lacks_node_port(0) && !print.lacks_node_port(64)
        );

        // A changed endpoint, and addresses the service did not have, are not the same.
        let mut changed = web.endpoints.get(&"fd00::3".parse().unwrap()).unwrap().clone();
        changed.ready = false;
        assert!(!print.same_endpoint(&changed));
        for ip in ["10.0.0.8", "10.0.0.11", "fd00::4", "::ffff:10.0.0.9"] {
            let mut other = changed.clone();
            other.ip = ip.parse().unwrap();
            assert!(!print.same_endpoint(&other), "{ip}");
        }
        let other = state(&v4, &v6, false);
        assert!(!print.same_service(&other.service));
        assert!(print.lacks_node_port(1) != ServicePrint::of(&other).lacks_node_port(1));
    }

    #[test]
    fn a_service_without_endpoints_keeps_only_its_head() {
        let print = ServicePrint::of(&state(&[], &[], false));
        assert_eq!((print.endpoints(), print.bytes.len()), (0, HEAD));
        assert!(print.endpoint_ips().is_empty());
    }
}
