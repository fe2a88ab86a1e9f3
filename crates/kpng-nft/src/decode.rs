//! What the kernel holds, read back into kpng's terms: dumped elements as keys and values
//! of kpng's sets. The inverse of [`crate::encode`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use kpng_model::{Family, Protocol};
use kpng_netlink::nftables::Verdict;
use kpng_netlink::nftables::messages::{ElementData, ElementMsg};

use crate::objects::{Dest, Key, KeyKind, MapName, Value};

fn ip(family: Family, bytes: &[u8]) -> Option<IpAddr> {
    match family {
        Family::V4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes.get(..4)?).ok()?))),
        Family::V6 => {
            Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes.get(..16)?).ok()?)))
        }
    }
}

fn addr_len(family: Family) -> usize {
    if family == Family::V4 { 4 } else { 16 }
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
    let a = addr_len(family);
    let d = Dest {
        ip: ip(family, bytes)?,
        protocol: protocol(*bytes.get(a)?)?,
        port: port(bytes.get(a + 4..)?)?,
    };
    Some((d, bytes.get(a + 8..)?))
}

fn nodeport(bytes: &[u8]) -> Option<(Protocol, u16)> {
    Some((protocol(*bytes.first()?)?, port(bytes.get(4..)?)?))
}

/// Decodes a key of `map` (and its interval end, for interval maps).
pub fn key(family: Family, map: MapName, bytes: &[u8], end: Option<&[u8]>) -> Option<Key> {
    Some(match map.key_kind() {
        KeyKind::Addr => Key::Addr(ip(family, bytes)?),
        KeyKind::Dest => Key::Dest(dest(family, bytes)?.0),
        KeyKind::NodePort => {
            let (p, n) = nodeport(bytes)?;
            Key::NodePort(p, n)
        }
        KeyKind::DestSlot => {
            let (d, rest) = dest(family, bytes)?;
            Key::DestSlot(d, slot(rest)?)
        }
        KeyKind::NodePortSlot => {
            let (p, n) = nodeport(bytes)?;
            Key::NodePortSlot(p, n, slot(bytes.get(8..)?)?)
        }
        KeyKind::AddrPair => {
            Key::AddrPair(ip(family, bytes)?, ip(family, bytes.get(addr_len(family)..)?)?)
        }
        KeyKind::DestSource => {
            let (d, start) = dest(family, bytes)?;
            let (_, last) = dest(family, end?)?;
            let (start, last) = (ip(family, start)?, ip(family, last)?);
            let max = if family == Family::V4 { 32 } else { 128 };
            let net = (0..=max)
                .filter_map(|len| IpNet::new(start, len).ok())
                .find(|n| n.network() == start && n.broadcast() == last)?;
            Key::DestSource(d, net)
        }
    })
}

/// Decodes one dumped element of `map`.
pub fn element(family: Family, map: MapName, element: &ElementMsg) -> Option<(Key, Value)> {
    let key = key(family, map, &element.key, element.key_end.as_deref())?;
    let value = match &element.data {
        // kpng's only verdict elements go to affinity chains.
        Some(ElementData::Verdict(Verdict::Goto(chain))) => {
            Value::Affinity(u64::from_str_radix(chain.strip_prefix("aff_")?, 16).ok()?)
        }
        Some(ElementData::Verdict(_)) => return None,
        Some(ElementData::Value(bytes)) => {
            Value::Endpoint(ip(family, bytes)?, port(bytes.get(addr_len(family)..)?)?)
        }
        None => Value::None,
    };
    Some((key, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::{key_bytes, value_bytes};
    use crate::objects::PickKind;

    #[test]
    fn keys_and_values_round_trip() {
        let d = Dest { ip: "fd00::1".parse().unwrap(), protocol: Protocol::Sctp, port: 80 };
        let cases = [
            (MapName::ClusterIps, Key::Addr("fd00::9".parse().unwrap()), Value::None),
            (MapName::Bit(PickKind::Cluster, 3), Key::Dest(d), Value::None),
            (MapName::NodePortLocalDests, Key::NodePort(Protocol::Udp, 30053), Value::None),
            (
                MapName::Backends(PickKind::Local, 3),
                Key::DestSlot(d, 7),
                Value::Endpoint("fd00::2".parse().unwrap(), 8080),
            ),
            (
                MapName::Hairpin,
                Key::AddrPair("fd00::2".parse().unwrap(), "fd00::2".parse().unwrap()),
                Value::None,
            ),
            (
                MapName::FirewallAllow,
                Key::DestSource(d, "fd00:1::/64".parse().unwrap()),
                Value::None,
            ),
        ];
        for (map, key, value) in cases {
            let dumped = ElementMsg {
                key: key_bytes(&key, false).to_vec(),
                key_end: matches!(key, Key::DestSource(..)).then(|| key_bytes(&key, true).to_vec()),
                data: value_bytes(&value).map(|v| ElementData::Value(v.to_vec())),
                ..ElementMsg::default()
            };
            assert_eq!(element(Family::V6, map, &dumped), Some((key, value)), "{map}");
        }
    }
}
