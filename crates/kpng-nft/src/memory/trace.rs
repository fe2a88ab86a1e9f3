//! Tracing a new connection's first packet through the rules an in-memory table holds.
//!
//! An interpreter of the nf_tables expressions kpng generates: registers, payload and meta
//! loads, set and map lookups against the stored elements, comparisons, verdicts (jump,
//! goto, return), NAT, masquerade and reject. It runs the table's base chains hook by hook
//! in priority order, as the kernel would for a new connection, and forks at
//! `numgen random` so that one trace yields every endpoint the packet can reach. A
//! destination rewritten in the packet (stateless DNAT) counts as the endpoint reached;
//! after `notrack`, NAT chains no longer see the packet and `ct state` is `untracked`.

use std::collections::BTreeSet;
use std::net::IpAddr;

use kpng_model::{Family, Protocol};
use kpng_netlink::nftables::expr::{
    CmpOp, CtKey, Expr, FIB_DADDR, MetaKey, NatKind, PayloadBase, Verdict,
};

use super::MemoryTables;
use crate::encode::{key_bytes, value_bytes};
use crate::objects::{Key, Value, affinity_chain};
use crate::rules::protocol_number;
use kpng_backend::slots::Target;

/// The first packet of a new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Transport protocol.
    pub protocol: Protocol,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// The interface it arrived on (empty when the node sends it).
    pub iif: String,
    /// The node itself sends it (output path; its source is a local address).
    pub from_node: bool,
    /// The node's own addresses (`fib daddr type local`; input versus forward).
    pub local_addresses: Vec<IpAddr>,
}

/// What happens to the connection.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Dropped.
    Dropped,
    /// Rejected (ICMP unreachable or TCP reset).
    Rejected,
    /// Let through, possibly translated.
    Passed {
        /// The endpoint it was DNATed to.
        dnat: Option<Target>,
        /// Its source is masqueraded.
        masquerade: bool,
    },
}

/// Every outcome the packet can have (several when a random choice is made).
pub fn trace(tables: &MemoryTables, packet: &Packet) -> BTreeSet<Outcome> {
    let family = Family::of(&packet.dst);
    let start = Path {
        regs: [0; 64],
        dst: packet.dst,
        dport: packet.dport,
        mark: 0,
        dnat: None,
        masquerade: false,
        untracked: false,
    };
    let vm = Vm { tables, family, packet };
    let first = if packet.from_node { OUTPUT } else { PREROUTING };
    let mut outcomes = BTreeSet::new();
    for (path, exit) in vm.hook(first, start) {
        if let Some(outcome) = exit.stop() {
            outcomes.insert(outcome);
            continue;
        }
        let local = packet.local_addresses.contains(&path.dst);
        let next: &[u32] = match (packet.from_node, local) {
            (true, _) => &[POSTROUTING],
            (false, true) => &[INPUT],
            (false, false) => &[FORWARD, POSTROUTING],
        };
        outcomes.extend(vm.hooks(next, path));
    }
    outcomes
}

const PREROUTING: u32 = 0;
const INPUT: u32 = 1;
const FORWARD: u32 = 2;
const OUTPUT: u32 = 3;
const POSTROUTING: u32 = 4;

#[derive(Debug, Clone)]
struct Path {
    regs: [u8; 64],
    dst: IpAddr,
    dport: u16,
    mark: u32,
    dnat: Option<Target>,
    masquerade: bool,
    /// `notrack` ran: conntrack, and so NAT, never see the packet.
    untracked: bool,
}

/// How a chain (or hook) ended for one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    /// Fell off the end, or `return`.
    Returned,
    /// `accept`, or a NAT statement.
    Accepted,
    /// `drop`.
    Dropped,
    /// `reject`.
    Rejected,
}

impl Exit {
    fn stop(self) -> Option<Outcome> {
        match self {
            Exit::Dropped => Some(Outcome::Dropped),
            Exit::Rejected => Some(Outcome::Rejected),
            _ => None,
        }
    }
}

/// How one rule ended for one path.
enum RuleEnd {
    NoMatch,
    Fallthrough,
    Verdict(Verdict),
    Exit(Exit),
}

