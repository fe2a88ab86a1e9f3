//! The static part of each table: sets, maps, chains and the rules that never depend on
//! the cluster's size. Everything per service and per endpoint is an element of these
//! sets and maps. The skeleton depends only on [`SkeletonOptions`]; it is (re)written
//! whole, in the same transaction as the elements, at start-up and at every repair.
//!
//! Picking an endpoint among `n` walks a fixed binary tree of chains, one level per bit of
//! `n - 1` (`<kind>_bit_<b>` sets say which bits a destination has), down to the rule
//! `numgen random mod n`: a new connection costs the same few lookups whatever the mix of
//! endpoint counts, and a changed count is a few element updates, never a rule change.

use ipnet::IpNet;
use kpng_backend::proxy::LocalTraffic;
use kpng_model::{Family, PerFamily};
use kpng_netlink::nftables::objects::Hook;
use kpng_netlink::nftables::{ChainSpec, Verdict};

use crate::objects::{MapName, PickKind, TREE_BITS};
use crate::rules::{DEST, Field, NODEPORT, Rule, RuleBuilder};
use crate::sets::{SetDecl, declaration};

/// Options that shape the static rules.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SkeletonOptions {
    /// Masquerade all traffic to cluster IPs (`--masquerade-all`).
    pub masquerade_all: bool,
    /// How traffic from local pods is recognised.
    pub local_detector: LocalTraffic,
    /// The packet-mark bit kpng uses to flag connections for masquerading (kube-proxy's
    /// default is 14, 0x4000). Only this bit is touched.
    pub masquerade_bit: u8,
    /// Per family: NodePorts are accepted on every local address but loopback (a match-all
    /// `--nodeport-addresses`), instead of the addresses in `nodeport_addrs`.
    pub nodeports_on_all_local: PerFamily<bool>,
    /// The cluster's service CIDRs: new connections to an address in them that no service
    /// holds are dropped.
    pub service_cidrs: Vec<IpNet>,
}

impl Default for SkeletonOptions {
    fn default() -> Self {
        SkeletonOptions {
            masquerade_all: false,
            local_detector: LocalTraffic::Unknown,
            masquerade_bit: 14,
            nodeports_on_all_local: PerFamily::default(),
            service_cidrs: Vec::new(),
        }
    }
}

/// One chain with its rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// Name and hook.
    pub spec: ChainSpec,
    /// Its rules, in order.
    pub rules: Vec<Rule>,
}

/// The static objects of one family's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skeleton {
    /// The family.
    pub family: Family,
    /// Every static set and map.
    pub sets: Vec<SetDecl>,
    /// Every static chain (base chains first), with its rules.
    pub chains: Vec<Chain>,
}

fn hook(chain_type: &'static str, num: u32, priority: i32) -> Option<Hook> {
    Some(Hook { chain_type, num, priority })
}

const PREROUTING: u32 = 0;
const INPUT: u32 = 1;
const FORWARD: u32 = 2;
const OUTPUT: u32 = 3;
const POSTROUTING: u32 = 4;

/// The local-pod detector of `family`: none where the family has no network for it.
fn detector(family: Family, options: &SkeletonOptions) -> LocalTraffic {
    match &options.local_detector {
        LocalTraffic::Cidrs(nets) => {
            let nets: Vec<IpNet> =
                nets.iter().copied().filter(|n| Family::of_net(n) == family).collect();
            if nets.is_empty() { LocalTraffic::Unknown } else { LocalTraffic::Cidrs(nets) }
        }
        other => other.clone(),
    }
}

/// Rules that match traffic from local pods, one per network or interface, each ending
/// with `then`.
fn from_pods(family: Family, detector: &LocalTraffic, then: Verdict) -> Vec<Rule> {
    let start = || RuleBuilder::new(family);
    match detector {
        LocalTraffic::Unknown => Vec::new(),
        LocalTraffic::Cidrs(nets) => {
            nets.iter().map(|n| start().address_in(true, *n, false).verdict(then.clone())).collect()
        }
        LocalTraffic::Interface(name) => {
            vec![start().input_interface(name, false, false).verdict(then)]
        }
        LocalTraffic::InterfacePrefix(prefix) => {
            vec![start().input_interface(prefix, true, false).verdict(then)]
        }
    }
}

