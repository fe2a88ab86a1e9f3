//! proptest strategies over a small universe, so that random objects often share keys,
//! addresses, nodes and zones, and random streams update and delete what they created.

use std::collections::BTreeMap;
use std::net::IpAddr;

use kpng_model::global::{
    Endpoint, EndpointSlice, Helper, Hints, IpMode, LoadBalancerIngress, LoadBalancing, LogPath,
    NatMode, Node, NodeAddress, NodeAddressKind, Outside, Persistence, PersistenceKey, Placement,
    Scheduler, Service, ServiceCidr, ServiceKey, ServicePort, ServiceType, SessionAffinity,
    SliceKey, SlicePort, TargetPort, TrafficPolicy, ZONE_LABEL,
};
use kpng_model::{Family, Object, ObjectRef, Protocol};
use proptest::prelude::*;
use proptest::sample::{select, subsequence};

/// Node names of the universe.
pub const NODES: [&str; 3] = ["n0", "n1", "n2"];
const NAMESPACES: [&str; 2] = ["a", "b"];
const SERVICES: [&str; 3] = ["s0", "s1", "s2"];
const ZONES: [&str; 2] = ["z0", "z1"];
const PORTS: [(&str, Protocol, u16); 3] =
    [("http", Protocol::Tcp, 80), ("dns", Protocol::Udp, 53), ("", Protocol::Tcp, 8080)];

/// A change a source could report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    /// Create or update an object.
    Apply(Object),
    /// Delete an object.
    Delete(ObjectRef),
}

impl Mutation {
    /// Applies the mutation to `model`; returns what it touched.
    pub fn apply_to(&self, model: &mut kpng_model::GlobalModel) -> Vec<kpng_model::Touched> {
        match self {
            Mutation::Apply(o) => model.apply(o.clone()),
            Mutation::Delete(k) => model.delete(k),
        }
        .unwrap_or_default()
    }
}

/// A model changed by random histories, a batch of mutations at a time.
#[derive(Debug, Default)]
pub struct History {
    /// The model after the batches so far.
    pub model: kpng_model::GlobalModel,
    started: bool,
}

impl History {
    /// Applies `mutations`; returns what a projection must look at: everything after the
    /// first batch, then what each batch touched.
    pub fn step(&mut self, mutations: &[Mutation]) -> kpng_model::Changes {
        let mut touched = std::collections::BTreeSet::new();
        for mutation in mutations {
            touched.extend(mutation.apply_to(&mut self.model));
        }
        match std::mem::replace(&mut self.started, true) {
            false => kpng_model::Changes::All,
            true => kpng_model::Changes::Touched(touched),
        }
    }
}

/// The model `mutations` build from nothing.
pub fn build(mutations: &[Mutation]) -> kpng_model::GlobalModel {
    let mut model = kpng_model::GlobalModel::new();
    for m in mutations {
        m.apply_to(&mut model);
    }
    model
}

fn ip(family: Family, n: u8) -> IpAddr {
    match family {
        Family::V4 => IpAddr::from([10, 0, 0, n]),
        Family::V6 => IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, n as u16]),
    }
}

fn arb_family() -> impl Strategy<Value = Family> {
    prop_oneof![Just(Family::V4), Just(Family::V6)]
}

fn arb_ip(family: Family) -> impl Strategy<Value = IpAddr> {
    (1u8..=6).prop_map(move |n| ip(family, n))
}

fn arb_any_ip() -> impl Strategy<Value = IpAddr> {
    arb_family().prop_flat_map(arb_ip)
}

fn arb_policy() -> impl Strategy<Value = TrafficPolicy> {
    prop_oneof![3 => Just(TrafficPolicy::Cluster), 1 => Just(TrafficPolicy::Local)]
}

fn arb_names(universe: &'static [&'static str]) -> impl Strategy<Value = Vec<String>> {
    subsequence(universe, 0..=universe.len())
        .prop_map(|v| v.into_iter().map(str::to_string).collect())
}

/// A service key of the universe.
pub fn arb_service_key() -> impl Strategy<Value = ServiceKey> {
    (select(&NAMESPACES[..]), select(&SERVICES[..])).prop_map(|(ns, n)| ServiceKey::new(ns, n))
}

