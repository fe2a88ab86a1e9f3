//! Element encodings compared with what `nft --debug=netlink` prints for the same
//! elements (words shown there in host order, here as the bytes they stand for).

use super::*;
use crate::objects::{Dest, Key};

fn dest(ip: &str, protocol: Protocol, port: u16) -> Dest {
    Dest { ip: ip.parse().unwrap(), protocol, port }
}

#[test]
fn concatenated_keys_use_one_register_slot_per_field() {
    // nft: element 0100600a 00000006 00005000 00000000
    let key = Key::DestSlot(dest("10.96.0.1", Protocol::Tcp, 80), 0);
    assert_eq!(key_bytes(&key, false), [10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0, 0, 0, 0, 0]);
    let key = Key::NodePortSlot(Protocol::Udp, 30053, 2);
    let mut expected = vec![17, 0, 0, 0, 0x75, 0x65, 0, 0];
    expected.extend_from_slice(&2u32.to_ne_bytes());
    assert_eq!(key_bytes(&key, false), expected);
}

#[test]
fn interval_keys_span_the_network() {
    // nft: element 04030201 00000006 00005000 0000000a - 04030201 00000006 00005000 ffffff0a
    let key = Key::DestSource(dest("1.2.3.4", Protocol::Tcp, 80), "10.0.0.0/8".parse().unwrap());
    assert_eq!(key_bytes(&key, false)[12..], [10, 0, 0, 0]);
    assert_eq!(key_bytes(&key, true)[12..], [10, 255, 255, 255]);
}

#[test]
fn batches_are_framed_and_split() {
    let mut batch = Batch::new(100);
    let elements: Vec<(ElementId, Value)> = (0..3000u32)
        .map(|i| {
            let id = ElementId {
                family: Family::V4,
                map: crate::objects::MapName::ClusterBackends,
                key: Key::DestSlot(dest("10.96.0.1", Protocol::Tcp, 80), i),
            };
            (id, Value::Endpoint("10.0.0.1".parse().unwrap(), 8080))
        })
        .collect();
    batch.elements(true, &elements);
    assert!(batch.messages.len() > 1, "3000 elements need more than one message");
    let (bytes, last, messages) = batch.finish();
    assert_eq!(last, 100 + 1 + messages.len() as u32 + 1);
    // Walk the messages: every length is consistent and every element list nest fits 16 bits.
    let mut at = 0;
    let mut count = 0;
    while at < bytes.len() {
        let len = u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        assert!(len >= 20 && at + len <= bytes.len());
        at += len;
        count += 1;
    }
    assert_eq!(count, messages.len() + 2, "begin, messages, end");
}
