//! Messages that create, change and delete nf_tables objects, appended to a [`Batch`].
//! Each message carries a description in nft syntax for error reports; its bytes are
//! those of its type in [`super::messages`], which the dump reader decodes too.
//!
//! Kept in one file on purpose: one small builder per nf_tables message kind, all of
//! the same shape.

use crate::attr;
use crate::message::{Batch, NLM_F_APPEND, NLM_F_CREATE, ProtoFamily};
use crate::nftables::expr::Expr;
use crate::nftables::messages::{
    ChainHook, ChainMsg, CtHelperData, ElementRef, ElementsMsg, Message, ObjMsg, RuleExpr, RuleMsg,
    SetDesc, SetMsg, TableMsg,
};
use crate::nftables::msg;

/// `NFT_TABLE_F_OWNER`: only the netlink socket that created the table may change it, and
/// the table goes when that socket closes.
pub const TABLE_OWNER: u32 = 0x2;

pub use crate::nftables::messages::OBJECT_CT_HELPER;

/// A `ct helper` object: the kernel's conntrack helper `helper` (`ftp`, `sip`, ...) for
/// one transport protocol, which rules assign to connections by the object's name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CtHelperSpec {
    /// The object's name in its table.
    pub name: String,
    /// The kernel helper's name.
    pub helper: String,
    /// The transport protocol number (6 TCP, 17 UDP).
    pub l4proto: u8,
}

/// `NFT_SET_INTERVAL`.
pub const SET_INTERVAL: u32 = 0x4;
/// `NFT_SET_MAP`.
pub const SET_MAP: u32 = 0x8;
/// `NFT_SET_TIMEOUT`.
pub const SET_TIMEOUT: u32 = 0x10;
/// `NFT_SET_EVAL` (updated from the packet path).
pub const SET_EVAL: u32 = 0x20;
/// `NFT_SET_CONCAT` (interval keys over several fields).
pub const SET_CONCAT: u32 = 0x80;
/// `NFT_DATA_VERDICT`: the data type of a verdict map.
pub const DATA_VERDICT: u32 = 0xffff_ff00;
/// `NFT_SET_ELEM_INTERVAL_END`: the element closes an interval.
pub const ELEM_INTERVAL_END: u32 = 0x1;

/// The hook of a base chain.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Hook {
    /// `nat` or `filter`.
    pub chain_type: &'static str,
    /// `NF_INET_*` hook number (prerouting 0, input 1, forward 2, output 3, postrouting 4).
    pub num: u32,
    /// The priority.
    pub priority: i32,
}

impl Hook {
    /// The hook's nft keyword.
    pub fn name(&self) -> &'static str {
        match self.num {
            0 => "prerouting",
            1 => "input",
            2 => "forward",
            3 => "output",
            _ => "postrouting",
        }
    }

    /// The base chain's declaration in nft syntax, with policy accept
    /// (`type nat hook prerouting priority -100; policy accept;`).
    pub fn declaration(&self) -> String {
        format!(
            "type {} hook {} priority {}; policy accept;",
            self.chain_type,
            self.name(),
            self.priority
        )
    }
}

/// A chain to create.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChainSpec {
    /// The chain's name.
    pub name: String,
    /// For a base chain, its hook (policy accept).
    pub hook: Option<Hook>,
}

/// What a map's elements map to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetData {
    /// Values of an nft type id and length.
    Value {
        /// nft's datatype id (concatenations packed 6 bits apart).
        type_id: u32,
        /// Bytes.
        len: u32,
    },
    /// Verdicts.
    Verdict,
}

/// A set or map to create.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetSpec {
    /// The set's name.
    pub name: String,
    /// nft's datatype id of the key (concatenations packed 6 bits apart).
    pub key_type: u32,
    /// Key bytes (each concatenated field padded to 4).
    pub key_len: u32,
    /// `SET_INTERVAL`, `SET_TIMEOUT`, `SET_EVAL`, `SET_CONCAT` (map is implied by `data`).
    pub flags: u32,
    /// For a map, what it maps to.
    pub data: Option<SetData>,
    /// Default timeout in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Field lengths of an interval concatenation.
    pub concat: Vec<u32>,
    /// nft's description of the set (`NFTA_SET_USERDATA`): how `nft list` shows its types.
    pub userdata: Vec<u8>,
}

/// Keep each message's element list well under the 64 KiB an attribute length can express
/// (an overflow gives a misleading ENOENT).
const MAX_ELEMENTS_BYTES: usize = 48 * 1024;

/// Messages for the objects of one table of one family.
#[derive(Debug, Clone, Copy)]
pub struct Table<'t> {
    /// The family.
    pub family: ProtoFamily,
    /// The table's name.
    pub name: &'t str,
}

