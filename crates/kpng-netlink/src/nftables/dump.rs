//! Reading what the kernel holds: dump requests for the sets, elements, chains and rules
//! of one table, and the kernel's answers (message bodies as
//! [`crate::socket::NetlinkSocket::dump`] returns them) decoded into the message types
//! the writers send ([`super::messages`]).

use crate::attr;
use crate::message::{NFGENMSG_LEN, NFNL_SUBSYS_NFTABLES, NLM_F_DUMP, NLM_F_REQUEST, ProtoFamily};
use crate::nftables::messages::{
    ChainMsg, ElementMsg, ElementsMsg, GenMsg, Message, ObjMsg, RuleMsg, SetMsg, TableMsg,
};
use crate::nftables::msg;

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
    GenMsg::decode(payload(body)).ok().map(|g| g.id)
}

/// Asks `socket`'s network namespace for its ruleset generation.
pub fn read_generation(
    socket: &mut crate::socket::NetlinkSocket,
) -> Result<Option<u32>, crate::socket::NetlinkError> {
    Ok(generation(&socket.get(&generation_request())?))
}

/// A dump of every table of `family`.
pub fn tables_request(family: ProtoFamily) -> Vec<u8> {
    request(msg::GETTABLE, family, |_| {})
}

/// The name of a dumped table.
pub fn table_name(body: &[u8]) -> Option<String> {
    TableMsg::decode(payload(body)).ok().map(|t| t.name)
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
/// [`ChainMsg::table`] is `table` (set, rule and object dumps are filtered).
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

/// Decodes a dumped set.
pub fn set(body: &[u8]) -> Option<SetMsg> {
    SetMsg::decode(payload(body)).ok()
}

/// Decodes every element of a dumped element list.
pub fn elements(body: &[u8]) -> Vec<ElementMsg> {
    ElementsMsg::decode(payload(body)).map(|list| list.elements).unwrap_or_default()
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
    let object = ObjMsg::decode(payload(body)).ok()?;
    let helper = object.helper?;
    Some(super::objects::CtHelperSpec {
        name: object.name,
        helper: helper.helper,
        l4proto: helper.l4proto,
    })
}

/// Decodes a dumped chain.
pub fn chain(body: &[u8]) -> Option<ChainMsg> {
    ChainMsg::decode(payload(body)).ok()
}

/// Decodes a dumped rule.
pub fn rule(body: &[u8]) -> Option<RuleMsg> {
    RuleMsg::decode(payload(body)).ok()
}
