use super::*;
use crate::applier::MemoryApplier;
use crate::model::{Family, Update};
use crate::parse::parse;

const LEASE: Duration = Duration::from_secs(60);

fn whole(revision: u64, text: &str) -> Publication {
    Publication { revision, updates: vec![Update::Whole(parse(text).unwrap().state)] }
}

fn add_elements(revision: u64, table: &str, set: &str, elements: &[&str]) -> Publication {
    let table = TableKey::new(Family::Ip, table);
    let elements = elements.iter().map(|e| e.to_string()).collect();
    Publication {
        revision,
        updates: vec![Update::AddElements { table, set: set.into(), elements }],
    }
}

fn two_producers() -> (Aggregator, MemoryApplier, Instant) {
    let mut aggregator = Aggregator::new(LEASE);
    let mut applier = MemoryApplier::default();
    let now = Instant::now();
    for (name, table) in [("a", "ta"), ("b", "tb")] {
        aggregator.connect(name, "uid:0").unwrap();
        let text = format!(
            "table ip {table} {{ set s {{ type ipv4_addr; }} chain c {{ ip saddr @s accept }} }}"
        );
        aggregator.publish(name, whole(1, &text)).unwrap();
    }
    let batch = aggregator.commit(&mut applier, now);
    assert_eq!(batch.transactions, 1);
    (aggregator, applier, now)
}

#[test]
fn two_producers_updates_land_in_one_transaction() {
    let (mut aggregator, mut applier, now) = two_producers();
    assert_eq!(applier.transactions.len(), 1, "both whole states in one transaction");
    aggregator.publish("a", add_elements(2, "ta", "s", &["1.1.1.1"])).unwrap();
    aggregator.publish("a", add_elements(3, "ta", "s", &["1.1.1.2"])).unwrap();
    aggregator.publish("b", add_elements(2, "tb", "s", &["2.2.2.2"])).unwrap();
    let batch = aggregator.commit(&mut applier, now);
    assert_eq!(batch.transactions, 1);
    assert_eq!(batch.acks, [("a".to_string(), 3), ("b".to_string(), 2)]);
    assert_eq!(
        applier.transactions[1].commands,
        ["add element ip ta s { 1.1.1.1, 1.1.1.2 }", "add element ip tb s { 2.2.2.2 }"],
        "only what changed, a's two revisions coalesced"
    );
    assert!(!aggregator.has_pending());
}

#[test]
fn a_bad_producer_is_isolated_and_told_why() {
    let (mut aggregator, mut applier, now) = two_producers();
    applier.refuse = vec!["nochain".into()];
    let bad = Publication {
        revision: 2,
        updates: vec![Update::ReplaceRules {
            table: TableKey::new(Family::Ip, "ta"),
            chain: "c".into(),
            rules: vec!["jump nochain".into()],
        }],
    };
    aggregator.publish("a", bad).unwrap();
    aggregator.publish("b", add_elements(2, "tb", "s", &["2.2.2.2"])).unwrap();
    let batch = aggregator.commit(&mut applier, now);
    assert_eq!(batch.acks, [("b".to_string(), 2)]);
    let [rejection] = batch.rejections.as_slice() else { panic!("{batch:?}") };
    assert_eq!((rejection.producer.as_str(), rejection.revision), ("a", 2));
    assert_eq!(rejection.object, "add rule ip ta c jump nochain");
    assert!(rejection.message.contains("Could not process rule"), "{rejection}");
    assert_eq!(batch.transactions, 1, "the rest in one transaction");
    assert_eq!(applier.transactions.last().unwrap().commands, ["add element ip tb s { 2.2.2.2 }"]);
    // a keeps its previous committed state: republishing it changes nothing.
    let report = aggregator.report(now, true);
    assert_eq!(
        report.producers["a"].committed.as_ref().unwrap().tables[&TableKey::new(Family::Ip, "ta")]
            .chains["c"]
            .rules,
        ["ip saddr @s accept"]
    );
    assert_eq!(report.producers["a"].stats.rejections, 1);
}

#[test]
fn tables_of_others_are_refused() {
    let (mut aggregator, mut applier, now) = two_producers();
    let error = aggregator.publish("a", whole(2, "table ip tb { }")).unwrap_err();
    assert_eq!(error.object, "table ip tb");
    assert_eq!(error.message, "refused to producer a: table ip tb belongs to producer b");
    applier.foreign = vec![TableKey::new(Family::Inet, "filter")];
    aggregator.adopt("table inet filter {\n}\n", now).unwrap();
    let error = aggregator.publish("a", whole(3, "table inet filter { }")).unwrap_err();
    assert!(
        error
            .message
            .contains("table inet filter exists in the kernel and is not the aggregator's"),
        "{error}"
    );
    // One created by someone else since start-up is found when the batch would create it.
    applier.foreign.push(TableKey::new(Family::Ip, "late"));
    aggregator.publish("a", whole(4, "table ip late { }")).unwrap();
    let batch = aggregator.commit(&mut applier, now);
    assert_eq!(batch.rejections[0].object, "table ip late");
    assert_eq!(batch.transactions, 0);
    assert!(matches!(aggregator.connect("a", "uid:0"), Err(Refusal::Connected(_))));
    assert!(aggregator.connect("bad name", "uid:0").is_err());
}

