//! Netfilter netlink messages: an `nlmsghdr`, an `nfgenmsg`, then attributes; and a
//! [`Batch`], the messages of one nf_tables transaction between the batch markers, each
//! with a description for error reports.

use crate::attr;

/// Netlink protocol number of netfilter.
pub const NETLINK_NETFILTER: isize = 12;
/// Netlink protocol number of routing (links, addresses).
pub const NETLINK_ROUTE: isize = 0;

/// Length of `nlmsghdr`.
pub const NLMSG_HDRLEN: usize = 16;
/// Length of `nfgenmsg`.
pub const NFGENMSG_LEN: usize = 4;
/// `nlmsghdr` type of an error or acknowledgement.
pub const NLMSG_ERROR: u16 = 2;
/// `nlmsghdr` type ending a dump.
pub const NLMSG_DONE: u16 = 3;

/// `nlmsghdr` flag: a request.
pub const NLM_F_REQUEST: u16 = 0x1;
/// `nlmsghdr` flag: acknowledge the request.
pub const NLM_F_ACK: u16 = 0x4;
/// `nlmsghdr` flag: replace what exists.
pub const NLM_F_REPLACE: u16 = 0x100;
/// `nlmsghdr` flag: fail if the object exists.
pub const NLM_F_EXCL: u16 = 0x200;
/// `nlmsghdr` flag: create the object.
pub const NLM_F_CREATE: u16 = 0x400;
/// `nlmsghdr` flag: append (rules: at the end of the chain).
pub const NLM_F_APPEND: u16 = 0x800;
/// `nlmsghdr` flags of a dump request.
pub const NLM_F_DUMP: u16 = 0x300;

/// Netfilter subsystem: nf_tables.
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// Netfilter subsystem: conntrack.
pub const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;

/// A netfilter protocol family (`nfgenmsg.nfgen_family`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProtoFamily {
    /// `NFPROTO_UNSPEC`.
    Unspec,
    /// `NFPROTO_INET` (both IP families).
    Inet,
    /// `NFPROTO_IPV4`.
    Ipv4,
    /// `NFPROTO_IPV6`.
    Ipv6,
}

impl ProtoFamily {
    /// The number on the wire.
    pub fn number(self) -> u8 {
        match self {
            ProtoFamily::Unspec => 0,
            ProtoFamily::Inet => 1,
            ProtoFamily::Ipv4 => 2,
            ProtoFamily::Ipv6 => 10,
        }
    }

    /// The nft keyword (`ip`, `ip6`, `inet`).
    pub fn keyword(self) -> &'static str {
        match self {
            ProtoFamily::Unspec => "unspec",
            ProtoFamily::Inet => "inet",
            ProtoFamily::Ipv4 => "ip",
            ProtoFamily::Ipv6 => "ip6",
        }
    }
}

/// Writes a message header; returns where the message starts, for [`end_message`].
pub fn begin_message(
    buf: &mut Vec<u8>,
    kind: u16,
    flags: u16,
    seq: u32,
    family: ProtoFamily,
    res_id: u16,
) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&0u32.to_ne_bytes()); // length, patched in end_message()
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
    buf.push(family.number());
    buf.push(0); // NFNETLINK_V0
    buf.extend_from_slice(&res_id.to_be_bytes());
    start
}

/// Patches the length of the message that starts at `start`.
pub fn end_message(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

/// A request outside any batch (a dump, a conntrack request): header, then what `body`
/// writes.
pub fn request(
    subsystem: u16,
    msg: u16,
    flags: u16,
    family: ProtoFamily,
    body: impl FnOnce(&mut Vec<u8>),
) -> Vec<u8> {
    let mut buf = Vec::new();
    let start = begin_message(&mut buf, (subsystem << 8) | msg, flags, 0, family, 0);
    body(&mut buf);
    end_message(&mut buf, start);
    buf
}

/// One message of a received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received<'a> {
    /// `nlmsg_type`.
    pub kind: u16,
    /// `nlmsg_seq`.
    pub seq: u32,
    /// What follows the `nlmsghdr`.
    pub body: &'a [u8],
}

impl Received<'_> {
    /// The error code of an `NLMSG_ERROR` (0: an acknowledgement).
    pub fn error_code(&self) -> Option<i32> {
        (self.kind == NLMSG_ERROR)
            .then(|| self.body.get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]])))
            .flatten()
    }

    /// The attributes after the `nfgenmsg` of a netfilter message.
    pub fn netfilter_payload(&self) -> &[u8] {
        self.body.get(NFGENMSG_LEN..).unwrap_or_default()
    }
}

