//! The static part of each table: sets, maps, and chains whose rules never depend on the
//! cluster's size. Loaded with `nft -f` at start-up; everything per service and per
//! endpoint is an element of these sets and maps.

use std::fmt::Write;

use ipnet::IpNet;
use kpng_model::Family;

use crate::objects::{MapName, PickKind, TABLE};

/// Options that shape the static rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkeletonOptions {
    /// Masquerade all traffic to cluster IPs (`--masquerade-all`).
    pub masquerade_all: bool,
    /// The local-traffic detector (`--cluster-cidr`, else the node's pod CIDRs), both
    /// families. Where a family has none, ClusterIP traffic is not masqueraded for being
    /// non-local and pod traffic to external addresses is not short-circuited.
    pub local_pods: Vec<IpNet>,
    /// The packet-mark bit kpng uses to flag connections for masquerading (kube-proxy's
    /// default is 14, 0x4000). Only this bit is touched.
    pub masquerade_bit: u8,
}

impl Default for SkeletonOptions {
    fn default() -> Self {
        SkeletonOptions { masquerade_all: false, local_pods: Vec::new(), masquerade_bit: 14 }
    }
}

fn local_pods(family: Family, options: &SkeletonOptions) -> Vec<IpNet> {
    options.local_pods.iter().copied().filter(|n| Family::of_net(n) == family).collect()
}

struct Names {
    family_enum: Family,
    family: &'static str,
    addr: &'static str,
    ip: &'static str,
}

fn names(family: Family) -> Names {
    match family {
        Family::V4 => Names { family_enum: family, family: "ip", addr: "ipv4_addr", ip: "ip" },
        Family::V6 => Names { family_enum: family, family: "ip6", addr: "ipv6_addr", ip: "ip6" },
    }
}

/// The key type of a destination-keyed set, or of a NodePort-keyed one.
fn key_type(map_by_destination: bool, n: &Names) -> String {
    if map_by_destination {
        format!("{} . inet_proto . inet_service", n.addr)
    } else {
        "inet_proto . inet_service".to_string()
    }
}

/// The declaration of one set or map.
fn declaration(map: MapName, n: &Names) -> String {
    let (addr, ip) = (n.addr, n.ip);
    let dest = key_type(true, n);
    let nodeport = key_type(false, n);
    let body = match map {
        MapName::NodePortAddrs | MapName::ClusterIps => format!("type {addr};"),
        MapName::ClusterDests
        | MapName::LocalDests
        | MapName::ExternalLocalDests
        | MapName::RejectDests
        | MapName::DropDests
        | MapName::MasqDests
        | MapName::FirewallDests => format!("type {dest};"),
        MapName::NodePortClusterDests
        | MapName::NodePortLocalDests
        | MapName::RejectNodePorts
        | MapName::DropNodePorts
        | MapName::MasqNodePorts => format!("type {nodeport};"),
        MapName::ClusterBackends | MapName::LocalBackends => {
            format!(
                "typeof {ip} daddr . meta l4proto . th dport . numgen random mod 1 : {ip} daddr . th dport;"
            )
        }
        MapName::NodePortClusterBackends | MapName::NodePortLocalBackends => {
            format!("typeof meta l4proto . th dport . numgen random mod 1 : {ip} daddr . th dport;")
        }
        MapName::FirewallAllow => format!("type {dest} . {addr}; flags interval;"),
        MapName::Hairpin => format!("type {addr} . {addr};"),
        MapName::AffinityCluster | MapName::AffinityLocal => format!("type {dest} : verdict;"),
        MapName::AffinityNodePortCluster | MapName::AffinityNodePortLocal => {
            format!("type {nodeport} : verdict;")
        }
        MapName::Count(kind, _) => format!("type {};", key_type(kind.by_destination(), n)),
    };
    let kind = if body.contains(':') { "map" } else { "set" };
    format!("\t{kind} {map} {{ {body} }}\n")
}

