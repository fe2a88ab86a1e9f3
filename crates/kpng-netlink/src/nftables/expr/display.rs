//! How an [`Expr`] prints, the way `nft --debug=netlink` does.

use super::*;

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
                let base = base_name(*base);
                write!(f, "payload load {len}b @ {base} header + {offset} => reg {dreg}")
            }
            Expr::PayloadSet { base, offset, len, sreg, csum_type, csum_offset, csum_flags } => {
                let base = base_name(*base);
                write!(
                    f,
                    "payload write reg {sreg} => {len}b @ {base} header + {offset} csum_type \
                     {csum_type} csum_off {csum_offset} csum_flags 0x{csum_flags:x}"
                )
            }
            Expr::Notrack => f.write_str("notrack"),
            Expr::Dup { sreg_addr } => write!(f, "dup sreg_addr {sreg_addr}"),
            Expr::Meta { key, dreg } => write!(f, "meta load {} => reg {dreg}", meta_name(*key)),
            Expr::MetaSet { key, sreg } => {
                write!(f, "meta set {} with reg {sreg}", meta_name(*key))
            }
            Expr::Bitwise { sreg, dreg, mask, xor, .. } => {
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
            Expr::Lookup { set, sreg, dreg, invert, .. } => {
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
            Expr::DynsetUpdate { set, sreg_key, .. } => {
                write!(f, "dynset update reg_key {sreg_key} set {set}")
            }
            Expr::Hash { sreg: Some(sreg), dreg, len, modulus, seed } => {
                write!(f, "hash reg {dreg} = jhash(reg {sreg}, {len}, 0x{seed:x}) % mod {modulus}")
            }
            Expr::Hash { sreg: None, dreg, modulus, .. } => {
                write!(f, "hash reg {dreg} = symhash() % mod {modulus}")
            }
            Expr::Log { prefix, level } => write!(f, "log prefix {prefix} level {level}"),
            Expr::CtHelperSet { name } => write!(f, "objref type 3 name {name}"),
            Expr::Limit { rate, unit_seconds, burst } => {
                let unit = match unit_seconds {
                    1 => "second".to_string(),
                    60 => "minute".to_string(),
                    n => format!("{n}s"),
                };
                write!(f, "limit rate {rate}/{unit} burst {burst} type packets flags 0x0")
            }
        }
    }
}

fn base_name(base: PayloadBase) -> &'static str {
    match base {
        PayloadBase::Link => "link",
        PayloadBase::Network => "network",
        PayloadBase::Transport => "transport",
    }
}

fn meta_name(key: MetaKey) -> &'static str {
    match key {
        MetaKey::Mark => "mark",
        MetaKey::IifName => "iifname",
        MetaKey::L4Proto => "l4proto",
    }
}
