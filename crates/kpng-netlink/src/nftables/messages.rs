//! One type per nf_tables message kpng sends or reads, each with [`Message::encode`] and
//! [`Message::decode`]: the writers ([`super::objects`]) and the dump reader
//! ([`super::dump`]) share them, so what kpng writes and what it reads back are one
//! layout. Attributes are written in the order `nft` writes them (the golden fixtures in
//! `tests/fixtures`, taken from `nft --debug=mnl`, hold the bytes), and read in any order;
//! attributes a type does not model (a dump's use counts, say) are skipped when read.
//!
//! The same type serves a message's every kind: [`ChainMsg`] creates (`NEWCHAIN`),
//! deletes (`DELCHAIN`) and is dumped (`GETCHAIN`); [`RuleMsg`] without expressions
//! flushes a chain (`DELRULE`); [`ElementsMsg`] without elements flushes a set.
//!
//! Kept in one file on purpose: the messages are of one shape, each a struct and the two
//! directions of its attributes.

use crate::attr::{self, put, put_be32, put_be64, put_str};
use crate::nftables::expr::{Expr, Verdict};
use crate::nftables::{NFTA_DATA_VALUE, NFTA_DATA_VERDICT, NFTA_LIST_ELEM};

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}: {what}")]
pub struct DecodeError {
    /// The message type.
    pub message: &'static str,
    /// What is missing or malformed.
    pub what: &'static str,
}

/// An nf_tables message's attributes (what follows `nfgenmsg`).
pub trait Message: Sized {
    /// Appends the message's attributes.
    fn encode(&self, buf: &mut Vec<u8>);

    /// Reads the attributes of a message of this type.
    fn decode(attributes: &[u8]) -> Result<Self, DecodeError>;
}

fn missing(message: &'static str, what: &'static str) -> DecodeError {
    DecodeError { message, what }
}

/// Attributes of one level, looked up by type.
struct Attrs<'a>(Vec<(u16, &'a [u8])>);

impl<'a> Attrs<'a> {
    fn of(data: &'a [u8]) -> Self {
        Attrs(attr::parse(data))
    }

    fn get(&self, kind: u16) -> Option<&'a [u8]> {
        attr::find(&self.0, kind)
    }

    fn string(&self, kind: u16) -> Option<String> {
        self.get(kind).map(attr::string)
    }

    fn be32(&self, kind: u16) -> Option<u32> {
        self.get(kind).and_then(attr::be32)
    }

    fn be64(&self, kind: u16) -> Option<u64> {
        self.get(kind).and_then(attr::be64)
    }

    fn bytes(&self, kind: u16) -> Option<Vec<u8>> {
        self.get(kind).map(<[u8]>::to_vec)
    }

    fn all(&self, kind: u16) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.0.iter().filter(move |(k, _)| *k == kind).map(|(_, v)| *v)
    }
}

fn put_opt32(buf: &mut Vec<u8>, kind: u16, value: Option<u32>) {
    if let Some(v) = value {
        put_be32(buf, kind, v);
    }
}

fn put_opt64(buf: &mut Vec<u8>, kind: u16, value: Option<u64>) {
    if let Some(v) = value {
        put_be64(buf, kind, v);
    }
}

fn put_opt_bytes(buf: &mut Vec<u8>, kind: u16, value: &Option<Vec<u8>>) {
    if let Some(v) = value {
        put(buf, kind, v);
    }
}

/// A table (`NFTA_TABLE_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableMsg {
    /// Its name.
    pub name: String,
    /// `NFT_TABLE_F_*` flags.
    pub flags: Option<u32>,
    /// nft's comment and other user data.
    pub userdata: Option<Vec<u8>>,
}

mod table {
    pub const NAME: u16 = 1;
    pub const FLAGS: u16 = 2;
    pub const USERDATA: u16 = 6;
}

impl Message for TableMsg {
    fn encode(&self, buf: &mut Vec<u8>) {
        put_str(buf, table::NAME, &self.name);
        put_opt32(buf, table::FLAGS, self.flags);
        put_opt_bytes(buf, table::USERDATA, &self.userdata);
    }

    fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        let a = Attrs::of(data);
        Ok(TableMsg {
            name: a.string(table::NAME).ok_or(missing("table", "no name"))?,
            flags: a.be32(table::FLAGS),
            userdata: a.bytes(table::USERDATA),
        })
    }
}

/// A base chain's hook: `NF_INET_*` number and priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChainHook {
    /// The hook number (prerouting 0, input 1, forward 2, output 3, postrouting 4).
    pub num: u32,
    /// The priority.
    pub priority: i32,
}

/// A chain (`NFTA_CHAIN_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainMsg {
    /// Its table.
    pub table: String,
    /// Its handle (dumps).
    pub handle: Option<u64>,
    /// Its name.
    pub name: String,
    /// A base chain's type (`nat`, `filter`).
    pub chain_type: Option<String>,
    /// A base chain's policy (`NF_ACCEPT` is 1).
    pub policy: Option<u32>,
    /// A base chain's hook.
    pub hook: Option<ChainHook>,
}

mod chain {
    pub const TABLE: u16 = 1;
    pub const HANDLE: u16 = 2;
    pub const NAME: u16 = 3;
    pub const HOOK: u16 = 4;
    pub const POLICY: u16 = 5;
    pub const TYPE: u16 = 7;
    pub const HOOK_NUM: u16 = 1;
    pub const HOOK_PRIORITY: u16 = 2;
}

impl Message for ChainMsg {
    fn encode(&self, buf: &mut Vec<u8>) {
        put_str(buf, chain::TABLE, &self.table);
        put_opt64(buf, chain::HANDLE, self.handle);
        put_str(buf, chain::NAME, &self.name);
        if let Some(kind) = &self.chain_type {
            put_str(buf, chain::TYPE, kind);
        }
        put_opt32(buf, chain::POLICY, self.policy);
        if let Some(hook) = &self.hook {
            attr::nested(buf, chain::HOOK, |b| {
                put_be32(b, chain::HOOK_NUM, hook.num);
                put_be32(b, chain::HOOK_PRIORITY, hook.priority as u32);
            });
        }
    }

    fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        let a = Attrs::of(data);
        let hook = match a.get(chain::HOOK) {
            None => None,
            Some(nest) => {
                let h = Attrs::of(nest);
                let num =
                    h.be32(chain::HOOK_NUM).ok_or(missing("chain", "a hook without number"))?;
                let priority = h.be32(chain::HOOK_PRIORITY).unwrap_or(0) as i32;
                Some(ChainHook { num, priority })
            }
        };
        Ok(ChainMsg {
            table: a.string(chain::TABLE).ok_or(missing("chain", "no table"))?,
            handle: a.be64(chain::HANDLE),
            name: a.string(chain::NAME).ok_or(missing("chain", "no name"))?,
            chain_type: a.string(chain::TYPE),
            policy: a.be32(chain::POLICY),
            hook,
        })
    }
}

/// One expression of a rule: one kpng knows, or the bytes of one it does not (kept, so a
/// rule read back writes back the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleExpr {
    /// An expression kpng knows.
    Known(Expr),
    /// An `NFTA_LIST_ELEM` kpng does not know, as it was.
    Unknown(Vec<u8>),
}

/// A rule (`NFTA_RULE_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleMsg {
    /// Its table.
    pub table: String,
    /// Its chain.
    pub chain: String,
    /// Its handle (dumps).
    pub handle: Option<u64>,
    /// Its expressions; none with `DELRULE`: every rule of the chain.
    pub exprs: Vec<RuleExpr>,
}

mod rule {
    pub const TABLE: u16 = 1;
    pub const CHAIN: u16 = 2;
    pub const HANDLE: u16 = 3;
    pub const EXPRESSIONS: u16 = 4;
}

impl RuleMsg {
    /// The expressions kpng knows, `None` for the others.
    pub fn known(&self) -> Vec<Option<Expr>> {
        let known = |e: &RuleExpr| match e {
            RuleExpr::Known(e) => Some(e.clone()),
            RuleExpr::Unknown(_) => None,
        };
        self.exprs.iter().map(known).collect()
    }
}

