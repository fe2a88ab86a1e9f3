//! kpng's objects in iptables ([`Key`], [`Rules`]), how services become them
//! ([`IptablesRender`]: each service's own chains, and the dispatch chains many services
//! share), and the restore inputs that carry out a plan of them ([`Restores`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::convert::Infallible;
use std::sync::Arc;

use ipnet::IpNet;
use kpng_backend::reconcile::{
    AnnotationKey, Filed, LoadBalancing, Pack, Plan, Rank, Render, Wanted,
};
use kpng_model::local::LocalServiceState;
use kpng_model::{Family, NodePortAddresses, NodeState, ServiceKey};

use crate::dispatch::{Dispatch, LeafKey, first_level_chains, leaf_chain};
use crate::names::{self, ChainName};
use crate::render::{ChainKey, Context, Entry, Table, render_service};
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
    pub fn of(state: &dyn NodeState) -> NodeFacts {
        state
            .node()
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

/// One of kpng's objects in iptables: a chain of its own, or a jump into one from a
/// built-in chain.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// A `KPNG-*` chain; its value is its rules.
    Chain(Family, Table, ChainName),
    /// A rule of a built-in chain jumping into kpng's, as `iptables-save` prints it; its
    /// value is empty.
    Hook(Family, Table, String, String),
}

impl Key {
    /// The family.
    pub fn family(&self) -> Family {
        match self {
            Key::Chain(family, ..) | Key::Hook(family, ..) => *family,
        }
    }

    /// The table.
    pub fn table(&self) -> Table {
        match self {
            Key::Chain(_, table, _) | Key::Hook(_, table, ..) => *table,
        }
    }

    /// A chain's key.
    pub fn chain((family, table, name): ChainKey) -> Key {
        Key::Chain(family, table, name)
    }

    /// Whether this is one of the fixed chains or a hook: what verification reads back
    /// every time (a flushed table breaks these first).
    pub fn is_entry(&self) -> bool {
        match self {
            Key::Chain(_, _, name) => names::entry_chains().contains(name),
            Key::Hook(..) => true,
        }
    }
}

/// Kept whole by the template: a service's objects are a few chains of rules.
impl Pack for Key {}

impl Pack for Rules {}

impl Filed for Key {}

impl Rank for Key {
    /// Chains before the jumps into them (one restore applies both in that order anyway).
    fn rank(&self) -> u8 {
        match self {
            Key::Chain(..) => 0,
            Key::Hook(..) => 1,
        }
    }

    /// One table of one family: `iptables-restore` commits each table's section whole.
    fn group(&self) -> u8 {
        let family = match self.family() {
            Family::V4 => 0,
            Family::V6 => 2,
        };
        family + self.table() as u8
    }
}

/// A chain's rules as `iptables-save` prints them after `-A CHAIN `, one per line (empty
/// for a hook). Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Rules(Arc<str>);

impl Rules {
    /// The rules as printed.
    pub fn new<S: AsRef<str>>(rules: impl IntoIterator<Item = S>) -> Rules {
        let mut text = String::new();
        for rule in rules {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(rule.as_ref());
        }
        Rules(text.into())
    }

    /// Typed rules, printed.
    pub fn of(rules: &[Rule]) -> Rules {
        Rules::new(rules.iter().map(ToString::to_string))
    }

    /// Each rule.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.split('\n').filter(|l| !l.is_empty())
    }

    /// The number of rules.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// What shapes every service's chains: the options and the node's facts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// Options and node addresses.
    pub ctx: Context,
    /// Where NodePorts are accepted, the service CIDRs.
    pub node: NodeFacts,
}

/// How services become kpng's chains: each service's own chains, and the dispatch chains
/// that list many services' destinations ([`Render::shared`]).
#[derive(Debug, Default)]
pub struct IptablesRender {
    options: crate::IptablesOptions,
    /// Every service's destinations, by leaf.
    dispatch: Dispatch,
    /// Each service's entries in the dispatch, to take out when it renders again.
    entries: HashMap<ServiceKey, Vec<Entry>>,
    /// The leaves whose rules may have changed since the shared chains were last made.
    touched: BTreeSet<LeafKey>,
    /// The facts the shared chains were last made with.
    shared_facts: Option<Facts>,
}

