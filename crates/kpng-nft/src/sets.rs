//! The declaration of each set and map: in nft syntax (the dry run) and as the netlink
//! set specification the kernel receives, including the description nft keeps with a set
//! (`NFTA_SET_USERDATA`) so that `nft list` shows the backends maps as `typeof`.

use kpng_model::Family;
use kpng_model::global::PersistenceKey;
use kpng_netlink::nftables::SetSpec;
use kpng_netlink::nftables::objects::{SET_CONCAT, SET_EVAL, SET_INTERVAL, SET_TIMEOUT, SetData};

use crate::objects::{KeyKind, MapName, ValueKind};

// nft's datatype ids, packed 6 bits apart in a concatenation.
const INTEGER: u32 = 4;
const IPV4_ADDR: u32 = 7;
const IPV6_ADDR: u32 = 8;
const INET_PROTO: u32 = 12;
const INET_SERVICE: u32 = 13;
const ETHER_ADDR: u32 = 9;

fn concat(types: &[u32]) -> u32 {
    types.iter().fold(0, |acc, t| (acc << 6) | t)
}

fn addr(family: Family) -> (u32, u32, &'static str, &'static str) {
    match family {
        Family::V4 => (IPV4_ADDR, 4, "ipv4_addr", "ip"),
        Family::V6 => (IPV6_ADDR, 16, "ipv6_addr", "ip6"),
    }
}

/// A set's declaration, both ways.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetDecl {
    /// What the kernel receives.
    pub spec: SetSpec,
    /// The body of `set <name> { ... }` / `map <name> { ... }` in nft syntax.
    pub text: String,
}

impl SetDecl {
    /// Whether it declares a map (its elements map to data).
    pub fn is_map(&self) -> bool {
        self.spec.data.is_some()
    }

    /// `set` or `map`.
    pub fn keyword(&self) -> &'static str {
        if self.is_map() { "map" } else { "set" }
    }
}

/// The declaration of `map` in `family`'s table.
pub fn declaration(map: MapName, family: Family) -> SetDecl {
    let (addr_type, addr_len, addr_name, ip) = addr(family);
    let mut spec = SetSpec {
        name: map.name().into_owned(),
        key_type: 0,
        key_len: 0,
        flags: 0,
        data: None,
        timeout_ms: None,
        concat: Vec::new(),
        userdata: Vec::new(),
    };
    let dest_text = format!("{addr_name} . inet_proto . inet_service");
    let text = match map.key_kind() {
        KeyKind::Addr => {
            (spec.key_type, spec.key_len) = (addr_type, addr_len);
            format!("type {addr_name};")
        }
        KeyKind::Dest => {
            spec.key_type = concat(&[addr_type, INET_PROTO, INET_SERVICE]);
            spec.key_len = addr_len + 8;
            format!("type {dest_text}")
        }
        KeyKind::NodePort => {
            (spec.key_type, spec.key_len) = (concat(&[INET_PROTO, INET_SERVICE]), 8);
            "type inet_proto . inet_service".to_string()
        }
        KeyKind::DestSlot => {
            spec.key_type = concat(&[addr_type, INET_PROTO, INET_SERVICE, INTEGER]);
            spec.key_len = addr_len + 12;
            spec.userdata = typeof_userdata(family, true);
            format!(
                "typeof {ip} daddr . meta l4proto . th dport . numgen random mod 1 : {ip} daddr . th dport;"
            )
        }
        KeyKind::NodePortSlot => {
            (spec.key_type, spec.key_len) = (concat(&[INET_PROTO, INET_SERVICE, INTEGER]), 12);
            spec.userdata = typeof_userdata(family, false);
            format!("typeof meta l4proto . th dport . numgen random mod 1 : {ip} daddr . th dport;")
        }
        KeyKind::AddrPair => {
            (spec.key_type, spec.key_len) = (concat(&[addr_type, addr_type]), 2 * addr_len);
            format!("type {addr_name} . {addr_name};")
        }
        KeyKind::DestSource => {
            spec.key_type = concat(&[addr_type, INET_PROTO, INET_SERVICE, addr_type]);
            spec.key_len = 2 * addr_len + 8;
            spec.flags = SET_INTERVAL | SET_CONCAT;
            // Each field's own length, as nft declares them (keys pad each to 4 bytes).
            spec.concat = vec![addr_len, 1, 2, addr_len];
            format!("type {dest_text} . {addr_name}; flags interval;")
        }
    };
    if spec.userdata.is_empty() {
        let concatenated = !matches!(map.key_kind(), KeyKind::Addr);
        spec.userdata = type_userdata(concatenated, map.value_kind() == Some(ValueKind::Verdict));
    }
    let text = match map.value_kind() {
        None if text.ends_with(';') => text,
        None => format!("{text};"),
        Some(ValueKind::Endpoint) => {
            spec.data = Some(SetData::Value {
                type_id: concat(&[addr_type, INET_SERVICE]),
                len: addr_len + 4,
            });
            text
        }
        Some(ValueKind::Verdict) => {
            spec.data = Some(SetData::Verdict);
            format!("{text} : verdict;")
        }
    };
    SetDecl { spec, text }
}

