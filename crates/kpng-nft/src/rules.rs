//! [`Rule`]: one rule as nft text and as nf_tables expressions, built together statement by
//! statement so the two can never disagree. The text is what `--dry-run` prints and error
//! reports quote; the expressions are what the kernel receives. The registers follow nft's
//! own allocation (fields of a concatenation packed at 4-byte offsets), so the kernel holds
//! exactly what `nft -f` of the text would give: the golden tests compare both with
//! `nft --debug=netlink`.
//!
//! Kept in one file on purpose: each builder method writes a statement's text and its
//! expressions together; splitting them would separate pairs that must agree.

use std::net::IpAddr;

use ipnet::IpNet;
use kpng_model::{Family, Protocol};
use kpng_netlink::nftables::expr::{
    CSUM_INET, CSUM_L4_PSEUDOHDR, CSUM_NONE, CSUM_SCTP, CmpOp, CtKey, Expr, FIB_DADDR,
    FIB_RESULT_ADDRTYPE, FIB_SADDR, MetaKey, NAT_PROTO_SPECIFIED, NAT_RANDOM_FULLY, NatKind,
    PayloadBase, REJECT_ICMP_UNREACH, Register, Verdict,
};

/// One rule: its nft text and its expressions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// The rule in nft syntax (what follows `add rule <table> <chain>`).
    pub text: String,
    /// The expressions the kernel receives.
    pub exprs: Vec<Expr>,
}

/// A field of a concatenated key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// The source address.
    Saddr,
    /// The destination address.
    Daddr,
    /// The transport protocol.
    L4Proto,
    /// The transport destination port.
    Dport,
    /// The transport source port.
    Sport,
    /// The link-layer source address.
    Smac,
    /// `numgen random mod n`.
    Random(u32),
}

/// A destination key: address, protocol, port.
pub const DEST: &[Field] = &[Field::Daddr, Field::L4Proto, Field::Dport];
/// A NodePort key: protocol, port.
pub const NODEPORT: &[Field] = &[Field::L4Proto, Field::Dport];

/// The netfilter number of a family (for NAT expressions).
fn nfproto(family: Family) -> u8 {
    match family {
        Family::V4 => 2,
        Family::V6 => 10,
    }
}

fn ip_keyword(family: Family) -> &'static str {
    match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

fn addr_len(family: Family) -> u32 {
    match family {
        Family::V4 => 4,
        Family::V6 => 16,
    }
}

fn addr_offset(family: Family, source: bool) -> u32 {
    match (family, source) {
        (Family::V4, true) => 12,
        (Family::V4, false) => 16,
        (Family::V6, true) => 8,
        (Family::V6, false) => 24,
    }
}

/// The register holding byte `offset` of a concatenation: the 128-bit registers where
/// one starts, the 32-bit ones elsewhere (as nft allocates them).
fn register_at(offset: u32) -> Register {
    if offset.is_multiple_of(16) { 1 + offset / 16 } else { 8 + offset / 4 }
}

/// The bytes of an address.
pub fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// The protocol number.
pub fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// A transport protocol's nft keyword, by number.
pub fn protocol_keyword(number: u8) -> String {
    match number {
        6 => "tcp".into(),
        17 => "udp".into(),
        132 => "sctp".into(),
        n => n.to_string(),
    }
}

/// Builds a [`Rule`] statement by statement.
#[derive(Debug, Clone)]
pub struct RuleBuilder {
    family: Family,
    text: Vec<String>,
    exprs: Vec<Expr>,
    /// The transport protocol the rule already matched: a port match or rewrite of that
    /// protocol needs no `meta l4proto` check of its own (nft adds one only when missing).
    l4proto: Option<u8>,
}

impl RuleBuilder {
    /// An empty rule for `family`'s table.
    pub fn new(family: Family) -> Self {
        RuleBuilder { family, text: Vec::new(), exprs: Vec::new(), l4proto: None }
    }

    fn say(mut self, text: impl Into<String>, exprs: impl IntoIterator<Item = Expr>) -> Self {
        self.text.push(text.into());
        self.exprs.extend(exprs);
        self
    }

