//! [`ConntrackCleaner`]: the backend that deletes stale UDP conntrack entries after the
//! dataplane backends applied a state. A cleanup that fails is kept and retried with the
//! next change set and at every verification, until it succeeds.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kpng_model::{Family, LocalNode, ServiceKey};
use kpng_netlink::ctnetlink;
use kpng_netlink::message::NETLINK_NETFILTER;
use kpng_netlink::{NetlinkError, NetlinkSocket, ProtoFamily};

use super::{Entry, UdpCheck, UdpTarget, stale, udp_checks};
use crate::backend::{Backend, BackendError, ChangeSet};

/// Above this many destinations, one unfiltered dump beats one filtered dump each.
const BULK_CHECKS: usize = 16;

/// Counters of the cleaner.
#[derive(Debug, Default)]
pub struct ConntrackStats {
    /// Stale entries deleted.
    pub deleted: AtomicU64,
    /// Cleanups that failed (and are retried).
    pub failures: AtomicU64,
}

/// Deletes stale UDP conntrack entries of the services each change set touched.
pub struct ConntrackCleaner {
    socket: Option<NetlinkSocket>,
    /// The UDP destinations each service had at its last change.
    targets: HashMap<ServiceKey, Vec<UdpTarget>>,
    /// Checks not done yet (a failed cleanup), by destination.
    pending: BTreeMap<UdpTarget, BTreeSet<SocketAddr>>,
    /// Where NodePorts are accepted: the addresses, and per family every local address.
    nodeports: (Vec<IpAddr>, [bool; 2]),
    stats: Arc<ConntrackStats>,
}

impl Default for ConntrackCleaner {
    fn default() -> Self {
        Self::new()
    }
}

impl ConntrackCleaner {
    /// A cleaner; its netlink socket is opened at the first cleanup.
    pub fn new() -> Self {
        ConntrackCleaner {
            socket: None,
            targets: HashMap::new(),
            pending: BTreeMap::new(),
            nodeports: (Vec::new(), [false; 2]),
            stats: Arc::default(),
        }
    }

    /// The cleaner's counters.
    pub fn stats(&self) -> Arc<ConntrackStats> {
        self.stats.clone()
    }

    /// Cleanups waiting for a retry.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The checks a change set calls for: every service's at a reset, the touched ones'
    /// otherwise; destinations that went away are checked with no endpoint at all.
    fn collect(&mut self, changes: &ChangeSet<'_>) {
        let state = changes.state;
        let keys: Vec<ServiceKey> = if changes.is_reset() {
            self.targets.keys().chain(state.services.keys()).cloned().collect()
        } else {
            changes.touched().0
        };
        for key in keys {
            let checks = state.services.get(&key).map(udp_checks).unwrap_or_default();
            let before = self.targets.remove(&key).unwrap_or_default();
            for gone in before.into_iter().filter(|t| !checks.iter().any(|c| c.target == *t)) {
                self.pending.insert(gone, BTreeSet::new());
            }
            if !checks.is_empty() {
                self.targets.insert(key, checks.iter().map(|c| c.target).collect());
            }
            for check in checks {
                self.pending.insert(check.target, check.serving);
            }
        }
        if let Some(node) = &state.node {
            self.nodeports = nodeport_addresses(node);
        }
    }