/// The declaration of the dynamic set of affinity slot `name` (clients, by `key`, with a
/// timeout, refreshed from the packet path).
pub fn affinity_declaration(
    name: &str,
    family: Family,
    key: PersistenceKey,
    timeout_seconds: u32,
) -> SetDecl {
    let (addr_type, addr_len, addr_name, _) = addr(family);
    let (key_type, key_len, type_name) = match key {
        PersistenceKey::SrcIp => (addr_type, addr_len, addr_name.to_string()),
        PersistenceKey::SrcPort => (INET_SERVICE, 2, "inet_service".to_string()),
        PersistenceKey::SrcMac => (ETHER_ADDR, 6, "ether_addr".to_string()),
        PersistenceKey::SrcIpSrcPort | PersistenceKey::SrcIpDstPort => (
            concat(&[addr_type, INET_SERVICE]),
            addr_len + 4,
            format!("{addr_name} . inet_service"),
        ),
    };
    let concatenated = matches!(key, PersistenceKey::SrcIpSrcPort | PersistenceKey::SrcIpDstPort);
    let spec = SetSpec {
        userdata: type_userdata(concatenated, false),
        name: name.to_string(),
        key_type,
        key_len,
        flags: SET_TIMEOUT | SET_EVAL,
        data: None,
        timeout_ms: Some(u64::from(timeout_seconds) * 1000),
        concat: Vec::new(),
    };
    let text = format!("type {type_name}; flags dynamic,timeout; timeout {timeout_seconds}s;");
    SetDecl { spec, text }
}

/// One node of nft's userdata: `type`, length, value (u32s in host order).
fn udata(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    out.push(kind);
    out.push(value.len() as u8);
    out.extend_from_slice(value);
}

fn udata_u32(out: &mut Vec<u8>, kind: u8, value: u32) {
    udata(out, kind, &value.to_ne_bytes());
}

// nft's expression ids and payload templates, as it records `typeof` expressions.
const EXPR_PAYLOAD: u32 = 7;
const EXPR_META: u32 = 9;
const EXPR_CONCAT: u32 = 13;
const EXPR_NUMGEN: u32 = 23;
const PROTO_IP: u32 = 12;
const PROTO_IP6: u32 = 13;
const PROTO_TH: u32 = 11;
const IP_DADDR: u32 = 12;
const IP6_DADDR: u32 = 9;
const TH_DPORT: u32 = 2;
const META_L4PROTO: u32 = 16;

/// One typed expression: `{0: expression id, 1: {its data}}`.
fn typed(out: &mut Vec<u8>, index: u8, expr: u32, data: &[u8]) {
    let mut inner = Vec::new();
    udata_u32(&mut inner, 0, expr);
    udata(&mut inner, 1, data);
    udata(out, index, &inner);
}

