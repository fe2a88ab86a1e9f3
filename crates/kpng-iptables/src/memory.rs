//! [`MemoryKernel`]: tables in memory that apply restore inputs as `iptables-restore
//! --noflush` does (each table's section whole or not at all, jumps to missing chains and
//! deletions of referenced chains refused), with injected failures; used by tests and, with
//! a printer, by `--dry-run`.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use kpng_model::Family;

use crate::error::IptablesError;
use crate::kernel::{Kernel, Snapshot};
use crate::names::ChainName;
use crate::render::Table;

#[derive(Debug, Default)]
struct Inner {
    families: BTreeMap<Family, Snapshot>,
    /// Fail this many restores from now.
    failures: usize,
    /// Fail this many restores of one family from now.
    family_failures: BTreeMap<Family, usize>,
    restores: usize,
    /// Table sections committed, by kpng or by [`MemoryKernel::set_snapshot`]: the
    /// generation of `iptables-nft`'s tables.
    generation: u64,
}

/// In-memory tables. Clones share them, so a test keeps a handle on what a backend holds.
#[derive(Clone, Default)]
pub struct MemoryKernel {
    inner: Arc<Mutex<Inner>>,
    printer: Option<Arc<Mutex<Box<dyn Write + Send>>>>,
}

impl MemoryKernel {
    /// Empty tables.
    pub fn new() -> MemoryKernel {
        MemoryKernel::default()
    }

    /// Empty tables that also print every restore input (`--dry-run`).
    pub fn printing(out: impl Write + Send + 'static) -> MemoryKernel {
        MemoryKernel {
            printer: Some(Arc::new(Mutex::new(Box::new(out)))),
            ..MemoryKernel::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock is a test failure already.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What `family` holds.
    pub fn snapshot(&self, family: Family) -> Snapshot {
        self.lock().families.get(&family).cloned().unwrap_or_default()
    }

    /// Replaces what `family` holds (someone else changed the tables).
    pub fn set_snapshot(&self, family: Family, snapshot: Snapshot) {
        let mut inner = self.lock();
        inner.families.insert(family, snapshot);
        inner.generation += 1;
    }

    /// Makes the next `n` restores fail.
    pub fn fail_next(&self, n: usize) {
        self.lock().failures = n;
    }

    /// Makes the next `n` restores of `family` fail.
    pub fn fail_next_in(&self, family: Family, n: usize) {
        self.lock().family_failures.insert(family, n);
    }

    /// Restores applied so far (refused ones included).
    pub fn restores(&self) -> usize {
        self.lock().restores
    }
}

fn apply_table(
    tables: &mut Snapshot,
    table: Table,
    lines: &[(usize, &str)],
) -> Result<(), (usize, String)> {
    let mut work = tables.clone();
    for (n, line) in lines {
        let fail = |why: &str| Err((*n, format!("{why}: {line}")));
        if let Some(decl) = line.strip_prefix(':') {
            let name = decl.split_whitespace().next().unwrap_or_default();
            let Ok(chain) = ChainName::new(name) else { return fail("not a kpng chain") };
            work.chains.insert((table, chain), Vec::new());
        } else if let Some(rest) = line.strip_prefix("-I ") {
            let mut parts = rest.splitn(3, ' ');
            let (Some(builtin), Some("1"), Some(rule)) = (parts.next(), parts.next(), parts.next())
            else {
                return fail("bad insert");
            };
            work.hooks.insert((table, builtin.to_string(), rule.to_string()));
        } else if let Some(rest) = line.strip_prefix("-D ") {
            let (builtin, rule) = rest.split_once(' ').unwrap_or((rest, ""));
            if !work.hooks.remove(&(table, builtin.to_string(), rule.to_string())) {
                return fail("no such rule");
            }
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let (chain, rule) = rest.split_once(' ').unwrap_or((rest, ""));
            let Ok(chain) = ChainName::new(chain) else { return fail("not a kpng chain") };
            let Some(rules) = work.chains.get_mut(&(table, chain)) else {
                return fail("no such chain");
            };
            rules.push(rule.to_string());
        } else if let Some(name) = line.strip_prefix("-X ") {
            let Ok(chain) = ChainName::new(name) else { return fail("not a kpng chain") };
            match work.chains.get(&(table, chain.clone())) {
                Some(rules) if rules.is_empty() => {}
                _ => return fail("chain missing or not empty"),
            }
            work.chains.remove(&(table, chain));
        } else {
            return fail("unknown line");
        }
    }
    // Every jump must land on a chain of the table (built-in targets are upper case words
    // that are not kpng chains).
    let jumps = work.chains.iter().filter(|((t, _), _)| *t == table).flat_map(|(_, rules)| rules);
    let hooks = work.hooks.iter().filter(|(t, _, _)| *t == table).map(|(_, _, r)| r);
    for rule in jumps.chain(hooks) {
        if let Some(target) = rule.split("-j ").nth(1).and_then(|t| t.split_whitespace().next())
            && let Ok(chain) = ChainName::new(target)
            && !work.chains.contains_key(&(table, chain))
        {
            let n = lines.last().map_or(0, |(n, _)| *n);
            return Err((n, format!("jump to missing chain {target}")));
        }
    }
    *tables = work;
    Ok(())
}

impl Kernel for MemoryKernel {
    fn read(&mut self, family: Family) -> Result<Snapshot, IptablesError> {
        Ok(self.snapshot(family))
    }

    fn generation(&mut self) -> Option<u64> {
        Some(self.lock().generation)
    }

    fn restore(&mut self, family: Family, input: &str) -> Result<(), IptablesError> {
        if let Some(printer) = &self.printer {
            let mut out = printer.lock().unwrap_or_else(|e| e.into_inner());
            let _ = writeln!(
                out,
                "# {}",
                match family {
                    Family::V4 => "iptables-restore --noflush",
                    Family::V6 => "ip6tables-restore --noflush",
                }
            );
            let _ = out.write_all(input.as_bytes());
            let _ = out.flush();
        }
        let mut inner = self.lock();
        inner.restores += 1;
        let restores = inner.restores;
        let refused = |left: &mut usize| {
            let refuse = *left > 0;
            *left = left.saturating_sub(1);
            refuse
        };
        if refused(&mut inner.failures) || refused(inner.family_failures.entry(family).or_default())
        {
            return Err(IptablesError::Injected(format!("restore {restores} refused")));
        }
        let Inner { families, generation, .. } = &mut *inner;
        let tables = families.entry(family).or_default();
        let mut section: Option<(Table, Vec<(usize, &str)>)> = None;
        for (i, line) in input.lines().enumerate() {
            let n = i + 1;
            if let Some(name) = line.strip_prefix('*') {
                let table = match name {
                    "nat" => Table::Nat,
                    "filter" => Table::Filter,
                    other => return Err(IptablesError::Injected(format!("unknown table {other}"))),
                };
                section = Some((table, Vec::new()));
            } else if line == "COMMIT" {
                let Some((table, lines)) = section.take() else {
                    return Err(IptablesError::Injected(format!(
                        "line {n}: COMMIT outside a table"
                    )));
                };
                apply_table(tables, table, &lines).map_err(|(line, why)| {
                    IptablesError::Restore {
                        program: "memory".into(),
                        line: Some(line),
                        text: input.lines().nth(line.saturating_sub(1)).map(str::to_string),
                        stderr: why,
                    }
                })?;
                *generation += 1;
            } else if let Some((_, lines)) = section.as_mut() {
                lines.push((n, line));
            }
        }
        Ok(())
    }
}
