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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Vip {
    /// `ipv4` or `ipv6`.
    pub family: String,
    /// The cluster IP.
    pub virtual_addr: String,
    /// The service port.
    pub virtual_ports: String,
    /// `snat` (replies come back through the node), or the `mode` annotation's `dnat`.
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
    fn of(service: &LocalService) -> Balancing {
        let lb = &service.load_balancing;
        let hashed = lb.scheduler == Some(Scheduler::Hash);
        let sticky = match (lb.persistence, service.affinity_timeout_seconds) {
            (Some(p), _) => Some((p.key.as_str(), p.timeout_seconds)),
            (None, Some(timeout)) => Some((PersistenceKey::SrcIp.as_str(), timeout)),
            (None, None) => None,
        };
        let (sched_param, persistence, persist_ttl) = match sticky {
            // `hash` hashes the key, statelessly (`srcip` when no key is set).
            _ if hashed => (sticky.map_or("srcip", |(key, _)| key), "none", 60),
            Some((key, ttl)) => ("none", key, ttl),
            None => ("none", "none", 60),
        };
        Balancing {
            mode: match lb.mode {
                Some(NatMode::Dnat) => "dnat",
                _ => "snat",
            },
            scheduler: lb.scheduler.map_or("weight", Scheduler::as_str),
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
    /// The endpoint's port.
    pub port: String,
}

/// A farm as kpng wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Farm {
    /// The farm's name.
    pub name: String,
    /// The virtual service.
    pub vip: Vip,
    /// The backends, by name.
    pub backends: BTreeMap<String, FarmBackend>,
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
        Farm { name: listed.name, vip: listed.vip, backends }
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
    format!("{}--{}--{port}{suffix}", key.namespace, key.name)
}

/// The farms of one service.
pub fn farms_of(state: &LocalServiceState) -> Vec<Farm> {
    let service = &state.service;
    let balancing = Balancing::of(service);
    let mut farms = Vec::new();
    for port in &service.ports {
        for family in Family::ALL {
            let Some(ip) = service.cluster_ip(family) else { continue };
            if port.yielded.contains(&ip) {
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
                        .and_then(|e| e.pod_name.clone())
                        .unwrap_or_else(|| ip.to_string().replace(':', "-"));
                    let name = format!("{owner}--{port_name}");
                    (
                        name.clone(),
                        FarmBackend { name, ip_addr: ip.to_string(), port: target.to_string() },
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
    if !s.external_ips.is_empty() {
        what.push("externalIPs");
    }
    if !s.load_balancer_ips.is_empty() {
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
        state: &'static str,
        backends: Vec<Up<'a>>,
    }
    let whole: Vec<Whole<'_>> = farms
        .iter()
        .map(|farm| Whole {
            name: &farm.name,
            vip: &farm.vip,
            intra_connect: "on",
            state: "up",
            backends: farm.backends.values().map(Up::of).collect(),
        })
        .collect();
    farms_body(&whole)
}

/// The body of a `POST /farms` adding `backends` to the farm `name`.
pub fn backends_body(name: &str, backends: &[&FarmBackend]) -> String {
    #[derive(Serialize)]
    struct Part<'a> {
        name: &'a str,
        backends: Vec<Up<'a>>,
    }
    farms_body(&[Part { name, backends: backends.iter().map(|b| Up::of(b)).collect() }])
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct Up<'a> {
    name: &'a str,
    ip_addr: &'a str,
    port: &'a str,
    state: &'static str,
}

impl<'a> Up<'a> {
    fn of(backend: &'a FarmBackend) -> Up<'a> {
        Up { name: &backend.name, ip_addr: &backend.ip_addr, port: &backend.port, state: "up" }
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
