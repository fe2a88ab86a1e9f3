//! Farms: what nftlb is asked to hold for a service, one farm per service port and
//! family, with one backend per endpoint of the port's Cluster set (its Local set with
//! `internalTrafficPolicy: Local`).
//!
//! Names: a farm is `<namespace>--<service>--<port name>` (`default` for an unnamed port;
//! `--ipv6` appended for IPv6), a backend `<pod>--<port name>`, or `<address>--<port name>`
//! for an endpoint without a pod. The namespace keeps two services of the same name in
//! two namespaces from sharing a farm.

use std::collections::BTreeMap;

use kpng_backend::endpoints::port_sets;
use kpng_model::global::{Helper, LogPath, NatMode, PersistenceKey, Scheduler};
use kpng_model::local::{LocalService, LocalServiceState};
use kpng_model::{Family, Protocol};
use serde::{Deserialize, Serialize};

/// A farm's virtual service: what nftlb matches and how it balances. The balancing fields
/// follow the service's load-balancing annotations, which keep nftlb's own spelling.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Vip {
    /// `ipv4` or `ipv6`.
    pub family: String,
    /// The cluster IP.
    pub virtual_addr: String,
    /// The service port.
    pub virtual_ports: String,
    /// `snat` (replies come back through the node), or the `mode` annotation's `dnat`, or
    /// `dsr` when the backend knows the clients' interface.
    pub mode: String,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
    /// The `scheduler` annotation (`rr`, `hash`, `symhash`); without one `weight`: random,
    /// weighted by each backend's weight (all 1: uniform, as kpng's other backends pick).
    pub scheduler: String,
    /// What `hash` hashes (the `persistence` annotation's key); `none` otherwise.
    #[serde(deserialize_with = "trimmed")]
    pub sched_param: String,
    /// Stickiness: the `persistence` annotation's key, `srcip` for ClientIP affinity, or
    /// `none`.
    #[serde(deserialize_with = "trimmed")]
    pub persistence: String,
    /// Idle seconds after which a sticky client is forgotten.
    pub persist_ttl: String,
    /// The `helper` annotation, or `none`.
    pub helper: String,
    /// The `log` annotation (`output`, `forward`), or `none`.
    #[serde(deserialize_with = "trimmed")]
    pub log: String,
}

/// nftlb lists some fields with a trailing space (`"srcip "`).
fn trimmed<'de, D: serde::Deserializer<'de>>(de: D) -> Result<String, D::Error> {
    String::deserialize(de).map(|s| s.trim().to_string())
}

/// The balancing fields of a service's farms, from its load-balancing settings (and
/// ClientIP affinity, which is `srcip` persistence when no `persistence` annotation wins).
struct Balancing {
    mode: &'static str,
    scheduler: &'static str,
    sched_param: &'static str,
    persistence: &'static str,
    persist_ttl: u32,
    helper: &'static str,
    log: &'static str,
}

impl Balancing {
    fn of(service: &LocalService, direct: bool) -> Balancing {
        let lb = &service.load_balancing;
        let hashed = lb.scheduler == Some(Scheduler::Hash);
        let sticky = match (lb.persistence, service.affinity_timeout_seconds) {
            (Some(p), _) => Some((p.key.as_str(), p.timeout_seconds)),
            (None, Some(timeout)) => Some((PersistenceKey::SrcIp.as_str(), timeout)),
            (None, None) => None,
        };
        // Without conntrack (`dsr`) every packet chooses: by a hash of the persistence key,
        // source address and port when unset, or the symmetric hash.
        let stateless = direct && lb.mode == Some(NatMode::Dsr);
        let (sched_param, persistence, persist_ttl) = match sticky {
            _ if stateless && lb.scheduler == Some(Scheduler::SymmetricHash) => {
                ("none", "none", 60)
            }
            _ if stateless => {
                (sticky.map_or(PersistenceKey::SrcIpSrcPort.as_str(), |(key, _)| key), "none", 60)
            }
            // `hash` hashes the key, statelessly (`srcip` when no key is set).
            _ if hashed => (sticky.map_or("srcip", |(key, _)| key), "none", 60),
            Some((key, ttl)) => ("none", key, ttl),
            None => ("none", "none", 60),
        };
        let scheduler = match lb.scheduler {
            Some(Scheduler::SymmetricHash) => Scheduler::SymmetricHash.as_str(),
            _ if stateless => Scheduler::Hash.as_str(),
            other => other.map_or("weight", Scheduler::as_str),
        };
        Balancing {
            mode: match lb.mode {
                Some(NatMode::Dnat) => "dnat",
                Some(NatMode::Dsr) if direct => "dsr",
                _ => "snat",
            },
            scheduler,
            sched_param,
            persistence,
            persist_ttl,
            helper: lb.helper.map_or("none", Helper::as_str),
            log: lb.log.map_or("none", LogPath::as_str),
        }
    }
}

