//! What `/state` shows: each producer, its revisions and its objects.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use super::{Aggregator, Presence, ProducerStats};
use crate::model::State;

/// The aggregator's state, for `/state`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Producers by name.
    pub producers: BTreeMap<String, ProducerReport>,
    /// Tables the aggregator found and refuses to producers (`ip filter`).
    pub foreign_tables: Vec<String>,
}

/// One producer in the [`Report`].
#[derive(Debug, Clone, Serialize)]
pub struct ProducerReport {
    /// `connected`, `leased` (gone, its tables kept until the lease ends) or `expiring`.
    pub presence: &'static str,
    /// Seconds left of its lease, when leased.
    pub lease_seconds_left: Option<f64>,
    /// The last revision committed.
    pub committed_revision: Option<u64>,
    /// The revision waiting for the next batch, if any.
    pub pending_revision: Option<u64>,
    /// Objects committed (tables, chains, sets, rules, elements).
    pub objects: usize,
    /// Its counters.
    pub stats: ProducerStats,
    /// Its committed tables (only in [`Aggregator::report`] with tables).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub committed: Option<State>,
}

impl Aggregator {
    /// What each producer has, at `now`; with `tables`, its committed tables too (a copy
    /// of every producer's state: for `/state`, not after every batch).
    pub fn report(&self, now: Instant, tables: bool) -> Report {
        let producers = self
            .producers
            .iter()
            .map(|(name, producer)| {
                let (presence, left) = match producer.presence {
                    Presence::Connected => ("connected", None),
                    Presence::Leased(until) => {
                        ("leased", Some(until.saturating_duration_since(now).as_secs_f64()))
                    }
                    Presence::Expiring => ("expiring", None),
                };
                let report = ProducerReport {
                    presence,
                    lease_seconds_left: left,
                    committed_revision: producer.revision,
                    pending_revision: producer.pending,
                    objects: producer.committed.objects(),
                    stats: producer.stats.clone(),
                    committed: tables.then(|| producer.committed.clone()),
                };
                (name.clone(), report)
            })
            .collect();
        let foreign_tables = self.foreign.iter().map(ToString::to_string).collect();
        Report { producers, foreign_tables }
    }
}
