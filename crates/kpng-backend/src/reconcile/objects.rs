//! [`Objects`]: what each owner wants in the kernel, what the kernel holds, and the plan
//! between the two.
//!
//! What the kernel holds is not a copy: once a plan is committed it is, at every key, the
//! value of the claim in force, so it is read from the owners' objects. A plan records the
//! values it replaces as it is made. A failed commit is followed by a reset, which starts
//! again from what the kernel really holds ([`Objects::replace_all`]). Each key costs its
//! owner's copy of it and of its value (their packed bytes when every object of the owner
//! packs, see [`Pack`]; else the key alone when the value is the default one, as a set's
//! element's is), and a share of an entry of the index of claims, not a second copy of
//! the key: claims are filed under a 32-bit fingerprint of part of the key ([`Filed`]),
//! each owner listed once per fingerprint with the number of its keys there (one claim
//! kept inline), so a service's keys filed alike cost one entry between them.
//!
//! Each owner (the node, or a service) claims the keys of its render. Owners share a key
//! when they want the same thing (a cluster IP listed once for two services). When they
//! want different values, the claim that sorts first is in force: claims that yield (a
//! NodePort frontend on an address another service names with that port) sort after the
//! others, then owners in the order they first claimed anything, the node first. So the
//! result never depends on the order of events beyond that.
//!
//! Kept in one file on purpose: who owns an object and the plan that follows from it are
//! one algorithm.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

use kpng_model::ServiceKey;

use super::pack::{Pack, Packed, Records};
use super::plan::{Plan, Rank};

/// What one owner wants in the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted<K, V> {
    /// Every object, by key.
    pub objects: BTreeMap<K, V>,
    /// The keys among `objects` that give way to another owner's claim on the same key.
    pub yielding: BTreeSet<K>,
}

impl<K, V> Default for Wanted<K, V> {
    fn default() -> Self {
        Wanted { objects: BTreeMap::new(), yielding: BTreeSet::new() }
    }
}

impl<K: Ord, V> Wanted<K, V> {
    /// These objects, none of them yielding.
    pub fn objects(objects: impl IntoIterator<Item = (K, V)>) -> Self {
        Wanted { objects: objects.into_iter().collect(), yielding: BTreeSet::new() }
    }
}

/// Who wants objects: the node (whose claims come first), or a service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// The node's own objects.
    Node,
    /// Objects made from many services' renders ([`Render::shared`](super::Render::shared)),
    /// whose claims come after the node's and before every service's.
    Shared,
    /// A service's objects.
    Service(ServiceKey),
}

/// One owner's claim on a key, packed in 32 bits: the owner's number, and the top bit set
/// when the claim yields. Claims compare as numbers: yielding claims last, then owners by
/// number (the node is 0, shared objects 1, services in the order of their first claim).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Claim(u32);

const YIELDING: u32 = 1 << 31;

impl Claim {
    fn new(owner: u32, yielding: bool) -> Claim {
        // The highest owner number is never used: its yielding claim is [`MANY`].
        Claim(owner.min(YIELDING - 2) | if yielding { YIELDING } else { 0 })
    }

    fn owner(self) -> u32 {
        self.0 & !YIELDING
    }

    fn yielding(self) -> bool {
        self.0 & YIELDING != 0
    }
}

/// One owner's claim in a fingerprint's list, and how many of its keys of that
/// fingerprint it covers (one owner may claim many keys filed alike: it is listed once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Listed {
    claim: Claim,
    keys: u32,
}

/// Filed in place of a claim when a fingerprint has two or more: they are in
/// [`Objects::many`].
const MANY: Claim = Claim(u32::MAX);

/// How the template files a key's claims: under a hash of what [`file_under`] feeds it,
/// by default the whole key (its `Hash`).
///
/// Keys filed alike share one list of claims, in which each owner is listed once, with the
/// number of its keys there; a look-up asks each owner listed for the very key, so any
/// filing gives the right values, as long as equal keys file alike. It is a matter of
/// memory and time: an entry of the index per list, and a look-up per owner listed. A
/// backend with many keys per destination (an nftables element per set and per slot)
/// files them by destination: one entry for a service's dozen keys, and as few owners per
/// list as want one destination.
///
/// [`file_under`]: Filed::file_under
pub trait Filed: Hash {
    /// Feeds `state` what the key's claims are filed under.
    fn file_under<H: Hasher>(&self, state: &mut H) {
        self.hash(state);
    }
}

/// A key's 32-bit fingerprint, the hash of what it is filed under ([`Filed`]). Claims are
/// filed under it rather than under a copy of the key: two keys of one fingerprint share
/// a list of claims, and each resolves to the first claim whose owner wants that very key,
/// so a collision costs time, never a wrong value. Thirty-two bits keep an entry of the
/// index at 8 bytes; whole keys would collide for a few dozen pairs at 30,000 services.
fn fingerprint<K: Filed>(key: &K) -> u32 {
    let mut hasher = std::hash::DefaultHasher::new();
    key.file_under(&mut hasher);
    let hash = hasher.finish();
    (hash ^ (hash >> 32)) as u32
}

/// A hasher for keys that are fingerprints already: spreads the 32 bits over the 64 a hash
/// table reads (it takes its control bits from the top).
#[derive(Default)]
struct Fingerprints(u64);

impl std::hash::Hasher for Fingerprints {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n);
    }
}

type ByPrint<T> = HashMap<u32, T, std::hash::BuildHasherDefault<Fingerprints>>;

/// Services with more objects than this are kept whole (a service with four endpoints has
/// about a dozen, one with a hundred a few hundred).
const MOST_PACKED: usize = 1024;

/// One owner's objects as kept.
///
/// A service's objects are kept as bytes ([`Pack`]) when every one of them packs: one
/// allocation of records, a few bytes each for an element of an IPv4 set, a key found by a
/// short scan ([`Records`]). Otherwise they are kept whole, sorted by key, without a
/// tree's overhead: most objects of a set-based dataplane are set elements, whose value is
/// the default one (they carry none), kept as bare keys, the value of each being the
/// table's one default value ([`Objects::plain`]). The keys whose claims yield, which few
/// owners have, are kept apart ([`Objects::yielding`]), so as not to cost every owner an
/// empty list.
#[derive(Debug)]
enum Kept<K, V> {
    /// Every object, packed ([`Records`]).
    Packed(Box<[u8]>),
    /// Every object, whole (behind one pointer: few owners are kept so, and every owner's
    /// entry in [`Objects::wanted`] is then 16 bytes, not 32).
    Whole(Box<Whole<K, V>>),
}

