//! nf_tables over netlink: typed expressions ([`expr`]); one type per message kpng sends
//! or reads, with its encoding and decoding ([`messages`]); the builders that append
//! messages creating, changing and deleting tables, chains, sets, rules and elements to a
//! batch ([`objects`]); and dumps of what the kernel holds, decoded into the same message
//! types ([`dump`]); and the announcements of committed transactions, by generation
//! ([`announce`]). Numbers follow the kernel's uapi (`linux/netfilter/nf_tables.h`);
//! each is named where it is used.

pub mod announce;
pub mod dump;
pub mod expr;
pub mod messages;
pub mod objects;

pub use expr::{Expr, Register, Verdict};
pub use objects::{ChainSpec, Hook, SetSpec};

/// nf_tables message types (`enum nf_tables_msg_types`).
pub mod msg {
    /// Create a table.
    pub const NEWTABLE: u16 = 0;
    /// The ruleset's generation (an answer, or a notification of a commit).
    pub const NEWGEN: u16 = 15;
    /// Ask for the ruleset's generation.
    pub const GETGEN: u16 = 16;
    /// Dump tables.
    pub const GETTABLE: u16 = 1;
    /// Delete a table.
    pub const DELTABLE: u16 = 2;
    /// Create a chain.
    pub const NEWCHAIN: u16 = 3;
    /// Dump chains.
    pub const GETCHAIN: u16 = 4;
    /// Delete a chain.
    pub const DELCHAIN: u16 = 5;
    /// Create a rule.
    pub const NEWRULE: u16 = 6;
    /// Dump rules.
    pub const GETRULE: u16 = 7;
    /// Delete rules (all of a chain without a handle).
    pub const DELRULE: u16 = 8;
    /// Create a set.
    pub const NEWSET: u16 = 9;
    /// Dump sets.
    pub const GETSET: u16 = 10;
    /// Delete a set.
    pub const DELSET: u16 = 11;
    /// Add set elements.
    pub const NEWSETELEM: u16 = 12;
    /// Dump set elements.
    pub const GETSETELEM: u16 = 13;
    /// Delete set elements (all of a set without a list).
    pub const DELSETELEM: u16 = 14;
    /// Create a stateful object.
    pub const NEWOBJ: u16 = 18;
    /// Dump stateful objects.
    pub const GETOBJ: u16 = 19;
    /// Delete a stateful object.
    pub const DELOBJ: u16 = 20;
}

/// `NFTA_LIST_ELEM`: one element of a nested list.
pub const NFTA_LIST_ELEM: u16 = 1;
/// `NFTA_DATA_VALUE`: a value inside `nft_data`.
pub const NFTA_DATA_VALUE: u16 = 1;
/// `NFTA_DATA_VERDICT`: a verdict inside `nft_data`.
pub const NFTA_DATA_VERDICT: u16 = 2;
