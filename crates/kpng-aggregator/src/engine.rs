//! [`Aggregator`]: every producer's committed and pending state, who owns which table, the
//! leases of those who left, and the batch that commits everyone's changes in one
//! transaction. Pure but for the [`Applier`](crate::Applier) it is handed; time is passed in.

pub use kpng_aggregator_client::rejection::{EXCERPT, Rejection, excerpt};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::applier::NftError;
use crate::bindings::Bindings;
use crate::changes::Changes;
use crate::diff::{OWNER_COMMENT, Script, comment_owner};
use crate::model::{ModelError, Publication, State, TableKey, check_name};
use crate::parse::{ParseError, parse, split_tables};

/// Why a producer's connection or publication was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The producer's name is not one identifier.
    #[error(transparent)]
    Name(ModelError),
    /// Another connection publishes under that name.
    #[error("producer {0} is already connected")]
    Connected(String),
    /// The publication came before the producer connected.
    #[error("producer {0} is not connected")]
    NotConnected(String),
    /// The name belongs to another identity.
    #[error(
        "producer {producer} belongs to {owner}, which first published it; {identity} may not \
         publish under that name"
    )]
    Bound {
        /// The producer name.
        producer: String,
        /// The identity it is bound to.
        owner: String,
        /// The identity that asked for it.
        identity: String,
    },
}

/// How a producer's name and the connecting identity stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// The name was already this identity's.
    Known,
    /// The name was free and is this identity's from now on (to be saved).
    New,
}

/// What one batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Producers whose pending state is now committed, with the revision acknowledged.
    pub acks: Vec<(String, u64)>,
    /// Producers whose pending state was refused.
    pub rejections: Vec<Rejection>,
    /// Transactions committed (0 when nothing changed, 1 normally, more only when some
    /// part failed).
    pub transactions: usize,
    /// Commands committed.
    pub commands: usize,
    /// Producers whose lease ended and whose tables are now gone.
    pub removed: Vec<String>,
}

/// Counters of one producer, for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProducerStats {
    /// Publications received.
    pub publications: u64,
    /// Batches that committed a change of this producer.
    pub batches: u64,
    /// Publications refused.
    pub rejections: u64,
    /// Leases that ran out.
    pub lease_expiries: u64,
    /// Time spent in transactions that held this producer's changes.
    pub commit_seconds: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presence {
    Connected,
    /// Gone (or not back since a restart) until this instant; then its tables go.
    Leased(Instant),
    /// Its lease ran out: its tables are being removed.
    Expiring,
}

#[derive(Debug)]
struct Producer {
    committed: State,
    /// What the producer published: the committed state with its pending changes.
    desired: State,
    revision: Option<u64>,
    /// The revision published since the last batch, if any.
    pending: Option<u64>,
    /// What the pending publications touched.
    changes: Changes,
    presence: Presence,
    stats: ProducerStats,
}

impl Producer {
    fn new(presence: Presence) -> Self {
        Producer {
            committed: State::default(),
            desired: State::default(),
            revision: None,
            pending: None,
            changes: Changes::default(),
            presence,
            stats: ProducerStats::default(),
        }
    }
}

/// The aggregator's state: see the crate docs.
#[derive(Debug)]
pub struct Aggregator {
    producers: BTreeMap<String, Producer>,
    foreign: BTreeSet<TableKey>,
    lease: Duration,
    bindings: Bindings,
}

impl Aggregator {
    /// An aggregator whose producers keep their tables for `lease` after leaving, with no
    /// name bound yet.
    pub fn new(lease: Duration) -> Self {
        Aggregator::with_bindings(lease, Bindings::new())
    }

    /// An aggregator whose producer names are bound as `bindings` says (read back from the
    /// file an earlier run saved).
    pub fn with_bindings(lease: Duration, bindings: Bindings) -> Self {
        Aggregator { producers: BTreeMap::new(), foreign: BTreeSet::new(), lease, bindings }
    }

    /// Every producer name with the identity that owns it.
    pub fn bindings(&self) -> &Bindings {
        &self.bindings
    }