impl IptablesRender {
    /// A render for `options`.
    pub fn new(options: crate::IptablesOptions) -> IptablesRender {
        IptablesRender { options, ..IptablesRender::default() }
    }

    fn file(&mut self, key: &ServiceKey, entries: Option<Vec<Entry>>) {
        if let Some(old) = self.entries.remove(key) {
            self.dispatch.file(key, &old, false, &mut self.touched);
        }
        if let Some(new) = entries {
            self.dispatch.file(key, &new, true, &mut self.touched);
            self.entries.insert(key.clone(), new);
        }
    }
}

impl Render for IptablesRender {
    type Key = Key;
    type Value = Rules;
    type Facts = Facts;
    type Error = Infallible;

    fn facts(&self, state: &dyn NodeState) -> Facts {
        let o = &self.options;
        let ctx = Context {
            masquerade_all: o.masquerade_all,
            masq_mark: 1 << o.masquerade_bit,
            drop_mark: 1 << o.drop_bit,
            local: o.local_detection.resolve(state.node(), &o.cluster_cidrs),
            node_ips: state.node().map(|n| n.primary_ips.clone()).unwrap_or_default(),
            localhost_nodeports: o.localhost_nodeports,
        };
        Facts { ctx, node: NodeFacts::of(state) }
    }

    fn node(&mut self, facts: &Facts) -> Wanted<Key, Rules> {
        let mut objects = BTreeMap::new();
        for family in Family::ALL {
            for (key, rules) in node_chains(family, &facts.ctx) {
                objects.insert(Key::chain(key), Rules::of(&rules));
            }
            for hook in hooks() {
                let key = Key::Hook(family, hook.table, hook.builtin.into(), hook.rule.to_string());
                objects.insert(key, Rules::default());
            }
        }
        Wanted { objects, yielding: BTreeSet::new() }
    }

    fn service(
        &mut self,
        facts: &Facts,
        service: &LocalServiceState,
        _held: &dyn kpng_backend::reconcile::Lookup<Key, Rules>,
    ) -> Result<Wanted<Key, Rules>, Infallible> {
        let rules = render_service(service, &facts.ctx);
        self.file(&service.service.key, Some(rules.entries));
        let chains = rules.chains.into_iter().map(|(k, r)| (Key::chain(k), Rules::of(&r)));
        Ok(Wanted::objects(chains))
    }

    fn shared(&mut self, facts: &Facts) -> Vec<(Key, Option<Rules>)> {
        let mut changes = Vec::new();
        let mut tables: BTreeSet<(Family, Table)> = BTreeSet::new();
        for leaf in std::mem::take(&mut self.touched) {
            let (family, table, l) = leaf;
            tables.insert((family, table));
            let rules = self.dispatch.leaf_rules(&leaf);
            let key = Key::Chain(family, table, leaf_chain(table, l));
            changes.push((key, (!rules.is_empty()).then(|| Rules::of(&rules))));
        }
        if self.shared_facts.as_ref() != Some(facts) {
            tables.extend(Family::ALL.into_iter().flat_map(|f| Table::ALL.map(|t| (f, t))));
            self.shared_facts = Some(facts.clone());
        }
        for (family, table) in tables {
            let chains = upper_chains(family, table, &facts.ctx, &facts.node, &self.dispatch);
            // The first-level shards without a leaf now go (those that were never there
            // are no change).
            for name in first_level_chains(table) {
                if !chains.iter().any(|((_, _, chain), _)| *chain == name) {
                    changes.push((Key::Chain(family, table, name), None));
                }
            }
            for (key, rules) in chains {
                changes.push((Key::chain(key), Some(Rules::of(&rules))));
            }
        }
        changes
    }