/// The whole static skeleton of `family`'s table, as `nft -f` input. Loading it creates the
/// table if needed, declares every set and map (existing ones keep their elements), and
/// replaces the rules of the static chains in one transaction.
pub fn skeleton(family: Family, options: &SkeletonOptions) -> String {
    let n = names(family);
    let (fam, ip) = (n.family, n.ip);
    let mark = 1u32 << options.masquerade_bit;
    let dest = format!("{ip} daddr . meta l4proto . th dport");
    let mut out = String::new();
    let _ = writeln!(out, "table {fam} {TABLE} {{");
    for map in MapName::ALL {
        out.push_str(&declaration(map, &n));
    }
    let _ = writeln!(out, "\tset local_pods {{ type {}; flags interval; }}", n.addr);
    let nodeport = format!("{ip} daddr @nodeport_addrs meta l4proto . th dport");
    let chains: Vec<(&str, Option<String>, Vec<String>)> = vec![
        (
            "nat_prerouting",
            Some("type nat hook prerouting priority -100; policy accept;".into()),
            vec!["jump services".into()],
        ),
        (
            "nat_output",
            Some("type nat hook output priority -100; policy accept;".into()),
            vec!["jump services".into()],
        ),
        (
            "nat_postrouting",
            Some("type nat hook postrouting priority 100; policy accept;".into()),
            vec!["ct status dnat jump masquerading".into()],
        ),
        ("services", None, services_rules(&n, options)),
        ("mark_for_masquerade", None, vec![format!("meta mark set meta mark | {mark:#x}")]),
        (
            "masquerading",
            None,
            vec![
                format!("{ip} saddr . {ip} daddr @hairpin masquerade fully-random"),
                format!("meta mark & {mark:#x} == 0 return"),
                format!("meta mark set meta mark ^ {mark:#x}"),
                "masquerade fully-random".into(),
            ],
        ),
        ("external_local", None, external_local_rules(&n, options, "pick_cluster", "pick_local")),
        (
            "nodeport_local",
            None,
            external_local_rules(&n, options, "pick_nodeport_cluster", "pick_nodeport_local"),
        ),
        (
            "filter_prerouting",
            Some("type filter hook prerouting priority -110; policy accept;".into()),
            vec!["ct state new jump firewall_check".into()],
        ),
        (
            "filter_output_early",
            Some("type filter hook output priority -110; policy accept;".into()),
            vec!["ct state new jump firewall_check".into()],
        ),
        (
            "firewall_check",
            None,
            vec![format!("{dest} @firewall_dests {dest} . {ip} saddr != @firewall_allow drop")],
        ),
        (
            "filter_input",
            Some("type filter hook input priority 0; policy accept;".into()),
            vec!["ct state new jump endpoint_check".into()],
        ),
        (
            "filter_forward",
            Some("type filter hook forward priority 0; policy accept;".into()),
            vec!["ct state new jump endpoint_check".into()],
        ),
        (
            "filter_output",
            Some("type filter hook output priority 0; policy accept;".into()),
            vec!["ct state new jump endpoint_check".into()],
        ),
        (
            "endpoint_check",
            None,
            vec![
                format!("{dest} @drop_dests drop"),
                format!("{dest} @reject_dests goto reject_packet"),
                format!("{nodeport} @drop_nodeports drop"),
                format!("{nodeport} @reject_nodeports goto reject_packet"),
                format!("{ip} daddr @cluster_ips goto reject_packet"),
            ],
        ),
        ("reject_packet", None, vec!["reject".into()]),
        ("pick_cluster", None, pick_entry_rules(&dest, PickKind::Cluster)),
        ("pick_local", None, pick_entry_rules(&dest, PickKind::Local)),
        (
            "pick_nodeport_cluster",
            None,
            pick_entry_rules("meta l4proto . th dport", PickKind::NodePortCluster),
        ),
        (
            "pick_nodeport_local",
            None,
            pick_entry_rules("meta l4proto . th dport", PickKind::NodePortLocal),
        ),
    ];
    // The counts chains hold one rule per endpoint count in use, added over netlink: they
    // are declared here but never flushed by a reload.
    for kind in PickKind::ALL {
        let _ = writeln!(out, "\tchain {} {{ }}", kind.counts_chain());
    }
    for (name, hook, _) in &chains {
        let _ = writeln!(out, "\tchain {name} {{ {} }}", hook.as_deref().unwrap_or(""));
    }
    out.push_str("}\n");
    // The detector and the rules of every static chain are replaced in the same
    // transaction: a reload over an existing table leaves no window without rules and never
    // duplicates them.
    let _ = writeln!(out, "flush set {fam} {TABLE} local_pods");
    let detector: Vec<String> =
        local_pods(family, options).iter().map(ToString::to_string).collect();
    if !detector.is_empty() {
        let _ = writeln!(out, "add element {fam} {TABLE} local_pods {{ {} }}", detector.join(", "));
    }
    for (name, _, rules) in &chains {
        let _ = writeln!(out, "flush chain {fam} {TABLE} {name}");
        for rule in rules {
            let _ = writeln!(out, "add rule {fam} {TABLE} {name} {rule}");
        }
    }
    out
}