    /// Adopts what the kernel holds (`listed`, as `nft -s list ruleset` prints it): each
    /// table marked with the aggregator's comment is its producer's committed state, with a
    /// lease from `now`; every other table is foreign and refused to producers. Flushes
    /// nothing. Returns the producers adopted.
    pub fn adopt(&mut self, listed: &str, now: Instant) -> Result<Vec<String>, ParseError> {
        let (owned, foreign) = owned_tables(listed)?;
        self.foreign.extend(foreign);
        for (name, state) in &owned {
            let until = Presence::Leased(now + self.lease);
            let producer =
                self.producers.entry(name.clone()).or_insert_with(|| Producer::new(until));
            for (key, table) in &state.tables {
                producer.desired.tables.insert(key.clone(), table.clone());
                producer.committed.tables.insert(key.clone(), table.clone());
            }
        }
        Ok(owned.into_keys().collect())
    }

    /// A producer connects as `identity` ([`kpng_api::peer::PeerIdentity::key`]): it may
    /// publish from now on, and its lease (if any) stops. A name belongs to the first
    /// identity that connects under it, and is refused to every other, whether or not the
    /// owner is connected or still has tables.
    pub fn connect(&mut self, name: &str, identity: &str) -> Result<Binding, Refusal> {
        check_name("producer", name).map_err(Refusal::Name)?;
        let binding = match self.bindings.get(name) {
            Some(owner) if owner == identity => Binding::Known,
            Some(owner) => {
                return Err(Refusal::Bound {
                    producer: name.to_string(),
                    owner: owner.clone(),
                    identity: identity.to_string(),
                });
            }
            None => Binding::New,
        };
        match self.producers.get_mut(name) {
            Some(producer) if producer.presence == Presence::Connected => {
                return Err(Refusal::Connected(name.to_string()));
            }
            Some(producer) => producer.presence = Presence::Connected,
            None => {
                self.producers.insert(name.to_string(), Producer::new(Presence::Connected));
            }
        }
        if binding == Binding::New {
            self.bindings.insert(name.to_string(), identity.to_string());
        }
        Ok(binding)
    }

    /// A producer's connection ends: its tables stay for the lease, from `now`.
    pub fn disconnect(&mut self, name: &str, now: Instant) {
        if let Some(producer) = self.producers.get_mut(name) {
            producer.presence = Presence::Leased(now + self.lease);
        }
    }

    /// A producer cut off for misbehaving: what it published since its last batch is
    /// dropped, not committed; its committed tables stay (for its lease).
    pub fn cut(&mut self, name: &str) {
        if let Some(producer) = self.producers.get_mut(name)
            && producer.pending.is_some()
        {
            producer.desired = producer.committed.clone();
            producer.changes = Changes::default();
            producer.pending = None;
        }
    }

    /// Records a publication, to be committed with the next batch. Refused at once, with
    /// nothing changed, if an update does not apply, a text is invalid, or a table is not
    /// the producer's to take. The work is proportional to the publication, not to the
    /// producer's state.
    pub fn publish(&mut self, name: &str, publication: Publication) -> Result<(), Rejection> {
        let Publication { revision, updates } = publication;
        let reject =
            |object: String, message: String| Rejection::new(name, revision, object, message);
        let producer = self.producers.get_mut(name).filter(|p| p.presence == Presence::Connected);
        let Some(producer) = producer else {
            return Err(reject(String::new(), Refusal::NotConnected(name.to_string()).to_string()));
        };
        let mut changes = Changes::default();
        let mut undo = Vec::new();
        let applied = updates.into_iter().try_for_each(|update| {
            update.validate()?;
            changes.record(&update, &producer.desired);
            undo.push(producer.desired.apply_undoable(update)?);
            Ok::<_, ModelError>(())
        });
        let conflict = match applied {
            Err(error) => Some((String::new(), error.to_string())),
            Ok(()) => self.table_conflict(name, &changes),
        };
        let Some(producer) = self.producers.get_mut(name) else {
            return Err(reject(String::new(), Refusal::NotConnected(name.to_string()).to_string()));
        };
        if let Some((object, message)) = conflict {
            for step in undo.into_iter().rev() {
                producer.desired.undo(step);
            }
            if !object.is_empty() {
                producer.stats.rejections += 1;
            }
            return Err(reject(object, message));
        }
        producer.changes.merge(changes);
        producer.stats.publications += 1;
        producer.pending = Some(revision);
        Ok(())
    }

