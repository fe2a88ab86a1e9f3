//! IP families, transport protocols, and parsing of addresses as Kubernetes accepts them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// An IP family. Each family is proxied on its own: a dual-stack Service is two services,
/// one per family, that share ports and policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Family {
    /// IPv4.
    #[serde(rename = "IPv4")]
    V4,
    /// IPv6.
    #[serde(rename = "IPv6")]
    V6,
}

impl Family {
    /// Both families, IPv4 first.
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The family of an address.
    pub fn of(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// The family of a network.
    pub fn of_net(net: &IpNet) -> Family {
        match net {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// One value per IP family.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct PerFamily<T> {
    /// The IPv4 value.
    pub v4: T,
    /// The IPv6 value.
    pub v6: T,
}

impl<T> PerFamily<T> {
    /// The value for `family`.
    pub fn get(&self, family: Family) -> &T {
        match family {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }

    /// The value for `family`, mutably.
    pub fn get_mut(&mut self, family: Family) -> &mut T {
        match family {
            Family::V4 => &mut self.v4,
            Family::V6 => &mut self.v6,
        }
    }
}

/// A transport protocol a service port can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Protocol {
    /// TCP.
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP.
    #[serde(rename = "UDP")]
    Udp,
    /// SCTP.
    #[serde(rename = "SCTP")]
    Sctp,
}

impl Protocol {
    /// The Kubernetes spelling: `TCP`, `UDP` or `SCTP`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A protocol name Kubernetes does not define.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown protocol {0:?} (expected TCP, UDP or SCTP)")]
pub struct UnknownProtocol(pub String);

impl FromStr for Protocol {
    type Err = UnknownProtocol;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "TCP" => Ok(Protocol::Tcp),
            "UDP" => Ok(Protocol::Udp),
            "SCTP" => Ok(Protocol::Sctp),
            other => Err(UnknownProtocol(other.to_string())),
        }
    }
}

/// Text that is not an IP address or network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Not an IP address.
    #[error("invalid IP address {0:?}")]
    Ip(String),
    /// Not a network in CIDR notation.
    #[error("invalid CIDR {0:?}")]
    Cidr(String),
}

/// Parses an IP address the way Kubernetes' API validation accepted it for years: IPv4
/// octets may carry leading zeros and are read as decimal (`172.30.0.041` is
/// `172.30.0.41`), and IPv4-mapped IPv6 addresses are IPv4. Surrounding spaces are trimmed.
pub fn parse_ip(text: &str) -> Result<IpAddr, AddressError> {
    let trimmed = text.trim();
    if let Ok(ip) = trimmed.parse::<IpAddr>() {
        return Ok(ip.to_canonical());
    }
    parse_ipv4_leading_zeros(trimmed)
        .map(IpAddr::V4)
        .ok_or_else(|| AddressError::Ip(text.to_string()))
}

fn parse_ipv4_leading_zeros(text: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = text.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    parts.next().is_none().then_some(Ipv4Addr::from(octets))
}

/// Parses a network in CIDR notation with the same leniency as [`parse_ip`]; host bits are
/// cleared (`10.1.2.3/8` is `10.0.0.0/8`), as the kernel would match it.
pub fn parse_cidr(text: &str) -> Result<IpNet, AddressError> {
    let trimmed = text.trim();
    let error = || AddressError::Cidr(text.to_string());
    let (addr, len) = trimmed.split_once('/').ok_or_else(error)?;
    let addr = parse_ip(addr).map_err(|_| error())?;
    let len: u8 = len.parse().map_err(|_| error())?;
    IpNet::new(addr, len).map(|net| net.trunc()).map_err(|_| error())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_zeros_are_decimal() {
        assert_eq!(parse_ip("172.30.0.041").unwrap(), "172.30.0.41".parse::<IpAddr>().unwrap());
        assert_eq!(parse_ip(" 010.000.000.001 ").unwrap(), "10.0.0.1".parse::<IpAddr>().unwrap());
        assert!(parse_ip("1.2.3.256").is_err());
        assert!(parse_ip("1.2.3").is_err());
        assert!(parse_ip("1.2.3.4.5").is_err());
        assert!(parse_ip("nope").is_err());
    }

    #[test]
    fn mapped_ipv6_is_ipv4() {
        assert_eq!(parse_ip("::ffff:1.2.3.4").unwrap(), "1.2.3.4".parse::<IpAddr>().unwrap());
        assert_eq!(Family::of(&parse_ip("fd00::1").unwrap()), Family::V6);
    }

    #[test]
    fn cidrs_are_trimmed_and_truncated() {
        assert_eq!(parse_cidr(" 10.1.2.3/8 ").unwrap(), "10.0.0.0/8".parse::<IpNet>().unwrap());
        assert_eq!(
            parse_cidr("192.168.001.0/24").unwrap(),
            "192.168.1.0/24".parse::<IpNet>().unwrap()
        );
        assert!(parse_cidr("10.0.0.0/33").is_err());
        assert!(parse_cidr("10.0.0.0").is_err());
    }

    #[test]
    fn protocols_round_trip() {
        for p in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
            assert_eq!(p.as_str().parse::<Protocol>().unwrap(), p);
        }
        assert!("ICMP".parse::<Protocol>().is_err());
    }
}
