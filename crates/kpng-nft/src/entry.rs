//! [`EntryKey`] and [`EntryValue`]: one object of kpng's tables as the backend template
//! keeps it ([`kpng_backend::reconcile::Objects`]): an element (half a million at 30,000
//! services, so packed: an IPv4 element's key in 16 bytes, an IPv6 one behind a pointer to
//! its packed bytes), or a layout object (a table,
//! set, chain or `ct helper`, a few hundred at most).
//!
//! A layout object's value is what kpng declares ([`LayoutValue::Set`],
//! [`LayoutValue::Chain`]) or what the kernel reports of it ([`LayoutValue::Shape`],
//! [`LayoutValue::Rules`]); two values are equal when the kernel cannot tell them apart
//! (a set's flags and types, a chain's hook and its rules' expressions), so a restart
//! over tables that are right finds every object equal and writes nothing.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use kpng_backend::reconcile::{Filed, Pack, Packed, Rank};
use kpng_model::Family;
use kpng_netlink::nftables::ChainSpec;
use kpng_netlink::nftables::objects::CtHelperSpec;

use crate::objects::{ElementId, Value};
use crate::packed::{
    PACKED_V6, PackedValue, filed_under, pack_v4, pack_v6, part_of, unpack_v4, unpack_v6,
};
use crate::reconcile::{PresentChain, SetShape, WantedSet, hook_shape, same_rules};
use crate::rules::Rule;

/// A layout object by family and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LayoutName {
    /// The family's table.
    Table(Family),
    /// A set or map.
    Set(Family, String),
    /// A chain.
    Chain(Family, String),
    /// A `ct helper` object.
    Helper(Family, String),
}

impl LayoutName {
    /// The family's table it is in.
    pub fn family(&self) -> Family {
        match self {
            LayoutName::Table(family)
            | LayoutName::Set(family, _)
            | LayoutName::Chain(family, _)
            | LayoutName::Helper(family, _) => *family,
        }
    }
}

/// The key of one object of kpng's tables.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryKey {
    /// An IPv4 element, packed (see [`crate::packed`]).
    V4([u8; 15]),
    /// An IPv6 element, packed behind a pointer (see [`crate::packed`]).
    V6(Box<[u8; PACKED_V6]>),
    /// Any other element.
    Element(Arc<ElementId>),
    /// A table, set, chain or `ct helper`.
    Layout(Arc<LayoutName>),
}

impl EntryKey {
    /// The key of element `id`.
    pub fn element(id: &ElementId) -> EntryKey {
        if let Some(bytes) = pack_v4(id) {
            return EntryKey::V4(bytes);
        }
        match pack_v6(id) {
            Some(bytes) => EntryKey::V6(Box::new(bytes)),
            None => EntryKey::Element(Arc::new(*id)),
        }
    }

    /// The key of a layout object.
    pub fn layout(name: LayoutName) -> EntryKey {
        EntryKey::Layout(Arc::new(name))
    }

    /// The element it is the key of, if it is one.
    pub fn as_element(&self) -> Option<ElementId> {
        match self {
            EntryKey::V4(bytes) => Some(unpack_v4(bytes)),
            EntryKey::V6(bytes) => Some(unpack_v6(bytes)),
            EntryKey::Element(id) => Some(**id),
            EntryKey::Layout(_) => None,
        }
    }

    /// The layout object it is the key of, if it is one.
    pub fn as_layout(&self) -> Option<&LayoutName> {
        match self {
            EntryKey::Layout(name) => Some(name),
            _ => None,
        }
    }
}

impl fmt::Debug for EntryKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.as_element(), self.as_layout()) {
            (Some(id), _) => {
                write!(f, "{} {} {:?}", crate::objects::table_family(id.family), id.map, id.key)
            }
            (_, Some(name)) => write!(f, "{name:?}"),
            _ => Ok(()),
        }
    }
}

