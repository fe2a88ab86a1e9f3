//! ClientIP session affinity, for the services that ask for it.
//!
//! Each service port, family and endpoint set of an affinity service is a group with its
//! own chain `aff_<hash>` (the only per-service chains kpng makes). Slot `i` of the group
//! has a timeout set `aff_<hash>_<i>` of client addresses and a chain `aff_<hash>_<i>` that
//! refreshes the client in that set and DNATs to the slot's endpoint:
//!
//! ```text
//! chain aff_h    { ip saddr @aff_h_0 goto aff_h_0; ...                 (a known client)
//!                  numgen random mod N == 0 goto aff_h_0;              (a new one: the first
//!                  numgen random mod N-1 == 0 goto aff_h_1; ...         live slot with 1/N,
//!                  goto aff_h_<last> }                                  the next 1/(N-1), ...)
//! chain aff_h_i  { meta l4proto tcp update @aff_h_i { ip saddr } dnat ip to <endpoint i> }
//! ```
//!
//! Every destination of the group (ClusterIP, external and LB IPs, NodePort) enters the
//! same chain through the `affinity_*` verdict maps, so a client sticks to one endpoint
//! across all of a service port's addresses, and each new connection refreshes the
//! timeout. Endpoints never change slots: one that leaves leaves a hole (its clients choose
//! again), one that arrives takes a hole or a new slot, so the clients of every other
//! endpoint keep their endpoint.

use kpng_model::{Family, Protocol};

use crate::objects::{affinity_chain, affinity_slot};
use crate::rules::{Field, Rule, RuleBuilder};
use crate::slots::Target;

/// One affinity group as it should be in the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffinityGroup {
    /// Stable identity (names its chains and sets), from [`crate::objects::GroupKey::hash`].
    pub hash: u64,
    /// The family.
    pub family: Family,
    /// The service port's protocol.
    pub protocol: Protocol,
    /// Affinity timeout in seconds.
    pub timeout: u32,
    /// The endpoint of each slot; `None` for a hole.
    pub slots: Vec<Option<Target>>,
}

impl AffinityGroup {
    /// The entry chain's name.
    pub fn chain(&self) -> String {
        affinity_chain(self.hash)
    }

    /// The indices of the slots that hold an endpoint.
    fn live(&self) -> impl Iterator<Item = (usize, Target)> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, t)| t.map(|t| (i, t)))
    }

    /// The rules of the entry chain: known clients to their slot, new ones to a slot chosen
    /// uniformly among the live ones.
    pub fn entry_rules(&self) -> Vec<Rule> {
        let r = || RuleBuilder::new(self.family);
        let live: Vec<usize> = self.live().map(|(i, _)| i).collect();
        let mut rules: Vec<Rule> = live
            .iter()
            .map(|i| {
                let slot = affinity_slot(self.hash, *i);
                r().member(&[Field::Saddr], &slot, false).goto(slot)
            })
            .collect();
        for (j, i) in live.iter().enumerate() {
            let remaining = (live.len() - j) as u32;
            let slot = affinity_slot(self.hash, *i);
            rules.push(if remaining > 1 {
                r().one_in(remaining).goto(slot)
            } else {
                r().goto(slot)
            });
        }
        rules
    }

    /// The rule of slot `i`'s chain; `None` for a hole.
    pub fn slot_rule(&self, i: usize) -> Option<Rule> {
        let (ip, port) = self.slots.get(i).copied().flatten()?;
        let set = affinity_slot(self.hash, i);
        Some(
            RuleBuilder::new(self.family)
                .protocol(self.protocol)
                .remember_source(&set)
                .dnat_to(ip, port),
        )
    }

    /// Every chain of the group with its rules: the entry chain, then each live slot.
    pub fn chains(&self) -> Vec<(String, Vec<Rule>)> {
        let mut chains = vec![(self.chain(), self.entry_rules())];
        for (i, _) in self.live() {
            let rule = self.slot_rule(i).into_iter().collect();
            chains.push((affinity_slot(self.hash, i), rule));
        }
        chains
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(slots: &[Option<u8>]) -> AffinityGroup {
        AffinityGroup {
            hash: 0xab,
            family: Family::V4,
            protocol: Protocol::Tcp,
            timeout: 60,
            slots: slots
                .iter()
                .map(|s| s.map(|n| (std::net::IpAddr::from([10, 0, 0, n]), 80)))
                .collect(),
        }
    }

    #[test]
    fn new_clients_choose_among_live_slots_only() {
        let texts: Vec<String> =
            group(&[None, Some(2), Some(3)]).entry_rules().into_iter().map(|r| r.text).collect();
        assert_eq!(
            texts,
            [
                "ip saddr @aff_00000000000000ab_1 goto aff_00000000000000ab_1",
                "ip saddr @aff_00000000000000ab_2 goto aff_00000000000000ab_2",
                "numgen random mod 2 == 0 goto aff_00000000000000ab_1",
                "goto aff_00000000000000ab_2",
            ]
        );
    }
}
