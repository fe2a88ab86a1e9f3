//! How an [`Expr`] is written to and read from netlink attributes.

use super::*;

mod attrs {
    pub const PAYLOAD_DREG: u16 = 1;
    pub const PAYLOAD_BASE: u16 = 2;
    pub const PAYLOAD_OFFSET: u16 = 3;
    pub const PAYLOAD_LEN: u16 = 4;
    pub const PAYLOAD_SREG: u16 = 5;
    pub const PAYLOAD_CSUM_TYPE: u16 = 6;
    pub const PAYLOAD_CSUM_OFFSET: u16 = 7;
    pub const PAYLOAD_CSUM_FLAGS: u16 = 8;
    pub const META_DREG: u16 = 1;
    pub const META_KEY: u16 = 2;
    pub const META_SREG: u16 = 3;
    pub const BITWISE_SREG: u16 = 1;
    pub const BITWISE_DREG: u16 = 2;
    pub const BITWISE_LEN: u16 = 3;
    pub const BITWISE_MASK: u16 = 4;
    pub const BITWISE_XOR: u16 = 5;
    pub const BITWISE_OP: u16 = 6;
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
    pub const LOOKUP_SET_ID: u16 = 4;
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
    pub const NUMGEN_OFFSET: u16 = 4;
    pub const NAT_TYPE: u16 = 1;
    pub const NAT_FAMILY: u16 = 2;
    pub const NAT_REG_ADDR_MIN: u16 = 3;
    pub const NAT_REG_PROTO_MIN: u16 = 5;
    pub const NAT_FLAGS: u16 = 7;
    pub const MASQ_FLAGS: u16 = 1;
    pub const REJECT_TYPE: u16 = 1;
    pub const REJECT_ICMP_CODE: u16 = 2;
    pub const DYNSET_SET_NAME: u16 = 1;
    pub const DYNSET_SET_ID: u16 = 2;
    pub const DYNSET_OP: u16 = 3;
    pub const DYNSET_SREG_KEY: u16 = 4;
    pub const DYNSET_OP_UPDATE: u32 = 1;
    pub const HASH_SREG: u16 = 1;
    pub const HASH_DREG: u16 = 2;
    pub const HASH_LEN: u16 = 3;
    pub const HASH_MODULUS: u16 = 4;
    pub const HASH_SEED: u16 = 5;
    pub const HASH_TYPE: u16 = 7;
    pub const HASH_JENKINS: u32 = 0;
    pub const HASH_SYM: u32 = 1;
    pub const LOG_PREFIX: u16 = 2;
    pub const LOG_LEVEL: u16 = 5;
    pub const LIMIT_RATE: u16 = 1;
    pub const LIMIT_UNIT: u16 = 2;
    pub const LIMIT_BURST: u16 = 3;
    pub const LIMIT_TYPE: u16 = 4;
    pub const LIMIT_FLAGS: u16 = 5;
    pub const DUP_SREG_ADDR: u16 = 1;
    pub const OBJREF_IMM_TYPE: u16 = 1;
    pub const OBJREF_IMM_NAME: u16 = 2;
    /// `NFT_OBJECT_CT_HELPER`.
    pub const OBJECT_CT_HELPER: u32 = 3;
}

