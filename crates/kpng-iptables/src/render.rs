//! ENLS service → its chains and dispatch entries, as typed rules. Pure.
//!
//! A service port of one family gets: `KPNG-SVC-*` (pick among the Cluster set) and/or
//! `KPNG-SVL-*` (the Local set), one `KPNG-SEP-*` per endpoint (hairpin mark, affinity
//! record, DNAT), `KPNG-EXT-*` for its external destinations and `KPNG-FW-*` for
//! load-balancer IPs with source ranges. Its destinations become [`Entry`]s, which the
//! dispatch ([`crate::dispatch`]) files into shard chains.

use std::collections::BTreeMap;
use std::net::IpAddr;

use kpng_backend::proxy::{LocalTraffic, SourceRanges};
use kpng_model::local::{LocalServicePort, LocalServiceState};
use kpng_model::{Family, Protocol, ServiceKey};

use crate::names::{self, ChainName, PortChain};
use crate::rule::{Addr, Match, Rule, Target, one_in};

/// A netfilter table kpng uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// `nat`: dispatch, endpoint choice, DNAT, masquerading.
    Nat,
    /// `filter`: rejects, drops.
    Filter,
}

impl Table {
    /// Both, in the order a restore writes them.
    pub const ALL: [Table; 2] = [Table::Nat, Table::Filter];

    /// The table's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Table::Nat => "nat",
            Table::Filter => "filter",
        }
    }
}

/// A chain of one family's table.
pub type ChainKey = (Family, Table, ChainName);

/// Where a destination is dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryKey {
    /// An address and port (`whole == false`), or the whole address after its ports
    /// (`whole == true`, a cluster IP's undefined ports).
    Dest {
        /// The address.
        ip: IpAddr,
        /// After the address's port rules.
        whole: bool,
        /// The protocol.
        protocol: Protocol,
        /// The port.
        port: u16,
    },
    /// A NodePort.
    NodePort(Protocol, u16),
}

/// One rule of a destination, filed into the dispatch of its table.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entry {
    /// The family.
    pub family: Family,
    /// The table.
    pub table: Table,
    /// Where it is filed.
    pub key: EntryKey,
    /// The rule.
    pub rule: Rule,
}

/// Everything one service needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceRules {
    /// Its own chains.
    pub chains: BTreeMap<ChainKey, Vec<Rule>>,
    /// Its destinations' rules in the dispatch chains.
    pub entries: Vec<Entry>,
}

/// Node facts and options that shape the rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// The masquerade mark bit (a single bit, e.g. `0x4000`).
    pub masq_mark: u32,
    /// The drop mark bit (loadBalancerSourceRanges), e.g. `0x8000`.
    pub drop_mark: u32,
    /// How local pods' traffic is recognised.
    pub local: LocalTraffic,
    /// The node's own IPs (a source range holding one also admits the LB IPs).
    pub node_ips: Vec<IpAddr>,
    /// NodePorts on 127.0.0.1 too, when IPv4 NodePorts are on every local address
    /// (`--localhost-nodeports`, kube-proxy's `iptables.localhostNodePorts`).
    pub localhost_nodeports: bool,
}

impl Context {
    /// Whether traffic from local pods can be told apart in `family`.
    pub fn detects_pods(&self, family: Family) -> bool {
        match &self.local {
            LocalTraffic::Unknown => false,
            LocalTraffic::Cidrs(nets) => nets.iter().any(|n| Family::of_net(n) == family),
            LocalTraffic::Interface(_) | LocalTraffic::InterfacePrefix(_) => true,
        }
    }

    /// Rules matching traffic from local pods, each ending in `target`.
    pub fn from_pods(&self, family: Family, target: Target) -> Vec<Rule> {
        match &self.local {
            LocalTraffic::Unknown => Vec::new(),
            LocalTraffic::Cidrs(nets) => nets
                .iter()
                .filter(|n| Family::of_net(n) == family)
                .map(|n| Rule::to(target.clone()).src(Addr::Net(n.trunc())))
                .collect(),
            LocalTraffic::Interface(name) => vec![Rule::to(target).in_iface(name.clone())],
            LocalTraffic::InterfacePrefix(prefix) => {
                vec![Rule::to(target).in_iface(format!("{prefix}+"))]
            }
        }
    }
}

use kpng_backend::endpoints::Target as Target2;

/// The Cluster and Local sets of one port in one family.
fn port_sets(
    state: &LocalServiceState,
    family: Family,
    port: &LocalServicePort,
) -> (Vec<Target2>, Vec<Target2>) {
    let (cluster, local) =
        kpng_backend::endpoints::port_sets(state, family, &port.name, port.protocol);
    (cluster.into_iter().collect(), local.into_iter().collect())
}