#[test]
fn an_expired_lease_removes_only_that_producers_tables() {
    let (mut aggregator, mut applier, now) = two_producers();
    aggregator.disconnect("a", now);
    assert_eq!(aggregator.next_expiry(), Some(now + LEASE));
    assert!(aggregator.expire(now + LEASE / 2).is_empty(), "not yet");
    assert_eq!(aggregator.expire(now + LEASE), ["a"]);
    let batch = aggregator.commit(&mut applier, now + LEASE);
    assert_eq!(batch.removed, ["a"]);
    assert_eq!(applier.transactions.last().unwrap().commands, ["delete table ip ta"]);
    let report = aggregator.report(now, true);
    assert!(!report.producers.contains_key("a") && report.producers.contains_key("b"));
}

#[test]
fn a_reconnection_with_the_same_whole_state_changes_nothing() {
    let (mut aggregator, mut applier, now) = two_producers();
    aggregator.disconnect("a", now);
    aggregator.connect("a", "uid:0").unwrap();
    let text = "table ip ta { set s { type ipv4_addr; } chain c { ip saddr @s accept } }";
    aggregator.publish("a", whole(7, text)).unwrap();
    let batch = aggregator.commit(&mut applier, now);
    assert_eq!(batch.acks, [("a".to_string(), 7)]);
    assert_eq!((batch.transactions, applier.transactions.len()), (0, 1), "no transaction");
    assert_eq!(aggregator.next_expiry(), None, "the lease stopped");
}

#[test]
fn a_restart_adopts_the_kernels_tables_and_flushes_nothing() {
    // A foreign table may hold what the model has no place for: it is not read.
    let listed = "table ip ta {\n\tcomment \"kpng-aggregator producer=a\"\n\tset s {\n\t\ttype ipv4_addr\n\t\telements = { 1.1.1.1 }\n\t}\n\n\tchain c {\n\t\tip saddr @s counter accept\n\t}\n}\ntable ip foreign {\n\tct helper ftp_tcp {\n\t\ttype \"ftp\" protocol tcp\n\t\tl3proto ip\n\t}\n\tflowtable f {\n\t\thook ingress priority filter\n\t\tdevices = { lo }\n\t}\n}\n";
    let mut aggregator = Aggregator::new(LEASE);
    let mut applier = MemoryApplier::default();
    let now = Instant::now();
    assert_eq!(aggregator.adopt(listed, now).unwrap(), ["a"]);
    assert!(!aggregator.has_pending(), "nothing to commit after adoption");
    assert_eq!(aggregator.next_expiry(), Some(now + LEASE), "a lease from start-up");
    aggregator.connect("a", "uid:0").unwrap();
    let text = "table ip ta { set s { type ipv4_addr; elements = { 1.1.1.1, 2.2.2.2 } } chain c { ip saddr @s counter accept } }";
    aggregator.publish("a", whole(1, text)).unwrap();
    aggregator.commit(&mut applier, now);
    assert_eq!(
        applier.transactions[0].commands,
        ["add element ip ta s { 2.2.2.2 }"],
        "converged by diff"
    );
    let error = aggregator.publish("a", whole(2, "table ip foreign { }")).unwrap_err();
    assert!(error.message.contains("not the aggregator's"), "{error}");
}

#[test]
fn a_publication_that_does_not_apply_is_refused_at_once() {
    let (mut aggregator, _, _) = two_producers();
    let error = aggregator.publish("a", add_elements(2, "nope", "s", &["1.1.1.1"])).unwrap_err();
    assert_eq!(error.message, "table ip nope does not exist");
    let error = aggregator.publish("a", whole(3, "table ip ta { chain c { accept; drop } }"));
    assert!(error.is_ok(), "two statements are two rules");
    assert!(aggregator.publish("nobody", whole(1, "table ip x { }")).is_err());
}

