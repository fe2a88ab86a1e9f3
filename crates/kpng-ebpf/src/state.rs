//! What the maps hold, what each service wants, and the writes between the two.
//!
//! Each service claims the keys of its render. Services share a key when they want the
//! same thing (a cluster IP listed once for two services); the ENLS leaves them no
//! contested address (an address and port two services name is held by one, the other's
//! port lists it as yielded) and no contested NodePort. What remains is a NodePort
//! frontend on an address where another service has an external or load-balancer IP
//! with that port: as in nftables, which matches NodePorts last, the address frontend is
//! in force, whatever the order of events, and when it goes the NodePort's takes over.
//! A [`Batch`] lists upserts in the order that keeps every
//! reader consistent (endpoints before the counts that reveal them, groups before the
//! frontends that point at them) and deletions in the reverse order.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kpng_model::ServiceKey;

use crate::maps::{Key, MapName, Value};

/// What one service wants in the maps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wanted {
    /// Every element, by key.
    pub elements: BTreeMap<Key, Value>,
    /// The keys among `elements` that give way to another service's claim on the same key
    /// (NodePort frontends, see [`crate::render::Rendered::nodeports`]).
    pub yielding: BTreeSet<Key>,
}

impl Wanted {
    /// The service's elements, none of them yielding.
    pub fn elements(elements: BTreeMap<Key, Value>) -> Wanted {
        Wanted { elements, yielding: BTreeSet::new() }
    }
}

/// One service's claim on a key: yielding claims sort after the others, then by the order
/// in which services first claimed anything. Only claims with equal values can tie (see
/// the module docs), so that order never decides a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Claim {
    /// The service gives way on this key (fields compare in order: yielding claims last).
    yielding: bool,
    /// The claiming service's number, in order of first claim.
    owner: u32,
}

/// Map writes, in the order they must be made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Elements to create or replace, ordered by [`MapName::ALL`].
    pub upserts: Vec<(Key, Value)>,
    /// Elements to delete, after the upserts, in the reverse map order.
    pub deletes: Vec<Key>,
}

impl Batch {
    /// Whether the batch writes nothing.
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.deletes.is_empty()
    }

    /// The number of element writes (upserts and deletions).
    pub fn len(&self) -> usize {
        self.upserts.len() + self.deletes.len()
    }
}

fn map_rank(key: &Key) -> usize {
    MapName::ALL.iter().position(|m| *m == key.map()).unwrap_or(0)
}

/// Wanted and held elements.
#[derive(Debug, Default)]
pub struct MapState {
    owners: HashMap<ServiceKey, u32>,
    next_owner: u32,
    wanted: HashMap<u32, Wanted>,
    claims: HashMap<Key, Vec<Claim>>,
    held: HashMap<Key, Value>,
    /// Elements held per map, kept as `held` changes (a change set must not count them).
    counts: BTreeMap<MapName, usize>,
}

/// A service's wants, or `None` when it is gone.
pub type Render = (ServiceKey, Option<Wanted>);

impl MapState {
    /// An empty state: nothing wanted, nothing held.
    pub fn new() -> Self {
        MapState::default()
    }

    /// Forgets what services want and takes `held` as what the maps hold (a restart reads
    /// them back; a reset after a failure too).
    pub fn adopt(&mut self, held: HashMap<Key, Value>) {
        let mut counts = BTreeMap::new();
        for key in held.keys() {
            *counts.entry(key.map()).or_default() += 1;
        }
        *self = MapState { held, counts, ..MapState::default() };
    }

    /// What the maps hold.
    pub fn held(&self) -> &HashMap<Key, Value> {
        &self.held
    }

    /// The value the maps hold at `key`.
    pub fn held_value(&self, key: &Key) -> Option<Value> {
        self.held.get(key).copied()
    }

    /// Elements held per map.
    pub fn held_counts(&self) -> BTreeMap<MapName, usize> {
        MapName::ALL.iter().map(|m| (*m, self.counts.get(m).copied().unwrap_or(0))).collect()
    }

    /// Every element some service wants, with the value in force.
    pub fn wanted(&self) -> HashMap<Key, Value> {
        self.claims
            .iter()
            .filter_map(|(key, claims)| Some((*key, self.value_of(key, claims.first()?)?)))
            .collect()
    }

