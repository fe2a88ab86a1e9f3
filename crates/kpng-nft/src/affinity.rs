//! ClientIP session affinity, for the services that ask for it.
//!
//! Each service port, family and endpoint set of an affinity service is a group with its
//! own chain `aff_<hash>` (the only per-service chains kpng makes). Slot `i` of the group
//! has a timeout set `aff_<hash>_<i>` of client addresses and a chain `aff_<hash>_<i>` that
//! refreshes the client in that set and DNATs to the slot's endpoint:
//!
//! ```text
//! chain aff_h    { ip saddr @aff_h_0 goto aff_h_0; ...                 (a known client)
//!                  numgen random mod N == 0 goto aff_h_0;              (a new one: slot 0 with 1/N,
//!                  numgen random mod N-1 == 0 goto aff_h_1; ...         slot 1 with 1/(N-1) of the rest, ...)
//!                  goto aff_h_<N-1> }
//! chain aff_h_i  { update @aff_h_i { ip saddr } dnat ip to <endpoint i> }
//! ```
//!
//! Every destination of the group (ClusterIP, external and LB IPs, NodePort) enters the
//! same chain through the `affinity_*` verdict maps, so a client sticks to one endpoint
//! across all of a service port's addresses, and each new connection refreshes the
//! timeout. When a slot's endpoint changes, its set is emptied: clients of the old
//! endpoint choose again.

use std::fmt::Write;
use std::hash::Hasher;

use kpng_model::{Family, ServiceKey};

use crate::objects::{TABLE, affinity_chain, table_family};
use crate::render::GroupKey;
use crate::slots::Target;

/// One affinity group as it should be in the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffinityGroup {
    /// Stable identity (names its chains and sets).
    pub hash: u64,
    /// The family.
    pub family: Family,
    /// The service port's protocol.
    pub protocol: kpng_model::Protocol,
    /// Affinity timeout in seconds.
    pub timeout: u32,
    /// The endpoint of each slot.
    pub slots: Vec<Target>,
}

/// What a transaction does to one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AffinityOp {
    /// Make the group's sets and chains.
    Create(AffinityGroup),
    /// Rewrite a group in place (its entry chain stays: verdict maps point at it).
    Replace {
        /// What the kernel holds (slot endpoints may be unknown after a restart).
        old: AffinityGroup,
        /// What it must hold.
        new: AffinityGroup,
    },
    /// Remove the group, once nothing points at it.
    Remove(AffinityGroup),
}

/// A stable 64-bit name for a group (FNV-1a of its identity).
pub fn group_hash(service: &ServiceKey, group: &GroupKey) -> u64 {
    let mut hasher = Fnv(0xcbf2_9ce4_8422_2325);
    let text =
        format!("{service}|{:?}|{}|{}|{:?}", group.family, group.port, group.protocol, group.kind);
    hasher.write(text.as_bytes());
    hasher.finish()
}

struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The name of slot `i`'s set and chain.
pub fn slot_name(hash: u64, i: usize) -> String {
    format!("{}_{i}", affinity_chain(hash))
}

fn addr_type(family: Family) -> (&'static str, &'static str) {
    match family {
        Family::V4 => ("ipv4_addr", "ip"),
        Family::V6 => ("ipv6_addr", "ip6"),
    }
}

/// The rule of slot chain `i`, in nft syntax (without `add rule <table> <chain>`).
pub fn slot_rule(group: &AffinityGroup, i: usize) -> String {
    let (_, ip) = addr_type(group.family);
    let (addr, port) = group.slots[i];
    let target = match addr {
        std::net::IpAddr::V4(a) => format!("{a}:{port}"),
        std::net::IpAddr::V6(a) => format!("[{a}]:{port}"),
    };
    let protocol = group.protocol.as_str().to_ascii_lowercase();
    format!(
        "meta l4proto {protocol} update @{} {{ {ip} saddr }} dnat {ip} to {target}",
        slot_name(group.hash, i)
    )
}

/// The rules of the entry chain, in nft syntax.
pub fn entry_rules(group: &AffinityGroup) -> Vec<String> {
    let (_, ip) = addr_type(group.family);
    let n = group.slots.len();
    let mut rules: Vec<String> = (0..n)
        .map(|i| {
            format!("{ip} saddr @{} goto {}", slot_name(group.hash, i), slot_name(group.hash, i))
        })
        .collect();
    for i in 0..n.saturating_sub(1) {
        rules.push(format!("numgen random mod {} == 0 goto {}", n - i, slot_name(group.hash, i)));
    }
    if n > 0 {
        rules.push(format!("goto {}", slot_name(group.hash, n - 1)));
    }
    rules
}

/// A group's operation as nft commands.
pub fn op_text(op: &AffinityOp) -> String {
    let mut out = String::new();
    let (group, old) = match op {
        AffinityOp::Create(g) => (g, None),
        AffinityOp::Replace { old, new } => (new, Some(old)),
        AffinityOp::Remove(g) => {
            let fam = table_family(g.family);
            let _ = writeln!(out, "flush chain {fam} {TABLE} {}", affinity_chain(g.hash));
            let _ = writeln!(out, "delete chain {fam} {TABLE} {}", affinity_chain(g.hash));
            for i in 0..g.slots.len() {
                let _ = writeln!(out, "delete chain {fam} {TABLE} {}", slot_name(g.hash, i));
                let _ = writeln!(out, "delete set {fam} {TABLE} {}", slot_name(g.hash, i));
            }
            return out;
        }
    };
    let fam = table_family(group.family);
    let (addr, _) = addr_type(group.family);
    let entry = affinity_chain(group.hash);
    let old_n = old.map_or(0, |o| o.slots.len());
    let retimed = old.is_some_and(|o| o.timeout != group.timeout);
    if old.is_some() {
        let _ = writeln!(out, "flush chain {fam} {TABLE} {entry}");
        for i in 0..old_n {
            let name = slot_name(group.hash, i);
            let _ = writeln!(out, "flush chain {fam} {TABLE} {name}");
            if retimed || i >= group.slots.len() {
                let _ = writeln!(out, "delete set {fam} {TABLE} {name}");
            }
        }
    }
    let _ = writeln!(out, "table {fam} {TABLE} {{");
    let _ = writeln!(out, "\tchain {entry} {{ }}");
    for i in 0..group.slots.len() {
        let name = slot_name(group.hash, i);
        let _ = writeln!(
            out,
            "\tset {name} {{ type {addr}; flags dynamic,timeout; timeout {}s; }}",
            group.timeout
        );
        let _ = writeln!(out, "\tchain {name} {{ }}");
    }
    out.push_str("}\n");
    for i in 0..group.slots.len() {
        let name = slot_name(group.hash, i);
        // Slots read back after a restart have unknown endpoints (port 0): keep their clients.
        if !retimed
            && old.is_some_and(|o| i < old_n && o.slots[i].1 != 0 && o.slots[i] != group.slots[i])
        {
            let _ = writeln!(out, "flush set {fam} {TABLE} {name}");
        }
        let _ = writeln!(out, "add rule {fam} {TABLE} {name} {}", slot_rule(group, i));
    }
    for rule in entry_rules(group) {
        let _ = writeln!(out, "add rule {fam} {TABLE} {entry} {rule}");
    }
    for i in group.slots.len()..old_n {
        let _ = writeln!(out, "delete chain {fam} {TABLE} {}", slot_name(group.hash, i));
    }
    out
}
