//! [`Expr`]: the nf_tables expressions kpng uses, typed. Each encodes itself as a
//! `NFTA_LIST_ELEM` of a rule, decodes from the kernel's dump, and prints itself the way
//! `nft --debug=netlink` does, so rules can be checked against nft's own encoding.
//!
//! This file holds the types; `codec` writes and reads them as netlink attributes, and
//! `display` prints them.

use std::fmt;

use crate::attr;
use crate::nftables::{NFTA_DATA_VALUE, NFTA_DATA_VERDICT, NFTA_LIST_ELEM};

const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;

/// A register number: 0 is the verdict register, 1-4 the 128-bit registers, 8-23 the
/// 32-bit ones.
pub type Register = u32;

/// The verdict register.
pub const REG_VERDICT: Register = 0;
/// The first 128-bit register.
pub const REG_1: Register = 1;
/// The second 128-bit register.
pub const REG_2: Register = 2;
/// The first 32-bit register (`NFT_REG32_00`).
pub const REG32_00: Register = 8;

/// A verdict.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
    /// `return`.
    Return,
    /// `jump <chain>`.
    Jump(String),
    /// `goto <chain>`.
    Goto(String),
}

mod verdict_code {
    pub const DROP: i32 = 0;
    pub const ACCEPT: i32 = 1;
    pub const JUMP: i32 = -3;
    pub const GOTO: i32 = -4;
    pub const RETURN: i32 = -5;
}

const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

fn encode_verdict(buf: &mut Vec<u8>, code: i32, chain: Option<&str>) {
    attr::nested(buf, NFTA_DATA_VERDICT, |b| {
        attr::put_be32(b, NFTA_VERDICT_CODE, code as u32);
        if let Some(chain) = chain {
            attr::put_str(b, NFTA_VERDICT_CHAIN, chain);
        }
    });
}

impl Verdict {
    /// Writes the verdict as `NFTA_DATA_VERDICT` (inside an `nft_data` nest).
    pub fn encode(&self, buf: &mut Vec<u8>) {
        let (code, chain) = match self {
            Verdict::Accept => (verdict_code::ACCEPT, None),
            Verdict::Drop => (verdict_code::DROP, None),
            Verdict::Return => (verdict_code::RETURN, None),
            Verdict::Jump(c) => (verdict_code::JUMP, Some(c.as_str())),
            Verdict::Goto(c) => (verdict_code::GOTO, Some(c.as_str())),
        };
        encode_verdict(buf, code, chain);
    }

    /// Writes `goto <chain>` as [`Verdict::encode`] does, without owning the name.
    pub fn encode_goto(buf: &mut Vec<u8>, chain: &str) {
        encode_verdict(buf, verdict_code::GOTO, Some(chain));
    }

    /// Reads a verdict from the payload of `NFTA_DATA_VERDICT`.
    pub fn decode(payload: &[u8]) -> Option<Verdict> {
        let attrs = attr::parse(payload);
        let code = attr::be32(attr::find(&attrs, NFTA_VERDICT_CODE)?)? as i32;
        let chain = || attr::find(&attrs, NFTA_VERDICT_CHAIN).map(attr::string);
        Some(match code {
            verdict_code::ACCEPT => Verdict::Accept,
            verdict_code::DROP => Verdict::Drop,
            verdict_code::RETURN => Verdict::Return,
            verdict_code::JUMP => Verdict::Jump(chain()?),
            verdict_code::GOTO => Verdict::Goto(chain()?),
            _ => return None,
        })
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Accept => f.write_str("accept"),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Return => f.write_str("return"),
            Verdict::Jump(c) => write!(f, "jump -> {c}"),
            Verdict::Goto(c) => write!(f, "goto -> {c}"),
        }
    }
}

/// Where a payload expression reads from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadBase {
    /// The link-layer header.
    Link = 0,
    /// The network header.
    Network = 1,
    /// The transport header.
    Transport = 2,
}

/// A meta key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetaKey {
    /// The packet mark.
    Mark = 3,
    /// The input interface name.
    IifName = 6,
    /// The transport protocol number.
    L4Proto = 16,
}

/// A conntrack key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtKey {
    /// The connection state bits (new, established, ...).
    State = 0,
    /// The connection status bits (dnat, snat, ...).
    Status = 2,
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmpOp {
    /// `==`.
    Eq = 0,
    /// `!=`.
    Neq = 1,
}

/// The kind of address translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NatKind {
    /// Source NAT.
    Snat = 0,
    /// Destination NAT.
    Dnat = 1,
}

/// `NF_NAT_RANGE_MAP_IPS`.
pub const NAT_MAP_IPS: u32 = 0x1;
/// `NF_NAT_RANGE_PROTO_SPECIFIED`.
pub const NAT_PROTO_SPECIFIED: u32 = 0x2;
/// `NF_NAT_RANGE_PROTO_RANDOM_FULLY`.
pub const NAT_RANDOM_FULLY: u32 = 0x10;

