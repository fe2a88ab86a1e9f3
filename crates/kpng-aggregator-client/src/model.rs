//! What a producer publishes: the nftables tables it owns, each with its chains (rules in
//! nft syntax) and its sets and maps (elements in nft syntax), and the updates that change
//! them. Texts are kept as nft text, normalized (whitespace collapsed, declarations as
//! `statement; statement;`) so that equal meaning written alike compares equal.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// An nftables address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// `ip`
    Ip,
    /// `ip6`
    Ip6,
    /// `inet`
    Inet,
    /// `arp`
    Arp,
    /// `bridge`
    Bridge,
    /// `netdev`
    Netdev,
}

impl Family {
    /// Every family, in nft's spelling order.
    pub const ALL: [Family; 6] =
        [Family::Ip, Family::Ip6, Family::Inet, Family::Arp, Family::Bridge, Family::Netdev];

    /// nft's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
            Family::Inet => "inet",
            Family::Arp => "arp",
            Family::Bridge => "bridge",
            Family::Netdev => "netdev",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Family {
    type Err = ModelError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Family::ALL
            .into_iter()
            .find(|family| family.as_str() == text)
            .ok_or_else(|| ModelError::Family(text.to_string()))
    }
}

/// A table's identity: its family and name (`ip filter`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct TableKey {
    /// The family.
    pub family: Family,
    /// The name.
    pub name: String,
}

impl TableKey {
    /// The table `family name`.
    pub fn new(family: Family, name: impl Into<String>) -> Self {
        TableKey { family, name: name.into() }
    }
}

impl fmt::Display for TableKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.family, self.name)
    }
}

/// A chain: a base chain's declaration (`type filter hook input priority 0; policy accept;`)
/// or none for a regular chain, and its rules in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Chain {
    /// The base-chain declaration, normalized; `None` for a regular chain.
    pub declaration: Option<String>,
    /// The rule bodies in order (`ip saddr @allowed accept`), normalized.
    pub rules: Vec<String>,
}

impl Chain {
    /// A chain from nft text, normalized.
    pub fn new(
        declaration: Option<&str>,
        rules: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Self {
        Chain {
            declaration: declaration.map(normalize_declaration).filter(|d| !d.is_empty()),
            rules: rules.into_iter().map(|r| collapse(r.as_ref())).collect(),
        }
    }
}

/// Whether a [`Set`] is a set or a map (nft declares them with different keywords).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SetKind {
    /// `set`
    #[default]
    Set,
    /// `map`
    Map,
}

impl SetKind {
    /// nft's keyword.
    pub fn as_str(self) -> &'static str {
        match self {
            SetKind::Set => "set",
            SetKind::Map => "map",
        }
    }
}

/// A set or map: its declaration (`type ipv4_addr . inet_service; flags interval;`) and its
/// elements (`10.0.0.0/8 . 80`, or for a map `10.0.0.1 : accept`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Set {
    /// Set or map.
    pub kind: SetKind,
    /// The declaration, normalized.
    pub declaration: String,
    /// The elements, normalized.
    pub elements: BTreeSet<String>,
}

impl Set {
    /// A set or map from nft text, normalized.
    pub fn new(
        kind: SetKind,
        declaration: &str,
        elements: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Self {
        Set {
            kind,
            declaration: normalize_declaration(declaration),
            elements: elements.into_iter().map(|e| collapse(e.as_ref())).collect(),
        }
    }
}

/// A table's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Table {
    /// Chains by name.
    pub chains: BTreeMap<String, Chain>,
    /// Sets and maps by name.
    pub sets: BTreeMap<String, Set>,
}

impl Table {
    /// Objects it holds: itself, its chains, sets, rules and elements.
    pub fn objects(&self) -> usize {
        let rules: usize = self.chains.values().map(|c| c.rules.len()).sum();
        let elements: usize = self.sets.values().map(|s| s.elements.len()).sum();
        1 + self.chains.len() + self.sets.len() + rules + elements
    }
}

