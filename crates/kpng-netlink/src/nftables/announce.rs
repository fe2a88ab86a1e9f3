//! nf_tables' announcements of committed transactions: a socket subscribed to the
//! `NFNLGRP_NFTABLES` multicast group receives every object a transaction changed, then
//! the generation it committed (`NFT_MSG_NEWGEN`), whoever committed it. [`Announcements`]
//! keeps, for each announced generation, what the transaction touched of one table, so a
//! process can tell whether other processes' commits left its table alone, and which of
//! its sets and chains they touched if not.
//!
//! A full receive buffer loses announcements (`ENOBUFS`): every generation up to the one
//! in force when the loss is noticed is then unknown, and a question about them has no
//! answer. (The loss happens while a transaction is announced, after its generation is
//! counted; a later transaction's loss is noticed again.)

use std::collections::{BTreeMap, BTreeSet};

use crate::attr;
use crate::message::{NETLINK_NETFILTER, NFNL_SUBSYS_NFTABLES, messages};
use crate::socket::{NetlinkError, NetlinkSocket};

use super::{dump, msg};

/// nf_tables' multicast group: every committed change.
pub const NFNLGRP_NFTABLES: u32 = 7;

/// Generations remembered at most; older ones are forgotten first.
const REMEMBERED: usize = 65_536;

/// What of the watched table a transaction touched: a set (its definition or elements) or a
/// chain (its definition or rules), in a protocol family (`nfgen_family`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// A set, by name.
    Set(u8, String),
    /// A chain, by name.
    Chain(u8, String),
}

/// What one announced transaction did to the watched table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum Touch {
    /// Nothing of it.
    #[default]
    Nothing,
    /// These sets and chains.
    Parts(BTreeSet<Part>),
    /// The table itself, or objects other than sets and chains.
    Whole,
}

impl Touch {
    fn add(&mut self, part: Option<Part>) {
        match (part, &mut *self) {
            (_, Touch::Whole) => {}
            (None, _) => *self = Touch::Whole,
            (Some(part), Touch::Parts(parts)) => {
                parts.insert(part);
            }
            (Some(part), Touch::Nothing) => *self = Touch::Parts(BTreeSet::from([part])),
        }
    }
}

/// What the announced commits of a span of generations did to the watched table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touched {
    /// Nothing of it.
    Nothing,
    /// These sets and chains, and nothing else of it.
    Parts(BTreeSet<Part>),
    /// The table itself or its other objects, or the announcements of some of the span's
    /// generations were not received (lost, or the socket was not listening then).
    Unknown,
}

/// The announcements of nf_tables commits, as far as they concern one table.
#[derive(Debug)]
pub struct Announcements {
    socket: NetlinkSocket,
    /// Asks for the generation in force when announcements were lost.
    asker: NetlinkSocket,
    table: String,
    listening: bool,
    /// Announced generations and what each transaction touched.
    announced: BTreeMap<u32, Touch>,
    /// What the transaction being announced touched so far.
    pending: Touch,
    /// The last generation whose announcements may have been lost.
    lost_through: Option<u32>,
}

impl Announcements {
    /// Listens to the announcements of the current network namespace, keeping what concerns
    /// the tables named `table` (of any family).
    pub fn open(table: &str) -> Result<Self, NetlinkError> {
        let mut socket = NetlinkSocket::open(NETLINK_NETFILTER)?;
        socket.subscribe(NFNLGRP_NFTABLES)?;
        let asker = NetlinkSocket::open(NETLINK_NETFILTER)?;
        Ok(Announcements {
            socket,
            asker,
            table: table.to_owned(),
            listening: true,
            announced: BTreeMap::new(),
            pending: Touch::Nothing,
            lost_through: None,
        })
    }

    /// Stops listening (around the process's own commits, whose announcements it need not
    /// receive): the generations committed meanwhile are missing until [`resume`](Self::resume).
    pub fn pause(&mut self) -> Result<(), NetlinkError> {
        if self.listening {
            self.socket.unsubscribe(NFNLGRP_NFTABLES)?;
            self.listening = false;
        }
        Ok(())
    }

