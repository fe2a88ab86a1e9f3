//! What kpng wants its chains to hold, kept up to date one service at a time, and the
//! smallest restore that brings the kernel (or what was committed) there.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ipnet::IpNet;
use kpng_model::{Family, LocalState, NodePortAddresses, ServiceKey};

use crate::dispatch::{Dispatch, LeafKey, leaf_chain};
use crate::names::{self, ChainName};
use crate::render::{ChainKey, Context, ServiceRules, Table, render_service};
use crate::rule::{Addr, Match, Rule, Target};

/// Node facts that shape the fixed chains.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// Where NodePorts are accepted.
    pub nodeports: NodePortAddresses,
    /// The service CIDRs in force: unallocated addresses in them are dropped.
    pub service_cidrs: Vec<IpNet>,
}

impl NodeFacts {
    /// The facts of the node in `state`.
    pub fn of(state: &LocalState) -> NodeFacts {
        state
            .node
            .as_ref()
            .map(|n| NodeFacts {
                nodeports: n.nodeport_addresses.clone(),
                service_cidrs: n.service_cidrs.clone(),
            })
            .unwrap_or_default()
    }
}

/// A jump from a built-in chain into kpng's, inserted once at the top.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hook {
    /// The table.
    pub table: Table,
    /// The built-in chain.
    pub builtin: &'static str,
    /// The rule.
    pub rule: Rule,
}

/// The jumps kpng inserts into built-in chains (the same in both families).
pub fn hooks() -> Vec<Hook> {
    let comment = Match::Comment("kpng");
    let nat = |builtin, chain: ChainName| Hook {
        table: Table::Nat,
        builtin,
        rule: Rule::jump(&chain).with(comment.clone()),
    };
    let filter = |builtin| Hook {
        table: Table::Filter,
        builtin,
        rule: Rule::jump(&names::filter()).with(Match::CtStateNew).with(comment.clone()),
    };
    vec![
        nat("PREROUTING", names::services()),
        nat("OUTPUT", names::services()),
        nat("POSTROUTING", names::postrouting()),
        filter("INPUT"),
        filter("FORWARD"),
        filter("OUTPUT"),
    ]
}

/// Every chain kpng wants, and how it got there.
#[derive(Debug, Clone, Default)]
pub struct Desired {
    ctx: Context,
    node: NodeFacts,
    services: HashMap<ServiceKey, ServiceRules>,
    dispatch: Dispatch,
    chains: HashMap<ChainKey, Vec<Rule>>,
    /// The first-level shard chains among `chains`, which come and go with their leaves.
    first_level: BTreeSet<ChainKey>,
}

impl Desired {
    /// Everything for `state`.
    pub fn build(state: &LocalState, ctx: Context) -> Desired {
        let mut desired = Desired { ctx, node: NodeFacts::of(state), ..Desired::default() };
        let mut touched = BTreeSet::new();
        for (key, service) in &state.services {
            let rules = render_service(service, &desired.ctx);
            desired.put(key, Some(rules), &mut touched);
        }
        desired.refresh_fixed(&mut touched);
        desired
    }

    /// Every chain.
    pub fn chains(&self) -> &HashMap<ChainKey, Vec<Rule>> {
        &self.chains
    }

    /// The options and node facts in force.
    pub fn context(&self) -> (&Context, &NodeFacts) {
        (&self.ctx, &self.node)
    }

    /// Re-renders the services `keys` from `state`; adds the chains that may differ to
    /// `touched`.
    pub fn update(
        &mut self,
        state: &LocalState,
        keys: &[ServiceKey],
        touched: &mut BTreeSet<ChainKey>,
    ) {
        for key in keys {
            let rules = state.services.get(key).map(|s| render_service(s, &self.ctx));
            self.put(key, rules, touched);
        }
        self.refresh_fixed(touched);
    }

    /// New options or node facts: every service is rendered again (only chains whose
    /// rules differ will be written).
    pub fn renew(&mut self, state: &LocalState, ctx: Context, touched: &mut BTreeSet<ChainKey>) {
        self.ctx = ctx;
        self.node = NodeFacts::of(state);
        let mut keys: Vec<ServiceKey> = self.services.keys().cloned().collect();
        keys.extend(state.services.keys().cloned());
        keys.sort();
        keys.dedup();
        self.update(state, &keys, touched);
    }

