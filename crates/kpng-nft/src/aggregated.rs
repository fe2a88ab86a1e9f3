//! [`AggregatorKernel`]: kpng's tables published to an nftables aggregator (`kpng
//! aggregate`, package `aggregatorv1`) instead of programmed through netlink. The
//! aggregator owns the node's nftables and commits every producer's changes in one
//! transaction per batch; this kernel is one producer.
//!
//! Each transaction becomes one publication holding only what it changes: elements added
//! and removed, sets and chains created or deleted, the rules of the chains it touches.
//! The publication is acknowledged once the aggregator has committed it, so a commit here
//! is as synchronous as a netlink transaction. At start-up and after a failure the kernel
//! publishes the tables whole ([`Kernel::publishes_whole`]): their layout as a transaction
//! planned from nothing, and every element as it is read from what the backend committed,
//! its text going straight into its set ([`translate_whole`]); the aggregator changes only
//! what differs from what it committed before. At start-up, what the node's kernel holds
//! of kpng's tables is still read, to keep each endpoint in its position (ClientIP affinity
//! clients keep their endpoints across a restart); the resets after a failure take the
//! positions from what was published
//! ([`reads_only_positions`](kpng_backend::reconcile::Kernel::reads_only_positions)).
//! `ct helper` objects are not part of the aggregator's model: the `helper` annotation is
//! reported as not enforced.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc;
use std::time::Duration;

use kpng_aggregator_client::client::Publisher;
use kpng_aggregator_client::{
    Chain, Family as TableFamily, Publication, Set, SetKind, State, TableKey,
};
use kpng_aggregator_client::{Table, Update};
use kpng_api::{Address, Security};
use kpng_model::Family;

use crate::error::NftError;
use crate::kernel::{Kernel, KernelContents, NetlinkKernel};
use crate::objects::{MapName, TABLE};
use crate::plan::{AllElements, Command, Plan};
use crate::text::element_text;

/// How long a publication may wait for its acknowledgement.
const ACK_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a whole publication may wait for its acknowledgement: the aggregator commits
/// it through libnftables, which at 100,000 services parses 1.8 million elements for about
/// a minute; a shorter wait would give up just before the commit lands, and send the
/// whole state again.
const WHOLE_ACK_TIMEOUT: Duration = Duration::from_secs(300);

/// Where and as whom to publish.
#[derive(Debug, Clone)]
pub struct AggregatorTarget {
    /// The aggregator's address.
    pub address: Address,
    /// The connection's security.
    pub security: Security,
    /// The producer's name.
    pub producer: String,
}

/// A kernel reached through an nftables aggregator.
pub struct AggregatorKernel {
    /// kpng's tables as last published (nft text), without the sets' elements: what the
    /// next publications build on ([`translate`]).
    state: State,
    /// The revision of the last publication.
    revision: u64,
    requests: mpsc::Sender<Request>,
}

/// A publication for the client's thread, and where its outcome goes.
struct Request {
    publication: Publication,
    reply: mpsc::Sender<Result<(), String>>,
}

impl AggregatorKernel {
    /// A kernel publishing to `target`; it connects on its first transaction, and again
    /// after the stream broke.
    pub fn new(target: AggregatorTarget) -> Result<Self, NftError> {
        let (requests, receiver) = mpsc::channel();
        std::thread::Builder::new()
            .name("kpng-aggregator-client".into())
            .spawn(move || serve_requests(target, receiver))
            .map_err(|e| NftError::Aggregator(format!("starting the publishing thread: {e}")))?;
        Ok(AggregatorKernel { state: State::default(), revision: 0, requests })
    }

    fn publish(&mut self, updates: Vec<Update>) -> Result<(), NftError> {
        self.revision += 1;
        let (reply, outcome) = mpsc::channel();
        let publication = Publication { revision: self.revision, updates };
        let request = Request { publication, reply };
        let gone = || NftError::Aggregator("the publishing thread ended".into());
        self.requests.send(request).map_err(|_| gone())?;
        outcome.recv().map_err(|_| gone())?.map_err(NftError::Aggregator)
    }
}

impl Kernel for AggregatorKernel {
    fn commit(&mut self, plan: &Plan<'_>) -> Result<(), NftError> {
        // After a failure the backend resyncs, which replaces the state whole: what this
        // one holds meanwhile does not matter.
        let updates = translate(&mut self.state, plan)?;
        if updates.is_empty() {
            return Ok(());
        }
        self.publish(updates)
    }

