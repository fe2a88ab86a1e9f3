//! Conntrack over netlink (`ctnetlink`): dump the UDP entries towards a destination, and
//! delete entries by their original tuple. Bytes only; the socket carries them.

use std::net::{IpAddr, SocketAddr};

use crate::attr;
use crate::message::ProtoFamily;
use crate::message::{NFGENMSG_LEN, NFNL_SUBSYS_CTNETLINK, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};

const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_ZONE: u16 = 18;
const CTA_FILTER: u16 = 25;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const CTA_FILTER_REPLY_FLAGS: u16 = 2;
const FILTER_IP_DST: u32 = 1 << 1;
const FILTER_PROTO_NUM: u32 = 1 << 3;
const FILTER_PROTO_DST_PORT: u32 = 1 << 5;

/// IP protocol number of UDP.
pub const UDP: u8 = 17;

/// One conntrack entry, as far as cleanup cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entry {
    /// Original direction source.
    pub orig_src: SocketAddr,
    /// Original direction destination: the service address the client used.
    pub orig_dst: SocketAddr,
    /// Reply direction source: the endpoint that answers (the service itself if no DNAT).
    pub reply_src: SocketAddr,
    /// Conntrack zone.
    pub zone: u16,
}

fn family_of(ip: IpAddr) -> ProtoFamily {
    match ip {
        IpAddr::V4(_) => ProtoFamily::Ipv4,
        IpAddr::V6(_) => ProtoFamily::Ipv6,
    }
}

fn put_ip(buf: &mut Vec<u8>, ip: IpAddr, v4: u16, v6: u16) {
    match ip {
        IpAddr::V4(a) => attr::put(buf, v4, &a.octets()),
        IpAddr::V6(a) => attr::put(buf, v6, &a.octets()),
    }
}

/// A UDP tuple with the given fields (absent ones left out).
fn tuple(
    buf: &mut Vec<u8>,
    kind: u16,
    src: Option<SocketAddr>,
    dst_ip: Option<IpAddr>,
    dst_port: Option<u16>,
) {
    attr::nested(buf, kind, |b| {
        attr::nested(b, CTA_TUPLE_IP, |b| {
            if let Some(src) = src {
                put_ip(b, src.ip(), CTA_IP_V4_SRC, CTA_IP_V6_SRC);
            }
            if let Some(ip) = dst_ip {
                put_ip(b, ip, CTA_IP_V4_DST, CTA_IP_V6_DST);
            }
        });
        attr::nested(b, CTA_TUPLE_PROTO, |b| {
            attr::put(b, CTA_PROTO_NUM, &[UDP]);
            if let Some(src) = src {
                attr::put(b, CTA_PROTO_SRC_PORT, &src.port().to_be_bytes());
            }
            if let Some(port) = dst_port {
                attr::put(b, CTA_PROTO_DST_PORT, &port.to_be_bytes());
            }
        });
    });
}

/// A dump of the UDP entries of `family`, filtered in the kernel to an original
/// destination port (when given) and address (when given with a port).
pub fn dump_udp(family: ProtoFamily, ip: Option<IpAddr>, port: Option<u16>) -> Vec<u8> {
    let flags = NLM_F_REQUEST | NLM_F_DUMP;
    crate::message::request(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_GET, flags, family, |b| {
        let ip = ip.filter(|_| port.is_some());
        tuple(b, CTA_TUPLE_ORIG, None, ip, port);
        let mut filter = FILTER_PROTO_NUM;
        if port.is_some() {
            filter |= FILTER_PROTO_DST_PORT;
        }
        if ip.is_some() {
            filter |= FILTER_IP_DST;
        }
        attr::nested(b, CTA_FILTER, |b| {
            attr::put(b, CTA_FILTER_ORIG_FLAGS, &filter.to_ne_bytes());
            attr::put(b, CTA_FILTER_REPLY_FLAGS, &0u32.to_ne_bytes());
        });
    })
}

/// Deletes one entry by its original tuple (acknowledged).
pub fn delete(entry: &Entry) -> Vec<u8> {
    let family = family_of(entry.orig_src.ip());
    let flags = NLM_F_REQUEST | NLM_F_ACK;
    crate::message::request(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_DELETE, flags, family, |b| {
        let dst = entry.orig_dst;
        tuple(b, CTA_TUPLE_ORIG, Some(entry.orig_src), Some(dst.ip()), Some(dst.port()));
        if entry.zone != 0 {
            attr::put(b, CTA_ZONE, &entry.zone.to_be_bytes());
        }
    })
}

fn decode_tuple(payload: &[u8]) -> Option<(SocketAddr, SocketAddr, u8)> {
    let attrs = attr::parse(payload);
    let ips = attr::parse(attr::find(&attrs, CTA_TUPLE_IP)?);
    let proto = attr::parse(attr::find(&attrs, CTA_TUPLE_PROTO)?);
    let ip = |v4: u16, v6: u16| -> Option<IpAddr> {
        if let Some(b) = attr::find(&ips, v4) {
            return Some(IpAddr::from(<[u8; 4]>::try_from(b.get(..4)?).ok()?));
        }
        let b = attr::find(&ips, v6)?;
        Some(IpAddr::from(<[u8; 16]>::try_from(b.get(..16)?).ok()?))
    };
    let port = |k: u16| -> Option<u16> {
        let b = attr::find(&proto, k)?;
        Some(u16::from_be_bytes([*b.first()?, *b.get(1)?]))
    };
    let number = *attr::find(&proto, CTA_PROTO_NUM)?.first()?;
    let src = SocketAddr::new(ip(CTA_IP_V4_SRC, CTA_IP_V6_SRC)?, port(CTA_PROTO_SRC_PORT)?);
    let dst = SocketAddr::new(ip(CTA_IP_V4_DST, CTA_IP_V6_DST)?, port(CTA_PROTO_DST_PORT)?);
    Some((src, dst, number))
}

/// The UDP entry in a dumped message body (as the socket's dump returns it).
pub fn entry(body: &[u8]) -> Option<Entry> {
    let attrs = attr::parse(body.get(NFGENMSG_LEN..)?);
    let orig = decode_tuple(attr::find(&attrs, CTA_TUPLE_ORIG)?)?;
    let reply = decode_tuple(attr::find(&attrs, CTA_TUPLE_REPLY)?)?;
    if orig.2 != UDP {
        return None;
    }
    let zone = attr::find(&attrs, CTA_ZONE)
        .and_then(|v| Some(u16::from_be_bytes([*v.first()?, *v.get(1)?])))
        .unwrap_or(0);
    Some(Entry { orig_src: orig.0, orig_dst: orig.1, reply_src: reply.0, zone })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_entry_decodes_back() {
        let entry = Entry {
            orig_src: "10.244.0.9:4000".parse().unwrap(),
            orig_dst: "10.96.0.10:53".parse().unwrap(),
            reply_src: "10.96.0.10:53".parse().unwrap(),
            zone: 3,
        };
        // A dump answer carries both tuples; build one from the delete's original tuple.
        let request = delete(&entry);
        let mut body = request[16..].to_vec();
        let reply_tuple = {
            let mut b = Vec::new();
            tuple(
                &mut b,
                CTA_TUPLE_REPLY,
                Some(entry.reply_src),
                Some(entry.orig_src.ip()),
                Some(4000),
            );
            b
        };
        body.extend_from_slice(&reply_tuple);
        assert_eq!(super::entry(&body), Some(entry));
    }
}
