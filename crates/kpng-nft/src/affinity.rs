//! Services balanced by chains of their own: ClientIP session affinity, and the kube-nftlb
//! load-balancing annotations ([`GroupPolicy`]).
//!
//! Each service port, family and endpoint set of such a service is a group with its
//! own chain `aff_<hash>` (the only per-service chains kpng makes). Slot `i` of the group
//! has a timeout set `aff_<hash>_<i>` of client addresses and a chain `aff_<hash>_<i>` that
//! refreshes the client in that set and DNATs to the slot's endpoint (for ClientIP
//! affinity, which the policy of an unannotated service gives):
//!
//! ```text
//! chain aff_h    { ip saddr @aff_h_0 goto aff_h_0; ...                 (a known client)
//!                  numgen random mod N == 0 goto aff_h_0;              (a new one: the first
//!                  numgen random mod N-1 == 0 goto aff_h_1; ...         live slot with 1/N,
//!                  goto aff_h_<last> }                                  the next 1/(N-1), ...)
//! chain aff_h_i  { meta l4proto tcp update @aff_h_i { ip saddr } dnat ip to <endpoint i> }
//! ```
//!
//! Every destination of the group (ClusterIP, external and LB IPs, NodePort) enters the
//! same chain through the `affinity_*` verdict maps, so a client sticks to one endpoint
//! across all of a service port's addresses, and each new connection refreshes the
//! timeout. Endpoints never change slots: one that leaves leaves a hole (its clients choose
//! again), one that arrives takes a hole or a new slot, so the clients of every other
//! endpoint keep their endpoint.
//!
//! The annotations change the entry chain: `helper` assigns a `ct helper` object of the
//! table (`helper_ftp_tcp`, made while a group uses it) to every connection of the ports of
//! a protocol the helper serves; `log` puts a rate-limited log rule first
//! (`fib saddr type local` for `output`, `!= local` for `forward`); `mode` sets (`snat`)
//! or clears (`dnat`) the masquerade mark bit that the rules before set from kube-proxy's
//! rules; `persistence` keys the slot sets by its fields (`srcip srcport`: `ip saddr . th
//! sport`) with its timeout; the scheduler chooses a new client's slot: `rr` with
//! `numgen inc mod N-j == 0` in rule `j` (each rule's counter counts the connections that
//! reach it, so connection `k` takes live slot `k mod N`), `symhash`/`hash` with
//! `symhash mod N == j` / `jhash <persistence key> mod N seed 0x0 == j` (no stickiness:
//! the hash is the persistence). Whatever the scheduler, the last live slot's rule has no
//! condition: it takes what the others left.
//!
//! A group of a `mode: stlsdnat` service is stateless: conntrack never sees its packets,
//! so nothing is NATed and every packet of a flow must choose the same way. Two base
//! chains of its own, `aff_<hash>_prerouting` (filter, prerouting) and `aff_<hash>_output`
//! (route, output), both at priority -300 (before conntrack), send the packets to the
//! service port's ClusterIP through `notrack` into the entry chain, which picks a slot by
//! hash (`symhash` for `scheduler: symhash`, else `jhash` of the persistence key, source
//! address and port when unset); the slot chain rewrites destination address and port in
//! the packet (checksums updated). In the prerouting chain, each live slot's replies
//! (source = that endpoint and port) are rewritten back to the ClusterIP and port, also
//! untracked:
//!
//! ```text
//! chain aff_h_prerouting { type filter hook prerouting priority -300;
//!                          ip daddr <cluster IP> tcp dport <port> notrack goto aff_h
//!                          ip saddr <endpoint i> tcp sport <target port> notrack
//!                              ip saddr set <cluster IP> tcp sport set <port> ... }
//! chain aff_h_i          { ip daddr set <endpoint i> tcp dport set <target port> }
//! ```
//!
//! Both directions must therefore pass through this node (like `dnat`, the endpoint sees
//! the client's address and must answer through the node), and an endpoint's packets from
//! its target port are taken for replies of the ClusterIP: that is why a stlsdnat
//! service's external IPs, load-balancer IPs and NodePorts are rejected rather than served
//! statefully (their replies would be rewritten too). Log, helper and `rr` need conntrack
//! or per-flow state and are reported unsupported with this mode.
//!
//! A `mode: dsr` group (direct server return) is stateless the same way, but its slot
//! chain changes nothing in the packet: `dup to <endpoint> drop` sends an untracked copy to
//! the endpoint's link-layer address (the neighbour entry the node resolves for it), with
//! the ClusterIP and port still as destination, and drops the original. The endpoint must
//! hold the ClusterIP (on its loopback), serve the service's port (not the target port),
//! and be a neighbour of the node (on its L2 segment, or a pod on a veth of the node); it
//! answers the client directly, so the prerouting chain has no reply rules. The copy passes
//! the output hook again, which the output chain recognises (`ct state != untracked`). Its
//! other destinations are rejected as for `stlsdnat` (a NodePort's packets are addressed to
//! the node).