impl Table<'_> {
    fn prefix(&self) -> String {
        format!("{} {}", self.family.keyword(), self.name)
    }

    fn table_msg(&self, flags: Option<u32>) -> TableMsg {
        TableMsg { name: self.name.to_string(), flags, userdata: None }
    }

    /// Creates the table if it does not exist.
    pub fn add(&self, batch: &mut Batch) {
        let what = format!("add table {}", self.prefix());
        let message = self.table_msg(None);
        batch.message(msg::NEWTABLE, NLM_F_CREATE, self.family, what, |b| message.encode(b));
    }

    /// Creates the table with `NFT_TABLE_F_*` flags.
    pub fn add_with_flags(&self, batch: &mut Batch, flags: u32) {
        let what = format!("add table {} {{ flags {flags:#x}; }}", self.prefix());
        let message = self.table_msg(Some(flags));
        batch.message(msg::NEWTABLE, NLM_F_CREATE, self.family, what, |b| message.encode(b));
    }

    /// Deletes the table and everything in it.
    pub fn delete(&self, batch: &mut Batch) {
        let what = format!("delete table {}", self.prefix());
        let message = self.table_msg(None);
        batch.message(msg::DELTABLE, 0, self.family, what, |b| message.encode(b));
    }

    fn chain_msg(&self, name: &str) -> ChainMsg {
        ChainMsg { table: self.name.to_string(), name: name.to_string(), ..ChainMsg::default() }
    }

    /// Creates a chain (an existing one is kept as it is).
    pub fn add_chain(&self, batch: &mut Batch, spec: &ChainSpec) {
        let what = format!("add chain {} {}", self.prefix(), spec.name);
        let mut message = self.chain_msg(&spec.name);
        if let Some(hook) = &spec.hook {
            message.chain_type = Some(hook.chain_type.to_string());
            message.policy = Some(1); // NF_ACCEPT
            message.hook = Some(ChainHook { num: hook.num, priority: hook.priority });
        }
        batch.message(msg::NEWCHAIN, NLM_F_CREATE, self.family, what, |b| message.encode(b));
    }

    /// Deletes a chain (it must hold no rule and no reference).
    pub fn delete_chain(&self, batch: &mut Batch, name: &str) {
        let what = format!("delete chain {} {name}", self.prefix());
        let message = self.chain_msg(name);
        batch.message(msg::DELCHAIN, 0, self.family, what, |b| message.encode(b));
    }

    fn rule_msg(&self, chain: &str, exprs: Vec<RuleExpr>) -> RuleMsg {
        RuleMsg { table: self.name.to_string(), chain: chain.to_string(), handle: None, exprs }
    }

    /// Removes every rule of a chain.
    pub fn flush_chain(&self, batch: &mut Batch, name: &str) {
        // A rule deletion with a chain and no handle removes the chain's rules. Never send
        // it without the chain: that would flush the whole table.
        let what = format!("flush chain {} {name}", self.prefix());
        let message = self.rule_msg(name, Vec::new());
        batch.message(msg::DELRULE, 0, self.family, what, |b| message.encode(b));
    }

    /// Appends a rule to a chain; `text` is the rule in nft syntax, for error reports.
    pub fn add_rule(&self, batch: &mut Batch, chain_name: &str, exprs: &[Expr], text: &str) {
        let what = format!("add rule {} {chain_name} {text}", self.prefix());
        let exprs = exprs.iter().cloned().map(RuleExpr::Known).collect();
        let message = self.rule_msg(chain_name, exprs);
        let flags = NLM_F_CREATE | NLM_F_APPEND;
        batch.message(msg::NEWRULE, flags, self.family, what, |b| message.encode(b));
    }

    fn set_msg(&self, name: &str) -> SetMsg {
        SetMsg { table: self.name.to_string(), name: name.to_string(), ..SetMsg::default() }
    }

    /// Creates a set or map (an existing one with the same definition is kept with its
    /// elements).
    pub fn add_set(&self, batch: &mut Batch, spec: &SetSpec, id: u32) {
        let kind = if spec.data.is_some() { "map" } else { "set" };
        let what = format!("add {kind} {} {}", self.prefix(), spec.name);
        let map = if spec.data.is_some() { SET_MAP } else { 0 };
        let message = SetMsg {
            flags: Some(spec.flags | map),
            key_type: Some(spec.key_type),
            key_len: Some(spec.key_len),
            data: spec.data.map(|d| match d {
                SetData::Verdict => (DATA_VERDICT, 0),
                SetData::Value { type_id, len } => (type_id, len),
            }),
            desc: (!spec.concat.is_empty())
                .then(|| SetDesc { size: None, concat: spec.concat.clone() }),
            id: Some(id),
            timeout_ms: spec.timeout_ms,
            userdata: (!spec.userdata.is_empty()).then(|| spec.userdata.clone()),
            ..self.set_msg(&spec.name)
        };
        batch.message(msg::NEWSET, NLM_F_CREATE, self.family, what, |b| message.encode(b));
    }

    /// Creates a `ct helper` object (an existing one with the same definition is kept). The
    /// kernel loads the helper's module if needed; a helper it does not have fails the
    /// transaction.
    pub fn add_ct_helper(&self, batch: &mut Batch, spec: &CtHelperSpec) {
        let l3 = self.family.keyword();
        let what = format!(
            "add ct helper {} {} {{ type {:?} protocol {}; l3proto {l3}; }}",
            self.prefix(),
            spec.name,
            spec.helper,
            spec.l4proto
        );
        let helper = CtHelperData {
            helper: spec.helper.clone(),
            l3proto: Some(u16::from(self.family.number())),
            l4proto: spec.l4proto,
        };
        let message = ObjMsg { helper: Some(helper), ..self.helper_msg(&spec.name) };
        batch.message(msg::NEWOBJ, NLM_F_CREATE, self.family, what, |b| message.encode(b));
    }

    fn helper_msg(&self, name: &str) -> ObjMsg {
        ObjMsg {
            table: self.name.to_string(),
            name: name.to_string(),
            obj_type: OBJECT_CT_HELPER,
            helper: None,
            handle: None,
        }
    }

    /// Deletes a `ct helper` object (no rule may refer to it).
    pub fn delete_ct_helper(&self, batch: &mut Batch, name: &str) {
        let what = format!("delete ct helper {} {name}", self.prefix());
        let message = self.helper_msg(name);
        batch.message(msg::DELOBJ, 0, self.family, what, |b| message.encode(b));
    }

    /// Deletes a set (nothing may refer to it).
    pub fn delete_set(&self, batch: &mut Batch, name: &str) {
        let what = format!("delete set {} {name}", self.prefix());
        let message = self.set_msg(name);
        batch.message(msg::DELSET, 0, self.family, what, |b| message.encode(b));
    }

    fn elements_msg(&self, set: &str) -> ElementsMsg {
        ElementsMsg { table: self.name.to_string(), set: set.to_string(), ..ElementsMsg::default() }
    }

    /// Removes every element of a set.
    pub fn flush_set(&self, batch: &mut Batch, name: &str) {
        let what = format!("flush set {} {name}", self.prefix());
        let message = self.elements_msg(name);
        batch.message(msg::DELSETELEM, 0, self.family, what, |b| message.encode(b));
    }

    /// Adds (`add`) or deletes the elements of one set, each written by `write`, split into
    /// messages that stay within netlink's attribute size. The elements are taken from
    /// their iterator as they are written, so none has to be listed first. `describe`
    /// names an element in nft syntax, for error reports (each message is described by its
    /// first element).
    pub fn elements<E>(
        &self,
        batch: &mut Batch,
        set_name: &str,
        add: bool,
        elements: impl Iterator<Item = E>,
        describe: impl Fn(&E) -> String,
        mut write: impl FnMut(&E, &mut ElementSink<'_>),
    ) {
        let (kind, flags, verb) = match add {
            true => (msg::NEWSETELEM, NLM_F_CREATE, "add"),
            false => (msg::DELSETELEM, 0, "delete"),
        };
        let header = self.elements_msg(set_name);
        let mut elements = elements.peekable();
        while let Some(first) = elements.peek() {
            let what =
                format!("{verb} element {} {set_name} {{ {} }}", self.prefix(), describe(first));
            batch.message(kind, flags, self.family, what, |b| {
                header.encode_header(b);
                let list = ElementsMsg::open_elements(b);
                let start = b.len();
                while b.len() - start < MAX_ELEMENTS_BYTES
                    && let Some(element) = elements.next()
                {
                    write(&element, &mut ElementSink { buf: b, with_data: add });
                }
                attr::close(b, list);
            });
        }
    }
}

