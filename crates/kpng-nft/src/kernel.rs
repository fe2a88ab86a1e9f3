//! The [`Kernel`] trait the backend commits through, what it reads back
//! ([`KernelContents`]), and [`NetlinkKernel`], the real kernel: every transaction is one
//! nf_tables netlink batch.

use std::collections::BTreeSet;
use std::net::IpAddr;

use kpng_model::Family;
use kpng_model::global::PersistenceKey;
use kpng_netlink::message::NETLINK_NETFILTER;
use kpng_netlink::nftables::announce::{Announcements, Touched};
use kpng_netlink::nftables::dump;
use kpng_netlink::nftables::expr::Expr;
use kpng_netlink::nftables::objects::Table;
use kpng_netlink::{Batch, NetlinkSocket};

use crate::decode;
use crate::encode::encode;
use crate::error::NftError;
use crate::objects::{ElementId, MapName, TABLE, Value, proto_family};
use crate::plan::{AllElements, Plan};
use crate::reconcile::{HookShape, Present, PresentChain, SHAPE_FLAGS, SetShape};
use crate::rules::RuleBuilder;
use kpng_backend::slots::Target;

/// Where transactions go: the kernel, a printer for `--dry-run`, or an in-memory table.
pub trait Kernel: Send {
    /// Applies one transaction atomically. On error nothing of it is in force.
    fn commit(&mut self, plan: &Plan<'_>) -> Result<(), NftError>;

    /// What kpng's tables hold now; `None` when the kernel cannot say (a dry run starts
    /// from nothing, an aggregator is told the whole state again).
    fn read(&mut self) -> Result<Option<KernelContents>, NftError>;

    /// The same, but the cluster IPs held are read first and, when `stale` says so of
    /// their number, no other set's elements are read (they are listed in
    /// [`KernelContents::unread`]): a restart over a table that holds far more services
    /// than the node state flushes those sets rather than reading what it would delete.
    /// By default everything is read.
    fn read_unless_stale(
        &mut self,
        stale: &dyn Fn(usize) -> bool,
    ) -> Result<Option<KernelContents>, NftError> {
        let _ = stale;
        self.read()
    }

    /// What kpng's tables hold, reading the elements of the sets `sets` alone (every other
    /// element set is listed in [`KernelContents::unread`]): what a verification reads
    /// when other processes' commits touched those sets. By default everything is read.
    fn read_sets_of(
        &mut self,
        sets: &BTreeSet<(Family, MapName)>,
    ) -> Result<Option<KernelContents>, NftError> {
        let _ = sets;
        self.read()
    }

    /// Replaces whatever kpng's tables held with `layout` (the tables, sets, chains and
    /// rules, planned from nothing) and `elements` (every element, in no particular
    /// order): what a kernel that [takes whole tables](Self::publishes_whole) gets at each
    /// reset. The elements come one by one from what was committed, so that the tables are
    /// not copied into a list first. By default they are sorted into one transaction after
    /// the layout, and committed.
    fn replace(&mut self, layout: &Plan<'_>, elements: AllElements<'_>) -> Result<(), NftError> {
        let mut all: Vec<(ElementId, Value)> = elements.collect();
        all.sort_unstable();
        let mut plan = layout.clone();
        plan.elements(true, &all);
        self.commit(&plan)
    }

    /// Whether every reconciliation is sent whole ([`replace`](Self::replace)) rather than
    /// as the difference from what [`read`](Self::read) found, which then only seeds the
    /// endpoints' positions; such a kernel is not verified either (an aggregator, which owns
    /// the tables).
    fn publishes_whole(&self) -> bool {
        false
    }

    /// The ruleset generation of the network namespace: every committed nf_tables
    /// transaction, anyone's, increments it by one. `None` when the kernel cannot say.
    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        Ok(None)
    }

    /// What other processes' commits after generation `known` up to `now` did to kpng's
    /// tables, as the kernel announced them; [`Touched::Unknown`] when it cannot say.
    fn touched(&mut self, known: u32, now: u32) -> Touched {
        let _ = (known, now);
        Touched::Unknown
    }

