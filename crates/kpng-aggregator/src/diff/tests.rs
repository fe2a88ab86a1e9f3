use super::*;
use crate::parse::parse;

fn state(text: &str) -> State {
    parse(text).unwrap().state
}

#[test]
fn the_same_state_needs_no_command() {
    let s = state(
        "table ip t { set s { type ipv4_addr; elements = { 1.1.1.1 } } chain c { ip saddr @s accept } }",
    );
    assert!(diff("p", &s, &s).is_empty());
}

#[test]
fn a_new_table_is_created_in_dependency_order_with_its_owner() {
    let want = state(
        "table ip t { map m { type ipv4_addr : verdict; elements = { 1.1.1.1 : jump c } }
           chain c { counter }
           chain in { type filter hook input priority 0; policy accept; ip saddr vmap @m } }",
    );
    let script = diff("fw", &State::default(), &want);
    assert_eq!(
        script.commands,
        [
            "add table ip t { comment \"kpng-aggregator producer=fw\"; }",
            "add map ip t m { type ipv4_addr : verdict; }",
            "add chain ip t c",
            "add chain ip t in { type filter hook input priority 0; policy accept; }",
            "add element ip t m { 1.1.1.1 : jump c }",
            "add rule ip t c counter",
            "add rule ip t in ip saddr vmap @m",
        ]
    );
}

#[test]
fn only_what_changed_is_touched() {
    let have = state(
        "table ip t { set s { type ipv4_addr; elements = { 1.1.1.1, 2.2.2.2 } }
           chain a { ip saddr @s accept } chain b { drop } chain gone { accept } }
         table ip old { chain x { } }",
    );
    let want = state(
        "table ip t { set s { type ipv4_addr; elements = { 2.2.2.2, 3.3.3.3 } }
           chain a { ip saddr @s accept } chain b { counter drop } }",
    );
    assert_eq!(
        diff("p", &have, &want).commands,
        [
            "delete table ip old",
            "flush chain ip t b",
            "flush chain ip t gone",
            "delete element ip t s { 1.1.1.1 }",
            "delete chain ip t gone",
            "add element ip t s { 3.3.3.3 }",
            "add rule ip t b counter drop",
        ]
    );
}

#[test]
fn a_redeclared_set_is_recreated_and_its_users_refilled() {
    let have = state(
        "table ip t { set s { type ipv4_addr; } chain a { ip saddr @s accept } chain b { ip saddr @s2 drop } }",
    );
    let want = state(
        "table ip t { set s { type ipv4_addr; flags interval; elements = { 10.0.0.0/8 } }
           chain a { ip saddr @s accept } chain b { ip saddr @s2 drop } }",
    );
    assert_eq!(
        diff("p", &have, &want).commands,
        [
            "flush chain ip t a",
            "delete set ip t s",
            "add set ip t s { type ipv4_addr; flags interval; }",
            "add element ip t s { 10.0.0.0/8 }",
            "add rule ip t a ip saddr @s accept",
        ]
    );
}

#[test]
fn a_policy_change_redeclares_a_hook_change_recreates() {
    let have =
        state("table ip t { chain c { type filter hook input priority 0; policy accept; } }");
    let policy =
        state("table ip t { chain c { type filter hook input priority filter; policy drop; } }");
    assert_eq!(
        diff("p", &have, &policy).commands,
        ["add chain ip t c { type filter hook input priority 0; policy drop; }"]
    );
    let hook = state(
        "table ip t { chain c { type filter hook output priority 0; policy accept; accept } }",
    );
    assert_eq!(
        diff("p", &have, &hook).commands,
        [
            "flush chain ip t c",
            "delete chain ip t c",
            "add chain ip t c { type filter hook output priority 0; policy accept; }",
            "add rule ip t c accept",
        ]
    );
}
