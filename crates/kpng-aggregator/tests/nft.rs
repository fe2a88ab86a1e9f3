//! The aggregator against the real kernel in a network namespace of its own, through each
//! applier (libnftables in-process, and the `nft` command): one transaction per batch, a
//! bad producer isolated, and a restart that flushes nothing.

use std::time::{Duration, Instant};

use kpng_aggregator::diff::Script;
use kpng_aggregator::parse::parse;
use kpng_aggregator::{
    Aggregator, Applier, LibNftApplier, NftApplier, NftError, Publication, TableKey, Update,
};
use kpng_testkit::netns::Netns;
use kpng_testkit::privileged::require;

const LEASE: Duration = Duration::from_secs(60);

/// Counts the commits: each sends one netlink batch, one transaction.
struct Counting {
    nft: Box<dyn Applier>,
    transactions: usize,
}

/// The appliers every scenario runs with.
const APPLIERS: [&str; 2] = ["libnftables", "nft"];

impl Counting {
    /// `kind`'s applier, programming `netns`.
    fn new(kind: &str, netns: &Netns) -> Counting {
        let nft: Box<dyn Applier> = match kind {
            "libnftables" => Box::new(LibNftApplier::open(Some(netns.name())).unwrap()),
            _ => Box::new(NftApplier::in_netns(netns.name())),
        };
        Counting { nft, transactions: 0 }
    }
}

impl Applier for Counting {
    fn commit(&mut self, script: &Script) -> Result<(), NftError> {
        self.transactions += 1;
        self.nft.commit(script)
    }
    fn check(&mut self, script: &Script) -> Result<(), NftError> {
        self.nft.check(script)
    }
    fn tables(&mut self) -> Result<Vec<TableKey>, NftError> {
        self.nft.tables()
    }
    fn ruleset(&mut self) -> Result<String, NftError> {
        self.nft.ruleset()
    }
}

fn whole(revision: u64, text: &str) -> Publication {
    Publication { revision, updates: vec![Update::Whole(parse(text).unwrap().state)] }
}

fn nft(netns: &Netns, args: &[&str]) -> String {
    let out = netns.output("nft", args);
    assert!(out.status.success(), "nft {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn producer_table(name: &str) -> String {
    format!(
        "table ip {name} {{
           set allowed {{ type ipv4_addr . inet_service; flags interval; elements = {{ 10.0.0.0/8 . 22 }} }}
           chain out {{ type filter hook output priority 0; policy accept; ip daddr . udp dport @allowed counter accept
             meta l4proto udp counter }}
         }}"
    )
}

#[test]
fn two_producers_land_in_one_transaction_per_batch() {
    if !require("two_producers_land_in_one_transaction_per_batch", &["nft", "ip"]) {
        return;
    }
    for kind in APPLIERS {
        two_producers_land_in_one_transaction_per_batch_with(kind);
    }
}

fn two_producers_land_in_one_transaction_per_batch_with(kind: &str) {
    let netns = Netns::new("agg2");
    let mut applier = Counting::new(kind, &netns);
    let mut aggregator = Aggregator::new(LEASE);
    let now = Instant::now();
    for name in ["a", "b"] {
        aggregator.connect(name, "uid:0").unwrap();
        aggregator.publish(name, whole(1, &producer_table(name))).unwrap();
    }
    let batch = aggregator.commit(&mut applier, now);
    assert_eq!((batch.transactions, applier.transactions), (1, 1), "{batch:?}");
    for name in ["a", "b"] {
        let elements = vec![format!("192.168.0.{} . 53", name.len())];
        let table = TableKey::new(kpng_aggregator::Family::Ip, name);
        let set = "allowed".to_string();
        let update = Update::AddElements { table, set, elements };
        aggregator.publish(name, Publication { revision: 2, updates: vec![update] }).unwrap();
    }
    let batch = aggregator.commit(&mut applier, now);
    assert_eq!(batch.acks.len(), 2);
    assert_eq!((batch.transactions, applier.transactions), (1, 2), "one more transaction");
    let tables = nft(&netns, &["list", "tables"]);
    assert!(tables.contains("table ip a") && tables.contains("table ip b"), "{tables}");
    let listed = nft(&netns, &["list", "set", "ip", "b", "allowed"]);
    assert!(listed.contains("192.168.0.1 . 53"), "{listed}");
    let listed = nft(&netns, &["list", "table", "ip", "a"]);
    assert!(listed.contains("comment \"kpng-aggregator producer=a\""), "{listed}");
}