    /// Listens again after [`pause`](Self::pause).
    pub fn resume(&mut self) -> Result<(), NetlinkError> {
        if !self.listening {
            self.socket.subscribe(NFNLGRP_NFTABLES)?;
            self.listening = true;
        }
        Ok(())
    }

    /// What the commits after generation `known` up to `now` did to the table, from the
    /// announcements received so far. Forgets the generations up to `known`.
    pub fn touched(&mut self, known: u32, now: u32) -> Result<Touched, NetlinkError> {
        self.receive()?;
        self.announced.retain(|generation, _| after(*generation, known));
        let span = now.wrapping_sub(known);
        let lost = self.lost_through.is_some_and(|lost| after(lost, known));
        if lost || span as usize > REMEMBERED {
            return Ok(Touched::Unknown);
        }
        let mut parts = BTreeSet::new();
        for step in 1..=span {
            match self.announced.get(&known.wrapping_add(step)) {
                Some(Touch::Nothing) => {}
                Some(Touch::Parts(touched)) => parts.extend(touched.iter().cloned()),
                Some(Touch::Whole) | None => return Ok(Touched::Unknown),
            }
        }
        Ok(match parts.is_empty() {
            true => Touched::Nothing,
            false => Touched::Parts(parts),
        })
    }

    /// Takes in every datagram queued.
    fn receive(&mut self) -> Result<(), NetlinkError> {
        loop {
            let datagram = match self.socket.try_receive() {
                Ok(Some(datagram)) => datagram,
                Ok(None) => return Ok(()),
                Err(e) if e.errno() == Some(nix::libc::ENOBUFS) => {
                    // Announcements were lost, of a transaction already counted: every
                    // generation up to the one in force now is unknown.
                    let now = dump::read_generation(&mut self.asker)?;
                    let lost = now.ok_or_else(|| NetlinkError::Io {
                        op: "generation",
                        source: std::io::Error::other("no generation in the answer"),
                    })?;
                    self.lost_through = Some(lost);
                    self.announced.retain(|generation, _| after(*generation, lost));
                    self.pending = Touch::Whole;
                    continue;
                }
                Err(e) => return Err(e),
            };
            for message in messages(&datagram) {
                if message.kind >> 8 != NFNL_SUBSYS_NFTABLES {
                    continue;
                }
                let family = message.body.first().copied().unwrap_or_default();
                let attrs = attr::parse(message.netfilter_payload());
                let kind = message.kind & 0xff;
                if kind == msg::NEWGEN {
                    if let Some(generation) = attr::find(&attrs, 1).and_then(attr::be32) {
                        let touch = std::mem::take(&mut self.pending);
                        if self.lost_through.is_some_and(|lost| !after(generation, lost)) {
                            continue;
                        }
                        self.announced.insert(generation, touch);
                        while self.announced.len() > REMEMBERED {
                            self.announced.pop_first();
                        }
                    }
                    continue;
                }
                let table = attr::find(&attrs, 1).map(attr::string);
                if table.as_deref() != Some(self.table.as_str()) {
                    continue;
                }
                let named = |kind: u16| attr::find(&attrs, kind).map(attr::string);
                let part = match kind {
                    // Chains (NFTA_CHAIN_NAME) and rules (NFTA_RULE_CHAIN).
                    3 | 5 | 27 => named(3).map(|name| Part::Chain(family, name)),
                    6 | 8 | 28 => named(2).map(|name| Part::Chain(family, name)),
                    // Sets (NFTA_SET_NAME) and elements (NFTA_SET_ELEM_LIST_SET).
                    9 | 11 | 29 | 12 | 14 | 30 => named(2).map(|name| Part::Set(family, name)),
                    // The table itself, stateful objects, flowtables.
                    _ => None,
                };
                self.pending.add(part);
            }
        }
    }
}

/// Whether generation `a` comes after `b` (they wrap).
fn after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}