#[test]
fn a_table_deleted_behind_the_aggregators_back_is_recreated_by_the_next_whole_state() {
    let (mut aggregator, mut applier, now) = two_producers();
    // Someone deletes table ip ta: the kernel lists only tb; nft refuses a's next change.
    applier.listed = Some("table ip tb {\n\tcomment \"kpng-aggregator producer=b\"\n\tset s {\n\t\ttype ipv4_addr\n\t}\n\n\tchain c {\n\t\tip saddr @s accept\n\t}\n}\n".into());
    applier.refuse = vec!["ip ta".into()];
    aggregator.publish("a", add_elements(2, "ta", "s", &["1.1.1.1"])).unwrap();
    let batch = aggregator.commit(&mut applier, now);
    assert_eq!(batch.rejections.len(), 1);
    // The producer publishes its whole state again, as after any refusal: compared with
    // what the kernel holds, the table is created anew with everything in it.
    applier.refuse.clear();
    let text = "table ip ta { set s { type ipv4_addr; elements = { 1.1.1.1 } } chain c { ip saddr @s accept } }";
    aggregator.publish("a", whole(3, text)).unwrap();
    let batch = aggregator.commit(&mut applier, now);
    assert_eq!(batch.acks, [("a".to_string(), 3)]);
    let script = &applier.transactions.last().unwrap().commands;
    assert!(script.iter().any(|c| c.starts_with("add table ip ta ")), "{script:?}");
    assert!(script.contains(&"add element ip ta s { 1.1.1.1 }".to_string()), "{script:?}");
    assert!(script.contains(&"add rule ip ta c ip saddr @s accept".to_string()), "{script:?}");
}

mod random_histories {
    use proptest::prelude::*;

    use super::*;
    use crate::model::{Chain, Set, SetKind, Table};

    fn key(t: u8) -> TableKey {
        TableKey::new(Family::Ip, format!("t{t}"))
    }

    fn set(interval: bool, elements: &[u8]) -> Set {
        let declaration =
            if interval { "type ipv4_addr; flags interval;" } else { "type ipv4_addr;" };
        Set::new(SetKind::Set, declaration, elements.iter().map(|e| format!("10.0.0.{e}")))
    }

    fn chain(s: u8, verdict: bool) -> Chain {
        let rule = format!("ip saddr @s{s} {}", if verdict { "accept" } else { "drop" });
        Chain::new(None, [rule])
    }

    /// Updates over two tables, two sets and two chains, some of which do not apply.
    fn arb_update() -> impl Strategy<Value = Update> {
        let elements = prop::collection::vec(0u8..5, 1..4);
        prop_oneof![
            1 => (0u8..2, prop::collection::vec(0u8..8, 0..4)).prop_map(|(t, e)| {
                let mut table = Table::default();
                table.sets.insert("s0".into(), set(false, &e));
                table.sets.insert("s1".into(), set(false, &[]));
                table.chains.insert("c0".into(), chain(0, true));
                Update::PutTable { table: key(t), content: table }
            }),
            1 => (0u8..2).prop_map(|t| Update::DeleteTable { table: key(t) }),
            1 => (0u8..2, 0u8..2, any::<bool>(), elements.clone()).prop_map(|(t, s, i, e)| {
                Update::PutSet { table: key(t), name: format!("s{s}"), set: set(i, &e) }
            }),
            1 => (0u8..2, 0u8..2).prop_map(|(t, s)| Update::DeleteSet { table: key(t), name: format!("s{s}") }),
            1 => (0u8..2, 0u8..2, 0u8..2, any::<bool>()).prop_map(|(t, c, s, v)| {
                Update::PutChain { table: key(t), name: format!("c{c}"), chain: chain(s, v) }
            }),
            1 => (0u8..2, 0u8..2).prop_map(|(t, c)| Update::DeleteChain { table: key(t), name: format!("c{c}") }),
            1 => (0u8..2, 0u8..2, any::<bool>()).prop_map(|(t, c, v)| Update::ReplaceRules {
                table: key(t),
                chain: format!("c{c}"),
                rules: vec![format!("ip daddr @s0 {}", if v { "accept" } else { "drop" })],
            }),
            4 => (0u8..2, 0u8..2, elements.clone()).prop_map(|(t, s, e)| Update::AddElements {
                table: key(t),
                set: format!("s{s}"),
                elements: e.iter().map(|e| format!("10.0.0.{e}")).collect(),
            }),
            4 => (0u8..2, 0u8..2, elements).prop_map(|(t, s, e)| Update::RemoveElements {
                table: key(t),
                set: format!("s{s}"),
                elements: e.iter().map(|e| format!("10.0.0.{e}")).collect(),
            }),
        ]
    }

