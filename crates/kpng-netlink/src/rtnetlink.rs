//! The network namespace's addresses: listed, and watched through route netlink address
//! notifications, so that whatever depends on them (NodePorts on `--nodeport-addresses`
//! CIDRs) follows an address added or removed at once.

use std::net::IpAddr;

use crate::message::{NETLINK_ROUTE, messages};
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