struct Out<'a> {
    family: Family,
    ctx: &'a Context,
    key: &'a ServiceKey,
    rules: ServiceRules,
}

impl Out<'_> {
    fn chain(&mut self, table: Table, name: ChainName, rules: Vec<Rule>) {
        self.rules.chains.insert((self.family, table, name), rules);
    }

    fn entry(&mut self, table: Table, key: EntryKey, rule: Rule) {
        self.rules.entries.push(Entry { family: self.family, table, key, rule });
    }

    /// A chain picking uniformly among `targets`, each through its endpoint chain.
    fn pick(
        &mut self,
        name: ChainName,
        port: &LocalServicePort,
        targets: &[Target2],
        affinity: Option<u32>,
        first: Vec<Rule>,
    ) {
        let seps: Vec<ChainName> = targets
            .iter()
            .map(|(ip, p)| names::endpoint_chain(self.key, &port.name, port.protocol, *ip, *p))
            .collect();
        let mut rules = first;
        if let Some(seconds) = affinity {
            for sep in &seps {
                let recent = Match::Recent {
                    name: sep.clone(),
                    check_seconds: Some(seconds),
                    family: self.family,
                };
                rules.push(Rule::jump(sep).with(recent));
            }
        }
        let n = seps.len() as u32;
        for (i, sep) in seps.iter().enumerate() {
            let left = n - i as u32;
            rules.push(match left {
                1 => Rule::jump(sep),
                _ => Rule::jump(sep).with(Match::Random(one_in(left))),
            });
        }
        self.chain(Table::Nat, name, rules);
        for ((ip, target_port), sep) in targets.iter().zip(seps) {
            let mut dnat = Rule::to(Target::Dnat(*ip, *target_port)).proto(port.protocol);
            if affinity.is_some() {
                dnat = dnat.with(Match::Recent {
                    name: sep.clone(),
                    check_seconds: None,
                    family: self.family,
                });
            }
            // A pod reaching itself through the service is masqueraded.
            let hairpin = Rule::jump(&names::mark_masq()).src(Addr::host(*ip));
            self.chain(Table::Nat, sep, vec![hairpin, dnat]);
        }
    }
}

/// The chains and entries of one service.
pub fn render_service(state: &LocalServiceState, ctx: &Context) -> ServiceRules {
    let mut out =
        Out { family: Family::V4, ctx, key: &state.service.key, rules: ServiceRules::default() };
    for family in Family::ALL {
        let Some(cluster_ip) = state.service.cluster_ip(family) else { continue };
        out.family = family;
        // Ports a cluster IP does not define are rejected (after its defined ports).
        let whole =
            EntryKey::Dest { ip: cluster_ip, whole: true, protocol: Protocol::Tcp, port: 0 };
        out.entry(
            Table::Filter,
            whole,
            Rule::to(Target::Reject(family)).dst(Addr::host(cluster_ip)),
        );
        for port in &state.service.ports {
            render_port(&mut out, state, cluster_ip, port);
        }
    }
    out.rules.entries.sort();
    out.rules.entries.dedup();
    out.rules
}

fn of_family(ips: &[IpAddr], family: Family) -> Vec<IpAddr> {
    ips.iter().copied().filter(|ip| Family::of(ip) == family).collect()
}