    /// Loads a concatenation into registers from 1 on; returns its text and the loads.
    fn load(&self, fields: &[Field]) -> (String, Vec<Expr>) {
        self.load_at(fields, 0)
    }

    /// Loads a concatenation into registers from byte `start` of the register space.
    fn load_at(&self, fields: &[Field], start: u32) -> (String, Vec<Expr>) {
        let ip = ip_keyword(self.family);
        let mut offset = start;
        let mut text = Vec::new();
        let mut exprs = Vec::new();
        for field in fields {
            let dreg = register_at(offset);
            let len = match *field {
                Field::Saddr | Field::Daddr => {
                    let source = *field == Field::Saddr;
                    text.push(format!("{ip} {}", if source { "saddr" } else { "daddr" }));
                    let len = addr_len(self.family);
                    exprs.push(Expr::Payload {
                        base: PayloadBase::Network,
                        offset: addr_offset(self.family, source),
                        len,
                        dreg,
                    });
                    len
                }
                Field::L4Proto => {
                    text.push("meta l4proto".into());
                    exprs.push(Expr::Meta { key: MetaKey::L4Proto, dreg });
                    4
                }
                Field::Sport | Field::Dport => {
                    let source = *field == Field::Sport;
                    text.push(format!("th {}", if source { "sport" } else { "dport" }));
                    // The source port comes first in the transport header, then the
                    // destination port.
                    let offset = if source { 0 } else { 2 };
                    exprs.push(Expr::Payload {
                        base: PayloadBase::Transport,
                        offset,
                        len: 2,
                        dreg,
                    });
                    4
                }
                Field::Smac => {
                    text.push("ether saddr".into());
                    exprs.push(Expr::Payload { base: PayloadBase::Link, offset: 6, len: 6, dreg });
                    8
                }
                Field::Random(n) => {
                    text.push(format!("numgen random mod {n}"));
                    exprs.push(Expr::Numgen { dreg, modulus: n, random: true });
                    4
                }
            };
            offset += len;
        }
        (text.join(" . "), exprs)
    }

    /// `<fields> @set` (or `!= @set`): the rule goes on only when the key is (not) a member.
    pub fn member(self, fields: &[Field], set: &str, invert: bool) -> Self {
        let (key, mut exprs) = self.load(fields);
        exprs.push(Expr::Lookup { set: set.into(), sreg: 1, dreg: None, invert, set_id: None });
        let op = if invert { "!= " } else { "" };
        self.say(format!("{key} {op}@{set}"), exprs)
    }

    /// `<dest> . <ip> saddr != @set`: the destination and source are not in an interval set
    /// of allowed sources (nft converts the protocol to network order for intervals).
    pub fn dest_source_not_in(self, set: &str) -> Self {
        let (key, mut exprs) =
            self.load(&[Field::Daddr, Field::L4Proto, Field::Dport, Field::Saddr]);
        let proto = register_at(addr_len(self.family));
        exprs.insert(2, Expr::Byteorder { sreg: proto, dreg: proto, hton: true, len: 1, size: 2 });
        exprs.push(Expr::Lookup {
            set: set.into(),
            sreg: 1,
            dreg: None,
            invert: true,
            set_id: None,
        });
        self.say(format!("{key} != @{set}"), exprs)
    }

    /// The packet's destination is a NodePort address: one of `@nodeport_addrs`, or with
    /// `all_local` any local address but loopback.
    pub fn on_nodeport_address(self, all_local: bool) -> Self {
        if !all_local {
            return self.member(&[Field::Daddr], "nodeport_addrs", false);
        }
        let family = self.family;
        let fib = Expr::Fib { flags: FIB_DADDR, result: FIB_RESULT_ADDRTYPE, dreg: 1 };
        let rtn_local = Expr::Cmp { sreg: 1, op: CmpOp::Eq, data: 2u32.to_ne_bytes().to_vec() };
        let loopback: IpNet = match family {
            Family::V4 => "127.0.0.0/8".parse().expect("a literal network"),
            Family::V6 => "::1/128".parse().expect("a literal network"),
        };
        self.say("fib daddr type local", [fib, rtn_local]).address_in(false, loopback, true)
    }

