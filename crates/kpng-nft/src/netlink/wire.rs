//! nf_tables netlink messages as bytes. Pure: builds a batch in memory.
//!
//! Layouts follow the kernel's uapi (`linux/netfilter/nf_tables.h`): every message is an
//! `nlmsghdr` and an `nfgenmsg`, followed by attributes (`nlattr`, 4-byte aligned, nested
//! ones flagged `NLA_F_NESTED`). Concatenated set keys put each field in its own 32-bit
//! register-sized slot: addresses and ports in network order, protocols as one byte, and
//! `numgen` results in host order.

use std::net::IpAddr;

use kpng_model::{Family, Protocol};

use crate::objects::{Dest, ElementId, Key, MapName, PickKind, TABLE, Value};

/// Netlink protocol number of netfilter.
pub const NETLINK_NETFILTER: isize = 12;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;

const NFT_MSG_DELTABLE: u16 = 2;
/// Get rules (dumped).
pub const NFT_MSG_GETRULE: u16 = 7;
/// Get sets (dumped).
pub const NFT_MSG_GETSET: u16 = 10;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_DELSET: u16 = 11;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_SET_TIMEOUT: u16 = 11;
const NFT_SET_TIMEOUT: u32 = 0x10;
const NFT_SET_EVAL: u32 = 0x20;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFT_GOTO: i32 = -4;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
/// Get set elements (dumped).
pub const NFT_MSG_GETSETELEM: u16 = 13;
const NLM_F_DUMP: u16 = 0x300;
const NFTA_TABLE_NAME: u16 = 1;

/// `nlmsghdr` flags.
pub const NLM_F_REQUEST: u16 = 0x1;
/// Ask for an acknowledgement.
pub const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;

const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const NFPROTO_UNSPEC: u8 = 0;

// Attribute numbers.
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_ID: u16 = 10;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_KEY_END: u16 = 10;
const NFTA_DATA_VALUE: u16 = 1;

/// Keep each message's element list well under the 64 KiB an attribute length can express.
const MAX_ELEMENTS_BYTES: usize = 48 * 1024;

fn nfproto(family: Family) -> u8 {
    match family {
        Family::V4 => NFPROTO_IPV4,
        Family::V6 => NFPROTO_IPV6,
    }
}

/// A batch of messages under construction, with a description of each for error reports.
#[derive(Debug, Default)]
pub struct Batch {
    buf: Vec<u8>,
    seq: u32,
    /// `(sequence number, what the message does)` for every message but the batch markers.
    pub messages: Vec<(u32, String)>,
}

impl Batch {
    /// An empty batch whose sequence numbers start after `seq`.
    pub fn new(seq: u32) -> Self {
        let mut batch = Batch { buf: Vec::new(), seq, messages: Vec::new() };
        let start =
            batch.begin(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, NFPROTO_UNSPEC, NFNL_SUBSYS_NFTABLES);
        batch.end(start);
        batch
    }

    /// Closes the batch and returns its bytes and the last sequence number used.
    pub fn finish(mut self) -> (Vec<u8>, u32, Vec<(u32, String)>) {
        let start =
            self.begin(NFNL_MSG_BATCH_END, NLM_F_REQUEST, NFPROTO_UNSPEC, NFNL_SUBSYS_NFTABLES);
        self.end(start);
        (self.buf, self.seq, self.messages)
    }