/// Layout objects before elements (a set before its elements, a chain before the verdict
/// that jumps to it), and deleted after them.
impl Rank for EntryKey {
    fn rank(&self) -> u8 {
        match self {
            EntryKey::Layout(name) => match **name {
                LayoutName::Table(_) => 0,
                LayoutName::Set(..) | LayoutName::Helper(..) => 1,
                LayoutName::Chain(..) => 2,
            },
            _ => 3,
        }
    }
}

/// An element's claims are filed under its destination whatever its set and slot (its
/// NodePort, its address or pair of addresses for keys without a destination): a service's
/// dozen elements per destination take one entry of the template's index, not a dozen.
/// Other keys are filed whole.
impl Filed for EntryKey {
    fn file_under<H: Hasher>(&self, state: &mut H) {
        let (family, bytes): (Family, &[u8]) = match self {
            EntryKey::V4(bytes) => (Family::V4, bytes),
            EntryKey::V6(bytes) => (Family::V6, &bytes[..]),
            EntryKey::Element(_) | EntryKey::Layout(_) => return self.hash(state),
        };
        let (part, bytes) = filed_under(bytes, family);
        state.write_u8(family as u8);
        state.write_u8(part);
        state.write(bytes);
    }
}

/// An element's key packs into its packed bytes without their trailing zeros (which every
/// packed id of one family pads with), after a byte for its family: 7 to 12 bytes for an
/// IPv4 element instead of 16, and no allocation for an IPv6 one. Other keys are kept
/// whole. The set's code moves after the part the element is filed under (its
/// destination, say): a service's keys, sorted by these bytes, then run destination by
/// destination, and each record of the template's shares all but the set and slot with
/// the one before it ([`kpng_backend::reconcile::Pack`]'s records).
impl Pack for EntryKey {
    fn pack(&self) -> Option<Packed> {
        let mut packed = Packed::new();
        let fits = match self {
            EntryKey::V4(bytes) => put_reordered(&mut packed, 0, bytes, Family::V4),
            EntryKey::V6(bytes) => put_reordered(&mut packed, 1, &bytes[..], Family::V6),
            EntryKey::Element(_) | EntryKey::Layout(_) => false,
        };
        fits.then_some(packed)
    }

    fn unpack(bytes: &[u8]) -> Option<Self> {
        let (family, used) = bytes.split_first()?;
        match family {
            0 => {
                let mut bytes = [0; 15];
                restore(used, &mut bytes, Family::V4)?;
                Some(EntryKey::V4(bytes))
            }
            1 => {
                let mut bytes = Box::new([0; PACKED_V6]);
                restore(used, &mut bytes[..], Family::V6)?;
                Some(EntryKey::V6(bytes))
            }
            _ => None,
        }
    }
}

/// Puts `family`, then the packed id `bytes` with its set's code moved after its filed
/// part, without trailing zeros.
fn put_reordered(packed: &mut Packed, family_byte: u8, bytes: &[u8], family: Family) -> bool {
    let [code, shape, rest @ ..] = bytes else { return false };
    let len = part_of(*shape, family).1.min(rest.len());
    let (part, tail) = rest.split_at(len);
    let mut reordered = [0; PACKED_V6];
    let Some(out) = reordered.get_mut(..bytes.len()) else { return false };
    out[0] = *shape;
    out[1..=len].copy_from_slice(part);
    out[len + 1] = *code;
    out[len + 2..].copy_from_slice(tail);
    let used = out.iter().rposition(|b| *b != 0).map_or(0, |last| last + 1);
    packed.put(&[family_byte]) && packed.put(&out[..used])
}

