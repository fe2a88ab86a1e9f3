//! Reading what the kernel holds: dump requests for the sets, elements, chains and rules
//! of one table, and decoders for the kernel's answers (message bodies as
//! [`crate::socket::NetlinkSocket::dump`] returns them).

use crate::attr;
use crate::message::{NFGENMSG_LEN, NFNL_SUBSYS_NFTABLES, NLM_F_DUMP, NLM_F_REQUEST, ProtoFamily};
use crate::nftables::expr::{Expr, Verdict, decode_all};
use crate::nftables::{NFTA_DATA_VALUE, NFTA_DATA_VERDICT, NFTA_LIST_ELEM, msg};

fn request(kind: u16, family: ProtoFamily, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    crate::message::request(NFNL_SUBSYS_NFTABLES, kind, NLM_F_REQUEST | NLM_F_DUMP, family, body)
}

/// A request for the network namespace's ruleset generation: a number every committed
/// nf_tables transaction (any process's, iptables-nft's included) increments by one.
pub fn generation_request() -> Vec<u8> {
    crate::message::request(
        NFNL_SUBSYS_NFTABLES,
        msg::GETGEN,
        NLM_F_REQUEST | crate::message::NLM_F_ACK,
        ProtoFamily::Unspec,
        |_| {},
    )
}

/// The generation in an answer to [`generation_request`].
pub fn generation(body: &[u8]) -> Option<u32> {
    let id = attr::find(&attr::parse(payload(body)), 1)?;
    Some(u32::from_be_bytes(id.get(..4)?.try_into().ok()?))
}

/// A dump of every table of `family`.
pub fn tables_request(family: ProtoFamily) -> Vec<u8> {
    request(msg::GETTABLE, family, |_| {})
}

/// The name of a dumped table.
pub fn table_name(body: &[u8]) -> Option<String> {
    Some(attr::string(attr::find(&attr::parse(payload(body)), 1)?))
}

/// A dump of every set of `table`.
pub fn sets_request(family: ProtoFamily, table: &str) -> Vec<u8> {
    request(msg::GETSET, family, |b| attr::put_str(b, 1, table))
}

/// A dump of every element of set `set` of `table`.
pub fn elements_request(family: ProtoFamily, table: &str, set: &str) -> Vec<u8> {
    request(msg::GETSETELEM, family, |b| {
        attr::put_str(b, 1, table);
        attr::put_str(b, 2, set);
    })
}

/// A dump of the chains of `table`. The kernel does not filter chain dumps by table: it
/// answers with the chains of every table of the family, so keep those whose
/// [`DumpedChain::table`] is `table` (set, rule and object dumps are filtered).
pub fn chains_request(family: ProtoFamily, table: &str) -> Vec<u8> {
    request(msg::GETCHAIN, family, |b| attr::put_str(b, 1, table))
}

/// A dump of the rules of `table`, of one chain or of all.
pub fn rules_request(family: ProtoFamily, table: &str, chain: Option<&str>) -> Vec<u8> {
    request(msg::GETRULE, family, |b| {
        attr::put_str(b, 1, table);
        if let Some(chain) = chain {
            attr::put_str(b, 2, chain);
        }
    })
}

fn payload(body: &[u8]) -> &[u8] {
    body.get(NFGENMSG_LEN..).unwrap_or_default()
}

/// A set as the kernel describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpedSet {
    /// Its table.
    pub table: String,
    /// Its name.
    pub name: String,
    /// `NFT_SET_*` flags.
    pub flags: u32,
    /// nft's datatype id of the key.
    pub key_type: u32,
    /// Key bytes.
    pub key_len: u32,
    /// A map's data type id and bytes.
    pub data: Option<(u32, u32)>,
    /// Default timeout in milliseconds.
    pub timeout_ms: Option<u64>,
    /// nft's description of the set.
    pub userdata: Option<Vec<u8>>,
}

/// Decodes a dumped set.
pub fn set(body: &[u8]) -> Option<DumpedSet> {
    let a = attr::parse(payload(body));
    let u = |kind| attr::find(&a, kind).and_then(attr::be32);
    Some(DumpedSet {
        table: attr::string(attr::find(&a, 1)?),
        name: attr::string(attr::find(&a, 2)?),
        flags: u(3).unwrap_or(0),
        key_type: u(4).unwrap_or(0),
        key_len: u(5).unwrap_or(0),
        data: u(6).map(|t| (t, u(7).unwrap_or(0))),
        timeout_ms: attr::find(&a, 11).and_then(attr::be64),
        userdata: attr::find(&a, 13).map(<[u8]>::to_vec),
    })
}

