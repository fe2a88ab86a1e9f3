//! One batch: every producer's pending changes in one transaction, and what to do when
//! nft refuses it.

use std::time::Instant;

use super::{Aggregator, Batch, Presence, Rejection, rejection};
use crate::applier::Applier;
use crate::diff::{Phases, Script};

/// One producer's part of a batch.
struct Part {
    producer: String,
    revision: u64,
    script: Script,
}

impl Aggregator {
    /// Commits every pending change in one transaction. A producer whose part nft refuses
    /// (found by checking each part alone) is rejected with nft's error and keeps its
    /// committed state; the others are committed together without it. A producer whose
    /// desired state equals its committed one is acknowledged without any transaction.
    pub fn commit(&mut self, applier: &mut dyn Applier, now: Instant) -> Batch {
        let mut batch = Batch::default();
        let mut parts = Vec::new();
        for (name, producer) in &self.producers {
            if let Some(revision) = producer.pending {
                let mut phases = Phases::default();
                producer.changes.diff(name, &producer.committed, &producer.desired, &mut phases);
                let script = Script::from_phases(phases);
                parts.push(Part { producer: name.clone(), revision, script });
            }
        }
        let (empty, mut parts): (Vec<Part>, Vec<Part>) =
            parts.into_iter().partition(|part| part.script.is_empty());
        for part in empty {
            self.accept(&part, 0.0, &mut batch);
        }
        if parts.iter().any(|part| creates_table(&part.script)) {
            self.refresh_foreign(applier);
            parts.retain(|part| match self.foreign_conflict(&part.producer) {
                None => true,
                Some((object, message)) => {
                    let rejected = Rejection::new(&part.producer, part.revision, object, message);
                    self.reject(rejected, now, &mut batch);
                    false
                }
            });
        }
        let refused_before = batch.rejections.len();
        while !parts.is_empty() {
            let mut script = Script::default();
            parts.iter().for_each(|part| script.extend(&part.script));
            let started = Instant::now();
            let error = match applier.commit(&script) {
                Ok(()) => {
                    self.committed(&script, parts.drain(..), started, &mut batch);
                    break;
                }
                Err(error) => error,
            };
            if let [part] = parts.as_slice() {
                let rejected = rejection(&part.producer, part.revision, &part.script, error);
                self.reject(rejected, now, &mut batch);
                break;
            }
            let before = parts.len();
            parts.retain(|part| match applier.check(&part.script) {
                Ok(()) => true,
                Err(error) => {
                    let rejected = rejection(&part.producer, part.revision, &part.script, error);
                    self.reject(rejected, now, &mut batch);
                    false
                }
            });
            if parts.len() == before {
                // Each part passes alone but not with the others: one transaction each.
                for part in std::mem::take(&mut parts) {
                    let started = Instant::now();
                    match applier.commit(&part.script) {
                        Ok(()) => self.committed(&part.script.clone(), [part], started, &mut batch),
                        Err(error) => {
                            let rejected =
                                rejection(&part.producer, part.revision, &part.script, error);
                            self.reject(rejected, now, &mut batch);
                        }
                    }
                }
            }
        }
        let refused: Vec<String> =
            batch.rejections[refused_before..].iter().map(|r| r.producer.clone()).collect();
        for producer in refused {
            self.reread(&producer, applier);
        }
        batch
    }

    /// What the kernel holds of `name`'s tables becomes its committed (and desired) state:
    /// nft refused its change, perhaps because its tables changed behind the aggregator's
    /// back, and its next publication (a whole one, after a refusal) must be compared with
    /// what is really there. A listing that fails or does not parse keeps what it was.
    fn reread(&mut self, name: &str, applier: &mut dyn Applier) {
        let listed = match applier.ruleset() {
            Ok(listed) => listed,
            Err(error) => {
                tracing::warn!(producer = name, %error, "listing the ruleset after a refusal failed");
                return;
            }
        };
        let found = match super::owned_tables(&listed) {
            Ok((mut owned, _)) => owned.remove(name).unwrap_or_default(),
            Err(error) => {
                tracing::warn!(producer = name, %error, "reading the producer's tables back failed");
                return;
            }
        };
        if let Some(producer) = self.producers.get_mut(name) {
            producer.desired = found.clone();
            producer.committed = found;
        }
    }

    fn committed(
        &mut self,
        script: &Script,
        parts: impl IntoIterator<Item = Part>,
        started: Instant,
        batch: &mut Batch,
    ) {
        let took = started.elapsed().as_secs_f64();
        batch.transactions += 1;
        batch.commands += script.commands.len();
        for part in parts {
            self.accept(&part, took, batch);
        }
    }

    fn accept(&mut self, part: &Part, took: f64, batch: &mut Batch) {
        let Some(producer) = self.producers.get_mut(&part.producer) else { return };
        let Some(revision) = producer.pending.take() else { return };
        let changes = std::mem::take(&mut producer.changes);
        changes.copy(&producer.desired, &mut producer.committed);
        producer.revision = Some(revision);
        if !part.script.is_empty() {
            producer.stats.batches += 1;
            producer.stats.commit_seconds += took;
        }
        if producer.presence == Presence::Expiring {
            self.producers.remove(&part.producer);
            batch.removed.push(part.producer.clone());
        } else {
            batch.acks.push((part.producer.clone(), revision));
        }
    }

    fn reject(&mut self, rejected: Rejection, now: Instant, batch: &mut Batch) {
        if let Some(producer) = self.producers.get_mut(&rejected.producer) {
            producer.pending = None;
            let changes = std::mem::take(&mut producer.changes);
            changes.copy(&producer.committed, &mut producer.desired);
            producer.stats.rejections += 1;
            if producer.presence == Presence::Expiring {
                // Its tables could not be removed: try again after another lease.
                producer.presence = Presence::Leased(now + self.lease);
            }
        }
        batch.rejections.push(rejected);
    }

    /// Re-reads which tables exist outside the aggregator: one producer's new table must
    /// not be someone else's, even one created since the aggregator started.
    fn refresh_foreign(&mut self, applier: &mut dyn Applier) {
        match applier.tables() {
            Ok(tables) => {
                let ours =
                    |key| self.producers.values().any(|p| p.committed.tables.contains_key(key));
                let foreign = tables.iter().filter(|key| !ours(key)).cloned().collect();
                self.foreign = foreign;
            }
            Err(error) => tracing::warn!(%error, "listing the kernel's tables failed"),
        }
    }

    /// A table `producer` would create that exists outside the aggregator, if any.
    fn foreign_conflict(&self, producer: &str) -> Option<(String, String)> {
        let found = self.producers.get(producer)?;
        found.pending?;
        let key = found.changes.tables.iter().find(|key| {
            found.desired.tables.contains_key(*key)
                && !found.committed.tables.contains_key(*key)
                && self.foreign.contains(*key)
        })?;
        let message = format!(
            "refused to producer {producer}: table {key} exists in the kernel and is not the \
             aggregator's"
        );
        Some((format!("table {key}"), message))
    }
}

fn creates_table(script: &Script) -> bool {
    script.commands.iter().any(|command| command.starts_with("add table "))
}