    fn replace(&mut self, layout: &Plan<'_>, elements: AllElements<'_>) -> Result<(), NftError> {
        let (whole, layout) = translate_whole(layout, elements)?;
        self.state = layout;
        self.publish(vec![Update::Whole(whole)])
    }

    /// What this network namespace's kernel holds of kpng's tables (what the aggregator
    /// committed, when it programs this namespace), read over netlink: it seeds the
    /// endpoints' positions of the whole publication that follows (at start-up only: later
    /// resets take them from what was published). Nothing when it cannot be read.
    fn read(&mut self) -> Result<Option<KernelContents>, NftError> {
        let read = NetlinkKernel::reader().and_then(|mut kernel| kernel.read());
        match read {
            Ok(contents) => Ok(contents),
            Err(error) => {
                tracing::debug!(%error, "nftables: kpng's tables cannot be read here; endpoints get new positions");
                Ok(None)
            }
        }
    }

    fn publishes_whole(&self) -> bool {
        true
    }

    fn ct_helpers(&self) -> bool {
        false
    }
}

/// The client's thread: one stream at a time, opened by a whole publication. A broken or
/// silent stream is dropped, and the backend's next transaction (a whole one, as after any
/// failure) opens another.
fn serve_requests(target: AggregatorTarget, requests: mpsc::Receiver<Request>) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            for request in requests {
                let _ = request.reply.send(Err(format!("starting a runtime: {error}")));
            }
            return;
        }
    };
    let mut stream: Option<Publisher> = None;
    for Request { publication, reply } in requests {
        let whole = matches!(publication.updates.first(), Some(Update::Whole(_)));
        let revision = publication.revision;
        let outcome = runtime.block_on(async {
            // A whole publication goes on the open stream too: a new connection under the
            // same name would be refused while the aggregator still holds the old one.
            let sent = match stream.take() {
                Some(publisher) => publisher.publish(publication).await.map(|()| publisher),
                None if whole => {
                    Publisher::connect(
                        &target.address,
                        &target.security,
                        &target.producer,
                        publication,
                    )
                    .await
                }
                None => {
                    return Err(
                        "not connected to the aggregator; the tables are published whole next"
                            .to_string(),
                    );
                }
            };
            let mut publisher =
                sent.map_err(|e| format!("publishing to {}: {e}", target.address))?;
            let timeout = if whole { WHOLE_ACK_TIMEOUT } else { ACK_TIMEOUT };
            let acked = tokio::time::timeout(timeout, publisher.wait_for(revision));
            let answer = match acked.await {
                Err(_) => {
                    return Err(format!("no answer from the aggregator within {timeout:?}"));
                }
                Ok(Err(e)) => return Err(format!("publishing to {}: {e}", target.address)),
                Ok(Ok(answer)) => answer,
            };
            // A refused revision leaves the producer's committed state as it was and the
            // stream open; the backend publishes its tables whole next.
            stream = Some(publisher);
            answer.map(drop).map_err(|rejection| {
                format!(
                    "the aggregator refused revision {} at {}: {}",
                    rejection.revision, rejection.object, rejection.message
                )
            })
        });
        let _ = reply.send(outcome);
    }
}

