//! Kernel objects in nft syntax: what `--dry-run` prints and what golden tests compare.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use kpng_model::{Family, Protocol};

use crate::objects::{ElementId, Key, MapName, TABLE, Value, table_family};
use crate::skeleton::{SkeletonOptions, ladder, skeleton};
use crate::state::{Ladder, TableDiff};

fn protocol(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

/// A key in nft syntax.
pub fn key_text(key: &Key) -> String {
    match key {
        Key::Addr(ip) => ip.to_string(),
        Key::Dest(d) => format!("{} . {} . {}", d.ip, protocol(d.protocol), d.port),
        Key::NodePort(p, port) => format!("{} . {port}", protocol(*p)),
        Key::DestSlot(d, slot) => {
            format!("{} . {} . {} . {slot}", d.ip, protocol(d.protocol), d.port)
        }
        Key::NodePortSlot(p, port, slot) => format!("{} . {port} . {slot}", protocol(*p)),
        Key::AddrPair(a, b) => format!("{a} . {b}"),
        Key::DestSource(d, net) => {
            format!("{} . {} . {} . {net}", d.ip, protocol(d.protocol), d.port)
        }
    }
}

/// One element in nft syntax: `key` or `key : value`.
pub fn element_text(key: &Key, value: &Value) -> String {
    match value {
        Value::None => key_text(key),
        Value::Endpoint(ip, port) => format!("{} : {ip} . {port}", key_text(key)),
        Value::Affinity(hash) => {
            format!("{} : goto {}", key_text(key), crate::objects::affinity_chain(*hash))
        }
    }
}

/// The count sets `elements` use.
pub fn ladders<'a>(
    elements: impl IntoIterator<Item = (&'a ElementId, &'a Value)>,
) -> BTreeSet<Ladder> {
    elements
        .into_iter()
        .filter_map(|(id, _)| match id.map {
            MapName::Count(kind, n) => Some((id.family, kind, n)),
            _ => None,
        })
        .collect()
}

/// A whole ruleset as `nft -f` input: both skeletons, the count sets and pick rules in use,
/// and every element, grouped per set and map.
pub fn ruleset<'a>(
    options: &SkeletonOptions,
    elements: impl IntoIterator<Item = (&'a ElementId, &'a Value)> + Clone,
) -> String {
    let mut out = String::new();
    for family in Family::ALL {
        out.push_str(&skeleton(family, options));
    }
    for (family, kind, n) in ladders(elements.clone()) {
        out.push_str(&ladder(family, kind, n));
    }
    let mut grouped: BTreeMap<(Family, MapName), Vec<String>> = BTreeMap::new();
    for (id, value) in elements {
        grouped.entry((id.family, id.map)).or_default().push(element_text(&id.key, value));
    }
    for ((family, map), items) in grouped {
        let _ = writeln!(out, "add element {} {TABLE} {map} {{", table_family(family));
        for item in items {
            let _ = writeln!(out, "\t{item},");
        }
        out.push_str("}\n");
    }
    out
}

/// One transaction as nft commands: new count sets and pick rules, element deletes, then
/// element adds.
pub fn transaction_text(diff: &TableDiff) -> String {
    let mut out = String::new();
    for (family, kind, n) in &diff.new_ladders {
        out.push_str(&ladder(*family, *kind, *n));
    }
    for op in &diff.affinity_before {
        out.push_str(&crate::affinity::op_text(op));
    }
    // Sorted, so that a dry run prints the same text for the same state.
    let (mut deletes, mut adds) = (diff.deletes.clone(), diff.adds.clone());
    deletes.sort_unstable();
    adds.sort_unstable();
    for (verb, elements) in [("delete", &deletes), ("add", &adds)] {
        for (id, value) in elements {
            let element =
                if verb == "delete" { key_text(&id.key) } else { element_text(&id.key, value) };
            let _ = writeln!(
                out,
                "{verb} element {} {TABLE} {} {{ {element} }}",
                table_family(id.family),
                id.map
            );
        }
    }
    for op in &diff.affinity_after {
        out.push_str(&crate::affinity::op_text(op));
    }
    out
}