fn encode_exprs(exprs: &[RuleExpr], buf: &mut Vec<u8>) {
    for expr in exprs {
        match expr {
            RuleExpr::Known(e) => e.encode(buf),
            RuleExpr::Unknown(bytes) => put(buf, NFTA_LIST_ELEM | attr::NLA_F_NESTED, bytes),
        }
    }
}

impl Message for RuleMsg {
    fn encode(&self, buf: &mut Vec<u8>) {
        put_str(buf, rule::TABLE, &self.table);
        put_str(buf, rule::CHAIN, &self.chain);
        put_opt64(buf, rule::HANDLE, self.handle);
        if !self.exprs.is_empty() {
            attr::nested(buf, rule::EXPRESSIONS, |b| encode_exprs(&self.exprs, b));
        }
    }

    fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        let a = Attrs::of(data);
        let exprs = Attrs::of(a.get(rule::EXPRESSIONS).unwrap_or_default())
            .all(NFTA_LIST_ELEM)
            .map(|e| match Expr::decode(e) {
                Some(known) => RuleExpr::Known(known),
                None => RuleExpr::Unknown(e.to_vec()),
            })
            .collect();
        Ok(RuleMsg {
            table: a.string(rule::TABLE).ok_or(missing("rule", "no table"))?,
            chain: a.string(rule::CHAIN).ok_or(missing("rule", "no chain"))?,
            handle: a.be64(rule::HANDLE),
            exprs,
        })
    }
}

/// A set's description: its size, and the field lengths of a concatenation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetDesc {
    /// The size the set was declared with.
    pub size: Option<u32>,
    /// Field lengths of an interval concatenation.
    pub concat: Vec<u32>,
}

/// A set or map (`NFTA_SET_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetMsg {
    /// Its table.
    pub table: String,
    /// Its name.
    pub name: String,
    /// `NFT_SET_*` flags.
    pub flags: Option<u32>,
    /// nft's datatype id of the key (concatenations packed 6 bits apart).
    pub key_type: Option<u32>,
    /// Key bytes.
    pub key_len: Option<u32>,
    /// A map's data: type id and bytes.
    pub data: Option<(u32, u32)>,
    /// Its description.
    pub desc: Option<SetDesc>,
    /// The id that refers to it within one batch.
    pub id: Option<u32>,
    /// Default timeout in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Its handle (dumps).
    pub handle: Option<u64>,
    /// nft's description of the set (`NFTA_SET_USERDATA`): how `nft list` shows its types.
    pub userdata: Option<Vec<u8>>,
}

mod set {
    pub const TABLE: u16 = 1;
    pub const NAME: u16 = 2;
    pub const FLAGS: u16 = 3;
    pub const KEY_TYPE: u16 = 4;
    pub const KEY_LEN: u16 = 5;
    pub const DATA_TYPE: u16 = 6;
    pub const DATA_LEN: u16 = 7;
    pub const DESC: u16 = 9;
    pub const ID: u16 = 10;
    pub const TIMEOUT: u16 = 11;
    pub const USERDATA: u16 = 13;
    pub const HANDLE: u16 = 16;
    pub const DESC_SIZE: u16 = 1;
    pub const DESC_CONCAT: u16 = 2;
    pub const FIELD_LEN: u16 = 1;
}

impl Message for SetMsg {
    fn encode(&self, buf: &mut Vec<u8>) {
        put_str(buf, set::TABLE, &self.table);
        put_str(buf, set::NAME, &self.name);
        put_opt32(buf, set::FLAGS, self.flags);
        put_opt32(buf, set::KEY_TYPE, self.key_type);
        put_opt32(buf, set::KEY_LEN, self.key_len);
        if let Some((kind, len)) = self.data {
            put_be32(buf, set::DATA_TYPE, kind);
            put_be32(buf, set::DATA_LEN, len);
        }
        put_opt32(buf, set::ID, self.id);
        if let Some(desc) = &self.desc {
            attr::nested(buf, set::DESC, |b| {
                put_opt32(b, set::DESC_SIZE, desc.size);
                if !desc.concat.is_empty() {
                    attr::nested(b, set::DESC_CONCAT, |b| {
                        for len in &desc.concat {
                            attr::nested(b, NFTA_LIST_ELEM, |b| put_be32(b, set::FIELD_LEN, *len));
                        }
                    });
                }
            });
        }
        put_opt64(buf, set::TIMEOUT, self.timeout_ms);
        put_opt64(buf, set::HANDLE, self.handle);
        put_opt_bytes(buf, set::USERDATA, &self.userdata);
    }

    fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        let a = Attrs::of(data);
        let desc = a.get(set::DESC).map(|nest| {
            let d = Attrs::of(nest);
            let concat = Attrs::of(d.get(set::DESC_CONCAT).unwrap_or_default())
                .all(NFTA_LIST_ELEM)
                .filter_map(|field| Attrs::of(field).be32(set::FIELD_LEN))
                .collect();
            SetDesc { size: d.be32(set::DESC_SIZE), concat }
        });
        let data = a.be32(set::DATA_TYPE).map(|kind| (kind, a.be32(set::DATA_LEN).unwrap_or(0)));
        Ok(SetMsg {
            table: a.string(set::TABLE).ok_or(missing("set", "no table"))?,
            name: a.string(set::NAME).ok_or(missing("set", "no name"))?,
            flags: a.be32(set::FLAGS),
            key_type: a.be32(set::KEY_TYPE),
            key_len: a.be32(set::KEY_LEN),
            data,
            desc,
            id: a.be32(set::ID),
            timeout_ms: a.be64(set::TIMEOUT),
            handle: a.be64(set::HANDLE),
            userdata: a.bytes(set::USERDATA),
        })
    }
}

/// What an element maps to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElementData {
    /// A map value.
    Value(Vec<u8>),
    /// A verdict map's verdict.
    Verdict(Verdict),
}

/// One element (`NFTA_SET_ELEM_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ElementMsg {
    /// The key.
    pub key: Vec<u8>,
    /// The last key of an interval concatenation's range.
    pub key_end: Option<Vec<u8>>,
    /// What it maps to.
    pub data: Option<ElementData>,
    /// `NFT_SET_ELEM_*` flags.
    pub flags: Option<u32>,
    /// Its timeout in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Milliseconds until it expires (dumps).
    pub expiration_ms: Option<u64>,
}

mod elem {
    pub const LIST_TABLE: u16 = 1;
    pub const LIST_SET: u16 = 2;
    pub const LIST_ELEMENTS: u16 = 3;
    pub const LIST_SET_ID: u16 = 4;
    pub const KEY: u16 = 1;
    pub const DATA: u16 = 2;
    pub const FLAGS: u16 = 3;
    pub const TIMEOUT: u16 = 4;
    pub const EXPIRATION: u16 = 5;
    pub const KEY_END: u16 = 10;
}

fn put_value(buf: &mut Vec<u8>, kind: u16, value: &[u8]) {
    attr::nested(buf, kind, |b| put(b, NFTA_DATA_VALUE, value));
}

fn value_of(nest: &[u8]) -> Option<Vec<u8>> {
    Attrs::of(nest).bytes(NFTA_DATA_VALUE)
}

/// What an element maps to, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElementDataRef<'a> {
    /// A map value.
    Value(&'a [u8]),
    /// A verdict map's verdict.
    Verdict(&'a Verdict),
    /// A verdict map's `goto <chain>`, the chain borrowed.
    Goto(&'a str),
}

/// An element's parts, borrowed: what [`ElementMsg`] holds, for writers that stream
/// elements without owning them. Both encode through [`ElementRef::encode`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ElementRef<'a> {
    /// The key.
    pub key: &'a [u8],
    /// The last key of an interval concatenation's range.
    pub key_end: Option<&'a [u8]>,
    /// What it maps to.
    pub data: Option<ElementDataRef<'a>>,
    /// `NFT_SET_ELEM_*` flags.
    pub flags: Option<u32>,
    /// Its timeout in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Milliseconds until it expires (dumps).
    pub expiration_ms: Option<u64>,
}

impl ElementRef<'_> {
    /// Appends the element, with its data unless `with_data` is false (a deletion).
    pub fn encode(&self, buf: &mut Vec<u8>, with_data: bool) {
        attr::nested(buf, NFTA_LIST_ELEM, |b| {
            put_value(b, elem::KEY, self.key);
            if let Some(end) = self.key_end {
                put_value(b, elem::KEY_END, end);
            }
            match (self.data, with_data) {
                (Some(ElementDataRef::Value(v)), true) => put_value(b, elem::DATA, v),
                (Some(ElementDataRef::Verdict(v)), true) => {
                    attr::nested(b, elem::DATA, |b| v.encode(b))
                }
                (Some(ElementDataRef::Goto(chain)), true) => {
                    attr::nested(b, elem::DATA, |b| Verdict::encode_goto(b, chain))
                }
                _ => {}
            }
            put_opt32(b, elem::FLAGS, self.flags);
            put_opt64(b, elem::TIMEOUT, self.timeout_ms);
            put_opt64(b, elem::EXPIRATION, self.expiration_ms);
        });
    }
}