use kpng_model::global::{Helper, LogPath, PersistenceKey, Scheduler};
use kpng_model::{Family, Protocol};
use kpng_netlink::nftables::ChainSpec;
use kpng_netlink::nftables::objects::{CtHelperSpec, Hook};

use crate::objects::{Dest, affinity_chain, affinity_slot};
use kpng_netlink::nftables::Verdict;

use crate::rules::{Field, Rule, RuleBuilder, protocol_keyword, protocol_number};
use kpng_backend::slots::Target;

/// The priority of a stateless group's base chains: before conntrack (-200), as `raw`.
pub const STATELESS_PRIORITY: i32 = -300;
const PREROUTING: u32 = 0;
const OUTPUT: u32 = 3;

/// How a group chooses and treats a new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPolicy {
    /// What a known client is recognised by (slot sets keyed by it, with the group's
    /// timeout); `None`: no stickiness.
    pub sticky: Option<PersistenceKey>,
    /// How a new client's slot is chosen; `None`: uniformly at random.
    pub scheduler: Option<Scheduler>,
    /// What `hash` hashes.
    pub hash_key: PersistenceKey,
    /// `Some(true)`: set the masquerade mark (`snat`); `Some(false)`: clear it (`dnat`).
    pub masquerade: Option<bool>,
    /// The masquerade mark bit (from the backend's options).
    pub mark: u32,
    /// Log new connections on this path with this prefix.
    pub log: Option<(LogPath, String)>,
    /// A conntrack helper for the connections (on the ports of a protocol it serves).
    pub helper: Option<Helper>,
    /// Packets go to the endpoints without conntrack (`stlsdnat`, `dsr`).
    pub stateless: Option<Stateless>,
}

/// How a stateless group's packets reach the endpoint, conntrack never seeing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stateless {
    /// `stlsdnat`: destination address and port rewritten, the replies rewritten back.
    Rewrite,
    /// `dsr`: an unchanged copy goes to the endpoint's link-layer address (`dup to`), and
    /// the endpoint answers the client directly.
    DirectReturn,
}

impl GroupPolicy {
    /// ClientIP session affinity: sticky by source address, random choice.
    pub fn client_ip() -> GroupPolicy {
        GroupPolicy {
            sticky: Some(PersistenceKey::SrcIp),
            scheduler: None,
            hash_key: PersistenceKey::SrcIp,
            masquerade: None,
            mark: 0,
            log: None,
            helper: None,
            stateless: None,
        }
    }
}

/// The kernel's conntrack helper for `helper` on `protocol` in `family`, when it serves
/// them: H.323 is `RAS` over UDP and `Q.931` over TCP; the others have one name. The
/// kernel's IRC, NetBIOS name service, PPTP and SNMP helpers serve IPv4 only.
pub fn kernel_helper(helper: Helper, protocol: Protocol, family: Family) -> Option<&'static str> {
    use Protocol::{Tcp, Udp};
    let ipv4_only = matches!(helper, Helper::Irc | Helper::NetbiosNs | Helper::Pptp | Helper::Snmp);
    if ipv4_only && family != Family::V4 {
        return None;
    }
    Some(match (helper, protocol) {
        (Helper::Amanda, Udp) => "amanda",
        (Helper::Ftp, Tcp) => "ftp",
        (Helper::H323, Udp) => "RAS",
        (Helper::H323, Tcp) => "Q.931",
        (Helper::Irc, Tcp) => "irc",
        (Helper::NetbiosNs, Udp) => "netbios-ns",
        (Helper::Pptp, Tcp) => "pptp",
        (Helper::Sane, Tcp) => "sane",
        (Helper::Sip, Tcp | Udp) => "sip",
        (Helper::Snmp, Udp) => "snmp",
        (Helper::Tftp, Udp) => "tftp",
        _ => return None,
    })
}

