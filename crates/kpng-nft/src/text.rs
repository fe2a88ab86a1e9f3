//! Keys and elements in nft syntax: what the dry run prints and error reports quote.

use kpng_model::Protocol;

use crate::objects::{Key, Value, affinity_chain};

fn protocol(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

/// A key in nft syntax.
pub fn key_text(key: &Key) -> String {
    match key {
        Key::Addr(ip) => ip.to_string(),
        Key::Dest(d) => format!("{} . {} . {}", d.ip, protocol(d.protocol), d.port),
        Key::NodePort(p, port) => format!("{} . {port}", protocol(*p)),
        Key::DestSlot(d, slot) => {
            format!("{} . {} . {} . {slot}", d.ip, protocol(d.protocol), d.port)
        }
        Key::NodePortSlot(p, port, slot) => format!("{} . {port} . {slot}", protocol(*p)),
        Key::AddrPair(a, b) => format!("{a} . {b}"),
        Key::DestSource(d, net) => {
            format!("{} . {} . {} . {net}", d.ip, protocol(d.protocol), d.port)
        }
    }
}

/// One element in nft syntax: `key` or `key : value`.
pub fn element_text(key: &Key, value: &Value) -> String {
    match value {
        Value::None => key_text(key),
        Value::Endpoint(ip, port) => format!("{} : {ip} . {port}", key_text(key)),
        Value::Affinity(hash) => format!("{} : goto {}", key_text(key), affinity_chain(*hash)),
    }
}