    /// `ip saddr <net>` / `ip daddr != <net>`: a prefix match, loading only the bytes the
    /// prefix covers as nft does.
    pub fn address_in(self, source: bool, net: IpNet, negate: bool) -> Self {
        let bits = u32::from(net.prefix_len());
        // Like nft: a byte-aligned prefix loads the bytes it covers, another loads the
        // whole address and masks it.
        let bytes = if bits.is_multiple_of(8) { bits / 8 } else { addr_len(self.family) };
        let ip = ip_keyword(self.family);
        let field = if source { "saddr" } else { "daddr" };
        let op = if negate { "!= " } else { "" };
        let shown = if net.prefix_len() == net.max_prefix_len() {
            net.addr().to_string()
        } else {
            net.to_string()
        };
        let text = format!("{ip} {field} {op}{shown}");
        let offset = addr_offset(self.family, source);
        let mut exprs =
            vec![Expr::Payload { base: PayloadBase::Network, offset, len: bytes, dreg: 1 }];
        let network = ip_bytes(&net.network())[..bytes as usize].to_vec();
        if !bits.is_multiple_of(8) {
            let mask = ip_bytes(&net.netmask())[..bytes as usize].to_vec();
            let xor = vec![0; bytes as usize];
            exprs.push(Expr::Bitwise { sreg: 1, dreg: 1, mask, xor, op: Some(0) });
        }
        let op = if negate { CmpOp::Neq } else { CmpOp::Eq };
        exprs.push(Expr::Cmp { sreg: 1, op, data: network });
        self.say(text, exprs)
    }

    /// `iifname "<name>"` (or `"<prefix>*"` when `prefix`, negated with `negate`).
    pub fn input_interface(self, name: &str, prefix: bool, negate: bool) -> Self {
        let data = if prefix {
            name.as_bytes().to_vec()
        } else {
            let mut bytes = name.as_bytes().to_vec();
            bytes.resize(16, 0);
            bytes
        };
        let op = if negate { CmpOp::Neq } else { CmpOp::Eq };
        let text = format!(
            "iifname {}\"{name}{}\"",
            if negate { "!= " } else { "" },
            if prefix { "*" } else { "" }
        );
        let load = Expr::Meta { key: MetaKey::IifName, dreg: 1 };
        self.say(text, [load, Expr::Cmp { sreg: 1, op, data }])
    }

    /// `ct state new`.
    pub fn ct_state_new(self) -> Self {
        self.ct_bit(CtKey::State, 0x8, "ct state new")
    }

    /// `ct status dnat`.
    pub fn ct_status_dnat(self) -> Self {
        self.ct_bit(CtKey::Status, 0x20, "ct status dnat")
    }

    fn ct_bit(self, key: CtKey, bit: u32, text: &str) -> Self {
        let exprs = [
            Expr::Ct { key, dreg: 1 },
            Expr::Bitwise {
                sreg: 1,
                dreg: 1,
                mask: bit.to_ne_bytes().to_vec(),
                xor: 0u32.to_ne_bytes().to_vec(),
                op: Some(0),
            },
            Expr::Cmp { sreg: 1, op: CmpOp::Neq, data: 0u32.to_ne_bytes().to_vec() },
        ];
        self.say(text, exprs)
    }

    fn mark(self, text: String, mask: u32, xor: u32, then: Option<Expr>) -> Self {
        let mut exprs = vec![
            Expr::Meta { key: MetaKey::Mark, dreg: 1 },
            Expr::Bitwise {
                sreg: 1,
                dreg: 1,
                mask: mask.to_ne_bytes().to_vec(),
                xor: xor.to_ne_bytes().to_vec(),
                op: Some(0),
            },
        ];
        exprs.extend(then);
        self.say(text, exprs)
    }

