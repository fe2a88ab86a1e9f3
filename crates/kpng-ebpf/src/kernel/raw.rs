//! Byte-level access to the maps, one typed aya view per key and value size.

use aya::maps::{HashMap as BpfHashMap, Map, MapData};

use super::boxed;
use crate::maps::{self, MapName};

type Failure = Box<dyn std::error::Error + Send + Sync>;

fn view<const K: usize, const V: usize>(
    map: &mut Map,
) -> Result<BpfHashMap<&mut MapData, [u8; K], [u8; V]>, Failure> {
    BpfHashMap::try_from(map).map_err(boxed)
}

fn put<const K: usize, const V: usize>(
    map: &mut Map,
    key: &[u8],
    value: &[u8],
) -> Result<(), Failure> {
    let key: [u8; K] = key.try_into()?;
    let value: [u8; V] = value.try_into()?;
    view::<K, V>(map)?.insert(key, value, 0).map_err(boxed)
}

fn del<const K: usize, const V: usize>(map: &mut Map, key: &[u8]) -> Result<(), Failure> {
    let key: [u8; K] = key.try_into()?;
    view::<K, V>(map)?.remove(&key).map_err(boxed)
}

fn all<const K: usize, const V: usize>(map: &mut Map) -> Result<Vec<maps::RawElement>, Failure> {
    let view = view::<K, V>(map)?;
    let mut out = Vec::new();
    for item in view.iter() {
        let (k, v) = item.map_err(boxed)?;
        out.push((k.to_vec(), v.to_vec()));
    }
    Ok(out)
}

/// Creates or replaces one element.
pub fn insert(name: MapName, map: &mut Map, key: &[u8], value: &[u8]) -> Result<(), Failure> {
    match name {
        MapName::Frontends => put::<20, 16>(map, key, value),
        MapName::Groups => put::<8, 8>(map, key, value),
        MapName::Backends => put::<16, 20>(map, key, value),
        MapName::Members => put::<32, 1>(map, key, value),
        MapName::ClusterIps => put::<20, 1>(map, key, value),
    }
}

/// Deletes one element.
pub fn remove(name: MapName, map: &mut Map, key: &[u8]) -> Result<(), Failure> {
    match name {
        MapName::Frontends => del::<20, 16>(map, key),
        MapName::Groups => del::<8, 8>(map, key),
        MapName::Backends => del::<16, 20>(map, key),
        MapName::Members => del::<32, 1>(map, key),
        MapName::ClusterIps => del::<20, 1>(map, key),
    }
}

/// Every element.
pub fn read(name: MapName, map: &mut Map) -> Result<Vec<maps::RawElement>, Failure> {
    match name {
        MapName::Frontends => all::<20, 16>(map),
        MapName::Groups => all::<8, 8>(map),
        MapName::Backends => all::<16, 20>(map),
        MapName::Members => all::<32, 1>(map),
        MapName::ClusterIps => all::<20, 1>(map),
    }
}
