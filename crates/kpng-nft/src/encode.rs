//! A [`Plan`] as netlink messages: one nf_tables batch, with element keys and values as
//! the kernel lays them out. Concatenated keys put each field in its own 32-bit
//! register-sized slot: addresses and ports in network order, protocols as one byte, and
//! `numgen` results (slots) in host order.

use std::net::IpAddr;

use kpng_model::Protocol;
use kpng_netlink::Batch;
use kpng_netlink::nftables::objects::{Element, ElementData, Table};

use crate::objects::{Dest, Key, TABLE, Value, affinity_chain, proto_family};
use crate::plan::{Command, Plan};
use crate::rules::{ip_bytes, protocol_number};
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
                table.elements(batch, &map.name(), *add, elements.iter(), describe, |e, sink| {
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
                        (_, Some(chain)) => ElementData::Goto(chain),
                        (Some(bytes), None) => ElementData::Value(bytes),
                        (None, None) => ElementData::None,
                    };
                    sink.put(&Element { key: &key, key_end: end.as_deref(), data, flags: 0 });
                });
            }
        }
    }
}

/// A set id unique within the batch (the kernel wants one per new set).
fn batch_id(batch: &Batch) -> u32 {
    batch.message_count() as u32 + 1
}

/// A port in network order, padded to a register slot.
fn port_bytes(port: u16) -> [u8; 4] {
    let [a, b] = port.to_be_bytes();
    [a, b, 0, 0]
}

fn proto_bytes(protocol: Protocol) -> [u8; 4] {
    [protocol_number(protocol), 0, 0, 0]
}

fn dest_bytes(dest: &Dest) -> Vec<u8> {
    let mut bytes = ip_bytes(&dest.ip);
    bytes.extend_from_slice(&proto_bytes(dest.protocol));
    bytes.extend_from_slice(&port_bytes(dest.port));
    bytes
}

/// The bytes of a key; for interval keys, `end` selects the last address of the range.
pub fn key_bytes(key: &Key, end: bool) -> Vec<u8> {
    match key {
        Key::Addr(ip) => ip_bytes(ip),
        Key::Dest(dest) => dest_bytes(dest),
        Key::NodePort(protocol, port) => [proto_bytes(*protocol), port_bytes(*port)].concat(),
        Key::DestSlot(dest, slot) => {
            let mut bytes = dest_bytes(dest);
            bytes.extend_from_slice(&slot.to_ne_bytes());
            bytes
        }
        Key::NodePortSlot(protocol, port, slot) => {
            [proto_bytes(*protocol), port_bytes(*port), slot.to_ne_bytes()].concat()
        }
        Key::AddrPair(a, b) => [ip_bytes(a), ip_bytes(b)].concat(),
        Key::DestSource(dest, net) => {
            let mut bytes = dest_bytes(dest);
            let ip: IpAddr = if end { net.broadcast() } else { net.network() };
            bytes.extend_from_slice(&ip_bytes(&ip));
            bytes
        }
    }
}

/// The bytes of a map value (`None` for set elements and verdicts).
pub fn value_bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::Endpoint(ip, port) => {
            let mut bytes = ip_bytes(ip);
            bytes.extend_from_slice(&port_bytes(*port));
            Some(bytes)
        }
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
        assert_eq!(key_bytes(&key, false), [10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0, 0, 0, 0, 0]);
        let key = Key::NodePortSlot(Protocol::Udp, 30053, 2);
        let mut expected = vec![17, 0, 0, 0, 0x75, 0x65, 0, 0];
        expected.extend_from_slice(&2u32.to_ne_bytes());
        assert_eq!(key_bytes(&key, false), expected);
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
