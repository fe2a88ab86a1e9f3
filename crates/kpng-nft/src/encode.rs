//! A [`Plan`] as netlink messages: one nf_tables batch, with element keys and values as
//! the kernel lays them out. Concatenated keys put each field in its own 32-bit
//! register-sized slot: addresses and ports in network order, protocols as one byte, and
//! `numgen` results (slots) in host order.

use std::net::IpAddr;

use kpng_model::Protocol;
use kpng_netlink::Batch;
use kpng_netlink::nftables::messages::{ElementDataRef, ElementRef};
use kpng_netlink::nftables::objects::Table;

use crate::objects::{Dest, Key, TABLE, Value, affinity_chain, proto_family};
use crate::plan::{Command, Plan};
use crate::rules::protocol_number;
use crate::text::{element_text, key_text};

/// Appends the plan's commands to `batch`.
pub fn encode(plan: &Plan<'_>, batch: &mut Batch) {
    for (family, command) in &plan.commands {
        let table = Table { family: proto_family(*family), name: TABLE };
        match command {
            Command::AddTable => table.add(batch),
            Command::AddSet(decl) => table.add_set(batch, &decl.spec, batch_id(batch)),
            Command::FlushSet(name) => table.flush_set(batch, name),
            Command::DeleteSet(name) => table.delete_set(batch, name),
            Command::AddCtHelper(spec) => table.add_ct_helper(batch, spec),
            Command::DeleteCtHelper(name) => table.delete_ct_helper(batch, name),
            Command::AddChain(spec) => table.add_chain(batch, spec),
            Command::FlushChain(name) => table.flush_chain(batch, name),
            Command::DeleteChain(name) => table.delete_chain(batch, name),
            Command::AddRule { chain, rule } => {
                table.add_rule(batch, chain, &rule.exprs, &rule.text)
            }
            Command::Elements { add, map, elements } => {
                let describe = |(id, value): &(crate::objects::ElementId, Value)| {
                    if *add { element_text(&id.key, value) } else { key_text(&id.key) }
                };
                table.elements(
                    batch,
                    &map.name(),
                    *add,
                    elements.iter().copied(),
                    describe,
                    |e, sink| {
                        let (id, value) = e;
                        let key = key_bytes(&id.key, false);
                        let end =
                            matches!(id.key, Key::DestSource(..)).then(|| key_bytes(&id.key, true));
                        let data = value_bytes(value);
                        let chain = match value {
                            Value::Affinity(hash) => Some(affinity_chain(*hash)),
                            _ => None,
                        };
                        let data = match (&data, &chain) {
                            (_, Some(chain)) => Some(ElementDataRef::Goto(chain)),
                            (Some(bytes), None) => Some(ElementDataRef::Value(bytes)),
                            (None, None) => None,
                        };
                        let key_end = end.as_deref();
                        sink.put(&ElementRef { key: &key, key_end, data, ..ElementRef::default() });
                    },
                );
            }
        }
    }
}

/// A set id unique within the batch (the kernel wants one per new set).
fn batch_id(batch: &Batch) -> u32 {
    batch.message_count() as u32 + 1
}

/// A key or value as the kernel lays it out, built in place without allocating: a cold
/// start encodes half a million of them on the thread that then waits for the kernel. The
/// longest key (an IPv6 destination and source range) takes 40 bytes.
#[derive(Clone, Copy)]
pub struct Bytes {
    buf: [u8; 40],
    len: usize,
}

impl Bytes {
    fn new() -> Self {
        Bytes { buf: [0; 40], len: 0 }
    }

    fn put(mut self, bytes: &[u8]) -> Self {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
        self
    }