/// An owner's objects kept whole.
#[derive(Debug)]
struct Whole<K, V> {
    /// The objects whose value is not the default one.
    objects: Box<[(K, V)]>,
    /// The keys whose value is the default one.
    bare: Box<[K]>,
}

/// An object as a packed key and a packed value (`None` for the default value), when both
/// pack.
fn packed<K: Pack, V: Pack + Eq>(
    key: &K,
    value: &V,
    plain: &V,
) -> Option<(Packed, Option<Packed>)> {
    let key = key.pack()?;
    if value == plain {
        return Some((key, None));
    }
    // No bytes stand for the default value.
    let value = value.pack().filter(|v| !v.as_bytes().is_empty())?;
    Some((key, Some(value)))
}

impl<K: Clone + Ord + Pack, V: Clone + Eq + Pack> Kept<K, V> {
    /// The objects of `wanted`, and the keys of its claims that yield.
    fn of(wanted: Wanted<K, V>, plain: &V) -> (Kept<K, V>, Box<[K]>) {
        let yielding = wanted.yielding.into_iter().collect();
        if wanted.objects.len() <= MOST_PACKED {
            let all: Option<Vec<_>> =
                wanted.objects.iter().map(|(k, v)| packed(k, v, plain)).collect();
            if let Some(records) = all.and_then(Records::of) {
                return (Kept::Packed(records), yielding);
            }
        }
        let (bare, objects): (Vec<_>, Vec<_>) =
            wanted.objects.into_iter().partition(|(_, v)| v == plain);
        let kept = Kept::Whole(Box::new(Whole {
            objects: objects.into_boxed_slice(),
            bare: bare.into_iter().map(|(k, _)| k).collect(),
        }));
        (kept, yielding)
    }

    /// The value at `key`, where `plain` is the default value.
    fn get<'a>(&'a self, key: &K, plain: &'a V) -> Option<Cow<'a, V>> {
        match self {
            Kept::Packed(records) => {
                let value = Records::get(records, key.pack()?.as_bytes())?;
                match value.is_empty() {
                    true => Some(Cow::Borrowed(plain)),
                    false => V::unpack(value).map(Cow::Owned),
                }
            }
            Kept::Whole(whole) => {
                let Whole { objects, bare } = &**whole;
                if let Ok(at) = objects.binary_search_by(|(k, _)| k.cmp(key)) {
                    return Some(Cow::Borrowed(&objects[at].1));
                }
                bare.binary_search(key).is_ok().then_some(Cow::Borrowed(plain))
            }
        }
    }

    /// Every key and its value, in no order.
    fn iter<'a>(&'a self, plain: &'a V) -> impl Iterator<Item = (Cow<'a, K>, Cow<'a, V>)> {
        let (records, objects, bare): (&[u8], &[(K, V)], &[K]) = match self {
            Kept::Packed(records) => (records, &[], &[]),
            Kept::Whole(whole) => (&[], &whole.objects, &whole.bare),
        };
        let records = Records::iter(records).filter_map(move |(k, v)| {
            let value = match v.is_empty() {
                true => Cow::Borrowed(plain),
                false => Cow::Owned(V::unpack(v)?),
            };
            Some((Cow::Owned(K::unpack(k.as_bytes())?), value))
        });
        let objects = objects.iter().map(|(k, v)| (Cow::Borrowed(k), Cow::Borrowed(v)));
        let bare = bare.iter().map(move |k| (Cow::Borrowed(k), Cow::Borrowed(plain)));
        records.chain(objects).chain(bare)
    }

    fn is_empty(&self) -> bool {
        match self {
            Kept::Packed(records) => Records::is_empty(records),
            Kept::Whole(whole) => whole.objects.is_empty() && whole.bare.is_empty(),
        }
    }
}

/// One owner's objects and the keys of its claims that yield.
type Claims<'a, K, V> = (&'a Kept<K, V>, &'a [K]);

/// Whether `key` is among the sorted keys `yielding`.
fn yields<K: Ord>(yielding: &[K], key: &K) -> bool {
    yielding.binary_search(key).is_ok()
}

/// What every owner wants and what the kernel holds.
#[derive(Debug)]
pub struct Objects<K, V> {
    numbers: Numbers,
    next: u32,
    /// What the node and each service want, by owner number.
    wanted: HashMap<u32, Kept<K, V>>,
    /// The keys whose claims yield, sorted, by owner number, for the owners that have any.
    yielding: ByPrint<Box<[K]>>,
    /// What [`Owner::Shared`] wants (patched a few objects at a time).
    shared: BTreeMap<K, V>,
    /// The claim on the keys of each fingerprint ([`MANY`] when it has more).
    claims: ByPrint<Claim>,
    /// How many keys the claim of a fingerprint of one claim covers, when more than one
    /// (apart: with most backends, most claims cover one key, and an entry of `claims`
    /// stays at 8 bytes).
    counts: ByPrint<u32>,
    /// The claims of the fingerprints that have two or more, in order, each once.
    many: ByPrint<Vec<Listed>>,
    /// How many keys are claimed.
    keys: usize,
    /// The default value: the value of every bare key ([`Kept::bare`]).
    plain: V,
}

/// [`Owner::Node`]'s number.
const NODE: u32 = 0;

/// [`Owner::Shared`]'s number.
const SHARED: u32 = 1;

/// The numbers of the owners that want something. The node's and the shared objects' are
/// fixed, so only services are mapped, by their key: one word, where an [`Owner`] is two
/// (a map entry of 16 bytes instead of 24, one per service).
#[derive(Debug, Default)]
struct Numbers {
    node: bool,
    shared: bool,
    services: HashMap<ServiceKey, u32>,
}

impl Numbers {
    fn get(&self, owner: &Owner) -> Option<u32> {
        match owner {
            Owner::Node => self.node.then_some(NODE),
            Owner::Shared => self.shared.then_some(SHARED),
            Owner::Service(key) => self.services.get(key).copied(),
        }
    }

