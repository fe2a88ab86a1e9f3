//! nf_tables over netlink: kpng's own encoding of transactions, and the socket that
//! carries them.
//!
//! - [`wire`]: bytes only, no I/O: messages, attributes, element keys and values, and the
//!   pick-chain rule.
//! - [`attr`]: attribute writing shared by both encoders.
//! - [`ctnetlink`]: conntrack dump and delete messages, for UDP cleanup.
//! - [`decode`]: dumped messages back into keys, values and chain names.
//! - [`socket`]: a `NETLINK_NETFILTER` socket that sends one batch and collects the
//!   kernel's answer for every message in it.

pub mod attr;
pub mod ctnetlink;
pub mod decode;
pub mod socket;
pub mod wire;