/// An element as the kernel dumps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpedElement {
    /// The key.
    pub key: Vec<u8>,
    /// The last key of an interval concatenation's range.
    pub key_end: Option<Vec<u8>>,
    /// A map value.
    pub value: Option<Vec<u8>>,
    /// A verdict map's verdict.
    pub verdict: Option<Verdict>,
    /// `NFT_SET_ELEM_*` flags.
    pub flags: u32,
}

fn data_value(nest: Option<&[u8]>) -> Option<Vec<u8>> {
    Some(attr::find(&attr::parse(nest?), NFTA_DATA_VALUE)?.to_vec())
}

/// Decodes every element of a dumped element list.
pub fn elements(body: &[u8]) -> Vec<DumpedElement> {
    let a = attr::parse(payload(body));
    let Some(list) = attr::find(&a, 3) else { return Vec::new() };
    attr::parse(list)
        .into_iter()
        .filter(|(k, _)| *k == NFTA_LIST_ELEM)
        .filter_map(|(_, e)| {
            let e = attr::parse(e);
            let data = attr::find(&e, 2).map(attr::parse);
            Some(DumpedElement {
                key: data_value(attr::find(&e, 1))?,
                key_end: data_value(attr::find(&e, 10)),
                value: data
                    .as_ref()
                    .and_then(|d| attr::find(d, NFTA_DATA_VALUE))
                    .map(<[u8]>::to_vec),
                verdict: data
                    .as_ref()
                    .and_then(|d| attr::find(d, NFTA_DATA_VERDICT))
                    .and_then(Verdict::decode),
                flags: attr::find(&e, 3).and_then(attr::be32).unwrap_or(0),
            })
        })
        .collect()
}

/// The request for every `ct helper` object of `table`.
pub fn ct_helpers_request(family: ProtoFamily, table: &str) -> Vec<u8> {
    request(msg::GETOBJ, family, |b| {
        attr::put_str(b, 1, table);
        attr::put_be32(b, 3, super::objects::OBJECT_CT_HELPER);
    })
}

/// Decodes a dumped `ct helper` object (`None` for another object type).
pub fn ct_helper(body: &[u8]) -> Option<super::objects::CtHelperSpec> {
    let a = attr::parse(payload(body));
    if attr::find(&a, 3).and_then(attr::be32) != Some(super::objects::OBJECT_CT_HELPER) {
        return None;
    }
    let data = attr::parse(attr::find(&a, 4)?);
    Some(super::objects::CtHelperSpec {
        name: attr::string(attr::find(&a, 2)?),
        helper: attr::string(attr::find(&data, 1)?),
        l4proto: *attr::find(&data, 3)?.first()?,
    })
}

/// A chain as the kernel describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpedChain {
    /// Its table.
    pub table: String,
    /// Its name.
    pub name: String,
    /// Hook number and priority, for a base chain.
    pub hook: Option<(u32, i32)>,
    /// The base chain's type (`nat`, `filter`).
    pub chain_type: Option<String>,
    /// The base chain's policy (`NF_ACCEPT` is 1).
    pub policy: Option<u32>,
}

/// Decodes a dumped chain.
pub fn chain(body: &[u8]) -> Option<DumpedChain> {
    let a = attr::parse(payload(body));
    let hook = attr::find(&a, 4).map(attr::parse).and_then(|h| {
        let num = attr::find(&h, 1).and_then(attr::be32)?;
        let priority = attr::find(&h, 2).and_then(attr::be32)? as i32;
        Some((num, priority))
    });
    Some(DumpedChain {
        table: attr::string(attr::find(&a, 1)?),
        name: attr::string(attr::find(&a, 3)?),
        hook,
        chain_type: attr::find(&a, 7).map(attr::string),
        policy: attr::find(&a, 5).and_then(attr::be32),
    })
}

/// A rule as the kernel dumps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpedRule {
    /// Its table.
    pub table: String,
    /// Its chain.
    pub chain: String,
    /// Its handle.
    pub handle: u64,
    /// Its expressions (`None` for one kpng does not know).
    pub exprs: Vec<Option<Expr>>,
    /// The expressions as the kernel dumped them.
    pub raw: Vec<u8>,
}

/// Decodes a dumped rule.
pub fn rule(body: &[u8]) -> Option<DumpedRule> {
    let a = attr::parse(payload(body));
    Some(DumpedRule {
        table: attr::string(attr::find(&a, 1)?),
        chain: attr::string(attr::find(&a, 2)?),
        handle: attr::find(&a, 3).and_then(attr::be64).unwrap_or(0),
        exprs: decode_all(attr::find(&a, 4).unwrap_or_default()),
        raw: attr::find(&a, 4).unwrap_or_default().to_vec(),
    })
}
