//! nf_tables messages against nft's own bytes. `tests/fixtures/kpng.nft` is a part of
//! kpng's table (sets and maps of every kind, elements, base and regular chains, rules with
//! every kind of expression kpng writes) as `to-nft --dry-run` prints it; `kpng.mnl.hex`
//! is what `nft --debug=mnl -f kpng.nft` sent for it, one message a line (type, then the
//! bytes after the netlink header). Every message decodes into its type and encodes back
//! to nft's bytes exactly; kpng's batch builders, given what each message declares, write
//! those bytes too (but for the set ids nft adds); as root, nft is run again in a network
//! namespace of the test's own and must still send those bytes (`KPNG_WRITE_FIXTURES=1`
//! rewrites the file instead).

use kpng_netlink::nftables::messages::{
    ChainMsg, ElementsMsg, GenMsg, Message, ObjMsg, RuleExpr, RuleMsg, SetMsg, TableMsg,
};
use kpng_netlink::nftables::msg;
use kpng_testkit::netns::Netns;
use kpng_testkit::privileged::require;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// `nfgenmsg`: family, version, resource id.
const NFGENMSG_LEN: usize = 4;

/// nf_tables' netlink subsystem.
const NFTABLES: u16 = 10;

/// The nf_tables messages of `nft --debug=mnl` output that change the ruleset (the batch's
/// content: not the cache's dump requests nor the batch's begin and end), as `(message
/// type, bytes after the netlink header)`.
fn parse_mnl(text: &str) -> Vec<(u16, Vec<u8>)> {
    let mut messages: Vec<(u16, usize, Vec<u8>)> = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if line.contains("message length") {
            let length: usize = cells[1].parse().expect("a message length");
            let kind_line = lines.next().expect("the type line");
            let kind: u16 = kind_line.split('|').nth(1).unwrap().trim().parse().unwrap();
            messages.push((kind, length, Vec::new()));
            continue;
        }
        let Some((_, _, bytes)) = messages.last_mut() else { continue };
        // An attribute header: |len|flags|type|.
        if cells.len() >= 5 && cells[1].len() == 5 && cells[3].len() == 5 {
            let (Ok(len), Ok(kind)) = (cells[1].parse::<u16>(), cells[3].parse::<u16>()) else {
                continue;
            };
            let flags = cells[2].as_bytes();
            let mut kind = kind;
            if flags.first() == Some(&b'N') {
                kind |= 0x8000;
            }
            if flags.get(1) == Some(&b'B') {
                kind |= 0x4000;
            }
            bytes.extend_from_slice(&len.to_ne_bytes());
            bytes.extend_from_slice(&kind.to_ne_bytes());
            continue;
        }
        // Four bytes of data (the extra header is the nfgenmsg).
        let hex: Vec<&str> = cells.get(1).map(|c| c.split(' ').collect()).unwrap_or_default();
        if hex.len() == 4 && hex.iter().all(|h| h.len() == 2) {
            let four: Result<Vec<u8>, _> = hex.iter().map(|h| u8::from_str_radix(h, 16)).collect();
            if let Ok(four) = four {
                bytes.extend(four);
            }
        }
    }
    messages
        .into_iter()
        .filter(|(kind, _, _)| kind >> 8 == NFTABLES && is_change(kind & 0xff))
        .map(|(kind, length, bytes)| {
            assert_eq!(bytes.len() + 16, length, "message {kind} read whole");
            (kind & 0xff, bytes)
        })
        .collect()
}

fn is_change(kind: u16) -> bool {
    matches!(kind, 0 | 2 | 3 | 5 | 6 | 8 | 9 | 11 | 12 | 14 | 18 | 20)
}

fn to_hex(messages: &[(u16, Vec<u8>)]) -> String {
    let line = |(kind, bytes): &(u16, Vec<u8>)| {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!("{kind} {hex}\n")
    };
    messages.iter().map(line).collect()
}

fn from_hex(text: &str) -> Vec<(u16, Vec<u8>)> {
    text.lines()
        .map(|line| {
            let (kind, hex) = line.split_once(' ').expect("type and bytes");
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            (kind.parse().unwrap(), bytes)
        })
        .collect()
}

fn stored() -> Vec<(u16, Vec<u8>)> {
    let text = std::fs::read_to_string(format!("{FIXTURES}/kpng.mnl.hex")).expect("the fixture");
    from_hex(&text)
}