/// A farm's backend.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct FarmBackend {
    /// Unique within the farm.
    pub name: String,
    /// The endpoint's address.
    pub ip_addr: String,
    /// The endpoint's port (empty in `dsr` mode: the packet keeps the service port).
    pub port: String,
}

/// A `dsr` farm's link layer: where nftlb hooks it and where it forwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Direct {
    /// The interface clients arrive on (`iface`).
    pub iface: String,
    /// The interface towards the backends (`oface`).
    pub oface: String,
    /// `oface`'s link-layer address (the farm's `ether-addr`).
    pub ether_addr: String,
    /// Each backend's link-layer address, by backend name.
    pub backends: BTreeMap<String, String>,
}

/// A farm as kpng wants it. The default farm (no name, nothing set) is never one kpng
/// wants: every farm carries a value.
#[derive(Debug, Clone, Default, Eq)]
pub struct Farm {
    /// The farm's name.
    pub name: String,
    /// The virtual service.
    pub vip: Vip,
    /// The backends, by name.
    pub backends: BTreeMap<String, FarmBackend>,
    /// A `dsr` farm's link layer, once resolved. nftlb does not list it, so farms compare
    /// without it: it is resolved when the farm or a backend is created.
    pub direct: Option<Direct>,
}

impl PartialEq for Farm {
    fn eq(&self, other: &Farm) -> bool {
        (&self.name, &self.vip, &self.backends) == (&other.name, &other.vip, &other.backends)
    }
}

/// What nftlb's `GET /farms` lists of a farm (it lists more; the rest is not kpng's).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ListedFarm {
    /// The name.
    pub name: String,
    /// The virtual service.
    #[serde(flatten)]
    pub vip: Vip,
    /// The backends.
    #[serde(default)]
    pub backends: Vec<FarmBackend>,
}

impl From<ListedFarm> for Farm {
    fn from(listed: ListedFarm) -> Farm {
        let backends = listed.backends.into_iter().map(|b| (b.name.clone(), b)).collect();
        Farm { name: listed.name, vip: listed.vip, backends, direct: None }
    }
}

/// `GET /farms`' answer.
#[derive(Debug, Deserialize)]
pub struct Listing {
    /// The farms.
    #[serde(default)]
    pub farms: Vec<ListedFarm>,
}