    fn forget(&mut self, key: &ServiceKey) {
        self.file(key, None);
    }

    fn reset(&mut self) {
        *self = IptablesRender::new(self.options.clone());
    }

    fn unsupported(&self, lb: &LoadBalancing) -> Vec<(AnnotationKey, &'static str)> {
        // None of the kube-nftlb settings has a translation here yet.
        kpng_backend::unsupported::all_settings(lb)
    }
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

/// The chains of one family that hold no service's rules and depend on no dispatch: the
/// marks and the masquerading.
pub fn node_chains(family: Family, ctx: &Context) -> Vec<(ChainKey, Vec<Rule>)> {
    let key = |name| (family, Table::Nat, name);
    let mut unless_pod = ctx.from_pods(family, Target::Return);
    unless_pod.push(Rule::jump(&names::mark_masq()));
    vec![
        (
            key(names::postrouting()),
            vec![
                Rule::to(Target::Return).with(Match::Mark { not: true, bit: ctx.masq_mark }),
                Rule::to(Target::ClearMark(ctx.masq_mark)),
                Rule::to(Target::Masquerade),
            ],
        ),
        (key(names::mark_masq()), vec![Rule::to(Target::SetMark(ctx.masq_mark))]),
        (key(names::mark_drop()), vec![Rule::to(Target::SetMark(ctx.drop_mark))]),
        (key(names::masq_unless_pod()), unless_pod),
    ]
}

/// The chains of one family's table above the leaves: the entry chain (`KPNG-SERVICES`,
/// `KPNG-FILTER`), `KPNG-NODEPORTS` and the first-level shards, from the non-empty leaves
/// and the node.
pub fn upper_chains(
    family: Family,
    table: Table,
    ctx: &Context,
    node: &NodeFacts,
    dispatch: &Dispatch,
) -> Vec<(ChainKey, Vec<Rule>)> {
    let upper = dispatch.upper(family, table);
    let key = |name| (family, table, name);
    let mut chains = Vec::new();
    match table {
        Table::Nat => {
            let mut services = upper.top;
            services.extend(nodeport_guard(family, ctx, node));
            chains.push((key(names::services()), services));
        }
        Table::Filter => {
            let mut rules =
                vec![Rule::to(Target::Drop).with(Match::Mark { not: false, bit: ctx.drop_mark })];
            if localhost_nodeports(family, ctx, node) {
                // route_localnet lets packets from elsewhere reach 127.0.0.0/8: only
                // NodePort traffic (translated) may (CVE-2020-8558).
                let net = Addr::Net(loopback(family));
                rules
                    .push(Rule::to(Target::Drop).dst(net).not_src(net).with(Match::CtStateNotDnat));
            }
            rules.extend(upper.top);
            rules.extend(
                node.service_cidrs
                    .iter()
                    .filter(|n| Family::of_net(n) == family)
                    .map(|n| Rule::to(Target::Drop).dst(Addr::Net(n.trunc()))),
            );
            rules.extend(nodeport_guard(family, ctx, node));
            chains.push((key(names::filter()), rules));
        }
    }
    chains.push((key(names::nodeports()), upper.nodeports));
    chains.extend(upper.shards);
    chains
}

/// What one table of one family needs written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TablePlan {
    /// Chains to create or flush and fill, with their rules.
    pub write: BTreeMap<ChainName, Rules>,
    /// Chains to delete.
    pub delete: BTreeSet<ChainName>,
    /// Jumps from built-in chains to insert: the built-in chain and the rule.
    pub hooks: Vec<(String, String)>,
    /// Jumps from built-in chains to delete.
    pub unhooks: Vec<(String, String)>,
}

impl TablePlan {
    /// Whether nothing is to be done.
    pub fn is_empty(&self) -> bool {
        self.write.is_empty()
            && self.delete.is_empty()
            && self.hooks.is_empty()
            && self.unhooks.is_empty()
    }