    fn sorted(script: &Script) -> Vec<String> {
        let mut commands = script.commands.clone();
        commands.sort();
        commands
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Batches diff, commit and roll back only what publications touched; they must do
        /// exactly what comparing whole states would: the same commands, the same committed
        /// state, and after a refusal the committed state again.
        #[test]
        fn batches_match_whole_state_comparisons(
            history in prop::collection::vec(
                (prop::collection::vec(prop::collection::vec(arb_update(), 1..4), 1..4), any::<bool>()),
                1..8,
            )
        ) {
            let now = Instant::now();
            let mut aggregator = Aggregator::new(LEASE);
            let mut applier = MemoryApplier::default();
            aggregator.connect("p", "uid:0").unwrap();
            // Both tables exist at first, so that most updates apply.
            let mut start = State::default();
            for t in 0..2 {
                let mut table = Table::default();
                table.sets.insert("s0".into(), set(false, &[0, 1, 2]));
                table.sets.insert("s1".into(), set(true, &[3]));
                table.chains.insert("c0".into(), chain(0, true));
                table.chains.insert("c1".into(), chain(1, false));
                start.tables.insert(key(t), table);
            }
            let first = Publication { revision: 0, updates: vec![Update::Whole(start.clone())] };
            aggregator.publish("p", first).unwrap();
            aggregator.commit(&mut applier, now);
            let (mut committed, mut revision) = (start, 0);
            for (publications, refuse) in history {
                let mut desired = committed.clone();
                for updates in publications {
                    revision += 1;
                    let mut attempt = desired.clone();
                    let applies = updates.iter().cloned().all(|u| attempt.apply(u).is_ok());
                    let publication = Publication { revision, updates };
                    prop_assert_eq!(aggregator.publish("p", publication).is_ok(), applies);
                    if applies {
                        desired = attempt;
                    }
                }
                let expected = crate::diff::diff("p", &committed, &desired);
                applier.refuse = if refuse { vec!["".into()] } else { Vec::new() };
                let transactions = applier.transactions.len();
                let batch = aggregator.commit(&mut applier, now);
                let report = aggregator.report(now, true);
                let held = report.producers["p"].committed.clone().unwrap();
                if refuse && !expected.is_empty() {
                    prop_assert_eq!(batch.rejections.len(), 1);
                    prop_assert_eq!(&held, &committed, "a refusal keeps the committed state");
                } else {
                    prop_assert!(batch.rejections.is_empty());
                    let scripts = &applier.transactions[transactions..];
                    let done = scripts.first().map(sorted).unwrap_or_default();
                    prop_assert_eq!(done, sorted(&expected));
                    prop_assert_eq!(&held, &desired);
                    committed = desired;
                }
                prop_assert!(!aggregator.has_pending());
            }
        }
    }
}

#[test]
fn a_name_stays_with_the_identity_that_first_published_it() {
    let (mut aggregator, mut applier, now) = two_producers();
    assert_eq!(aggregator.bindings().get("a").map(String::as_str), Some("uid:0"));
    aggregator.disconnect("a", now);
    // While the owner is away, and after its lease ran out and its tables went, another
    // identity may not take the name.
    let refused = aggregator.connect("a", "uid:65534").unwrap_err();
    assert!(matches!(&refused, Refusal::Bound { owner, .. } if owner == "uid:0"), "{refused}");
    assert!(refused.to_string().contains("uid:65534"), "{refused}");
    assert_eq!(aggregator.expire(now + LEASE), ["a"]);
    aggregator.commit(&mut applier, now + LEASE);
    assert!(matches!(aggregator.connect("a", "uid:65534"), Err(Refusal::Bound { .. })));
    // A new name is the newcomer's; the owner gets its own back.
    assert_eq!(aggregator.connect("c", "uid:65534"), Ok(Binding::New));
    assert_eq!(aggregator.connect("a", "uid:0"), Ok(Binding::Known));
    // Bindings read back after a restart hold the same.
    let mut restarted = Aggregator::with_bindings(LEASE, aggregator.bindings().clone());
    assert!(matches!(restarted.connect("c", "uid:0"), Err(Refusal::Bound { .. })));
    assert_eq!(restarted.connect("c", "uid:65534"), Ok(Binding::Known));
}

#[test]
fn a_rejection_carries_an_excerpt_of_what_was_refused() {
    let long = format!("element {}", "1.2.3.4, ".repeat(100_000));
    let rejection = Rejection::new("p", 3, long.clone(), "é".repeat(300));
    assert!(rejection.object.len() < EXCERPT + 32, "{}", rejection.object.len());
    assert!(rejection.object.starts_with("element 1.2.3.4"));
    assert!(rejection.object.ends_with(&format!("... ({} bytes)", long.len())));
    assert!(rejection.message.ends_with("... (600 bytes)"), "cut at a character boundary");
    let short = Rejection::new("p", 3, "table ip t".into(), "no such file".into());
    assert_eq!((short.object.as_str(), short.message.as_str()), ("table ip t", "no such file"));
}
