//! `aggregatorv1` messages ↔ the model, in one place.

use kpng_api::aggregatorv1 as pb;
use pb::update::Op;

use crate::model::{
    Chain, Family, ModelError, Publication, Set, SetKind, State, Table, TableKey, Update,
};
use crate::rejection::Rejection;

/// A message that does not make a valid publication.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("update {index}: {reason}")]
pub struct WireError {
    /// Which update (0-based).
    pub index: usize,
    /// What is wrong.
    pub reason: String,
}

/// A publication from the wire.
pub fn publication_from_wire(message: pb::Publication) -> Result<Publication, WireError> {
    let updates = message
        .updates
        .into_iter()
        .enumerate()
        .map(|(index, update)| {
            update_from_wire(update).map_err(|reason| WireError { index, reason })
        })
        .collect::<Result<_, _>>()?;
    Ok(Publication { revision: message.revision, updates })
}

fn update_from_wire(update: pb::Update) -> Result<Update, String> {
    let op = update.op.ok_or("no operation")?;
    Ok(match op {
        Op::Whole(state) => Update::Whole(state_from_wire(state)?),
        Op::PutTable(table) => {
            let (table, content) = table_from_wire(table)?;
            Update::PutTable { table, content }
        }
        Op::DeleteTable(table) => Update::DeleteTable { table: key(Some(table))? },
        Op::PutChain(pb::ChainUpdate { table, chain }) => {
            let chain = chain.ok_or("no chain")?;
            Update::PutChain {
                table: key(table)?,
                name: chain.name.clone(),
                chain: chain_from_wire(chain),
            }
        }
        Op::DeleteChain(object) => {
            Update::DeleteChain { table: key(object.table)?, name: object.name }
        }
        Op::ReplaceRules(pb::ChainUpdate { table, chain }) => {
            let chain = chain.ok_or("no chain")?;
            Update::ReplaceRules { table: key(table)?, chain: chain.name, rules: chain.rules }
        }
        Op::PutSet(pb::SetUpdate { table, set }) => {
            let set = set.ok_or("no set")?;
            Update::PutSet { table: key(table)?, name: set.name.clone(), set: set_from_wire(set) }
        }
        Op::DeleteSet(object) => Update::DeleteSet { table: key(object.table)?, name: object.name },
        Op::AddElements(pb::Elements { table, set, elements }) => {
            Update::AddElements { table: key(table)?, set, elements }
        }
        Op::RemoveElements(pb::Elements { table, set, elements }) => {
            Update::RemoveElements { table: key(table)?, set, elements }
        }
    })
}

fn key(table: Option<pb::TableRef>) -> Result<TableKey, String> {
    let table = table.ok_or("no table")?;
    let family: Family = table.family.parse().map_err(|e: ModelError| e.to_string())?;
    Ok(TableKey::new(family, table.name))
}

fn state_from_wire(state: pb::State) -> Result<State, String> {
    let mut tables = std::collections::BTreeMap::new();
    for table in state.tables {
        let (key, content) = table_from_wire(table)?;
        if tables.insert(key.clone(), content).is_some() {
            return Err(format!("table {key} appears twice"));
        }
    }
    Ok(State { tables })
}

fn table_from_wire(table: pb::Table) -> Result<(TableKey, Table), String> {
    let key = key(table.table)?;
    let chains = table.chains.into_iter().map(|c| (c.name.clone(), chain_from_wire(c))).collect();
    let sets = table.sets.into_iter().map(|s| (s.name.clone(), set_from_wire(s))).collect();
    Ok((key, Table { chains, sets }))
}

fn chain_from_wire(chain: pb::Chain) -> Chain {
    let declaration = Some(chain.declaration.as_str()).filter(|d| !d.trim().is_empty());
    Chain::new(declaration, chain.rules)
}

fn set_from_wire(set: pb::Set) -> Set {
    let kind = if set.map { SetKind::Map } else { SetKind::Set };
    Set::new(kind, &set.declaration, set.elements)
}

/// A publication for the wire, from `producer`. The publication is moved in, its text
/// never copied: a whole state holds half a million elements at 30,000 services.
pub fn publication_to_wire(producer: &str, publication: Publication) -> pb::Publication {
    pb::Publication {
        producer: producer.to_string(),
        revision: publication.revision,
        updates: (publication.updates.into_iter())
            .map(|u| pb::Update { op: Some(update_to_wire(u)) })
            .collect(),
    }
}

