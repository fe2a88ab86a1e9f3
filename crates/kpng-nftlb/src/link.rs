//! Link-layer facts a farm in nftlb's `dsr` mode needs: nftlb forwards such a farm's
//! packets at the netdev ingress of the interface clients arrive on, rewriting only the
//! link-layer addresses, so it must be told the interface towards the backends (`oface`),
//! that interface's own address and each backend's. kpng reads them from the neighbour
//! table, asking the kernel to resolve a backend it does not know yet.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use kpng_netlink::rtnetlink::{links, mac_text, neighbours};

/// Where a farm's backends are on the link layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The interface every backend is reached on.
    pub oface: String,
    /// That interface's link-layer address.
    pub oface_mac: String,
    /// Each backend's link-layer address.
    pub macs: BTreeMap<IpAddr, String>,
}

/// Resolves backends to link-layer addresses.
pub trait LinkLayer: Send {
    /// The interface and addresses of neighbours `ips`; an error says which is not a
    /// neighbour of this node, or that they are on different interfaces.
    fn resolve(&mut self, ips: &[IpAddr]) -> Result<Resolved, String>;
}

/// This node's neighbour table.
#[derive(Debug, Default, Clone, Copy)]
pub struct NeighbourTable;

/// Times the table is read while the kernel resolves missing neighbours, and the wait
/// between reads.
const TRIES: u32 = 20;
const WAIT: Duration = Duration::from_millis(25);

/// Makes the kernel resolve `ip`: a datagram to its discard port goes out through the
/// neighbour layer, which asks for the link-layer address.
fn solicit(ip: IpAddr) {
    let any = match ip {
        IpAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        IpAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
    };
    if let Ok(socket) = UdpSocket::bind(any) {
        let _ = socket.send_to(&[], SocketAddr::new(ip, 9));
    }
}

impl LinkLayer for NeighbourTable {
    fn resolve(&mut self, ips: &[IpAddr]) -> Result<Resolved, String> {
        let mut known = BTreeMap::new();
        for attempt in 0..TRIES {
            known = neighbours()
                .map_err(|e| format!("reading the neighbour table: {e}"))?
                .into_iter()
                .filter(|n| ips.contains(&n.ip))
                .map(|n| (n.ip, (n.index, n.address)))
                .collect();
            let missing: Vec<IpAddr> =
                ips.iter().copied().filter(|ip| !known.contains_key(ip)).collect();
            if missing.is_empty() {
                break;
            }
            if attempt == 0 {
                missing.iter().for_each(|ip| solicit(*ip));
            }
            std::thread::sleep(WAIT);
        }
        if let Some(ip) = ips.iter().find(|ip| !known.contains_key(*ip)) {
            return Err(format!(
                "{ip} has no link-layer address after resolution: direct server return needs \
                 endpoints that are neighbours of this node"
            ));
        }
        let mut indices: Vec<u32> = known.values().map(|(index, _)| *index).collect();
        indices.sort_unstable();
        indices.dedup();
        let [index] = indices[..] else {
            return Err(format!(
                "the endpoints are reached on {} interfaces; nftlb forwards a farm out of one",
                indices.len()
            ));
        };
        let link = links()
            .map_err(|e| format!("reading the interfaces: {e}"))?
            .into_iter()
            .find(|l| l.index == index)
            .ok_or_else(|| format!("interface {index} vanished"))?;
        Ok(Resolved {
            oface: link.name,
            oface_mac: mac_text(&link.address),
            macs: known.into_iter().map(|(ip, (_, mac))| (ip, mac_text(&mac))).collect(),
        })
    }
}
