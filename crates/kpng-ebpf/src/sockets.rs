//! [`ConnectedUdp`]: connected UDP sockets whose endpoint no longer serves, destroyed.
//!
//! A UDP socket that `connect()`s to a service is pointed at one endpoint for good: its
//! datagrams carry the endpoint's address, and no conntrack entry stands in between that a
//! cleanup could delete. When the endpoint stops serving the service, the socket is
//! destroyed instead (`sock_diag`'s `SOCK_DESTROY`, as `ss -K` does): its owner sees
//! `ECONNABORTED` and connects again, to an endpoint that serves. A socket is a candidate
//! only if kpng's programs translated it: its cookie and endpoint are in `kpng_revnat`,
//! which also says which service address it asked for.
//!
//! Sockets live in their owners' network namespaces: those of the processes in the cgroup
//! (and its descendants) are visited, each once. Listing them needs the host's PID
//! namespace (a DaemonSet's `hostPID: true`); destroying needs `CONFIG_INET_DIAG_DESTROY`.

use std::collections::HashSet;
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use aya::maps::{HashMap as BpfHashMap, Map, MapData, MapError};
use kpng_netlink::NetlinkSocket;
use kpng_netlink::sock_diag::{self, NETLINK_SOCK_DIAG};

use crate::error::EbpfError;
use crate::kernel::KernelOptions;
use crate::maps;
use crate::pins;

/// The connected UDP sockets of a cgroup's processes, as kpng's programs translated them.
#[derive(Debug, Clone)]
pub struct ConnectedUdp {
    cgroup: PathBuf,
    revnat: PathBuf,
}

impl ConnectedUdp {
    /// The sockets of the cgroup the programs are attached to, as `options` name it.
    pub fn new(options: &KernelOptions) -> Self {
        ConnectedUdp {
            cgroup: options.cgroup.clone(),
            revnat: pins::lru_dir(&options.pin_root).join("kpng_revnat"),
        }
    }

    /// Destroys every connected UDP socket that the programs pointed at an endpoint, when
    /// `stale(service, endpoint)` (IPv4 addresses as such, not IPv4-mapped); returns how
    /// many went, IPv4 and IPv6 flows apart.
    pub fn destroy(
        &mut self,
        stale: &dyn Fn(SocketAddr, SocketAddr) -> bool,
    ) -> Result<(usize, usize), EbpfError> {
        let data = match MapData::from_pin(&self.revnat) {
            Ok(data) => data,
            // Nothing installed yet: no socket was translated.
            Err(MapError::SyscallError(e)) if e.io_error.kind() == std::io::ErrorKind::NotFound => {
                return Ok((0, 0));
            }
            Err(e) => {
                return Err(EbpfError::Pin {
                    step: "opening",
                    path: self.revnat.clone(),
                    source: Box::new(e),
                });
            }
        };
        let map = Map::from_map_data(data).map_err(|e| EbpfError::Pin {
            step: "opening",
            path: self.revnat.clone(),
            source: Box::new(e),
        })?;
        let revnat: BpfHashMap<&MapData, [u8; 32], [u8; 20]> =
            BpfHashMap::try_from(&map).map_err(|e| EbpfError::Pin {
                step: "reading",
                path: self.revnat.clone(),
                source: Box::new(e),
            })?;
        let mut destroyed = (0, 0);
        for (pid, netns) in network_namespaces(&self.cgroup)? {
            let failed = |step: &str| {
                let step = format!("{step} in the network namespace of process {pid}");
                move |e: kpng_netlink::NetlinkError| EbpfError::Sockets { step, source: e.into() }
            };
            let mut socket =
                NetlinkSocket::open_in(NETLINK_SOCK_DIAG, &netns).map_err(failed("opening"))?;
            let mut doomed = Vec::new();
            for v6 in [false, true] {
                let dumped =
                    socket.dump(&sock_diag::dump_connected_udp(v6)).map_err(failed("listing"))?;
                for body in &dumped {
                    let Some(udp) = sock_diag::udp_socket(body) else { continue };
                    let key = maps::revnat_key(udp.cookie, udp.remote);
                    let Ok(value) = revnat.get(&key, 0) else { continue };
                    let Some(service) = maps::revnat_service(&value) else { continue };
                    if stale(unmapped(service), unmapped(udp.remote)) {
                        doomed.push(udp);
                    }
                }
            }
            if doomed.is_empty() {
                continue;
            }
            let requests: Vec<Vec<u8>> = doomed.iter().map(sock_diag::destroy).collect();
            let codes = socket.requests(&requests).map_err(failed("destroying"))?;
            for (code, socket) in codes.into_iter().zip(&doomed) {
                let count = |destroyed: &mut (usize, usize)| match unmapped(socket.remote).is_ipv4()
                {
                    true => destroyed.0 += 1,
                    false => destroyed.1 += 1,
                };
                match nix::errno::Errno::from_raw(-code) {
                    _ if code == 0 => count(&mut destroyed),
                    // Closed meanwhile: gone all the same.
                    nix::errno::Errno::ENOENT => count(&mut destroyed),
                    nix::errno::Errno::EOPNOTSUPP => {
                        return Err(EbpfError::Unsupported {
                            what: "destroying sockets (CONFIG_INET_DIAG_DESTROY): a connected UDP socket keeps an endpoint that is gone".into(),
                            source: None,
                        });
                    }
                    errno => {
                        return Err(EbpfError::Sockets {
                            step: format!("destroying in the network namespace of process {pid}"),
                            source: Box::new(std::io::Error::from(errno)),
                        });
                    }
                }
            }
        }
        Ok(destroyed)
    }
}

