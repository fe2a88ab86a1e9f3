//! Every expression decodes to itself, and prints as `nft --debug=netlink` does (the
//! expected lines are nft's own output for the same rules).

use super::*;

fn all() -> Vec<(Expr, &'static str)> {
    vec![
        (
            Expr::Payload { base: PayloadBase::Network, offset: 16, len: 4, dreg: 1 },
            "payload load 4b @ network header + 16 => reg 1",
        ),
        (
            Expr::PayloadSet {
                base: PayloadBase::Network,
                offset: 16,
                len: 4,
                sreg: 1,
                csum_type: CSUM_INET,
                csum_offset: 10,
                csum_flags: CSUM_L4_PSEUDOHDR,
            },
            "payload write reg 1 => 4b @ network header + 16 csum_type 1 csum_off 10 csum_flags 0x1",
        ),
        (
            Expr::PayloadSet {
                base: PayloadBase::Transport,
                offset: 2,
                len: 2,
                sreg: 1,
                csum_type: CSUM_SCTP,
                csum_offset: 8,
                csum_flags: 0,
            },
            "payload write reg 1 => 2b @ transport header + 2 csum_type 2 csum_off 8 csum_flags 0x0",
        ),
        (Expr::Notrack, "notrack"),
        (Expr::Dup { sreg_addr: 1 }, "dup sreg_addr 1"),
        (Expr::Meta { key: MetaKey::L4Proto, dreg: 9 }, "meta load l4proto => reg 9"),
        (Expr::MetaSet { key: MetaKey::Mark, sreg: 1 }, "meta set mark with reg 1"),
        (
            Expr::Bitwise {
                sreg: 1,
                dreg: 1,
                mask: 0xffff_bfffu32.to_ne_bytes().to_vec(),
                xor: 0x4000u32.to_ne_bytes().to_vec(),
                op: None,
            },
            "bitwise reg 1 = ( reg 1 & 0xffffbfff ) ^ 0x00004000",
        ),
        (
            Expr::Byteorder { sreg: 9, dreg: 9, hton: true, len: 1, size: 2 },
            "byteorder reg 9 = hton(reg 9, 2, 1)",
        ),
        (Expr::Cmp { sreg: 1, op: CmpOp::Neq, data: vec![0; 4] }, "cmp neq reg 1 0x00000000"),
        (
            Expr::Lookup {
                set: "local_pods".into(),
                sreg: 1,
                dreg: None,
                invert: true,
                set_id: None,
            },
            "lookup reg 1 set local_pods 0x1",
        ),
        (
            Expr::Lookup {
                set: "cluster_backends".into(),
                sreg: 1,
                dreg: Some(1),
                invert: false,
                set_id: None,
            },
            "lookup reg 1 set cluster_backends dreg 1",
        ),
        (Expr::Immediate { dreg: 1, data: vec![10, 244, 0, 10] }, "immediate reg 1 0x0a00f40a"),
        (Expr::Verdict(Verdict::Jump("services".into())), "immediate reg 0 jump -> services"),
        (Expr::Verdict(Verdict::Goto("pick".into())), "immediate reg 0 goto -> pick"),
        (Expr::Verdict(Verdict::Return), "immediate reg 0 return"),
        (
            Expr::Hash { sreg: Some(2), dreg: 1, len: 8, modulus: 3, seed: 0 },
            "hash reg 1 = jhash(reg 2, 8, 0x0) % mod 3",
        ),
        (
            Expr::Hash { sreg: None, dreg: 1, len: 0, modulus: 3, seed: 0 },
            "hash reg 1 = symhash() % mod 3",
        ),
        (
            Expr::Limit { rate: 10, unit_seconds: 1, burst: 5 },
            "limit rate 10/second burst 5 type packets flags 0x0",
        ),
        (Expr::Log { prefix: "kpng ns/a ".into(), level: 4 }, "log prefix kpng ns/a  level 4"),
        (Expr::Verdict(Verdict::Drop), "immediate reg 0 drop"),
        (Expr::CtHelperSet { name: "ftp_tcp".into() }, "objref type 3 name ftp_tcp"),
        (Expr::Ct { key: CtKey::Status, dreg: 1 }, "ct load status => reg 1"),
        (
            Expr::Fib { flags: FIB_SADDR, result: FIB_RESULT_ADDRTYPE, dreg: 1 },
            "fib saddr type => reg 1",
        ),
        (Expr::Numgen { dreg: 11, modulus: 2, random: true }, "numgen reg 11 = random mod 2"),
        (
            Expr::Nat { kind: NatKind::Dnat, family: 2, addr: 1, proto: Some(9), flags: 0 },
            "nat dnat ip addr_min reg 1 proto_min reg 9",
        ),
        (
            Expr::Nat {
                kind: NatKind::Dnat,
                family: 10,
                addr: 1,
                proto: Some(2),
                flags: NAT_PROTO_SPECIFIED,
            },
            "nat dnat ip6 addr_min reg 1 proto_min reg 2 flags 0x2",
        ),
        (Expr::Masq { flags: NAT_RANDOM_FULLY }, "masq flags 0x10"),
        (Expr::Reject { kind: REJECT_ICMP_UNREACH, code: 3 }, "reject type 0 code 3"),
        (
            Expr::DynsetUpdate { set: "aff_0".into(), sreg_key: 1, set_id: None },
            "dynset update reg_key 1 set aff_0",
        ),
    ]
}

#[test]
fn expressions_print_as_nft_debug_does() {
    for (expr, text) in all() {
        assert_eq!(expr.to_string(), text);
    }
}

#[test]
fn expressions_decode_to_themselves() {
    let exprs: Vec<Expr> = all().into_iter().map(|(e, _)| e).collect();
    let mut buf = Vec::new();
    encode_all(&exprs, &mut buf);
    let back: Vec<Expr> = decode_all(&buf).into_iter().map(|e| e.expect("decodes")).collect();
    assert_eq!(back, exprs);
}

#[test]
fn unknown_expressions_decode_as_none() {
    let mut buf = Vec::new();
    attr::nested(&mut buf, NFTA_LIST_ELEM, |b| {
        attr::put_str(b, 1, "counter");
        attr::nested(b, 2, |_| {});
    });
    assert_eq!(decode_all(&buf), [None]);
}
