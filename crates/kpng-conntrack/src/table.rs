//! Where stale flows are removed: [`FlowTable`]. The kernel's conntrack table is one,
//! through [`ConntrackTable`] and [`Ctnetlink`], the implementation over a ctnetlink socket.

use std::collections::HashMap;
use std::net::IpAddr;

use kpng_model::Family;
use kpng_netlink::ctnetlink;
use kpng_netlink::message::NETLINK_NETFILTER;
use kpng_netlink::{NetlinkError, NetlinkSocket, ProtoFamily};

use super::{Entry, UdpCheck, UdpTarget, stale};

/// Why a cleanup failed.
pub type FlowError = Box<dyn std::error::Error + Send + Sync>;

/// Flows removed, by family.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Removed {
    /// IPv4 flows.
    pub v4: usize,
    /// IPv6 flows.
    pub v6: usize,
}

impl Removed {
    /// Both families'.
    pub fn total(&self) -> usize {
        self.v4 + self.v6
    }

    /// Counts `n` more of `family`'s.
    pub fn add(&mut self, family: Family, n: usize) {
        match family {
            Family::V4 => self.v4 += n,
            Family::V6 => self.v6 += n,
        }
    }
}

/// UDP flows that can outlive their endpoint: conntrack entries on the packet path,
/// connected sockets with socket-level translation. The [`FlowCleaner`](super::FlowCleaner)
/// removes those its checks find stale.
pub trait FlowTable: Send {
    /// What the flows are, for logs: `UDP conntrack entries`.
    fn flows(&self) -> &'static str;
    /// Removes the flows that `checks` find stale (NodePort checks: towards one of
    /// `nodeport_addrs`); returns how many went (one already gone counts).
    fn remove_stale(
        &mut self,
        checks: &[UdpCheck],
        nodeport_addrs: &[IpAddr],
    ) -> Result<Removed, FlowError>;
    /// The node's addresses, for NodePorts accepted on every local address.
    fn local_addresses(&mut self) -> Result<Vec<IpAddr>, FlowError> {
        Ok(kpng_netlink::rtnetlink::local_addresses()?)
    }
}

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

impl<T: ConntrackTable> FlowTable for T {
    fn flows(&self) -> &'static str {
        "UDP conntrack entries"
    }

    fn remove_stale(
        &mut self,
        checks: &[UdpCheck],
        nodeport_addrs: &[IpAddr],
    ) -> Result<Removed, FlowError> {
        // The kernel walks its whole conntrack hash for every dump, filtered or not: one
        // dump per family, filtered in the kernel only when it serves a single check.
        let mut removed = Removed::default();
        for family in Family::ALL {
            let mut doomed = Vec::new();
            let family_checks: Vec<&UdpCheck> =
                checks.iter().filter(|c| target_family(&c.target) == family).collect();
            let entries = match family_checks.as_slice() {
                [] => continue,
                [check] => {
                    let ip = match check.target {
                        UdpTarget::Dest(dest) => Some(dest.ip()),
                        UdpTarget::NodePort(..) => None,
                    };
                    self.dump(family, ip, Some(target_port(&check.target)))?
                }
                _ => self.dump(family, None, None)?,
            };
            let mut by_port: HashMap<u16, Vec<Entry>> = HashMap::new();
            for entry in entries {
                by_port.entry(entry.orig_dst.port()).or_default().push(entry);
            }
            for check in family_checks {
                let port = target_port(&check.target);
                let candidates = by_port.get(&port).map(Vec::as_slice).unwrap_or_default();
                doomed.extend(stale(candidates, check, nodeport_addrs));
            }
            doomed.sort();
            doomed.dedup();
            if !doomed.is_empty() {
                removed.add(family, self.delete(&doomed)?);
            }
        }
        Ok(removed)
    }

    fn local_addresses(&mut self) -> Result<Vec<IpAddr>, FlowError> {
        Ok(ConntrackTable::local_addresses(self)?)
    }
}

/// The family of a flow target.
fn target_family(target: &UdpTarget) -> Family {
    match target {
        UdpTarget::Dest(dest) => Family::of(&dest.ip()),
        UdpTarget::NodePort(family, _) => *family,
    }
}

/// The port of a flow target.
fn target_port(target: &UdpTarget) -> u16 {
    match target {
        UdpTarget::Dest(dest) => dest.port(),
        UdpTarget::NodePort(_, port) => *port,
    }
}
