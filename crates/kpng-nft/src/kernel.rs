//! [`NetlinkKernel`]: the real kernel. The static skeleton is loaded with `nft -f` at
//! start-up; every transaction after that is one netlink batch.

use std::io::Write;
use std::process::{Command, Stdio};

use kpng_backend::BackendError;
use kpng_model::Family;

use std::collections::BTreeSet;

use std::net::IpAddr;

use crate::backend::{Kernel, KernelContents};
use crate::conntrack::{UdpCheck, UdpTarget, stale};
use crate::netlink::ctnetlink;
use crate::netlink::decode;
use crate::netlink::socket::{CommitError, NetlinkSocket};
use crate::netlink::wire::{NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_MSG_GETSETELEM, dump_request};
use crate::objects::{ElementId, MapName};
use crate::skeleton::{SkeletonOptions, skeleton};
use crate::state::TableDiff;

/// Programs the kernel of the current network namespace.
pub struct NetlinkKernel {
    socket: NetlinkSocket,
}

fn backend_error(message: impl Into<String>) -> BackendError {
    BackendError::new("to-nft", message)
}

impl NetlinkKernel {
    /// Checks the kernel's features and opens the netlink socket.
    pub fn open() -> Result<Self, BackendError> {
        check_features()?;
        let socket = NetlinkSocket::open().map_err(|e| {
            backend_error("cannot open a netfilter netlink socket (is nf_tables available?)")
                .with_source(e)
        })?;
        Ok(NetlinkKernel { socket })
    }

    /// Bytes sent to the kernel over netlink so far (the skeleton, loaded through `nft`,
    /// is not counted).
    pub fn bytes_sent(&self) -> u64 {
        self.socket.bytes_sent()
    }
}

/// Runs `nft <args> -f -` on `text`; an error carries what nft printed.
fn run_nft(args: &[&str], text: &str) -> Result<(), BackendError> {
    let mut child = Command::new("nft")
        .args(args)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            backend_error("cannot run `nft` (install the nftables package)").with_source(e)
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| backend_error("writing to `nft`").with_source(e))?;
    }
    let out =
        child.wait_with_output().map_err(|e| backend_error("waiting for `nft`").with_source(e))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(backend_error(String::from_utf8_lossy(&out.stderr).trim().to_string())),
    }
}

/// Loads `text` with `nft -f`.
pub fn nft_load(text: &str) -> Result<(), BackendError> {
    run_nft(&[], text)
        .map_err(|e| backend_error("`nft -f` rejected kpng's static table").with_source(e))
}

impl Kernel for NetlinkKernel {
    fn drop_tables(&mut self) -> Result<(), BackendError> {
        self.remove_tables().map(|_| ())
    }

    fn load_skeleton(&mut self, options: &SkeletonOptions) -> Result<(), BackendError> {
        let text: String = Family::ALL.iter().map(|f| skeleton(*f, options)).collect();
        nft_load(&text)
    }

    fn local_addresses(&mut self) -> Vec<IpAddr> {
        let Ok(addresses) = nix::ifaddrs::getifaddrs() else {
            tracing::warn!(
                "cannot list the node's addresses; NodePorts on --nodeport-addresses CIDRs are not accepted"
            );
            return Vec::new();
        };
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
        ips
    }

    fn current(&mut self) -> Result<Option<KernelContents>, BackendError> {
        let fail = |e: CommitError| backend_error("reading kpng's tables").with_source(e);
        let mut elements = Vec::new();
        let mut ladders = BTreeSet::new();
        let mut affinity = std::collections::BTreeMap::new();
        for family in Family::ALL {
            // The static sets, and the count sets found in the table.
            let mut maps: Vec<MapName> = MapName::ALL.to_vec();
            for payload in
                self.socket.dump(&dump_request(0, NFT_MSG_GETSET, family, None)).map_err(fail)?
            {
                let Some(name) = decode::set_name(&payload) else { continue };
                if let Some(MapName::Count(kind, n)) = MapName::parse(&name) {
                    ladders.insert((family, kind, n));
                    maps.push(MapName::Count(kind, n));
                } else if let Some((hash, slot)) = decode::affinity_slot(&name) {
                    let timeout = decode::set_timeout(&payload).unwrap_or(0);
                    let entry: &mut (usize, u32) =
                        affinity.entry((family, hash)).or_insert((0, timeout));
                    entry.0 = entry.0.max(slot as usize + 1);
                }
            }
            for map in maps {
                let request = dump_request(0, NFT_MSG_GETSETELEM, family, Some(&map.name()));
                for payload in self.socket.dump(&request).map_err(fail)? {
                    for (key, value) in decode::elements(family, map, &payload) {
                        elements.push((ElementId { family, map, key }, value));
                    }
                }
            }
        }
        let affinity = affinity
            .into_iter()
            .map(|((family, hash), (slots, timeout))| (family, hash, slots, timeout))
            .collect();
        let mut rules = Vec::new();
        for family in Family::ALL {
            // The table attribute has the same number in rule and set requests.
            let request = dump_request(0, NFT_MSG_GETRULE, family, None);
            rules.push((family, self.socket.dump(&request).map_err(fail)?.len()));
        }
        Ok(Some(KernelContents { elements, ladders, affinity, rules }))
    }