/// `NFT_FIB_F_SADDR`: look up the source address.
pub const FIB_SADDR: u32 = 1;
/// `NFT_FIB_F_DADDR`: look up the destination address.
pub const FIB_DADDR: u32 = 2;
/// `NFT_FIB_RESULT_ADDRTYPE`: the address type (`RTN_LOCAL` is 2).
pub const FIB_RESULT_ADDRTYPE: u32 = 3;

/// `NFT_PAYLOAD_CSUM_NONE`: no checksum in this header (IPv6).
pub const CSUM_NONE: u32 = 0;
/// `NFT_PAYLOAD_CSUM_INET`: the internet checksum (IPv4, TCP, UDP).
pub const CSUM_INET: u32 = 1;
/// `NFT_PAYLOAD_CSUM_SCTP`: SCTP's CRC32c.
pub const CSUM_SCTP: u32 = 2;
/// `NFT_PAYLOAD_L4CSUM_PSEUDOHDR`: also update the transport checksum's pseudo-header.
pub const CSUM_L4_PSEUDOHDR: u32 = 1;

/// `NFT_REJECT_ICMP_UNREACH`.
pub const REJECT_ICMP_UNREACH: u32 = 0;
/// `NFT_REJECT_TCP_RST`.
pub const REJECT_TCP_RST: u32 = 1;

/// One expression of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    /// Load `len` bytes at `offset` of a header into `dreg`.
    Payload {
        /// The header.
        base: PayloadBase,
        /// Byte offset.
        offset: u32,
        /// Byte count.
        len: u32,
        /// Destination register.
        dreg: Register,
    },
    /// Write `len` bytes of `sreg` at `offset` of a header, updating a checksum.
    PayloadSet {
        /// The header.
        base: PayloadBase,
        /// Byte offset.
        offset: u32,
        /// Byte count.
        len: u32,
        /// Source register.
        sreg: Register,
        /// The checksum to update in place: `CSUM_INET`, `CSUM_SCTP` or `CSUM_NONE`.
        csum_type: u32,
        /// Where that checksum is, from the same header's start.
        csum_offset: u32,
        /// `CSUM_L4_PSEUDOHDR`: the transport checksum covers the written bytes too (an
        /// address in the pseudo-header).
        csum_flags: u32,
    },
    /// Load a meta key into `dreg`.
    Meta {
        /// The key.
        key: MetaKey,
        /// Destination register.
        dreg: Register,
    },
    /// Set a meta key from `sreg`.
    MetaSet {
        /// The key.
        key: MetaKey,
        /// Source register.
        sreg: Register,
    },
    /// `dreg = (sreg & mask) ^ xor` over `mask.len()` bytes.
    Bitwise {
        /// Source register.
        sreg: Register,
        /// Destination register.
        dreg: Register,
        /// The mask.
        mask: Vec<u8>,
        /// The value xored in.
        xor: Vec<u8>,
        /// `NFTA_BITWISE_OP`, when given (nft gives `NFT_BITWISE_BOOL`, 0, for a mark it
        /// sets; kpng gives none, which means the same).
        op: Option<u32>,
    },
    /// Converts `len` bytes of `size`-byte words between host and network order.
    Byteorder {
        /// Source register.
        sreg: Register,
        /// Destination register.
        dreg: Register,
        /// Host to network (true) or back.
        hton: bool,
        /// Total length.
        len: u32,
        /// Word size.
        size: u32,
    },
    /// Compare `sreg` with `data`; no match ends the rule.
    Cmp {
        /// Source register.
        sreg: Register,
        /// The comparison.
        op: CmpOp,
        /// The value.
        data: Vec<u8>,
    },
    /// Look `sreg` up in a set (no match ends the rule) or a map (the value goes to `dreg`).
    Lookup {
        /// The set's name.
        set: String,
        /// Source register of the key.
        sreg: Register,
        /// Destination register of a map's value (0 for a verdict map).
        dreg: Option<Register>,
        /// Match when the key is *not* in the set.
        invert: bool,
        /// The set's id when it is created in the same batch (nft names it both ways; kpng
        /// by name only).
        set_id: Option<u32>,
    },
    /// Load a constant into `dreg`.
    Immediate {
        /// Destination register.
        dreg: Register,
        /// The value.
        data: Vec<u8>,
    },
    /// A verdict.
    Verdict(Verdict),
    /// Load a conntrack key into `dreg`.
    Ct {
        /// The key.
        key: CtKey,
        /// Destination register.
        dreg: Register,
    },
    /// A routing lookup.
    Fib {
        /// `FIB_SADDR`, `FIB_DADDR`, ...
        flags: u32,
        /// What to return (`FIB_RESULT_ADDRTYPE`).
        result: u32,
        /// Destination register.
        dreg: Register,
    },
    /// A number: random (`random`) or a counter, modulo `modulus`.
    Numgen {
        /// Destination register.
        dreg: Register,
        /// The modulus.
        modulus: u32,
        /// Random (true) or incremental.
        random: bool,
    },
    /// Address translation to the address in `addr` and the port in `proto`.
    Nat {
        /// Source or destination NAT.
        kind: NatKind,
        /// `NFPROTO_IPV4` or `NFPROTO_IPV6`.
        family: u8,
        /// Register of the address.
        addr: Register,
        /// Register of the port.
        proto: Option<Register>,
        /// `NF_NAT_RANGE_*` flags (0: not sent).
        flags: u32,
    },
    /// Masquerade.
    Masq {
        /// `NF_NAT_RANGE_*` flags.
        flags: u32,
    },
    /// Reject with an ICMP error (or a TCP reset).
    Reject {
        /// `REJECT_ICMP_UNREACH`, `REJECT_TCP_RST`, ...
        kind: u32,
        /// The ICMP code.
        code: u8,
    },
    /// A hash of `len` bytes from `sreg` (jhash), or of the packet's addresses and ports
    /// the same in both directions (symhash, no `sreg`), modulo `modulus`.
    Hash {
        /// Source register of the hashed key; `None` for the symmetric hash.
        sreg: Option<Register>,
        /// Destination register.
        dreg: Register,
        /// Bytes hashed (jhash).
        len: u32,
        /// The modulus.
        modulus: u32,
        /// The seed (jhash).
        seed: u32,
    },
    /// Log the packet with a prefix, at syslog level `level`.
    Log {
        /// The prefix.
        prefix: String,
        /// The syslog level (4: warning).
        level: u32,
    },
    /// Go on only while packets stay under `rate` per `unit_seconds`, after a burst.
    Limit {
        /// Packets per unit.
        rate: u64,
        /// The unit, in seconds.
        unit_seconds: u64,
        /// Packets allowed at once beyond the rate.
        burst: u32,
    },
    /// Add or refresh `sreg_key` in a dynamic set (`update @set { key }`).
    DynsetUpdate {
        /// The set.
        set: String,
        /// Source register of the key.
        sreg_key: Register,
        /// The set's id when it is created in the same batch.
        set_id: Option<u32>,
    },
    /// Keep the packet out of connection tracking (`notrack`, before conntrack sees it).
    Notrack,
    /// Send an untracked copy of the packet, unchanged, to the neighbour whose address is
    /// in `sreg_addr` (`dup to <address>`).
    Dup {
        /// Source register of the neighbour's address.
        sreg_addr: Register,
    },
    /// Assign the table's conntrack helper object `name` to the connection (`ct helper set
    /// "<name>"`, an `objref` to a `ct helper` object).
    CtHelperSet {
        /// The object's name.
        name: String,
    },
}

