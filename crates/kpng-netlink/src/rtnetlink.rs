//! The network namespace's addresses: listed, and watched through route netlink address
//! notifications, so that whatever depends on them (NodePorts on `--nodeport-addresses`
//! CIDRs) follows an address added or removed at once. And its interfaces and neighbour
//! table, for what must address endpoints by their link-layer address (direct server
//! return through nftlb).

use std::net::IpAddr;

use crate::attr;
use crate::message::{NETLINK_ROUTE, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_HDRLEN, messages};
use crate::socket::{NetlinkError, NetlinkSocket};

/// `RTNLGRP_IPV4_IFADDR`.
const GROUP_IPV4_ADDRESSES: u32 = 5;
/// `RTNLGRP_IPV6_IFADDR`.
const GROUP_IPV6_ADDRESSES: u32 = 9;
/// `RTM_NEWADDR`.
const NEW_ADDRESS: u16 = 20;
/// `RTM_DELADDR`.
const DELETED_ADDRESS: u16 = 21;

/// Every address of the network namespace's interfaces, sorted, without duplicates.
pub fn local_addresses() -> Result<Vec<IpAddr>, NetlinkError> {
    let addresses = nix::ifaddrs::getifaddrs()
        .map_err(|e| NetlinkError::Io { op: "listing addresses", source: e.into() })?;
    let mut ips: Vec<IpAddr> = addresses
        .filter_map(|a| a.address)
        .filter_map(|a| {
            a.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .collect();
    ips.sort();
    ips.dedup();
    Ok(ips)
}

/// Route netlink address notifications.
#[derive(Debug)]
pub struct AddressWatcher {
    socket: NetlinkSocket,
}

impl AddressWatcher {
    /// Subscribes to IPv4 and IPv6 address notifications.
    pub fn open() -> Result<Self, NetlinkError> {
        let mut socket = NetlinkSocket::open(NETLINK_ROUTE)?;
        socket.subscribe(GROUP_IPV4_ADDRESSES)?;
        socket.subscribe(GROUP_IPV6_ADDRESSES)?;
        socket.clear_timeout()?;
        Ok(AddressWatcher { socket })
    }

    /// Blocks until an address is added or removed.
    pub fn wait(&mut self) -> Result<(), NetlinkError> {
        loop {
            let datagram = self.socket.receive()?;
            if messages(&datagram)
                .iter()
                .any(|m| m.kind == NEW_ADDRESS || m.kind == DELETED_ADDRESS)
            {
                return Ok(());
            }
        }
    }
}

/// `RTM_GETLINK`.
const GET_LINK: u16 = 18;
/// `RTM_GETNEIGH`.
const GET_NEIGHBOUR: u16 = 30;
/// Length of `ifinfomsg`.
const IFINFOMSG_LEN: usize = 16;
/// Length of `ndmsg`.
const NDMSG_LEN: usize = 12;
/// `NUD_INCOMPLETE | NUD_FAILED`: no usable link-layer address.
const NUD_UNUSABLE: u16 = 0x01 | 0x20;

/// An interface: index, name and link-layer address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The interface index.
    pub index: u32,
    /// Its name.
    pub name: String,
    /// Its link-layer address (empty for an interface without one).
    pub address: Vec<u8>,
}

/// A neighbour with a usable link-layer address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    /// Its IP address.
    pub ip: IpAddr,
    /// The interface it is reached on.
    pub index: u32,
    /// Its link-layer address.
    pub address: Vec<u8>,
}

