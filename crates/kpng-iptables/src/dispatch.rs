//! The dispatch: where each destination's rules live, so that a new connection walks a few
//! short chains rather than a rule per service, and a one-service change rewrites one
//! short chain.
//!
//! Destinations (address and port) are sharded by the low byte of the address, in two
//! levels: the top chain holds at most 16 rules `-d 0.0.0.N/0.0.0.15` (low nibble), each
//! first-level chain at most 16 rules `-d 0.0.0.B/0.0.0.255` (low byte), and the leaf holds
//! the rules of the destinations whose address ends in that byte (IPv6: `::N/::f` and
//! `::B/::ff`). Service addresses are allocated at random, so leaves hold about 1/256 of
//! the destinations each. NodePorts are bucketed by protocol and 64-port range, entered
//! through one `--dport A:B` rule per non-empty bucket. Only non-empty shards and buckets
//! exist.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kpng_model::{Family, Protocol, ServiceKey};

use crate::names::{self, ChainName};
use crate::render::{ChainKey, Entry, EntryKey, Table};
use crate::rule::{Addr, Rule};

/// A dispatch leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Leaf {
    /// Destinations whose address ends in this byte.
    Byte(u8),
    /// NodePorts of this protocol in `64 * bucket .. 64 * bucket + 63`.
    Bucket(Protocol, u16),
}

/// Ports per NodePort bucket.
pub const BUCKET_PORTS: u16 = 64;

/// A leaf of one family's table.
pub type LeafKey = (Family, Table, Leaf);

fn low_byte(ip: &IpAddr) -> u8 {
    match ip {
        IpAddr::V4(v4) => v4.octets()[3],
        IpAddr::V6(v6) => v6.octets()[15],
    }
}

/// The leaf an entry belongs to.
pub fn leaf_of(entry: &Entry) -> LeafKey {
    let leaf = match entry.key {
        EntryKey::Dest { ip, .. } => Leaf::Byte(low_byte(&ip)),
        EntryKey::NodePort(protocol, port) => Leaf::Bucket(protocol, port / BUCKET_PORTS),
    };
    (entry.family, entry.table, leaf)
}

fn prefixes(table: Table) -> (&'static str, &'static str) {
    match table {
        Table::Nat => ("SH", "NP"),
        Table::Filter => ("FSH", "FNP"),
    }
}

/// Every first-level shard chain a table may have (one per low nibble).
pub fn first_level_chains(table: Table) -> impl Iterator<Item = ChainName> {
    let (dest, _) = prefixes(table);
    (0..16).map(move |nibble| names::shard1(dest, nibble))
}

/// The chain of a leaf.
pub fn leaf_chain(table: Table, leaf: Leaf) -> ChainName {
    let (dest, nodeport) = prefixes(table);
    match leaf {
        Leaf::Byte(b) => names::shard2(dest, b),
        Leaf::Bucket(p, b) => names::nodeport_bucket(nodeport, p, b),
    }
}

fn masked(family: Family, value: u8, mask: u8) -> Addr {
    match family {
        Family::V4 => Addr::Masked(
            IpAddr::V4(Ipv4Addr::new(0, 0, 0, value)),
            IpAddr::V4(Ipv4Addr::new(0, 0, 0, mask)),
        ),
        Family::V6 => Addr::Masked(
            IpAddr::V6(Ipv6Addr::from(u128::from(value))),
            IpAddr::V6(Ipv6Addr::from(u128::from(mask))),
        ),
    }
}

/// Every service's dispatch entries, by leaf.
#[derive(Debug, Clone, Default)]
pub struct Dispatch {
    leaves: BTreeMap<LeafKey, BTreeMap<(EntryKey, ServiceKey, Rule), ()>>,
}

impl Dispatch {
    /// Adds (`add`) or removes one service's entries; returns the leaves touched.
    pub fn file(
        &mut self,
        service: &ServiceKey,
        entries: &[Entry],
        add: bool,
        touched: &mut BTreeSet<LeafKey>,
    ) {
        for entry in entries {
            let leaf = leaf_of(entry);
            touched.insert(leaf);
            let key = (entry.key, service.clone(), entry.rule.clone());
            if add {
                self.leaves.entry(leaf).or_default().insert(key, ());
            } else if let Some(rules) = self.leaves.get_mut(&leaf) {
                rules.remove(&key);
                if rules.is_empty() {
                    self.leaves.remove(&leaf);
                }
            }
        }
    }