/// One producer's desired (or committed) state: the tables it owns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct State {
    /// Tables by family and name.
    #[serde(serialize_with = "tables_by_name")]
    pub tables: BTreeMap<TableKey, Table>,
}

fn tables_by_name<S: serde::Serializer>(
    tables: &BTreeMap<TableKey, Table>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(tables.iter().map(|(key, table)| (key.to_string(), table)))
}

impl State {
    /// Objects it holds (tables, chains, sets, rules, elements).
    pub fn objects(&self) -> usize {
        self.tables.values().map(Table::objects).sum()
    }
}

/// A change to a producer's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// The whole state: replaces everything the producer published before.
    Whole(State),
    /// A table created or replaced with this content.
    PutTable {
        /// The table.
        table: TableKey,
        /// Its whole content.
        content: Table,
    },
    /// A table deleted with everything in it.
    DeleteTable {
        /// The table.
        table: TableKey,
    },
    /// A chain created or replaced.
    PutChain {
        /// Its table.
        table: TableKey,
        /// Its name.
        name: String,
        /// Its declaration and rules.
        chain: Chain,
    },
    /// A chain deleted.
    DeleteChain {
        /// Its table.
        table: TableKey,
        /// Its name.
        name: String,
    },
    /// A chain's rules replaced (its declaration stays).
    ReplaceRules {
        /// Its table.
        table: TableKey,
        /// The chain.
        chain: String,
        /// The new rules in order.
        rules: Vec<String>,
    },
    /// A set or map created or replaced.
    PutSet {
        /// Its table.
        table: TableKey,
        /// Its name.
        name: String,
        /// Its declaration and elements.
        set: Set,
    },
    /// A set or map deleted.
    DeleteSet {
        /// Its table.
        table: TableKey,
        /// Its name.
        name: String,
    },
    /// Elements added to a set or map (present ones stay).
    AddElements {
        /// Its table.
        table: TableKey,
        /// The set or map.
        set: String,
        /// The elements.
        elements: Vec<String>,
    },
    /// Elements removed from a set or map (absent ones are ignored).
    RemoveElements {
        /// Its table.
        table: TableKey,
        /// The set or map.
        set: String,
        /// The elements.
        elements: Vec<String>,
    },
}

/// A producer's publication: updates to apply in order, as one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publication {
    /// The producer's revision for the state after these updates; acknowledged once
    /// committed.
    pub revision: u64,
    /// The updates.
    pub updates: Vec<Update>,
}

/// What makes an update or a state invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// An unknown address family.
    #[error("unknown family {0:?} (expected ip, ip6, inet, arp, bridge or netdev)")]
    Family(String),
    /// A name nft would not take as one identifier.
    #[error(
        "invalid {kind} name {name:?}: letters, digits, '_', '-' and '.' only, starting with a letter"
    )]
    Name {
        /// table, chain, set or producer.
        kind: &'static str,
        /// The name.
        name: String,
    },
    /// Text that would end the nft command it is written in.
    #[error("{object}: {what} {text:?} holds {character:?}, which would end the nft command")]
    Text {
        /// The object (`table ip t chain c`).
        object: String,
        /// rule, element or declaration.
        what: &'static str,
        /// The text.
        text: String,
        /// The offending character.
        character: char,
    },
    /// A partial update to an object the state lacks.
    #[error("{0} does not exist")]
    Missing(String),
}

// === impl State ===

impl State {
    /// Applies `update`; on error the state is unchanged.
    pub fn apply(&mut self, update: Update) -> Result<(), ModelError> {
        self.apply_undoable(update).map(drop)
    }

    fn table_mut(&mut self, table: &TableKey) -> Result<&mut Table, ModelError> {
        self.tables.get_mut(table).ok_or_else(|| ModelError::Missing(format!("table {table}")))
    }