impl ElementMsg {
    /// The element, borrowed.
    pub fn as_ref(&self) -> ElementRef<'_> {
        let data = self.data.as_ref().map(|d| match d {
            ElementData::Value(v) => ElementDataRef::Value(v),
            ElementData::Verdict(v) => ElementDataRef::Verdict(v),
        });
        ElementRef {
            key: &self.key,
            key_end: self.key_end.as_deref(),
            data,
            flags: self.flags,
            timeout_ms: self.timeout_ms,
            expiration_ms: self.expiration_ms,
        }
    }

    fn decode_element(data: &[u8]) -> Option<ElementMsg> {
        let e = Attrs::of(data);
        let data = e.get(elem::DATA).and_then(|nest| {
            let d = Attrs::of(nest);
            match (d.get(NFTA_DATA_VALUE), d.get(NFTA_DATA_VERDICT)) {
                (Some(v), _) => Some(ElementData::Value(v.to_vec())),
                (None, Some(v)) => Verdict::decode(v).map(ElementData::Verdict),
                (None, None) => None,
            }
        });
        Some(ElementMsg {
            key: value_of(e.get(elem::KEY)?)?,
            key_end: e.get(elem::KEY_END).and_then(value_of),
            data,
            flags: e.be32(elem::FLAGS),
            timeout_ms: e.be64(elem::TIMEOUT),
            expiration_ms: e.be64(elem::EXPIRATION),
        })
    }
}

/// Elements of one set (`NFTA_SET_ELEM_LIST_*`); none with `DELSETELEM`: every element.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ElementsMsg {
    /// The set's table.
    pub table: String,
    /// The set.
    pub set: String,
    /// The set's id within the batch, when it is created in it.
    pub set_id: Option<u32>,
    /// The elements.
    pub elements: Vec<ElementMsg>,
}

impl ElementsMsg {
    /// Appends the list's header (table, set, set id); the elements follow in the nested
    /// attribute [`ElementsMsg::open_elements`] opens.
    pub fn encode_header(&self, buf: &mut Vec<u8>) {
        put_str(buf, elem::LIST_TABLE, &self.table);
        put_str(buf, elem::LIST_SET, &self.set);
        put_opt32(buf, elem::LIST_SET_ID, self.set_id);
    }

    /// Opens the nested attribute of the elements (close it with [`attr::close`]).
    pub fn open_elements(buf: &mut Vec<u8>) -> usize {
        attr::open(buf, elem::LIST_ELEMENTS)
    }
}

impl Message for ElementsMsg {
    fn encode(&self, buf: &mut Vec<u8>) {
        self.encode_header(buf);
        if !self.elements.is_empty() {
            attr::nested(buf, elem::LIST_ELEMENTS, |b| {
                for element in &self.elements {
                    element.as_ref().encode(b, true);
                }
            });
        }
    }

    fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        let a = Attrs::of(data);
        let elements = Attrs::of(a.get(elem::LIST_ELEMENTS).unwrap_or_default())
            .all(NFTA_LIST_ELEM)
            .map(|e| ElementMsg::decode_element(e).ok_or(missing("element", "no key")))
            .collect::<Result<_, _>>()?;
        Ok(ElementsMsg {
            table: a.string(elem::LIST_TABLE).ok_or(missing("elements", "no table"))?,
            set: a.string(elem::LIST_SET).ok_or(missing("elements", "no set"))?,
            set_id: a.be32(elem::LIST_SET_ID),
            elements,
        })
    }
}