/// The packed id whose reordered bytes without trailing zeros are `used`
/// ([`put_reordered`]), into `bytes` (zeros).
fn restore(used: &[u8], bytes: &mut [u8], family: Family) -> Option<()> {
    let mut reordered = [0; PACKED_V6];
    reordered.get_mut(..used.len())?.copy_from_slice(used);
    let reordered = reordered.get(..bytes.len())?;
    let shape = reordered[0];
    let len = part_of(shape, family).1.min(bytes.len().checked_sub(2)?);
    bytes[0] = reordered[len + 1];
    bytes[1] = shape;
    bytes[2..2 + len].copy_from_slice(&reordered[1..=len]);
    bytes[2 + len..].copy_from_slice(&reordered[len + 2..]);
    Some(())
}

const VALUE_NONE: u8 = 0;
const VALUE_V4: u8 = 1;
const VALUE_V6: u8 = 2;
const VALUE_AFFINITY: u8 = 3;

/// An element's value packs into a byte for its kind and its address and port (or its
/// hash); a layout object's is kept whole.
impl Pack for EntryValue {
    fn pack(&self) -> Option<Packed> {
        let EntryValue::Element(value) = self else { return None };
        let mut packed = Packed::new();
        let fits = match value {
            PackedValue::None => packed.put(&[VALUE_NONE]),
            PackedValue::V4(ip, port) => {
                packed.put(&[VALUE_V4])
                    && packed.put(&ip.octets())
                    && packed.put(&port.to_be_bytes())
            }
            PackedValue::V6(v6) => {
                let (ip, port) = &**v6;
                packed.put(&[VALUE_V6])
                    && packed.put(&ip.octets())
                    && packed.put(&port.to_be_bytes())
            }
            PackedValue::Affinity([high, low]) => {
                packed.put(&[VALUE_AFFINITY])
                    && packed.put(&high.to_be_bytes())
                    && packed.put(&low.to_be_bytes())
            }
        };
        fits.then_some(packed)
    }

    fn unpack(bytes: &[u8]) -> Option<Self> {
        let (kind, rest) = bytes.split_first()?;
        let value = match *kind {
            VALUE_NONE if rest.is_empty() => PackedValue::None,
            VALUE_V4 => {
                let (ip, port) = rest.split_first_chunk::<4>()?;
                PackedValue::V4((*ip).into(), u16::from_be_bytes(port.try_into().ok()?))
            }
            VALUE_V6 => {
                let (ip, port) = rest.split_first_chunk::<16>()?;
                let port = u16::from_be_bytes(port.try_into().ok()?);
                PackedValue::V6(Arc::new(((*ip).into(), port)))
            }
            VALUE_AFFINITY => {
                let (high, low) = rest.split_first_chunk::<4>()?;
                let low = u32::from_be_bytes(low.try_into().ok()?);
                PackedValue::Affinity([u32::from_be_bytes(*high), low])
            }
            _ => return None,
        };
        Some(EntryValue::Element(value))
    }
}

/// A layout object's value: as kpng declares it, or as the kernel reports it.
#[derive(Debug, Clone)]
pub enum LayoutValue {
    /// A table.
    Table,
    /// A set kpng declares.
    Set(WantedSet),
    /// A set as the kernel reports it.
    Shape(SetShape),
    /// A chain kpng declares, with its rules.
    Chain(ChainSpec, Vec<Rule>),
    /// A chain as the kernel reports it.
    Rules(PresentChain),
    /// A `ct helper` object.
    Helper(CtHelperSpec),
}

impl LayoutValue {
    /// The set's shape, for a set.
    pub fn shape(&self) -> Option<SetShape> {
        match self {
            LayoutValue::Set(set) => Some(SetShape::of(&set.decl)),
            LayoutValue::Shape(shape) => Some(shape.clone()),
            _ => None,
        }
    }

    /// The chain as the kernel reports it, for a chain.
    pub fn present_chain(&self) -> Option<PresentChain> {
        match self {
            LayoutValue::Chain(spec, rules) => Some(PresentChain {
                hook: hook_shape(&spec.hook),
                rules: rules.iter().map(|r| r.exprs.iter().cloned().map(Some).collect()).collect(),
            }),
            LayoutValue::Rules(chain) => Some(chain.clone()),
            _ => None,
        }
    }
}