    /// Records `owner`'s number `n` (the node's is [`NODE`], the shared objects' [`SHARED`]).
    fn insert(&mut self, owner: &Owner, n: u32) {
        match owner {
            Owner::Node => self.node = true,
            Owner::Shared => self.shared = true,
            Owner::Service(key) => {
                self.services.insert(key.clone(), n);
            }
        }
    }

    fn remove(&mut self, owner: &Owner) {
        match owner {
            Owner::Node => self.node = false,
            Owner::Shared => self.shared = false,
            Owner::Service(key) => {
                self.services.remove(key);
            }
        }
    }
}

impl<K, V: Default> Default for Objects<K, V> {
    fn default() -> Self {
        Objects {
            numbers: Numbers::default(),
            next: 2,
            wanted: HashMap::new(),
            yielding: ByPrint::default(),
            shared: BTreeMap::new(),
            claims: ByPrint::default(),
            counts: ByPrint::default(),
            many: ByPrint::default(),
            keys: 0,
            plain: V::default(),
        }
    }
}

/// What a change touches: the value in force before it at each key whose claims it
/// changed, and the keys no one claimed that new owners claimed first.
struct Noted<K, V> {
    /// The value in force before the change, by key.
    before: HashMap<K, Option<V>>,
    /// Keys that had no claim (none of their fingerprint) when an owner new in this change
    /// claimed them, with that owner's value: they were not held, and unless they are in
    /// `before` too (another claim came later), that value is in force. A cold start's
    /// keys are nearly all such, and planning them needs no look-up of the claims.
    fresh: Vec<(K, V)>,
    /// The first owner number given in this change: a key not in `before` whose claims
    /// are all of owners from this one on was claimed fresh.
    since: u32,
}

impl<K, V> Noted<K, V> {
    fn new(since: u32) -> Self {
        Noted { before: HashMap::new(), fresh: Vec::new(), since }
    }
}

/// An owner's new wants, or `None` when it wants nothing any more.
pub type Render<K, V> = (Owner, Option<Wanted<K, V>>);