/// `NFT_OBJECT_CT_HELPER`: the object type of a conntrack helper.
pub const OBJECT_CT_HELPER: u32 = 3;

/// A conntrack helper object's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtHelperData {
    /// The kernel helper's name (`ftp`, `sip`).
    pub helper: String,
    /// The layer 3 protocol number (2 IPv4, 10 IPv6).
    pub l3proto: Option<u16>,
    /// The transport protocol number (6 TCP, 17 UDP).
    pub l4proto: u8,
}

/// A stateful object (`NFTA_OBJ_*`); kpng makes `ct helper` objects only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjMsg {
    /// Its table.
    pub table: String,
    /// Its name.
    pub name: String,
    /// `NFT_OBJECT_*` type.
    pub obj_type: u32,
    /// A `ct helper`'s data (none to delete one, or for another type).
    pub helper: Option<CtHelperData>,
    /// Its handle (dumps).
    pub handle: Option<u64>,
}

mod obj {
    pub const TABLE: u16 = 1;
    pub const NAME: u16 = 2;
    pub const TYPE: u16 = 3;
    pub const DATA: u16 = 4;
    pub const HANDLE: u16 = 6;
    pub const HELPER_NAME: u16 = 1;
    pub const HELPER_L3PROTO: u16 = 2;
    pub const HELPER_L4PROTO: u16 = 3;
}

impl Message for ObjMsg {
    fn encode(&self, buf: &mut Vec<u8>) {
        put_str(buf, obj::TABLE, &self.table);
        put_str(buf, obj::NAME, &self.name);
        put_be32(buf, obj::TYPE, self.obj_type);
        if let Some(helper) = &self.helper {
            attr::nested(buf, obj::DATA, |b| {
                put_str(b, obj::HELPER_NAME, &helper.helper);
                if let Some(l3) = helper.l3proto {
                    put(b, obj::HELPER_L3PROTO, &l3.to_be_bytes());
                }
                put(b, obj::HELPER_L4PROTO, &[helper.l4proto]);
            });
        }
        put_opt64(buf, obj::HANDLE, self.handle);
    }

    fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        let a = Attrs::of(data);
        let obj_type = a.be32(obj::TYPE).ok_or(missing("object", "no type"))?;
        let helper = match (obj_type, a.get(obj::DATA)) {
            (OBJECT_CT_HELPER, Some(nest)) => {
                let d = Attrs::of(nest);
                let l3proto = d
                    .get(obj::HELPER_L3PROTO)
                    .and_then(|b| Some(u16::from_be_bytes(b.get(..2)?.try_into().ok()?)));
                Some(CtHelperData {
                    helper: d.string(obj::HELPER_NAME).ok_or(missing("ct helper", "no helper"))?,
                    l3proto,
                    l4proto: *d
                        .get(obj::HELPER_L4PROTO)
                        .and_then(<[u8]>::first)
                        .ok_or(missing("ct helper", "no protocol"))?,
                })
            }
            _ => None,
        };
        Ok(ObjMsg {
            table: a.string(obj::TABLE).ok_or(missing("object", "no table"))?,
            name: a.string(obj::NAME).ok_or(missing("object", "no name"))?,
            obj_type,
            helper,
            handle: a.be64(obj::HANDLE),
        })
    }
}

/// The ruleset's generation (`NFTA_GEN_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GenMsg {
    /// The generation.
    pub id: u32,
    /// The process that committed it (notifications).
    pub pid: Option<u32>,
    /// Its name.
    pub process: Option<String>,
}

impl Message for GenMsg {
    fn encode(&self, buf: &mut Vec<u8>) {
        put_be32(buf, 1, self.id);
        put_opt32(buf, 2, self.pid);
        if let Some(name) = &self.process {
            put_str(buf, 3, name);
        }
    }

    fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        let a = Attrs::of(data);
        Ok(GenMsg {
            id: a.be32(1).ok_or(missing("generation", "no id"))?,
            pid: a.be32(2),
            process: a.string(3),
        })
    }
}

#[cfg(test)]
mod tests;