    /// Applies `update` and returns how to take it back ([`State::undo`]); on error the
    /// state is unchanged. What an update replaces is moved into the undo, never copied.
    pub fn apply_undoable(&mut self, update: Update) -> Result<Undo, ModelError> {
        Ok(match update {
            Update::Whole(state) => Undo::Whole(std::mem::replace(self, state)),
            Update::PutTable { table, content } => {
                let old = self.tables.insert(table.clone(), content);
                Undo::Table(table, old)
            }
            Update::DeleteTable { table } => {
                let old = self.tables.remove(&table);
                Undo::Table(table, old)
            }
            Update::PutChain { table, name, chain } => {
                let old = self.table_mut(&table)?.chains.insert(name.clone(), chain);
                Undo::Chain(table, name, old)
            }
            Update::DeleteChain { table, name } => {
                let old = self.table_mut(&table)?.chains.remove(&name);
                Undo::Chain(table, name, old)
            }
            Update::ReplaceRules { table, chain, rules } => {
                let found = self.table_mut(&table)?.chains.get_mut(&chain);
                let found = found.ok_or_else(|| missing(&table, "chain", &chain))?;
                let rules = rules.iter().map(|r| collapse(r)).collect();
                let old = std::mem::replace(&mut found.rules, rules);
                Undo::Rules(table, chain, old)
            }
            Update::PutSet { table, name, set } => {
                let old = self.table_mut(&table)?.sets.insert(name.clone(), set);
                Undo::Set(table, name, old)
            }
            Update::DeleteSet { table, name } => {
                let old = self.table_mut(&table)?.sets.remove(&name);
                Undo::Set(table, name, old)
            }
            Update::AddElements { table, set, elements } => {
                let found = self.table_mut(&table)?.sets.get_mut(&set);
                let found = found.ok_or_else(|| missing(&table, "set", &set))?;
                let added = elements
                    .iter()
                    .map(|e| collapse(e))
                    .filter(|e| found.elements.insert(e.clone()));
                let added = added.collect();
                Undo::Added(table, set, added)
            }
            Update::RemoveElements { table, set, elements } => {
                let found = self.table_mut(&table)?.sets.get_mut(&set);
                let found = found.ok_or_else(|| missing(&table, "set", &set))?;
                let removed =
                    elements.iter().map(|e| collapse(e)).filter(|e| found.elements.remove(e));
                let removed = removed.collect();
                Undo::Removed(table, set, removed)
            }
        })
    }

    /// Takes back an update [`State::apply_undoable`] applied (the latest first).
    pub fn undo(&mut self, undo: Undo) {
        fn restore<T>(map: &mut BTreeMap<String, T>, name: String, old: Option<T>) {
            match old {
                Some(old) => map.insert(name, old),
                None => map.remove(&name),
            };
        }
        match undo {
            Undo::Whole(old) => *self = old,
            Undo::Table(table, old) => {
                match old {
                    Some(old) => self.tables.insert(table, old),
                    None => self.tables.remove(&table),
                };
            }
            Undo::Chain(table, name, old) => {
                if let Some(t) = self.tables.get_mut(&table) {
                    restore(&mut t.chains, name, old);
                }
            }
            Undo::Rules(table, chain, old) => {
                let found = self.tables.get_mut(&table).and_then(|t| t.chains.get_mut(&chain));
                if let Some(found) = found {
                    found.rules = old;
                }
            }
            Undo::Set(table, name, old) => {
                if let Some(t) = self.tables.get_mut(&table) {
                    restore(&mut t.sets, name, old);
                }
            }
            Undo::Added(table, set, added) => {
                let found = self.tables.get_mut(&table).and_then(|t| t.sets.get_mut(&set));
                if let Some(found) = found {
                    added.iter().for_each(|e| {
                        found.elements.remove(e);
                    });
                }
            }
            Undo::Removed(table, set, removed) => {
                let found = self.tables.get_mut(&table).and_then(|t| t.sets.get_mut(&set));
                if let Some(found) = found {
                    found.elements.extend(removed);
                }
            }
        }
    }