/// Decodes `body` as message type `kind` and encodes it again.
fn round_trip(kind: u16, body: &[u8]) -> Vec<u8> {
    fn again<M: Message + std::fmt::Debug>(body: &[u8]) -> Vec<u8> {
        let decoded = M::decode(body).unwrap_or_else(|e| panic!("{e}: {body:02x?}"));
        let mut out = Vec::new();
        decoded.encode(&mut out);
        out
    }
    match kind {
        msg::NEWTABLE | msg::DELTABLE => again::<TableMsg>(body),
        msg::NEWCHAIN | msg::DELCHAIN => again::<ChainMsg>(body),
        msg::NEWRULE | msg::DELRULE => again::<RuleMsg>(body),
        msg::NEWSET | msg::DELSET => again::<SetMsg>(body),
        msg::NEWSETELEM | msg::DELSETELEM => again::<ElementsMsg>(body),
        msg::NEWOBJ | msg::DELOBJ => again::<ObjMsg>(body),
        msg::NEWGEN => again::<GenMsg>(body),
        other => panic!("message type {other} has no type of its own"),
    }
}

#[test]
fn every_message_nft_sends_for_kpngs_table_decodes_and_encodes_to_its_bytes() {
    let messages = stored();
    assert!(messages.len() > 150, "the fixture holds {} messages", messages.len());
    let mut kinds = std::collections::BTreeSet::new();
    for (kind, bytes) in &messages {
        kinds.insert(*kind);
        let body = &bytes[NFGENMSG_LEN..];
        assert_eq!(round_trip(*kind, body), body, "message type {kind}");
    }
    let expected = [msg::NEWTABLE, msg::NEWCHAIN, msg::NEWRULE, msg::NEWSET, msg::NEWSETELEM];
    assert!(expected.iter().all(|k| kinds.contains(k)), "{kinds:?}");
}

#[test]
fn kpngs_rule_expressions_are_all_known() {
    for (kind, bytes) in stored().iter().filter(|(k, _)| *k == msg::NEWRULE) {
        let rule = RuleMsg::decode(&bytes[NFGENMSG_LEN..]).unwrap();
        let unknown = rule.exprs.iter().filter(|e| matches!(e, RuleExpr::Unknown(_))).count();
        assert_eq!(unknown, 0, "type {kind}: {rule:?}");
    }
}

