//! Destinations services claim, and who holds each.
//!
//! Two services can name the same address and port (an external IP, a load-balancer IP,
//! a NodePort, or a ClusterIP written twice in a file). Traffic to it must go to one of
//! them, the same one on every node and after every restart: the oldest service (by
//! creation time, then `namespace/name`) holds it; the others are told it is not theirs.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::global::few::Few;
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
            .chain(self.external_ips().iter().copied())
            .chain(
                self.load_balancer_ingress()
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
    /// Every claim and its claimants, sorted (nearly every claim has one).
    by_claim: BTreeMap<Claim, Few<ServiceKey>>,
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
                let left = claimants.remove(key);
                touched.extend(claimants.as_slice().iter().filter(|k| *k != key).cloned());
                if !left {
                    self.by_claim.remove(claim);
                }
            }
        }
        for claim in claims.iter().filter(|c| before.binary_search(c).is_err()) {
            match self.by_claim.entry(*claim) {
                Entry::Vacant(entry) => {
                    entry.insert(Few::One(key.clone()));
                }
                Entry::Occupied(mut entry) => {
                    touched.extend(entry.get().as_slice().iter().cloned());
                    entry.get_mut().add(key);
                }
            }
        }
        touched.remove(key);
        touched
    }

    /// The services claiming `claim`.
    pub fn claimants(&self, claim: &Claim) -> &[ServiceKey] {
        self.by_claim.get(claim).map(Few::as_slice).unwrap_or_default()
    }

    /// Rebuilds the index with full tree nodes (see [`crate::GlobalModel::compact`]).
    pub(crate) fn compact(&mut self) {
        self.by_claim = compacted(std::mem::take(&mut self.by_claim));
    }
}

/// `map` rebuilt from its entries in order: a tree built in one pass has full nodes, where
/// one grown by inserting keys in ascending order (as lists return objects) leaves each
/// node half full.
pub(crate) fn compacted<K: Ord, V>(map: BTreeMap<K, V>) -> BTreeMap<K, V> {
    map.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claimants_come_and_go_in_order_and_an_unclaimed_destination_is_forgotten() {
        let claim = Claim::NodePort(Protocol::Tcp, 30080);
        let [a, b, c] = ["a", "b", "c"].map(|name| ServiceKey::new("ns", name));
        let mut claims = Claims::default();
        assert!(claims.update(&b, &[], &[claim]).is_empty());
        assert_eq!(claims.update(&c, &[], &[claim]), BTreeSet::from([b.clone()]));
        assert_eq!(claims.update(&a, &[], &[claim]), BTreeSet::from([b.clone(), c.clone()]));
        assert_eq!(claims.claimants(&claim), [a.clone(), b.clone(), c.clone()]);
        assert_eq!(claims.update(&b, &[claim], &[]), BTreeSet::from([a.clone(), c.clone()]));
        assert_eq!(claims.update(&a, &[claim], &[]), BTreeSet::from([c.clone()]));
        assert_eq!(claims.claimants(&claim), std::slice::from_ref(&c));
        assert!(claims.update(&c, &[claim], &[]).is_empty());
        assert!(claims.claimants(&claim).is_empty() && claims.by_claim.is_empty());
    }
}