    fn clear_udp(
        &mut self,
        checks: &[UdpCheck],
        nodeport_addrs: &[IpAddr],
    ) -> Result<usize, BackendError> {
        let fail = |e: CommitError| backend_error("cleaning UDP conntrack entries").with_source(e);
        let mut doomed = Vec::new();
        if checks.len() > BULK_CHECKS {
            // Many destinations (a reset): one dump of every UDP entry per family, matched
            // here, instead of one kernel-filtered dump per destination.
            for family in Family::ALL {
                let payloads =
                    self.socket.dump(&ctnetlink::dump_udp(0, family, None, None)).map_err(fail)?;
                let entries: Vec<ctnetlink::Entry> =
                    payloads.iter().filter_map(|p| ctnetlink::entry(p)).collect();
                let mut by_port: std::collections::HashMap<u16, Vec<ctnetlink::Entry>> =
                    Default::default();
                for entry in entries {
                    by_port.entry(entry.orig_dst.port()).or_default().push(entry);
                }
                for (target, serving) in checks {
                    let (target_family, port) = match target {
                        UdpTarget::Dest(dest) => (Family::of(&dest.ip()), dest.port()),
                        UdpTarget::NodePort(family, port) => (*family, *port),
                    };
                    if target_family == family {
                        let candidates = by_port.get(&port).map(Vec::as_slice).unwrap_or_default();
                        doomed.extend(stale(candidates, target, serving, nodeport_addrs));
                    }
                }
            }
        } else {
            for (target, serving) in checks {
                let (family, ip, port) = match target {
                    UdpTarget::Dest(dest) => (Family::of(&dest.ip()), Some(dest.ip()), dest.port()),
                    UdpTarget::NodePort(family, port) => (*family, None, *port),
                };
                let payloads = self
                    .socket
                    .dump(&ctnetlink::dump_udp(0, family, ip, Some(port)))
                    .map_err(fail)?;
                let entries: Vec<ctnetlink::Entry> =
                    payloads.iter().filter_map(|p| ctnetlink::entry(p)).collect();
                doomed.extend(stale(&entries, target, serving, nodeport_addrs));
            }
        }
        doomed.sort();
        doomed.dedup();
        let requests: Vec<Vec<u8>> = doomed.iter().map(|e| ctnetlink::delete(0, e)).collect();
        let codes = self.socket.requests(&requests).map_err(fail)?;
        let enoent = -(nix::errno::Errno::ENOENT as i32);
        Ok(codes.iter().filter(|c| **c == 0 || **c == enoent).count())
    }

    fn commit(&mut self, diff: &TableDiff) -> Result<(), BackendError> {
        let mut batch = self.socket.batch();
        for (family, kind, n) in &diff.new_ladders {
            batch.create_ladder(*family, *kind, *n);
        }
        for op in &diff.affinity_before {
            batch.affinity(op);
        }
        batch.elements(false, &diff.deletes);
        batch.elements(true, &diff.adds);
        for op in &diff.affinity_after {
            batch.affinity(op);
        }
        self.socket.commit(batch).map_err(|e: CommitError| {
            backend_error("transaction failed; the previous rules stay in force").with_source(e)
        })
    }
}

/// Above this many UDP destinations, one unfiltered dump beats one filtered dump each.
const BULK_CHECKS: usize = 16;

/// Removes kpng's tables (both families) and nothing else. Returns the families whose
/// table existed.
pub fn cleanup() -> Result<Vec<Family>, BackendError> {
    NetlinkKernel::open()?.remove_tables()
}

impl NetlinkKernel {
    /// Removes kpng's tables; returns the families that had one.
    fn remove_tables(&mut self) -> Result<Vec<Family>, BackendError> {
        let kernel = self;
        let mut removed = Vec::new();
        for family in Family::ALL {
            let mut batch = kernel.socket.batch();
            batch.delete_table(family);
            match kernel.socket.commit(batch) {
                Ok(()) => removed.push(family),
                Err(CommitError::Rejected { source, .. })
                    if source.raw_os_error() == Some(nix::errno::Errno::ENOENT as i32) => {}
                Err(e) => return Err(backend_error("removing kpng's tables").with_source(e)),
            }
        }
        Ok(removed)
    }
}

/// Kernel features the table needs, each with a rule that uses it.
const FEATURES: [(&str, &str); 6] = [
    ("nf_tables", "counter"),
    ("conntrack (nft_ct)", "ct state new counter"),
    ("fib lookups (nft_fib)", "fib saddr type local counter"),
    ("random numbers (nft_numgen)", "meta mark set numgen random mod 2"),
    ("NAT (nft_nat)", "ip daddr 10.0.0.1 dnat ip to 10.0.0.2"),
    ("REJECT (nft_reject)", "ip daddr 10.0.0.1 reject"),
];

/// Checks, without changing anything (`nft -c`), that the kernel has every feature the
/// table uses; the error names the first missing one.
pub fn check_features() -> Result<(), BackendError> {
    for (feature, rule) in FEATURES {
        let probe = format!(
            "table ip kpng_probe {{\n\tchain c {{\n\t\ttype nat hook prerouting priority -100;\n\t\t{rule}\n\t}}\n}}\n"
        );
        let reject = if rule.contains("reject") {
            format!(
                "table ip kpng_probe {{\n\tchain f {{\n\t\ttype filter hook input priority 0;\n\t\t{rule}\n\t}}\n}}\n"
            )
        } else {
            probe
        };
        if let Err(e) = nft_check(&reject) {
            return Err(backend_error(format!(
                "the kernel lacks {feature}, which kpng's nftables table needs"
            ))
            .with_source(e));
        }
    }
    Ok(())
}

fn nft_check(text: &str) -> Result<(), BackendError> {
    run_nft(&["-c"], text)
}
