//! The kernel side: the [`Kernel`] trait (read kpng's chains back, apply a restore), and
//! [`CommandKernel`], which runs `iptables-save` and `iptables-restore --noflush -w` of the
//! chosen variant.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Stdio};

use kpng_model::Family;

use crate::error::IptablesError;
use crate::names::{ChainName, PREFIX};
use crate::render::Table;

/// What one family's tables hold of kpng's: its chains' rules as `iptables-save` prints
/// them (after `-A CHAIN `), and the rules of built-in chains that jump into kpng's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// kpng's chains.
    pub chains: BTreeMap<(Table, ChainName), Vec<String>>,
    /// `(table, built-in chain, rule)` of jumps into kpng's chains.
    pub hooks: BTreeSet<(Table, String, String)>,
}

impl Snapshot {
    /// Reads `iptables-save` output (or `iptables -S CHAIN` output after a `*table` line),
    /// keeping only what concerns kpng.
    pub fn parse(text: &str) -> Snapshot {
        let mut snapshot = Snapshot::default();
        let mut table = None;
        for line in text.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = match name.trim() {
                    "nat" => Some(Table::Nat),
                    "filter" => Some(Table::Filter),
                    _ => None,
                };
                continue;
            }
            let Some(table) = table else { continue };
            // `:NAME` in `iptables-save` output, `-N NAME` in `iptables -S` output.
            if let Some(decl) = line.strip_prefix(':').or_else(|| line.strip_prefix("-N ")) {
                let name = decl.split_whitespace().next().unwrap_or_default();
                if let Ok(chain) = ChainName::new(name) {
                    snapshot.chains.entry((table, chain)).or_default();
                }
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let (chain, rest) = rule.split_once(' ').unwrap_or((rule, ""));
                match ChainName::new(chain) {
                    Ok(chain) => {
                        snapshot.chains.entry((table, chain)).or_default().push(rest.to_string())
                    }
                    Err(_) if rest.contains(&format!("-j {PREFIX}")) => {
                        snapshot.hooks.insert((table, chain.to_string(), rest.to_string()));
                    }
                    Err(_) => {}
                }
            }
        }
        snapshot
    }
}

/// Where kpng's rules go: the kernel, or a stand-in.
pub trait Kernel: Send {
    /// What the tables of `family` hold of kpng's.
    fn read(&mut self, family: Family) -> Result<Snapshot, IptablesError>;

    /// What the listed chains of `family` hold: kpng's among them (absent ones left out)
    /// and the jumps into kpng's chains from the built-in ones. Reads no other chain, so
    /// its cost does not grow with the number of services.
    fn read_chains(
        &mut self,
        family: Family,
        chains: &[(Table, String)],
    ) -> Result<Snapshot, IptablesError> {
        let mut snapshot = self.read(family)?;
        let listed =
            |table: &Table, chain: &str| chains.iter().any(|(t, c)| t == table && c == chain);
        snapshot.chains.retain(|(table, chain), _| listed(table, chain.as_str()));
        snapshot.hooks.retain(|(table, builtin, _)| listed(table, builtin));
        Ok(snapshot)
    }

    /// Applies `input` (an `iptables-restore --noflush` text) to `family`. Each table's
    /// section commits whole or not at all.
    fn restore(&mut self, family: Family, input: &str) -> Result<(), IptablesError>;

    /// A number every committed table section moves by one (and every other process's
    /// commit moves too), when the variant has one: the nf_tables ruleset generation of
    /// `iptables-nft`. `iptables-legacy` has none.
    fn generation(&mut self) -> Option<u64> {
        None
    }
}

/// The network namespace's nf_tables ruleset generation, or `None` when it cannot be read.
fn nft_generation() -> Option<u64> {
    use kpng_netlink::message::NETLINK_NETFILTER;
    use kpng_netlink::socket::NetlinkSocket;
    let read = NetlinkSocket::open(NETLINK_NETFILTER)
        .and_then(|mut socket| kpng_netlink::nftables::dump::read_generation(&mut socket));
    match read {
        Ok(generation) => generation.map(u64::from),
        Err(error) => {
            tracing::debug!(%error, "the nf_tables generation could not be read");
            None
        }
    }
}

