use super::*;

const FIREWALL: &str = r#"
# a static firewall
table inet fw {
    set allowed {
        type ipv4_addr . inet_service; flags interval;
        elements = { 10.0.0.0/8 . 22,
                     192.168.1.1 . 443 }
    }
    map ports { type inet_service : verdict; elements = { 80 : accept } }
    chain input {
        type filter hook input priority 0; policy accept;
        ip saddr . tcp dport @allowed accept
        tcp dport { 80, 443 } counter accept ; udp dport 53 accept
    }
    chain other {
    }
}
"#;

#[test]
fn a_file_reads_into_tables_chains_and_sets() {
    let parsed = parse(FIREWALL).unwrap();
    let table = &parsed.state.tables[&TableKey::new(Family::Inet, "fw")];
    let input = &table.chains["input"];
    assert_eq!(
        input.declaration.as_deref(),
        Some("type filter hook input priority 0; policy accept;")
    );
    assert_eq!(
        input.rules,
        [
            "ip saddr . tcp dport @allowed accept",
            "tcp dport { 80, 443 } counter accept",
            "udp dport 53 accept"
        ]
    );
    assert_eq!(table.chains["other"], Chain::default());
    let allowed = &table.sets["allowed"];
    assert_eq!(allowed.declaration, "type ipv4_addr . inet_service; flags interval;");
    assert_eq!(
        allowed.elements.iter().collect::<Vec<_>>(),
        ["10.0.0.0/8 . 22", "192.168.1.1 . 443"]
    );
    assert_eq!(table.sets["ports"].kind, SetKind::Map);
    assert!(parsed.comments.is_empty());
}

#[test]
fn what_nft_lists_reads_back_with_the_owner_comment() {
    let listed = "table ip t {\n\tcomment \"kpng-aggregator producer=fw\"\n\tset s {\n\t\ttype ipv4_addr . inet_service\n\t\tflags interval\n\t\telements = { 10.0.0.0/8 . 80 }\n\t}\n\n\tchain c {\n\t\ttype filter hook input priority filter; policy accept;\n\t\tip saddr . tcp dport @s counter accept\n\t}\n}\ntable ip other {\n}\n";
    let parsed = parse(listed).unwrap();
    let key = TableKey::new(Family::Ip, "t");
    assert_eq!(parsed.comments[&key], "kpng-aggregator producer=fw");
    let written = parse(
        "table ip t { set s { type ipv4_addr . inet_service; flags interval; elements = { 10.0.0.0/8 . 80 } }
         chain c { type filter hook input priority 0; policy accept; ip saddr . tcp dport @s counter accept } }",
    )
    .unwrap();
    assert_eq!(
        parsed.state.tables[&key], written.state.tables[&key],
        "nft's listing equals what was written"
    );
    assert!(parsed.state.tables.contains_key(&TableKey::new(Family::Ip, "other")));
}

#[test]
fn a_malformed_file_names_the_line_and_object() {
    let cases = [
        (
            "table ip t {\n chain c {\n accept\n",
            "line 4: table ip t chain c: unexpected end of file",
        ),
        ("table ip t {\n  bogus thing\n}", "line 2: table ip t: expected a chain, set or map"),
        ("tables ip t {\n}", "line 1: expected `table FAMILY NAME {`"),
        ("table ipx t {\n}", "line 1: unknown family \"ipx\""),
        (
            "table ip t {\n set s {\n elements = { 1.2.3.4 }\n }\n}",
            "line 4: table ip t set s: a set or map needs a `type`",
        ),
        (
            "table ip t {\n set s {\n type ipv4_addr\n elements = 1.2.3.4\n }\n}",
            "line 4: table ip t set s: expected `elements",
        ),
        ("table ip t {\n}\ntable ip t {\n}", "line 3: table ip t is declared twice"),
    ];
    for (text, expected) in cases {
        let error = parse(text).unwrap_err().to_string();
        assert!(error.starts_with(expected), "{text:?}: {error}");
    }
}

#[test]
fn tables_split_whole_whatever_they_hold() {
    let listed = "table ip ta {\n\tcomment \"x {\"\n\tchain c {\n\t\taccept\n\t}\n}\ntable inet f {\n\tflowtable ft {\n\t\tdevices = { lo }\n\t}\n}\n";
    let tables = split_tables(listed);
    let keys: Vec<String> = tables.iter().map(|(k, _)| k.to_string()).collect();
    assert_eq!(keys, ["ip ta", "inet f"]);
    assert!(tables[0].1.starts_with("table ip ta {") && tables[0].1.ends_with('}'));
    assert!(tables[1].1.contains("flowtable ft"));
}