#[test]
fn the_fixture_is_what_nft_sends() {
    if !require("the_fixture_is_what_nft_sends", &["nft", "ip"]) {
        return;
    }
    let netns = Netns::new("mnl");
    let script = format!("{FIXTURES}/kpng.nft");
    let out = netns.output("nft", &["--debug=mnl", "-f", &script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // nft writes its debug output to stdout, in colour.
    let text = String::from_utf8_lossy(&out.stdout).replace('\u{1b}', "");
    let text = strip_colours(&text);
    let live = parse_mnl(&text);
    if std::env::var("KPNG_WRITE_FIXTURES").is_ok_and(|v| v == "1") {
        std::fs::write(format!("{FIXTURES}/kpng.mnl.hex"), to_hex(&live)).unwrap();
    }
    assert_eq!(to_hex(&live), to_hex(&stored()), "nft sends other bytes than the fixture holds");
}

/// Removes ANSI colour sequences (`[1;31m` once the escape is gone).
fn strip_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '[' && chars.peek().is_some_and(|c| c.is_ascii_digit()) {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// kpng's batch builders ([`kpng_netlink::nftables::objects::Table`]), given what each
/// fixture message declares, write nft's bytes: the same attributes in the same order.
/// Two differences are nft's own and are taken out of its side first: it names a set
/// created in the same batch by its id as well as its name (kpng names it only), and it
/// gives a table its flags when they are 0.
#[test]
fn kpngs_batch_builders_write_what_nft_writes() {
    use kpng_netlink::message::messages;
    use kpng_netlink::nftables::Expr;
    use kpng_netlink::nftables::messages::{ElementData, ElementDataRef, ElementRef};
    use kpng_netlink::nftables::objects::{ChainSpec, Hook, SetData, SetSpec, Table};
    use kpng_netlink::{Batch, ProtoFamily};

    /// nft's message with what kpng does not write taken out.
    fn as_kpng_writes(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match kind {
            msg::NEWTABLE => {
                let table = TableMsg::decode(body).unwrap();
                TableMsg { flags: table.flags.filter(|f| *f != 0), ..table }.encode(&mut out);
            }
            msg::NEWRULE => {
                let mut rule = RuleMsg::decode(body).unwrap();
                for expr in &mut rule.exprs {
                    if let RuleExpr::Known(
                        Expr::Lookup { set_id, .. } | Expr::DynsetUpdate { set_id, .. },
                    ) = expr
                    {
                        *set_id = None;
                    }
                }
                rule.encode(&mut out);
            }
            msg::NEWSETELEM => {
                ElementsMsg { set_id: None, ..ElementsMsg::decode(body).unwrap() }.encode(&mut out);
            }
            _ => out.extend_from_slice(body),
        }
        out
    }

    /// What kpng's builders write for the object `body` declares.
    fn written_by_kpng(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut batch = Batch::new(0);
        let table = |name: &str| Table { family: ProtoFamily::Ipv4, name: leak(name) };
        match kind {
            msg::NEWTABLE => table(&TableMsg::decode(body).unwrap().name).add(&mut batch),
            msg::NEWCHAIN => {
                let chain = ChainMsg::decode(body).unwrap();
                let hook = chain.hook.map(|h| Hook {
                    chain_type: leak(chain.chain_type.as_deref().unwrap()),
                    num: h.num,
                    priority: h.priority,
                });
                table(&chain.table).add_chain(&mut batch, &ChainSpec { name: chain.name, hook });
            }
            msg::NEWSET => {
                let set = SetMsg::decode(body).unwrap();
                let map = kpng_netlink::nftables::objects::SET_MAP;
                let data = set.data.map(|(type_id, len)| match type_id {
                    kpng_netlink::nftables::objects::DATA_VERDICT => SetData::Verdict,
                    _ => SetData::Value { type_id, len },
                });
                let spec = SetSpec {
                    name: set.name.clone(),
                    key_type: set.key_type.unwrap(),
                    key_len: set.key_len.unwrap(),
                    flags: set.flags.unwrap() & !map,
                    data,
                    timeout_ms: set.timeout_ms,
                    concat: set.desc.map(|d| d.concat).unwrap_or_default(),
                    userdata: set.userdata.unwrap_or_default(),
                };
                table(&set.table).add_set(&mut batch, &spec, set.id.unwrap());
            }
            msg::NEWRULE => {
                let rule = RuleMsg::decode(body).unwrap();
                let exprs: Vec<Expr> = rule.known().into_iter().map(Option::unwrap).collect();
                let exprs: Vec<Expr> = exprs
                    .into_iter()
                    .map(|e| match e {
                        Expr::Lookup { set, sreg, dreg, invert, .. } => {
                            Expr::Lookup { set, sreg, dreg, invert, set_id: None }
                        }
                        Expr::DynsetUpdate { set, sreg_key, .. } => {
                            Expr::DynsetUpdate { set, sreg_key, set_id: None }
                        }
                        other => other,
                    })
                    .collect();
                table(&rule.table).add_rule(&mut batch, &rule.chain, &exprs, "");
            }
            msg::NEWSETELEM => {
                let list = ElementsMsg::decode(body).unwrap();
                let write = |e: &&kpng_netlink::nftables::messages::ElementMsg,
                             sink: &mut kpng_netlink::nftables::objects::ElementSink<'_>| {
                    let data = match &e.data {
                        Some(ElementData::Value(v)) => Some(ElementDataRef::Value(v)),
                        Some(ElementData::Verdict(v)) => Some(ElementDataRef::Verdict(v)),
                        None => None,
                    };
                    let key_end = e.key_end.as_deref();
                    sink.put(&ElementRef { key: &e.key, key_end, data, flags: e.flags, ..ElementRef::default() });
                };
                table(&list.table).elements(
                    &mut batch,
                    &list.set,
                    true,
                    list.elements.iter(),
                    |_| String::new(),
                    write,
                );
            }
            other => panic!("no builder for message type {other}"),
        }
        let finished = batch.finish();
        let received = messages(&finished.bytes);
        // Between the batch's begin and end markers: the one message.
        assert_eq!(received.len(), 3, "one message for type {kind}");
        received[1].netfilter_payload().to_vec()
    }

    fn leak(text: &str) -> &'static str {
        Box::leak(text.to_string().into_boxed_str())
    }

    let mut compared = std::collections::BTreeMap::new();
    for (kind, bytes) in stored() {
        let body = &bytes[NFGENMSG_LEN..];
        let expected = as_kpng_writes(kind, body);
        assert_eq!(written_by_kpng(kind, body), expected, "message type {kind}: {body:02x?}");
        *compared.entry(kind).or_insert(0) += 1;
    }
    assert_eq!(compared.len(), 5, "{compared:?}");
}
