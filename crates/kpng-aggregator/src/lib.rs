//! kpng's nftables aggregator: one process owns the node's nftables, many producers
//! publish the tables they own, and every batch of their changes is one transaction.
//!
//! A producer names itself and publishes desired state as nftables objects: the tables it
//! declares (under names that neither another producer nor anything outside the aggregator
//! holds), their chains with rules, and their sets and maps with elements, in nft syntax.
//! It publishes its whole state first, then updates (elements added or removed, a chain's
//! rules replaced, an object put or deleted), each carrying a revision. The aggregator
//! diffs each producer's desired state against what it committed for that producer and
//! merges every producer's commands into one `nft -f -` script per batch. kpng's own
//! nftables backend is one such producer (`to-nft --aggregator`, through
//! `kpng_nft::AggregatorKernel`), `kpng publish` another.
//!
//! # Cost
//! A batch is one `nft` invocation, which sends one atomic netlink batch: one kernel
//! transaction for every producer's changes at once. The aggregator's cost is therefore
//! one process start (~10 ms) plus one transaction per batch, and batches are paced by the
//! runner's policy ([`kpng_backend::pace::Pace`]: a burst, then at most one per
//! `--min-sync-period`, and a rest after a long one), so changes that arrive meanwhile,
//! element changes above all, coalesce into the next batch instead of each costing a
//! transaction. The aggregator's own work is proportional to the change, not to the
//! producer's state: a publication is applied in place to the producer's desired state
//! (and taken back with an undo log if any of its updates does not apply), the objects it
//! touches are recorded ([`changes::Changes`]: whole tables, single chains and sets, single
//! elements), and a batch compares, commits or rolls back only those. An element update
//! costs the same a few microseconds whether the producer holds a thousand elements or half
//! a million; a whole state (a producer connecting again) is compared whole.
//!
//! # Guarantees
//! - **Isolation**: when nft refuses a batch, each producer's part is checked alone
//!   (`nft -c`); a part that fails is rejected with nft's error (which quotes the failing
//!   command, naming the object) and the rest is committed in one transaction. A rejected
//!   producer keeps its previous committed state, as the kernel lists it: its tables are
//!   read back (they may have been changed behind the aggregator's back, which is often
//!   why nft refused), so that its next whole publication recreates what is missing.
//! - **Ownership**: a producer creates and changes only its own tables; another producer's
//!   table or a table the aggregator did not create is refused with an error naming the
//!   producer, the table and its owner. Each table the aggregator creates carries the
//!   comment `kpng-aggregator producer=NAME`.
//! - **Identity**: a producer name belongs to the first identity that published under it
//!   (a Unix user, or the names of a TLS client's certificate), for good: [`bindings`]
//!   keeps the names in a file, so neither a lease that ran out nor a restart frees a name
//!   for another identity. Who may connect at all is the server's business (a Unix socket
//!   admits root and the users and groups allowed, TCP needs mutual TLS).
//! - **Leases**: a producer that disconnects keeps its tables for the lease; then they are
//!   deleted in one transaction. A producer that reconnects and publishes its whole state
//!   changes only what differs (nothing, if nothing does).
//! - **Restarts**: at start-up the aggregator reads the ruleset (`nft -s list ruleset`),
//!   adopts every table carrying its comment as its producer's committed state, with a
//!   lease from start-up, and flushes nothing. Where nft prints something differently from
//!   how a producer wrote it, the producer's republication replaces that element or
//!   chain's rules, within one transaction.
//!
//! # Layout
//! - From `kpng-aggregator-client`, re-exported: [`model`] (tables, chains, sets, updates,
//!   validation), [`parse`] (nft file structure into the model), [`updates`] (from one
//!   desired state to the next), [`wire`] (`aggregatorv1` ↔ the model), [`client`] (a
//!   producer's stream) and [`Rejection`]: what producers need, apart from the daemon.
//! - [`diff`]: committed → desired as nft commands, in an order valid in one transaction.
//! - [`changes`]: what a producer touched since its last batch: the objects a batch diffs,
//!   commits or rolls back.
//! - [`applier`]: [`Applier`], with [`NftApplier`] (one `nft -f -` per batch, optionally
//!   in a network namespace) and [`MemoryApplier`] (for tests).
//! - [`libnft`]: [`LibNftApplier`], each batch committed in-process by libnftables (the
//!   default; the crate's only unsafe code).
//! - [`engine`]: [`Aggregator`]: producers, ownership, leases, adoption, and the batch.
//! - [`bindings`]: which identity owns each producer name, saved in a file.
//! - [`daemon`]: the task that owns the [`Aggregator`], paces batches with the runner's
//!   policy, ends leases and answers producers, reached through a [`daemon::Handle`].
//! - [`service`]: the gRPC service `/aggregatorv1.Aggregator/Publish`.
//! - [`metrics`]: `/metrics` text, per producer.

pub mod applier;
pub mod bindings;
pub mod changes;
pub mod daemon;
pub mod diff;
pub mod engine;
pub mod libnft;
pub mod metrics;
pub mod service;

pub use kpng_aggregator_client::{client, model, parse, rejection, updates, wire};

pub use applier::{Applier, MemoryApplier, NftApplier, NftError};
pub use engine::{Aggregator, Batch, Binding, Refusal, Rejection};
pub use libnft::LibNftApplier;
pub use model::{
    Chain, Family, ModelError, Publication, Set, SetKind, State, Table, TableKey, Update,
};
