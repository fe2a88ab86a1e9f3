//! Reading what the kernel holds: attributes of dumped messages, decoded back into kpng's
//! element keys and values. The inverse of [`super::wire`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use kpng_model::{Family, Protocol};

use crate::objects::{Dest, Key, MapName, Value};

/// The attributes of one nesting level: `(type without flags, payload)`.
pub fn attributes(mut data: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while data.len() >= 4 {
        let len = u16::from_ne_bytes([data[0], data[1]]) as usize;
        let kind = u16::from_ne_bytes([data[2], data[3]]) & 0x3fff;
        if len < 4 || len > data.len() {
            break;
        }
        out.push((kind, &data[4..len]));
        data = &data[((len + 3) & !3).min(data.len())..];
    }
    out
}

fn find<'a>(attrs: &[(u16, &'a [u8])], kind: u16) -> Option<&'a [u8]> {
    attrs.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v)
}

fn cstring(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes.split(|b| *b == 0).next().unwrap_or_default()).into_owned()
}

/// The name of the set in a dumped `NEWSET` message payload.
pub fn set_name(payload: &[u8]) -> Option<String> {
    const NFTA_SET_NAME: u16 = 2;
    find(&attributes(payload), NFTA_SET_NAME).map(cstring)
}

fn ip(family: Family, bytes: &[u8]) -> Option<IpAddr> {
    match family {
        Family::V4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes.get(..4)?).ok()?))),
        Family::V6 => {
            Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes.get(..16)?).ok()?)))
        }
    }
}

fn protocol(byte: u8) -> Option<Protocol> {
    match byte {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

fn port(bytes: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes([*bytes.first()?, *bytes.get(1)?]))
}

fn slot(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?))
}

fn dest(family: Family, bytes: &[u8]) -> Option<(Dest, &[u8])> {
    let a = match family {
        Family::V4 => 4,
        Family::V6 => 16,
    };
    let d = Dest {
        ip: ip(family, bytes)?,
        protocol: protocol(*bytes.get(a)?)?,
        port: port(bytes.get(a + 4..)?)?,
    };
    Some((d, bytes.get(a + 8..)?))
}

/// Decodes a key of `map` (and its interval end, for interval maps).
pub fn key(family: Family, map: MapName, bytes: &[u8], end: Option<&[u8]>) -> Option<Key> {
    let nodeport = |b: &[u8]| Some((protocol(*b.first()?)?, port(b.get(4..)?)?));
    match map {
        MapName::NodePortAddrs | MapName::ClusterIps => Some(Key::Addr(ip(family, bytes)?)),
        MapName::AffinityCluster | MapName::AffinityLocal => {
            Some(Key::Dest(dest(family, bytes)?.0))
        }
        MapName::AffinityNodePortCluster | MapName::AffinityNodePortLocal => {
            nodeport(bytes).map(|(p, n)| Key::NodePort(p, n))
        }
        MapName::ClusterDests
        | MapName::LocalDests
        | MapName::ExternalLocalDests
        | MapName::RejectDests
        | MapName::DropDests
        | MapName::MasqDests
        | MapName::FirewallDests => Some(Key::Dest(dest(family, bytes)?.0)),
        MapName::Count(kind, _) if kind.by_destination() => Some(Key::Dest(dest(family, bytes)?.0)),
        MapName::NodePortClusterDests
        | MapName::NodePortLocalDests
        | MapName::RejectNodePorts
        | MapName::DropNodePorts
        | MapName::MasqNodePorts
        | MapName::Count(..) => nodeport(bytes).map(|(p, n)| Key::NodePort(p, n)),
        MapName::ClusterBackends | MapName::LocalBackends => {
            let (d, rest) = dest(family, bytes)?;
            Some(Key::DestSlot(d, slot(rest)?))
        }
        MapName::NodePortClusterBackends | MapName::NodePortLocalBackends => {
            let (p, n) = nodeport(bytes)?;
            Some(Key::NodePortSlot(p, n, slot(bytes.get(8..)?)?))
        }
        MapName::Hairpin => {
            let a = ip(family, bytes)?;
            let b = ip(family, bytes.get(if family == Family::V4 { 4 } else { 16 }..)?)?;
            Some(Key::AddrPair(a, b))
        }
        MapName::FirewallAllow => {
            let (d, start) = dest(family, bytes)?;
            let (_, last) = dest(family, end?)?;
            let (start, last) = (ip(family, start)?, ip(family, last)?);
            let net = (0..=if family == Family::V4 { 32 } else { 128 })
                .filter_map(|len| IpNet::new(start, len).ok())
                .find(|n| n.network() == start && n.broadcast() == last)?;
            Some(Key::DestSource(d, net))
        }
    }
}

/// Decodes one element of `map` from a `NFTA_LIST_ELEM` payload.
pub fn element(family: Family, map: MapName, payload: &[u8]) -> Option<(Key, Value)> {
    const KEY: u16 = 1;
    const DATA: u16 = 2;
    const KEY_END: u16 = 10;
    let attrs = attributes(payload);
    fn value_of(nest: Option<&[u8]>) -> Option<&[u8]> {
        nest.and_then(|n| find(&attributes(n), 1))
    }
    let key_bytes = value_of(find(&attrs, KEY))?;
    let key = key(family, map, key_bytes, value_of(find(&attrs, KEY_END)))?;
    let value = match find(&attrs, DATA) {
        None => Value::None,
        Some(data) if find(&attributes(data), 2).is_some() => {
            // A verdict: kpng's only verdict elements go to affinity chains.
            let verdict = attributes(find(&attributes(data), 2)?);
            let chain = cstring(find(&verdict, 2)?);
            Value::Affinity(u64::from_str_radix(chain.strip_prefix("aff_")?, 16).ok()?)
        }
        Some(data) => {
            let bytes = find(&attributes(data), 1)?;
            let at = if family == Family::V4 { 4 } else { 16 };
            Value::Endpoint(ip(family, bytes)?, port(bytes.get(at..)?)?)
        }
    };
    Some((key, value))
}

/// Every element of a dumped `NEWSETELEM` message payload.
pub fn elements(family: Family, map: MapName, payload: &[u8]) -> Vec<(Key, Value)> {
    const ELEMENTS: u16 = 3;
    const LIST_ELEM: u16 = 1;
    let attrs = attributes(payload);
    let Some(list) = find(&attrs, ELEMENTS) else { return Vec::new() };
    attributes(list)
        .into_iter()
        .filter(|(k, _)| *k == LIST_ELEM)
        .filter_map(|(_, e)| element(family, map, e))
        .collect()
}

/// The default timeout (seconds) of the set in a dumped `NEWSET` message payload.
pub fn set_timeout(payload: &[u8]) -> Option<u32> {
    const NFTA_SET_TIMEOUT: u16 = 11;
    let bytes = find(&attributes(payload), NFTA_SET_TIMEOUT)?;
    let ms = u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
    u32::try_from(ms / 1000).ok()
}

/// An affinity group's slot set name (`aff_<hash>_<slot>`) as `(hash, slot)`.
pub fn affinity_slot(name: &str) -> Option<(u64, u32)> {
    let rest = name.strip_prefix("aff_")?;
    let (hash, slot) = rest.split_once('_')?;
    Some((u64::from_str_radix(hash, 16).ok()?, slot.parse().ok()?))
}
