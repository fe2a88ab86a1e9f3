//! Properties of the store over random event streams.

use kpng_model::{GlobalModel, Kind, Object, ObjectRef};
use kpng_store::{SourceEvent, store};
use kpng_testkit::strategies::{Mutation, arb_mutation};
use proptest::prelude::*;

fn event(m: &Mutation) -> SourceEvent {
    match m {
        Mutation::Apply(o) => SourceEvent::Applied(o.clone()),
        Mutation::Delete(k) => SourceEvent::Deleted(k.clone()),
    }
}

fn final_objects(mutations: &[Mutation]) -> Vec<Object> {
    let mut model = GlobalModel::new();
    for m in mutations {
        match m {
            Mutation::Apply(o) => model.apply(o.clone()),
            Mutation::Delete(k) => model.delete(k),
        };
    }
    model.objects().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn any_event_stream_ends_where_loading_the_final_state_does(
        batches in proptest::collection::vec(proptest::collection::vec(arb_mutation(), 0..6), 0..10),
    ) {
        let (mut writer, reader) = store(&[]);
        for batch in &batches {
            writer.apply(batch.iter().map(event));
        }
        let all: Vec<Mutation> = batches.concat();
        let (mut fresh, fresh_reader) = store(&[]);
        fresh.apply(final_objects(&all).into_iter().map(SourceEvent::Applied));
        { let (a, b) = (reader.snapshot(), fresh_reader.snapshot()); prop_assert_eq!(a.model(), b.model()); }
    }

    #[test]
    fn relist_converges_to_the_listed_objects(
        before in proptest::collection::vec(arb_mutation(), 0..15),
        after in proptest::collection::vec(arb_mutation(), 0..15),
    ) {
        let (mut writer, reader) = store(&Kind::ALL);
        writer.apply(before.iter().map(event));
        let wanted = final_objects(&after);
        let rev_before = reader.snapshot().revision();
        let changed = writer.apply(SourceEvent::relist(&Kind::ALL, wanted.clone()));
        let (mut fresh, fresh_reader) = store(&[]);
        fresh.apply(wanted.into_iter().map(SourceEvent::Applied));
        { let (a, b) = (reader.snapshot(), fresh_reader.snapshot()); prop_assert_eq!(a.model(), b.model()); }
        // A relist of the same objects again is no change at all.
        let again: Vec<Object> = reader.snapshot().model().objects().collect();
        prop_assert_eq!(writer.apply(SourceEvent::relist(&Kind::ALL, again)), None);
        prop_assert_eq!(changed.is_some(), reader.snapshot().revision() != rev_before);
        prop_assert!(reader.is_ready());
    }

    /// A relist streamed in pages (one batch each, as the kube source writes them) ends
    /// where a relist in one batch does.
    #[test]
    fn a_relist_in_pages_converges_like_one_batch(
        before in proptest::collection::vec(arb_mutation(), 0..15),
        after in proptest::collection::vec(arb_mutation(), 0..15),
        page in 1usize..4,
    ) {
        let (mut writer, reader) = store(&Kind::ALL);
        writer.apply(before.iter().map(event));
        let wanted = final_objects(&after);
        writer.apply(Kind::ALL.map(SourceEvent::ListStarted));
        for chunk in wanted.chunks(page) {
            writer.apply(chunk.iter().cloned().map(SourceEvent::Applied));
        }
        writer.apply(Kind::ALL.map(SourceEvent::ListDone));
        let (mut fresh, fresh_reader) = store(&[]);
        fresh.apply(wanted.into_iter().map(SourceEvent::Applied));
        { let (a, b) = (reader.snapshot(), fresh_reader.snapshot()); prop_assert_eq!(a.model(), b.model()); }
        prop_assert!(reader.is_ready());
    }
}

#[test]
fn a_kept_object_survives_a_relist_that_could_not_read_it() {
    let (mut writer, reader) = store(&[Kind::Service]);
    let svc = kpng_testkit::builders::service("ns", "a", &["10.96.0.1"], &[]);
    let other = kpng_testkit::builders::service("ns", "b", &["10.96.0.2"], &[]);
    writer.apply(SourceEvent::relist(
        &[Kind::Service],
        [Object::Service(svc.clone()), Object::Service(other)],
    ));
    // The relist cannot read `a` any more (malformed) and no longer lists `b`.
    writer.apply([
        SourceEvent::ListStarted(Kind::Service),
        SourceEvent::Kept(ObjectRef::Service(svc.key.clone())),
        SourceEvent::ListDone(Kind::Service),
    ]);
    let snapshot = reader.snapshot();
    let left: Vec<&kpng_model::Service> = snapshot.model().services().collect();
    assert_eq!(left, [&svc], "the unreadable object keeps its last good value; b is gone");
}