/// The `ct helper` object of `helper` on `protocol` in a table of `family`, named
/// `helper_<name>_<protocol>` (`helper_ftp_tcp`).
pub fn helper_object(helper: Helper, protocol: Protocol, family: Family) -> Option<CtHelperSpec> {
    let kernel = kernel_helper(helper, protocol, family)?;
    let proto = protocol_number(protocol);
    let name = format!("helper_{}_{}", helper.as_str().replace('-', "_"), protocol_keyword(proto));
    Some(CtHelperSpec { name, helper: kernel.to_string(), l4proto: proto })
}

/// The packet fields of a persistence key.
pub fn key_fields(key: PersistenceKey) -> &'static [Field] {
    match key {
        PersistenceKey::SrcIp => &[Field::Saddr],
        PersistenceKey::SrcPort => &[Field::Sport],
        PersistenceKey::SrcMac => &[Field::Smac],
        PersistenceKey::SrcIpSrcPort => &[Field::Saddr, Field::Sport],
        PersistenceKey::SrcIpDstPort => &[Field::Saddr, Field::Dport],
    }
}

/// One affinity group as it should be in the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffinityGroup {
    /// Stable identity (names its chains and sets), from [`crate::objects::GroupKey::hash`].
    pub hash: u64,
    /// The family.
    pub family: Family,
    /// The service port's protocol.
    pub protocol: Protocol,
    /// Affinity timeout in seconds.
    pub timeout: u32,
    /// The endpoint of each slot; `None` for a hole.
    pub slots: Vec<Option<Target>>,
    /// How new connections are chosen and treated.
    pub policy: GroupPolicy,
    /// For a stateless group: the ClusterIP destination whose packets it rewrites.
    pub stateless: Option<Dest>,
}

impl AffinityGroup {
    /// The entry chain's name.
    pub fn chain(&self) -> String {
        affinity_chain(self.hash)
    }