    /// Runs the pending checks; on failure they stay pending.
    fn clean(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let checks: Vec<UdpCheck> = self
            .pending
            .iter()
            .map(|(target, serving)| UdpCheck { target: *target, serving: serving.clone() })
            .collect();
        match self.delete_stale(&checks) {
            Ok(deleted) => {
                self.pending.clear();
                if deleted > 0 {
                    self.stats.deleted.fetch_add(deleted as u64, Ordering::Relaxed);
                    tracing::info!(entries = deleted, "deleted stale UDP conntrack entries");
                }
            }
            Err(error) => {
                self.socket = None;
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %crate::error_chain(&error), pending = self.pending.len(), "UDP conntrack cleanup failed; it will be retried");
            }
        }
    }

    fn delete_stale(&mut self, checks: &[UdpCheck]) -> Result<usize, NetlinkError> {
        let socket = match &mut self.socket {
            Some(socket) => socket,
            None => self.socket.insert(NetlinkSocket::open(NETLINK_NETFILTER)?),
        };
        let mut addresses = self.nodeports.0.clone();
        if self.nodeports.1.iter().any(|all| *all) {
            addresses.extend(kpng_netlink::rtnetlink::local_addresses()?.into_iter().filter(
                |ip| {
                    !ip.is_loopback() && self.nodeports.1[usize::from(Family::of(ip) == Family::V6)]
                },
            ));
        }
        let mut doomed = Vec::new();
        if checks.len() > BULK_CHECKS {
            for family in Family::ALL {
                let entries = dump(socket, family, None, None)?;
                let mut by_port: HashMap<u16, Vec<Entry>> = HashMap::new();
                for entry in entries {
                    by_port.entry(entry.orig_dst.port()).or_default().push(entry);
                }
                for check in checks.iter().filter(|c| target_family(&c.target) == family) {
                    let port = target_port(&check.target);
                    let candidates = by_port.get(&port).map(Vec::as_slice).unwrap_or_default();
                    doomed.extend(stale(candidates, check, &addresses));
                }
            }
        } else {
            for check in checks {
                let ip = match check.target {
                    UdpTarget::Dest(dest) => Some(dest.ip()),
                    UdpTarget::NodePort(..) => None,
                };
                let entries = dump(
                    socket,
                    target_family(&check.target),
                    ip,
                    Some(target_port(&check.target)),
                )?;
                doomed.extend(stale(&entries, check, &addresses));
            }
        }
        doomed.sort();
        doomed.dedup();
        let requests: Vec<Vec<u8>> = doomed.iter().map(ctnetlink::delete).collect();
        let codes = socket.requests(&requests)?;
        let enoent = -(nix::errno::Errno::ENOENT as i32);
        Ok(codes.iter().filter(|c| **c == 0 || **c == enoent).count())
    }
}

fn target_family(target: &UdpTarget) -> Family {
    match target {
        UdpTarget::Dest(dest) => Family::of(&dest.ip()),
        UdpTarget::NodePort(family, _) => *family,
    }
}

fn target_port(target: &UdpTarget) -> u16 {
    match target {
        UdpTarget::Dest(dest) => dest.port(),
        UdpTarget::NodePort(_, port) => *port,
    }
}

fn dump(
    socket: &mut NetlinkSocket,
    family: Family,
    ip: Option<IpAddr>,
    port: Option<u16>,
) -> Result<Vec<Entry>, NetlinkError> {
    let family = match family {
        Family::V4 => ProtoFamily::Ipv4,
        Family::V6 => ProtoFamily::Ipv6,
    };
    let bodies = socket.dump(&ctnetlink::dump_udp(family, ip, port))?;
    Ok(bodies.iter().filter_map(|b| ctnetlink::entry(b)).collect())
}

fn nodeport_addresses(node: &LocalNode) -> (Vec<IpAddr>, [bool; 2]) {
    let all = node.nodeport_addresses.all_local;
    (node.nodeport_addresses.addresses.clone(), [all.v4, all.v6])
}

impl Backend for ConntrackCleaner {
    fn name(&self) -> &'static str {
        "conntrack"
    }

    fn follows_dataplane(&self) -> bool {
        true
    }

    /// Never fails: a cleanup that cannot run now is retried later, and the dataplane's
    /// rules are in force either way.
    fn apply(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError> {
        self.collect(changes);
        self.clean();
        Ok(())
    }

    fn verify(&mut self) -> Result<bool, BackendError> {
        self.clean();
        Ok(true)
    }
}

/// The cleaner's counters as Prometheus metrics.
#[derive(Debug)]
pub struct ConntrackMetrics(pub Arc<ConntrackStats>);

impl prometheus_client::collector::Collector for ConntrackMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        let counters = [
            (
                "kpng_conntrack_entries_deleted",
                "Stale UDP conntrack entries deleted.",
                &self.0.deleted,
            ),
            (
                "kpng_conntrack_cleanup_failures",
                "UDP conntrack cleanups that failed (they are retried).",
                &self.0.failures,
            ),
        ];
        for (name, help, value) in counters {
            let metric = ConstCounter::new(value.load(Ordering::Relaxed));
            metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)?;
        }
        Ok(())
    }
}
