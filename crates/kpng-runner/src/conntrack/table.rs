//! The kernel's conntrack table as the cleanup uses it: [`ConntrackTable`], and
//! [`Ctnetlink`], the implementation over a ctnetlink socket.

use std::net::IpAddr;

use kpng_model::Family;
use kpng_netlink::ctnetlink;
use kpng_netlink::message::NETLINK_NETFILTER;
use kpng_netlink::{NetlinkError, NetlinkSocket, ProtoFamily};

use super::Entry;

/// The kernel's conntrack table, as the cleanup uses it.
pub trait ConntrackTable: Send {
    /// The UDP entries of `family`, only those towards `ip` and `port` when given.
    fn dump(
        &mut self,
        family: Family,
        ip: Option<IpAddr>,
        port: Option<u16>,
    ) -> Result<Vec<Entry>, NetlinkError>;
    /// Deletes `entries`; returns how many are gone (one already gone counts).
    fn delete(&mut self, entries: &[Entry]) -> Result<usize, NetlinkError>;
    /// The node's addresses, for NodePorts accepted on every local address.
    fn local_addresses(&mut self) -> Result<Vec<IpAddr>, NetlinkError>;
}

/// The table through ctnetlink; the socket is opened at first use and again after a failure.
#[derive(Default)]
pub struct Ctnetlink {
    socket: Option<NetlinkSocket>,
}

impl Ctnetlink {
    fn socket(&mut self) -> Result<&mut NetlinkSocket, NetlinkError> {
        let socket = match self.socket.take() {
            Some(socket) => socket,
            None => NetlinkSocket::open(NETLINK_NETFILTER)?,
        };
        Ok(self.socket.insert(socket))
    }

    /// Drops the socket when `result` is a failure: the next use starts afresh.
    fn settle<T>(&mut self, result: Result<T, NetlinkError>) -> Result<T, NetlinkError> {
        if result.is_err() {
            self.socket = None;
        }
        result
    }
}

impl ConntrackTable for Ctnetlink {
    fn dump(
        &mut self,
        family: Family,
        ip: Option<IpAddr>,
        port: Option<u16>,
    ) -> Result<Vec<Entry>, NetlinkError> {
        let family = match family {
            Family::V4 => ProtoFamily::Ipv4,
            Family::V6 => ProtoFamily::Ipv6,
        };
        let result = self
            .socket()
            .and_then(|socket| socket.dump(&ctnetlink::dump_udp(family, ip, port)))
            .map(|bodies| bodies.iter().filter_map(|b| ctnetlink::entry(b)).collect());
        self.settle(result)
    }

    fn delete(&mut self, entries: &[Entry]) -> Result<usize, NetlinkError> {
        let requests: Vec<Vec<u8>> = entries.iter().map(ctnetlink::delete).collect();
        let enoent = -(nix::errno::Errno::ENOENT as i32);
        let result = self
            .socket()
            .and_then(|socket| socket.requests(&requests))
            .map(|codes| codes.iter().filter(|c| **c == 0 || **c == enoent).count());
        self.settle(result)
    }

    fn local_addresses(&mut self) -> Result<Vec<IpAddr>, NetlinkError> {
        kpng_netlink::rtnetlink::local_addresses()
    }
}
