//! The global store: the one place sources write and sinks read.
//!
//! A source turns what it observes into [`SourceEvent`]s and hands them to the
//! [`StoreWriter`] in batches. The store compares each object with what it holds: equal
//! values are dropped, and one batch with real changes becomes exactly one new
//! [`Revision`]. Readers ([`StoreReader`], cheap to clone) wait for "a revision after R",
//! then ask which services and nodes changed since R, so a consumer recomputes only those.
//!
//! Nothing is released to readers until every kind the sources announced has completed its
//! initial list: a node never acts on a half-listed cluster.
//!
//! # Layout
//! - [`events`]: [`SourceEvent`], the vocabulary every source emits.
//! - [`mod@store`]: [`store()`] builds a [`StoreWriter`] (exactly one, not cloneable) and
//!   [`StoreReader`]s; the change log that answers "what changed since R".
//! - [`stats`]: [`StoreStats`], the counters behind `--stats` and the metrics.

pub mod events;
pub mod stats;
pub mod store;

pub use events::SourceEvent;
pub use stats::{StatsSnapshot, StoreStats};
pub use store::{Revision, Snapshot, StoreReader, StoreWriter, store};