#[test]
fn a_bad_producer_is_isolated() {
    if !require("a_bad_producer_is_isolated", &["nft", "ip"]) {
        return;
    }
    for kind in APPLIERS {
        a_bad_producer_is_isolated_with(kind);
    }
}

fn a_bad_producer_is_isolated_with(kind: &str) {
    let netns = Netns::new("aggbad");
    let mut applier = Counting::new(kind, &netns);
    let mut aggregator = Aggregator::new(LEASE);
    let now = Instant::now();
    for name in ["good", "bad"] {
        aggregator.connect(name, "uid:0").unwrap();
        aggregator.publish(name, whole(1, &producer_table(name))).unwrap();
    }
    aggregator.commit(&mut applier, now);
    let broken = producer_table("bad").replace("meta l4proto udp counter", "jump nowhere");
    aggregator.publish("bad", whole(2, &broken)).unwrap();
    let good =
        producer_table("good").replace("10.0.0.0/8 . 22", "10.0.0.0/8 . 22, 172.16.0.0/12 . 80");
    aggregator.publish("good", whole(2, &good)).unwrap();
    let batch = aggregator.commit(&mut applier, now);
    assert_eq!(batch.acks, [("good".to_string(), 2)], "{batch:?}");
    let [rejection] = batch.rejections.as_slice() else { panic!("{batch:?}") };
    assert_eq!(rejection.producer, "bad");
    assert!(rejection.object.contains("jump nowhere"), "names the command: {rejection}");
    assert!(rejection.message.contains("Error"), "nft's error: {rejection}");
    let listed = nft(&netns, &["list", "set", "ip", "good", "allowed"]);
    assert!(listed.contains("172.16.0.0/12 . 80"), "the good producer's change: {listed}");
    let listed = nft(&netns, &["list", "chain", "ip", "bad", "out"]);
    assert!(listed.contains("meta l4proto udp counter"), "the bad producer's rules stay: {listed}");
}

#[test]
fn a_restart_adopts_and_flushes_nothing() {
    if !require("a_restart_adopts_and_flushes_nothing", &["nft", "ip", "bash"]) {
        return;
    }
    for kind in APPLIERS {
        a_restart_adopts_and_flushes_nothing_with(kind);
    }
}

fn a_restart_adopts_and_flushes_nothing_with(kind: &str) {
    let netns = Netns::new("aggrst");
    let mut applier = Counting::new(kind, &netns);
    let now = Instant::now();
    let mut first = Aggregator::new(LEASE);
    first.connect("fw", "uid:0").unwrap();
    first.publish("fw", whole(1, &producer_table("fw"))).unwrap();
    assert_eq!(first.commit(&mut applier, now).transactions, 1);
    // Traffic through the output chain counts.
    let sent = netns.output("bash", &["-c", "echo x > /dev/udp/127.0.0.1/9"]);
    assert!(sent.status.success(), "{}", String::from_utf8_lossy(&sent.stderr));
    let counted = nft(&netns, &["list", "chain", "ip", "fw", "out"]);
    assert!(counted.contains("meta l4proto udp counter packets 1"), "{counted}");
    drop(first);

    // A new aggregator adopts the table, and the producer's republication changes nothing.
    let mut second = Aggregator::new(LEASE);
    let listed = applier.ruleset().unwrap();
    assert_eq!(second.adopt(&listed, now).unwrap(), ["fw"]);
    assert!(!second.has_pending(), "adoption commits nothing");
    second.connect("fw", "uid:0").unwrap();
    second.publish("fw", whole(1, &producer_table("fw"))).unwrap();
    let batch = second.commit(&mut applier, now);
    assert_eq!(batch.acks, [("fw".to_string(), 1)]);
    assert_eq!(
        (batch.transactions, applier.transactions),
        (0, 1),
        "converged without a transaction"
    );
    let after = nft(&netns, &["list", "table", "ip", "fw"]);
    assert!(after.contains("meta l4proto udp counter packets 1"), "the counter survived: {after}");
    assert!(after.contains("10.0.0.0/8 . 22"), "the element survived: {after}");
}