    fn put(
        &mut self,
        key: &ServiceKey,
        rules: Option<ServiceRules>,
        touched: &mut BTreeSet<ChainKey>,
    ) {
        let mut leaves: BTreeSet<LeafKey> = BTreeSet::new();
        if let Some(old) = self.services.remove(key) {
            for chain in old.chains.keys() {
                self.chains.remove(chain);
                touched.insert(chain.clone());
            }
            self.dispatch.file(key, &old.entries, false, &mut leaves);
        }
        if let Some(new) = rules {
            for (chain, rules) in &new.chains {
                self.chains.insert(chain.clone(), rules.clone());
                touched.insert(chain.clone());
            }
            self.dispatch.file(key, &new.entries, true, &mut leaves);
            self.services.insert(key.clone(), new);
        }
        for leaf in leaves {
            let (family, table, l) = leaf;
            let chain = (family, table, leaf_chain(table, l));
            let rules = self.dispatch.leaf_rules(&leaf);
            match rules.is_empty() {
                true => self.chains.remove(&chain),
                false => self.chains.insert(chain.clone(), rules),
            };
            touched.insert(chain);
        }
    }

    /// The fixed chains and first-level shards of both families, from the leaves and the
    /// node.
    fn refresh_fixed(&mut self, touched: &mut BTreeSet<ChainKey>) {
        for key in std::mem::take(&mut self.first_level) {
            self.chains.remove(&key);
            touched.insert(key);
        }
        for family in Family::ALL {
            for (key, rules) in fixed_chains(family, &self.ctx, &self.node, &self.dispatch) {
                if is_first_level(&key.2) {
                    self.first_level.insert(key.clone());
                }
                self.chains.insert(key.clone(), rules);
                touched.insert(key);
            }
        }
    }
}

fn is_first_level(name: &ChainName) -> bool {
    let s = name.as_str();
    (s.starts_with("KPNG-SH-") || s.starts_with("KPNG-FSH-"))
        && s.rsplit('-').next().is_some_and(|t| t.len() == 1)
}

/// 127.0.0.0/8 or ::1.
fn loopback(family: Family) -> IpNet {
    match family {
        Family::V4 => ipnet::Ipv4Net::new_assert(std::net::Ipv4Addr::new(127, 0, 0, 0), 8).into(),
        Family::V6 => ipnet::Ipv6Net::new_assert(std::net::Ipv6Addr::LOCALHOST, 128).into(),
    }
}

/// Whether IPv4 NodePorts are accepted on 127.0.0.1 (they never are on ::1).
fn localhost_nodeports(family: Family, ctx: &Context, node: &NodeFacts) -> bool {
    family == Family::V4 && ctx.localhost_nodeports && node.nodeports.all_local.v4
}

fn nodeport_guard(family: Family, ctx: &Context, node: &NodeFacts) -> Vec<Rule> {
    let target = names::nodeports();
    if *node.nodeports.all_local.get(family) {
        let mut rule = Rule::jump(&target).with(Match::AddrTypeLocal { src: false });
        if !localhost_nodeports(family, ctx, node) {
            rule = rule.not_dst(Addr::Net(loopback(family)));
        }
        return vec![rule];
    }
    node.nodeports
        .addresses
        .iter()
        .filter(|ip| Family::of(ip) == family)
        .map(|ip| Rule::jump(&target).dst(Addr::host(*ip)))
        .collect()
}

/// The chains whose rules do not belong to one service, for one family.
pub fn fixed_chains(
    family: Family,
    ctx: &Context,
    node: &NodeFacts,
    dispatch: &Dispatch,
) -> Vec<(ChainKey, Vec<Rule>)> {
    let nat = dispatch.upper(family, Table::Nat);
    let filter = dispatch.upper(family, Table::Filter);
    let key = |table, name| (family, table, name);
    let mut chains = Vec::new();

    let mut services = nat.top;
    services.extend(nodeport_guard(family, ctx, node));
    chains.push((key(Table::Nat, names::services()), services));
    chains.push((key(Table::Nat, names::nodeports()), nat.nodeports));
    chains.extend(nat.shards);
    chains.push((
        key(Table::Nat, names::postrouting()),
        vec![
            Rule::to(Target::Return).with(Match::Mark { not: true, bit: ctx.masq_mark }),
            Rule::to(Target::ClearMark(ctx.masq_mark)),
            Rule::to(Target::Masquerade),
        ],
    ));
    chains.push((
        key(Table::Nat, names::mark_masq()),
        vec![Rule::to(Target::SetMark(ctx.masq_mark))],
    ));
    chains.push((
        key(Table::Nat, names::mark_drop()),
        vec![Rule::to(Target::SetMark(ctx.drop_mark))],
    ));
    let mut unless_pod = ctx.from_pods(family, Target::Return);
    unless_pod.push(Rule::jump(&names::mark_masq()));
    chains.push((key(Table::Nat, names::masq_unless_pod()), unless_pod));

    let mut filter_rules =
        vec![Rule::to(Target::Drop).with(Match::Mark { not: false, bit: ctx.drop_mark })];
    if localhost_nodeports(family, ctx, node) {
        // route_localnet lets packets from elsewhere reach 127.0.0.0/8: only NodePort
        // traffic (translated) may (CVE-2020-8558).
        let net = Addr::Net(loopback(family));
        filter_rules.push(Rule::to(Target::Drop).dst(net).not_src(net).with(Match::CtStateNotDnat));
    }
    filter_rules.extend(filter.top);
    filter_rules.extend(
        node.service_cidrs
            .iter()
            .filter(|n| Family::of_net(n) == family)
            .map(|n| Rule::to(Target::Drop).dst(Addr::Net(n.trunc()))),
    );
    filter_rules.extend(nodeport_guard(family, ctx, node));
    chains.push((key(Table::Filter, names::filter()), filter_rules));
    chains.push((key(Table::Filter, names::nodeports()), filter.nodeports));
    chains.extend(filter.shards);
    chains
}