    /// The indices of the slots that hold an endpoint.
    fn live(&self) -> impl Iterator<Item = (usize, Target)> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, t)| t.map(|t| (i, t)))
    }

    /// The rules of the entry chain: logging and masquerading as the policy says, known
    /// clients to their slot, new ones to a slot chosen among the live ones by the
    /// scheduler.
    pub fn entry_rules(&self) -> Vec<Rule> {
        let r = || RuleBuilder::new(self.family);
        let policy = &self.policy;
        let live: Vec<usize> = self.live().map(|(i, _)| i).collect();
        let mut rules = Vec::new();
        if let Some((path, prefix)) = &policy.log {
            rules.push(match path {
                LogPath::Output => r().from_the_node().log_limited(prefix).end(),
                LogPath::Forward => r().not_from_the_node().log_limited(prefix).end(),
            });
        }
        if let Some(object) = self.helper_object() {
            rules.push(r().ct_helper(&object.name).end());
        }
        match policy.masquerade {
            Some(true) => rules.push(r().mark_set(policy.mark).end()),
            Some(false) => rules.push(r().mark_unset(policy.mark).end()),
            None => {}
        }
        if let Some(key) = policy.sticky {
            for i in &live {
                let slot = affinity_slot(self.hash, *i);
                rules.push(r().member(key_fields(key), &slot, false).goto(slot));
            }
        }
        let n = live.len() as u32;
        for (j, i) in live.iter().enumerate() {
            let remaining = n - j as u32;
            let slot = affinity_slot(self.hash, *i);
            let choose = match policy.scheduler {
                // The last live slot takes what is left: a hash mod n is below n, so
                // comparing it again could only add a path no packet takes.
                _ if remaining == 1 => r(),
                None => r().one_in(remaining),
                Some(Scheduler::RoundRobin) => r().one_in_turn(remaining),
                Some(Scheduler::SymmetricHash) => r().hash_is(None, n, j as u32),
                Some(Scheduler::Hash) => {
                    r().hash_is(Some(key_fields(policy.hash_key)), n, j as u32)
                }
            };
            rules.push(choose.goto(slot));
        }
        rules
    }

    /// The `ct helper` object the group's connections get, if its helper serves its
    /// protocol.
    pub fn helper_object(&self) -> Option<CtHelperSpec> {
        helper_object(self.policy.helper?, self.protocol, self.family)
    }

    /// The rule of slot `i`'s chain; `None` for a hole.
    pub fn slot_rule(&self, i: usize) -> Option<Rule> {
        let (ip, port) = self.slots.get(i).copied().flatten()?;
        let r = || RuleBuilder::new(self.family);
        match self.stateless.and(self.policy.stateless) {
            Some(Stateless::Rewrite) => {
                return Some(r().address_set(false, ip).port_set(self.protocol, false, port).end());
            }
            Some(Stateless::DirectReturn) => return Some(r().dup_to(ip).verdict(Verdict::Drop)),
            None => {}
        }
        let set = affinity_slot(self.hash, i);
        let rule = RuleBuilder::new(self.family).protocol(self.protocol);
        let rule = match self.policy.sticky {
            Some(key) => rule.remember(key_fields(key), &set),
            None => rule,
        };
        Some(rule.dnat_to(ip, port))
    }

    /// Every chain of the group with its rules: the entry chain, each live slot, and a
    /// stateless group's base chains.
    pub fn chains(&self) -> Vec<(ChainSpec, Vec<Rule>)> {
        let chain = |name: String| ChainSpec { name, hook: None };
        let mut chains = vec![(chain(self.chain()), self.entry_rules())];
        for (i, _) in self.live() {
            let rule = self.slot_rule(i).into_iter().collect();
            chains.push((chain(affinity_slot(self.hash, i)), rule));
        }
        chains.extend(self.stateless_chains());
        chains
    }

    /// A stateless group's base chains: requests to its ClusterIP port go untracked to the
    /// entry chain; with rewriting, each live slot's replies are rewritten back to it
    /// (prerouting only: the node's own sockets receive replies through prerouting too).
    fn stateless_chains(&self) -> Vec<(ChainSpec, Vec<Rule>)> {
        let (Some(dest), Some(how)) = (self.stateless, self.policy.stateless) else {
            return Vec::new();
        };
        let r = || RuleBuilder::new(self.family);
        let single = |ip| ipnet::IpNet::from(ip);
        let request = |start: RuleBuilder| {
            start
                .address_in(false, single(dest.ip), false)
                .port_is(dest.protocol, false, dest.port)
                .notrack()
                .goto(self.chain())
        };
        let mut prerouting = vec![request(r())];
        if how == Stateless::Rewrite {
            for (_, (ip, port)) in self.live() {
                let reply = r()
                    .address_in(true, single(ip), false)
                    .port_is(dest.protocol, true, port)
                    .notrack()
                    .address_set(true, dest.ip)
                    .port_set(dest.protocol, true, dest.port)
                    .end();
                prerouting.push(reply);
            }
        }
        // The copies `dup` sends pass the output hook again, untracked: they must not be
        // taken for requests of the node's own.
        let output = match how {
            Stateless::Rewrite => request(r()),
            Stateless::DirectReturn => request(r().tracked()),
        };
        let base = |name: &str, chain_type, num| ChainSpec {
            name: format!("{}_{name}", self.chain()),
            hook: Some(Hook { chain_type, num, priority: STATELESS_PRIORITY }),
        };
        vec![
            (base("prerouting", "filter", PREROUTING), prerouting),
            (base("output", "route", OUTPUT), vec![output]),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(slots: &[Option<u8>]) -> AffinityGroup {
        AffinityGroup {
            hash: 0xab,
            family: Family::V4,
            protocol: Protocol::Tcp,
            timeout: 60,
            slots: slots
                .iter()
                .map(|s| s.map(|n| (std::net::IpAddr::from([10, 0, 0, n]), 80)))
                .collect(),
            policy: GroupPolicy::client_ip(),
            stateless: None,
        }
    }

    #[test]
    fn new_clients_choose_among_live_slots_only() {
        let texts: Vec<String> =
            group(&[None, Some(2), Some(3)]).entry_rules().into_iter().map(|r| r.text).collect();
        assert_eq!(
            texts,
            [
                "ip saddr @aff_00000000000000ab_1 goto aff_00000000000000ab_1",
                "ip saddr @aff_00000000000000ab_2 goto aff_00000000000000ab_2",
                "numgen random mod 2 == 0 goto aff_00000000000000ab_1",
                "goto aff_00000000000000ab_2",
            ]
        );
    }
}