    /// Whether `ct helper` objects can be created (kube-nftlb's `helper` annotation).
    fn ct_helpers(&self) -> bool {
        true
    }
}

/// What kpng's tables hold.
#[derive(Debug, Clone, Default)]
pub struct KernelContents {
    /// Tables, sets, chains and rules.
    pub present: Present,
    /// Every element of kpng's element sets (static sets and count sets) that was read.
    pub elements: Vec<(ElementId, Value)>,
    /// Element sets whose elements were not read (see [`Kernel::read_unless_stale`]).
    pub unread: BTreeSet<(Family, MapName)>,
}

/// The address and port a slot rule DNATs to (its two immediates).
pub(crate) fn dnat_target(rule: &[Option<Expr>]) -> Option<Target> {
    let mut immediates = rule.iter().filter_map(|e| match e {
        Some(Expr::Immediate { data, .. }) => Some(data.as_slice()),
        _ => None,
    });
    let ip: IpAddr = match immediates.next()? {
        a if a.len() == 4 => <[u8; 4]>::try_from(a).ok()?.into(),
        a => <[u8; 16]>::try_from(a).ok()?.into(),
    };
    let port = immediates.next()?;
    Some((ip, u16::from_be_bytes([*port.first()?, *port.get(1)?])))
}

/// Programs the kernel of the current network namespace.
pub struct NetlinkKernel {
    socket: NetlinkSocket,
    /// What other processes commit, as the kernel announces it; not listened to during
    /// kpng's own commits. `None` when the announcements cannot be listened to.
    announcements: Option<Announcements>,
}

impl NetlinkKernel {
    /// Opens the netlink socket and checks that the kernel has every feature the table
    /// uses (one batch that creates a probe table and deletes it again).
    pub fn open() -> Result<Self, NftError> {
        let socket = NetlinkSocket::open(NETLINK_NETFILTER).map_err(NftError::Socket)?;
        let mut kernel = NetlinkKernel { socket, announcements: None };
        kernel.check_features()?;
        kernel.announcements = Announcements::open(TABLE)
            .inspect_err(|error| {
                tracing::warn!(
                    %error,
                    "cannot listen to nf_tables' announcements: every commit by another \
                     process will make the next verification read kpng's tables back"
                )
            })
            .ok();
        Ok(kernel)
    }

    /// Opens the netlink socket to read kpng's tables only: no probe, nothing written.
    pub fn reader() -> Result<Self, NftError> {
        let socket = NetlinkSocket::open(NETLINK_NETFILTER).map_err(NftError::Socket)?;
        Ok(NetlinkKernel { socket, announcements: None })
    }

    /// Bytes sent to the kernel over netlink so far.
    pub fn bytes_sent(&self) -> u64 {
        self.socket.bytes_sent()
    }

    fn check_features(&mut self) -> Result<(), NftError> {
        for family in Family::ALL {
            let (batch, features) = probe_batch(family);
            if let Err(error) = self.socket.commit(batch.finish()) {
                if error.errno() == Some(nix::errno::Errno::EPERM as i32) {
                    return Err(NftError::Permission(error));
                }
                let what = match &error {
                    kpng_netlink::NetlinkError::Rejected { what, .. } => what.clone(),
                    _ => String::new(),
                };
                let feature = features
                    .iter()
                    .find(|(_, text)| what.contains(text.as_str()))
                    .map_or("nf_tables", |(feature, _)| feature);
                return Err(NftError::MissingFeature { feature, source: error });
            }
        }
        Ok(())
    }

    /// Removes kpng's tables (both families) and nothing else; returns the families whose
    /// table existed.
    pub fn remove_tables(&mut self) -> Result<Vec<Family>, NftError> {
        self.remove_tables_named(TABLE)
    }

