//! [`SourceEvent`]: what every source tells the store.

use kpng_model::{Kind, Object, ObjectRef};

/// One observation of a source. Sources group them into batches; each batch with real
/// changes becomes one store revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceEvent {
    /// The object exists with this value: store it, replacing any object with its key. An
    /// object equal to the stored one changes nothing.
    Applied(Object),
    /// The object no longer exists (or is no longer proxied): remove it.
    Deleted(ObjectRef),
    /// The object exists but the source could not read its current version (it is
    /// malformed): keep whatever the store holds for it. A list in progress counts it as
    /// listed, so a relist does not delete its last good version.
    Kept(ObjectRef),
    /// A full list of `kind` begins. Every object of that kind that is not `Applied` before
    /// the matching [`SourceEvent::ListDone`] is deleted then. Used for the initial list and
    /// for every relist (a file re-read, a watch that expired).
    ListStarted(Kind),
    /// The full list of `kind` is complete: delete what it did not mention. Once every kind
    /// the store expects has completed one list, readers are released.
    ListDone(Kind),
}

impl SourceEvent {
    /// A whole snapshot as one relist of every kind: what a source that re-reads its input
    /// emits. Applying it leaves the store holding exactly `objects`.
    pub fn relist(kinds: &[Kind], objects: impl IntoIterator<Item = Object>) -> Vec<SourceEvent> {
        let mut events: Vec<SourceEvent> =
            kinds.iter().map(|k| SourceEvent::ListStarted(*k)).collect();
        events.extend(objects.into_iter().map(SourceEvent::Applied));
        events.extend(kinds.iter().map(|k| SourceEvent::ListDone(*k)));
        events
    }
}