/// What one table of one family needs written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TablePlan {
    /// Chains to create or flush and fill, with their rules.
    pub write: BTreeMap<ChainName, Vec<Rule>>,
    /// Chains to delete.
    pub delete: BTreeSet<ChainName>,
    /// Jumps from built-in chains to insert.
    pub hooks: Vec<Hook>,
}

impl TablePlan {
    /// Whether nothing is to be done.
    pub fn is_empty(&self) -> bool {
        self.write.is_empty() && self.delete.is_empty() && self.hooks.is_empty()
    }
}

/// One restore per family, each with its nat and filter sections.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// By family and table.
    pub tables: BTreeMap<(Family, Table), TablePlan>,
}

impl Plan {
    /// Whether nothing is to be done.
    pub fn is_empty(&self) -> bool {
        self.tables.values().all(TablePlan::is_empty)
    }

    fn table(&mut self, family: Family, table: Table) -> &mut TablePlan {
        self.tables.entry((family, table)).or_default()
    }

    /// The chains written and deleted.
    pub fn counts(&self) -> (usize, usize) {
        self.tables.values().fold((0, 0), |(w, d), t| (w + t.write.len(), d + t.delete.len()))
    }

    /// The families with something to do.
    pub fn families(&self) -> BTreeSet<Family> {
        self.tables.iter().filter(|(_, t)| !t.is_empty()).map(|((f, _), _)| *f).collect()
    }

    /// Writes `key` with `rules`.
    pub fn write(&mut self, key: &ChainKey, rules: Vec<Rule>) {
        self.table(key.0, key.1).write.insert(key.2.clone(), rules);
    }

    /// Deletes `key`.
    pub fn delete(&mut self, key: &ChainKey) {
        self.table(key.0, key.1).delete.insert(key.2.clone());
    }

    /// Inserts `hook` in `family`.
    pub fn hook(&mut self, family: Family, hook: Hook) {
        self.table(family, hook.table).hooks.push(hook);
    }

    /// The `iptables-restore --noflush` input for `family`: declarations (create, or flush
    /// an existing chain), inserted jumps, rules, then deletions.
    pub fn restore_text(&self, family: Family) -> String {
        let tables = Table::ALL.iter().filter_map(|t| Some((*t, self.tables.get(&(family, *t))?)));
        tables.map(|(table, plan)| table_text(table, plan)).collect()
    }

    /// The inputs for `family`, in order: one when it writes at most `max_chains` chains;
    /// otherwise the written chains in batches of `max_chains`, each chain after those it
    /// jumps to (so every batch is valid on its own), then the deletions and jumps from
    /// built-in chains. iptables-restore's cost grows faster than the number of chains in
    /// one input, so a cold start over tens of thousands of chains is much faster in
    /// batches; changes after it are one input, applied atomically.
    pub fn restore_texts(&self, family: Family, max_chains: usize) -> Vec<String> {
        let written: usize =
            self.tables.iter().filter(|((f, _), _)| *f == family).map(|(_, t)| t.write.len()).sum();
        if written <= max_chains.max(1) {
            let text = self.restore_text(family);
            return if text.is_empty() { Vec::new() } else { vec![text] };
        }
        let mut texts = Vec::new();
        for table in Table::ALL {
            let Some(plan) = self.tables.get(&(family, table)) else { continue };
            for chunk in dependency_order(&plan.write).chunks(max_chains.max(1)) {
                let write = chunk.iter().map(|c| ((*c).clone(), plan.write[*c].clone())).collect();
                texts.push(table_text(table, &TablePlan { write, ..TablePlan::default() }));
            }
            let rest = TablePlan {
                delete: plan.delete.clone(),
                hooks: plan.hooks.clone(),
                ..TablePlan::default()
            };
            texts.push(table_text(table, &rest));
        }
        texts.retain(|t| !t.is_empty());
        texts
    }
}