    /// Removes the `ip` and `ip6` tables named `name`, each in a transaction of its own;
    /// returns the families that had one.
    pub fn remove_tables_named(&mut self, name: &str) -> Result<Vec<Family>, NftError> {
        let mut removed = Vec::new();
        for family in Family::ALL {
            if !self.tables(family)?.iter().any(|t| t == name) {
                continue;
            }
            let mut batch = Batch::new(self.socket.seq());
            Table { family: proto_family(family), name }.delete(&mut batch);
            self.socket.commit(batch.finish()).map_err(NftError::Commit)?;
            removed.push(family);
        }
        Ok(removed)
    }

    fn tables(&mut self, family: Family) -> Result<Vec<String>, NftError> {
        let request = dump::tables_request(proto_family(family));
        let bodies = self.socket.dump(&request).map_err(NftError::Read)?;
        Ok(bodies.iter().filter_map(|b| dump::table_name(b)).collect())
    }

    /// Reads `family`'s table: sets (with the elements of those `read_elements` accepts;
    /// the others are listed unread), chains, rules and helpers.
    fn read_family(
        &mut self,
        family: Family,
        contents: &mut KernelContents,
        read_elements: &dyn Fn(MapName) -> bool,
    ) -> Result<(), NftError> {
        if !self.tables(family)?.iter().any(|t| t == TABLE) {
            return Ok(());
        }
        contents.present.tables.insert(family);
        let pf = proto_family(family);
        let fail = NftError::Read;
        let sets = self.socket.dump(&dump::sets_request(pf, TABLE)).map_err(fail)?;
        let mut to_read = Vec::new();
        for set in sets.iter().filter_map(|b| dump::set(b)).filter(|s| s.table == TABLE) {
            let shape = SetShape {
                flags: set.flags.unwrap_or(0) & SHAPE_FLAGS,
                key_type: set.key_type.unwrap_or(0),
                key_len: set.key_len.unwrap_or(0),
                // The kernel reports a verdict map's data length; kpng sends none.
                data: set.data.map(|(t, len)| {
                    (t, if t == kpng_netlink::nftables::objects::DATA_VERDICT { 0 } else { len })
                }),
                timeout_ms: set.timeout_ms,
            };
            contents.present.sets.insert((family, set.name.clone()), shape);
            let Some(map) = MapName::parse(&set.name) else { continue };
            match read_elements(map) {
                true => to_read.push(map),
                false => _ = contents.unread.insert((family, map)),
            }
        }
        self.read_sets(family, &to_read, &mut contents.elements)?;
        let present = &mut contents.present;
        let chains = self.socket.dump(&dump::chains_request(pf, TABLE)).map_err(NftError::Read)?;
        // Chain dumps hold every table's chains.
        for chain in chains.iter().filter_map(|b| dump::chain(b)).filter(|c| c.table == TABLE) {
            let hook = chain.hook.map(|hook| HookShape {
                kind: chain.chain_type.clone().unwrap_or_default(),
                hook: hook.num,
                priority: hook.priority,
            });
            present.chains.insert((family, chain.name), PresentChain { hook, rules: Vec::new() });
        }
        let helpers = dump::ct_helpers_request(pf, TABLE);
        for helper in self.socket.dump(&helpers).map_err(NftError::Read)? {
            if let Some(spec) = dump::ct_helper(&helper) {
                present.helpers.insert((family, spec.name.clone()), spec);
            }
        }
        let rules =
            self.socket.dump(&dump::rules_request(pf, TABLE, None)).map_err(NftError::Read)?;
        for rule in rules.iter().filter_map(|b| dump::rule(b)).filter(|r| r.table == TABLE) {
            let exprs = rule.known();
            if let Some(chain) = present.chains.get_mut(&(family, rule.chain)) {
                chain.rules.push(exprs);
            }
        }
        Ok(())
    }