/// A pick entry: destinations of affinity services go to their own chain, the others to
/// the rule for their endpoint count.
fn pick_entry_rules(key: &str, kind: PickKind) -> Vec<String> {
    vec![format!("{key} vmap @{}", kind.affinity_map()), format!("goto {}", kind.counts_chain())]
}

fn services_rules(n: &Names, options: &SkeletonOptions) -> Vec<String> {
    let ip = n.ip;
    let dest = format!("{ip} daddr . meta l4proto . th dport");
    let nodeport = format!("{ip} daddr @nodeport_addrs meta l4proto . th dport");
    let mut rules = Vec::new();
    if options.masquerade_all {
        rules.push(format!("{ip} daddr @cluster_ips jump mark_for_masquerade"));
    } else if !local_pods(n.family_enum, options).is_empty() {
        rules.push(format!(
            "{ip} daddr @cluster_ips {ip} saddr != @local_pods jump mark_for_masquerade"
        ));
    }
    rules.push(format!("{dest} @masq_dests jump mark_for_masquerade"));
    rules.push(format!("{nodeport} @masq_nodeports jump mark_for_masquerade"));
    rules.push(format!("{dest} @cluster_dests goto pick_cluster"));
    rules.push(format!("{dest} @local_dests goto pick_local"));
    rules.push(format!("{dest} @external_local_dests goto external_local"));
    rules.push(format!("{nodeport} @nodeport_cluster_dests goto pick_nodeport_cluster"));
    rules.push(format!("{nodeport} @nodeport_local_dests goto nodeport_local"));
    rules
}

fn external_local_rules(
    n: &Names,
    options: &SkeletonOptions,
    cluster: &str,
    local: &str,
) -> Vec<String> {
    let mut rules = Vec::new();
    if !local_pods(n.family_enum, options).is_empty() {
        rules.push(format!("{} saddr @local_pods goto {cluster}", n.ip));
    }
    rules.push("fib saddr type local jump mark_for_masquerade".into());
    rules.push(format!("fib saddr type local goto {cluster}"));
    rules.push(format!("goto {local}"));
    rules
}

/// The count set and pick rule for `count` endpoints of `kind`, as `nft -f` input (for
/// display; the backend creates them over netlink).
pub fn ladder(family: Family, kind: PickKind, count: u32) -> String {
    let n = names(family);
    let ip = n.ip;
    let key = if kind.by_destination() {
        format!("{ip} daddr . meta l4proto . th dport")
    } else {
        "meta l4proto . th dport".to_string()
    };
    let set = MapName::Count(kind, count);
    format!(
        "table {fam} {TABLE} {{\n{}}}\nadd rule {fam} {TABLE} {} {key} @{set} dnat {ip} to {key} . numgen random mod {count} map @{}\n",
        declaration(set, &n),
        kind.counts_chain(),
        kind.backends(),
        fam = n.family,
    )
}