    /// A leaf chain's rules (empty: the chain does not exist).
    pub fn leaf_rules(&self, leaf: &LeafKey) -> Vec<Rule> {
        self.leaves
            .get(leaf)
            .map(|r| r.keys().map(|(_, _, rule)| rule.clone()).collect())
            .unwrap_or_default()
    }

    /// The first-level and NodePort chains of one family's table, from its non-empty leaves:
    /// the rules that enter destination shards (for the top chain), the first-level chains,
    /// and the rules of `KPNG-NODEPORTS`.
    pub fn upper(&self, family: Family, table: Table) -> Upper {
        let mut upper = Upper::default();
        let (dest, _) = prefixes(table);
        let mut by_nibble: BTreeMap<u8, Vec<Rule>> = BTreeMap::new();
        let range = (family, table, Leaf::Byte(0))
            ..=(family, table, Leaf::Bucket(Protocol::Sctp, u16::MAX));
        for (family, table, leaf) in self.leaves.range(range).map(|(k, _)| *k) {
            let chain = leaf_chain(table, leaf);
            match leaf {
                Leaf::Byte(b) => by_nibble
                    .entry(b & 0xf)
                    .or_default()
                    .push(Rule::jump(&chain).dst(masked(family, b, 0xff))),
                Leaf::Bucket(p, bucket) => {
                    let lo = bucket * BUCKET_PORTS;
                    let mut rule = Rule::jump(&chain).proto(p);
                    rule.matches.push(crate::rule::Match::Dport(
                        p,
                        lo,
                        Some(lo + (BUCKET_PORTS - 1)),
                    ));
                    upper.nodeports.push(rule);
                }
            }
        }
        for (nibble, rules) in by_nibble {
            let chain = names::shard1(dest, nibble);
            upper.top.push(Rule::jump(&chain).dst(masked(family, nibble, 0xf)));
            upper.shards.push(((family, table, chain), rules));
        }
        upper
    }
}

/// The chains above the leaves of one family's table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Upper {
    /// Rules of the top chain entering the first-level shards.
    pub top: Vec<Rule>,
    /// The first-level shard chains.
    pub shards: Vec<(ChainKey, Vec<Rule>)>,
    /// The rules of `KPNG-NODEPORTS`.
    pub nodeports: Vec<Rule>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::Target;

    fn entry(ip: &str, port: u16) -> Entry {
        let ip: IpAddr = ip.parse().unwrap();
        Entry {
            family: Family::of(&ip),
            table: Table::Nat,
            key: EntryKey::Dest { ip, whole: false, protocol: Protocol::Tcp, port },
            rule: Rule::to(Target::Drop).dst(Addr::host(ip)).dport(Protocol::Tcp, port),
        }
    }

    #[test]
    fn destinations_shard_by_low_nibble_then_low_byte() {
        let mut d = Dispatch::default();
        let mut touched = BTreeSet::new();
        let key = ServiceKey::new("a", "b");
        d.file(
            &key,
            &[entry("10.96.0.21", 80), entry("10.96.1.21", 80), entry("10.96.0.37", 80)],
            true,
            &mut touched,
        );
        assert_eq!(touched.len(), 2, "{touched:?}");
        let upper = d.upper(Family::V4, Table::Nat);
        let top: Vec<String> = upper.top.iter().map(ToString::to_string).collect();
        assert_eq!(top, ["-d 0.0.0.5/0.0.0.15 -j KPNG-SH-5"]);
        let shard: Vec<String> = upper.shards[0].1.iter().map(ToString::to_string).collect();
        assert_eq!(
            shard,
            ["-d 0.0.0.21/0.0.0.255 -j KPNG-SH-15", "-d 0.0.0.37/0.0.0.255 -j KPNG-SH-25"]
        );
        assert_eq!(d.leaf_rules(&(Family::V4, Table::Nat, Leaf::Byte(21))).len(), 2);
        // Removing empties the leaf: the chain goes.
        d.file(&key, &[entry("10.96.0.37", 80)], false, &mut touched);
        assert!(d.leaf_rules(&(Family::V4, Table::Nat, Leaf::Byte(37))).is_empty());
        assert_eq!(d.upper(Family::V4, Table::Nat).shards[0].1.len(), 1);
        assert!(d.upper(Family::V6, Table::Nat).top.is_empty());
    }
}
