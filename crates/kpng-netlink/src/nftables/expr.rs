//! [`Expr`]: the nf_tables expressions kpng uses, typed. Each encodes itself as a
//! `NFTA_LIST_ELEM` of a rule, decodes from the kernel's dump, and prints itself the way
//! `nft --debug=netlink` does, so rules can be checked against nft's own encoding.

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

impl Verdict {
    /// Writes the verdict as `NFTA_DATA_VERDICT` (inside an `nft_data` nest).
    pub fn encode(&self, buf: &mut Vec<u8>) {
        attr::nested(buf, NFTA_DATA_VERDICT, |b| {
            let (code, chain) = match self {
                Verdict::Accept => (verdict_code::ACCEPT, None),
                Verdict::Drop => (verdict_code::DROP, None),
                Verdict::Return => (verdict_code::RETURN, None),
                Verdict::Jump(c) => (verdict_code::JUMP, Some(c)),
                Verdict::Goto(c) => (verdict_code::GOTO, Some(c)),
            };
            attr::put_be32(b, NFTA_VERDICT_CODE, code as u32);
            if let Some(chain) = chain {
                attr::put_str(b, NFTA_VERDICT_CHAIN, chain);
            }
        });
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
    /// Add or refresh `sreg_key` in a dynamic set (`update @set { key }`).
    DynsetUpdate {
        /// The set.
        set: String,
        /// Source register of the key.
        sreg_key: Register,
    },
}

mod attrs {
    pub const PAYLOAD_DREG: u16 = 1;
    pub const PAYLOAD_BASE: u16 = 2;
    pub const PAYLOAD_OFFSET: u16 = 3;
    pub const PAYLOAD_LEN: u16 = 4;
    pub const META_DREG: u16 = 1;
    pub const META_KEY: u16 = 2;
    pub const META_SREG: u16 = 3;
    pub const BITWISE_SREG: u16 = 1;
    pub const BITWISE_DREG: u16 = 2;
    pub const BITWISE_LEN: u16 = 3;
    pub const BITWISE_MASK: u16 = 4;
    pub const BITWISE_XOR: u16 = 5;
    pub const BYTEORDER_SREG: u16 = 1;
    pub const BYTEORDER_DREG: u16 = 2;
    pub const BYTEORDER_OP: u16 = 3;
    pub const BYTEORDER_LEN: u16 = 4;
    pub const BYTEORDER_SIZE: u16 = 5;
    pub const CMP_SREG: u16 = 1;
    pub const CMP_OP: u16 = 2;
    pub const CMP_DATA: u16 = 3;
    pub const LOOKUP_SET: u16 = 1;
    pub const LOOKUP_SREG: u16 = 2;
    pub const LOOKUP_DREG: u16 = 3;
    pub const LOOKUP_FLAGS: u16 = 5;
    pub const LOOKUP_F_INV: u32 = 1;
    pub const IMMEDIATE_DREG: u16 = 1;
    pub const IMMEDIATE_DATA: u16 = 2;
    pub const CT_DREG: u16 = 1;
    pub const CT_KEY: u16 = 2;
    pub const FIB_DREG: u16 = 1;
    pub const FIB_RESULT: u16 = 2;
    pub const FIB_FLAGS: u16 = 3;
    pub const NUMGEN_DREG: u16 = 1;
    pub const NUMGEN_MODULUS: u16 = 2;
    pub const NUMGEN_TYPE: u16 = 3;
    pub const NAT_TYPE: u16 = 1;
    pub const NAT_FAMILY: u16 = 2;
    pub const NAT_REG_ADDR_MIN: u16 = 3;
    pub const NAT_REG_PROTO_MIN: u16 = 5;
    pub const NAT_FLAGS: u16 = 7;
    pub const MASQ_FLAGS: u16 = 1;
    pub const REJECT_TYPE: u16 = 1;
    pub const REJECT_ICMP_CODE: u16 = 2;
    pub const DYNSET_SET_NAME: u16 = 1;
    pub const DYNSET_OP: u16 = 3;
    pub const DYNSET_SREG_KEY: u16 = 4;
    pub const DYNSET_OP_UPDATE: u32 = 1;
}

impl Expr {
    /// The expression's name in the kernel.
    pub fn name(&self) -> &'static str {
        match self {
            Expr::Payload { .. } => "payload",
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

    /// Writes the expression as one `NFTA_LIST_ELEM` of `NFTA_RULE_EXPRESSIONS`.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        use attr::{put_be32, put_str};
        use attrs::*;
        attr::nested(buf, NFTA_LIST_ELEM, |b| {
            put_str(b, NFTA_EXPR_NAME, self.name());
            attr::nested(b, NFTA_EXPR_DATA, |b| match self {
                Expr::Payload { base, offset, len, dreg } => {
                    put_be32(b, PAYLOAD_DREG, *dreg);
                    put_be32(b, PAYLOAD_BASE, *base as u32);
                    put_be32(b, PAYLOAD_OFFSET, *offset);
                    put_be32(b, PAYLOAD_LEN, *len);
                }
                Expr::Meta { key, dreg } => {
                    put_be32(b, META_DREG, *dreg);
                    put_be32(b, META_KEY, *key as u32);
                }
                Expr::MetaSet { key, sreg } => {
                    put_be32(b, META_KEY, *key as u32);
                    put_be32(b, META_SREG, *sreg);
                }
                Expr::Bitwise { sreg, dreg, mask, xor } => {
                    put_be32(b, BITWISE_SREG, *sreg);
                    put_be32(b, BITWISE_DREG, *dreg);
                    put_be32(b, BITWISE_LEN, mask.len() as u32);
                    attr::nested(b, BITWISE_MASK, |b| attr::put(b, NFTA_DATA_VALUE, mask));
                    attr::nested(b, BITWISE_XOR, |b| attr::put(b, NFTA_DATA_VALUE, xor));
                }
                Expr::Byteorder { sreg, dreg, hton, len, size } => {
                    put_be32(b, BYTEORDER_SREG, *sreg);
                    put_be32(b, BYTEORDER_DREG, *dreg);
                    put_be32(b, BYTEORDER_OP, u32::from(*hton));
                    put_be32(b, BYTEORDER_LEN, *len);
                    put_be32(b, BYTEORDER_SIZE, *size);
                }
                Expr::Cmp { sreg, op, data } => {
                    put_be32(b, CMP_SREG, *sreg);
                    put_be32(b, CMP_OP, *op as u32);
                    attr::nested(b, CMP_DATA, |b| attr::put(b, NFTA_DATA_VALUE, data));
                }
                Expr::Lookup { set, sreg, dreg, invert } => {
                    put_str(b, LOOKUP_SET, set);
                    put_be32(b, LOOKUP_SREG, *sreg);
                    if let Some(dreg) = dreg {
                        put_be32(b, LOOKUP_DREG, *dreg);
                    }
                    if *invert {
                        put_be32(b, LOOKUP_FLAGS, LOOKUP_F_INV);
                    }
                }
                Expr::Immediate { dreg, data } => {
                    put_be32(b, IMMEDIATE_DREG, *dreg);
                    attr::nested(b, IMMEDIATE_DATA, |b| attr::put(b, NFTA_DATA_VALUE, data));
                }
                Expr::Verdict(verdict) => {
                    put_be32(b, IMMEDIATE_DREG, REG_VERDICT);
                    attr::nested(b, IMMEDIATE_DATA, |b| verdict.encode(b));
                }
                Expr::Ct { key, dreg } => {
                    put_be32(b, CT_DREG, *dreg);
                    put_be32(b, CT_KEY, *key as u32);
                }
                Expr::Fib { flags, result, dreg } => {
                    put_be32(b, FIB_DREG, *dreg);
                    put_be32(b, FIB_RESULT, *result);
                    put_be32(b, FIB_FLAGS, *flags);
                }
                Expr::Numgen { dreg, modulus, random } => {
                    put_be32(b, NUMGEN_DREG, *dreg);
                    put_be32(b, NUMGEN_MODULUS, *modulus);
                    put_be32(b, NUMGEN_TYPE, u32::from(*random));
                }
                Expr::Nat { kind, family, addr, proto, flags } => {
                    put_be32(b, NAT_TYPE, *kind as u32);
                    put_be32(b, NAT_FAMILY, u32::from(*family));
                    put_be32(b, NAT_REG_ADDR_MIN, *addr);
                    if let Some(proto) = proto {
                        put_be32(b, NAT_REG_PROTO_MIN, *proto);
                    }
                    if *flags != 0 {
                        put_be32(b, NAT_FLAGS, *flags);
                    }
                }
                Expr::Masq { flags } => {
                    if *flags != 0 {
                        put_be32(b, MASQ_FLAGS, *flags);
                    }
                }
                Expr::Reject { kind, code } => {
                    put_be32(b, REJECT_TYPE, *kind);
                    attr::put(b, REJECT_ICMP_CODE, &[*code]);
                }
                Expr::DynsetUpdate { set, sreg_key } => {
                    put_str(b, DYNSET_SET_NAME, set);
                    put_be32(b, DYNSET_OP, DYNSET_OP_UPDATE);
                    put_be32(b, DYNSET_SREG_KEY, *sreg_key);
                }
            });
        });
    }