fn payload(out: &mut Vec<u8>, index: u8, protocol: u32, field: u32) {
    let mut data = Vec::new();
    udata_u32(&mut data, 0, protocol);
    udata_u32(&mut data, 1, field);
    typed(out, index, EXPR_PAYLOAD, &data);
}

fn daddr(out: &mut Vec<u8>, index: u8, family: Family) {
    match family {
        Family::V4 => payload(out, index, PROTO_IP, IP_DADDR),
        Family::V6 => payload(out, index, PROTO_IP6, IP6_DADDR),
    }
}

/// A concatenation of the expressions `fields` writes.
fn concatenation(kind: u8, fields: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut list = Vec::new();
    fields(&mut list);
    let mut inner = Vec::new();
    udata_u32(&mut inner, 0, EXPR_CONCAT);
    udata(&mut inner, 1, &list);
    let mut out = Vec::new();
    udata(&mut out, kind, &inner);
    out
}

/// nft's description of a set declared by `type`: the key's byte order (addresses are
/// big-endian) and, for a concatenation, an empty `typeof`; a verdict map also records its
/// data's byte order and that its data are no intervals.
fn type_userdata(concatenated: bool, verdicts: bool) -> Vec<u8> {
    let mut out = Vec::new();
    if !concatenated {
        udata_u32(&mut out, 0, 2);
        return out;
    }
    udata_u32(&mut out, 0, 0);
    if verdicts {
        udata_u32(&mut out, 1, 0);
    }
    out.extend(concatenation(3, |_| {}));
    if verdicts {
        udata_u32(&mut out, 6, 0);
    }
    out
}

/// nft's description of a backends map: the key `[ip daddr .] meta l4proto . th dport .
/// numgen random mod 1`, the value `ip daddr . th dport`.
fn typeof_userdata(family: Family, by_destination: bool) -> Vec<u8> {
    let mut out = Vec::new();
    udata_u32(&mut out, 0, 0); // key byte order
    udata_u32(&mut out, 1, 0); // data byte order
    out.extend(concatenation(3, |list| {
        let mut index = 0;
        if by_destination {
            daddr(list, index, family);
            index += 1;
        }
        let mut meta = Vec::new();
        udata_u32(&mut meta, 0, META_L4PROTO);
        typed(list, index, EXPR_META, &meta);
        payload(list, index + 1, PROTO_TH, TH_DPORT);
        let mut numgen = Vec::new();
        udata_u32(&mut numgen, 0, 1); // random
        udata_u32(&mut numgen, 1, 1); // mod 1
        udata_u32(&mut numgen, 2, 0); // offset
        typed(list, index + 2, EXPR_NUMGEN, &numgen);
    }));
    out.extend(concatenation(4, |list| {
        daddr(list, 0, family);
        payload(list, 1, PROTO_TH, TH_DPORT);
    }));
    udata_u32(&mut out, 6, 0); // data interval
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn backends_maps_carry_nfts_typeof_description() {
        // What nft 1.0.6 stores for `typeof ip daddr . meta l4proto . th dport . numgen
        // random mod 1 : ip daddr . th dport`, read back from the kernel.
        let v4 = hex(concat!(
            "000400000000",
            "010400000000",
            "036000040d00000001580014000407000000010c00040c00000001040c000000010e0004090000",
            "0001060004100000000214000407000000010c00040b000000010402000000031a00041700000001",
            "12000401000000010401000000020400000000",
            "043400040d000000012c0014000407000000010c00040c00000001040c0000000114000407000000",
            "010c00040b000000010402000000",
            "060400000000",
        ));
        assert_eq!(typeof_userdata(Family::V4, true), v4);
        assert_eq!(typeof_userdata(Family::V4, true).len(), 170);
        assert_eq!(typeof_userdata(Family::V4, false).len(), 148);
    }
}
