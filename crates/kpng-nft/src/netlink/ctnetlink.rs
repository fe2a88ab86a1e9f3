//! Conntrack over netlink (`ctnetlink`): dump UDP entries towards one destination, and
//! delete entries by their original tuple. Bytes only; the socket carries them.

use std::net::{IpAddr, SocketAddr};

use kpng_model::Family;

use super::decode::attributes;

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;

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

struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn header(kind: u16, flags: u16, family: Family, seq: u32) -> Writer {
        let mut buf = Vec::new();
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | kind).to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.push(match family {
            Family::V4 => 2,
            Family::V6 => 10,
        });
        buf.push(0);
        buf.extend_from_slice(&0u16.to_be_bytes());
        Writer { buf }
    }

    fn attr(&mut self, kind: u16, payload: &[u8]) {
        super::attr::put(&mut self.buf, kind, payload);
    }

    fn nest(&mut self, kind: u16) -> usize {
        super::attr::open(&mut self.buf, kind)
    }

    fn nest_end(&mut self, start: usize) {
        super::attr::close(&mut self.buf, start);
    }

    fn finish(mut self) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[..4].copy_from_slice(&len.to_ne_bytes());
        self.buf
    }

    /// A tuple with the given fields (absent ones left out).
    fn tuple(
        &mut self,
        kind: u16,
        src: Option<SocketAddr>,
        dst: Option<(IpAddr, u16)>,
        dst_port: Option<u16>,
    ) {
        let tuple = self.nest(kind);
        let ips = self.nest(CTA_TUPLE_IP);
        let put_ip = |w: &mut Writer, ip: IpAddr, v4: u16, v6: u16| match ip {
            IpAddr::V4(a) => w.attr(v4, &a.octets()),
            IpAddr::V6(a) => w.attr(v6, &a.octets()),
        };
        if let Some(src) = src {
            put_ip(self, src.ip(), CTA_IP_V4_SRC, CTA_IP_V6_SRC);
        }
        if let Some((ip, _)) = dst {
            put_ip(self, ip, CTA_IP_V4_DST, CTA_IP_V6_DST);
        }
        self.nest_end(ips);
        let proto = self.nest(CTA_TUPLE_PROTO);
        self.attr(CTA_PROTO_NUM, &[UDP]);
        if let Some(src) = src {
            self.attr(CTA_PROTO_SRC_PORT, &src.port().to_be_bytes());
        }
        if let Some(port) = dst.map(|(_, p)| p).or(dst_port) {
            self.attr(CTA_PROTO_DST_PORT, &port.to_be_bytes());
        }
        self.nest_end(proto);
        self.nest_end(tuple);
    }
}

/// A dump of the UDP entries of `family`, filtered in the kernel to an original
/// destination port (when given) and address (when given with a port).
pub fn dump_udp(seq: u32, family: Family, ip: Option<IpAddr>, port: Option<u16>) -> Vec<u8> {
    let mut w = Writer::header(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, family, seq);
    let dst = ip.zip(port);
    w.tuple(CTA_TUPLE_ORIG, None, dst, port);
    let filter = w.nest(CTA_FILTER);
    let mut flags = FILTER_PROTO_NUM;
    if port.is_some() {
        flags |= FILTER_PROTO_DST_PORT;
    }
    if dst.is_some() {
        flags |= FILTER_IP_DST;
    }
    w.attr(CTA_FILTER_ORIG_FLAGS, &flags.to_ne_bytes());
    w.attr(CTA_FILTER_REPLY_FLAGS, &0u32.to_ne_bytes());
    w.nest_end(filter);
    w.finish()
}

/// Deletes one entry by its original tuple.
pub fn delete(seq: u32, entry: &Entry) -> Vec<u8> {
    let family = Family::of(&entry.orig_src.ip());
    let mut w = Writer::header(IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, family, seq);
    w.tuple(
        CTA_TUPLE_ORIG,
        Some(entry.orig_src),
        Some((entry.orig_dst.ip(), entry.orig_dst.port())),
        None,
    );
    if entry.zone != 0 {
        w.attr(CTA_ZONE, &entry.zone.to_be_bytes());
    }
    w.finish()
}

fn tuple(payload: &[u8]) -> Option<(SocketAddr, SocketAddr, u8)> {
    let attrs = attributes(payload);
    let find =
        |a: &[(u16, &[u8])], k: u16| a.iter().find(|(t, _)| *t == k).map(|(_, v)| v.to_vec());
    let ips = attributes(attrs.iter().find(|(t, _)| *t == CTA_TUPLE_IP)?.1);
    let proto = attributes(attrs.iter().find(|(t, _)| *t == CTA_TUPLE_PROTO)?.1);
    let ip = |v4: u16, v6: u16| -> Option<IpAddr> {
        if let Some(b) = find(&ips, v4) {
            return Some(IpAddr::from(<[u8; 4]>::try_from(b.get(..4)?).ok()?));
        }
        let b = find(&ips, v6)?;
        Some(IpAddr::from(<[u8; 16]>::try_from(b.get(..16)?).ok()?))
    };
    let port = |k: u16| -> Option<u16> {
        let b = find(&proto, k)?;
        Some(u16::from_be_bytes([*b.first()?, *b.get(1)?]))
    };
    let number = *find(&proto, CTA_PROTO_NUM)?.first()?;
    let src = SocketAddr::new(ip(CTA_IP_V4_SRC, CTA_IP_V6_SRC)?, port(CTA_PROTO_SRC_PORT)?);
    let dst = SocketAddr::new(ip(CTA_IP_V4_DST, CTA_IP_V6_DST)?, port(CTA_PROTO_DST_PORT)?);
    Some((src, dst, number))
}

/// The UDP entry in a dumped message payload (after the `nfgenmsg`).
pub fn entry(payload: &[u8]) -> Option<Entry> {
    let attrs = attributes(payload);
    let orig = tuple(attrs.iter().find(|(t, _)| *t == CTA_TUPLE_ORIG)?.1)?;
    let reply = tuple(attrs.iter().find(|(t, _)| *t == CTA_TUPLE_REPLY)?.1)?;
    if orig.2 != UDP {
        return None;
    }
    let zone = attrs
        .iter()
        .find(|(t, _)| *t == CTA_ZONE)
        .and_then(|(_, v)| Some(u16::from_be_bytes([*v.first()?, *v.get(1)?])))
        .unwrap_or(0);
    Some(Entry { orig_src: orig.0, orig_dst: orig.1, reply_src: reply.0, zone })
}