    /// Reads one expression from the payload of a `NFTA_LIST_ELEM`, as the kernel dumps
    /// it. Expressions kpng never writes, and attributes it does not use, read as `None`.
    pub fn decode(payload: &[u8]) -> Option<Expr> {
        let outer = attr::parse(payload);
        let name = attr::string(attr::find(&outer, NFTA_EXPR_NAME)?);
        let a = attr::parse(attr::find(&outer, NFTA_EXPR_DATA).unwrap_or_default());
        decode_data(&name, &a)
    }
}

fn value_of(nest: Option<&[u8]>) -> Option<Vec<u8>> {
    Some(attr::find(&attr::parse(nest?), NFTA_DATA_VALUE)?.to_vec())
}

fn decode_data(name: &str, a: &[(u16, &[u8])]) -> Option<Expr> {
    use attrs::*;
    let u = |kind| attr::find(a, kind).and_then(attr::be32);
    Some(match name {
        "payload" => Expr::Payload {
            base: match u(PAYLOAD_BASE)? {
                0 => PayloadBase::Link,
                1 => PayloadBase::Network,
                2 => PayloadBase::Transport,
                _ => return None,
            },
            offset: u(PAYLOAD_OFFSET)?,
            len: u(PAYLOAD_LEN)?,
            dreg: u(PAYLOAD_DREG)?,
        },
        "meta" => {
            let key = match u(META_KEY)? {
                3 => MetaKey::Mark,
                6 => MetaKey::IifName,
                16 => MetaKey::L4Proto,
                _ => return None,
            };
            match u(META_SREG) {
                Some(sreg) => Expr::MetaSet { key, sreg },
                None => Expr::Meta { key, dreg: u(META_DREG)? },
            }
        }
        "bitwise" => Expr::Bitwise {
            sreg: u(BITWISE_SREG)?,
            dreg: u(BITWISE_DREG)?,
            mask: value_of(attr::find(a, BITWISE_MASK))?,
            xor: value_of(attr::find(a, BITWISE_XOR))?,
        },
        "byteorder" => Expr::Byteorder {
            sreg: u(BYTEORDER_SREG)?,
            dreg: u(BYTEORDER_DREG)?,
            hton: u(BYTEORDER_OP)? == 1,
            len: u(BYTEORDER_LEN)?,
            size: u(BYTEORDER_SIZE)?,
        },
        "cmp" => Expr::Cmp {
            sreg: u(CMP_SREG)?,
            op: if u(CMP_OP)? == 0 { CmpOp::Eq } else { CmpOp::Neq },
            data: value_of(attr::find(a, CMP_DATA))?,
        },
        "lookup" => Expr::Lookup {
            set: attr::string(attr::find(a, LOOKUP_SET)?),
            sreg: u(LOOKUP_SREG)?,
            dreg: u(LOOKUP_DREG),
            invert: u(LOOKUP_FLAGS).is_some_and(|f| f & LOOKUP_F_INV != 0),
        },
        "immediate" => {
            let dreg = u(IMMEDIATE_DREG)?;
            let data = attr::parse(attr::find(a, IMMEDIATE_DATA)?);
            match attr::find(&data, NFTA_DATA_VERDICT) {
                Some(verdict) => Expr::Verdict(Verdict::decode(verdict)?),
                None => {
                    Expr::Immediate { dreg, data: attr::find(&data, NFTA_DATA_VALUE)?.to_vec() }
                }
            }
        }
        "ct" => Expr::Ct {
            key: match u(CT_KEY)? {
                0 => CtKey::State,
                2 => CtKey::Status,
                _ => return None,
            },
            dreg: u(CT_DREG)?,
        },
        "fib" => Expr::Fib { flags: u(FIB_FLAGS)?, result: u(FIB_RESULT)?, dreg: u(FIB_DREG)? },
        "numgen" => Expr::Numgen {
            dreg: u(NUMGEN_DREG)?,
            modulus: u(NUMGEN_MODULUS)?,
            random: u(NUMGEN_TYPE)? == 1,
        },
        "nat" => Expr::Nat {
            kind: if u(NAT_TYPE)? == 0 { NatKind::Snat } else { NatKind::Dnat },
            family: u(NAT_FAMILY)? as u8,
            addr: u(NAT_REG_ADDR_MIN)?,
            proto: u(NAT_REG_PROTO_MIN),
            flags: u(NAT_FLAGS).unwrap_or(0),
        },
        "masq" => Expr::Masq { flags: u(MASQ_FLAGS).unwrap_or(0) },
        "reject" => {
            Expr::Reject { kind: u(REJECT_TYPE)?, code: *attr::find(a, REJECT_ICMP_CODE)?.first()? }
        }
        "dynset" if u(DYNSET_OP) == Some(DYNSET_OP_UPDATE) => Expr::DynsetUpdate {
            set: attr::string(attr::find(a, DYNSET_SET_NAME)?),
            sreg_key: u(DYNSET_SREG_KEY)?,
        },
        _ => return None,
    })
}

/// Bytes as nft prints them: 32-bit words read in host order, `0x%08x`, space-separated.
pub fn words(bytes: &[u8]) -> String {
    bytes
        .chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            format!("0x{:08x}", u32::from_ne_bytes(w))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The expression as `nft --debug=netlink` prints it (without the brackets).
impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Payload { base, offset, len, dreg } => {
                let base = match base {
                    PayloadBase::Link => "link",
                    PayloadBase::Network => "network",
                    PayloadBase::Transport => "transport",
                };
                write!(f, "payload load {len}b @ {base} header + {offset} => reg {dreg}")
            }
            Expr::Meta { key, dreg } => write!(f, "meta load {} => reg {dreg}", meta_name(*key)),
            Expr::MetaSet { key, sreg } => {
                write!(f, "meta set {} with reg {sreg}", meta_name(*key))
            }
            Expr::Bitwise { sreg, dreg, mask, xor } => {
                write!(f, "bitwise reg {dreg} = ( reg {sreg} & {} ) ^ {}", words(mask), words(xor))
            }
            Expr::Byteorder { sreg, dreg, hton, len, size } => {
                let op = if *hton { "hton" } else { "ntoh" };
                write!(f, "byteorder reg {dreg} = {op}(reg {sreg}, {size}, {len})")
            }
            Expr::Cmp { sreg, op, data } => {
                let op = if *op == CmpOp::Eq { "eq" } else { "neq" };
                write!(f, "cmp {op} reg {sreg} {}", words(data))
            }
            Expr::Lookup { set, sreg, dreg, invert } => {
                write!(f, "lookup reg {sreg} set {set}")?;
                if let Some(dreg) = dreg {
                    write!(f, " dreg {dreg}")?;
                }
                if *invert {
                    f.write_str(" 0x1")?;
                }
                Ok(())
            }
            Expr::Immediate { dreg, data } => write!(f, "immediate reg {dreg} {}", words(data)),
            Expr::Verdict(v) => write!(f, "immediate reg 0 {v}"),
            Expr::Ct { key, dreg } => {
                let key = if *key == CtKey::State { "state" } else { "status" };
                write!(f, "ct load {key} => reg {dreg}")
            }
            Expr::Fib { flags, result, dreg } => {
                let on = match *flags {
                    FIB_SADDR => "saddr",
                    FIB_DADDR => "daddr",
                    _ => "?",
                };
                let result = if *result == FIB_RESULT_ADDRTYPE { "type" } else { "?" };
                write!(f, "fib {on} {result} => reg {dreg}")
            }
            Expr::Numgen { dreg, modulus, random } => {
                let kind = if *random { "random" } else { "inc" };
                write!(f, "numgen reg {dreg} = {kind} mod {modulus}")
            }
            Expr::Nat { kind, family, addr, proto, flags } => {
                let kind = if *kind == NatKind::Dnat { "dnat" } else { "snat" };
                let family = if *family == 10 { "ip6" } else { "ip" };
                write!(f, "nat {kind} {family} addr_min reg {addr}")?;
                if let Some(proto) = proto {
                    write!(f, " proto_min reg {proto}")?;
                }
                if *flags != 0 {
                    write!(f, " flags 0x{flags:x}")?;
                }
                Ok(())
            }
            Expr::Masq { flags } => match flags {
                0 => f.write_str("masq"),
                _ => write!(f, "masq flags 0x{flags:x}"),
            },
            Expr::Reject { kind, code } => write!(f, "reject type {kind} code {code}"),
            Expr::DynsetUpdate { set, sreg_key } => {
                write!(f, "dynset update reg_key {sreg_key} set {set}")
            }
        }
    }
}

fn meta_name(key: MetaKey) -> &'static str {
    match key {
        MetaKey::Mark => "mark",
        MetaKey::IifName => "iifname",
        MetaKey::L4Proto => "l4proto",
    }
}

/// Writes a rule's expressions as `NFTA_RULE_EXPRESSIONS` content.
pub fn encode_all(exprs: &[Expr], buf: &mut Vec<u8>) {
    for expr in exprs {
        expr.encode(buf);
    }
}

/// Reads the expressions of a dumped rule (`NFTA_RULE_EXPRESSIONS` content); an
/// expression kpng does not know reads as `None`.
pub fn decode_all(payload: &[u8]) -> Vec<Option<Expr>> {
    attr::parse(payload)
        .into_iter()
        .filter(|(kind, _)| *kind == NFTA_LIST_ELEM)
        .map(|(_, e)| Expr::decode(e))
        .collect()
}

#[cfg(test)]
mod tests;
