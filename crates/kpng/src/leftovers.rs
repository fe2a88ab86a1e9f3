//! kube-proxy's leftovers, removed when kpng replaces it (`--remove-kube-proxy`, and
//! `kpng cleanup --kube-proxy`): its `ip` and `ip6` nftables tables named `kube-proxy`, its
//! iptables chains and the jumps into them in both iptables variants
//! ([`kpng_iptables::leftovers`]), and what its IPVS mode leaves: the `kube-ipvs0` dummy
//! interface, which holds the service addresses IPVS matched, and its ipsets. The kubelet's
//! chains, other tables, other interfaces and conntrack entries are not touched.

use std::process::{Command, Stdio};

/// The ipsets kube-proxy's IPVS mode makes (IPv4 names; IPv6 ones start `KUBE-6-`).
const IPSETS: &[&str] = &[
    "KUBE-LOOP-BACK",
    "KUBE-CLUSTER-IP",
    "KUBE-EXTERNAL-IP",
    "KUBE-EXTERNAL-IP-LOCAL",
    "KUBE-LOAD-BALANCER",
    "KUBE-LOAD-BALANCER-FW",
    "KUBE-LOAD-BALANCER-LOCAL",
    "KUBE-LOAD-BALANCER-SOURCE-IP",
    "KUBE-LOAD-BALANCER-SOURCE-CIDR",
    "KUBE-NODE-PORT-TCP",
    "KUBE-NODE-PORT-LOCAL-TCP",
    "KUBE-NODE-PORT-UDP",
    "KUBE-NODE-PORT-LOCAL-UDP",
    "KUBE-NODE-PORT-SCTP-HASH",
    "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
    "KUBE-HEALTH-CHECK-NODE-PORT",
    "KUBE-IPVS-IPS",
];

/// The interface kube-proxy's IPVS mode binds service addresses to.
const IPVS_INTERFACE: &str = "kube-ipvs0";

/// Whether `name` is one of kube-proxy's ipsets: an IPv4 name, or its IPv6 form (`KUBE-6-`
/// instead of `KUBE-`, cut to ipset's 31 characters).
fn is_kube_proxy_ipset(name: &str) -> bool {
    IPSETS.iter().any(|set| {
        let v6: String = set.replacen("KUBE-", "KUBE-6-", 1).chars().take(31).collect();
        name == *set || name == v6
    })
}

/// Removes what kube-proxy left, logging each part; a part that fails is logged and the
/// others still run. Returns the failures.
pub fn remove() -> Vec<String> {
    let mut failures = Vec::new();
    match kpng_nft::remove_tables_named("kube-proxy") {
        Ok(tables) if tables.is_empty() => tracing::debug!("kube-proxy: no nftables table"),
        Ok(tables) => {
            tracing::info!(tables = %tables.join(", "), "kube-proxy's nftables tables removed")
        }
        Err(e) => {
            failures.push(format!("kube-proxy's nftables tables: {}", kpng_runner::error_chain(&e)))
        }
    }
    for mode in [kpng_iptables::Mode::Nft, kpng_iptables::Mode::Legacy] {
        let command = mode.command(kpng_model::Family::V4, "");
        match kpng_iptables::leftovers::remove(mode) {
            Ok(0) => tracing::debug!(variant = %command, "kube-proxy: no iptables chain"),
            Ok(n) => {
                tracing::info!(variant = %command, chains = n, "kube-proxy's iptables chains removed")
            }
            Err(kpng_iptables::IptablesError::Spawn { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                tracing::debug!(variant = %command, "not installed: no kube-proxy chain there")
            }
            Err(e) => failures.push(format!(
                "kube-proxy's chains in {command}: {}",
                kpng_runner::error_chain(&e)
            )),
        }
    }
    if std::path::Path::new("/sys/class/net").join(IPVS_INTERFACE).exists() {
        match run("ip", &["link", "delete", IPVS_INTERFACE], None) {
            Ok(()) => {
                tracing::info!(interface = IPVS_INTERFACE, "kube-proxy's IPVS interface removed")
            }
            Err(e) => failures.push(format!("kube-proxy's interface {IPVS_INTERFACE}: {e}")),
        }
    }
    if let Err(e) = remove_ipsets() {
        failures.push(format!("kube-proxy's ipsets: {e}"));
    }
    for failure in &failures {
        tracing::warn!("removing kube-proxy's leftovers: {failure}");
    }
    failures
}

/// Destroys kube-proxy's ipsets in one `ipset restore`; without `ipset` there are none.
fn remove_ipsets() -> Result<(), String> {
    let listed = match Command::new("ipset").args(["list", "-n"]).stderr(Stdio::null()).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        // Not installed, or no ipset support in the kernel: nothing of kube-proxy's.
        _ => return Ok(()),
    };
    let doomed: Vec<&str> =
        listed.lines().map(str::trim).filter(|n| is_kube_proxy_ipset(n)).collect();
    if doomed.is_empty() {
        return Ok(());
    }
    let input: String = doomed.iter().map(|n| format!("destroy {n}\n")).collect();
    run("ipset", &["restore"], Some(&input))?;
    tracing::info!(sets = doomed.len(), "kube-proxy's ipsets removed");
    Ok(())
}

fn run(program: &str, args: &[&str], input: Option<&str>) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        let _ = stdin.write_all(text.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| format!("{program}: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_ipsets_are_known_by_their_cut_names() {
        assert!(is_kube_proxy_ipset("KUBE-CLUSTER-IP"));
        assert!(is_kube_proxy_ipset("KUBE-6-CLUSTER-IP"));
        assert!(is_kube_proxy_ipset("KUBE-6-LOAD-BALANCER-SOURCE-CID"));
        assert!(
            !is_kube_proxy_ipset("KUBE-6-LOAD-BALANCER-SOURCE-CIDR"),
            "longer than ipset allows"
        );
        assert!(!is_kube_proxy_ipset("MY-SET"));
    }
}