fn render_port(
    out: &mut Out<'_>,
    state: &LocalServiceState,
    cluster_ip: IpAddr,
    port: &LocalServicePort,
) {
    let svc = &state.service;
    let family = out.family;
    let (cluster, local) = port_sets(state, family, port);
    let has_endpoints = *port.has_endpoints.get(family);
    let chain = |kind| names::port_chain(kind, family, &svc.key, &port.name, port.protocol);
    let (svc_chain, svl_chain, ext_chain, fw_chain) =
        (chain(PortChain::Svc), chain(PortChain::Svl), chain(PortChain::Ext), chain(PortChain::Fw));
    let dest =
        |ip: IpAddr| EntryKey::Dest { ip, whole: false, protocol: port.protocol, port: port.port };
    let to_dest = |ip: IpAddr, target: Target| {
        Rule::to(target).dst(Addr::host(ip)).dport(port.protocol, port.port)
    };
    let empty_verdict = if has_endpoints { Target::Drop } else { Target::Reject(family) };

    let external: Vec<IpAddr> = of_family(svc.external_ips(), family)
        .into_iter()
        .chain(of_family(svc.load_balancer_ips(), family))
        .filter(|ip| port.holds(ip))
        .collect();
    let reachable_outside = !external.is_empty() || port.node_port.is_some();
    let uses_svc = !cluster.is_empty() && (!svc.internal_local || reachable_outside);
    let uses_svl =
        !local.is_empty() && (svc.internal_local || (svc.external_local && reachable_outside));

    // ClusterIP traffic not from local pods is masqueraded (or all of it).
    let masq = if out.ctx.masquerade_all {
        vec![to_dest(cluster_ip, Target::Jump(names::mark_masq()))]
    } else if out.ctx.detects_pods(family) {
        vec![to_dest(cluster_ip, Target::Jump(names::masq_unless_pod()))]
    } else {
        Vec::new()
    };
    let (internal_set, internal_chain) =
        if svc.internal_local { (&local, &svl_chain) } else { (&cluster, &svc_chain) };
    let affinity = svc.affinity_timeout_seconds;
    if uses_svc {
        let first = if svc.internal_local { Vec::new() } else { masq.clone() };
        out.pick(svc_chain.clone(), port, &cluster, affinity, first);
    }
    if uses_svl {
        let first = if svc.internal_local { masq } else { Vec::new() };
        out.pick(svl_chain.clone(), port, &local, affinity, first);
    }

    // ClusterIP.
    if port.holds(&cluster_ip) {
        match internal_set.is_empty() {
            true => out.entry(
                Table::Filter,
                dest(cluster_ip),
                to_dest(cluster_ip, empty_verdict.clone()),
            ),
            false => out.entry(
                Table::Nat,
                dest(cluster_ip),
                to_dest(cluster_ip, Target::Jump(internal_chain.clone())),
            ),
        }
    }
    if !reachable_outside {
        return;
    }

    // External destinations: external IPs, LB IPs, the NodePort.
    let external_verdict = match (cluster.is_empty(), svc.external_local && local.is_empty()) {
        (true, _) => Some(Target::Reject(family)),
        (false, true) => Some(empty_verdict),
        (false, false) => None,
    };
    if !cluster.is_empty() {
        let mut rules = Vec::new();
        if svc.external_local {
            // Local pods and the node itself go to the Cluster set.
            rules.extend(out.ctx.from_pods(family, Target::Jump(svc_chain.clone())));
            let from_node = Match::AddrTypeLocal { src: true };
            rules.push(Rule::jump(&names::mark_masq()).with(from_node.clone()));
            rules.push(Rule::jump(&svc_chain).with(from_node));
            if uses_svl {
                rules.push(Rule::jump(&svl_chain));
            }
        } else {
            rules.push(Rule::jump(&names::mark_masq()));
            rules.push(Rule::jump(&svc_chain));
        }
        out.chain(Table::Nat, ext_chain.clone(), rules);
    }
    let sources = SourceRanges::of(svc, family, &out.ctx.node_ips);
    let lb_ips: Vec<IpAddr> = of_family(svc.load_balancer_ips(), family);
    let firewalled = sources.any() && !cluster.is_empty();
    if firewalled {
        let ranges = sources.ranges.iter();
        let mut rules: Vec<Rule> =
            ranges.map(|r| Rule::jump(&ext_chain).src(Addr::Net(r.trunc()))).collect();
        if sources.node_in_range {
            rules.extend(lb_ips.iter().map(|ip| Rule::jump(&ext_chain).src(Addr::host(*ip))));
        }
        rules.push(Rule::jump(&names::mark_drop()));
        out.chain(Table::Nat, fw_chain.clone(), rules);
    }
    for ip in external {
        if !cluster.is_empty() {
            let via = if firewalled && lb_ips.contains(&ip) { &fw_chain } else { &ext_chain };
            out.entry(Table::Nat, dest(ip), to_dest(ip, Target::Jump(via.clone())));
        }
        if let Some(verdict) = &external_verdict {
            out.entry(Table::Filter, dest(ip), to_dest(ip, verdict.clone()));
        }
    }
    if let Some(node_port) = port.node_port {
        let key = EntryKey::NodePort(port.protocol, node_port);
        let rule = |target| Rule::to(target).dport(port.protocol, node_port);
        if !cluster.is_empty() {
            out.entry(Table::Nat, key, rule(Target::Jump(ext_chain.clone())));
        }
        if let Some(verdict) = external_verdict {
            out.entry(Table::Filter, key, rule(verdict));
        }
    }
}

#[cfg(test)]
mod tests;
