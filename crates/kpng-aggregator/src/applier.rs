//! Where batches go: [`Applier`], with [`NftApplier`] (one `nft -f -` process per batch,
//! optionally in a named network namespace) and [`MemoryApplier`] (records transactions,
//! refuses what it is told to, for tests).

use std::io::Write;
use std::process::{Command, Stdio};

use crate::diff::Script;
use crate::model::{Family, TableKey};

/// What nft (or the memory applier) said about a script it refused, or why it could not
/// be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct NftError {
    /// nft's error text: the position, the error, and the failing command as written.
    pub message: String,
}

impl NftError {
    /// The failing command nft quotes under its error, if it quotes one: the command names
    /// the object (`add rule ip t c ...`).
    pub fn command(&self) -> Option<&str> {
        let mut lines = self.message.lines();
        lines.find(|line| line.contains("Error:"))?;
        lines.next().map(str::trim).filter(|line| !line.is_empty())
    }
}

/// Runs nft scripts. Each [`commit`](Applier::commit) is one atomic transaction.
pub trait Applier: Send {
    /// Commits `script` as one transaction: all of it, or nothing.
    fn commit(&mut self, script: &Script) -> Result<(), NftError>;
    /// Checks `script` against the current ruleset without committing (`nft -c`).
    fn check(&mut self, script: &Script) -> Result<(), NftError>;
    /// The tables that exist.
    fn tables(&mut self) -> Result<Vec<TableKey>, NftError>;
    /// The ruleset as `nft -s list ruleset` prints it (no counter values).
    fn ruleset(&mut self) -> Result<String, NftError>;
}

/// The real thing: one `nft` process per call, which sends one netlink batch (one kernel
/// transaction) per script.
#[derive(Debug, Clone, Default)]
pub struct NftApplier {
    netns: Option<String>,
}

impl NftApplier {
    /// Programs this network namespace.
    pub fn new() -> Self {
        NftApplier { netns: None }
    }

    /// Programs the named network namespace (`ip netns exec NAME nft ...`).
    pub fn in_netns(name: impl Into<String>) -> Self {
        NftApplier { netns: Some(name.into()) }
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, NftError> {
        let mut command = match &self.netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns, "nft"]);
                command
            }
            None => Command::new("nft"),
        };
        command.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        command.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let failed = |e: std::io::Error| NftError { message: format!("running nft: {e}") };
        let started = std::time::Instant::now();
        let mut child = command.spawn().map_err(failed)?;
        let spawned = started.elapsed();
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes()).map_err(failed)?;
        }
        let output = child.wait_with_output().map_err(failed)?;
        tracing::debug!(?args, ?spawned, took = ?started.elapsed(), "nft run");
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
        }
        let message = String::from_utf8_lossy(&output.stderr).trim().to_string();
        Err(NftError { message: format!("nft {} failed: {message}", args.join(" ")) })
    }
}

impl Applier for NftApplier {
    fn commit(&mut self, script: &Script) -> Result<(), NftError> {
        self.run(&["-f", "-"], Some(&script.to_string())).map(drop)
    }

    fn check(&mut self, script: &Script) -> Result<(), NftError> {
        self.run(&["-c", "-f", "-"], Some(&script.to_string())).map(drop)
    }

    fn tables(&mut self) -> Result<Vec<TableKey>, NftError> {
        let listed = self.run(&["list", "tables"], None)?;
        Ok(listed.lines().filter_map(parse_table_line).collect())
    }

    fn ruleset(&mut self) -> Result<String, NftError> {
        self.run(&["-s", "list", "ruleset"], None)
    }
}

/// `table FAMILY NAME`, as `nft list tables` prints each table.
pub(crate) fn parse_table_line(line: &str) -> Option<TableKey> {
    let mut words = line.split_whitespace();
    let (Some("table"), Some(family), Some(name)) = (words.next(), words.next(), words.next())
    else {
        return None;
    };
    Some(TableKey::new(family.parse::<Family>().ok()?, name))
}

/// A recording applier for tests: counts transactions, refuses any script that holds one of
/// [`refuse`](Self::refuse) (as nft would, quoting the command), and lists what it is told.
#[derive(Debug, Clone, Default)]
pub struct MemoryApplier {
    /// Scripts committed, one per transaction.
    pub transactions: Vec<Script>,
    /// Scripts checked.
    pub checks: Vec<Script>,
    /// Texts that make a command fail.
    pub refuse: Vec<String>,
    /// Tables that exist outside the aggregator.
    pub foreign: Vec<TableKey>,
    /// What [`Applier::ruleset`] returns (`None`: listing fails).
    pub listed: Option<String>,
}

impl MemoryApplier {
    fn judge(&self, script: &Script) -> Result<(), NftError> {
        let refused = script
            .commands
            .iter()
            .enumerate()
            .find(|(_, command)| self.refuse.iter().any(|r| command.contains(r.as_str())));
        match refused {
            None => Ok(()),
            Some((index, command)) => Err(NftError {
                message: format!(
                    "/dev/stdin:{}:1-{}: Error: Could not process rule: No such file or directory\n{command}",
                    index + 1,
                    command.len()
                ),
            }),
        }
    }
}

impl Applier for MemoryApplier {
    fn commit(&mut self, script: &Script) -> Result<(), NftError> {
        self.judge(script)?;
        self.transactions.push(script.clone());
        Ok(())
    }

    fn check(&mut self, script: &Script) -> Result<(), NftError> {
        self.checks.push(script.clone());
        self.judge(script)
    }

    fn tables(&mut self) -> Result<Vec<TableKey>, NftError> {
        Ok(self.foreign.clone())
    }

    fn ruleset(&mut self) -> Result<String, NftError> {
        self.listed.clone().ok_or_else(|| NftError { message: "no ruleset to list".into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lines_parse_and_errors_quote_the_command() {
        assert_eq!(parse_table_line("table inet fw"), Some(TableKey::new(Family::Inet, "fw")));
        assert_eq!(parse_table_line("chain x"), None);
        let error = NftError {
            message: "/dev/stdin:1:13-13: Error: Could not process rule: No such file or directory\nadd rule ip t nochain accept\n            ^".into(),
        };
        assert_eq!(error.command(), Some("add rule ip t nochain accept"));
    }
}