    /// The rules written.
    pub fn rules_written(&self) -> usize {
        self.write.values().map(Rules::len).sum()
    }
}

/// A plan of kpng's objects as restore inputs: by family and table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restores {
    /// By family and table.
    pub tables: BTreeMap<(Family, Table), TablePlan>,
}

impl Restores {
    /// The restores that carry out `plan`.
    pub fn of(plan: &Plan<Key, Rules>) -> Restores {
        let mut restores = Restores::default();
        for (key, _, rules) in &plan.upserts {
            let table = restores.tables.entry((key.family(), key.table())).or_default();
            match key {
                Key::Chain(_, _, name) => {
                    table.write.insert(name.clone(), rules.clone());
                }
                Key::Hook(_, _, builtin, rule) => table.hooks.push((builtin.clone(), rule.clone())),
            }
        }
        for (key, _) in &plan.deletes {
            let table = restores.tables.entry((key.family(), key.table())).or_default();
            match key {
                Key::Chain(_, _, name) => {
                    table.delete.insert(name.clone());
                }
                Key::Hook(_, _, builtin, rule) => {
                    table.unhooks.push((builtin.clone(), rule.clone()))
                }
            }
        }
        restores
    }

    /// The families with something to do.
    pub fn families(&self) -> BTreeSet<Family> {
        self.tables.iter().filter(|(_, t)| !t.is_empty()).map(|((f, _), _)| *f).collect()
    }

    /// The `iptables-restore --noflush` input for `family`: for each table, declarations
    /// (create, or flush a chain to delete), jumps deleted then inserted, rules, then
    /// deletions.
    pub fn restore_text(&self, family: Family) -> String {
        self.sections(family).into_iter().map(|(_, text)| text).collect()
    }

    /// Each table's section of `family`'s input, in order, with its table.
    pub fn sections(&self, family: Family) -> Vec<(Table, String)> {
        let tables = Table::ALL.iter().filter_map(|t| Some((*t, self.tables.get(&(family, *t))?)));
        tables
            .map(|(table, plan)| (table, table_text(table, plan)))
            .filter(|(_, t)| !t.is_empty())
            .collect()
    }

    /// The inputs for `family`, in order: one when it writes at most `max_chains` chains;
    /// otherwise the written chains in batches of `max_chains`, each chain after those it
    /// jumps to (so every batch is valid on its own), then the deletions and jumps from
    /// built-in chains. iptables-restore's cost grows faster than the number of chains in
    /// one input, so a cold start over tens of thousands of chains is much faster in
    /// batches; changes after it are one input, each table's section applied whole.
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
                unhooks: plan.unhooks.clone(),
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
    for (builtin, rule) in &plan.unhooks {
        let _ = writeln!(text, "-D {builtin} {rule}");
    }
    for (builtin, rule) in &plan.hooks {
        let _ = writeln!(text, "-I {builtin} 1 {rule}");
    }
    for (chain, rules) in &plan.write {
        for rule in rules.iter() {
            let _ = writeln!(text, "-A {chain} {rule}");
        }
    }
    for chain in &plan.delete {
        let _ = writeln!(text, "-X {chain}");
    }
    text.push_str("COMMIT\n");
    text
}

/// The chain a printed rule jumps to (`-j NAME` or `-g NAME`), if any.
fn jump_target(rule: &str) -> Option<&str> {
    let mut words = rule.split_whitespace();
    while let Some(word) = words.next() {
        if word == "-j" || word == "-g" {
            return words.next();
        }
    }
    None
}

