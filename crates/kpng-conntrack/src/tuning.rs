//! Conntrack tuning at start-up, as kube-proxy does it: the table's size (at least
//! `--conntrack-min`, else `--conntrack-max-per-core` times the CPUs) with its hash size,
//! and the TCP and UDP timeouts. A value is written only when it differs, and logged; a
//! value that cannot be written (a read-only sysctl in a container or a network namespace)
//! is a warning, never a failure; 0 leaves a value alone.

use std::path::PathBuf;
use std::time::Duration;

/// The tuning kpng applies (kube-proxy's `--conntrack-*` flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConntrackTuning {
    /// Entries per CPU (`--conntrack-max-per-core`, default 32768; 0: leave the size).
    pub max_per_core: u32,
    /// The least table size (`--conntrack-min`, default 131072).
    pub min: u32,
    /// Idle timeout of established TCP connections (default 24h; 0: leave it).
    pub tcp_established: Duration,
    /// Timeout of TCP connections in CLOSE_WAIT (default 1h; 0: leave it).
    pub tcp_close_wait: Duration,
    /// Accept TCP packets outside the window (`--conntrack-tcp-be-liberal`).
    pub tcp_be_liberal: bool,
    /// Timeout of UDP flows seen in one direction (0: leave it).
    pub udp: Duration,
    /// Timeout of UDP flows seen in both directions (0: leave it).
    pub udp_stream: Duration,
}

impl Default for ConntrackTuning {
    fn default() -> Self {
        ConntrackTuning {
            max_per_core: 32_768,
            min: 131_072,
            tcp_established: Duration::from_secs(24 * 3600),
            tcp_close_wait: Duration::from_secs(3600),
            tcp_be_liberal: false,
            udp: Duration::ZERO,
            udp_stream: Duration::ZERO,
        }
    }
}

/// Where the values live: `/proc/sys/net/netfilter/<name>` and the module's hash size.
pub trait Sysctls {
    /// Reads a value.
    fn read(&mut self, name: &str) -> std::io::Result<u64>;
    /// Writes a value.
    fn write(&mut self, name: &str, value: u64) -> std::io::Result<()>;
}

/// The host's values.
#[derive(Debug, Clone)]
pub struct HostSysctls {
    /// `/proc/sys/net/netfilter`.
    pub netfilter: PathBuf,
    /// `/sys/module/nf_conntrack/parameters/hashsize`.
    pub hashsize: PathBuf,
}

impl Default for HostSysctls {
    fn default() -> Self {
        HostSysctls {
            netfilter: "/proc/sys/net/netfilter".into(),
            hashsize: "/sys/module/nf_conntrack/parameters/hashsize".into(),
        }
    }
}

/// The name of the module's hash size among the values.
pub const HASHSIZE: &str = "hashsize";

impl HostSysctls {
    fn path(&self, name: &str) -> PathBuf {
        match name {
            HASHSIZE => self.hashsize.clone(),
            other => self.netfilter.join(other),
        }
    }
}

impl Sysctls for HostSysctls {
    fn read(&mut self, name: &str) -> std::io::Result<u64> {
        let text = std::fs::read_to_string(self.path(name))?;
        text.trim().parse().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    fn write(&mut self, name: &str, value: u64) -> std::io::Result<()> {
        std::fs::write(self.path(name), format!("{value}\n"))
    }
}

/// What tuning did to one value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tuned {
    /// Written: from, to.
    Set(String, u64, u64),
    /// Already right.
    Kept(String, u64),
    /// Cannot be read or written: why (logged as a warning).
    Failed(String, String),
}

impl ConntrackTuning {
    /// The table size for `cpus` CPUs (0: leave it).
    pub fn max(&self, cpus: usize) -> u64 {
        if self.max_per_core == 0 {
            return 0;
        }
        (u64::from(self.max_per_core) * cpus as u64).max(u64::from(self.min))
    }

    /// The values to write: `(name, value)`, in order.
    fn wanted(&self, cpus: usize) -> Vec<(&'static str, u64)> {
        let mut wanted = Vec::new();
        let max = self.max(cpus);
        if max > 0 {
            wanted.push(("nf_conntrack_max", max));
        }
        let seconds = |d: Duration| d.as_secs();
        for (name, value) in [
            ("nf_conntrack_tcp_timeout_established", seconds(self.tcp_established)),
            ("nf_conntrack_tcp_timeout_close_wait", seconds(self.tcp_close_wait)),
            ("nf_conntrack_udp_timeout", seconds(self.udp)),
            ("nf_conntrack_udp_timeout_stream", seconds(self.udp_stream)),
        ] {
            if value > 0 {
                wanted.push((name, value));
            }
        }
        if self.tcp_be_liberal {
            wanted.push(("nf_conntrack_tcp_be_liberal", 1));
        }
        wanted
    }