fn update_to_wire(update: Update) -> Op {
    let chain_update = |table: &TableKey, chain: pb::Chain| pb::ChainUpdate {
        table: Some(key_to_wire(table)),
        chain: Some(chain),
    };
    let object =
        |table: &TableKey, name: String| pb::ObjectRef { table: Some(key_to_wire(table)), name };
    let elements = |table: &TableKey, set: String, elements: Vec<String>| pb::Elements {
        table: Some(key_to_wire(table)),
        set,
        elements,
    };
    match update {
        Update::Whole(state) => Op::Whole(state_to_wire(state)),
        Update::PutTable { table, content } => Op::PutTable(table_to_wire(&table, content)),
        Update::DeleteTable { table } => Op::DeleteTable(key_to_wire(&table)),
        Update::PutChain { table, name, chain } => {
            Op::PutChain(chain_update(&table, chain_to_wire(name, chain)))
        }
        Update::DeleteChain { table, name } => Op::DeleteChain(object(&table, name)),
        Update::ReplaceRules { table, chain, rules } => Op::ReplaceRules(chain_update(
            &table,
            pb::Chain { name: chain, declaration: String::new(), rules },
        )),
        Update::PutSet { table, name, set } => Op::PutSet(pb::SetUpdate {
            table: Some(key_to_wire(&table)),
            set: Some(set_to_wire(name, set)),
        }),
        Update::DeleteSet { table, name } => Op::DeleteSet(object(&table, name)),
        Update::AddElements { table, set, elements: e } => {
            Op::AddElements(elements(&table, set, e))
        }
        Update::RemoveElements { table, set, elements: e } => {
            Op::RemoveElements(elements(&table, set, e))
        }
    }
}

fn key_to_wire(key: &TableKey) -> pb::TableRef {
    pb::TableRef { family: key.family.to_string(), name: key.name.clone() }
}

/// A state for the wire, moved in.
pub fn state_to_wire(state: State) -> pb::State {
    pb::State {
        tables: state.tables.into_iter().map(|(key, table)| table_to_wire(&key, table)).collect(),
    }
}

fn table_to_wire(key: &TableKey, table: Table) -> pb::Table {
    pb::Table {
        table: Some(key_to_wire(key)),
        chains: table.chains.into_iter().map(|(name, chain)| chain_to_wire(name, chain)).collect(),
        sets: table.sets.into_iter().map(|(name, set)| set_to_wire(name, set)).collect(),
    }
}

fn chain_to_wire(name: String, chain: Chain) -> pb::Chain {
    pb::Chain { name, declaration: chain.declaration.unwrap_or_default(), rules: chain.rules }
}

fn set_to_wire(name: String, set: Set) -> pb::Set {
    pb::Set {
        name,
        map: set.kind == SetKind::Map,
        declaration: set.declaration,
        elements: set.elements.into_iter().collect(),
    }
}

/// An acknowledgement of a committed revision.
pub fn committed_to_wire(revision: u64) -> pb::Ack {
    pb::Ack { result: Some(pb::ack::Result::Committed(revision)) }
}

/// An acknowledgement of a refused revision.
pub fn rejection_to_wire(rejection: &Rejection) -> pb::Ack {
    pb::Ack {
        result: Some(pb::ack::Result::Rejected(pb::Rejection {
            revision: rejection.revision,
            object: rejection.object.clone(),
            message: rejection.message.clone(),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    #[test]
    fn publications_round_trip() {
        let state = parse(
            "table inet t { map m { type ipv4_addr : verdict; elements = { 1.1.1.1 : accept } }
               chain c { type filter hook input priority 0; policy drop; ip saddr vmap @m } chain d { } }",
        )
        .unwrap()
        .state;
        let key = TableKey::new(Family::Inet, "t");
        let publication = Publication {
            revision: 9,
            updates: vec![
                Update::Whole(state.clone()),
                Update::AddElements {
                    table: key.clone(),
                    set: "m".into(),
                    elements: vec!["2.2.2.2 : drop".into()],
                },
                Update::ReplaceRules {
                    table: key.clone(),
                    chain: "d".into(),
                    rules: vec!["accept".into()],
                },
                Update::DeleteChain { table: key.clone(), name: "d".into() },
                Update::PutTable { table: key.clone(), content: state.tables[&key].clone() },
                Update::DeleteTable { table: key },
            ],
        };
        let wire = publication_to_wire("p", publication.clone());
        assert_eq!(wire.producer, "p");
        assert_eq!(publication_from_wire(wire).unwrap(), publication);
        let empty =
            pb::Publication { updates: vec![pb::Update { op: None }], ..Default::default() };
        assert_eq!(publication_from_wire(empty).unwrap_err().to_string(), "update 0: no operation");
    }
}