/// Which iptables variant to drive (`--iptables-mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// The system's `iptables` (whichever variant it is).
    #[default]
    Auto,
    /// `iptables-nft`: the xtables rules in nf_tables.
    Nft,
    /// `iptables-legacy`: the legacy xtables.
    Legacy,
}

impl Mode {
    /// The command for `tool` (`save` or `restore`, or `""` for the plain command).
    pub fn command(self, family: Family, tool: &str) -> String {
        let base = match family {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        };
        let variant = match self {
            Mode::Auto => "",
            Mode::Nft => "-nft",
            Mode::Legacy => "-legacy",
        };
        match tool {
            "" => format!("{base}{variant}"),
            tool => format!("{base}{variant}-{tool}"),
        }
    }

    /// The variant to drive on this node. `Auto` becomes the variant the kubelet uses (it
    /// creates `KUBE-IPTABLES-HINT` or `KUBE-KUBELET-CANARY` in `mangle` of that variant),
    /// else the variant already holding kpng's chains, else stays the system's `iptables`;
    /// with the reason, for the log. A variant whose tables do not exist is not listed
    /// (listing legacy tables would create them). When both variants hold kpng's chains
    /// (an earlier run in the other mode), the one not chosen is stale: that is logged and
    /// its chains removed, so two sets of kpng's rules never answer the same packets.
    pub fn resolve(self) -> (Mode, &'static str) {
        match self {
            Mode::Auto => {
                let (nft, legacy) = (Marks::probe(Mode::Nft), Marks::probe(Mode::Legacy));
                let (mode, why) = Mode::choose(nft, legacy);
                if let Some(stale) = Mode::stale(nft, legacy, mode.variant()) {
                    remove_stale(stale, mode);
                }
                (mode, why)
            }
            mode => (mode, "--iptables-mode"),
        }
    }

    /// The variant holding kpng's chains that is not `used`, when both hold them.
    pub fn stale(nft: Marks, legacy: Marks, used: Mode) -> Option<Mode> {
        match (nft.kpng && legacy.kpng, used) {
            (false, _) => None,
            (true, Mode::Legacy) => Some(Mode::Nft),
            (true, _) => Some(Mode::Legacy),
        }
    }

    /// `Nft` or `Legacy`: for `Auto`, the variant the system's `iptables` is.
    pub fn variant(self) -> Mode {
        match self {
            Mode::Auto if self.describe().contains("legacy") => Mode::Legacy,
            Mode::Auto => Mode::Nft,
            mode => mode,
        }
    }

    /// What `Auto` becomes given what each variant holds.
    pub fn choose(nft: Marks, legacy: Marks) -> (Mode, &'static str) {
        match (nft, legacy) {
            (n, l) if n.kubelet != l.kubelet => match n.kubelet {
                true => (Mode::Nft, "the kubelet's chains are in iptables-nft"),
                false => (Mode::Legacy, "the kubelet's chains are in iptables-legacy"),
            },
            (n, l) if n.kpng != l.kpng => match n.kpng {
                true => (Mode::Nft, "kpng's chains are in iptables-nft"),
                false => (Mode::Legacy, "kpng's chains are in iptables-legacy"),
            },
            _ => (Mode::Auto, "the system's iptables"),
        }
    }

    /// The variant `iptables -V` names (`nf_tables` or `legacy`), for the log.
    pub fn describe(self) -> String {
        let out = Command::new(self.command(Family::V4, "")).arg("-V").output();
        match out {
            Ok(out) => String::from_utf8_lossy(&out.stdout).trim().to_string(),
            Err(e) => format!("{} unavailable: {e}", self.command(Family::V4, "")),
        }
    }
}

/// Removes kpng's chains from the variant `stale`, which `used` replaced.
fn remove_stale(stale: Mode, used: Mode) {
    let (stale_name, used_name) = (stale.command(Family::V4, ""), used.command(Family::V4, ""));
    tracing::warn!(
        stale = %stale_name,
        used = %used_name,
        "iptables: kpng's chains are in both variants; removing those of the variant not used"
    );
    match cleanup(stale) {
        Ok(removed) => {
            tracing::info!(stale = %stale_name, chains = removed, "iptables: the unused variant's chains removed")
        }
        Err(error) => {
            tracing::warn!(stale = %stale_name, %error, "iptables: the unused variant's chains could not be removed (kpng cleanup --backend iptables removes them)")
        }
    }
}

