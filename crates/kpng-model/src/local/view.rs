//! [`NodeState`]: a node's ENLS as its consumers read it, whether it is held whole or made on
//! demand.

use std::borrow::Cow;

use super::{LocalNode, LocalServiceState, LocalState};
use crate::global::ServiceKey;

/// A node's whole ENLS, read one service at a time.
///
/// Backends and the other consumers of a node's state read it through this trait, not through
/// the maps of a [`LocalState`], so that a state need not be held whole: one made on demand
/// from the global model hands out owned services ([`Cow::Owned`]), a [`LocalState`] borrowed
/// ones. Either way a consumer sees the same services in the same order.
pub trait NodeState: Sync + std::fmt::Debug {
    /// The node itself, once known.
    fn node(&self) -> Option<&LocalNode>;

    /// The service `key` and its endpoints, if the node proxies it.
    fn service(&self, key: &ServiceKey) -> Option<Cow<'_, LocalServiceState>>;

    /// Every service the node proxies, in key order.
    fn services(&self) -> Box<dyn Iterator<Item = Cow<'_, LocalServiceState>> + '_>;

    /// How many services the node proxies.
    fn service_count(&self) -> usize;
}

impl NodeState for LocalState {
    fn node(&self) -> Option<&LocalNode> {
        self.node.as_ref()
    }

    fn service(&self, key: &ServiceKey) -> Option<Cow<'_, LocalServiceState>> {
        self.services.get(key).map(Cow::Borrowed)
    }

    fn services(&self) -> Box<dyn Iterator<Item = Cow<'_, LocalServiceState>> + '_> {
        Box::new(self.services.values().map(Cow::Borrowed))
    }

    fn service_count(&self) -> usize {
        self.services.len()
    }
}