/// The whole static skeleton of `family`'s table.
pub fn skeleton(family: Family, options: &SkeletonOptions) -> Skeleton {
    let r = || RuleBuilder::new(family);
    let mark = 1u32 << options.masquerade_bit;
    let detector = detector(family, options);
    let all_local = *options.nodeports_on_all_local.get(family);
    let nodeport = |set: &str| r().on_nodeport_address(all_local).member(NODEPORT, set, false);
    let mut chains = vec![
        base("nat_prerouting", hook("nat", PREROUTING, -100), vec![r().jump("services")]),
        base("nat_output", hook("nat", OUTPUT, -100), vec![r().jump("services")]),
        base(
            "nat_postrouting",
            hook("nat", POSTROUTING, 100),
            vec![r().ct_status_dnat().jump("masquerading")],
        ),
        base(
            "filter_prerouting",
            hook("filter", PREROUTING, -110),
            vec![r().ct_state_new().jump("firewall_check")],
        ),
        base(
            "filter_output_early",
            hook("filter", OUTPUT, -110),
            vec![r().ct_state_new().jump("firewall_check")],
        ),
    ];
    for (name, num) in
        [("filter_input", INPUT), ("filter_forward", FORWARD), ("filter_output", OUTPUT)]
    {
        chains.push(base(
            name,
            hook("filter", num, 0),
            vec![r().ct_state_new().jump("endpoint_check")],
        ));
    }

    let mut services = Vec::new();
    if options.masquerade_all {
        services
            .push(r().member(&[Field::Daddr], "cluster_ips", false).jump("mark_for_masquerade"));
    } else if detector != LocalTraffic::Unknown {
        services
            .push(r().member(&[Field::Daddr], "cluster_ips", false).jump("masquerade_unless_pod"));
        let mut unless = from_pods(family, &detector, Verdict::Return);
        unless.push(r().jump("mark_for_masquerade"));
        chains.push(base("masquerade_unless_pod", None, unless));
    }
    services.extend([
        r().member(DEST, "masq_dests", false).jump("mark_for_masquerade"),
        nodeport("masq_nodeports").jump("mark_for_masquerade"),
        r().member(DEST, "cluster_dests", false).goto("pick_cluster"),
        r().member(DEST, "local_dests", false).goto("pick_local"),
        r().member(DEST, "external_local_dests", false).goto("external_local"),
        nodeport("nodeport_cluster_dests").goto("pick_nodeport_cluster"),
        nodeport("nodeport_local_dests").goto("nodeport_local"),
    ]);
    chains.push(base("services", None, services));
    chains.push(base("mark_for_masquerade", None, vec![r().mark_set(mark).end()]));
    chains.push(base(
        "masquerading",
        None,
        vec![
            r().member(&[Field::Saddr, Field::Daddr], "hairpin", false).masquerade(),
            r().mark_clear(mark).verdict(Verdict::Return),
            r().mark_toggle(mark).end(),
            r().masquerade(),
        ],
    ));
    for (name, cluster, local) in [
        ("external_local", "pick_cluster", "pick_local"),
        ("nodeport_local", "pick_nodeport_cluster", "pick_nodeport_local"),
    ] {
        let mut rules = from_pods(family, &detector, Verdict::Goto(cluster.into()));
        rules.push(r().from_the_node().jump("mark_for_masquerade"));
        rules.push(r().from_the_node().goto(cluster));
        rules.push(r().goto(local));
        chains.push(base(name, None, rules));
    }
    chains.push(base(
        "firewall_check",
        None,
        vec![
            r().member(DEST, "firewall_dests", false)
                .dest_source_not_in("firewall_allow")
                .verdict(Verdict::Drop),
        ],
    ));
    let mut check = vec![
        r().member(DEST, "drop_dests", false).verdict(Verdict::Drop),
        r().member(DEST, "reject_dests", false).goto("reject_packet"),
        nodeport("drop_nodeports").verdict(Verdict::Drop),
        nodeport("reject_nodeports").goto("reject_packet"),
        r().member(&[Field::Daddr], "cluster_ips", false).goto("reject_packet"),
    ];
    for cidr in options.service_cidrs.iter().filter(|c| Family::of_net(c) == family) {
        check.push(r().address_in(false, *cidr, false).verdict(Verdict::Drop));
    }
    chains.push(base("endpoint_check", None, check));
    chains.push(base("reject_packet", None, vec![r().reject()]));
    for kind in PickKind::ALL {
        chains.extend(pick_chains(family, kind));
    }
    let sets = MapName::all_static().map(|m| declaration(m, family)).collect();
    Skeleton { family, sets, chains }
}

fn base(name: &str, hook: Option<Hook>, rules: Vec<Rule>) -> Chain {
    Chain { spec: ChainSpec { name: name.to_string(), hook }, rules }
}

fn key_fields(kind: PickKind) -> &'static [Field] {
    if kind.by_destination() { DEST } else { NODEPORT }
}

/// `dnat <ip> to <key> . numgen random mod n map @<backends>`.
pub fn pick(builder: RuleBuilder, kind: PickKind, n: u32) -> Rule {
    let mut fields = key_fields(kind).to_vec();
    fields.push(Field::Random(n));
    builder.dnat_map(&fields, &kind.backends(n).name())
}

/// The entry chain of a pick kind, its counts chain (empty: rules for counts beyond the
/// tree are added when first used), and the tree.
fn pick_chains(family: Family, kind: PickKind) -> Vec<Chain> {
    let r = || RuleBuilder::new(family);
    let key = key_fields(kind);
    let mut chains = vec![
        base(
            &kind.chain(),
            None,
            vec![
                r().vmap(key, &kind.affinity_map().name()),
                r().jump(kind.counts_chain()),
                r().goto(kind.tree_chain(0, 0)),
            ],
        ),
        base(&kind.counts_chain(), None, Vec::new()),
    ];
    for depth in 0..TREE_BITS {
        let bit = TREE_BITS - 1 - depth;
        let bit_set = MapName::Bit(kind, bit).name();
        for prefix in 0..(1u32 << depth) {
            let rules = if depth + 1 < TREE_BITS {
                vec![
                    r().member(key, &bit_set, false)
                        .goto(kind.tree_chain(depth + 1, 2 * prefix + 1)),
                    r().goto(kind.tree_chain(depth + 1, 2 * prefix)),
                ]
            } else {
                // The last bit decides the count: `count - 1` is `2 * prefix + bit`.
                vec![
                    pick(r().member(key, &bit_set, false), kind, 2 * prefix + 2),
                    pick(r(), kind, 2 * prefix + 1),
                ]
            };
            chains.push(base(&kind.tree_chain(depth, prefix), None, rules));
        }
    }
    chains
}

/// The rule of the counts chain for `n` endpoints of `kind` (beyond the tree).
pub fn count_rule(family: Family, kind: PickKind, n: u32) -> Rule {
    let set = MapName::Count(kind, n).name();
    pick(RuleBuilder::new(family).member(key_fields(kind), &set, false), kind, n)
}

impl Skeleton {
    /// The chain named `name`.
    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.spec.name == name)
    }
}

#[cfg(test)]
mod tests;