    /// Appends the elements of `family`'s sets `maps` to `out`, in that order. Several sets
    /// are dumped at once, each thread on a socket of its own: the kernel walks a hash set
    /// from its start again for every 32 KiB of a dump, so reading a large set costs it
    /// time that grows with the square of the set's size, and the sets of a table of 30,000
    /// services took it a second one after another.
    fn read_sets(
        &mut self,
        family: Family,
        maps: &[MapName],
        out: &mut Vec<(ElementId, Value)>,
    ) -> Result<(), NftError> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(maps.len());
        if threads < 2 {
            return maps.iter().try_for_each(|map| read_set(&mut self.socket, family, *map, out));
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let read = |socket: &mut NetlinkSocket| -> Result<Vec<(usize, Vec<_>)>, NftError> {
            let mut sets = Vec::new();
            loop {
                let at = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(map) = maps.get(at) else { return Ok(sets) };
                let mut elements = Vec::new();
                read_set(socket, family, *map, &mut elements)?;
                sets.push((at, elements));
            }
        };
        let mut sets = std::thread::scope(|scope| {
            let helpers: Vec<_> = (1..threads)
                .map(|_| {
                    scope.spawn(|| {
                        let mut socket =
                            NetlinkSocket::open(NETLINK_NETFILTER).map_err(NftError::Socket)?;
                        read(&mut socket)
                    })
                })
                .collect();
            let mut sets = read(&mut self.socket)?;
            for helper in helpers {
                sets.extend(helper.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?);
            }
            Ok::<_, NftError>(sets)
        })?;
        sets.sort_unstable_by_key(|(at, _)| *at);
        out.extend(sets.into_iter().flat_map(|(_, elements)| elements));
        Ok(())
    }
}

/// Appends the elements of `family`'s set `map`, dumped on `socket`, to `out`.
fn read_set(
    socket: &mut NetlinkSocket,
    family: Family,
    map: MapName,
    out: &mut Vec<(ElementId, Value)>,
) -> Result<(), NftError> {
    let request = dump::elements_request(proto_family(family), TABLE, &map.name());
    for body in socket.dump(&request).map_err(NftError::Read)? {
        for element in dump::elements(&body) {
            if let Some((key, value)) = decode::element(family, map, &element) {
                out.push((ElementId { family, map, key }, value));
            }
        }
    }
    Ok(())
}

impl NetlinkKernel {
    /// Starts or stops listening to the announcements; one that fails is given up (the
    /// generations it misses are unknown, so nothing is taken on trust).
    fn listen(&mut self, on: bool) {
        let Some(announcements) = &mut self.announcements else { return };
        let result = match on {
            true => announcements.resume(),
            false => announcements.pause(),
        };
        if let Err(error) = result {
            tracing::warn!(%error, "cannot listen to nf_tables' announcements any more");
            self.announcements = None;
        }
    }
}

impl Kernel for NetlinkKernel {
    fn commit(&mut self, plan: &Plan<'_>) -> Result<(), NftError> {
        let mut batch = Batch::new(self.socket.seq());
        encode(plan, &mut batch);
        // kpng's own commits are not listened to: announcing a cold start's million
        // elements would cost the kernel as much again, and fill the socket.
        self.listen(false);
        let committed = self.socket.commit(batch.finish()).map_err(NftError::Commit);
        self.listen(true);
        committed
    }

    fn read_sets_of(
        &mut self,
        sets: &BTreeSet<(Family, MapName)>,
    ) -> Result<Option<KernelContents>, NftError> {
        let mut contents = KernelContents::default();
        for family in Family::ALL {
            self.read_family(family, &mut contents, &|map| sets.contains(&(family, map)))?;
        }
        Ok(Some(contents))
    }

    fn touched(&mut self, known: u32, now: u32) -> Touched {
        let Some(announcements) = &mut self.announcements else { return Touched::Unknown };
        announcements.touched(known, now).unwrap_or_else(|error| {
            tracing::warn!(%error, "cannot receive nf_tables' announcements");
            Touched::Unknown
        })
    }