    /// The services the state knows.
    pub fn services(&self) -> impl Iterator<Item = &ServiceKey> {
        self.owners.keys()
    }

    fn value_of(&self, key: &Key, claim: &Claim) -> Option<Value> {
        self.wanted.get(&claim.owner)?.elements.get(key).copied()
    }

    /// Replaces what the given services want (`None`: the service is gone) and returns the
    /// writes that bring the maps there. The writes count as held from now on: call
    /// [`MapState::adopt`] with what the maps really hold when they fail.
    pub fn update(&mut self, renders: Vec<Render>) -> Batch {
        let affected = self.claim(renders);
        self.diff(affected)
    }

    /// Starts over from `held` (what the maps hold, read back at a reset or a restart) and
    /// `renders` (every service): the writes that leave exactly the wanted elements.
    pub fn replace_all(&mut self, held: HashMap<Key, Value>, renders: Vec<Render>) -> Batch {
        self.adopt(held);
        self.claim(renders);
        let keys: BTreeSet<Key> = self.held.keys().chain(self.claims.keys()).copied().collect();
        self.diff(keys)
    }

    /// Records what `renders` want; returns the keys whose value may have changed.
    fn claim(&mut self, renders: Vec<Render>) -> BTreeSet<Key> {
        let mut affected: BTreeSet<Key> = BTreeSet::new();
        for (service, new) in renders {
            let owner = match (self.owners.get(&service), &new) {
                (Some(o), _) => *o,
                (None, None) => continue,
                (None, Some(_)) => {
                    let o = self.next_owner;
                    self.next_owner += 1;
                    self.owners.insert(service.clone(), o);
                    o
                }
            };
            let old = self.wanted.remove(&owner).unwrap_or_default();
            let new = new.unwrap_or_default();
            let claim_of = |wanted: &Wanted, key: &Key| Claim {
                yielding: wanted.yielding.contains(key),
                owner,
            };
            for key in old.elements.keys() {
                let before = claim_of(&old, key);
                let kept = new.elements.get(key).is_some_and(|_| claim_of(&new, key) == before);
                if kept {
                    continue;
                }
                if let Some(claims) = self.claims.get_mut(key) {
                    claims.retain(|c| *c != before);
                    if claims.is_empty() {
                        self.claims.remove(key);
                    }
                }
                affected.insert(*key);
            }
            for (key, value) in &new.elements {
                let claim = claim_of(&new, key);
                let claims = self.claims.entry(*key).or_default();
                if let Err(at) = claims.binary_search(&claim) {
                    claims.insert(at, claim);
                    affected.insert(*key);
                } else if old.elements.get(key) != Some(value) {
                    affected.insert(*key);
                }
            }
            if new.elements.is_empty() {
                self.owners.remove(&service);
            } else {
                self.wanted.insert(owner, new);
            }
        }
        affected
    }