    /// Checks every name and text: names are nft identifiers, and no text can end the
    /// command it is written into (so a producer can only ever touch its own tables).
    pub fn validate(&self) -> Result<(), ModelError> {
        for (key, table) in &self.tables {
            validate_table(key, table)?;
        }
        Ok(())
    }
}

/// How to take back one applied update: what it replaced or changed.
#[derive(Debug)]
pub enum Undo {
    /// The whole state before.
    Whole(State),
    /// A table before (`None`: it did not exist).
    Table(TableKey, Option<Table>),
    /// A chain before.
    Chain(TableKey, String, Option<Chain>),
    /// A chain's rules before.
    Rules(TableKey, String, Vec<String>),
    /// A set before.
    Set(TableKey, String, Option<Set>),
    /// Elements that were added (and were not there).
    Added(TableKey, String, Vec<String>),
    /// Elements that were removed (and were there).
    Removed(TableKey, String, Vec<String>),
}

impl Update {
    /// Checks the names and texts this update carries, as [`State::validate`] does for a
    /// whole state.
    pub fn validate(&self) -> Result<(), ModelError> {
        match self {
            Update::Whole(state) => state.validate(),
            Update::PutTable { table, content } => validate_table(table, content),
            Update::DeleteTable { .. } | Update::DeleteChain { .. } | Update::DeleteSet { .. } => {
                Ok(())
            }
            Update::PutChain { table, name, chain } => validate_chain(table, name, chain),
            Update::ReplaceRules { table, chain, rules } => {
                let object = format!("table {table} chain {chain}");
                rules.iter().try_for_each(|rule| check_text(&object, "rule", rule, RULE_FORBIDDEN))
            }
            Update::PutSet { table, name, set } => validate_set(table, name, set),
            Update::AddElements { table, set, elements }
            | Update::RemoveElements { table, set, elements } => {
                let object = format!("table {table} set {set}");
                elements
                    .iter()
                    .try_for_each(|e| check_text(&object, "element", e, ELEMENT_FORBIDDEN))
            }
        }
    }
}

const RULE_FORBIDDEN: &[char] = &[';', '\n', '\r'];
const ELEMENT_FORBIDDEN: &[char] = &[';', '\n', '\r', '{', '}', ',', '#'];
const DECLARATION_FORBIDDEN: &[char] = &['{', '}', '#', '\n'];

fn validate_table(key: &TableKey, table: &Table) -> Result<(), ModelError> {
    check_name("table", &key.name)?;
    for (name, chain) in &table.chains {
        validate_chain(key, name, chain)?;
    }
    for (name, set) in &table.sets {
        validate_set(key, name, set)?;
    }
    Ok(())
}

fn validate_chain(key: &TableKey, name: &str, chain: &Chain) -> Result<(), ModelError> {
    check_name("chain", name)?;
    let object = format!("table {key} chain {name}");
    if let Some(declaration) = &chain.declaration {
        check_text(&object, "declaration", declaration, DECLARATION_FORBIDDEN)?;
    }
    chain.rules.iter().try_for_each(|rule| check_text(&object, "rule", rule, RULE_FORBIDDEN))
}

fn validate_set(key: &TableKey, name: &str, set: &Set) -> Result<(), ModelError> {
    check_name("set", name)?;
    let object = format!("table {key} {} {name}", set.kind.as_str());
    check_text(&object, "declaration", &set.declaration, DECLARATION_FORBIDDEN)?;
    set.elements.iter().try_for_each(|e| check_text(&object, "element", e, ELEMENT_FORBIDDEN))
}

fn missing(table: &TableKey, kind: &str, name: &str) -> ModelError {
    ModelError::Missing(format!("table {table} {kind} {name}"))
}