/// What one variant's IPv4 tables show of who uses it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// The kubelet's `KUBE-IPTABLES-HINT` or `KUBE-KUBELET-CANARY` chain in `mangle`.
    pub kubelet: bool,
    /// kpng's `KPNG-SERVICES` in `nat`.
    pub kpng: bool,
}

impl Marks {
    /// Lists the chains in `mode`'s variant (`Nft` or `Legacy`); a missing command or
    /// table shows nothing.
    pub fn probe(mode: Mode) -> Marks {
        // Legacy tables a netns has are listed here; listing one that is absent creates it.
        let legacy = std::fs::read_to_string("/proc/net/ip_tables_names").unwrap_or_default();
        let has = |table: &str, chain: &str| {
            if mode == Mode::Legacy && !legacy.lines().any(|t| t == table) {
                return false;
            }
            Command::new(mode.command(Family::V4, ""))
                .args(["-w", "-t", table, "-S", chain])
                .stderr(Stdio::null())
                .output()
                .is_ok_and(|out| out.status.success())
        };
        Marks {
            kubelet: has("mangle", "KUBE-IPTABLES-HINT") || has("mangle", "KUBE-KUBELET-CANARY"),
            kpng: has("nat", "KPNG-SERVICES"),
        }
    }
}

/// The real kernel, through the iptables commands of one variant.
#[derive(Debug, Clone, Copy)]
pub struct CommandKernel {
    mode: Mode,
    /// The variant is the legacy one, whose commands wait for the xtables lock.
    legacy: bool,
}

impl CommandKernel {
    /// Drives the commands of `mode`; checks that they run.
    pub fn new(mode: Mode) -> Result<CommandKernel, IptablesError> {
        let kernel = CommandKernel { mode, legacy: mode.variant() == Mode::Legacy };
        for family in Family::ALL {
            kernel.read(family)?;
        }
        Ok(kernel)
    }

    /// Drives the commands of `mode`, unchecked (for a one-off clean-up).
    pub(crate) fn unchecked(mode: Mode) -> CommandKernel {
        CommandKernel { mode, legacy: mode.variant() == Mode::Legacy }
    }

    fn read(&self, family: Family) -> Result<Snapshot, IptablesError> {
        Ok(Snapshot::parse(&self.save(family)?))
    }

    /// What `iptables-save` of this variant prints for `family`: every table it has.
    pub(crate) fn save(&self, family: Family) -> Result<String, IptablesError> {
        let program = self.mode.command(family, "save");
        let out = Command::new(&program)
            .output()
            .map_err(|source| IptablesError::Spawn { program: program.clone(), source })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(IptablesError::Save { program, stderr });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// The input line a restore error names: `Error occurred at line: N` or `line N: ...`
/// (nf_tables variant), `line N failed` (legacy).
pub fn failed_line(stderr: &str) -> Option<usize> {
    if let Some(rest) = stderr.split("Error occurred at line: ").nth(1) {
        return rest.split_whitespace().next()?.parse().ok();
    }
    stderr.split("line ").skip(1).find_map(|rest| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let after = &rest[digits.len()..];
        (after.starts_with(':') || after.starts_with(" failed")).then(|| digits.parse().ok())?
    })
}

impl Kernel for CommandKernel {
    fn read(&mut self, family: Family) -> Result<Snapshot, IptablesError> {
        CommandKernel::read(self, family)
    }

    fn generation(&mut self) -> Option<u64> {
        match self.legacy {
            true => None,
            false => nft_generation(),
        }
    }

    fn read_chains(
        &mut self,
        family: Family,
        chains: &[(Table, String)],
    ) -> Result<Snapshot, IptablesError> {
        // One `-S CHAIN` per chain: each reads that chain alone (a few milliseconds at any
        // table size), where `iptables-nft-save` of 30,000 chains takes seconds.
        let program = self.mode.command(family, "");
        let mut text = String::new();
        for (table, chain) in chains {
            let out = Command::new(&program)
                .args(["-w", "-t", table.as_str(), "-S", chain])
                .output()
                .map_err(|source| IptablesError::Spawn { program: program.clone(), source })?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            if out.status.success() {
                text.push_str(&format!("*{}\n", table.as_str()));
                text.push_str(&String::from_utf8_lossy(&out.stdout));
            } else if !(stderr.contains("No chain/target/match by that name")
                // What iptables-nft 1.8 says of a missing chain, and of a chain holding
                // rules it cannot print: either way not what kpng committed.
                || stderr.contains("is incompatible"))
            {
                return Err(IptablesError::Save {
                    program: format!("{program} -t {} -S {chain}", table.as_str()),
                    stderr: stderr.trim().to_string(),
                });
            }
        }
        Ok(Snapshot::parse(&text))
    }