/// One table's section of a restore input.
fn table_text(table: Table, plan: &TablePlan) -> String {
    use std::fmt::Write;
    let mut text = String::new();
    if plan.is_empty() {
        return text;
    }
    let _ = writeln!(text, "*{}", table.as_str());
    for chain in plan.write.keys().chain(&plan.delete) {
        let _ = writeln!(text, ":{chain} - [0:0]");
    }
    for hook in &plan.hooks {
        let _ = writeln!(text, "-I {} 1 {}", hook.builtin, hook.rule);
    }
    for (chain, rules) in &plan.write {
        for rule in rules {
            let _ = writeln!(text, "-A {chain} {rule}");
        }
    }
    for chain in &plan.delete {
        let _ = writeln!(text, "-X {chain}");
    }
    text.push_str("COMMIT\n");
    text
}

/// The chains of `write`, each after the chains of `write` it jumps to.
fn dependency_order(write: &BTreeMap<ChainName, Vec<Rule>>) -> Vec<&ChainName> {
    fn visit<'a>(
        chain: &'a ChainName,
        write: &'a BTreeMap<ChainName, Vec<Rule>>,
        seen: &mut BTreeSet<&'a ChainName>,
        order: &mut Vec<&'a ChainName>,
    ) {
        if !seen.insert(chain) {
            return;
        }
        // Jumps go down a few levels (dispatch, service, endpoint, mark): shallow recursion.
        for rule in &write[chain] {
            if let Some((target, _)) = rule.jumps_to().and_then(|t| write.get_key_value(t)) {
                visit(target, write, seen, order);
            }
        }
        order.push(chain);
    }
    let (mut seen, mut order) = (BTreeSet::new(), Vec::new());
    for chain in write.keys() {
        visit(chain, write, &mut seen, &mut order);
    }
    order
}

/// The plan that makes `committed` hold `desired` for the chains `keys`.
pub fn plan_chains<'k>(
    desired: &HashMap<ChainKey, Vec<Rule>>,
    committed: &HashMap<ChainKey, Vec<Rule>>,
    keys: impl IntoIterator<Item = &'k ChainKey>,
) -> Plan {
    let mut plan = Plan::default();
    for key in keys {
        match (desired.get(key), committed.get(key)) {
            (Some(want), Some(have)) if want == have => {}
            (Some(want), _) => plan.write(key, want.clone()),
            (None, Some(_)) => plan.delete(key),
            (None, None) => {}
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_text_declares_inserts_fills_then_deletes() {
        let mut plan = Plan::default();
        let chain = names::mark_masq();
        plan.write(
            &(Family::V4, Table::Nat, chain.clone()),
            vec![Rule::to(Target::SetMark(0x4000))],
        );
        plan.delete(&(Family::V4, Table::Nat, names::mark_drop()));
        plan.hook(Family::V4, hooks().remove(0));
        assert_eq!(
            plan.restore_text(Family::V4),
            "*nat\n:KPNG-MARK-MASQ - [0:0]\n:KPNG-MARK-DROP - [0:0]\n-I PREROUTING 1 -m comment --comment kpng -j KPNG-SERVICES\n-A KPNG-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n-X KPNG-MARK-DROP\nCOMMIT\n"
        );
        assert_eq!(plan.restore_text(Family::V6), "");
        assert_eq!(plan.families(), BTreeSet::from([Family::V4]));
    }

    #[test]
    fn large_writes_come_in_batches_each_after_what_it_jumps_to() {
        let mut plan = Plan::default();
        let key = |name: &str| (Family::V4, Table::Nat, ChainName::new(name).unwrap());
        let jump = |name: &str| Rule::jump(&ChainName::new(name).unwrap());
        plan.write(&key("KPNG-A"), vec![jump("KPNG-B"), jump("KPNG-C")]);
        plan.write(&key("KPNG-B"), vec![jump("KPNG-C")]);
        plan.write(&key("KPNG-C"), vec![Rule::to(Target::Drop)]);
        plan.delete(&key("KPNG-OLD"));
        assert_eq!(plan.restore_texts(Family::V4, 3), vec![plan.restore_text(Family::V4)]);
        let texts = plan.restore_texts(Family::V4, 1);
        let first_lines: Vec<&str> = texts.iter().map(|t| t.lines().nth(1).unwrap()).collect();
        assert_eq!(
            first_lines,
            [":KPNG-C - [0:0]", ":KPNG-B - [0:0]", ":KPNG-A - [0:0]", ":KPNG-OLD - [0:0]"]
        );
        assert!(texts[3].ends_with("-X KPNG-OLD\nCOMMIT\n"), "{}", texts[3]);
    }
}