/// Checks that `name` is one nft identifier of the kind given.
pub fn check_name(kind: &'static str, name: &str) -> Result<(), ModelError> {
    let mut chars = name.chars();
    let first = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    if first && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
        Ok(())
    } else {
        Err(ModelError::Name { kind, name: name.to_string() })
    }
}

fn check_text(
    object: &str,
    what: &'static str,
    text: &str,
    forbidden: &[char],
) -> Result<(), ModelError> {
    match text.chars().find(|c| forbidden.contains(c)) {
        None => Ok(()),
        Some(character) => Err(ModelError::Text {
            object: object.to_string(),
            what,
            text: text.to_string(),
            character,
        }),
    }
}

/// Collapses runs of whitespace into one space and trims.
pub fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A declaration as `statement; statement;` with whitespace collapsed, and a base chain's
/// named priority as the number nft prints it as (`priority filter` is `priority 0`), so that
/// what nft lists compares equal to what a producer wrote.
pub fn normalize_declaration(text: &str) -> String {
    let statements: Vec<String> = text
        .split([';', '\n'])
        .map(collapse)
        .filter(|s| !s.is_empty())
        .map(|s| number_priority(&s))
        .collect();
    statements.iter().map(|s| format!("{s};")).collect::<Vec<_>>().join(" ")
}

fn number_priority(statement: &str) -> String {
    const NAMED: [(&str, &str); 6] = [
        ("raw", "-300"),
        ("mangle", "-150"),
        ("dstnat", "-100"),
        ("filter", "0"),
        ("security", "50"),
        ("srcnat", "100"),
    ];
    let words: Vec<&str> = statement.split(' ').collect();
    let mut out = Vec::with_capacity(words.len());
    let mut after_priority = false;
    for word in words {
        let named = NAMED.iter().find(|(name, _)| *name == word).filter(|_| after_priority);
        out.push(named.map_or(word, |(_, number)| *number));
        after_priority = word == "priority";
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_normalize_to_what_nft_prints() {
        let written = "type filter hook input priority 0 ;policy   accept";
        let listed = "type filter hook input priority filter; policy accept;";
        assert_eq!(normalize_declaration(written), normalize_declaration(listed));
        assert_eq!(
            normalize_declaration(listed),
            "type filter hook input priority 0; policy accept;"
        );
        let set = "type ipv4_addr . inet_service\n\t\tflags interval";
        assert_eq!(normalize_declaration(set), "type ipv4_addr . inet_service; flags interval;");
    }

    #[test]
    fn texts_that_would_end_a_command_are_refused() {
        let key = TableKey::new(Family::Ip, "t");
        let mut table = Table::default();
        table.chains.insert("c".into(), Chain::new(None, ["accept; delete table ip other"]));
        let state = State { tables: [(key, table)].into() };
        let error = state.validate().unwrap_err().to_string();
        assert!(error.contains("table ip t chain c") && error.contains("';'"), "{error}");
        assert!(check_name("table", "a b").is_err());
        assert!(check_name("table", "kube-proxy.v2_x").is_ok());
    }

    #[test]
    fn partial_updates_need_their_object() {
        let key = TableKey::new(Family::Inet, "t");
        let mut state = State::default();
        let update = Update::AddElements { table: key.clone(), set: "s".into(), elements: vec![] };
        assert_eq!(state.apply(update).unwrap_err().to_string(), "table inet t does not exist");
        state.apply(Update::PutTable { table: key.clone(), content: Table::default() }).unwrap();
        let set = Set::new(SetKind::Set, "type ipv4_addr", ["10.0.0.1"]);
        state.apply(Update::PutSet { table: key.clone(), name: "s".into(), set }).unwrap();
        let add = vec![" 10.0.0.2 ".to_string()];
        state
            .apply(Update::AddElements { table: key.clone(), set: "s".into(), elements: add })
            .unwrap();
        let set = &state.tables[&key].sets["s"];
        assert_eq!(set.elements.iter().collect::<Vec<_>>(), ["10.0.0.1", "10.0.0.2"]);
    }
}