/// An IPv4-mapped address as the IPv4 address it maps.
fn unmapped(address: SocketAddr) -> SocketAddr {
    match address.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), address.port()),
            None => address,
        },
        IpAddr::V4(_) => address,
    }
}

/// The network namespaces of the processes in `cgroup` and its descendants, each once,
/// with a process that was in it. A process that ends meanwhile is passed over; the open
/// namespace file keeps its namespace for as long as it is needed.
fn network_namespaces(cgroup: &Path) -> Result<Vec<(u32, File)>, EbpfError> {
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    let mut dirs = vec![cgroup.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let procs = match std::fs::read_to_string(dir.join("cgroup.procs")) {
            Ok(procs) => procs,
            // Removed meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && dir != cgroup => continue,
            Err(e) => {
                return Err(EbpfError::Cgroup { path: dir, reason: format!("cgroup.procs: {e}") });
            }
        };
        // 0: a process outside this PID namespace.
        for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()).filter(|p| *p != 0) {
            let Ok(netns) = File::open(format!("/proc/{pid}/ns/net")) else { continue };
            let Ok(meta) = netns.metadata() else { continue };
            if seen.insert((meta.dev(), meta.ino())) {
                found.push((pid, netns));
            }
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            dirs.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_addresses_compare_as_ipv4() {
        let mapped: SocketAddr = "[::ffff:10.96.0.10]:53".parse().unwrap();
        assert_eq!(unmapped(mapped), "10.96.0.10:53".parse().unwrap());
        let v6: SocketAddr = "[fd00::10]:53".parse().unwrap();
        assert_eq!(unmapped(v6), v6);
    }

    #[test]
    fn the_revnat_key_is_the_programs_layout() {
        let key = maps::revnat_key(7, "10.244.0.10:8080".parse().unwrap());
        assert_eq!(&key[..8], &7u64.to_ne_bytes());
        assert_eq!(&key[8..12], &[10, 244, 0, 10]);
        assert_eq!(&key[24..26], &8080u16.to_be_bytes());
        assert_eq!(key[26], 4, "the family");
        let mut value = [0u8; 20];
        value.copy_from_slice(&key[8..28]);
        assert_eq!(maps::revnat_service(&value), Some("10.244.0.10:8080".parse().unwrap()));
    }
}