impl Expr {
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
                Expr::PayloadSet {
                    base,
                    offset,
                    len,
                    sreg,
                    csum_type,
                    csum_offset,
                    csum_flags,
                } => {
                    put_be32(b, PAYLOAD_SREG, *sreg);
                    put_be32(b, PAYLOAD_BASE, *base as u32);
                    put_be32(b, PAYLOAD_OFFSET, *offset);
                    put_be32(b, PAYLOAD_LEN, *len);
                    put_be32(b, PAYLOAD_CSUM_TYPE, *csum_type);
                    put_be32(b, PAYLOAD_CSUM_OFFSET, *csum_offset);
                    if *csum_flags != 0 {
                        put_be32(b, PAYLOAD_CSUM_FLAGS, *csum_flags);
                    }
                }
                Expr::Meta { key, dreg } => {
                    put_be32(b, META_KEY, *key as u32);
                    put_be32(b, META_DREG, *dreg);
                }
                Expr::MetaSet { key, sreg } => {
                    put_be32(b, META_KEY, *key as u32);
                    put_be32(b, META_SREG, *sreg);
                }
                Expr::Bitwise { sreg, dreg, mask, xor, op } => {
                    put_be32(b, BITWISE_SREG, *sreg);
                    put_be32(b, BITWISE_DREG, *dreg);
                    if let Some(op) = op {
                        put_be32(b, BITWISE_OP, *op);
                    }
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
                Expr::Lookup { set, sreg, dreg, invert, set_id } => {
                    put_be32(b, LOOKUP_SREG, *sreg);
                    if let Some(dreg) = dreg {
                        put_be32(b, LOOKUP_DREG, *dreg);
                    }
                    put_str(b, LOOKUP_SET, set);
                    if let Some(id) = set_id {
                        put_be32(b, LOOKUP_SET_ID, *id);
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
                    put_be32(b, CT_KEY, *key as u32);
                    put_be32(b, CT_DREG, *dreg);
                }
                Expr::Fib { flags, result, dreg } => {
                    put_be32(b, FIB_FLAGS, *flags);
                    put_be32(b, FIB_RESULT, *result);
                    put_be32(b, FIB_DREG, *dreg);
                }
                Expr::Numgen { dreg, modulus, random } => {
                    put_be32(b, NUMGEN_DREG, *dreg);
                    put_be32(b, NUMGEN_MODULUS, *modulus);
                    put_be32(b, NUMGEN_TYPE, u32::from(*random));
                    put_be32(b, NUMGEN_OFFSET, 0);
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
                Expr::DynsetUpdate { set, sreg_key, set_id } => {
                    put_be32(b, DYNSET_SREG_KEY, *sreg_key);
                    put_be32(b, DYNSET_OP, DYNSET_OP_UPDATE);
                    put_str(b, DYNSET_SET_NAME, set);
                    if let Some(id) = set_id {
                        put_be32(b, DYNSET_SET_ID, *id);
                    }
                }
                Expr::Hash { sreg, dreg, len, modulus, seed } => match sreg {
                    Some(sreg) => {
                        put_be32(b, HASH_SREG, *sreg);
                        put_be32(b, HASH_DREG, *dreg);
                        put_be32(b, HASH_LEN, *len);
                        put_be32(b, HASH_MODULUS, *modulus);
                        put_be32(b, HASH_SEED, *seed);
                        put_be32(b, HASH_TYPE, HASH_JENKINS);
                    }
                    None => {
                        put_be32(b, HASH_DREG, *dreg);
                        put_be32(b, HASH_MODULUS, *modulus);
                        put_be32(b, HASH_TYPE, HASH_SYM);
                    }
                },
                Expr::Log { prefix, level } => {
                    put_str(b, LOG_PREFIX, prefix);
                    put_be32(b, LOG_LEVEL, *level);
                }
                Expr::Limit { rate, unit_seconds, burst } => {
                    attr::put_be64(b, LIMIT_RATE, *rate);
                    attr::put_be64(b, LIMIT_UNIT, *unit_seconds);
                    put_be32(b, LIMIT_BURST, *burst);
                    put_be32(b, LIMIT_TYPE, 0);
                    put_be32(b, LIMIT_FLAGS, 0);
                }
                Expr::CtHelperSet { name } => {
                    put_be32(b, OBJREF_IMM_TYPE, OBJECT_CT_HELPER);
                    put_str(b, OBJREF_IMM_NAME, name);
                }
                Expr::Notrack => {}
                Expr::Dup { sreg_addr } => put_be32(b, DUP_SREG_ADDR, *sreg_addr),
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
        "payload" => {
            let base = match u(PAYLOAD_BASE)? {
                0 => PayloadBase::Link,
                1 => PayloadBase::Network,
                2 => PayloadBase::Transport,
                _ => return None,
            };
            let (offset, len) = (u(PAYLOAD_OFFSET)?, u(PAYLOAD_LEN)?);
            match u(PAYLOAD_SREG) {
                Some(sreg) => Expr::PayloadSet {
                    base,
                    offset,
                    len,
                    sreg,
                    csum_type: u(PAYLOAD_CSUM_TYPE).unwrap_or(0),
                    csum_offset: u(PAYLOAD_CSUM_OFFSET).unwrap_or(0),
                    csum_flags: u(PAYLOAD_CSUM_FLAGS).unwrap_or(0),
                },
                None => Expr::Payload { base, offset, len, dreg: u(PAYLOAD_DREG)? },
            }
        }
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
            op: u(BITWISE_OP),
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
            set_id: u(LOOKUP_SET_ID),
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
            set_id: u(DYNSET_SET_ID),
        },
        "hash" => match u(HASH_TYPE)? {
            HASH_SYM => Expr::Hash {
                sreg: None,
                dreg: u(HASH_DREG)?,
                len: 0,
                modulus: u(HASH_MODULUS)?,
                seed: 0,
            },
            HASH_JENKINS => Expr::Hash {
                sreg: Some(u(HASH_SREG)?),
                dreg: u(HASH_DREG)?,
                len: u(HASH_LEN)?,
                modulus: u(HASH_MODULUS)?,
                seed: u(HASH_SEED)?,
            },
            _ => return None,
        },
        "log" => Expr::Log {
            prefix: attr::string(attr::find(a, LOG_PREFIX)?),
            level: u(LOG_LEVEL).unwrap_or(4),
        },
        "limit" if u(LIMIT_TYPE) == Some(0) && u(LIMIT_FLAGS).unwrap_or(0) == 0 => Expr::Limit {
            rate: attr::be64(attr::find(a, LIMIT_RATE)?)?,
            unit_seconds: attr::be64(attr::find(a, LIMIT_UNIT)?)?,
            burst: u(LIMIT_BURST)?,
        },
        "objref" if u(OBJREF_IMM_TYPE) == Some(OBJECT_CT_HELPER) => {
            Expr::CtHelperSet { name: attr::string(attr::find(a, OBJREF_IMM_NAME)?) }
        }
        "notrack" => Expr::Notrack,
        "dup" => Expr::Dup { sreg_addr: u(DUP_SREG_ADDR)? },
        _ => return None,
    })
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
