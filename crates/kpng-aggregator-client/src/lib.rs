//! What a producer of kpng's nftables aggregator needs, apart from the aggregator itself:
//! the publication model (tables, chains with rules, sets and maps with elements, the
//! updates between two states), nft file structure parsed into it, the `aggregatorv1` wire
//! conversion, and the client that publishes and reads the acknowledgements. `to-nft
//! --aggregator` and `kpng publish` use this crate only; the daemon (`kpng-aggregator`)
//! uses it too.
//!
//! # Layout
//! - [`model`]: tables, chains, sets, the updates a producer publishes, and validation.
//! - [`parse`]: nft file structure into the model (`kpng publish --file`, adoption).
//! - [`updates`]: the updates from one desired state to the next (what a producer
//!   publishes after its whole state).
//! - [`rejection`]: [`Rejection`], why a revision was refused, cut to an excerpt.
//! - [`wire`]: `aggregatorv1` messages ↔ the model.
//! - [`client`]: a producer's stream and its acknowledgements.

pub mod client;
pub mod model;
pub mod parse;
pub mod rejection;
pub mod updates;
pub mod wire;

pub use model::{
    Chain, Family, ModelError, Publication, Set, SetKind, State, Table, TableKey, Update,
};
pub use rejection::Rejection;