/// Applies `plan` to `state` (nft text), returning the updates that publish the change.
/// Rules are published per chain touched, after everything else: the aggregator applies
/// updates to its model in order and orders the kernel's commands itself.
///
/// `state` keeps the tables' layout (sets' declarations, chains' rules) and none of the
/// sets' elements: a change's elements are published as they are added or removed, and a
/// set is only ever published whole empty (created or flushed), so their text would be a
/// copy of every element (half a million strings at 30,000 services) that nothing reads.
pub fn translate(state: &mut State, plan: &Plan<'_>) -> Result<Vec<Update>, NftError> {
    let mut updates = Vec::new();
    let mut touched: BTreeSet<(TableKey, String)> = BTreeSet::new();
    for (family, command) in &plan.commands {
        let key = table_key(*family);
        let existed = state.tables.contains_key(&key);
        if !existed && !matches!(command, Command::AddTable) {
            return Err(NftError::Aggregator(format!(
                "the plan uses table {key} before adding it"
            )));
        }
        let table = state.tables.entry(key.clone()).or_default();
        match command {
            Command::AddTable => {
                if !existed {
                    updates.push(Update::PutTable { table: key, content: Table::default() });
                }
            }
            Command::AddSet(decl) => {
                let name = decl.spec.name.clone();
                if !table.sets.contains_key(&name) {
                    let kind = if decl.is_map() { SetKind::Map } else { SetKind::Set };
                    let set = Set::new(kind, &decl.text, std::iter::empty::<&str>());
                    table.sets.insert(name.clone(), set.clone());
                    updates.push(Update::PutSet { table: key, name, set });
                }
            }
            Command::FlushSet(name) => {
                // The layout's sets hold no elements: published as it is, the set is empty.
                let set = table.sets.get(name).ok_or_else(|| missing(&key, "set", name))?;
                updates.push(Update::PutSet { table: key, name: name.clone(), set: set.clone() });
            }
            Command::DeleteSet(name) => {
                table.sets.remove(name);
                updates.push(Update::DeleteSet { table: key, name: name.clone() });
            }
            Command::AddCtHelper(spec) => {
                return Err(NftError::Aggregator(format!(
                    "ct helper {} cannot be published: the aggregator's tables hold chains and sets only",
                    spec.name
                )));
            }
            Command::DeleteCtHelper(_) => {}
            Command::AddChain(spec) => {
                if !table.chains.contains_key(&spec.name) {
                    let declaration = spec.hook.as_ref().map(|h| h.declaration());
                    let chain = Chain::new(declaration.as_deref(), std::iter::empty::<&str>());
                    table.chains.insert(spec.name.clone(), chain.clone());
                    updates.push(Update::PutChain { table: key, name: spec.name.clone(), chain });
                }
            }
            Command::FlushChain(name) => {
                let chain =
                    table.chains.get_mut(name).ok_or_else(|| missing(&key, "chain", name))?;
                chain.rules.clear();
                touched.insert((key, name.clone()));
            }
            Command::DeleteChain(name) => {
                table.chains.remove(name);
                touched.remove(&(key.clone(), name.clone()));
                updates.push(Update::DeleteChain { table: key, name: name.clone() });
            }
            Command::AddRule { chain, rule } => {
                let found =
                    table.chains.get_mut(chain).ok_or_else(|| missing(&key, "chain", chain))?;
                found.rules.push(kpng_aggregator_client::model::collapse(&rule.text));
                touched.insert((key, chain.clone()));
            }
            Command::Elements { add, map, elements } => {
                let name = map.name().into_owned();
                if !table.sets.contains_key(&name) {
                    return Err(missing(&key, "set", &name));
                }
                let texts: Vec<String> =
                    elements.iter().map(|(id, value)| element_text(&id.key, value)).collect();
                if *add {
                    updates.push(Update::AddElements { table: key, set: name, elements: texts });
                } else {
                    updates.push(Update::RemoveElements { table: key, set: name, elements: texts });
                }
            }
        }
    }
    for (key, name) in touched {
        if let Some(chain) = state.tables.get(&key).and_then(|t| t.chains.get(&name)) {
            updates.push(Update::ReplaceRules {
                table: key,
                chain: name,
                rules: chain.rules.clone(),
            });
        }
    }
    Ok(updates)
}

/// kpng's tables whole, `layout` (planned from nothing) and `elements`, as one whole
/// publication, and the layout [`translate`] goes on from. The layout is the plan's updates
/// applied in order to nothing, as the aggregator would apply them one by one; each
/// element's text goes straight into its set, so that the elements are held once, as text,
/// while the publication is made.
pub fn translate_whole(
    layout: &Plan<'_>,
    elements: AllElements<'_>,
) -> Result<(State, State), NftError> {
    let mut translated = State::default();
    let updates = translate(&mut translated, layout)?;
    let mut whole = State::default();
    for update in updates {
        let applied = whole.apply(update);
        applied.map_err(|e| NftError::Aggregator(format!("publishing the tables whole: {e}")))?;
    }
    let mut texts: BTreeMap<(Family, MapName), BTreeSet<String>> = BTreeMap::new();
    for (id, value) in elements {
        texts.entry((id.family, id.map)).or_default().insert(element_text(&id.key, &value));
    }
    for ((family, map), elements) in texts {
        let table = table_key(family);
        let name = map.name();
        let found = whole.tables.get_mut(&table).and_then(|t| t.sets.get_mut(&*name));
        let found = found.ok_or_else(|| missing(&table, "set", &name))?;
        match found.elements.is_empty() {
            true => found.elements = elements,
            false => found.elements.extend(elements),
        }
    }
    Ok((whole, translated))
}

/// kpng's table of `family`.
fn table_key(family: Family) -> TableKey {
    let family = match family {
        Family::V4 => TableFamily::Ip,
        Family::V6 => TableFamily::Ip6,
    };
    TableKey::new(family, TABLE)
}

fn missing(table: &TableKey, kind: &str, name: &str) -> NftError {
    NftError::Aggregator(format!(
        "the plan changes {kind} {name} of table {table}, which it never added"
    ))
}
