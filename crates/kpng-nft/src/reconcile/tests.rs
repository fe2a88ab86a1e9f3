//! Reconciliation touches exactly what differs.

use kpng_model::Family;
use kpng_netlink::nftables::ChainSpec;

use super::*;
use crate::affinity::AffinityGroup;
use crate::layout::{Layout, groups_wanted};
use crate::plan::Plan;
use crate::rules::RuleBuilder;

fn text(commands: &[(Family, Command<'_>)]) -> String {
    Plan { commands: commands.to_vec() }.text()
}

fn layout() -> Layout {
    Layout::default()
}

#[test]
fn the_same_objects_need_nothing() {
    let wanted = layout().wanted();
    let reconciled = reconcile(&wanted, &wanted.as_present());
    assert!(reconciled.is_empty(), "{:?}", reconciled.reasons);
}

#[test]
fn a_missing_table_is_created_whole_with_one_reason() {
    let wanted = layout().wanted();
    let reconciled = reconcile(&wanted, &Present::default());
    assert_eq!(reconciled.reasons, ["table ip kpng missing", "table ip6 kpng missing"]);
    let text = text(&reconciled.before);
    assert!(text.starts_with("add table ip kpng\nadd table ip6 kpng\n"), "{text}");
    assert!(text.contains("add rule ip kpng services ip daddr . meta l4proto . th dport @cluster_dests goto pick_cluster"));
    assert!(reconciled.after.is_empty());
}

#[test]
fn a_deleted_rule_rewrites_its_chain_only() {
    let wanted = layout().wanted();
    let mut present = wanted.as_present();
    let services = present.chains.get_mut(&(Family::V4, "services".to_string())).unwrap();
    services.rules.remove(3);
    let reconciled = reconcile(&wanted, &present);
    let text = text(&reconciled.before);
    let expected_rules = wanted.chains[&(Family::V4, "services".to_string())].1.len();
    assert!(text.starts_with("flush chain ip kpng services\n"), "{text}");
    assert_eq!(text.lines().count(), 1 + expected_rules, "{text}");
    assert!(reconciled.reasons[0].contains("chain ip services"), "{:?}", reconciled.reasons);
}

#[test]
fn a_foreign_rule_and_chain_go() {
    let wanted = layout().wanted();
    let mut present = wanted.as_present();
    let hijack = RuleBuilder::new(Family::V4).dnat_to("192.0.2.66".parse().unwrap(), 80);
    present
        .chains
        .get_mut(&(Family::V4, "nat_prerouting".to_string()))
        .unwrap()
        .rules
        .insert(0, hijack.exprs.into_iter().map(Some).collect());
    present.chains.insert(
        (Family::V6, "intruder".into()),
        PresentChain { hook: None, rules: vec![vec![None]] },
    );
    let reconciled = reconcile(&wanted, &present);
    let before = text(&reconciled.before);
    assert!(
        before.contains("flush chain ip kpng nat_prerouting\nflush chain ip6 kpng intruder\n"),
        "{before}"
    );
    assert!(before.contains("add rule ip kpng nat_prerouting jump services"), "{before}");
    assert_eq!(text(&reconciled.after), "delete chain ip6 kpng intruder\n");
}

#[test]
fn a_set_with_another_definition_is_replaced_with_its_users_rewritten() {
    let wanted = layout().wanted();
    let mut present = wanted.as_present();
    present.sets.get_mut(&(Family::V4, "hairpin".to_string())).unwrap().key_len = 4;
    let reconciled = reconcile(&wanted, &present);
    let before = text(&reconciled.before);
    let flush = before.find("flush chain ip kpng masquerading").expect(&before);
    let delete = before.find("delete set ip kpng hairpin").expect(&before);
    let add = before.find("add set ip kpng hairpin").expect(&before);
    assert!(flush < delete && delete < add, "{before}");
    assert!(reconciled.emptied.contains(&(Family::V4, "hairpin".to_string())));
}

fn group(slots: &[Option<u8>]) -> AffinityGroup {
    AffinityGroup {
        hash: 0xab,
        family: Family::V4,
        protocol: kpng_model::Protocol::Tcp,
        timeout: 60,
        slots: slots
            .iter()
            .map(|s| s.map(|n| (std::net::IpAddr::from([10, 0, 0, n]), 80)))
            .collect(),
        policy: crate::affinity::GroupPolicy::client_ip(),
        stateless: None,
    }
}

#[test]
fn affinity_slots_keep_their_clients_unless_their_endpoint_changes() {
    // Endpoint 1 leaves: its slot goes, the others keep their sets and chains.
    let old = groups_wanted([&group(&[Some(1), Some(2), Some(3)])]).as_present();
    let reconciled = reconcile(&groups_wanted([&group(&[None, Some(2), Some(3)])]), &old);
    let (before, after) = (text(&reconciled.before), text(&reconciled.after));
    assert!(!before.contains("flush set"), "clients of surviving slots stay:\n{before}");
    assert!(before.starts_with("flush chain ip kpng aff_00000000000000ab\n"), "{before}");
    assert_eq!(
        after,
        "delete chain ip kpng aff_00000000000000ab_0\ndelete set ip kpng aff_00000000000000ab_0\n"
    );
    // Another endpoint takes slot 1: its old clients choose again.
    let reconciled = reconcile(&groups_wanted([&group(&[Some(1), Some(9), Some(3)])]), &old);
    let before = text(&reconciled.before);
    assert!(before.contains("flush set ip kpng aff_00000000000000ab_1"), "{before}");
    assert!(!before.contains("flush set ip kpng aff_00000000000000ab_0"), "{before}");
    // A new timeout recreates every slot's set, after the rules that use them are gone.
    let mut retimed = group(&[Some(1), Some(2), Some(3)]);
    retimed.timeout = 30;
    let reconciled = reconcile(&groups_wanted([&retimed]), &old);
    let before = text(&reconciled.before);
    let flush = before.find("flush chain ip kpng aff_00000000000000ab_0").expect(&before);
    let delete = before.find("delete set ip kpng aff_00000000000000ab_0").expect(&before);
    assert!(flush < delete, "{before}");
}

#[test]
fn chains_are_created_before_the_rules_that_use_them() {
    let mut wanted = Wanted::default();
    let spec = |name: &str| ChainSpec { name: name.into(), hook: None };
    let jump = RuleBuilder::new(Family::V4).jump("b");
    wanted.chains.insert((Family::V4, "a".into()), (spec("a"), vec![jump]));
    wanted.chains.insert((Family::V4, "b".into()), (spec("b"), vec![]));
    let mut present = Present::default();
    present.tables.insert(Family::V4);
    let text = text(&reconcile(&wanted, &present).before);
    assert_eq!(text, "add chain ip kpng a\nadd chain ip kpng b\nadd rule ip kpng a jump b\n");
}