    fn read(&mut self) -> Result<Option<KernelContents>, NftError> {
        let mut contents = KernelContents::default();
        for family in Family::ALL {
            self.read_family(family, &mut contents, &|_| true)?;
        }
        Ok(Some(contents))
    }

    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        dump::read_generation(&mut self.socket).map_err(NftError::Read)
    }

    fn read_unless_stale(
        &mut self,
        stale: &dyn Fn(usize) -> bool,
    ) -> Result<Option<KernelContents>, NftError> {
        let mut cluster_ips = Vec::new();
        for family in Family::ALL {
            if self.tables(family)?.iter().any(|t| t == TABLE) {
                read_set(&mut self.socket, family, MapName::ClusterIps, &mut cluster_ips)?;
            }
        }
        // The cluster IPs just read are not read again.
        let stale = stale(cluster_ips.len());
        let mut contents = KernelContents { elements: cluster_ips, ..KernelContents::default() };
        for family in Family::ALL {
            self.read_family(family, &mut contents, &|map| !stale && map != MapName::ClusterIps)?;
        }
        contents.unread.retain(|(_, map)| *map != MapName::ClusterIps);
        Ok(Some(contents))
    }
}

/// Kernel features the table needs, each with a rule that uses it.
fn probe_batch(family: Family) -> (Batch, Vec<(&'static str, String)>) {
    use kpng_netlink::nftables::ChainSpec;
    use kpng_netlink::nftables::objects::Hook;
    let table = Table { family: proto_family(family), name: "kpng_probe" };
    let r = || RuleBuilder::new(family);
    let features = [
        ("conntrack (nft_ct)", r().ct_state_new().jump("x")),
        ("fib lookups (nft_fib)", r().from_the_node().jump("x")),
        ("random numbers (nft_numgen)", r().one_in(2).jump("x")),
        ("NAT (nft_nat)", r().dnat_to(probe_address(family), 80)),
        ("masquerading (nft_masq)", r().masquerade()),
        ("REJECT (nft_reject)", r().reject()),
        ("dynamic sets (nft_dynset)", r().remember_source("d").jump("x")),
    ];
    let mut batch = Batch::new(0);
    table.add(&mut batch);
    let decl = crate::sets::affinity_declaration("d", family, PersistenceKey::SrcIp, 60);
    table.add_set(&mut batch, &decl.spec, 1);
    table.add_chain(&mut batch, &ChainSpec { name: "x".into(), hook: None });
    let nat = Hook { chain_type: "nat", num: 0, priority: -100 };
    let filter = Hook { chain_type: "filter", num: 1, priority: 0 };
    table.add_chain(&mut batch, &ChainSpec { name: "n".into(), hook: Some(nat) });
    table.add_chain(&mut batch, &ChainSpec { name: "f".into(), hook: Some(filter) });
    for (feature, rule) in &features {
        let chain = if feature.starts_with("REJECT") { "f" } else { "n" };
        table.add_rule(&mut batch, chain, &rule.exprs, &rule.text);
    }
    table.delete(&mut batch);
    let texts = features.into_iter().map(|(f, r)| (f, r.text)).collect();
    (batch, texts)
}

fn probe_address(family: Family) -> IpAddr {
    match family {
        Family::V4 => IpAddr::from([192, 0, 2, 1]),
        Family::V6 => IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1]),
    }
}

/// Removes kpng's tables (both families) and nothing else. Returns the tables that existed,
/// by name (`ip kpng`).
pub fn cleanup() -> Result<Vec<String>, NftError> {
    remove_tables_named(TABLE)
}

/// Removes the `ip` and `ip6` tables named `name` (kube-proxy's are `kube-proxy`) and
/// nothing else. Returns the tables that existed (`ip kube-proxy`).
pub fn remove_tables_named(name: &str) -> Result<Vec<String>, NftError> {
    let removed = NetlinkKernel::open()?.remove_tables_named(name)?;
    Ok(removed.into_iter().map(|f| format!("{} {name}", crate::objects::table_family(f))).collect())
}