    fn diff(&mut self, keys: BTreeSet<Key>) -> Batch {
        let mut batch = Batch::default();
        for key in keys {
            let wanted = self.claims.get(&key).and_then(|c| self.value_of(&key, c.first()?));
            match (wanted, self.held.get(&key)) {
                (Some(value), Some(held)) if value == *held => {}
                (Some(value), _) => {
                    if self.held.insert(key, value).is_none() {
                        *self.counts.entry(key.map()).or_default() += 1;
                    }
                    batch.upserts.push((key, value));
                }
                (None, Some(_)) => {
                    self.held.remove(&key);
                    if let Some(n) = self.counts.get_mut(&key.map()) {
                        *n = n.saturating_sub(1);
                    }
                    batch.deletes.push(key);
                }
                (None, None) => {}
            }
        }
        batch.upserts.sort_by_key(|(k, _)| map_rank(k));
        batch.deletes.sort_by_key(|k| std::cmp::Reverse(map_rank(k)));
        batch
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use kpng_model::Protocol;

    use super::*;
    use crate::maps::{Empty, Frontend, GroupId};

    fn svc(name: &str) -> ServiceKey {
        ServiceKey::new("test", name)
    }

    fn frontend(port: u16) -> Key {
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        Key::Frontend(Frontend { ip, protocol: Protocol::Tcp, port })
    }

    fn points_at(group: u64) -> Value {
        Value::Frontend { group: GroupId(group), empty: Empty::Reject, flow_seconds: 0 }
    }

    fn render(elements: &[(Key, Value)]) -> Option<Wanted> {
        Some(Wanted::elements(elements.iter().copied().collect()))
    }

    /// A render whose frontends are NodePort frontends only.
    fn nodeports(elements: &[(Key, Value)]) -> Option<Wanted> {
        let yielding = elements.iter().map(|(k, _)| *k).collect();
        Some(Wanted { elements: elements.iter().copied().collect(), yielding })
    }

    #[test]
    fn unchanged_renders_write_nothing() {
        let mut state = MapState::new();
        let elements = [(frontend(80), points_at(1)), (Key::Group(GroupId(1)), Value::Present)];
        let first = state.update(vec![(svc("a"), render(&elements))]);
        assert_eq!(first.len(), 2);
        assert!(state.update(vec![(svc("a"), render(&elements))]).is_empty());
        let held = state.held().clone();
        assert!(state.replace_all(held, vec![(svc("a"), render(&elements))]).is_empty());
    }

    #[test]
    fn a_shared_key_stays_while_a_service_wants_it() {
        let mut state = MapState::new();
        let ip = Key::ClusterIp("10.96.0.1".parse().unwrap());
        let first = state.update(vec![(svc("a"), render(&[(ip, Value::Present)]))]);
        assert_eq!(first.upserts, vec![(ip, Value::Present)]);
        assert!(state.update(vec![(svc("b"), render(&[(ip, Value::Present)]))]).is_empty());
        assert!(state.update(vec![(svc("a"), None)]).is_empty(), "b still wants it");
        assert_eq!(state.update(vec![(svc("b"), None)]).deletes, vec![ip]);
    }

    #[test]
    fn a_nodeport_frontend_gives_way_to_an_address_frontend_in_any_order() {
        for address_first in [true, false] {
            let mut state = MapState::new();
            let address = (svc("z-external"), render(&[(frontend(30080), points_at(1))]));
            let nodeport = (svc("a-nodeport"), nodeports(&[(frontend(30080), points_at(2))]));
            let order = match address_first {
                true => vec![address.clone(), nodeport.clone()],
                false => vec![nodeport.clone(), address.clone()],
            };
            for render in order {
                state.update(vec![render]);
            }
            assert_eq!(state.held_value(&frontend(30080)), Some(points_at(1)), "{address_first}");
            // The address goes: the NodePort takes over; then it goes too.
            let gone = state.update(vec![(svc("z-external"), None)]);
            assert_eq!(gone.upserts, vec![(frontend(30080), points_at(2))]);
            let gone = state.update(vec![(svc("a-nodeport"), None)]);
            assert_eq!(gone.deletes, vec![frontend(30080)]);
            assert!(state.held().is_empty());
            assert!(state.held_counts().values().all(|n| *n == 0));
        }
    }

    #[test]
    fn writes_are_ordered_for_readers() {
        let mut state = MapState::new();
        let g = GroupId(7);
        let target = ("10.244.0.1".parse().unwrap(), 80);
        let all = [
            (frontend(80), points_at(7)),
            (Key::Group(g), Value::Group { count: 1, affinity_seconds: 0 }),
            (Key::Backend(g, 0), Value::Backend(target)),
        ];
        let batch = state.update(vec![(svc("a"), render(&all))]);
        let maps: Vec<MapName> = batch.upserts.iter().map(|(k, _)| k.map()).collect();
        assert_eq!(maps, [MapName::Backends, MapName::Groups, MapName::Frontends]);
        let batch = state.update(vec![(svc("a"), None)]);
        let maps: Vec<MapName> = batch.deletes.iter().map(Key::map).collect();
        assert_eq!(maps, [MapName::Frontends, MapName::Groups, MapName::Backends]);
    }

    #[test]
    fn adoption_keeps_what_is_right_and_removes_the_rest() {
        let mut state = MapState::new();
        let stale = frontend(81);
        let held = HashMap::from([(frontend(80), points_at(1)), (stale, points_at(1))]);
        let batch =
            state.replace_all(held, vec![(svc("a"), render(&[(frontend(80), points_at(1))]))]);
        assert!(batch.upserts.is_empty());
        assert_eq!(batch.deletes, vec![stale]);
    }
}