struct Vm<'a> {
    tables: &'a MemoryTables,
    family: Family,
    packet: &'a Packet,
}

fn offset(reg: u32) -> usize {
    if reg < 8 { (reg as usize - 1) * 16 } else { (reg as usize - 8) * 4 }
}

impl Vm<'_> {
    fn hooks(&self, hooks: &[u32], path: Path) -> BTreeSet<Outcome> {
        let Some((first, rest)) = hooks.split_first() else {
            return BTreeSet::from([Outcome::Passed {
                dnat: path.dnat,
                masquerade: path.masquerade,
            }]);
        };
        let mut outcomes = BTreeSet::new();
        for (path, exit) in self.hook(*first, path) {
            match exit.stop() {
                Some(outcome) => {
                    outcomes.insert(outcome);
                }
                None => outcomes.extend(self.hooks(rest, path)),
            }
        }
        outcomes
    }

    /// Every base chain of `hook`, by priority; a drop or reject stops the packet.
    fn hook(&self, hook: u32, path: Path) -> Vec<(Path, Exit)> {
        let mut chains: Vec<(i32, &String, bool)> = self
            .tables
            .chains
            .iter()
            .filter_map(|((f, name), c)| {
                let h = c.hook.as_ref().filter(|h| *f == self.family && h.hook == hook)?;
                Some((h.priority, name, h.kind == "nat"))
            })
            .collect();
        chains.sort();
        let mut paths = vec![(path, Exit::Returned)];
        for (_, chain, nat) in chains {
            let mut next = Vec::new();
            for (path, exit) in paths {
                if exit.stop().is_some() || (nat && path.untracked) {
                    next.push((path, exit));
                } else {
                    next.extend(self.chain(chain, 0, path, 0));
                }
            }
            paths = next;
        }
        paths
    }

    fn chain(&self, name: &str, from: usize, path: Path, depth: usize) -> Vec<(Path, Exit)> {
        let Some(chain) = self.tables.chains.get(&(self.family, name.to_string())) else {
            return vec![(path, Exit::Returned)];
        };
        if depth > 64 {
            return vec![(path, Exit::Dropped)];
        }
        let Some(rule) = chain.rules.get(from) else { return vec![(path, Exit::Returned)] };
        let mut out = Vec::new();
        for (path, end) in self.exprs(&rule.exprs, path) {
            match end {
                RuleEnd::NoMatch | RuleEnd::Fallthrough => {
                    out.extend(self.chain(name, from + 1, path, depth))
                }
                RuleEnd::Exit(exit) => out.push((path, exit)),
                RuleEnd::Verdict(Verdict::Accept) => out.push((path, Exit::Accepted)),
                RuleEnd::Verdict(Verdict::Drop) => out.push((path, Exit::Dropped)),
                RuleEnd::Verdict(Verdict::Return) => out.push((path, Exit::Returned)),
                RuleEnd::Verdict(Verdict::Goto(target)) => {
                    out.extend(self.chain(&target, 0, path, depth + 1))
                }
                RuleEnd::Verdict(Verdict::Jump(target)) => {
                    for (path, exit) in self.chain(&target, 0, path, depth + 1) {
                        match exit {
                            Exit::Returned => out.extend(self.chain(name, from + 1, path, depth)),
                            other => out.push((path, other)),
                        }
                    }
                }
            }
        }
        out
    }

    fn exprs(&self, exprs: &[Expr], mut path: Path) -> Vec<(Path, RuleEnd)> {
        for (i, expr) in exprs.iter().enumerate() {
            // A number or a hash could be any value: every one is a path.
            if let Expr::Numgen { dreg, modulus, .. } | Expr::Hash { dreg, modulus, .. } = expr {
                let mut out = Vec::new();
                for value in 0..*modulus {
                    let mut fork = path.clone();
                    write(&mut fork, *dreg, &value.to_ne_bytes());
                    out.extend(self.exprs(&exprs[i + 1..], fork));
                }
                return out;
            }
            if let Some(end) = self.step(expr, &mut path) {
                return vec![(path, end)];
            }
        }
        vec![(path, RuleEnd::Fallthrough)]
    }

    /// One expression; `Some` ends the rule.
    fn step(&self, expr: &Expr, path: &mut Path) -> Option<RuleEnd> {
        match expr {
            Expr::Payload { base, offset: at, len, dreg } => {
                let bytes = self.header(*base, path);
                let at = *at as usize;
                write(path, *dreg, &bytes[at..at + *len as usize]);
            }
            Expr::Meta { key: MetaKey::L4Proto, dreg } => {
                write(path, *dreg, &[protocol_number(self.packet.protocol), 0, 0, 0])
            }
            Expr::Meta { key: MetaKey::Mark, dreg } => write(path, *dreg, &path.mark.to_ne_bytes()),
            Expr::Meta { key: MetaKey::IifName, dreg } => {
                let mut name = self.packet.iif.as_bytes().to_vec();
                name.resize(16, 0);
                write(path, *dreg, &name);
            }
            Expr::MetaSet { sreg, .. } => {
                path.mark = u32::from_ne_bytes(read(path, *sreg, 4).try_into().unwrap_or_default())
            }
            Expr::Bitwise { sreg, dreg, mask, xor, .. } => {
                let value: Vec<u8> = read(path, *sreg, mask.len())
                    .iter()
                    .zip(mask.iter().zip(xor))
                    .map(|(v, (m, x))| (v & m) ^ x)
                    .collect();
                write(path, *dreg, &value);
            }
            Expr::Byteorder { sreg, dreg, len, size, .. } => {
                let mut value = read(path, *sreg, *len as usize);
                for word in value.chunks_exact_mut((*size as usize).max(1)) {
                    word.reverse();
                }
                write(path, *dreg, &value);
            }
            Expr::Cmp { sreg, op, data } => {
                let equal = read(path, *sreg, data.len()) == *data;
                if equal != (*op == CmpOp::Eq) {
                    return Some(RuleEnd::NoMatch);
                }
            }
            Expr::Lookup { set, sreg, dreg, invert, .. } => {
                return self.lookup(set, *sreg, *dreg, *invert, path);
            }
            Expr::Immediate { dreg, data } => write(path, *dreg, data),
            Expr::Verdict(v) => return Some(RuleEnd::Verdict(v.clone())),
            Expr::Ct { key: CtKey::State, dreg } => {
                // `new`, or `untracked` (bit 6) once conntrack was told to look away.
                let state: u32 = if path.untracked { 0x40 } else { 0x8 };
                write(path, *dreg, &state.to_ne_bytes());
            }
            Expr::Notrack => path.untracked = true,
            Expr::Dup { sreg_addr } => {
                // The copy, untracked and unchanged, is what reaches the endpoint.
                path.dnat = Some((self.address(path, *sreg_addr), path.dport));
                path.untracked = true;
                return Some(RuleEnd::Exit(Exit::Accepted));
            }
            Expr::PayloadSet { base: PayloadBase::Network, offset, sreg, .. } => {
                // Only a destination rewrite matters to where the packet goes.
                let destination = match self.family {
                    Family::V4 => 16,
                    Family::V6 => 24,
                };
                if *offset == destination {
                    path.dst = self.address(path, *sreg);
                    path.dnat = Some((path.dst, path.dport));
                }
            }
            Expr::PayloadSet { base: PayloadBase::Transport, offset: 2, sreg, .. } => {
                let b = read(path, *sreg, 2);
                path.dport = u16::from_be_bytes([b[0], b[1]]);
                path.dnat = Some((path.dst, path.dport));
            }
            Expr::PayloadSet { .. } => {}
            Expr::Ct { key: CtKey::Status, dreg } => {
                let status: u32 = if path.dnat.is_some() { 0x20 } else { 0 };
                write(path, *dreg, &status.to_ne_bytes());
            }
            Expr::Fib { flags, dreg, .. } => {
                let local = match *flags {
                    FIB_DADDR => {
                        path.dst.is_loopback() || self.packet.local_addresses.contains(&path.dst)
                    }
                    _ => self.packet.from_node,
                };
                write(path, *dreg, &(if local { 2u32 } else { 1 }).to_ne_bytes());
            }
            Expr::Numgen { .. }
            | Expr::Hash { .. }
            | Expr::DynsetUpdate { .. }
            | Expr::Log { .. }
            | Expr::Limit { .. }
            | Expr::CtHelperSet { .. } => {}
            Expr::Nat { kind: NatKind::Dnat, addr, proto, .. } => {
                let ip = self.address(path, *addr);
                let port = proto.map_or(path.dport, |p| {
                    let b = read(path, p, 2);
                    u16::from_be_bytes([b[0], b[1]])
                });
                path.dnat = Some((ip, port));
                path.dst = ip;
                path.dport = port;
                return Some(RuleEnd::Exit(Exit::Accepted));
            }
            Expr::Nat { .. } => return Some(RuleEnd::Exit(Exit::Accepted)),
            Expr::Masq { .. } => {
                path.masquerade = true;
                return Some(RuleEnd::Exit(Exit::Accepted));
            }
            Expr::Reject { .. } => return Some(RuleEnd::Exit(Exit::Rejected)),
        }
        None
    }

    fn lookup(
        &self,
        set: &str,
        sreg: u32,
        dreg: Option<u32>,
        invert: bool,
        path: &mut Path,
    ) -> Option<RuleEnd> {
        let Some(set) = self.tables.sets.get(&(self.family, set.to_string())) else {
            return Some(RuleEnd::NoMatch);
        };
        let key = read(path, sreg, set.shape.key_len as usize);
        let found = set.elements.iter().find(|(k, _)| matches(k, &key)).map(|(_, v)| *v);
        match (invert, found, dreg) {
            (true, Some(_), _) | (false, None, _) => Some(RuleEnd::NoMatch),
            (true, None, _) | (false, Some(_), None) => None,
            (false, Some(Value::Affinity(hash)), Some(0)) => {
                Some(RuleEnd::Verdict(Verdict::Goto(affinity_chain(hash))))
            }
            (false, Some(value), Some(dreg)) => {
                write(path, dreg, value_bytes(&value).as_deref().unwrap_or_default());
                None
            }
        }
    }

    /// The address of the table's family held in register `reg`.
    fn address(&self, path: &Path, reg: u32) -> IpAddr {
        match self.family {
            Family::V4 => IpAddr::from(<[u8; 4]>::try_from(read(path, reg, 4)).unwrap_or_default()),
            Family::V6 => {
                IpAddr::from(<[u8; 16]>::try_from(read(path, reg, 16)).unwrap_or_default())
            }
        }
    }

    fn header(&self, base: PayloadBase, path: &Path) -> Vec<u8> {
        // Addresses of the table's family (a packet of the other family never reaches it).
        let len = if self.family == Family::V4 { 4 } else { 16 };
        let ip = |a: &IpAddr| {
            let mut bytes = crate::rules::ip_bytes(a);
            bytes.resize(len, 0);
            bytes
        };
        match (base, self.family) {
            (PayloadBase::Transport, _) => {
                [self.packet.sport.to_be_bytes(), path.dport.to_be_bytes()].concat()
            }
            (_, Family::V4) => [vec![0; 12], ip(&self.packet.src), ip(&path.dst)].concat(),
            (_, Family::V6) => [vec![0; 8], ip(&self.packet.src), ip(&path.dst)].concat(),
        }
    }
}

/// Whether a stored key matches register bytes (an interval key covers a range).
fn matches(key: &Key, bytes: &[u8]) -> bool {
    match key {
        Key::DestSource(..) => {
            let (start, end) = (key_bytes(key, false), key_bytes(key, true));
            *start <= *bytes && *bytes <= *end
        }
        _ => *key_bytes(key, false) == *bytes,
    }
}

fn write(path: &mut Path, reg: u32, data: &[u8]) {
    let at = offset(reg);
    let end = (at + data.len()).min(path.regs.len());
    path.regs[at..end].copy_from_slice(&data[..end - at]);
}

fn read(path: &Path, reg: u32, len: usize) -> Vec<u8> {
    let at = offset(reg);
    path.regs[at..(at + len).min(path.regs.len())].to_vec()
}