    fn ip(self, ip: &IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => self.put(&v4.octets()),
            IpAddr::V6(v6) => self.put(&v6.octets()),
        }
    }

    /// A port in network order, padded to a register slot.
    fn port(self, port: u16) -> Self {
        let [a, b] = port.to_be_bytes();
        self.put(&[a, b, 0, 0])
    }

    fn protocol(self, protocol: Protocol) -> Self {
        self.put(&[protocol_number(protocol), 0, 0, 0])
    }

    /// A `numgen` result, in host order.
    fn slot(self, slot: u32) -> Self {
        self.put(&slot.to_ne_bytes())
    }

    fn dest(self, dest: &Dest) -> Self {
        self.ip(&dest.ip).protocol(dest.protocol).port(dest.port)
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// The bytes of a key; for interval keys, `end` selects the last address of the range.
pub fn key_bytes(key: &Key, end: bool) -> Bytes {
    let bytes = Bytes::new();
    match key {
        Key::Addr(ip) => bytes.ip(ip),
        Key::Dest(dest) => bytes.dest(dest),
        Key::NodePort(protocol, port) => bytes.protocol(*protocol).port(*port),
        Key::DestSlot(dest, slot) => bytes.dest(dest).slot(*slot),
        Key::NodePortSlot(protocol, port, slot) => {
            bytes.protocol(*protocol).port(*port).slot(*slot)
        }
        Key::AddrPair(a, b) => bytes.ip(a).ip(b),
        Key::DestSource(dest, net) => {
            let ip: IpAddr = if end { net.broadcast() } else { net.network() };
            bytes.dest(dest).ip(&ip)
        }
    }
}

/// The bytes of a map value (`None` for set elements and verdicts).
pub fn value_bytes(value: &Value) -> Option<Bytes> {
    match value {
        Value::Endpoint(ip, port) => Some(Bytes::new().ip(ip).port(*port)),
        Value::None | Value::Affinity(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(ip: &str, protocol: Protocol, port: u16) -> Dest {
        Dest { ip: ip.parse().unwrap(), protocol, port }
    }

    #[test]
    fn concatenated_keys_use_one_register_slot_per_field() {
        // nft --debug=netlink: element 0100600a 00000006 00005000 00000000
        let key = Key::DestSlot(dest("10.96.0.1", Protocol::Tcp, 80), 0);
        assert_eq!(*key_bytes(&key, false), [10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0, 0, 0, 0, 0]);
        let key = Key::NodePortSlot(Protocol::Udp, 30053, 2);
        let mut expected = vec![17, 0, 0, 0, 0x75, 0x65, 0, 0];
        expected.extend_from_slice(&2u32.to_ne_bytes());
        assert_eq!(*key_bytes(&key, false), expected[..]);
    }

    #[test]
    fn the_longest_keys_fit() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let v6 = dest("2001:db8::1", Protocol::Sctp, 443);
        let key = Key::DestSource(v6, "2001:db8:1::/48".parse().unwrap());
        let end = key_bytes(&key, true);
        assert_eq!(end.len(), 40);
        assert_eq!(end[24..26], [0x20, 0x01]);
        assert_eq!(end[30..], [0xff; 10]);
        let pair = key_bytes(&Key::AddrPair(ip("2001:db8::1"), ip("2001:db8::2")), false);
        assert_eq!((pair.len(), pair[15], pair[31]), (32, 1, 2));
        let value = value_bytes(&Value::Endpoint(ip("2001:db8::9"), 8080)).unwrap();
        assert_eq!(value[15..], [9, 0x1f, 0x90, 0, 0]);
        assert!(value_bytes(&Value::None).is_none());
    }

    #[test]
    fn interval_keys_span_the_network() {
        // nft: element 04030201 00000006 00005000 0000000a - ... ffffff0a
        let key =
            Key::DestSource(dest("1.2.3.4", Protocol::Tcp, 80), "10.0.0.0/8".parse().unwrap());
        assert_eq!(key_bytes(&key, false)[12..], [10, 0, 0, 0]);
        assert_eq!(key_bytes(&key, true)[12..], [10, 255, 255, 255]);
    }
}