fn protocol_name(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

/// A port's name in farm and backend names: `default` for an unnamed port.
fn port_label(port: &str) -> &str {
    if port.is_empty() { "default" } else { port }
}

/// The farm name of a service port.
pub fn farm_name(state: &LocalServiceState, port: &str, family: Family) -> String {
    let key = &state.service.key;
    let port = port_label(port);
    let suffix = if family == Family::V6 { "--ipv6" } else { "" };
    format!("{}--{}--{port}{suffix}", key.namespace(), key.name())
}

/// The farms of one service; `direct`: `mode: dsr` makes `dsr` farms (their link layer
/// is for the caller to resolve).
pub fn farms_of(state: &LocalServiceState, direct: bool) -> Vec<Farm> {
    let service = &state.service;
    let balancing = Balancing::of(service, direct);
    let keeps_port = balancing.mode == "dsr";
    let mut farms = Vec::new();
    for port in &service.ports {
        for family in Family::ALL {
            let Some(ip) = service.cluster_ip(family) else { continue };
            if !port.holds(&ip) {
                continue;
            }
            let (cluster, local) = port_sets(state, family, &port.name, port.protocol);
            let set = if service.internal_local { local } else { cluster };
            let port_name = port_label(&port.name);
            let backends = set
                .into_iter()
                .map(|(ip, target)| {
                    let owner = state
                        .endpoints
                        .get(&ip)
                        .and_then(|e| e.pod_name.as_ref().map(ToString::to_string))
                        .unwrap_or_else(|| ip.to_string().replace(':', "-"));
                    let name = format!("{owner}--{port_name}");
                    (
                        name.clone(),
                        FarmBackend {
                            name,
                            ip_addr: ip.to_string(),
                            port: if keeps_port { String::new() } else { target.to_string() },
                        },
                    )
                })
                .collect();
            farms.push(Farm {
                name: farm_name(state, &port.name, family),
                vip: Vip {
                    family: match family {
                        Family::V4 => "ipv4".into(),
                        Family::V6 => "ipv6".into(),
                    },
                    virtual_addr: ip.to_string(),
                    virtual_ports: port.port.to_string(),
                    mode: balancing.mode.into(),
                    protocol: protocol_name(port.protocol).into(),
                    scheduler: balancing.scheduler.into(),
                    sched_param: balancing.sched_param.into(),
                    persistence: balancing.persistence.into(),
                    persist_ttl: balancing.persist_ttl.to_string(),
                    helper: balancing.helper.into(),
                    log: balancing.log.into(),
                },
                backends,
                direct: None,
            });
        }
    }
    farms
}

/// What of a service to-nftlb cannot express, for the log.
pub fn unsupported(state: &LocalServiceState) -> Vec<&'static str> {
    let s = &state.service;
    let mut what = Vec::new();
    if s.ports.iter().any(|p| p.node_port.is_some()) {
        what.push("NodePorts");
    }
    if !s.external_ips().is_empty() {
        what.push("externalIPs");
    }
    if !s.load_balancer_ips().is_empty() {
        what.push("load-balancer IPs");
    }
    what
}

/// The body of a `POST /farms` creating `farms` whole, in one call. nftlb reads keys in
/// order: the name comes first.
pub fn create_body(farms: &[&Farm]) -> String {
    #[derive(Serialize)]
    #[serde(rename_all = "kebab-case")]
    struct Whole<'a> {
        name: &'a str,
        #[serde(flatten)]
        vip: &'a Vip,
        intra_connect: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        iface: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        oface: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        ether_addr: Option<&'a str>,
        state: &'static str,
        backends: Vec<Up<'a>>,
    }
    let whole: Vec<Whole<'_>> = farms
        .iter()
        .map(|farm| {
            let direct = farm.direct.as_ref();
            Whole {
                name: &farm.name,
                vip: &farm.vip,
                intra_connect: "on",
                iface: direct.map(|d| d.iface.as_str()),
                oface: direct.map(|d| d.oface.as_str()),
                ether_addr: direct.map(|d| d.ether_addr.as_str()),
                state: "up",
                backends: farm.backends.values().map(|b| Up::of(b, direct)).collect(),
            }
        })
        .collect();
    farms_body(&whole)
}

/// The body of a `POST /farms` adding `backends` to `farm`.
pub fn backends_body(farm: &Farm, backends: &[&FarmBackend]) -> String {
    #[derive(Serialize)]
    struct Part<'a> {
        name: &'a str,
        backends: Vec<Up<'a>>,
    }
    let direct = farm.direct.as_ref();
    let backends = backends.iter().map(|b| Up::of(b, direct)).collect();
    farms_body(&[Part { name: &farm.name, backends }])
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct Up<'a> {
    name: &'a str,
    ip_addr: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ether_addr: Option<&'a str>,
    port: &'a str,
    state: &'static str,
}

impl<'a> Up<'a> {
    fn of(backend: &'a FarmBackend, direct: Option<&'a Direct>) -> Up<'a> {
        Up {
            name: &backend.name,
            ip_addr: &backend.ip_addr,
            ether_addr: direct.and_then(|d| d.backends.get(&backend.name)).map(String::as_str),
            port: &backend.port,
            state: "up",
        }
    }
}

fn farms_body<T: Serialize>(farms: &[T]) -> String {
    #[derive(Serialize)]
    struct Farms<'a, T: Serialize> {
        farms: &'a [T],
    }
    // Serializing plain structs of strings cannot fail.
    serde_json::to_string(&Farms { farms }).unwrap_or_default()
}