/// The chains of `write`, each after the chains of `write` it jumps to.
fn dependency_order(write: &BTreeMap<ChainName, Rules>) -> Vec<&ChainName> {
    fn visit<'a>(
        chain: &'a ChainName,
        write: &'a BTreeMap<ChainName, Rules>,
        seen: &mut BTreeSet<&'a ChainName>,
        order: &mut Vec<&'a ChainName>,
    ) {
        if !seen.insert(chain) {
            return;
        }
        // Jumps go down a few levels (dispatch, service, endpoint, mark): shallow recursion.
        for rule in write[chain].iter() {
            let target = jump_target(rule).and_then(|t| ChainName::new(t).ok());
            if let Some((target, _)) = target.and_then(|t| write.get_key_value(&t)) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(name: &str) -> Key {
        Key::Chain(Family::V4, Table::Nat, ChainName::new(name).unwrap())
    }

    #[test]
    fn restore_text_declares_unhooks_inserts_fills_then_deletes() {
        let mut plan = Plan::default();
        let hook = hooks().remove(0);
        let (builtin, rule) = (hook.builtin.to_string(), hook.rule.to_string());
        let rules = Rules::of(&[Rule::to(Target::SetMark(0x4000))]);
        plan.upserts.push((chain("KPNG-MARK-MASQ"), None, rules));
        plan.upserts.push((
            Key::Hook(Family::V4, Table::Nat, builtin, rule),
            None,
            Rules::default(),
        ));
        plan.deletes.push((chain("KPNG-MARK-DROP"), Rules::default()));
        let stale = Key::Hook(Family::V4, Table::Nat, "OUTPUT".into(), "-j KPNG-OLD".into());
        plan.deletes.push((stale, Rules::default()));
        let restores = Restores::of(&plan);
        assert_eq!(
            restores.restore_text(Family::V4),
            "*nat\n:KPNG-MARK-MASQ - [0:0]\n:KPNG-MARK-DROP - [0:0]\n-D OUTPUT -j KPNG-OLD\n-I PREROUTING 1 -m comment --comment kpng -j KPNG-SERVICES\n-A KPNG-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n-X KPNG-MARK-DROP\nCOMMIT\n"
        );
        assert_eq!(restores.restore_text(Family::V6), "");
        assert_eq!(restores.families(), BTreeSet::from([Family::V4]));
    }

    #[test]
    fn large_writes_come_in_batches_each_after_what_it_jumps_to() {
        let mut plan = Plan::default();
        let jump = |name: &str| Rule::jump(&ChainName::new(name).unwrap());
        plan.upserts.push((chain("KPNG-A"), None, Rules::of(&[jump("KPNG-B"), jump("KPNG-C")])));
        plan.upserts.push((chain("KPNG-B"), None, Rules::of(&[jump("KPNG-C")])));
        plan.upserts.push((chain("KPNG-C"), None, Rules::of(&[Rule::to(Target::Drop)])));
        plan.deletes.push((chain("KPNG-OLD"), Rules::default()));
        let restores = Restores::of(&plan);
        assert_eq!(restores.restore_texts(Family::V4, 3), vec![restores.restore_text(Family::V4)]);
        let texts = restores.restore_texts(Family::V4, 1);
        let first_lines: Vec<&str> = texts.iter().map(|t| t.lines().nth(1).unwrap()).collect();
        assert_eq!(
            first_lines,
            [":KPNG-C - [0:0]", ":KPNG-B - [0:0]", ":KPNG-A - [0:0]", ":KPNG-OLD - [0:0]"]
        );
        assert!(texts[3].ends_with("-X KPNG-OLD\nCOMMIT\n"), "{}", texts[3]);
    }

    #[test]
    fn each_table_of_each_family_is_a_group_and_rules_round_trip() {
        let groups: BTreeSet<u8> = Family::ALL
            .into_iter()
            .flat_map(|f| Table::ALL.map(|t| Key::Chain(f, t, names::filter()).group()))
            .collect();
        assert_eq!(groups.len(), 4);
        let rules = Rules::new(["-j RETURN", "-j DROP"]);
        assert_eq!(rules.iter().collect::<Vec<_>>(), ["-j RETURN", "-j DROP"]);
        assert_eq!((rules.len(), Rules::default().len()), (2, 0));
    }
}
