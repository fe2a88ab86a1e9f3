//! Chain names: the fixed chains, and stable names for per-service and per-endpoint chains
//! made from a hash of what they stand for (so a restart finds the same names).
//!
//! The hashed names use encoding version 1: FNV-1a 64 of
//! `v1|<family>|<namespace>/<name>|<port name>|<protocol>` (and `|<endpoint ip>|<port>` for
//! endpoint chains), written as 13 base-32 digits. A change of encoding must change the
//! version, so that old and new chains never share a name.

use std::fmt;
use std::net::IpAddr;

use kpng_model::hash::fnv1a64;
use kpng_model::{Family, Protocol, ServiceKey};

/// Every chain kpng owns starts so; nothing else is ever touched.
pub const PREFIX: &str = "KPNG-";

/// The longest chain name iptables accepts.
pub const MAX_LEN: usize = 28;

/// A chain kpng owns: `KPNG-` and at most 23 more of `A-Z 0-9 -`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChainName(String);

/// A name that is not one of kpng's chains.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a kpng chain name (KPNG-, then up to 23 of A-Z, 0-9 and -)")]
pub struct NotKpngChain(pub String);

impl ChainName {
    /// `name` if it is one of kpng's chain names.
    pub fn new(name: &str) -> Result<ChainName, NotKpngChain> {
        let ok = name.starts_with(PREFIX)
            && name.len() <= MAX_LEN
            && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'-');
        match ok {
            true => Ok(ChainName(name.to_string())),
            false => Err(NotKpngChain(name.to_string())),
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn fixed(name: &'static str) -> ChainName {
        // The fixed names below are valid: checked by a test.
        ChainName(name.to_string())
    }
}

impl fmt::Display for ChainName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// nat: entered from PREROUTING and OUTPUT; dispatches by destination.
pub fn services() -> ChainName {
    ChainName::fixed("KPNG-SERVICES")
}
/// nat and filter: NodePorts, entered for the node's NodePort addresses.
pub fn nodeports() -> ChainName {
    ChainName::fixed("KPNG-NODEPORTS")
}
/// nat: entered from POSTROUTING; masquerades marked packets.
pub fn postrouting() -> ChainName {
    ChainName::fixed("KPNG-POSTROUTING")
}
/// nat: sets the masquerade bit.
pub fn mark_masq() -> ChainName {
    ChainName::fixed("KPNG-MARK-MASQ")
}
/// nat: sets the drop bit (loadBalancerSourceRanges).
pub fn mark_drop() -> ChainName {
    ChainName::fixed("KPNG-MARK-DROP")
}
/// nat: sets the masquerade bit unless the packet comes from a local pod.
pub fn masq_unless_pod() -> ChainName {
    ChainName::fixed("KPNG-MASQ-UNLESS-POD")
}
/// filter: entered from INPUT, FORWARD and OUTPUT for new connections.
pub fn filter() -> ChainName {
    ChainName::fixed("KPNG-FILTER")
}

/// The fixed chains: those the built-in chains jump to, and the helpers every service's
/// rules use. A flushed table empties them first.
pub fn entry_chains() -> [ChainName; 7] {
    [services(), nodeports(), postrouting(), mark_masq(), mark_drop(), masq_unless_pod(), filter()]
}

/// A first-level shard of the destination dispatch (low 4 bits of the address).
pub fn shard1(prefix: &str, nibble: u8) -> ChainName {
    ChainName(format!("{PREFIX}{prefix}-{nibble:X}"))
}

/// A leaf shard of the destination dispatch (low 8 bits of the address).
pub fn shard2(prefix: &str, byte: u8) -> ChainName {
    ChainName(format!("{PREFIX}{prefix}-{byte:02X}"))
}

/// A NodePort bucket: 64 ports of one protocol.
pub fn nodeport_bucket(prefix: &str, protocol: Protocol, bucket: u16) -> ChainName {
    ChainName(format!("{PREFIX}{prefix}-{}-{bucket}", protocol.as_str()))
}

/// What a per-service-port chain does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortChain {
    /// Picks among the Cluster set.
    Svc,
    /// Picks among the Local set.
    Svl,
    /// External destinations: masquerading, and the externalTrafficPolicy Local choice.
    Ext,
    /// loadBalancerSourceRanges.
    Fw,
}

impl PortChain {
    fn tag(self) -> &'static str {
        match self {
            PortChain::Svc => "SVC",
            PortChain::Svl => "SVL",
            PortChain::Ext => "EXT",
            PortChain::Fw => "FW",
        }
    }
}

fn base32(mut h: u64) -> String {
    const DIGITS: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    (0..13)
        .map(|_| {
            let d = DIGITS[(h & 31) as usize];
            h >>= 5;
            d as char
        })
        .collect()
}

fn port_identity(family: Family, service: &ServiceKey, port: &str, protocol: Protocol) -> String {
    format!("v1|{family}|{}/{}|{port}|{}", service.namespace(), service.name(), protocol.as_str())
}

/// The chain of `kind` for one service port in one family.
pub fn port_chain(
    kind: PortChain,
    family: Family,
    service: &ServiceKey,
    port: &str,
    protocol: Protocol,
) -> ChainName {
    let hash = fnv1a64(port_identity(family, service, port, protocol).as_bytes());
    ChainName(format!("{PREFIX}{}-{}", kind.tag(), base32(hash)))
}

/// The chain of one endpoint of one service port.
pub fn endpoint_chain(
    service: &ServiceKey,
    port: &str,
    protocol: Protocol,
    ip: IpAddr,
    target_port: u16,
) -> ChainName {
    let identity =
        format!("{}|{ip}|{target_port}", port_identity(Family::of(&ip), service, port, protocol));
    ChainName(format!("{PREFIX}SEP-{}", base32(fnv1a64(identity.as_bytes()))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_a_valid_kpng_chain() {
        let key = ServiceKey::new("a-very-long-namespace-name", "and-a-long-service-name");
        let names = [
            services(),
            nodeports(),
            postrouting(),
            mark_masq(),
            mark_drop(),
            masq_unless_pod(),
            filter(),
            shard1("SH", 15),
            shard2("FSH", 255),
            nodeport_bucket("FNP", Protocol::Sctp, 1023),
            port_chain(PortChain::Ext, Family::V6, &key, "https", Protocol::Sctp),
            endpoint_chain(&key, "https", Protocol::Tcp, "fd00::1".parse().unwrap(), 8443),
        ];
        for name in names {
            assert_eq!(ChainName::new(name.as_str()), Ok(name.clone()), "{name}");
        }
        assert!(ChainName::new("KUBE-SERVICES").is_err());
        assert!(ChainName::new("KPNG-lower").is_err());
    }

    #[test]
    fn hashed_names_are_stable_and_distinct() {
        let key = ServiceKey::new("shop", "web");
        let svc = port_chain(PortChain::Svc, Family::V4, &key, "http", Protocol::Tcp);
        // Version 1 of the encoding: this value must never change.
        let shop = ServiceKey::new("shop", "web");
        let pinned = port_chain(PortChain::Svc, Family::V4, &shop, "http", Protocol::Tcp);
        assert_eq!(pinned.as_str(), "KPNG-SVC-HB5TYTUADGHVJ");
        assert_ne!(svc, port_chain(PortChain::Svc, Family::V4, &key, "http", Protocol::Udp));
        assert_ne!(svc, port_chain(PortChain::Svc, Family::V6, &key, "http", Protocol::Tcp));
        assert!(svc.as_str().starts_with("KPNG-SVC-"));
    }
}