/// Equal when the kernel cannot tell them apart.
impl PartialEq for LayoutValue {
    fn eq(&self, other: &Self) -> bool {
        use LayoutValue::*;
        match (self, other) {
            (Table, Table) => true,
            (Helper(a), Helper(b)) => a == b,
            (Set(_) | Shape(_), Set(_) | Shape(_)) => self.shape() == other.shape(),
            // A declared chain against either form: its hook, and its rules compared as
            // the kernel would report them.
            (Chain(spec, rules), other @ (Chain(..) | Rules(_)))
            | (other @ Rules(_), Chain(spec, rules)) => other
                .present_chain()
                .is_some_and(|c| c.hook == hook_shape(&spec.hook) && same_rules(rules, &c.rules)),
            (Rules(a), Rules(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for LayoutValue {}

/// The value of one object of kpng's tables.
#[derive(Clone, PartialEq, Eq)]
pub enum EntryValue {
    /// An element's value, packed.
    Element(PackedValue),
    /// A layout object's.
    Layout(Arc<LayoutValue>),
}

/// A set's element: no value (most of kpng's objects, which the template keeps as bare
/// keys).
impl Default for EntryValue {
    fn default() -> Self {
        EntryValue::Element(PackedValue::None)
    }
}

impl EntryValue {
    /// The value of an element.
    pub fn element(value: Value) -> EntryValue {
        EntryValue::Element(value.into())
    }

    /// The value of a layout object.
    pub fn layout(value: LayoutValue) -> EntryValue {
        EntryValue::Layout(Arc::new(value))
    }

    /// The element value, for an element.
    pub fn as_element(&self) -> Option<Value> {
        match self {
            EntryValue::Element(value) => Some(value.into()),
            EntryValue::Layout(_) => None,
        }
    }

    /// The layout value, for a layout object.
    pub fn as_layout(&self) -> Option<&LayoutValue> {
        match self {
            EntryValue::Layout(value) => Some(value),
            EntryValue::Element(_) => None,
        }
    }
}

impl fmt::Debug for EntryValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryValue::Element(value) => write!(f, "{:?}", Value::from(value)),
            EntryValue::Layout(value) => write!(f, "{value:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{Dest, Key, MapName};
    use kpng_model::Protocol;

    #[test]
    fn element_keys_come_back_ipv4_ones_inline_and_ipv6_ones_packed() {
        let dest = |ip: &str| Dest { ip: ip.parse().unwrap(), protocol: Protocol::Tcp, port: 80 };
        for (family, ip) in [(Family::V4, "10.96.0.1"), (Family::V6, "fd00::1")] {
            let id = ElementId { family, map: MapName::ClusterDests, key: Key::Dest(dest(ip)) };
            let key = EntryKey::element(&id);
            assert_eq!(key.as_element(), Some(id));
            assert_eq!(matches!(key, EntryKey::V4(_)), family == Family::V4);
            assert_eq!(matches!(key, EntryKey::V6(_)), family == Family::V6);
        }
        assert_eq!(size_of::<EntryKey>(), 16);
        assert_eq!(size_of::<EntryValue>(), 16);
    }

    #[test]
    fn a_declared_set_equals_the_shape_the_kernel_reports_and_not_another() {
        let decl = crate::sets::declaration(MapName::ClusterDests, Family::V4);
        let other = crate::sets::declaration(
            MapName::Backends(crate::objects::PickKind::Cluster, 2),
            Family::V4,
        );
        let declared = LayoutValue::Set(WantedSet { decl: decl.clone(), forget_with: None });
        assert_eq!(declared, LayoutValue::Shape(SetShape::of(&decl)));
        assert_ne!(declared, LayoutValue::Shape(SetShape::of(&other)));
    }
}