    /// Applies the tuning for `cpus` CPUs; reports (and logs) what became of each value.
    pub fn apply(&self, sysctls: &mut dyn Sysctls, cpus: usize) -> Vec<Tuned> {
        let mut report = Vec::new();
        for (name, value) in self.wanted(cpus) {
            let tuned = set(sysctls, name, value);
            // The hash table should have a bucket for every four entries: grown only with
            // the table, by whoever may size the table (the host, not a network namespace).
            let grown = matches!(tuned, Tuned::Set(..));
            report.push(tuned);
            if name == "nf_conntrack_max"
                && grown
                && sysctls.read(HASHSIZE).is_ok_and(|h| h < value / 4)
            {
                report.push(set(sysctls, HASHSIZE, value / 4));
            }
        }
        for tuned in &report {
            match tuned {
                Tuned::Set(name, from, to) => tracing::info!(%name, from, to, "conntrack tuned"),
                Tuned::Kept(..) => {}
                Tuned::Failed(name, why) => {
                    tracing::warn!(%name, error = %why, "conntrack value left as it is (read-only here?)")
                }
            }
        }
        report
    }
}

fn set(sysctls: &mut dyn Sysctls, name: &str, value: u64) -> Tuned {
    match sysctls.read(name) {
        Ok(current) if current == value => Tuned::Kept(name.into(), value),
        Ok(current) => match sysctls.write(name, value) {
            Ok(()) => Tuned::Set(name.into(), current, value),
            Err(e) => Tuned::Failed(name.into(), e.to_string()),
        },
        Err(e) => Tuned::Failed(name.into(), e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Default)]
    struct Fake {
        values: BTreeMap<String, u64>,
        read_only: Vec<&'static str>,
        writes: Vec<(String, u64)>,
    }

    impl Sysctls for Fake {
        fn read(&mut self, name: &str) -> std::io::Result<u64> {
            self.values.get(name).copied().ok_or_else(|| std::io::ErrorKind::NotFound.into())
        }
        fn write(&mut self, name: &str, value: u64) -> std::io::Result<()> {
            if self.read_only.contains(&name) {
                return Err(std::io::ErrorKind::PermissionDenied.into());
            }
            self.writes.push((name.into(), value));
            self.values.insert(name.into(), value);
            Ok(())
        }
    }

    fn fake() -> Fake {
        let mut fake = Fake::default();
        for (name, value) in [
            ("nf_conntrack_max", 65_536),
            (HASHSIZE, 16_384),
            ("nf_conntrack_tcp_timeout_established", 432_000),
            ("nf_conntrack_tcp_timeout_close_wait", 3600),
            ("nf_conntrack_udp_timeout", 30),
        ] {
            fake.values.insert(name.into(), value);
        }
        fake
    }

    #[test]
    fn only_values_that_differ_are_written() {
        let mut sysctls = fake();
        let report = ConntrackTuning::default().apply(&mut sysctls, 8);
        // 8 CPUs × 32768 = 262144 > the minimum; the hash size follows at a quarter.
        assert_eq!(
            sysctls.writes,
            [
                ("nf_conntrack_max".to_string(), 262_144),
                (HASHSIZE.to_string(), 65_536),
                ("nf_conntrack_tcp_timeout_established".to_string(), 86_400),
            ]
        );
        assert!(report.contains(&Tuned::Kept("nf_conntrack_tcp_timeout_close_wait".into(), 3600)));
        // UDP timeouts are left alone by default (0).
        assert_eq!(sysctls.values["nf_conntrack_udp_timeout"], 30);
        // A second run changes nothing.
        sysctls.writes.clear();
        ConntrackTuning::default().apply(&mut sysctls, 8);
        assert!(sysctls.writes.is_empty());
    }

    #[test]
    fn the_minimum_wins_on_small_machines_and_zero_leaves_values_alone() {
        let tuning = ConntrackTuning::default();
        assert_eq!(tuning.max(2), 131_072);
        let none = ConntrackTuning {
            max_per_core: 0,
            tcp_established: Duration::ZERO,
            tcp_close_wait: Duration::ZERO,
            ..tuning
        };
        let mut sysctls = fake();
        assert!(none.apply(&mut sysctls, 2).is_empty());
        assert!(sysctls.writes.is_empty());
    }

    #[test]
    fn read_only_values_are_warnings_not_failures() {
        let mut sysctls = fake();
        sysctls.read_only = vec!["nf_conntrack_max", HASHSIZE];
        let tuning = ConntrackTuning {
            tcp_be_liberal: true,
            udp: Duration::from_secs(60),
            ..Default::default()
        };
        let report = tuning.apply(&mut sysctls, 8);
        assert!(matches!(&report[0], Tuned::Failed(name, _) if name == "nf_conntrack_max"));
        // The hash size follows only a table this process could size.
        assert!(
            !report
                .iter()
                .any(|t| matches!(t, Tuned::Failed(n, _) | Tuned::Set(n, ..) if n == HASHSIZE))
        );
        // The rest is still applied.
        assert_eq!(sysctls.values["nf_conntrack_udp_timeout"], 60);
        assert!(report.contains(&Tuned::Failed(
            "nf_conntrack_tcp_be_liberal".into(),
            "entity not found".into()
        )));
    }
}
