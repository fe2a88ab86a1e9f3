//! Whether the kernel holds what nftlb answered success for: nftlb puts a farm's DNAT in
//! the chain `nat-<farm>` of its table (`ip nftlb`, `ip6 nftlb`), and a `dsr` farm's
//! forwarding in the chain `<farm>` of `netdev nftlb`, which `nft` lists.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use crate::error::NftlbError;
use crate::farm::Farm;

/// Above this many farms to check, the tables are listed whole instead of chain by chain.
const CHAINS_ONE_BY_ONE: usize = 16;

/// Reads what the kernel holds of farms.
pub trait Installed: Send {
    /// The bodies of the `nat-<farm>` chains of `farms` that exist, by farm name.
    fn chains(&mut self, farms: &[&Farm]) -> Result<BTreeMap<String, String>, NftlbError>;
}

/// The kernel of this node, through `nft`.
#[derive(Debug, Default, Clone, Copy)]
pub struct NftListing;

fn table(farm: &Farm) -> &'static str {
    match (farm.direct.is_some(), farm.vip.family.as_str()) {
        (true, _) => "netdev",
        (false, "ipv6") => "ip6",
        (false, _) => "ip",
    }
}

/// The chain that holds a farm's backends.
fn chain(farm: &Farm) -> String {
    match farm.direct {
        Some(_) => farm.name.clone(),
        None => format!("nat-{}", farm.name),
    }
}

fn list(args: &[&str]) -> Result<Option<String>, NftlbError> {
    let out = Command::new("nft").args(args).output().map_err(NftlbError::Nft)?;
    Ok(out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// The chains of an `nft list` output, by name: the lines between `chain NAME {` and its
/// closing brace.
pub fn chain_bodies(listing: &str) -> BTreeMap<String, String> {
    let mut chains = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in listing.lines() {
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_prefix("chain ").and_then(|r| r.strip_suffix(" {")) {
            current = Some((name.to_string(), String::new()));
        } else if trimmed == "}" {
            if let Some((name, body)) = current.take() {
                chains.insert(name, body);
            }
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(trimmed);
            body.push('\n');
        }
    }
    chains
}

impl Installed for NftListing {
    fn chains(&mut self, farms: &[&Farm]) -> Result<BTreeMap<String, String>, NftlbError> {
        let mut found = BTreeMap::new();
        if farms.len() <= CHAINS_ONE_BY_ONE {
            for farm in farms {
                let chain = chain(farm);
                if let Some(listing) = list(&["list", "chain", table(farm), "nftlb", &chain])? {
                    let body = chain_bodies(&listing).remove(&chain).unwrap_or_default();
                    found.insert(farm.name.clone(), body);
                }
            }
            return Ok(found);
        }
        let tables: BTreeSet<&str> = farms.iter().map(|f| table(f)).collect();
        let mut all = BTreeMap::new();
        for t in tables {
            if let Some(listing) = list(&["list", "table", t, "nftlb"])? {
                all.extend(chain_bodies(&listing));
            }
        }
        for farm in farms {
            if let Some(body) = all.remove(&chain(farm)) {
                found.insert(farm.name.clone(), body);
            }
        }
        Ok(found)
    }
}

/// Whether a chain body sends traffic to `ip`:`port`: nftlb writes `ip . port` in a map
/// for several backends, `ip:port` (`[ip]:port`) for one.
pub fn names_target(body: &str, ip: &str, port: &str) -> bool {
    let tokens: Vec<&str> =
        body.split(|c: char| c.is_whitespace() || matches!(c, ',' | '{' | '}')).collect();
    tokens.iter().enumerate().any(|(i, t)| {
        (*t == ip && tokens.get(i + 2) == Some(&port) && tokens.get(i + 1) == Some(&"."))
            || *t == format!("{ip}:{port}")
            || *t == format!("[{ip}]:{port}")
    })
}

/// What differs between `farm` and the kernel's chain of it (`None`: absent): each
/// backend's address and port, or for a `dsr` farm its link-layer address.
pub fn mismatch(farm: &Farm, body: Option<&str>) -> Option<String> {
    let Some(body) = body else {
        return Some(format!("no chain {}", chain(farm)));
    };
    let missing: Vec<String> = match &farm.direct {
        Some(direct) => direct
            .backends
            .values()
            .filter(|mac| !body.split(|c: char| c.is_whitespace() || c == ',').any(|t| t == *mac))
            .cloned()
            .collect(),
        None => farm
            .backends
            .values()
            .filter(|b| !names_target(body, &b.ip_addr, &b.port))
            .map(|b| format!("{}:{}", b.ip_addr, b.port))
            .collect(),
    };
    (!missing.is_empty()).then(|| format!("backends {} missing", missing.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "table ip nftlb {\n\tchain nat-ns--web--http {\n\t\tip protocol tcp dnat ip to ct mark map { 0x80000001 : 10.244.0.10 . 8080, 0x80000002 : 10.244.1.10 . 8080 }\n\t}\n\tchain nat-ns--one--http {\n\t\tip protocol tcp dnat ip to 10.244.0.1:80\n\t}\n}\n";

    #[test]
    fn chains_and_their_targets_are_read_from_nfts_listing() {
        let chains = chain_bodies(LISTING);
        let web = &chains["nat-ns--web--http"];
        assert!(names_target(web, "10.244.0.10", "8080"));
        assert!(names_target(web, "10.244.1.10", "8080"));
        // Neither a prefix of another address nor another port.
        assert!(!names_target(web, "10.244.0.1", "8080"));
        assert!(!names_target(web, "10.244.0.10", "80"));
        let one = &chains["nat-ns--one--http"];
        assert!(names_target(one, "10.244.0.1", "80"));
        assert!(!names_target(one, "10.244.0.1", "8080"));
    }
}