    /// `meta mark set meta mark | <mark>`.
    pub fn mark_set(self, mark: u32) -> Self {
        let set = Expr::MetaSet { key: MetaKey::Mark, sreg: 1 };
        self.mark(format!("meta mark set meta mark | {mark:#x}"), !mark, mark, Some(set))
    }

    /// `meta mark set meta mark ^ <mark>`.
    pub fn mark_toggle(self, mark: u32) -> Self {
        let set = Expr::MetaSet { key: MetaKey::Mark, sreg: 1 };
        self.mark(format!("meta mark set meta mark ^ {mark:#x}"), u32::MAX, mark, Some(set))
    }

    /// `meta mark & <mark> == 0`.
    pub fn mark_clear(self, mark: u32) -> Self {
        let zero = Expr::Cmp { sreg: 1, op: CmpOp::Eq, data: 0u32.to_ne_bytes().to_vec() };
        self.mark(format!("meta mark & {mark:#x} == 0"), mark, 0, Some(zero))
    }

    /// `fib saddr type local`: the packet comes from the node itself.
    pub fn from_the_node(self) -> Self {
        let fib = Expr::Fib { flags: FIB_SADDR, result: FIB_RESULT_ADDRTYPE, dreg: 1 };
        let local = Expr::Cmp { sreg: 1, op: CmpOp::Eq, data: 2u32.to_ne_bytes().to_vec() };
        self.say("fib saddr type local", [fib, local])
    }

    /// `numgen random mod <n> == 0`.
    pub fn one_in(self, n: u32) -> Self {
        let exprs = [
            Expr::Numgen { dreg: 1, modulus: n, random: true },
            Expr::Cmp { sreg: 1, op: CmpOp::Eq, data: 0u32.to_ne_bytes().to_vec() },
        ];
        self.say(format!("numgen random mod {n} == 0"), exprs)
    }

    /// `numgen inc mod <n> == 0`: true for one packet in `n`, in turn (the rule's own
    /// counter counts the packets that reach it).
    pub fn one_in_turn(self, n: u32) -> Self {
        let exprs = [
            Expr::Numgen { dreg: 1, modulus: n, random: false },
            Expr::Cmp { sreg: 1, op: CmpOp::Eq, data: 0u32.to_ne_bytes().to_vec() },
        ];
        self.say(format!("numgen inc mod {n} == 0"), exprs)
    }

    /// `jhash <fields> mod <n> seed 0x0 == <value>` (or `symhash mod <n> == <value>` without
    /// fields): the packet's hash picks `value`.
    pub fn hash_is(self, fields: Option<&[Field]>, n: u32, value: u32) -> Self {
        let (text, mut exprs) = match fields {
            // The hashed key is loaded after the result's register, as nft does.
            Some(fields) => {
                let (key, mut exprs) = self.load_at(fields, 16);
                let len = fields.iter().map(|f| self.field_len(*f)).sum();
                exprs.push(Expr::Hash { sreg: Some(2), dreg: 1, len, modulus: n, seed: 0 });
                (format!("jhash {key} mod {n} seed 0x0"), exprs)
            }
            None => {
                let hash = Expr::Hash { sreg: None, dreg: 1, len: 0, modulus: n, seed: 0 };
                (format!("symhash mod {n}"), vec![hash])
            }
        };
        exprs.push(Expr::Cmp { sreg: 1, op: CmpOp::Eq, data: value.to_ne_bytes().to_vec() });
        self.say(format!("{text} == {value}"), exprs)
    }

    /// The bytes a field takes in a concatenation.
    fn field_len(&self, field: Field) -> u32 {
        match field {
            Field::Saddr | Field::Daddr => addr_len(self.family),
            Field::Smac => 8,
            _ => 4,
        }
    }

    /// `fib saddr type != local`: the packet comes from elsewhere.
    pub fn not_from_the_node(self) -> Self {
        let fib = Expr::Fib { flags: FIB_SADDR, result: FIB_RESULT_ADDRTYPE, dreg: 1 };
        let local = Expr::Cmp { sreg: 1, op: CmpOp::Neq, data: 2u32.to_ne_bytes().to_vec() };
        self.say("fib saddr type != local", [fib, local])
    }

