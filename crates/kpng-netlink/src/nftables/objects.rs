//! Messages that create, change and delete nf_tables objects, appended to a [`Batch`].
//! Each message carries a description in nft syntax for error reports.
//!
//! Kept in one file on purpose: one small builder per nf_tables message type, all of
//! the same shape.

use crate::attr::{self, put_be32, put_be64, put_str};
use crate::message::{Batch, NLM_F_APPEND, NLM_F_CREATE, ProtoFamily};
use crate::nftables::expr::{Expr, Verdict, encode_all};
use crate::nftables::{NFTA_DATA_VALUE, NFTA_LIST_ELEM, msg};

mod table {
    pub const NAME: u16 = 1;
    pub const FLAGS: u16 = 2;
}

/// `NFT_TABLE_F_OWNER`: only the netlink socket that created the table may change it, and
/// the table goes when that socket closes.
pub const TABLE_OWNER: u32 = 0x2;

mod chain {
    pub const TABLE: u16 = 1;
    pub const NAME: u16 = 3;
    pub const HOOK: u16 = 4;
    pub const POLICY: u16 = 5;
    pub const TYPE: u16 = 7;
    pub const HOOK_NUM: u16 = 1;
    pub const HOOK_PRIORITY: u16 = 2;
}

mod rule {
    pub const TABLE: u16 = 1;
    pub const CHAIN: u16 = 2;
    pub const EXPRESSIONS: u16 = 4;
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
    pub const DESC_CONCAT: u16 = 2;
    pub const FIELD_LEN: u16 = 1;
}

mod elem {
    pub const LIST_TABLE: u16 = 1;
    pub const LIST_SET: u16 = 2;
    pub const LIST_ELEMENTS: u16 = 3;
    pub const KEY: u16 = 1;
    pub const DATA: u16 = 2;
    pub const FLAGS: u16 = 3;
    pub const KEY_END: u16 = 10;
}

mod obj {
    pub const TABLE: u16 = 1;
    pub const NAME: u16 = 2;
    pub const TYPE: u16 = 3;
    pub const DATA: u16 = 4;
    pub const HELPER_NAME: u16 = 1;
    pub const HELPER_L3PROTO: u16 = 2;
    pub const HELPER_L4PROTO: u16 = 3;
}

/// `NFT_OBJECT_CT_HELPER`: the object type of a conntrack helper.
pub const OBJECT_CT_HELPER: u32 = 3;

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

