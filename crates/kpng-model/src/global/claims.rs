//! Destinations services claim, and who holds each.
//!
//! Two services can name the same address and port (an external IP, a load-balancer IP,
//! a NodePort, or a ClusterIP written twice in a file). Traffic to it must go to one of
//! them, the same one on every node and after every restart: the oldest service (by
//! creation time, then `namespace/name`) holds it; the others are told it is not theirs.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::global::{Service, ServiceKey};
use crate::net::Protocol;

/// A destination a service port claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Claim {
    /// An address (ClusterIP, external IP or load-balancer IP) and port.
    Address(IpAddr, Protocol, u16),
    /// A NodePort, on every node.
    NodePort(Protocol, u16),
}

impl std::fmt::Display for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Claim::Address(ip, protocol, port) => write!(f, "{ip} {protocol}/{port}"),
            Claim::NodePort(protocol, port) => write!(f, "NodePort {protocol}/{port}"),
        }
    }
}

impl Service {
    /// Every destination the service claims.
    pub fn claims(&self) -> Vec<Claim> {
        let addresses: Vec<IpAddr> = self
            .cluster_ips
            .iter()
            .copied()
            .chain(self.external_ips.iter().copied())
            .chain(
                self.load_balancer_ingress
                    .iter()
                    .filter(|i| i.ip_mode == crate::global::IpMode::VIP)
                    .map(|i| i.ip),
            )
            .collect();
        let mut claims = Vec::new();
        for port in &self.ports {
            claims.extend(addresses.iter().map(|ip| Claim::Address(*ip, port.protocol, port.port)));
            claims.extend(port.node_port.map(|n| Claim::NodePort(port.protocol, n)));
        }
        claims.sort();
        claims.dedup();
        claims
    }

    /// The order in which services win a contested destination: the oldest first, then by
    /// `namespace/name`.
    pub fn seniority(&self) -> (i64, &ServiceKey) {
        (self.created_at.unwrap_or(i64::MAX), &self.key)
    }
}

/// Who claims each contested destination, and every claim's claimants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claims {
    /// Every claim and its claimants (one, nearly always).
    by_claim: BTreeMap<Claim, Vec<ServiceKey>>,
}

impl Claims {
    /// Records that `key` claims `claims` now, where it claimed `before`. Returns the other
    /// services whose share of a claim may have changed.
    pub fn update(
        &mut self,
        key: &ServiceKey,
        before: &[Claim],
        claims: &[Claim],
    ) -> BTreeSet<ServiceKey> {
        let mut touched = BTreeSet::new();
        for claim in before.iter().filter(|c| claims.binary_search(c).is_err()) {
            if let Some(claimants) = self.by_claim.get_mut(claim) {
                claimants.retain(|k| k != key);
                touched.extend(claimants.iter().cloned());
                if claimants.is_empty() {
                    self.by_claim.remove(claim);
                }
            }
        }
        for claim in claims.iter().filter(|c| before.binary_search(c).is_err()) {
            // Nearly every claim has one claimant: room for one, not the four a first push
            // would make (tens of thousands of claims in a large cluster).
            let claimants = self.by_claim.entry(*claim).or_insert_with(|| Vec::with_capacity(1));
            touched.extend(claimants.iter().cloned());
            if let Err(at) = claimants.binary_search(key) {
                claimants.insert(at, key.clone());
            }
        }
        touched.remove(key);
        touched
    }

    /// The services claiming `claim`.
    pub fn claimants(&self, claim: &Claim) -> &[ServiceKey] {
        self.by_claim.get(claim).map(Vec::as_slice).unwrap_or_default()
    }
}
