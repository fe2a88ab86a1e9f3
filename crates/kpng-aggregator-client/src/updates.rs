//! The updates that take one desired state to another: what a producer publishes after its
//! whole state, so that only the difference travels and is diffed.

use crate::model::{State, Table, TableKey, Update};

/// Updates that turn `old` into `new` (applied in order with [`State::apply`]).
pub fn updates(old: &State, new: &State) -> Vec<Update> {
    let mut updates = Vec::new();
    for key in old.tables.keys().filter(|key| !new.tables.contains_key(*key)) {
        updates.push(Update::DeleteTable { table: key.clone() });
    }
    for (key, table) in &new.tables {
        match old.tables.get(key) {
            None => updates.push(Update::PutTable { table: key.clone(), content: table.clone() }),
            Some(before) => table_updates(key, before, table, &mut updates),
        }
    }
    updates
}

fn table_updates(key: &TableKey, old: &Table, new: &Table, updates: &mut Vec<Update>) {
    let table = || key.clone();
    for name in old.chains.keys().filter(|name| !new.chains.contains_key(*name)) {
        updates.push(Update::DeleteChain { table: table(), name: name.clone() });
    }
    for name in old.sets.keys().filter(|name| !new.sets.contains_key(*name)) {
        updates.push(Update::DeleteSet { table: table(), name: name.clone() });
    }
    for (name, set) in &new.sets {
        match old.sets.get(name) {
            Some(before) if before.kind == set.kind && before.declaration == set.declaration => {
                let gone: Vec<String> =
                    before.elements.difference(&set.elements).cloned().collect();
                let added: Vec<String> =
                    set.elements.difference(&before.elements).cloned().collect();
                if !gone.is_empty() {
                    updates.push(Update::RemoveElements {
                        table: table(),
                        set: name.clone(),
                        elements: gone,
                    });
                }
                if !added.is_empty() {
                    updates.push(Update::AddElements {
                        table: table(),
                        set: name.clone(),
                        elements: added,
                    });
                }
            }
            _ => updates.push(Update::PutSet {
                table: table(),
                name: name.clone(),
                set: set.clone(),
            }),
        }
    }
    for (name, chain) in &new.chains {
        match old.chains.get(name) {
            Some(before) if before == chain => {}
            Some(before) if before.declaration == chain.declaration => {
                let rules = chain.rules.clone();
                updates.push(Update::ReplaceRules { table: table(), chain: name.clone(), rules });
            }
            _ => updates.push(Update::PutChain {
                table: table(),
                name: name.clone(),
                chain: chain.clone(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    #[test]
    fn applying_the_updates_gives_the_new_state() {
        let old = parse(
            "table ip a { set s { type ipv4_addr; elements = { 1.1.1.1, 2.2.2.2 } } set t { type ipv4_addr; }
               chain c { accept } chain d { drop } chain e { type filter hook input priority 0; } }
             table ip gone { }",
        )
        .unwrap()
        .state;
        let new = parse(
            "table ip a { set s { type ipv4_addr; elements = { 2.2.2.2, 3.3.3.3 } }
               chain c { counter accept } chain e { type filter hook output priority 0; } chain f { } }
             table ip b { chain x { } }",
        )
        .unwrap()
        .state;
        let updates = updates(&old, &new);
        let mut state = old.clone();
        for update in updates.clone() {
            state.apply(update).unwrap();
        }
        assert_eq!(state, new);
        assert!(updates.iter().all(|u| !matches!(u, Update::Whole(_))));
        assert!(super::updates(&new, &new).is_empty());
    }
}
