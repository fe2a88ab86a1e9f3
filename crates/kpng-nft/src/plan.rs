//! [`Plan`]: one transaction as typed commands. The backend decides what a transaction
//! does once, here; the dry run prints the plan in nft syntax ([`Plan::text`]) and the
//! kernel receives the same commands as netlink messages (`encode`), so what is printed is
//! what is committed.

use std::fmt::Write;

use kpng_model::Family;
use kpng_netlink::nftables::ChainSpec;
use kpng_netlink::nftables::objects::CtHelperSpec;

use crate::objects::{ElementId, MapName, TABLE, Value, table_family};
use crate::rules::Rule;
use crate::sets::SetDecl;
use crate::text::{element_text, key_text};

/// One command of a transaction, in one family's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<'a> {
    /// Create the table if it does not exist.
    AddTable,
    /// Create a set or map (an existing one with the same definition keeps its elements).
    AddSet(SetDecl),
    /// Remove every element of a set.
    FlushSet(String),
    /// Delete a set (nothing may refer to it any more).
    DeleteSet(String),
    /// Create a `ct helper` object (an existing one is kept).
    AddCtHelper(CtHelperSpec),
    /// Delete a `ct helper` object (no rule may assign it any more).
    DeleteCtHelper(String),
    /// Create a chain (an existing one is kept).
    AddChain(ChainSpec),
    /// Remove every rule of a chain.
    FlushChain(String),
    /// Delete a chain (empty, and nothing may refer to it any more).
    DeleteChain(String),
    /// Append a rule to a chain.
    AddRule {
        /// The chain.
        chain: String,
        /// The rule.
        rule: Rule,
    },
    /// Add (or delete) elements of one set or map, all of `map`.
    Elements {
        /// Add, or delete.
        add: bool,
        /// The set or map.
        map: MapName,
        /// The elements (their values matter only when adding).
        elements: Elements<'a>,
    },
}

/// The elements of an element command.
pub type Elements<'a> = &'a [(ElementId, Value)];

/// Every element of kpng's tables, in no particular order: what a whole publication adds
/// to its layout ([`Kernel::replace`](crate::Kernel::replace)), made as it is read rather
/// than held in a list beside the objects it comes from.
pub type AllElements<'e> = &'e mut dyn Iterator<Item = (ElementId, Value)>;

/// The commands of one transaction, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan<'a> {
    /// `(family, command)`, in the order the kernel applies them.
    pub commands: Vec<(Family, Command<'a>)>,
}

impl<'a> Plan<'a> {
    /// An empty plan.
    pub fn new() -> Self {
        Plan { commands: Vec::new() }
    }

    /// Appends a command.
    pub fn push(&mut self, family: Family, command: Command<'a>) {
        self.commands.push((family, command));
    }

    /// Appends element commands for `elements`, one per run of the same family and set
    /// (the elements must be grouped by family and set).
    pub fn elements(&mut self, add: bool, elements: &'a [(ElementId, Value)]) {
        let mut rest = elements;
        while let Some((first, _)) = rest.first() {
            let run = rest
                .iter()
                .position(|(id, _)| id.family != first.family || id.map != first.map)
                .unwrap_or(rest.len());
            let (head, tail) = rest.split_at(run);
            self.push(first.family, Command::Elements { add, map: first.map, elements: head });
            rest = tail;
        }
    }

    /// Whether the plan changes nothing.
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// Element additions and deletions in the plan.
    pub fn element_count(&self) -> (usize, usize) {
        self.commands.iter().fold((0, 0), |(adds, deletes), (_, c)| match c {
            Command::Elements { add: true, elements, .. } => (adds + elements.len(), deletes),
            Command::Elements { add: false, elements, .. } => (adds, deletes + elements.len()),
            _ => (adds, deletes),
        })
    }

    /// Whether the plan adds, changes or removes a rule or chain (the kernel then validates
    /// the table, which costs more than element updates).
    pub fn changes_rules(&self) -> bool {
        self.commands.iter().any(|(_, c)| {
            matches!(
                c,
                Command::AddRule { .. }
                    | Command::FlushChain(_)
                    | Command::DeleteChain(_)
                    | Command::AddChain(_)
            )
        })
    }

    /// The plan in nft syntax, one command per line (`nft -f` accepts it).
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (family, command) in &self.commands {
            command_text(&mut out, *family, command);
        }
        out
    }
}

fn command_text(out: &mut String, family: Family, command: &Command<'_>) {
    let table = format!("{} {TABLE}", table_family(family));
    let _ = match command {
        Command::AddTable => writeln!(out, "add table {table}"),
        Command::AddSet(decl) => {
            writeln!(out, "add {} {table} {} {{ {} }}", decl.keyword(), decl.spec.name, decl.text)
        }
        Command::FlushSet(name) => writeln!(out, "flush set {table} {name}"),
        Command::AddCtHelper(spec) => writeln!(
            out,
            "add ct helper {table} {} {{ type {:?} protocol {}; l3proto {}; }}",
            spec.name,
            spec.helper,
            crate::rules::protocol_keyword(spec.l4proto),
            table_family(family)
        ),
        Command::DeleteCtHelper(name) => writeln!(out, "delete ct helper {table} {name}"),
        Command::DeleteSet(name) => writeln!(out, "delete set {table} {name}"),
        Command::AddChain(spec) => match &spec.hook {
            Some(h) => writeln!(out, "add chain {table} {} {{ {} }}", spec.name, h.declaration()),
            None => writeln!(out, "add chain {table} {}", spec.name),
        },
        Command::FlushChain(name) => writeln!(out, "flush chain {table} {name}"),
        Command::DeleteChain(name) => writeln!(out, "delete chain {table} {name}"),
        Command::AddRule { chain, rule } => writeln!(out, "add rule {table} {chain} {}", rule.text),
        Command::Elements { add, map, elements } => {
            let verb = if *add { "add" } else { "delete" };
            for (id, value) in elements.iter() {
                let element = if *add { element_text(&id.key, value) } else { key_text(&id.key) };
                let _ = writeln!(out, "{verb} element {table} {map} {{ {element} }}");
            }
            Ok(())
        }
    };
}