/// A service of the universe.
pub fn arb_service() -> impl Strategy<Value = Service> {
    let families = prop_oneof![
        Just(vec![Family::V4]),
        Just(vec![Family::V6]),
        Just(vec![Family::V4, Family::V6])
    ];
    (
        arb_service_key(),
        families,
        subsequence(&PORTS[..], 1..=PORTS.len()),
        prop_oneof![
            Just(ServiceType::ClusterIP),
            Just(ServiceType::NodePort),
            Just(ServiceType::LoadBalancer)
        ],
        proptest::collection::vec(arb_any_ip(), 0..2),
        proptest::collection::vec((arb_any_ip(), any::<bool>()), 0..2),
        (arb_policy(), arb_policy(), any::<bool>(), proptest::option::of(30000u16..30010)),
        (
            arb_proxy_name(),
            proptest::option::of(1_500_000_000i64..1_800_000_000),
            arb_load_balancing(),
        ),
    )
        .prop_map(
            |(key, families, ports, service_type, mut external_ips, ingress, policies, meta)| {
                let (itp, etp, affinity, hc) = policies;
                let (proxy_name, created_at, load_balancing) = meta;
                let node_ports = service_type != ServiceType::ClusterIP;
                external_ips.sort();
                external_ips.dedup();
                let mut load_balancer_ingress: Vec<LoadBalancerIngress> = ingress
                    .into_iter()
                    .filter(|_| service_type == ServiceType::LoadBalancer)
                    .map(|(ip, proxy)| LoadBalancerIngress {
                        ip,
                        ip_mode: if proxy { IpMode::Proxy } else { IpMode::VIP },
                    })
                    .collect();
                load_balancer_ingress.sort();
                load_balancer_ingress.dedup();
                let external = service_type != ServiceType::ClusterIP;
                Service {
                    cluster_ips: families.iter().map(|f| ip(*f, 100)).collect(),
                    ports: ports
                        .iter()
                        .enumerate()
                        .map(|(i, (name, protocol, port))| ServicePort {
                            name: (*name).into(),
                            protocol: *protocol,
                            port: *port,
                            node_port: node_ports.then_some(30100 + i as u16),
                            target_port: TargetPort::Number(*port),
                        })
                        .collect(),
                    outside: Outside {
                        external_ips: external_ips.into(),
                        load_balancer_ingress: load_balancer_ingress.into(),
                        load_balancer_source_ranges: Box::default(),
                    }
                    .boxed(),
                    session_affinity: if affinity {
                        SessionAffinity::ClientIP { timeout_seconds: 10_800 }
                    } else {
                        SessionAffinity::None
                    },
                    internal_traffic_policy: itp,
                    external_traffic_policy: if external { etp } else { TrafficPolicy::Cluster },
                    health_check_node_port: hc.filter(|_| {
                        service_type == ServiceType::LoadBalancer && etp == TrafficPolicy::Local
                    }),
                    key,
                    service_type,
                    proxy_name: proxy_name.map(Into::into),
                    created_at,
                    load_balancing,
                }
            },
        )
}

/// Load-balancing settings: usually none, else any combination of values.
pub fn arb_load_balancing() -> impl Strategy<Value = LoadBalancing> {
    fn of<T: Copy + std::fmt::Debug + 'static>(
        all: &'static [(T, &'static str)],
    ) -> impl Strategy<Value = Option<T>> {
        proptest::option::of(select(all).prop_map(|(v, _)| v))
    }
    let settings = (
        of(Scheduler::ALL),
        of(PersistenceKey::ALL),
        1u32..100_000,
        of(NatMode::ALL),
        of(Helper::ALL),
        of(LogPath::ALL),
    )
        .prop_map(|(scheduler, key, timeout_seconds, mode, helper, log)| LoadBalancing {
            scheduler,
            persistence: key.map(|key| Persistence { key, timeout_seconds }),
            mode,
            helper,
            log,
        });
    prop_oneof![3 => Just(LoadBalancing::default()), 1 => settings]
}

/// A service-proxy-name label value, usually none.
fn arb_proxy_name() -> impl Strategy<Value = Option<String>> {
    prop_oneof![4 => Just(None), 1 => Just(Some("other".to_string()))]
}

fn arb_endpoint(family: Family) -> impl Strategy<Value = Endpoint> {
    (
        arb_ip(family),
        (any::<bool>(), any::<bool>(), any::<bool>()),
        proptest::option::of(select(&NODES[..])),
        arb_names(&ZONES),
        prop_oneof![3 => Just(vec![]), 1 => arb_names(&NODES)],
    )
        .prop_map(|(address, (ready, serving, terminating), node, zone_hints, node_hints)| {
            Endpoint {
                address,
                ready: ready && !terminating,
                serving: serving || ready,
                terminating,
                placement: Placement::with_hints(node, None, Hints::new(zone_hints, node_hints)),
                pod_name: None,
            }
        })
}

