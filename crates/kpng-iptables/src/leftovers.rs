//! kube-proxy's chains, removed when kpng replaces it: its fixed chains (iptables and IPVS
//! modes, v1.33 and earlier), the per-service chains it names by prefix, and the rules of
//! other chains that jump into them, in the `nat`, `filter` and `mangle` tables. The
//! kubelet's chains (`KUBE-IPTABLES-HINT`, `KUBE-KUBELET-CANARY`, `KUBE-FIREWALL`) and
//! every other chain stay; conntrack entries are not touched, so connections kube-proxy
//! translated keep flowing.

use std::collections::{BTreeMap, BTreeSet};

use kpng_model::Family;

use crate::error::IptablesError;
use crate::kernel::{CommandKernel, Kernel, Mode};

/// kube-proxy's chains, by name.
pub const CHAINS: &[&str] = &[
    // iptables mode
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
    "KUBE-FORWARD",
    "KUBE-PROXY-FIREWALL",
    "KUBE-PROXY-CANARY",
    // IPVS mode
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];

/// kube-proxy's per-service and per-endpoint chains, by prefix.
pub const PREFIXES: &[&str] =
    &["KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-FW-", "KUBE-XLB-", "KUBE-EXT-"];

/// The tables kube-proxy writes to.
const TABLES: [&str; 3] = ["nat", "filter", "mangle"];

/// Whether `chain` is kube-proxy's.
pub fn is_kube_proxys(chain: &str) -> bool {
    CHAINS.contains(&chain) || PREFIXES.iter().any(|p| chain.starts_with(p))
}

/// What one family's tables hold of kube-proxy's.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Its chains, by table.
    pub chains: BTreeMap<String, BTreeSet<String>>,
    /// `(table, chain, rule)`: rules of other chains that jump into its chains.
    pub jumps: BTreeSet<(String, String, String)>,
}

impl Leftovers {
    /// Reads `iptables-save` output.
    pub fn find(saved: &str) -> Leftovers {
        let mut found = Leftovers::default();
        let mut table = None;
        for line in saved.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = TABLES.contains(&name.trim()).then(|| name.trim().to_string());
                continue;
            }
            let Some(table) = &table else { continue };
            if let Some(declared) = line.strip_prefix(':') {
                let name = declared.split_whitespace().next().unwrap_or_default();
                if is_kube_proxys(name) {
                    found.chains.entry(table.clone()).or_default().insert(name.to_string());
                }
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let (chain, spec) = rule.split_once(' ').unwrap_or((rule, ""));
                if !is_kube_proxys(chain) && jumps_to_kube_proxy(spec) {
                    found.jumps.insert((table.clone(), chain.to_string(), spec.to_string()));
                }
            }
        }
        found
    }

    /// How many chains there are.
    pub fn chain_count(&self) -> usize {
        self.chains.values().map(BTreeSet::len).sum()
    }

    /// The `iptables-restore --noflush` input that removes them: the jumps first, then
    /// each chain flushed (declaring it) and deleted.
    pub fn removal(&self) -> String {
        let mut text = String::new();
        for table in TABLES {
            let chains = self.chains.get(table);
            let jumps: Vec<_> = self.jumps.iter().filter(|(t, _, _)| t == table).collect();
            if chains.is_none_or(BTreeSet::is_empty) && jumps.is_empty() {
                continue;
            }
            text.push_str(&format!("*{table}\n"));
            for chain in chains.into_iter().flatten() {
                text.push_str(&format!(":{chain} - [0:0]\n"));
            }
            for (_, chain, spec) in jumps {
                text.push_str(&format!("-D {chain} {spec}\n"));
            }
            for chain in chains.into_iter().flatten() {
                text.push_str(&format!("-X {chain}\n"));
            }
            text.push_str("COMMIT\n");
        }
        text
    }
}

/// Whether a rule's target (`-j` or `-g`) is one of kube-proxy's chains.
fn jumps_to_kube_proxy(spec: &str) -> bool {
    let mut words = spec.split_whitespace();
    while let Some(word) = words.next() {
        if matches!(word, "-j" | "--jump" | "-g" | "--goto") {
            return words.next().is_some_and(is_kube_proxys);
        }
    }
    false
}

/// Removes kube-proxy's chains and the jumps into them from both families of `mode`'s
/// variant (`Nft` or `Legacy`); returns how many chains went. A variant that is not
/// installed holds nothing (`IptablesError::Spawn` with `NotFound`, for the caller to say).
pub fn remove(mode: Mode) -> Result<usize, IptablesError> {
    let mut kernel = CommandKernel::unchecked(mode);
    let mut removed = 0;
    for family in Family::ALL {
        let leftovers = Leftovers::find(&kernel.save(family)?);
        let text = leftovers.removal();
        if !text.is_empty() {
            kernel.restore(family, &text)?;
        }
        removed += leftovers.chain_count();
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVED: &str = "\
*mangle
:PREROUTING ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-PROXY-CANARY - [0:0]
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
:CNI-FORWARD - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD
-A FORWARD -j CNI-FORWARD
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-ABC - [0:0]
:KUBE-SEP-DEF - [0:0]
:KPNG-SERVICES - [0:0]
:KUBE-SERVICES-NOT - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A PREROUTING -j KPNG-SERVICES
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -j KUBE-SVC-ABC
-A KUBE-SVC-ABC -j KUBE-SEP-DEF
-A KUBE-SEP-DEF -p tcp -j DNAT --to-destination 10.244.0.5:6443
COMMIT
";

    #[test]
    fn kube_proxys_chains_and_jumps_are_found_and_no_others() {
        let found = Leftovers::find(SAVED);
        let chains: Vec<String> = found
            .chains
            .iter()
            .flat_map(|(t, cs)| cs.iter().map(move |c| format!("{t}/{c}")))
            .collect();
        assert_eq!(
            chains,
            [
                "filter/KUBE-FORWARD",
                "filter/KUBE-PROXY-FIREWALL",
                "filter/KUBE-SERVICES",
                "mangle/KUBE-PROXY-CANARY",
                "nat/KUBE-MARK-MASQ",
                "nat/KUBE-SEP-DEF",
                "nat/KUBE-SERVICES",
                "nat/KUBE-SVC-ABC",
            ]
        );
        let jumps: Vec<&str> = found.jumps.iter().map(|(_, c, _)| c.as_str()).collect();
        assert_eq!(jumps, ["FORWARD", "INPUT", "PREROUTING"]);
        let removal = found.removal();
        assert!(removal.contains("-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n"), "{removal}");
        for kept in [
            "KUBE-FIREWALL",
            "KUBE-IPTABLES-HINT",
            "KUBE-KUBELET-CANARY",
            "KPNG-SERVICES",
            "CNI-FORWARD",
            "KUBE-SERVICES-NOT",
        ] {
            assert!(
                !removal.contains(&format!("{kept}\n")) && !removal.contains(&format!("{kept} ")),
                "{kept}: {removal}"
            );
        }
        // Chains are flushed before any is deleted, so references between them never block.
        let first_delete = removal.find("-X ").unwrap();
        assert!(removal[..first_delete].contains(":KUBE-SVC-ABC - [0:0]"));
    }

    #[test]
    fn nothing_of_kube_proxys_means_no_input() {
        let found = Leftovers::find(
            "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j KPNG-SERVICES\nCOMMIT\n",
        );
        assert_eq!(found, Leftovers::default());
        assert_eq!(found.removal(), "");
    }
}
