//! The skeleton's shape for each option.

use super::*;
use crate::objects::TREE_COUNTS;

fn texts(skeleton: &Skeleton, chain: &str) -> Vec<String> {
    skeleton
        .chain(chain)
        .unwrap_or_else(|| panic!("no chain {chain}"))
        .rules
        .iter()
        .map(|r| r.text.clone())
        .collect()
}

#[test]
fn the_pick_tree_covers_every_count_with_constant_depth() {
    let skeleton = skeleton(Family::V4, &SkeletonOptions::default());
    let trees =
        skeleton.chains.iter().filter(|c| c.spec.name.starts_with("pick_cluster_t")).count();
    assert_eq!(trees, TREE_COUNTS as usize - 1);
    assert_eq!(
        texts(&skeleton, "pick_cluster_t0_0"),
        [
            "ip daddr . meta l4proto . th dport @cluster_bit_7 goto pick_cluster_t1_1",
            "goto pick_cluster_t1_0",
        ]
    );
    // Leaves: count - 1 is 2 * prefix + bit 0.
    assert_eq!(
        texts(&skeleton, "pick_nodeport_local_t7_2"),
        [
            "meta l4proto . th dport @nodeport_local_bit_0 dnat ip to meta l4proto . th dport . numgen random mod 6 map @nodeport_local_backends_8",
            "dnat ip to meta l4proto . th dport . numgen random mod 5 map @nodeport_local_backends_8",
        ]
    );
}

#[test]
fn each_backends_map_is_read_by_the_pick_rules_of_its_bucket_only() {
    // The kernel checks each element added to a map against every rule reading it.
    let skeleton = skeleton(Family::V4, &SkeletonOptions::default());
    let mut readers = std::collections::BTreeMap::<String, usize>::new();
    for rule in skeleton.chains.iter().flat_map(|c| &c.rules) {
        if let Some((_, map)) = rule.text.split_once(" map @") {
            *readers.entry(map.to_string()).or_default() += 1;
        }
    }
    assert_eq!(readers["cluster_backends_1"], 1);
    assert_eq!(readers["cluster_backends_2"], 1);
    assert_eq!(readers["cluster_backends_4"], 2);
    assert_eq!(readers["local_backends_256"], 128);
    assert_eq!(readers.len(), PickKind::ALL.len() * usize::from(TREE_BITS + 1));
    assert_eq!(readers.values().sum::<usize>(), PickKind::ALL.len() * TREE_COUNTS as usize);
    let rule = count_rule(Family::V4, PickKind::Cluster, 300);
    assert!(
        rule.text.ends_with("numgen random mod 300 map @cluster_backends_more"),
        "{}",
        rule.text
    );
}

#[test]
fn detectors_match_pods_by_source_or_interface() {
    let nets = |list: &[&str]| list.iter().map(|s| s.parse().unwrap()).collect::<Vec<IpNet>>();
    let with = |local_detector| SkeletonOptions { local_detector, ..SkeletonOptions::default() };
    let cidrs =
        skeleton(Family::V4, &with(LocalTraffic::Cidrs(nets(&["10.244.0.0/16", "fd00::/64"]))));
    assert_eq!(
        texts(&cidrs, "masquerade_unless_pod"),
        ["ip saddr 10.244.0.0/16 return", "jump mark_for_masquerade"]
    );
    assert_eq!(texts(&cidrs, "external_local")[0], "ip saddr 10.244.0.0/16 goto pick_cluster");
    let prefix = skeleton(Family::V6, &with(LocalTraffic::InterfacePrefix("veth".into())));
    assert_eq!(texts(&prefix, "masquerade_unless_pod")[0], "iifname \"veth*\" return");
    let bridge = skeleton(Family::V4, &with(LocalTraffic::Interface("cbr0".into())));
    assert_eq!(texts(&bridge, "nodeport_local")[0], "iifname \"cbr0\" goto pick_nodeport_cluster");
    // No detector for a family: no masquerading for being non-local, no short-circuit.
    let none = skeleton(Family::V6, &with(LocalTraffic::Cidrs(nets(&["10.244.0.0/16"]))));
    assert!(none.chain("masquerade_unless_pod").is_none());
    assert_eq!(texts(&none, "external_local")[0], "fib saddr type local jump mark_for_masquerade");
}

#[test]
fn service_cidrs_drop_and_nodeports_can_follow_every_local_address() {
    let options = SkeletonOptions {
        service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
        nodeports_on_all_local: PerFamily { v4: true, v6: false },
        ..SkeletonOptions::default()
    };
    let v4 = skeleton(Family::V4, &options);
    let check = texts(&v4, "endpoint_check");
    assert_eq!(check[check.len() - 2], "ip daddr @cluster_ips goto reject_packet");
    assert_eq!(
        check[check.len() - 1],
        "ip daddr 10.96.0.0/12 drop",
        "after the allocated-IP reject"
    );
    assert!(
        texts(&v4, "services")
            .iter()
            .any(|r| r.starts_with("fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto")),
        "{:?}",
        texts(&v4, "services")
    );
    let v6 = skeleton(Family::V6, &options);
    assert!(texts(&v6, "services").iter().any(|r| r.starts_with("ip6 daddr @nodeport_addrs")));
    assert!(!texts(&v6, "endpoint_check").iter().any(|r| r.contains("10.96")));
}