    /// A table that `changes` (of producer `name`) touches and that `name` may not hold:
    /// the object and why.
    fn table_conflict(&self, name: &str, changes: &Changes) -> Option<(String, String)> {
        let producer = self.producers.get(name)?;
        let touched = changes
            .tables
            .iter()
            .chain(changes.chains.iter().chain(&changes.sets).map(|(key, _)| key))
            .filter(|key| producer.desired.tables.contains_key(*key));
        for key in touched {
            if let Some(message) = self.owner_conflict(name, key) {
                return Some((format!("table {key}"), message));
            }
        }
        None
    }

    /// Why `name` may not hold the table `key`, if it may not.
    fn owner_conflict(&self, name: &str, key: &TableKey) -> Option<String> {
        let owner = self.producers.iter().find(|(other, producer)| {
            other.as_str() != name
                && (producer.committed.tables.contains_key(key)
                    || producer.desired.tables.contains_key(key))
        });
        match owner {
            Some((other, _)) => {
                Some(format!("refused to producer {name}: table {key} belongs to producer {other}"))
            }
            None if self.foreign.contains(key) => Some(format!(
                "refused to producer {name}: table {key} exists in the kernel and is not the \
                 aggregator's"
            )),
            None => None,
        }
    }

    /// Starts removing the tables of every producer whose lease ended by `now` (committed
    /// by the next batch). Returns their names.
    pub fn expire(&mut self, now: Instant) -> Vec<String> {
        let mut expired = Vec::new();
        for (name, producer) in &mut self.producers {
            if matches!(producer.presence, Presence::Leased(until) if until <= now) {
                producer.presence = Presence::Expiring;
                producer.stats.lease_expiries += 1;
                producer.changes.tables.extend(producer.desired.tables.keys().cloned());
                producer.changes.tables.extend(producer.committed.tables.keys().cloned());
                producer.desired = State::default();
                producer.pending = Some(producer.revision.unwrap_or(0));
                expired.push(name.clone());
            }
        }
        expired
    }

    /// When the next lease ends, if any runs.
    pub fn next_expiry(&self) -> Option<Instant> {
        let leases = self.producers.values().filter_map(|p| match p.presence {
            Presence::Leased(until) => Some(until),
            _ => None,
        });
        leases.min()
    }

    /// Whether a batch has anything to do.
    pub fn has_pending(&self) -> bool {
        self.producers.values().any(|p| p.pending.is_some())
    }
}

/// The tables of a ruleset listing (`nft -s list ruleset`): those marked with the
/// aggregator's comment by producer, and the foreign ones (any other, whatever it holds:
/// only the aggregator's own tables are read).
fn owned_tables(listed: &str) -> Result<(BTreeMap<String, State>, Vec<TableKey>), ParseError> {
    let mut owned: BTreeMap<String, State> = BTreeMap::new();
    let mut foreign = Vec::new();
    for (key, text) in split_tables(listed) {
        if !text.contains(&format!("comment \"{OWNER_COMMENT}")) {
            foreign.push(key);
            continue;
        }
        let parsed = parse(text)?;
        for (key, table) in parsed.state.tables {
            let owner = parsed.comments.get(&key).and_then(|c| comment_owner(c));
            match owner.filter(|name| check_name("producer", name).is_ok()) {
                Some(name) => {
                    owned.entry(name.to_string()).or_default().tables.insert(key, table);
                }
                None => foreign.push(key),
            }
        }
    }
    Ok((owned, foreign))
}

mod batch;
mod report;

pub use report::{ProducerReport, Report};

#[cfg(test)]
mod tests;

/// Converts an nft failure of `script` into a producer's rejection.
fn rejection(producer: &str, revision: u64, script: &Script, error: NftError) -> Rejection {
    let object = error
        .command()
        .map(str::to_string)
        .or_else(|| script.commands.first().cloned())
        .unwrap_or_default();
    Rejection::new(producer, revision, object, error.message)
}