    /// `limit rate 10/second burst 5 packets log prefix "<prefix>" level warn`.
    pub fn log_limited(self, prefix: &str) -> Self {
        let exprs = [
            Expr::Limit { rate: 10, unit_seconds: 1, burst: 5 },
            Expr::Log { prefix: prefix.to_string(), level: 4 },
        ];
        let text = format!("limit rate 10/second burst 5 packets log prefix {prefix:?} level warn");
        self.say(text, exprs)
    }

    /// `meta mark set meta mark & <!mark>`: the packet is not flagged for masquerading.
    pub fn mark_unset(self, mark: u32) -> Self {
        let set = Expr::MetaSet { key: MetaKey::Mark, sreg: 1 };
        self.mark(format!("meta mark set meta mark & {:#x}", !mark), !mark, 0, Some(set))
    }

    /// `ct helper set "<name>"`: the connection gets the table's conntrack helper object
    /// `name`.
    pub fn ct_helper(self, name: &str) -> Self {
        let exprs = [Expr::CtHelperSet { name: name.to_string() }];
        self.say(format!("ct helper set {name:?}"), exprs)
    }

    /// `update @<set> { <fields> }`: remember the client's key in a dynamic set.
    pub fn remember(self, fields: &[Field], set: &str) -> Self {
        let (key, mut exprs) = self.load(fields);
        exprs.push(Expr::DynsetUpdate { set: set.into(), sreg_key: 1, set_id: None });
        self.say(format!("update @{set} {{ {key} }}"), exprs)
    }