/// A route netlink dump request: `kind` with a zeroed family header of `header_len` bytes.
fn dump_request(kind: u16, header_len: usize) -> Vec<u8> {
    let len = NLMSG_HDRLEN + header_len;
    let mut buf = Vec::with_capacity(len);
    buf.extend_from_slice(&(len as u32).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    buf.extend_from_slice(&[0; 8]);
    buf.resize(len, 0);
    buf
}

fn index_at(body: &[u8], at: usize) -> Option<u32> {
    Some(i32::from_ne_bytes(body.get(at..at + 4)?.try_into().ok()?) as u32)
}

/// Every interface of the network namespace.
pub fn links() -> Result<Vec<Link>, NetlinkError> {
    let mut socket = NetlinkSocket::open(NETLINK_ROUTE)?;
    let bodies = socket.dump(&dump_request(GET_LINK, IFINFOMSG_LEN))?;
    Ok(bodies.iter().filter_map(|body| parse_link(body)).collect())
}

/// An `RTM_NEWLINK` body: `IFLA_IFNAME` (3), `IFLA_ADDRESS` (1).
fn parse_link(body: &[u8]) -> Option<Link> {
    let attrs = attr::parse(body.get(IFINFOMSG_LEN..)?);
    Some(Link {
        index: index_at(body, 4)?,
        name: attr::string(attr::find(&attrs, 3)?),
        address: attr::find(&attrs, 1).unwrap_or_default().to_vec(),
    })
}

/// Every neighbour (IPv4 and IPv6) whose link-layer address is known.
pub fn neighbours() -> Result<Vec<Neighbour>, NetlinkError> {
    let mut socket = NetlinkSocket::open(NETLINK_ROUTE)?;
    let bodies = socket.dump(&dump_request(GET_NEIGHBOUR, NDMSG_LEN))?;
    Ok(bodies.iter().filter_map(|body| parse_neighbour(body)).collect())
}

/// An `RTM_NEWNEIGH` body: `ndmsg`, then `NDA_DST` (1) and `NDA_LLADDR` (2).
fn parse_neighbour(body: &[u8]) -> Option<Neighbour> {
    let state = u16::from_ne_bytes(body.get(8..10)?.try_into().ok()?);
    if state & NUD_UNUSABLE != 0 {
        return None;
    }
    let attrs = attr::parse(body.get(NDMSG_LEN..)?);
    let ip = match attr::find(&attrs, 1)? {
        a if a.len() == 4 => IpAddr::from(<[u8; 4]>::try_from(a).ok()?),
        a => IpAddr::from(<[u8; 16]>::try_from(a).ok()?),
    };
    Some(Neighbour { ip, index: index_at(body, 4)?, address: attr::find(&attrs, 2)?.to_vec() })
}

/// A link-layer address as `aa:bb:cc:dd:ee:ff`.
pub fn mac_text(address: &[u8]) -> String {
    address.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_and_links_are_read_from_their_messages() {
        // ndmsg: family 2, ifindex 7, state REACHABLE; NDA_DST 192.168.10.3, NDA_LLADDR.
        let mut body = vec![2, 0, 0, 0];
        body.extend_from_slice(&7i32.to_ne_bytes());
        body.extend_from_slice(&0x02u16.to_ne_bytes());
        body.extend_from_slice(&[0, 0]);
        attr::put(&mut body, 1, &[192, 168, 10, 3]);
        attr::put(&mut body, 2, &[2, 0, 0, 0, 0, 0x0a]);
        let neighbour = parse_neighbour(&body).unwrap();
        assert_eq!(neighbour.ip, IpAddr::from([192, 168, 10, 3]));
        assert_eq!(
            (neighbour.index, mac_text(&neighbour.address).as_str()),
            (7, "02:00:00:00:00:0a")
        );
        // The same entry still being resolved (INCOMPLETE) has no usable address.
        body[8..10].copy_from_slice(&0x01u16.to_ne_bytes());
        assert_eq!(parse_neighbour(&body), None);

        let mut body = vec![0; IFINFOMSG_LEN];
        body[4..8].copy_from_slice(&3i32.to_ne_bytes());
        attr::put(&mut body, 3, b"eth0\0");
        attr::put(&mut body, 1, &[2, 0, 0, 0, 0, 1]);
        let link = parse_link(&body).unwrap();
        assert_eq!((link.index, link.name.as_str()), (3, "eth0"));
        assert_eq!(mac_text(&link.address), "02:00:00:00:00:01");
    }
}