/// The data of one element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElementData<'a> {
    /// A set element.
    None,
    /// A map value.
    Value(&'a [u8]),
    /// A verdict map's `goto <chain>`.
    Goto(&'a str),
}

/// One element, as bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Element<'a> {
    /// The key.
    pub key: &'a [u8],
    /// The last key of the range, for interval concatenations.
    pub key_end: Option<&'a [u8]>,
    /// The data (maps).
    pub data: ElementData<'a>,
    /// `ELEM_INTERVAL_END` for the closing element of a range in a plain interval set.
    pub flags: u32,
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

    /// Creates the table if it does not exist.
    pub fn add(&self, batch: &mut Batch) {
        let what = format!("add table {}", self.prefix());
        batch.message(msg::NEWTABLE, NLM_F_CREATE, self.family, what, |b| {
            put_str(b, table::NAME, self.name);
        });
    }

    /// Creates the table with `NFT_TABLE_F_*` flags.
    pub fn add_with_flags(&self, batch: &mut Batch, flags: u32) {
        let what = format!("add table {} {{ flags {flags:#x}; }}", self.prefix());
        batch.message(msg::NEWTABLE, NLM_F_CREATE, self.family, what, |b| {
            put_str(b, table::NAME, self.name);
            put_be32(b, table::FLAGS, flags);
        });
    }

    /// Deletes the table and everything in it.
    pub fn delete(&self, batch: &mut Batch) {
        let what = format!("delete table {}", self.prefix());
        batch.message(msg::DELTABLE, 0, self.family, what, |b| put_str(b, table::NAME, self.name));
    }

    /// Creates a chain (an existing one is kept as it is).
    pub fn add_chain(&self, batch: &mut Batch, spec: &ChainSpec) {
        let what = format!("add chain {} {}", self.prefix(), spec.name);
        batch.message(msg::NEWCHAIN, NLM_F_CREATE, self.family, what, |b| {
            put_str(b, chain::TABLE, self.name);
            put_str(b, chain::NAME, &spec.name);
            if let Some(hook) = &spec.hook {
                attr::nested(b, chain::HOOK, |b| {
                    put_be32(b, chain::HOOK_NUM, hook.num);
                    put_be32(b, chain::HOOK_PRIORITY, hook.priority as u32);
                });
                put_be32(b, chain::POLICY, 1); // NF_ACCEPT
                put_str(b, chain::TYPE, hook.chain_type);
            }
        });
    }

    fn chain_message(&self, batch: &mut Batch, kind: u16, verb: &str, name: &str) {
        let what = format!("{verb} chain {} {name}", self.prefix());
        batch.message(kind, 0, self.family, what, |b| {
            put_str(b, chain::TABLE, self.name);
            put_str(b, chain::NAME, name);
        });
    }

    /// Deletes a chain (it must hold no rule and no reference).
    pub fn delete_chain(&self, batch: &mut Batch, name: &str) {
        self.chain_message(batch, msg::DELCHAIN, "delete", name);
    }

    /// Removes every rule of a chain.
    pub fn flush_chain(&self, batch: &mut Batch, name: &str) {
        // A rule deletion with a chain and no handle removes the chain's rules. Never send
        // it without the chain: that would flush the whole table.
        let what = format!("flush chain {} {name}", self.prefix());
        batch.message(msg::DELRULE, 0, self.family, what, |b| {
            put_str(b, rule::TABLE, self.name);
            put_str(b, rule::CHAIN, name);
        });
    }

    /// Appends a rule to a chain; `text` is the rule in nft syntax, for error reports.
    pub fn add_rule(&self, batch: &mut Batch, chain_name: &str, exprs: &[Expr], text: &str) {
        let what = format!("add rule {} {chain_name} {text}", self.prefix());
        batch.message(msg::NEWRULE, NLM_F_CREATE | NLM_F_APPEND, self.family, what, |b| {
            put_str(b, rule::TABLE, self.name);
            put_str(b, rule::CHAIN, chain_name);
            attr::nested(b, rule::EXPRESSIONS, |b| encode_all(exprs, b));
        });
    }

    /// Creates a set or map (an existing one with the same definition is kept with its
    /// elements).
    pub fn add_set(&self, batch: &mut Batch, spec: &SetSpec, id: u32) {
        let kind = if spec.data.is_some() { "map" } else { "set" };
        let what = format!("add {kind} {} {}", self.prefix(), spec.name);
        batch.message(msg::NEWSET, NLM_F_CREATE, self.family, what, |b| {
            put_str(b, set::TABLE, self.name);
            put_str(b, set::NAME, &spec.name);
            let map = if spec.data.is_some() { SET_MAP } else { 0 };
            put_be32(b, set::FLAGS, spec.flags | map);
            put_be32(b, set::KEY_TYPE, spec.key_type);
            put_be32(b, set::KEY_LEN, spec.key_len);
            match spec.data {
                None => {}
                Some(SetData::Verdict) => {
                    put_be32(b, set::DATA_TYPE, DATA_VERDICT);
                    put_be32(b, set::DATA_LEN, 0);
                }
                Some(SetData::Value { type_id, len }) => {
                    put_be32(b, set::DATA_TYPE, type_id);
                    put_be32(b, set::DATA_LEN, len);
                }
            }
            if !spec.concat.is_empty() {
                attr::nested(b, set::DESC, |b| {
                    attr::nested(b, set::DESC_CONCAT, |b| {
                        for len in &spec.concat {
                            attr::nested(b, NFTA_LIST_ELEM, |b| put_be32(b, set::FIELD_LEN, *len));
                        }
                    });
                });
            }
            put_be32(b, set::ID, id);
            if let Some(ms) = spec.timeout_ms {
                put_be64(b, set::TIMEOUT, ms);
            }
            if !spec.userdata.is_empty() {
                attr::put(b, set::USERDATA, &spec.userdata);
            }
        });
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
        batch.message(msg::NEWOBJ, NLM_F_CREATE, self.family, what, |b| {
            put_str(b, obj::TABLE, self.name);
            put_str(b, obj::NAME, &spec.name);
            put_be32(b, obj::TYPE, OBJECT_CT_HELPER);
            attr::nested(b, obj::DATA, |b| {
                put_str(b, obj::HELPER_NAME, &spec.helper);
                attr::put(b, obj::HELPER_L3PROTO, &u16::from(self.family.number()).to_be_bytes());
                attr::put(b, obj::HELPER_L4PROTO, &[spec.l4proto]);
            });
        });
    }

    /// Deletes a `ct helper` object (no rule may refer to it).
    pub fn delete_ct_helper(&self, batch: &mut Batch, name: &str) {
        let what = format!("delete ct helper {} {name}", self.prefix());
        batch.message(msg::DELOBJ, 0, self.family, what, |b| {
            put_str(b, obj::TABLE, self.name);
            put_str(b, obj::NAME, name);
            put_be32(b, obj::TYPE, OBJECT_CT_HELPER);
        });
    }

    /// Deletes a set (nothing may refer to it).
    pub fn delete_set(&self, batch: &mut Batch, name: &str) {
        let what = format!("delete set {} {name}", self.prefix());
        batch.message(msg::DELSET, 0, self.family, what, |b| {
            put_str(b, set::TABLE, self.name);
            put_str(b, set::NAME, name);
        });
    }

    /// Removes every element of a set.
    pub fn flush_set(&self, batch: &mut Batch, name: &str) {
        let what = format!("flush set {} {name}", self.prefix());
        batch.message(msg::DELSETELEM, 0, self.family, what, |b| {
            put_str(b, elem::LIST_TABLE, self.name);
            put_str(b, elem::LIST_SET, name);
        });
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
        let mut elements = elements.peekable();
        while let Some(first) = elements.peek() {
            let what =
                format!("{verb} element {} {set_name} {{ {} }}", self.prefix(), describe(first));
            batch.message(kind, flags, self.family, what, |b| {
                put_str(b, elem::LIST_TABLE, self.name);
                put_str(b, elem::LIST_SET, set_name);
                attr::nested(b, elem::LIST_ELEMENTS, |b| {
                    let start = b.len();
                    while b.len() - start < MAX_ELEMENTS_BYTES
                        && let Some(element) = elements.next()
                    {
                        write(&element, &mut ElementSink { buf: b, with_data: add });
                    }
                });
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
    pub fn put(&mut self, element: &Element<'_>) {
        write_element(self.buf, element, self.with_data);
    }
}

fn write_element(buf: &mut Vec<u8>, element: &Element<'_>, with_data: bool) {
    attr::nested(buf, NFTA_LIST_ELEM, |b| {
        attr::nested(b, elem::KEY, |b| attr::put(b, NFTA_DATA_VALUE, element.key));
        if let Some(end) = element.key_end {
            attr::nested(b, elem::KEY_END, |b| attr::put(b, NFTA_DATA_VALUE, end));
        }
        if element.flags != 0 {
            put_be32(b, elem::FLAGS, element.flags);
        }
        if !with_data {
            return;
        }
        match element.data {
            ElementData::None => {}
            ElementData::Value(value) => {
                attr::nested(b, elem::DATA, |b| attr::put(b, NFTA_DATA_VALUE, value))
            }
            ElementData::Goto(chain) => {
                attr::nested(b, elem::DATA, |b| Verdict::Goto(chain.to_string()).encode(b))
            }
        }
    });
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
                let data = ElementData::Value(&value);
                sink.put(&Element { key: &key, key_end: None, data, flags: 0 });
            },
        );
        assert!(batch.message_count() > 1, "3000 elements need more than one message");
        let finished = batch.finish();
        let mut per_message = Vec::new();
        for message in &messages(&finished.bytes)[1..] {
            let attrs = attr::parse(message.netfilter_payload());
            if let Some(list) = attr::find(&attrs, elem::LIST_ELEMENTS) {
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