    /// `meta l4proto <protocol>`.
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.l4proto = Some(protocol_number(protocol));
        let exprs = [
            Expr::Meta { key: MetaKey::L4Proto, dreg: 1 },
            Expr::Cmp { sreg: 1, op: CmpOp::Eq, data: vec![protocol_number(protocol)] },
        ];
        self.say(format!("meta l4proto {}", protocol.as_str().to_ascii_lowercase()), exprs)
    }

    /// The `meta l4proto` check a port of `protocol` depends on, unless the rule made it.
    fn depend_on(&mut self, protocol: Protocol) -> Vec<Expr> {
        let number = protocol_number(protocol);
        if self.l4proto == Some(number) {
            return Vec::new();
        }
        self.l4proto = Some(number);
        vec![
            Expr::Meta { key: MetaKey::L4Proto, dreg: 1 },
            Expr::Cmp { sreg: 1, op: CmpOp::Eq, data: vec![number] },
        ]
    }

    /// `<protocol> sport|dport <port>`.
    pub fn port_is(mut self, protocol: Protocol, source: bool, port: u16) -> Self {
        let mut exprs = self.depend_on(protocol);
        let offset = if source { 0 } else { 2 };
        exprs.push(Expr::Payload { base: PayloadBase::Transport, offset, len: 2, dreg: 1 });
        exprs.push(Expr::Cmp { sreg: 1, op: CmpOp::Eq, data: port.to_be_bytes().to_vec() });
        let keyword = protocol_keyword(protocol_number(protocol));
        let field = if source { "sport" } else { "dport" };
        self.say(format!("{keyword} {field} {port}"), exprs)
    }

    /// `<protocol> sport|dport set <port>`: rewrites a port in the packet, updating the
    /// transport checksum (SCTP's CRC32c for SCTP).
    pub fn port_set(mut self, protocol: Protocol, source: bool, port: u16) -> Self {
        let mut exprs = self.depend_on(protocol);
        let (csum_type, csum_offset) = match protocol {
            Protocol::Tcp => (CSUM_INET, 16),
            Protocol::Udp => (CSUM_INET, 6),
            Protocol::Sctp => (CSUM_SCTP, 8),
        };
        exprs.push(Expr::Immediate { dreg: 1, data: port.to_be_bytes().to_vec() });
        exprs.push(Expr::PayloadSet {
            base: PayloadBase::Transport,
            offset: if source { 0 } else { 2 },
            len: 2,
            sreg: 1,
            csum_type,
            csum_offset,
            csum_flags: 0,
        });
        let keyword = protocol_keyword(protocol_number(protocol));
        let field = if source { "sport" } else { "dport" };
        self.say(format!("{keyword} {field} set {port}"), exprs)
    }

    /// `<ip> saddr|daddr set <address>`: rewrites an address in the packet, updating the
    /// IPv4 header checksum and the transport checksum's pseudo-header.
    pub fn address_set(self, source: bool, ip: IpAddr) -> Self {
        let family = self.family;
        let (csum_type, csum_offset) = match family {
            Family::V4 => (CSUM_INET, 10),
            Family::V6 => (CSUM_NONE, 0),
        };
        let exprs = [
            Expr::Immediate { dreg: 1, data: ip_bytes(&ip) },
            Expr::PayloadSet {
                base: PayloadBase::Network,
                offset: addr_offset(family, source),
                len: addr_len(family),
                sreg: 1,
                csum_type,
                csum_offset,
                csum_flags: CSUM_L4_PSEUDOHDR,
            },
        ];
        let field = if source { "saddr" } else { "daddr" };
        self.say(format!("{} {field} set {ip}", ip_keyword(family)), exprs)
    }

    /// `dup to <address>`: an untracked copy of the packet, unchanged, goes to the
    /// neighbour at `address` (its link-layer address; the packet's own destination stays).
    pub fn dup_to(self, ip: IpAddr) -> Self {
        let exprs = [Expr::Immediate { dreg: 1, data: ip_bytes(&ip) }, Expr::Dup { sreg_addr: 1 }];
        self.say(format!("dup to {ip}"), exprs)
    }

    /// `ct state != untracked`: not a packet kept out of conntrack, such as a copy `dup`
    /// sends (which passes the output hook again).
    pub fn tracked(self) -> Self {
        let exprs = [
            Expr::Ct { key: CtKey::State, dreg: 1 },
            Expr::Cmp { sreg: 1, op: CmpOp::Neq, data: 0x40u32.to_ne_bytes().to_vec() },
        ];
        self.say("ct state != untracked", exprs)
    }

    /// `notrack`: connection tracking never sees the packet.
    pub fn notrack(self) -> Self {
        self.say("notrack", [Expr::Notrack])
    }

    /// `update @<set> { ip saddr }`: remember the client in a dynamic set.
    pub fn remember_source(self, set: &str) -> Self {
        let family = self.family;
        let ip = ip_keyword(family);
        let exprs = [
            Expr::Payload {
                base: PayloadBase::Network,
                offset: addr_offset(family, true),
                len: addr_len(family),
                dreg: 1,
            },
            Expr::DynsetUpdate { set: set.into(), sreg_key: 1, set_id: None },
        ];
        self.say(format!("update @{set} {{ {ip} saddr }}"), exprs)
    }

    /// Ends with a verdict.
    pub fn verdict(self, verdict: Verdict) -> Rule {
        let text = match &verdict {
            Verdict::Accept => "accept".to_string(),
            Verdict::Drop => "drop".to_string(),
            Verdict::Return => "return".to_string(),
            Verdict::Jump(chain) => format!("jump {chain}"),
            Verdict::Goto(chain) => format!("goto {chain}"),
        };
        self.say(text, [Expr::Verdict(verdict)]).build()
    }

    /// Ends with `goto <chain>`.
    pub fn goto(self, chain: impl Into<String>) -> Rule {
        self.verdict(Verdict::Goto(chain.into()))
    }

    /// Ends with `jump <chain>`.
    pub fn jump(self, chain: impl Into<String>) -> Rule {
        self.verdict(Verdict::Jump(chain.into()))
    }

    /// Ends with `<fields> vmap @map`.
    pub fn vmap(self, fields: &[Field], map: &str) -> Rule {
        let (key, mut exprs) = self.load(fields);
        exprs.push(Expr::Lookup {
            set: map.into(),
            sreg: 1,
            dreg: Some(0),
            invert: false,
            set_id: None,
        });
        self.say(format!("{key} vmap @{map}"), exprs).build()
    }

    /// Ends with `masquerade fully-random`.
    pub fn masquerade(self) -> Rule {
        self.say("masquerade fully-random", [Expr::Masq { flags: NAT_RANDOM_FULLY }]).build()
    }

    /// Ends with `reject` (ICMP port unreachable).
    pub fn reject(self) -> Rule {
        let code = match self.family {
            Family::V4 => 3,
            Family::V6 => 4,
        };
        self.say("reject", [Expr::Reject { kind: REJECT_ICMP_UNREACH, code }]).build()
    }

    /// Ends with `dnat <ip> to <fields> map @map`: the map gives address and port.
    pub fn dnat_map(self, fields: &[Field], map: &str) -> Rule {
        let family = self.family;
        let (key, mut exprs) = self.load(fields);
        exprs.push(Expr::Lookup {
            set: map.into(),
            sreg: 1,
            dreg: Some(1),
            invert: false,
            set_id: None,
        });
        exprs.push(Expr::Nat {
            kind: NatKind::Dnat,
            family: nfproto(family),
            addr: 1,
            proto: Some(register_at(addr_len(family))),
            flags: 0,
        });
        let ip = ip_keyword(family);
        self.say(format!("dnat {ip} to {key} map @{map}"), exprs).build()
    }

    /// Ends with `dnat <ip> to <address>:<port>`.
    pub fn dnat_to(self, ip: IpAddr, port: u16) -> Rule {
        let family = self.family;
        let target = match ip {
            IpAddr::V4(a) => format!("{a}:{port}"),
            IpAddr::V6(a) => format!("[{a}]:{port}"),
        };
        let exprs = [
            Expr::Immediate { dreg: 1, data: ip_bytes(&ip) },
            Expr::Immediate { dreg: 2, data: port.to_be_bytes().to_vec() },
            Expr::Nat {
                kind: NatKind::Dnat,
                family: nfproto(family),
                addr: 1,
                proto: Some(2),
                flags: NAT_PROTO_SPECIFIED,
            },
        ];
        self.say(format!("dnat {} to {target}", ip_keyword(family)), exprs).build()
    }

    /// Ends without a verdict: evaluation goes on with the next rule.
    pub fn end(self) -> Rule {
        self.build()
    }

    fn build(self) -> Rule {
        // Rules are kept for as long as their chain (the skeleton's thousands for the
        // process's lifetime): without the room their expressions grew into.
        let mut exprs = self.exprs;
        exprs.shrink_to_fit();
        Rule { text: self.text.join(" "), exprs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_follow_nfts_allocation() {
        let rule = RuleBuilder::new(Family::V6)
            .member(&[Field::Daddr, Field::L4Proto, Field::Dport, Field::Random(3)], "x", false)
            .verdict(Verdict::Accept);
        let dregs: Vec<String> = rule.exprs.iter().map(ToString::to_string).collect();
        assert_eq!(
            dregs[..4],
            [
                "payload load 16b @ network header + 24 => reg 1",
                "meta load l4proto => reg 2",
                "payload load 2b @ transport header + 2 => reg 13",
                "numgen reg 14 = random mod 3",
            ]
        );
        assert_eq!(
            rule.text,
            "ip6 daddr . meta l4proto . th dport . numgen random mod 3 @x accept"
        );
    }

    #[test]
    fn rewrites_are_what_nft_makes_of_their_text() {
        let shown =
            |rule: &Rule| -> Vec<String> { rule.exprs.iter().map(ToString::to_string).collect() };
        // nft --debug=netlink of `ip daddr set 10.0.0.5 udp dport set 8080`.
        let request = RuleBuilder::new(Family::V4)
            .address_set(false, "10.0.0.5".parse().unwrap())
            .port_set(Protocol::Udp, false, 8080)
            .end();
        assert_eq!(request.text, "ip daddr set 10.0.0.5 udp dport set 8080");
        assert_eq!(
            shown(&request),
            [
                "immediate reg 1 0x0500000a",
                "payload write reg 1 => 4b @ network header + 16 csum_type 1 csum_off 10 csum_flags 0x1",
                "meta load l4proto => reg 1",
                "cmp eq reg 1 0x00000011",
                "immediate reg 1 0x0000901f",
                "payload write reg 1 => 2b @ transport header + 2 csum_type 1 csum_off 6 csum_flags 0x0",
            ]
        );
        // ... of `ip saddr 10.0.0.5 tcp sport 8080 notrack ip saddr set 10.96.0.1 tcp sport
        // set 80`: the port rewrite relies on the match's protocol check.
        let reply = RuleBuilder::new(Family::V4)
            .address_in(true, "10.0.0.5/32".parse().unwrap(), false)
            .port_is(Protocol::Tcp, true, 8080)
            .notrack()
            .address_set(true, "10.96.0.1".parse().unwrap())
            .port_set(Protocol::Tcp, true, 80)
            .end();
        assert_eq!(
            reply.text,
            "ip saddr 10.0.0.5 tcp sport 8080 notrack ip saddr set 10.96.0.1 tcp sport set 80"
        );
        assert_eq!(
            shown(&reply),
            [
                "payload load 4b @ network header + 12 => reg 1",
                "cmp eq reg 1 0x0500000a",
                "meta load l4proto => reg 1",
                "cmp eq reg 1 0x00000006",
                "payload load 2b @ transport header + 0 => reg 1",
                "cmp eq reg 1 0x0000901f",
                "notrack",
                "immediate reg 1 0x0100600a",
                "payload write reg 1 => 4b @ network header + 12 csum_type 1 csum_off 10 csum_flags 0x1",
                "immediate reg 1 0x00005000",
                "payload write reg 1 => 2b @ transport header + 0 csum_type 1 csum_off 16 csum_flags 0x0",
            ]
        );
        // ... of `ip6 daddr set fd00::5 sctp dport set 8080`: no IPv6 header checksum, and
        // SCTP's own.
        let v6 = RuleBuilder::new(Family::V6)
            .address_set(false, "fd00::5".parse().unwrap())
            .port_set(Protocol::Sctp, false, 8080)
            .end();
        assert_eq!(
            shown(&v6)[1],
            "payload write reg 1 => 16b @ network header + 24 csum_type 0 csum_off 0 csum_flags 0x1"
        );
        assert_eq!(
            shown(&v6)[5],
            "payload write reg 1 => 2b @ transport header + 2 csum_type 2 csum_off 8 csum_flags 0x0"
        );
    }

    #[test]
    fn direct_return_is_what_nft_makes_of_its_text() {
        // nft --debug=netlink of `ct state != untracked ... dup to 192.168.1.3 drop`.
        let rule = RuleBuilder::new(Family::V4)
            .tracked()
            .dup_to("192.168.1.3".parse().unwrap())
            .verdict(Verdict::Drop);
        assert_eq!(rule.text, "ct state != untracked dup to 192.168.1.3 drop");
        let shown: Vec<String> = rule.exprs.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "ct load state => reg 1",
                "cmp neq reg 1 0x00000040",
                "immediate reg 1 0x0301a8c0",
                "dup sreg_addr 1",
                "immediate reg 0 drop",
            ]
        );
    }

    #[test]
    fn aligned_prefixes_load_only_the_bytes_they_cover() {
        let rule = RuleBuilder::new(Family::V4)
            .address_in(true, "10.244.0.0/16".parse().unwrap(), false)
            .verdict(Verdict::Return);
        assert_eq!(rule.text, "ip saddr 10.244.0.0/16 return");
        assert_eq!(rule.exprs[0].to_string(), "payload load 2b @ network header + 12 => reg 1");
        let rule = RuleBuilder::new(Family::V4)
            .address_in(false, "10.96.0.0/12".parse().unwrap(), false)
            .verdict(Verdict::Drop);
        assert!(rule.exprs[1].to_string().starts_with("bitwise"), "{:?}", rule.exprs);
    }
}