/// A slice key of the universe: two slices per service name.
pub fn arb_slice_key() -> impl Strategy<Value = (SliceKey, String)> {
    (select(&NAMESPACES[..]), select(&SERVICES[..]), 0u8..2)
        .prop_map(|(ns, svc, n)| (SliceKey::new(ns, format!("{svc}-{n}")), svc.to_string()))
}

/// A slice of the universe, usually naming the service its name suggests.
pub fn arb_slice() -> impl Strategy<Value = EndpointSlice> {
    (
        arb_slice_key(),
        arb_family(),
        subsequence(&PORTS[..], 0..=PORTS.len()),
        prop_oneof![9 => Just(None), 1 => select(&SERVICES[..]).prop_map(Some)],
        arb_proxy_name(),
    )
        .prop_flat_map(|((key, svc), family, ports, other, proxy_name)| {
            proptest::collection::vec(arb_endpoint(family), 0..5).prop_map(move |endpoints| {
                EndpointSlice {
                    key: key.clone(),
                    service_name: other.unwrap_or(&svc).into(),
                    family,
                    ports: ports
                        .iter()
                        .map(|(name, protocol, port)| SlicePort {
                            name: (*name).into(),
                            protocol: *protocol,
                            port: *port + 1000,
                        })
                        .collect(),
                    endpoints: endpoints.into(),
                    trigger_time: None,
                    proxy_name: proxy_name.as_deref().map(Into::into),
                }
            })
        })
}

/// A node of the universe.
pub fn arb_node() -> impl Strategy<Value = Node> {
    (select(&NODES[..]), proptest::option::of(select(&ZONES[..])), 1u8..3, any::<bool>()).prop_map(
        |(name, zone, n, deleting)| {
            let mut labels = BTreeMap::new();
            if let Some(zone) = zone {
                labels.insert(ZONE_LABEL.to_string(), zone.to_string());
            }
            Node {
                name: name.to_string(),
                labels,
                addresses: vec![NodeAddress {
                    kind: NodeAddressKind::InternalIP,
                    ip: ip(Family::V4, 200 + n),
                }],
                pod_cidrs: vec![],
                deleting,
                to_be_deleted: false,
            }
        },
    )
}

/// ServiceCIDR names of the universe.
const SERVICE_CIDRS: [&str; 2] = ["kubernetes", "extra"];

/// Service ranges of the universe. As in a real cluster, they hold cluster IPs (`.100`,
/// `::64`) and no pod, external or node address: a proxy drops new connections to an
/// address inside them that no service holds, and checks that after DNAT, as kube-proxy
/// does, so an endpoint inside one would be unreachable.
const SERVICE_NETS: [&str; 4] = ["10.0.0.96/28", "10.96.0.0/16", "fd00::60/124", "fd00:96::/108"];

/// A ServiceCIDR of the universe: one or two ranges.
pub fn arb_service_cidr() -> impl Strategy<Value = ServiceCidr> {
    (select(&SERVICE_CIDRS[..]), subsequence(&SERVICE_NETS[..], 1..=2)).prop_map(|(name, nets)| {
        ServiceCidr::new(name, nets.iter().map(|n| n.parse().expect("a valid CIDR")))
    })
}

/// Any object of the universe.
pub fn arb_object() -> impl Strategy<Value = Object> {
    prop_oneof![
        4 => arb_service().prop_map(Object::Service),
        6 => arb_slice().prop_map(Object::EndpointSlice),
        2 => arb_node().prop_map(Object::Node),
        1 => arb_service_cidr().prop_map(Object::ServiceCidr),
    ]
}

/// A creation, update or deletion in the universe.
pub fn arb_mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => arb_object().prop_map(Mutation::Apply),
        1 => arb_service_key().prop_map(|k| Mutation::Delete(ObjectRef::Service(k))),
        1 => arb_slice_key().prop_map(|(k, _)| Mutation::Delete(ObjectRef::EndpointSlice(k))),
        1 => select(&NODES[..]).prop_map(|n| Mutation::Delete(ObjectRef::Node(n.to_string()))),
        1 => select(&SERVICE_CIDRS[..])
            .prop_map(|n| Mutation::Delete(ObjectRef::ServiceCidr(n.to_string()))),
    ]
}