/// Splits a datagram into its messages. A truncated message ends the list.
pub fn messages(datagram: &[u8]) -> Vec<Received<'_>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + NLMSG_HDRLEN <= datagram.len() {
        let word = |i: usize| {
            u32::from_ne_bytes([datagram[i], datagram[i + 1], datagram[i + 2], datagram[i + 3]])
        };
        let len = word(at) as usize;
        if len < NLMSG_HDRLEN || at + len > datagram.len() {
            break;
        }
        out.push(Received {
            kind: u16::from_ne_bytes([datagram[at + 4], datagram[at + 5]]),
            seq: word(at + 8),
            body: &datagram[at + NLMSG_HDRLEN..at + len],
        });
        at += (len + 3) & !3;
    }
    out
}

/// The messages of one nf_tables transaction. The kernel applies all of them or none.
#[derive(Debug, Default)]
pub struct Batch {
    buf: Vec<u8>,
    seq: u32,
    /// `(sequence number, what the message does)` for every message but the markers.
    descriptions: Vec<(u32, String)>,
}

impl Batch {
    /// An empty batch whose sequence numbers start after `seq`.
    pub fn new(seq: u32) -> Self {
        let mut batch = Batch { buf: Vec::new(), seq, descriptions: Vec::new() };
        batch.marker(NFNL_MSG_BATCH_BEGIN);
        batch
    }

    fn marker(&mut self, kind: u16) {
        self.seq = self.seq.wrapping_add(1);
        let start = begin_message(
            &mut self.buf,
            kind,
            NLM_F_REQUEST,
            self.seq,
            ProtoFamily::Unspec,
            NFNL_SUBSYS_NFTABLES,
        );
        end_message(&mut self.buf, start);
    }

    /// Adds one nf_tables message of type `msg` with `flags` (request and ack are added),
    /// described as `what`, whose attributes `body` writes.
    pub fn message(
        &mut self,
        msg: u16,
        flags: u16,
        family: ProtoFamily,
        what: impl Into<String>,
        body: impl FnOnce(&mut Vec<u8>),
    ) {
        self.seq = self.seq.wrapping_add(1);
        let kind = (NFNL_SUBSYS_NFTABLES << 8) | msg;
        let flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        let start = begin_message(&mut self.buf, kind, flags, self.seq, family, 0);
        body(&mut self.buf);
        end_message(&mut self.buf, start);
        self.descriptions.push((self.seq, what.into()));
    }

    /// Bytes written so far in the current message's buffer (for splitting long lists).
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the batch holds no message besides its markers.
    pub fn is_empty(&self) -> bool {
        self.descriptions.is_empty()
    }

    /// How many messages (besides the markers) the batch holds.
    pub fn message_count(&self) -> usize {
        self.descriptions.len()
    }

    /// Closes the batch: its bytes, the last sequence number used, and the descriptions.
    pub fn finish(mut self) -> FinishedBatch {
        self.marker(NFNL_MSG_BATCH_END);
        FinishedBatch { bytes: self.buf, last_seq: self.seq, descriptions: self.descriptions }
    }
}

/// A closed batch, ready to send.
#[derive(Debug)]
pub struct FinishedBatch {
    /// The datagram.
    pub bytes: Vec<u8>,
    /// The sequence number of the end marker.
    pub last_seq: u32,
    /// `(sequence number, what the message does)` of every message but the markers.
    pub descriptions: Vec<(u32, String)>,
}

/// Appends a NUL-terminated string attribute (re-exported for message bodies).
pub use attr::put_str;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_framed_with_markers_and_sequence_numbers() {
        let mut batch = Batch::new(100);
        batch.message(2, 0, ProtoFamily::Ipv4, "delete table ip kpng", |b| {
            put_str(b, 1, "kpng");
        });
        let finished = batch.finish();
        let received = messages(&finished.bytes);
        let kinds: Vec<u16> = received.iter().map(|m| m.kind).collect();
        assert_eq!(kinds, [0x10, (NFNL_SUBSYS_NFTABLES << 8) | 2, 0x11]);
        let seqs: Vec<u32> = received.iter().map(|m| m.seq).collect();
        assert_eq!(seqs, [101, 102, 103]);
        assert_eq!(finished.last_seq, 103);
        assert_eq!(finished.descriptions, [(102, "delete table ip kpng".to_string())]);
        let attrs = attr::parse(received[1].netfilter_payload());
        assert_eq!(attr::string(attr::find(&attrs, 1).unwrap()), "kpng");
    }
}