/// Where [`Table::elements`] asks for each element.
pub struct ElementSink<'b> {
    buf: &'b mut Vec<u8>,
    with_data: bool,
}

impl ElementSink<'_> {
    /// Writes one element (its data only when adding).
    pub fn put(&mut self, element: &ElementRef<'_>) {
        element.encode(self.buf, self.with_data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::messages;

    #[test]
    fn long_element_lists_are_split_into_messages() {
        let table = Table { family: ProtoFamily::Ipv4, name: "kpng" };
        let mut batch = Batch::new(0);
        let value = [10, 0, 0, 1, 0x1f, 0x90, 0, 0];
        table.elements(
            &mut batch,
            "cluster_backends",
            true,
            0..3000u32,
            |i| i.to_string(),
            |i, sink| {
                let mut key = [0u8; 16];
                key[12..].copy_from_slice(&i.to_ne_bytes());
                let data = Some(crate::nftables::messages::ElementDataRef::Value(&value));
                sink.put(&ElementRef { key: &key, data, ..ElementRef::default() });
            },
        );
        assert!(batch.message_count() > 1, "3000 elements need more than one message");
        let finished = batch.finish();
        let mut per_message = Vec::new();
        for message in &messages(&finished.bytes)[1..] {
            let attrs = attr::parse(message.netfilter_payload());
            if let Some(list) = attr::find(&attrs, 3) {
                assert!(list.len() < 64 * 1024);
                per_message.push(attr::parse(list).len());
            }
        }
        assert_eq!(per_message.iter().sum::<usize>(), 3000, "every element is sent once");
        // Each message is described by its own first element.
        assert_eq!(first_described(&finished.descriptions[1].1), per_message[0]);
    }

    fn first_described(text: &str) -> usize {
        text.rsplit("{ ").next().unwrap().trim_end_matches(" }").parse().unwrap()
    }
}