impl Expr {
    /// The expression's name in the kernel.
    pub fn name(&self) -> &'static str {
        match self {
            Expr::Payload { .. } | Expr::PayloadSet { .. } => "payload",
            Expr::Meta { .. } | Expr::MetaSet { .. } => "meta",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Byteorder { .. } => "byteorder",
            Expr::Cmp { .. } => "cmp",
            Expr::Lookup { .. } => "lookup",
            Expr::Immediate { .. } | Expr::Verdict(_) => "immediate",
            Expr::Ct { .. } => "ct",
            Expr::Fib { .. } => "fib",
            Expr::Numgen { .. } => "numgen",
            Expr::Nat { .. } => "nat",
            Expr::Masq { .. } => "masq",
            Expr::Reject { .. } => "reject",
            Expr::DynsetUpdate { .. } => "dynset",
            Expr::Hash { .. } => "hash",
            Expr::Log { .. } => "log",
            Expr::Limit { .. } => "limit",
            Expr::CtHelperSet { .. } => "objref",
            Expr::Notrack => "notrack",
            Expr::Dup { .. } => "dup",
        }
    }

    /// The expression with what the kernel implies made implicit, for comparing what was
    /// sent with what the kernel reports: NAT flags the kernel sets from the registers given
    /// (an address range, a port range) are dropped.
    pub fn canonical(&self) -> Expr {
        match self {
            Expr::Nat { kind, family, addr, proto, flags } => {
                let mut implied = NAT_MAP_IPS;
                if proto.is_some() {
                    implied |= NAT_PROTO_SPECIFIED;
                }
                Expr::Nat {
                    kind: *kind,
                    family: *family,
                    addr: *addr,
                    proto: *proto,
                    flags: flags & !implied,
                }
            }
            other => other.clone(),
        }
    }
}

mod codec;
mod display;

pub use codec::{decode_all, encode_all};
pub use display::words;

#[cfg(test)]
mod tests;
