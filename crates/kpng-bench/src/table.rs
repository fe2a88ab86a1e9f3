//! Percentiles and tables.

use std::time::Duration;

/// p50, p99 and max of `samples`, in milliseconds.
pub fn percentiles(samples: &mut [Duration]) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    samples.sort();
    let at =
        |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1000.0;
    (at(0.5), at(0.99), at(1.0))
}

/// The timings of one kind of change.
#[derive(Debug, Clone, Copy)]
pub struct ChangeStats {
    /// What changed.
    pub name: &'static str,
    /// Model update to committed transaction: p50, p99, max (ms).
    pub wall: (f64, f64, f64),
    /// The kernel commit alone: p50, p99 (ms).
    pub kernel: (f64, f64),
    /// CPU time (user + system) per change (ms).
    pub cpu: f64,
    /// Netlink bytes per change (median).
    pub bytes: u64,
}

/// One size's results.
pub struct NftRow {
    /// Services.
    pub services: usize,
    /// Endpoints per service.
    pub endpoints: usize,
    /// Elements in the table.
    pub elements: usize,
    /// Chains in the tables.
    pub chains: usize,
    /// Rules of endpoint counts beyond the pick tree (one per such count in use).
    pub large_counts: usize,
    /// Cold start: whole table in one transaction (ms).
    pub cold_start_ms: f64,
    /// The kernel's part of the cold start: the one big commit (ms).
    pub cold_kernel_ms: f64,
    /// Netlink bytes of the cold start's transaction.
    pub cold_bytes: u64,
    /// Per kind of change.
    pub changes: Vec<ChangeStats>,
    /// Full `nft -f` reload of the whole ruleset (ms, median; 0 with `--reloads 0`).
    pub reload_ms: f64,
    /// kube-proxy's iptables mode: the whole nat table through `iptables-restore` (ms,
    /// median); `None` without `iptables-restore` or with `--reloads 0`.
    pub iptables_ms: Option<f64>,
}

/// Prints the nftables table.
pub fn print_nft(rows: &[NftRow]) {
    println!("nftables backend (one atomic netlink transaction per change)");
    println!(
        "{:>8} {:>4} {:>12} {:>14} {:>14}",
        "services", "eps", "cold(ms)", "cold-kern(ms)", "netlink(KiB)"
    );
    for row in rows {
        println!(
            "{:>8} {:>4} {:>12.1} {:>14.1} {:>14.1}",
            row.services,
            row.endpoints,
            row.cold_start_ms,
            row.cold_kernel_ms,
            row.cold_bytes as f64 / 1024.0
        );
    }
    println!(
        "{:>8} {:>4} {:>9} {:>6} {:>5} {:>10} | {:<16} {:>8} {:>8} {:>8} {:>10} {:>10} {:>8} {:>7} | {:>10} {:>12} | {:>10} {:>10}",
        "services",
        "eps",
        "elements",
        "chains",
        "large",
        "cold(ms)",
        "change",
        "p50(ms)",
        "p99(ms)",
        "max(ms)",
        "kern50(ms)",
        "kern99(ms)",
        "cpu(ms)",
        "bytes",
        "reload(ms)",
        "reload/p50",
        "ipt(ms)",
        "ipt/p50"
    );
    for row in rows {
        for ChangeStats { name, wall: (p50, p99, max), kernel: (k50, k99), cpu, bytes } in
            &row.changes
        {
            println!(
                "{:>8} {:>4} {:>9} {:>6} {:>5} {:>10.1} | {:<16} {:>8.3} {:>8.3} {:>8.3} {:>10.3} {:>10.3} {:>8.3} {:>7} | {:>10.1} {:>12.0} | {:>10} {:>10}",
                row.services,
                row.endpoints,
                row.elements,
                row.chains,
                row.large_counts,
                row.cold_start_ms,
                name,
                p50,
                p99,
                max,
                k50,
                k99,
                cpu,
                bytes,
                row.reload_ms,
                if *p50 > 0.0 { row.reload_ms / p50 } else { 0.0 },
                row.iptables_ms.map_or("n/a".into(), |ms| format!("{ms:.1}")),
                row.iptables_ms
                    .filter(|_| *p50 > 0.0)
                    .map_or("n/a".into(), |ms| format!("{:.0}", ms / p50)),
            );
        }
    }
    println!(
        "* cold-kern and netlink: every part of the cold start summed (the parts commit on a \
         second thread while the next renders)"
    );
}
