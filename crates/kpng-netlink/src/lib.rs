//! Netlink for kpng, in layers: bytes ↔ messages (no I/O), then one socket.
//!
//! Nothing here knows about services: it speaks nf_tables, conntrack and routing
//! notifications in their own terms, so that kpng's backends (the nftables table, the
//! conntrack cleanup, the node's addresses) share one correct encoding.
//!
//! # Layout
//! - [`attr`]: netlink attributes, written and parsed.
//! - [`message`]: message framing, netfilter families, and [`message::Batch`], the messages of
//!   one nf_tables transaction.
//! - [`nftables`]: typed nf_tables expressions; one type per message (tables, chains, sets,
//!   rules, elements, objects, generations) with its encoding and decoding, shared by the
//!   batch builders and the dump reader, held to nft's own bytes by golden fixtures.
//! - [`ctnetlink`]: conntrack entries: dump by destination, delete by tuple.
//! - [`rtnetlink`]: the namespace's addresses, listed and watched.
//! - [`sock_diag`]: a namespace's connected UDP sockets, dumped and destroyed.
//! - [`socket`]: [`socket::NetlinkSocket`]: commit a batch, dump, acknowledged requests,
//!   notifications; opened in this thread's network namespace or in another.

pub mod attr;
pub mod ctnetlink;
pub mod message;
pub mod nftables;
pub mod rtnetlink;
pub mod sock_diag;
pub mod socket;

pub use message::{Batch, ProtoFamily};
pub use socket::{NetlinkError, NetlinkSocket};