#[test]
fn equal_values_make_no_revision_and_a_batch_makes_one() {
    let (mut writer, reader) = store(&[]);
    let svc = kpng_testkit::builders::service(
        "ns",
        "a",
        &["10.96.0.1"],
        &[("http", kpng_model::Protocol::Tcp, 80)],
    );
    let mut other = svc.clone();
    other.key = kpng_model::ServiceKey::new("ns", "b");
    assert_eq!(
        writer.apply([
            SourceEvent::Applied(Object::Service(svc.clone())),
            SourceEvent::Applied(Object::Service(other))
        ]),
        Some(1)
    );
    assert_eq!(writer.apply([SourceEvent::Applied(Object::Service(svc.clone()))]), None);
    assert_eq!(
        writer.apply([SourceEvent::Deleted(ObjectRef::Service(kpng_model::ServiceKey::new(
            "ns", "zzz"
        )))]),
        None
    );
    let stats = reader.stats().snapshot();
    assert_eq!((stats.events, stats.changes, stats.revisions), (4, 2, 1));
    let snapshot = reader.snapshot();
    assert_eq!(snapshot.revision(), 1);
    match snapshot.changes_since(Some(0)) {
        kpng_model::Changes::Touched(t) => assert_eq!(t.len(), 2),
        other => panic!("unexpected {other:?}"),
    }
    assert!(snapshot.changes_since(Some(1)).is_empty());
}

#[test]
fn the_first_lists_leave_no_log_and_later_changes_are_logged() {
    let (mut writer, reader) = store(&[Kind::Service]);
    let svc = |name: &str| {
        let mut svc = kpng_testkit::builders::service("ns", "a", &["10.96.0.1"], &[]);
        svc.key = kpng_model::ServiceKey::new("ns", name);
        SourceEvent::Applied(Object::Service(svc))
    };
    writer.apply([SourceEvent::ListStarted(Kind::Service), svc("a"), svc("b")]);
    assert!(!reader.is_ready());
    assert_eq!(writer.apply([svc("c"), SourceEvent::ListDone(Kind::Service)]), Some(2));
    assert!(reader.is_ready());
    // Released readers read the whole model first: nothing of the lists is kept for them.
    assert_eq!(reader.snapshot().changes_since(Some(0)), kpng_model::Changes::All);
    assert_eq!(reader.snapshot().changes_since(Some(1)), kpng_model::Changes::All);
    assert!(reader.snapshot().changes_since(Some(2)).is_empty());
    // What comes after is logged, a relist included.
    assert_eq!(writer.apply([svc("d"), svc("e")]), Some(3));
    writer.apply([SourceEvent::ListStarted(Kind::Service)]);
    let relist = [svc("a"), svc("b"), svc("c"), svc("e"), SourceEvent::ListDone(Kind::Service)];
    assert_eq!(writer.apply(relist), Some(4));
    let touched = |since| match reader.snapshot().changes_since(Some(since)) {
        kpng_model::Changes::Touched(t) => t.len(),
        other => panic!("since {since}: {other:?}"),
    };
    assert_eq!(touched(2), 2, "d and e added, then d swept by the relist");
    assert_eq!(touched(3), 1, "d swept");
}

#[tokio::test]
async fn readers_wait_for_every_initial_list() {
    let (mut writer, mut reader) = store(&[Kind::Service, Kind::EndpointSlice]);
    writer.apply([SourceEvent::ListStarted(Kind::Service), SourceEvent::ListDone(Kind::Service)]);
    assert!(!reader.is_ready());
    let waiter = tokio::spawn(async move { reader.wait_after(None).await });
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    writer.apply([
        SourceEvent::ListStarted(Kind::EndpointSlice),
        SourceEvent::ListDone(Kind::EndpointSlice),
    ]);
    assert_eq!(waiter.await.unwrap(), Some(0));
}

#[tokio::test]
async fn wait_after_returns_only_newer_revisions() {
    let (mut writer, mut reader) = store(&[]);
    assert_eq!(reader.wait_after(None).await, Some(0));
    let waiter = tokio::spawn(async move { reader.wait_after(Some(0)).await });
    let svc = kpng_testkit::builders::service("ns", "a", &["10.96.0.1"], &[]);
    writer.apply([SourceEvent::Applied(Object::Service(svc))]);
    assert_eq!(waiter.await.unwrap(), Some(1));
    drop(writer);
}