impl<K, V> Objects<K, V>
where
    K: Clone + Ord + Filed + Rank + Pack,
    V: Clone + Eq + Default + Pack,
{
    /// Nothing wanted, nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value in force at `key`: the first claim's. Once a plan is committed, this is
    /// what the kernel holds (no copy is kept: a failed commit is followed by a reset,
    /// [`Objects::replace_all`], from what the kernel really holds).
    pub fn get(&self, key: &K) -> Option<Cow<'_, V>> {
        self.claims_of(fingerprint(key)).find_map(|claim| self.value_of(key, claim))
    }

    /// The owner whose claim is in force at `key`.
    fn winner(&self, key: &K) -> Option<u32> {
        let mut claims = self.claims_of(fingerprint(key));
        let claim = claims.find(|claim| self.value_of(key, *claim).is_some())?;
        Some(claim.owner())
    }

    /// Whether an owner other than `owner` claims `key` (filed under `print`).
    fn claimed_by_another(&self, key: &K, print: u32, owner: u32) -> bool {
        let mut others = self.claims_of(print).filter(|claim| claim.owner() != owner);
        others.any(|claim| self.value_of(key, claim).is_some())
    }

    /// How many keys are claimed.
    pub fn len(&self) -> usize {
        self.keys
    }

    /// Whether nothing is claimed.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    /// Every key and the value in force, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (Cow<'_, K>, Cow<'_, V>)> {
        let owned = self
            .wanted
            .iter()
            .flat_map(|(n, kept)| kept.iter(&self.plain).map(|(k, v)| (*n, k, v)));
        let shared = self.shared.iter().map(|(k, v)| (SHARED, Cow::Borrowed(k), Cow::Borrowed(v)));
        owned.chain(shared).filter(|(n, k, _)| self.winner(k) == Some(*n)).map(|(_, k, v)| (k, v))
    }

    /// Every key and the value in force, copied.
    pub fn to_map(&self) -> HashMap<K, V> {
        self.iter().map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
    }

    /// Objects held by the node alone: `objects` as another process left them.
    pub fn of_node(objects: HashMap<K, V>) -> Self {
        let mut held = Objects::new();
        held.claim(vec![(Owner::Node, Some(Wanted::objects(objects)))], None);
        held
    }

    /// The services that want something.
    pub fn services(&self) -> impl Iterator<Item = &ServiceKey> {
        self.numbers.services.keys()
    }

    /// Replaces what the given owners want and returns the plan that brings the kernel
    /// there. The plan counts as held from now on: a failed commit is followed by a reset
    /// ([`Objects::replace_all`]) with what the kernel really holds.
    pub fn update(&mut self, renders: Vec<Render<K, V>>) -> Plan<K, V> {
        self.update_and_patch(renders, Vec::new())
    }

    /// [`update`](Self::update), and in the same plan, the shared objects that changed
    /// (`None`: gone), claimed by [`Owner::Shared`].
    pub fn update_and_patch(
        &mut self,
        renders: Vec<Render<K, V>>,
        shared: Vec<(K, Option<V>)>,
    ) -> Plan<K, V> {
        let mut noted = Noted::new(self.next);
        self.claim(renders, Some(&mut noted));
        self.patch(shared, Some(&mut noted));
        self.plan(noted)
    }

    /// Changes some of [`Owner::Shared`]'s objects, leaving its others; records in
    /// `before` the value in force before the first change of each key it touches.
    fn patch(&mut self, changes: Vec<(K, Option<V>)>, mut before: Option<&mut Noted<K, V>>) {
        if changes.is_empty() {
            return;
        }
        let number = self.number(&Owner::Shared);
        let claim = Claim::new(number, false);
        for (key, value) in changes {
            if let Some(before) = before.as_deref_mut() {
                self.note(&key, before);
            }
            match value {
                // A new key is claimed; a new value for a claimed one keeps its claim.
                Some(value) => {
                    if self.shared.insert(key.clone(), value).is_none() {
                        self.add_claim(&key, claim);
                    }
                }
                None => {
                    if self.shared.remove(&key).is_some() {
                        self.drop_claim(&key, claim);
                    }
                }
            }
        }
    }

    /// Records the value in force at `key` before the change, unless recorded already: none
    /// for a key claimed fresh in this change ([`Noted::fresh`]).
    fn note(&self, key: &K, noted: &mut Noted<K, V>) {
        if noted.before.contains_key(key) {
            return;
        }
        // The value in force before the change: the first claim on the key of an owner
        // that was there before it. Those owners' claims on the key are as they were (the
        // key was not noted yet); owners new in this change (from `since` on) may have
        // claimed it already, or another key filed alike, without noting it.
        let mut before = self.claims_of(fingerprint(key)).filter(|c| c.owner() < noted.since);
        let value = before.find_map(|claim| self.value_of(key, claim)).map(Cow::into_owned);
        noted.before.insert(key.clone(), value);
    }

    /// The claims filed under `print`, in order.
    fn claims_of(&self, print: u32) -> impl Iterator<Item = Claim> + Clone + '_ {
        let (one, many) = match self.claims.get(&print) {
            None => (None, &[][..]),
            Some(&MANY) => (None, self.many.get(&print).map_or(&[][..], Vec::as_slice)),
            Some(claim) => (Some(*claim), &[][..]),
        };
        one.into_iter().chain(many.iter().map(|listed| listed.claim))
    }

    /// Adds `claim` on `key`.
    fn add_claim(&mut self, key: &K, claim: Claim) {
        let print = fingerprint(key);
        if !self.claimed_by_another(key, print, claim.owner()) {
            self.keys += 1;
        }
        self.list(print, claim);
    }

    /// Removes `claim` from `key`.
    fn drop_claim(&mut self, key: &K, claim: Claim) {
        let print = fingerprint(key);
        if self.unlist(print, claim) && !self.claimed_by_another(key, print, claim.owner()) {
            self.keys = self.keys.saturating_sub(1);
        }
    }

    /// Lists `claim` under `print` for one more key: in claim order, each claim once.
    fn list(&mut self, print: u32, claim: Claim) {
        let mut all = match self.claims.get(&print).copied() {
            None => {
                self.claims.insert(print, claim);
                return;
            }
            Some(MANY) => self.many.remove(&print).unwrap_or_default(),
            Some(one) if one == claim => {
                let keys = self.counts.entry(print).or_insert(1);
                *keys = keys.saturating_add(1);
                return;
            }
            Some(one) => vec![Listed { claim: one, keys: self.counts.remove(&print).unwrap_or(1) }],
        };
        match all.binary_search_by(|l| l.claim.cmp(&claim)) {
            Ok(at) => all[at].keys = all[at].keys.saturating_add(1),
            Err(at) => all.insert(at, Listed { claim, keys: 1 }),
        }
        self.claims.insert(print, MANY);
        self.many.insert(print, all);
    }

    /// Lists `claim` under `print` for one key fewer. Whether it was listed.
    fn unlist(&mut self, print: u32, claim: Claim) -> bool {
        let mut all = match self.claims.get(&print).copied() {
            None => return false,
            Some(MANY) => self.many.remove(&print).unwrap_or_default(),
            Some(one) if one != claim => return false,
            Some(_) => {
                match self.counts.remove(&print).unwrap_or(1) {
                    0 | 1 => {
                        self.claims.remove(&print);
                    }
                    2 => {}
                    keys => {
                        self.counts.insert(print, keys - 1);
                    }
                }
                return true;
            }
        };
        let found = all.binary_search_by(|l| l.claim.cmp(&claim));
        if let Ok(at) = found {
            all[at].keys = all[at].keys.saturating_sub(1);
            if all[at].keys == 0 {
                all.remove(at);
            }
        }
        match all.as_slice() {
            [] => {
                self.claims.remove(&print);
            }
            [one] => {
                self.claims.insert(print, one.claim);
                if one.keys > 1 {
                    self.counts.insert(print, one.keys);
                }
            }
            _ => {
                self.many.insert(print, all);
            }
        }
        found.is_ok()
    }

    /// Starts over from `renders` (every owner), planning nothing: for a kernel that is
    /// handed every object whole.
    pub fn claim_all(&mut self, renders: Vec<Render<K, V>>) {
        *self = Objects::default();
        self.claim(renders, None);
    }

    /// Starts over from `held` (what the kernel holds) and `renders` (every owner): the
    /// plan that leaves exactly the wanted objects.
    pub fn replace_all(&mut self, held: HashMap<K, V>, renders: Vec<Render<K, V>>) -> Plan<K, V> {
        self.claim_all(renders);
        let mut plan = Plan::default();
        for (key, old) in &held {
            self.plan_key(key, Some(old), &mut plan);
        }
        // What is wanted and not held, each key once: by the owner whose claim is in force.
        let owned = self
            .wanted
            .iter()
            .flat_map(|(n, kept)| kept.iter(&self.plain).map(move |(k, _)| (*n, k)));
        let shared = self.shared.keys().map(|k| (SHARED, Cow::Borrowed(k)));
        for (owner, key) in owned.chain(shared) {
            if !held.contains_key(&*key) && self.winner(&key) == Some(owner) {
                self.plan_key(&key, None, &mut plan);
            }
        }
        // In key order within each rank, as a repair's.
        plan.upserts.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        plan.deletes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        plan.order();
        plan
    }

    /// The plan that brings `keys` from what `held` (a read-back of the kernel) says they
    /// hold to the values in force, wanting nothing else (a drift repaired where it was
    /// found; every key, for a reset). What is wanted does not change.
    pub fn repair<'a, S: std::hash::BuildHasher>(
        &self,
        keys: impl IntoIterator<Item = Cow<'a, K>>,
        held: &HashMap<K, V, S>,
    ) -> Plan<K, V>
    where
        K: 'a,
    {
        let mut keys: Vec<Cow<K>> = keys.into_iter().collect();
        keys.sort_unstable();
        keys.dedup();
        let mut plan = Plan::default();
        for key in &keys {
            self.plan_key(key, held.get(&**key), &mut plan);
        }
        plan.order();
        plan
    }

    /// Adds to `plan` what brings `key` from `old` to the value in force.
    fn plan_key(&self, key: &K, old: Option<&V>, plan: &mut Plan<K, V>) {
        match (self.get(key), old) {
            (Some(new), Some(old)) if *new == *old => {}
            (Some(new), old) => plan.upserts.push((key.clone(), old.cloned(), new.into_owned())),
            (None, Some(old)) => plan.deletes.push((key.clone(), old.clone())),
            (None, None) => {}
        }
    }

    fn number(&mut self, owner: &Owner) -> u32 {
        if let Some(n) = self.numbers.get(owner) {
            return n;
        }
        let n = match owner {
            Owner::Node => NODE,
            Owner::Shared => SHARED,
            Owner::Service(_) => {
                self.next += 1;
                self.next - 1
            }
        };
        self.numbers.insert(owner, n);
        n
    }

    /// The value `claim`'s owner wants at `key`, if that claim is its claim on `key` (and
    /// not on another key of the same fingerprint).
    fn value_of(&self, key: &K, claim: Claim) -> Option<Cow<'_, V>> {
        match claim.owner() {
            SHARED => self.shared.get(key).filter(|_| !claim.yielding()).map(Cow::Borrowed),
            owner => {
                let value = self.wanted.get(&owner)?.get(key, &self.plain)?;
                let yielding = self.yielding.get(&owner).is_some_and(|y| yields(y, key));
                (yielding == claim.yielding()).then_some(value)
            }
        }
    }

    /// Records what `renders` want; records in `before` the value in force before the
    /// first change of each key they touch.
    fn claim(&mut self, renders: Vec<Render<K, V>>, mut before: Option<&mut Noted<K, V>>) {
        let plain = self.plain.clone();
        for (owner, new) in renders {
            if new.is_none() && self.numbers.get(&owner).is_none() {
                continue;
            }
            if owner == Owner::Shared {
                let mut changes: Vec<(K, Option<V>)> =
                    self.shared.keys().map(|k| (k.clone(), None)).collect();
                changes.extend(new.into_iter().flat_map(|w| w.objects).map(|(k, v)| (k, Some(v))));
                self.patch(changes, before.as_deref_mut());
                continue;
            }
            let number = self.number(&owner);
            let new = match (before.as_deref_mut(), new) {
                // An owner new in this change claims its keys without noting them one by
                // one when no one claimed them.
                (Some(noted), Some(new))
                    if number >= noted.since && !self.wanted.contains_key(&number) =>
                {
                    self.claim_new(&owner, number, new, noted);
                    continue;
                }
                (_, new) => new,
            };
            let (new, new_yielding) = Kept::of(new.unwrap_or_default(), &plain);
            let now = (&new, &*new_yielding);
            // A key whose value and claim the owner keeps is not touched.
            let same = |a: Claims<K, V>, b: Claims<K, V>, key: &K, value: &V| {
                b.0.get(key, &plain).as_deref() == Some(value)
                    && yields(b.1, key) == yields(a.1, key)
            };
            if let Some(before) = before.as_deref_mut() {
                // Noted while the old claims are in force.
                let old_yielding = self.yielding.get(&number).map_or(&[][..], |y| &**y);
                let was = self.wanted.get(&number).map(|kept| (kept, old_yielding));
                for (key, value) in was.iter().flat_map(|was| was.0.iter(&plain)) {
                    if was.is_some_and(|was| !same(was, now, &key, &value)) {
                        self.note(&key, before);
                    }
                }
                for (key, value) in new.iter(&plain) {
                    if !was.is_some_and(|was| same(now, was, &key, &value)) {
                        self.note(&key, before);
                    }
                }
            }
            let old_yielding = self.yielding.remove(&number).unwrap_or_default();
            let old = self.wanted.remove(&number);
            let was = old.as_ref().map(|kept| (kept, &*old_yielding));
            let claim_in = |(kept, yielding): Claims<K, V>, key: &K| {
                kept.get(key, &plain).is_some().then(|| Claim::new(number, yields(yielding, key)))
            };
            if let Some(was) = was {
                for (key, _) in was.0.iter(&plain) {
                    let claim = Claim::new(number, yields(was.1, &key));
                    if claim_in(now, &key) != Some(claim) {
                        self.drop_claim(&key, claim);
                    }
                }
            }
            for (key, _) in new.iter(&plain) {
                let claim = Claim::new(number, yields(now.1, &key));
                if was.and_then(|was| claim_in(was, &key)) != Some(claim) {
                    self.add_claim(&key, claim);
                }
            }
            self.keep(&owner, number, new, new_yielding);
        }
    }

    /// Keeps `kept` as what `owner` (numbered `number`) wants, forgetting the owner when it
    /// wants nothing.
    fn keep(&mut self, owner: &Owner, number: u32, kept: Kept<K, V>, yielding: Box<[K]>) {
        if kept.is_empty() {
            self.numbers.remove(owner);
            return;
        }
        self.wanted.insert(number, kept);
        if !yielding.is_empty() {
            self.yielding.insert(number, yielding);
        }
    }

    /// Claims `wanted` for `owner` (numbered `number`), new in this change.
    fn claim_new(
        &mut self,
        owner: &Owner,
        number: u32,
        wanted: Wanted<K, V>,
        noted: &mut Noted<K, V>,
    ) {
        for (key, value) in &wanted.objects {
            let claim = Claim::new(number, wanted.yielding.contains(key));
            let print = fingerprint(key);
            // Filed where only this owner claims (it is new, and wants each key once): no
            // one else wants the key, so it was not held.
            let alone = self.claims_of(print).all(|claim| claim.owner() == number);
            if alone {
                self.list(print, claim);
                self.keys += 1;
                noted.fresh.push((key.clone(), value.clone()));
            } else {
                self.note(key, noted);
                self.add_claim(key, claim);
            }
        }
        let (kept, yielding) = Kept::of(wanted, &self.plain);
        self.keep(owner, number, kept, yielding);
    }

    /// The plan that brings each key of `noted` from its value before the change to the
    /// value in force.
    fn plan(&self, noted: Noted<K, V>) -> Plan<K, V> {
        let mut before: Vec<(K, Option<V>)> = noted.before.into_iter().collect();
        before.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut fresh = noted.fresh;
        fresh.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        // Room for every key at once: a cold start's part (tens of thousands of keys, all
        // new) is then never copied to a larger vector, which held both copies at once.
        let room = before.len() + fresh.len();
        let mut plan = Plan { upserts: Vec::with_capacity(room), deletes: Vec::new() };
        // Both lists in key order, merged: a fresh key that was noted too is planned from
        // what was noted.
        let mut fresh = fresh.into_iter().peekable();
        for (key, old) in &before {
            while let Some((new, value)) = fresh.next_if(|(new, _)| new <= key) {
                if new != *key {
                    plan.upserts.push((new, None, value));
                }
            }
            self.plan_key(key, old.as_ref(), &mut plan);
        }
        plan.upserts.extend(fresh.map(|(key, value)| (key, None, value)));
        plan.order();
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key of two kinds: `A` objects are written before `B` ones.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    enum Key {
        B(u16),
        A(u16),
    }

    impl Filed for Key {}

    impl Rank for Key {
        fn rank(&self) -> u8 {
            match self {
                Key::A(_) => 0,
                Key::B(_) => 1,
            }
        }
    }

    /// `B` keys pack, `A` keys do not: an owner with an `A` key is kept whole.
    impl Pack for Key {
        fn pack(&self) -> Option<Packed> {
            let Key::B(n) = self else { return None };
            let mut packed = Packed::new();
            packed.put(&n.to_be_bytes()).then_some(packed)
        }

        fn unpack(bytes: &[u8]) -> Option<Self> {
            Some(Key::B(u16::from_be_bytes(bytes.try_into().ok()?)))
        }
    }

    fn svc(name: &str) -> Owner {
        Owner::Service(ServiceKey::new("test", name))
    }

    fn render(objects: &[(Key, u32)]) -> Option<Wanted<Key, u32>> {
        Some(Wanted::objects(objects.iter().copied()))
    }

    fn yielding(objects: &[(Key, u32)]) -> Option<Wanted<Key, u32>> {
        let yielding = objects.iter().map(|(k, _)| *k).collect();
        Some(Wanted { objects: objects.iter().copied().collect(), yielding })
    }

    #[test]
    fn unchanged_renders_plan_nothing() {
        let mut objects = Objects::new();
        let all = [(Key::B(80), 1), (Key::A(1), 7)];
        assert_eq!(objects.update(vec![(svc("a"), render(&all))]).len(), 2);
        assert!(objects.update(vec![(svc("a"), render(&all))]).is_empty());
        let held = objects.to_map();
        assert!(objects.replace_all(held, vec![(svc("a"), render(&all))]).is_empty());
    }

    #[test]
    fn a_shared_key_stays_while_an_owner_wants_it() {
        let mut objects = Objects::new();
        let first = objects.update(vec![(svc("a"), render(&[(Key::A(1), 0)]))]);
        assert_eq!(first.upserts, vec![(Key::A(1), None, 0)]);
        assert!(objects.update(vec![(svc("b"), render(&[(Key::A(1), 0)]))]).is_empty());
        assert!(objects.update(vec![(svc("a"), None)]).is_empty(), "b still wants it");
        assert_eq!(objects.update(vec![(svc("b"), None)]).deletes, vec![(Key::A(1), 0)]);
        assert_eq!(objects.services().count(), 0);
    }

    #[test]
    fn a_yielding_claim_gives_way_in_any_order() {
        for address_first in [true, false] {
            let mut objects = Objects::new();
            let address = (svc("z-address"), render(&[(Key::B(30080), 1)]));
            let nodeport = (svc("a-nodeport"), yielding(&[(Key::B(30080), 2)]));
            let order = match address_first {
                true => [address.clone(), nodeport.clone()],
                false => [nodeport.clone(), address.clone()],
            };
            for render in order {
                objects.update(vec![render]);
            }
            assert_eq!(objects.get(&Key::B(30080)).as_deref(), Some(&1), "{address_first}");
            let gone = objects.update(vec![(svc("z-address"), None)]);
            assert_eq!(gone.upserts, vec![(Key::B(30080), Some(1), 2)]);
            let gone = objects.update(vec![(svc("a-nodeport"), None)]);
            assert_eq!(gone.deletes, vec![(Key::B(30080), 2)]);
            assert!(objects.is_empty());
        }
    }

    #[test]
    fn the_node_wins_over_services_whatever_came_first() {
        let mut objects = Objects::new();
        objects.update(vec![(svc("a"), render(&[(Key::A(9), 1)]))]);
        let plan = objects.update(vec![(Owner::Node, render(&[(Key::A(9), 0)]))]);
        assert_eq!(plan.upserts, vec![(Key::A(9), Some(1), 0)]);
    }

    #[test]
    fn shared_objects_are_patched_beside_services_and_give_way_to_the_node() {
        let mut objects = Objects::new();
        let plan = objects.update_and_patch(
            vec![(svc("a"), render(&[(Key::A(1), 1)]))],
            vec![(Key::B(1), Some(3)), (Key::B(2), Some(4))],
        );
        assert_eq!(plan.len(), 3);
        // Patching one leaves the other; a service's claim comes after the shared one.
        let plan = objects
            .update_and_patch(vec![(svc("b"), render(&[(Key::B(2), 9)]))], vec![(Key::B(1), None)]);
        assert_eq!(plan.deletes, vec![(Key::B(1), 3)]);
        assert!(plan.upserts.is_empty(), "{plan:?}");
        assert_eq!(objects.get(&Key::B(2)).as_deref(), Some(&4));
        // The shared object goes: the service's claim is next.
        let plan = objects.update_and_patch(Vec::new(), vec![(Key::B(2), None)]);
        assert_eq!(plan.upserts, vec![(Key::B(2), Some(4), 9)]);
        let plan = objects.update(vec![(Owner::Node, render(&[(Key::B(2), 0)]))]);
        assert_eq!(plan.upserts, vec![(Key::B(2), Some(9), 0)]);
        assert_eq!(objects.services().count(), 2);
    }

    #[test]
    fn default_values_are_kept_as_bare_keys_and_still_compared() {
        let mut objects = Objects::new();
        let plan = objects.update(vec![(svc("a"), render(&[(Key::A(1), 0), (Key::A(2), 5)]))]);
        assert_eq!(plan.upserts, vec![(Key::A(1), None, 0), (Key::A(2), None, 5)]);
        let Some(Kept::Whole(whole)) = objects.wanted.values().next() else {
            panic!("keys that do not pack are kept whole")
        };
        assert_eq!((whole.bare.len(), whole.objects.len()), (1, 1), "0 is u32's default");
        assert_eq!(
            (objects.get(&Key::A(1)).as_deref(), objects.get(&Key::A(2)).as_deref()),
            (Some(&0), Some(&5))
        );
        // A value leaving the default, and one coming to it, are both changes.
        let plan = objects.update(vec![(svc("a"), render(&[(Key::A(1), 3), (Key::A(2), 0)]))]);
        assert_eq!(plan.upserts, vec![(Key::A(1), Some(0), 3), (Key::A(2), Some(5), 0)]);
        let mut all: Vec<(Key, u32)> = objects.iter().map(|(k, v)| (*k, *v)).collect();
        all.sort();
        assert_eq!(all, [(Key::A(1), 3), (Key::A(2), 0)]);
        // Another owner's bare claim on a key yields to the first claim's value.
        assert!(objects.update(vec![(svc("b"), render(&[(Key::A(1), 0)]))]).is_empty());
        let plan = objects.update(vec![(svc("a"), None)]);
        assert_eq!(plan.upserts, vec![(Key::A(1), Some(3), 0)]);
        assert_eq!(plan.deletes, vec![(Key::A(2), 0)]);
    }

    #[test]
    fn an_owners_kept_objects_take_two_words() {
        // Every owner's entry in the table of what owners want holds one.
        assert_eq!(std::mem::size_of::<Kept<Key, u32>>(), 16);
        assert_eq!(std::mem::size_of::<Kept<(u128, u128), [u64; 4]>>(), 16);
    }

    #[test]
    fn objects_that_all_pack_are_kept_as_records_and_behave_alike() {
        let mut objects = Objects::new();
        let kinds = |objects: &Objects<Key, u32>| -> Vec<&'static str> {
            let mut kinds: Vec<_> = (objects.wanted.values())
                .map(|kept| match kept {
                    Kept::Packed(_) => "packed",
                    Kept::Whole(_) => "whole",
                })
                .collect();
            kinds.sort();
            kinds
        };
        let others = (10_000..).take(MOST_PACKED + 1 - 3);
        let many: Vec<(Key, u32)> =
            [1, 2, 7].into_iter().chain(others).map(|n| (Key::B(n), 1)).collect();
        let plan = objects.update(vec![
            (svc("a"), render(&[(Key::B(1), 0), (Key::B(300), 5), (Key::B(2), 0)])),
            (svc("b"), render(&[(Key::B(7), 1), (Key::A(7), 1)])),
            (svc("c"), render(&many)),
        ]);
        assert_eq!(plan.upserts.len(), 3 + 2 + many.len() - 3, "c shares 1, 2 and 7");
        assert_eq!(kinds(&objects), ["packed", "whole", "whole"], "a packs; b has A; c is many");
        assert_eq!(objects.get(&Key::B(300)).as_deref(), Some(&5));
        assert_eq!(objects.get(&Key::B(2)).as_deref(), Some(&0), "a's claim came first");
        assert_eq!(objects.get(&Key::B(10_000)).as_deref(), Some(&1));
        assert_eq!(objects.get(&Key::B(301)).as_deref(), None);
        let a: Vec<(Key, u32)> = objects.wanted[&2].iter(&0).map(|(k, v)| (*k, *v)).collect();
        let b: Vec<(Key, u32)> = objects.wanted[&4].iter(&0).map(|(k, v)| (*k, *v)).collect();
        assert_eq!(b.len(), many.len());
        assert_eq!(a, [(Key::B(1), 0), (Key::B(2), 0), (Key::B(300), 5)], "in key bytes' order");
        // A packed owner's change, and its departure, plan as a whole one's do.
        let plan = objects.update(vec![(svc("a"), render(&[(Key::B(1), 0), (Key::B(300), 6)]))]);
        assert_eq!(plan.upserts, vec![(Key::B(2), Some(0), 1), (Key::B(300), Some(5), 6)]);
        assert!(plan.deletes.is_empty());
        let plan = objects.update(vec![(svc("a"), None)]);
        assert_eq!(plan.upserts, vec![(Key::B(1), Some(0), 1)]);
        assert_eq!(plan.deletes, vec![(Key::B(300), 6)]);
        assert_eq!(objects.to_map().len(), many.len() + 1, "c's, and b's A(7)");
    }

    #[test]
    fn writes_are_ordered_by_rank_and_deletes_reversed() {
        let mut objects = Objects::new();
        let all = [(Key::B(2), 1), (Key::A(1), 1), (Key::B(1), 1)];
        let plan = objects.update(vec![(svc("a"), render(&all))]);
        let keys: Vec<Key> = plan.upserts.iter().map(|(k, _, _)| *k).collect();
        assert_eq!(keys, [Key::A(1), Key::B(1), Key::B(2)]);
        let plan = objects.update(vec![(svc("a"), None)]);
        let keys: Vec<Key> = plan.deletes.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, [Key::B(1), Key::B(2), Key::A(1)]);
    }

    #[test]
    fn adoption_keeps_what_is_right_and_removes_the_rest() {
        let mut objects = Objects::new();
        let held = HashMap::from([(Key::A(1), 1), (Key::A(2), 1), (Key::B(1), 5)]);
        let plan =
            objects.replace_all(held, vec![(svc("a"), render(&[(Key::A(1), 1), (Key::B(1), 6)]))]);
        assert_eq!(plan.upserts, vec![(Key::B(1), Some(5), 6)]);
        assert_eq!(plan.deletes, vec![(Key::A(2), 1)]);
    }

    /// A key whose fingerprints all collide: its hash writes nothing of the key.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    struct Same(u16);

    impl std::hash::Hash for Same {
        fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
            state.write_u8(0);
        }
    }

    impl Rank for Same {}

    impl Filed for Same {}

    impl Pack for Same {
        fn pack(&self) -> Option<Packed> {
            let mut packed = Packed::new();
            packed.put(&self.0.to_be_bytes()).then_some(packed)
        }

        fn unpack(bytes: &[u8]) -> Option<Self> {
            Some(Same(u16::from_be_bytes(bytes.try_into().ok()?)))
        }
    }

    impl Rank for u64 {}

    impl Filed for u64 {}

    /// A key filed with its neighbours: keys 0 to 3 share a list of claims, 4 to 7 another...
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    struct Near(u16);

    impl Filed for Near {
        fn file_under<H: Hasher>(&self, state: &mut H) {
            (self.0 / 4).hash(state);
        }
    }

    impl Rank for Near {}

    impl Pack for Near {}

    #[test]
    fn real_fingerprint_collisions_keep_every_value() {
        // 300,000 keys of 32-bit fingerprints: about ten pairs share one.
        let mut objects: Objects<u64, u64> = Objects::new();
        let keys: Vec<u64> =
            (0..300_000u64).map(|i| i.wrapping_mul(0x2545_f491_4f6c_dd1d)).collect();
        let prints: std::collections::HashSet<u32> = keys.iter().map(fingerprint).collect();
        assert!(prints.len() < keys.len(), "the keys must collide for this test to mean anything");
        let owners = keys.chunks(4).enumerate().map(|(i, chunk)| {
            (svc(&format!("s{i}")), Some(Wanted::objects(chunk.iter().map(|k| (*k, k ^ 1)))))
        });
        objects.update(owners.collect());
        assert!(keys.iter().all(|k| objects.get(k).as_deref() == Some(&(k ^ 1))));
        // Each owner gives up its keys one owner at a time: nothing else goes with them.
        let plan = objects.update(vec![(svc("s7"), None)]);
        assert_eq!(plan.deletes.len(), 4);
        assert!(
            keys[..28]
                .iter()
                .chain(&keys[32..])
                .all(|k| objects.get(k).as_deref() == Some(&(k ^ 1)))
        );
        assert!(keys[28..32].iter().all(|k| objects.get(k).as_deref().is_none()));
    }

    #[test]
    fn keys_of_one_fingerprint_keep_their_own_claims_and_values() {
        let mut objects: Objects<Same, u32> = Objects::new();
        let wanted = |objects: &[(Same, u32)], yielding: &[Same]| {
            Some(Wanted {
                objects: objects.iter().copied().collect(),
                yielding: yielding.iter().copied().collect(),
            })
        };
        // One owner wants two keys of one fingerprint, another a third, yielding.
        objects.update(vec![(svc("a"), wanted(&[(Same(1), 10), (Same(2), 20)], &[]))]);
        objects.update(vec![(svc("b"), wanted(&[(Same(3), 30), (Same(1), 11)], &[Same(1)]))]);
        assert_eq!(objects.get(&Same(1)).as_deref(), Some(&10), "a's claim does not yield");
        assert_eq!(
            (objects.get(&Same(2)).as_deref(), objects.get(&Same(3)).as_deref()),
            (Some(&20), Some(&30))
        );
        let mut all: Vec<(Same, u32)> = objects.iter().map(|(k, v)| (*k, *v)).collect();
        all.sort();
        assert_eq!(all, [(Same(1), 10), (Same(2), 20), (Same(3), 30)]);
        // a lets go of key 1 only: b's yielding claim is in force; key 2 stays a's.
        let plan = objects.update(vec![(svc("a"), wanted(&[(Same(2), 20)], &[]))]);
        assert_eq!(plan.upserts, vec![(Same(1), Some(10), 11)]);
        assert_eq!(objects.get(&Same(2)).as_deref(), Some(&20));
        let plan = objects.update(vec![(svc("b"), None)]);
        assert_eq!(plan.deletes, vec![(Same(1), 11), (Same(3), 30)]);
        assert_eq!(objects.iter().count(), 1);
        let plan = objects.update(vec![(svc("a"), None)]);
        assert_eq!(plan.deletes, vec![(Same(2), 20)]);
        assert!(objects.is_empty());
    }

    /// One change: per owner, its objects (`None`: it wants nothing) and which of them
    /// yield, as small numbers so that owners often want the same keys.
    type Batch = Vec<(u8, Option<Vec<(u16, u32)>>, Vec<u16>)>;

    fn batches() -> impl proptest::strategy::Strategy<Value = Vec<Batch>> {
        let objects = proptest::option::of(proptest::collection::vec((0u16..10, 0u32..3), 0..5));
        let render = (0u8..5, objects, proptest::collection::vec(0u16..10, 0..2));
        proptest::collection::vec(proptest::collection::vec(render, 1..4), 1..8)
    }

    /// Applies every batch, checking that each plan starts from what the kernel holds and
    /// ends where the claims in force say.
    fn plans_match_a_kernel<K>(batches: Vec<Batch>, key: impl Fn(u16) -> K)
    where
        K: Clone + Ord + Filed + Rank + Pack + std::fmt::Debug,
    {
        let mut objects: Objects<K, u32> = Objects::new();
        let mut kernel: HashMap<K, u32> = HashMap::new();
        for batch in batches {
            let renders = batch
                .into_iter()
                .map(|(owner, wanted, yielding)| {
                    let wanted = wanted.map(|objects| {
                        let objects: BTreeMap<K, u32> =
                            objects.into_iter().map(|(k, v)| (key(k), v)).collect();
                        let yielding = yielding
                            .iter()
                            .map(|k| key(*k))
                            .filter(|k| objects.contains_key(k))
                            .collect();
                        Wanted { objects, yielding }
                    });
                    (svc(&format!("s{owner}")), wanted)
                })
                .collect();
            let plan = objects.update(renders);
            for (k, old, _) in &plan.upserts {
                assert_eq!(kernel.get(k), old.as_ref(), "upsert of {k:?}");
            }
            for (k, old) in &plan.deletes {
                assert_eq!(kernel.get(k), Some(old), "delete of {k:?}");
            }
            plan.apply_to(&mut kernel, None);
            assert_eq!(kernel, objects.to_map());
            assert_eq!(objects.len(), kernel.len(), "the keys claimed");
        }
    }

    proptest::proptest! {
        #[test]
        fn plans_of_changes_with_new_owners_match_a_kernel(batches in batches()) {
            // Keys below 5 are kept whole, the others packed.
            plans_match_a_kernel(batches.clone(), |k| if k < 5 { Key::A(k) } else { Key::B(k) });
            // Keys filed by fours, kept whole.
            plans_match_a_kernel(batches.clone(), Near);
            // Every key of one fingerprint.
            plans_match_a_kernel(batches, Same);
        }
    }
}