    /// Whether the batch holds no message besides its markers.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    fn begin(&mut self, kind: u16, flags: u16, family: u8, res_id: u16) -> usize {
        self.seq = self.seq.wrapping_add(1);
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // length, patched in end()
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&self.seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
        self.buf.push(family);
        self.buf.push(0); // NFNETLINK_V0
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        start
    }

    fn end(&mut self, start: usize) {
        let len = (self.buf.len() - start) as u32;
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    fn message(&mut self, msg: u16, flags: u16, family: Family, what: String) -> usize {
        let kind = (NFNL_SUBSYS_NFTABLES << 8) | msg;
        let start = self.begin(kind, NLM_F_REQUEST | NLM_F_ACK | flags, nfproto(family), 0);
        self.messages.push((self.seq, what));
        start
    }

    fn attr(&mut self, kind: u16, payload: &[u8]) {
        super::attr::put(&mut self.buf, kind, payload);
    }

    fn attr_str(&mut self, kind: u16, text: &str) {
        let mut bytes = text.as_bytes().to_vec();
        bytes.push(0);
        self.attr(kind, &bytes);
    }

    fn attr_u32(&mut self, kind: u16, value: u32) {
        self.attr(kind, &value.to_be_bytes());
    }

    fn nest(&mut self, kind: u16) -> usize {
        super::attr::open(&mut self.buf, kind)
    }

    fn nest_end(&mut self, start: usize) {
        super::attr::close(&mut self.buf, start);
    }

    /// Adds (`add` true) or deletes elements of one set or map, split into messages that
    /// stay within netlink's attribute size.
    pub fn elements(&mut self, add: bool, elements: &[(ElementId, Value)]) {
        let mut i = 0;
        while i < elements.len() {
            let (id, _) = &elements[i];
            let (family, map) = (id.family, id.map);
            let (msg, flags, verb) = if add {
                (NFT_MSG_NEWSETELEM, NLM_F_CREATE, "add")
            } else {
                (NFT_MSG_DELSETELEM, 0, "delete")
            };
            let what = format!(
                "{verb} element {} {TABLE} {map} {{ {} }}",
                crate::objects::table_family(family),
                crate::text::element_text(&id.key, &elements[i].1)
            );
            let start = self.message(msg, flags, family, what);
            self.attr_str(NFTA_SET_ELEM_LIST_TABLE, TABLE);
            self.attr_str(NFTA_SET_ELEM_LIST_SET, &map.name());
            let list = self.nest(NFTA_SET_ELEM_LIST_ELEMENTS);
            while i < elements.len() && elements[i].0.family == family && elements[i].0.map == map {
                if self.buf.len() - list > MAX_ELEMENTS_BYTES {
                    break;
                }
                let (id, value) = &elements[i];
                self.element(&id.key, if add { Some(value) } else { None });
                i += 1;
            }
            self.nest_end(list);
            self.end(start);
        }
    }

    fn element(&mut self, key: &Key, value: Option<&Value>) {
        let elem = self.nest(NFTA_LIST_ELEM);
        let key_nest = self.nest(NFTA_SET_ELEM_KEY);
        self.attr(NFTA_DATA_VALUE, &key_bytes(key, false));
        self.nest_end(key_nest);
        if let Key::DestSource(..) = key {
            let end = self.nest(NFTA_SET_ELEM_KEY_END);
            self.attr(NFTA_DATA_VALUE, &key_bytes(key, true));
            self.nest_end(end);
        }
        match value {
            None | Some(Value::None) => {}
            Some(Value::Affinity(hash)) => {
                let data = self.nest(NFTA_SET_ELEM_DATA);
                self.verdict_goto(&crate::objects::affinity_chain(*hash));
                self.nest_end(data);
            }
            Some(Value::Endpoint(ip, port)) => {
                let data = self.nest(NFTA_SET_ELEM_DATA);
                let mut bytes = ip_bytes(ip);
                bytes.extend_from_slice(&port_bytes(*port));
                self.attr(NFTA_DATA_VALUE, &bytes);
                self.nest_end(data);
            }
        }
        self.nest_end(elem);
    }

    /// Creates the count set of `n` endpoints of `kind` in `family`, and appends to the
    /// kind's counts chain the rule that picks among `n` slots for its members.
    pub fn create_ladder(&mut self, family: Family, kind: PickKind, n: u32) {
        let set = MapName::Count(kind, n).name();
        let fam = crate::objects::table_family(family);
        let start = self.message(
            NFT_MSG_NEWSET,
            NLM_F_CREATE,
            family,
            format!("add set {fam} {TABLE} {set}"),
        );
        self.attr_str(NFTA_SET_TABLE, TABLE);
        self.attr_str(NFTA_SET_NAME, &set);
        self.attr_u32(NFTA_SET_FLAGS, 0);
        // nft's type ids, concatenated 6 bits apart: ipv4_addr 7, ipv6_addr 8,
        // inet_proto 12, inet_service 13.
        let (key_type, key_len) = match (family, kind.by_destination()) {
            (Family::V4, true) => (((7 << 6) | 12) << 6 | 13, 12),
            (Family::V6, true) => (((8 << 6) | 12) << 6 | 13, 24),
            (_, false) => ((12 << 6) | 13, 8),
        };
        self.attr_u32(NFTA_SET_KEY_TYPE, key_type);
        self.attr_u32(NFTA_SET_KEY_LEN, key_len);
        self.attr_u32(NFTA_SET_ID, self.seq);
        self.end(start);
        let chain = kind.counts_chain();
        let what =
            format!("add rule {fam} {TABLE} {chain} (@{set}: dnat to a random one of {n} slots)");
        let start = self.message(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, family, what);
        self.attr_str(NFTA_RULE_TABLE, TABLE);
        self.attr_str(NFTA_RULE_CHAIN, &chain);
        let exprs = self.nest(NFTA_RULE_EXPRESSIONS);
        self.pick_expressions(family, kind, n, &set);
        self.nest_end(exprs);
        self.end(start);
    }

    /// A `goto <chain>` verdict (inside a data attribute).
    fn verdict_goto(&mut self, chain: &str) {
        let v = self.nest(NFTA_DATA_VERDICT);
        self.attr_u32(NFTA_VERDICT_CODE, NFT_GOTO as u32);
        self.attr_str(NFTA_VERDICT_CHAIN, chain);
        self.nest_end(v);
    }

    /// Removes every rule of one chain (never without a chain name: that would flush the
    /// whole table).
    fn flush_rules(&mut self, family: Family, chain: &str) {
        let fam = crate::objects::table_family(family);
        let start =
            self.message(NFT_MSG_DELRULE, 0, family, format!("flush chain {fam} {TABLE} {chain}"));
        self.attr_str(NFTA_RULE_TABLE, TABLE);
        self.attr_str(NFTA_RULE_CHAIN, chain);
        self.end(start);
    }

    fn chain_message(&mut self, msg: u16, flags: u16, family: Family, name: &str, verb: &str) {
        let fam = crate::objects::table_family(family);
        let start = self.message(msg, flags, family, format!("{verb} chain {fam} {TABLE} {name}"));
        self.attr_str(NFTA_CHAIN_TABLE, TABLE);
        self.attr_str(NFTA_CHAIN_NAME, name);
        self.end(start);
    }

    fn rule(&mut self, family: Family, chain: &str, what: &str, body: impl FnOnce(&mut Self)) {
        let fam = crate::objects::table_family(family);
        let start = self.message(
            NFT_MSG_NEWRULE,
            NLM_F_CREATE | NLM_F_APPEND,
            family,
            format!("add rule {fam} {TABLE} {chain} {what}"),
        );
        self.attr_str(NFTA_RULE_TABLE, TABLE);
        self.attr_str(NFTA_RULE_CHAIN, chain);
        let exprs = self.nest(NFTA_RULE_EXPRESSIONS);
        body(self);
        self.nest_end(exprs);
        self.end(start);
    }

    fn set_message(&mut self, msg: u16, family: Family, name: &str, verb: &str) -> usize {
        let fam = crate::objects::table_family(family);
        let start = self.message(
            msg,
            if msg == NFT_MSG_NEWSET { NLM_F_CREATE } else { 0 },
            family,
            format!("{verb} set {fam} {TABLE} {name}"),
        );
        self.attr_str(NFTA_SET_TABLE, TABLE);
        self.attr_str(NFTA_SET_NAME, name);
        start
    }

    /// Applies one affinity-group operation (see [`crate::affinity`]).
    pub fn affinity(&mut self, op: &crate::affinity::AffinityOp) {
        use crate::affinity::{AffinityOp, slot_name};
        use crate::objects::affinity_chain;
        let (group, old) = match op {
            AffinityOp::Create(g) => (g, None),
            AffinityOp::Replace { old, new } => (new, Some(old)),
            AffinityOp::Remove(g) => {
                let entry = affinity_chain(g.hash);
                self.flush_rules(g.family, &entry);
                self.chain_message(NFT_MSG_DELCHAIN, 0, g.family, &entry, "delete");
                for i in 0..g.slots.len() {
                    let name = slot_name(g.hash, i);
                    self.flush_rules(g.family, &name);
                    self.chain_message(NFT_MSG_DELCHAIN, 0, g.family, &name, "delete");
                    let start = self.set_message(NFT_MSG_DELSET, g.family, &name, "delete");
                    self.end(start);
                }
                return;
            }
        };
        let family = group.family;
        let entry = affinity_chain(group.hash);
        let old_n = old.map_or(0, |o| o.slots.len());
        let retimed = old.is_some_and(|o| o.timeout != group.timeout);
        if old.is_some() {
            self.flush_rules(family, &entry);
            for i in 0..old_n {
                let name = slot_name(group.hash, i);
                self.flush_rules(family, &name);
                if retimed || i >= group.slots.len() {
                    let start = self.set_message(NFT_MSG_DELSET, family, &name, "delete");
                    self.end(start);
                }
            }
        }
        self.chain_message(NFT_MSG_NEWCHAIN, NLM_F_CREATE, family, &entry, "add");
        for i in 0..group.slots.len() {
            let name = slot_name(group.hash, i);
            if retimed || i >= old_n {
                let start = self.set_message(NFT_MSG_NEWSET, family, &name, "add");
                let (key_type, key_len) = match family {
                    Family::V4 => (7, 4),
                    Family::V6 => (8, 16),
                };
                self.attr_u32(NFTA_SET_FLAGS, NFT_SET_TIMEOUT | NFT_SET_EVAL);
                self.attr_u32(NFTA_SET_KEY_TYPE, key_type);
                self.attr_u32(NFTA_SET_KEY_LEN, key_len);
                self.attr(NFTA_SET_TIMEOUT, &(u64::from(group.timeout) * 1000).to_be_bytes());
                self.attr_u32(NFTA_SET_ID, self.seq);
                self.end(start);
            } else if old.is_some_and(|o| o.slots[i].1 != 0 && o.slots[i] != group.slots[i]) {
                // A new endpoint in this slot: its old clients choose again.
                let start = self.set_message(NFT_MSG_DELSETELEM, family, &name, "flush");
                self.end(start);
            }
            self.chain_message(NFT_MSG_NEWCHAIN, NLM_F_CREATE, family, &name, "add");
            let (ip, port) = group.slots[i];
            let protocol = group.protocol;
            self.rule(family, &name, "(remember the client, dnat to the slot's endpoint)", |b| {
                b.slot_expressions(family, &name, protocol, ip, port)
            });
        }
        let n = group.slots.len();
        for i in 0..n {
            let name = slot_name(group.hash, i);
            self.rule(family, &entry, "(a known client)", |b| {
                b.saddr(family);
                b.expr("lookup", &[(1, ExprAttr::Str(&name)), (2, ExprAttr::U32(1))]);
                b.goto(&name);
            });
        }
        for i in 0..n {
            let name = slot_name(group.hash, i);
            let modulus = (n - i) as u32;
            self.rule(family, &entry, "(a new client)", |b| {
                if modulus > 1 {
                    b.expr(
                        "numgen",
                        &[
                            (1, ExprAttr::U32(1)),
                            (2, ExprAttr::U32(modulus)),
                            (3, ExprAttr::U32(1)),
                        ],
                    );
                    b.cmp_eq(&0u32.to_ne_bytes());
                }
                b.goto(&name);
            });
        }
        for i in n..old_n {
            self.chain_message(NFT_MSG_DELCHAIN, 0, family, &slot_name(group.hash, i), "delete");
        }
    }

    fn saddr(&mut self, family: Family) {
        let (offset, len) = match family {
            Family::V4 => (12, 4),
            Family::V6 => (8, 16),
        };
        self.expr(
            "payload",
            &[
                (1, ExprAttr::U32(1)),
                (2, ExprAttr::U32(1)),
                (3, ExprAttr::U32(offset)),
                (4, ExprAttr::U32(len)),
            ],
        );
    }

    fn goto(&mut self, chain: &str) {
        let elem = self.nest(NFTA_LIST_ELEM);
        self.attr_str(NFTA_EXPR_NAME, "immediate");
        let data = self.nest(NFTA_EXPR_DATA);
        self.attr_u32(1, 0); // NFTA_IMMEDIATE_DREG: the verdict register
        let imm = self.nest(2); // NFTA_IMMEDIATE_DATA
        self.verdict_goto(chain);
        self.nest_end(imm);
        self.nest_end(data);
        self.nest_end(elem);
    }

    fn cmp_eq(&mut self, value: &[u8]) {
        let elem = self.nest(NFTA_LIST_ELEM);
        self.attr_str(NFTA_EXPR_NAME, "cmp");
        let data = self.nest(NFTA_EXPR_DATA);
        self.attr_u32(1, 1); // NFTA_CMP_SREG
        self.attr_u32(2, 0); // NFTA_CMP_OP: NFT_CMP_EQ
        let v = self.nest(3); // NFTA_CMP_DATA
        self.attr(NFTA_DATA_VALUE, value);
        self.nest_end(v);
        self.nest_end(data);
        self.nest_end(elem);
    }

    fn immediate(&mut self, reg: u32, value: &[u8]) {
        let elem = self.nest(NFTA_LIST_ELEM);
        self.attr_str(NFTA_EXPR_NAME, "immediate");
        let data = self.nest(NFTA_EXPR_DATA);
        self.attr_u32(1, reg);
        let imm = self.nest(2);
        self.attr(NFTA_DATA_VALUE, value);
        self.nest_end(imm);
        self.nest_end(data);
        self.nest_end(elem);
    }

    /// `meta l4proto P update @set { saddr } dnat to ip:port`, as nft encodes it.
    fn slot_expressions(
        &mut self,
        family: Family,
        set: &str,
        protocol: kpng_model::Protocol,
        ip: IpAddr,
        port: u16,
    ) {
        use ExprAttr::{Str, U32};
        self.expr("meta", &[(1, U32(1)), (2, U32(16))]);
        self.cmp_eq(&protocol_bytes(protocol)[..1]);
        self.saddr(family);
        // NFTA_DYNSET_SET_NAME, NFTA_DYNSET_OP (update), NFTA_DYNSET_SREG_KEY.
        self.expr("dynset", &[(1, Str(set)), (3, U32(1)), (4, U32(1))]);
        self.immediate(1, &ip_bytes(&ip));
        self.immediate(2, &port_bytes(port)[..2]);
        self.expr(
            "nat",
            &[(1, U32(1)), (2, U32(nfproto(family) as u32)), (3, U32(1)), (5, U32(2)), (7, U32(2))],
        );
    }

    /// Deletes kpng's table of `family` with everything in it.
    pub fn delete_table(&mut self, family: Family) {
        let fam = crate::objects::table_family(family);
        let start =
            self.message(NFT_MSG_DELTABLE, 0, family, format!("delete table {fam} {TABLE}"));
        self.attr_str(NFTA_TABLE_NAME, TABLE);
        self.end(start);
    }

    fn expr(&mut self, name: &str, attrs: &[(u16, ExprAttr<'_>)]) {
        let elem = self.nest(NFTA_LIST_ELEM);
        self.attr_str(NFTA_EXPR_NAME, name);
        let data = self.nest(NFTA_EXPR_DATA);
        for (kind, value) in attrs {
            match value {
                ExprAttr::U32(v) => self.attr_u32(*kind, *v),
                ExprAttr::Str(s) => self.attr_str(*kind, s),
            }
        }
        self.nest_end(data);
        self.nest_end(elem);
    }

    /// `dnat to <key> . numgen random mod n map @<backends>`, register by register as nft
    /// itself encodes it.
    fn pick_expressions(&mut self, family: Family, kind: PickKind, n: u32, count_set: &str) {
        use ExprAttr::{Str, U32};
        // Register numbers: 1-4 are the 128-bit registers, 8-23 the 32-bit ones.
        let (addr_len, addr_offset, l4_reg, port_reg, ng_reg, proto_min) =
            match (family, kind.by_destination()) {
                (Family::V4, true) => (4, 16, 9, 10, 11, 9),
                (Family::V6, true) => (16, 24, 2, 13, 14, 2),
                (Family::V4, false) => (0, 0, 1, 9, 10, 9),
                (Family::V6, false) => (0, 0, 1, 9, 10, 2),
            };
        const PAYLOAD_DREG: u16 = 1;
        const PAYLOAD_BASE: u16 = 2;
        const PAYLOAD_OFFSET: u16 = 3;
        const PAYLOAD_LEN: u16 = 4;
        const NETWORK_HEADER: u32 = 1;
        const TRANSPORT_HEADER: u32 = 2;
        if kind.by_destination() {
            self.expr(
                "payload",
                &[
                    (PAYLOAD_DREG, U32(1)),
                    (PAYLOAD_BASE, U32(NETWORK_HEADER)),
                    (PAYLOAD_OFFSET, U32(addr_offset)),
                    (PAYLOAD_LEN, U32(addr_len)),
                ],
            );
        }
        const META_DREG: u16 = 1;
        const META_KEY: u16 = 2;
        const NFT_META_L4PROTO: u32 = 16;
        self.expr("meta", &[(META_DREG, U32(l4_reg)), (META_KEY, U32(NFT_META_L4PROTO))]);
        self.expr(
            "payload",
            &[
                (PAYLOAD_DREG, U32(port_reg)),
                (PAYLOAD_BASE, U32(TRANSPORT_HEADER)),
                (PAYLOAD_OFFSET, U32(2)),
                (PAYLOAD_LEN, U32(2)),
            ],
        );
        const LOOKUP_SET: u16 = 1;
        const LOOKUP_SREG: u16 = 2;
        const LOOKUP_DREG: u16 = 3;
        // Only members of the count set: the key stays in place, a set lookup keeps it.
        self.expr("lookup", &[(LOOKUP_SET, Str(count_set)), (LOOKUP_SREG, U32(1))]);
        const NG_DREG: u16 = 1;
        const NG_MODULUS: u16 = 2;
        const NG_TYPE: u16 = 3;
        const NFT_NG_RANDOM: u32 = 1;
        self.expr(
            "numgen",
            &[(NG_DREG, U32(ng_reg)), (NG_MODULUS, U32(n)), (NG_TYPE, U32(NFT_NG_RANDOM))],
        );
        let backends = kind.backends().name();
        self.expr(
            "lookup",
            &[(LOOKUP_SET, Str(&backends)), (LOOKUP_SREG, U32(1)), (LOOKUP_DREG, U32(1))],
        );
        const NAT_TYPE: u16 = 1;
        const NAT_FAMILY: u16 = 2;
        const NAT_REG_ADDR_MIN: u16 = 3;
        const NAT_REG_PROTO_MIN: u16 = 5;
        const NFT_NAT_DNAT: u32 = 1;
        self.expr(
            "nat",
            &[
                (NAT_TYPE, U32(NFT_NAT_DNAT)),
                (NAT_FAMILY, U32(nfproto(family) as u32)),
                (NAT_REG_ADDR_MIN, U32(1)),
                (NAT_REG_PROTO_MIN, U32(proto_min)),
            ],
        );
    }
}

/// A dump request (outside any batch): every set of kpng's table, or every element of one
/// of its sets, in `family`.
pub fn dump_request(seq: u32, msg: u16, family: Family, set: Option<&str>) -> Vec<u8> {
    let mut batch = Batch { buf: Vec::new(), seq: seq.wrapping_sub(1), messages: Vec::new() };
    let start = batch.begin(
        (NFNL_SUBSYS_NFTABLES << 8) | msg,
        NLM_F_REQUEST | NLM_F_DUMP,
        nfproto(family),
        0,
    );
    match set {
        Some(set) => {
            batch.attr_str(NFTA_SET_ELEM_LIST_TABLE, TABLE);
            batch.attr_str(NFTA_SET_ELEM_LIST_SET, set);
        }
        None => batch.attr_str(NFTA_SET_TABLE, TABLE),
    }
    batch.end(start);
    batch.buf
}

enum ExprAttr<'a> {
    U32(u32),
    Str(&'a str),
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// A port in network order, padded to a register slot.
fn port_bytes(port: u16) -> [u8; 4] {
    let [a, b] = port.to_be_bytes();
    [a, b, 0, 0]
}

fn protocol_bytes(protocol: Protocol) -> [u8; 4] {
    let number = match protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    };
    [number, 0, 0, 0]
}

fn dest_bytes(dest: &Dest) -> Vec<u8> {
    let mut bytes = ip_bytes(&dest.ip);
    bytes.extend_from_slice(&protocol_bytes(dest.protocol));
    bytes.extend_from_slice(&port_bytes(dest.port));
    bytes
}

/// The bytes of a key; for interval keys, `end` selects the last address of the range.
pub fn key_bytes(key: &Key, end: bool) -> Vec<u8> {
    match key {
        Key::Addr(ip) => ip_bytes(ip),
        Key::Dest(dest) => dest_bytes(dest),
        Key::NodePort(protocol, port) => [protocol_bytes(*protocol), port_bytes(*port)].concat(),
        Key::DestSlot(dest, slot) => {
            let mut bytes = dest_bytes(dest);
            bytes.extend_from_slice(&slot.to_ne_bytes());
            bytes
        }
        Key::NodePortSlot(protocol, port, slot) => {
            [protocol_bytes(*protocol), port_bytes(*port), slot.to_ne_bytes()].concat()
        }
        Key::AddrPair(a, b) => [ip_bytes(a), ip_bytes(b)].concat(),
        Key::DestSource(dest, net) => {
            let mut bytes = dest_bytes(dest);
            bytes.extend_from_slice(&ip_bytes(&if end { net.broadcast() } else { net.network() }));
            bytes
        }
    }
}

#[cfg(test)]
mod tests;