    fn restore(&mut self, family: Family, input: &str) -> Result<(), IptablesError> {
        if self.legacy {
            note_lock_wait();
        }
        let program = self.mode.command(family, "restore");
        let spawn = |source| IptablesError::Spawn { program: program.clone(), source };
        let mut child = Command::new(&program)
            .args(["--noflush", "-w"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn)?;
        let write = child.stdin.take().map(|mut stdin| stdin.write_all(input.as_bytes()));
        let out = child.wait_with_output().map_err(spawn)?;
        if out.status.success() {
            if let Some(Err(source)) = write {
                return Err(spawn(source));
            }
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let line = failed_line(&stderr);
        let text = line.and_then(|n| input.lines().nth(n.checked_sub(1)?)).map(str::to_string);
        Err(IptablesError::Restore { program, line, text, stderr })
    }
}

/// The file legacy iptables commands lock (`-w` waits for it): `$XTABLES_LOCKFILE`, as
/// they read it, or `/run/xtables.lock`.
pub fn xtables_lock() -> std::path::PathBuf {
    std::env::var_os("XTABLES_LOCKFILE")
        .map_or_else(|| "/run/xtables.lock".into(), std::path::PathBuf::from)
}

/// Logs, with the lock's path, when another process holds the xtables lock that the
/// restore about to run will wait for: a restore that seems to hang says why.
fn note_lock_wait() {
    use nix::fcntl::{Flock, FlockArg};
    let path = xtables_lock();
    let Ok(file) = std::fs::File::open(&path) else { return };
    if let Err((_, errno)) = Flock::lock(file, FlockArg::LockExclusiveNonblock)
        && errno == nix::errno::Errno::EWOULDBLOCK
    {
        tracing::warn!(lock = %path.display(), "iptables: another process holds the xtables lock; waiting for it");
    }
}

/// Removes every chain of kpng's, and the jumps into them, from both families' nat and
/// filter tables of `mode`'s variant; returns how many chains went.
pub fn cleanup(mode: Mode) -> Result<usize, IptablesError> {
    let mut kernel = CommandKernel::unchecked(mode);
    let mut removed = 0;
    for family in Family::ALL {
        let snapshot = kernel.read(family)?;
        let text = cleanup_text(&snapshot);
        if !text.is_empty() {
            kernel.restore(family, &text)?;
        }
        removed += snapshot.chains.len();
    }
    Ok(removed)
}

/// The restore input that removes what `snapshot` lists.
pub fn cleanup_text(snapshot: &Snapshot) -> String {
    use std::fmt::Write;
    let mut text = String::new();
    for table in Table::ALL {
        let chains: Vec<&ChainName> =
            snapshot.chains.keys().filter(|(t, _)| *t == table).map(|(_, c)| c).collect();
        let hooks: Vec<_> = snapshot.hooks.iter().filter(|(t, _, _)| *t == table).collect();
        if chains.is_empty() && hooks.is_empty() {
            continue;
        }
        let _ = writeln!(text, "*{}", table.as_str());
        for chain in &chains {
            let _ = writeln!(text, ":{chain} - [0:0]");
        }
        for (_, builtin, rule) in hooks {
            let _ = writeln!(text, "-D {builtin} {rule}");
        }
        for chain in &chains {
            let _ = writeln!(text, "-X {chain}");
        }
        text.push_str("COMMIT\n");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVED: &str = "# Generated by iptables-nft-save v1.8.9\n*filter\n:INPUT ACCEPT [0:0]\n:KPNG-FILTER - [0:0]\n:KUBE-X - [0:0]\n-A INPUT -m conntrack --ctstate NEW -m comment --comment kpng -j KPNG-FILTER\n-A INPUT -j KUBE-X\n-A KPNG-FILTER -d 10.96.0.0/12 -j DROP\nCOMMIT\n*nat\n:PREROUTING ACCEPT [0:0]\n:KPNG-SERVICES - [0:0]\n:KPNG-NODEPORTS - [0:0]\n-A KPNG-SERVICES -d 0.0.0.5/0.0.0.15 -j KPNG-SH-5\nCOMMIT\n*mangle\n:KPNG-ODD - [0:0]\nCOMMIT\n";

    #[test]
    fn save_output_keeps_kpngs_chains_and_hooks_only() {
        let snapshot = Snapshot::parse(SAVED);
        let names: Vec<String> =
            snapshot.chains.keys().map(|(t, c)| format!("{}/{c}", t.as_str())).collect();
        assert_eq!(names, ["nat/KPNG-NODEPORTS", "nat/KPNG-SERVICES", "filter/KPNG-FILTER"]);
        assert_eq!(
            snapshot.chains[&(Table::Filter, ChainName::new("KPNG-FILTER").unwrap())],
            ["-d 10.96.0.0/12 -j DROP"]
        );
        assert_eq!(snapshot.hooks.len(), 1);
        let cleanup = cleanup_text(&snapshot);
        assert!(
            cleanup.contains(
                "-D INPUT -m conntrack --ctstate NEW -m comment --comment kpng -j KPNG-FILTER\n"
            ),
            "{cleanup}"
        );
        assert!(!cleanup.contains("KUBE-X"), "{cleanup}");
        assert!(cleanup.contains("-X KPNG-SERVICES\n"), "{cleanup}");
    }

    #[test]
    fn restore_errors_name_their_line_in_both_variants() {
        assert_eq!(
            failed_line(
                "iptables-restore v1.8.9 (nf_tables): unknown option\nError occurred at line: 7\nTry `iptables-restore -h'"
            ),
            Some(7)
        );
        assert_eq!(failed_line("iptables-restore: line 12 failed"), Some(12));
        assert_eq!(
            failed_line(
                "iptables-restore v1.8.9 (nf_tables): \nline 5: CHAIN_DEL failed (Device or resource busy): chain KPNG-SEP-X"
            ),
            Some(5)
        );
        assert_eq!(failed_line("something else"), None);
    }

    #[test]
    fn auto_follows_the_kubelet_then_kpngs_own_chains() {
        let none = Marks::default();
        let kubelet = Marks { kubelet: true, kpng: false };
        let kpng = Marks { kubelet: false, kpng: true };
        assert_eq!(Mode::choose(none, kubelet).0, Mode::Legacy);
        assert_eq!(Mode::choose(kubelet, none).0, Mode::Nft);
        // The kubelet wins over where kpng ran before.
        assert_eq!(Mode::choose(kpng, kubelet).0, Mode::Legacy);
        assert_eq!(Mode::choose(none, kpng).0, Mode::Legacy);
        assert_eq!(Mode::choose(kpng, none).0, Mode::Nft);
        // Nothing, or both alike: the system's iptables.
        assert_eq!(Mode::choose(none, none).0, Mode::Auto);
        assert_eq!(Mode::choose(kubelet, kubelet).0, Mode::Auto);
        assert_eq!(Mode::Legacy.resolve().0, Mode::Legacy);
    }

    #[test]
    fn kpngs_chains_in_both_variants_make_the_unused_one_stale() {
        let none = Marks::default();
        let kpng = Marks { kubelet: false, kpng: true };
        let both = Marks { kubelet: true, kpng: true };
        assert_eq!(Mode::stale(kpng, none, Mode::Nft), None, "one variant: nothing stale");
        assert_eq!(Mode::stale(kpng, both, Mode::Legacy), Some(Mode::Nft));
        assert_eq!(Mode::stale(both, kpng, Mode::Nft), Some(Mode::Legacy));
    }

    #[test]
    fn mode_names_its_commands() {
        assert_eq!(Mode::Legacy.command(Family::V6, "restore"), "ip6tables-legacy-restore");
        assert_eq!(Mode::Auto.command(Family::V4, "save"), "iptables-save");
        assert_eq!(Mode::Nft.command(Family::V4, ""), "iptables-nft");
    }
}
