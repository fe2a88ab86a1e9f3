use std::sync::Mutex;

use kpng_model::{Object, Op, Protocol};
use kpng_store::{SourceEvent, store};
use kpng_testkit::builders::{endpoint, service, slice};

use super::*;
use kpng_backend::ChangeSet;

/// Records every change set; fails while `fail` is set; reports drift while `drifted` is.
#[derive(Clone, Default)]
struct Recorder {
    log: Arc<Mutex<Vec<Vec<Op>>>>,
    fail: Arc<Mutex<bool>>,
    drifted: Arc<Mutex<bool>>,
}

impl Backend for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }

    fn apply(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError> {
        if *self.fail.lock().unwrap() {
            return Err(BackendError::new("recorder", "injected failure"));
        }
        self.log.lock().unwrap().push(changes.ops().map(std::borrow::Cow::into_owned).collect());
        *self.drifted.lock().unwrap() = false;
        Ok(())
    }

    fn verify(&mut self) -> Result<bool, BackendError> {
        Ok(!*self.drifted.lock().unwrap())
    }
}

fn objects(endpoints: &[(&str, &str)]) -> Vec<SourceEvent> {
    let http = ("http", Protocol::Tcp, 80);
    let eps = endpoints.iter().map(|(ip, node)| endpoint(ip, node)).collect();
    vec![
        SourceEvent::Applied(Object::Service(service("ns", "web", &["10.96.0.1"], &[http]))),
        SourceEvent::Applied(Object::EndpointSlice(slice(
            "ns",
            "web-1",
            "web",
            &[("http", Protocol::Tcp, 8080)],
            eps,
        ))),
    ]
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn backends_get_reset_then_only_real_changes() {
    let (mut writer, reader) = store(&[]);
    let recorder = Recorder::default();
    let stats = Arc::new(NodeStats::default());
    writer.apply(objects(&[("10.0.0.1", "a")]));
    let task = tokio::spawn(run_node(
        reader,
        vec![Box::new(recorder.clone())],
        RunnerOptions::new("a"),
        stats.clone(),
        None,
    ));
    settle().await;
    {
        let log = recorder.log.lock().unwrap();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].first(), Some(&Op::Reset));
        assert_eq!(log[0].last(), Some(&Op::Sync));
        assert_eq!(log[0].len(), 4, "reset, service, endpoint, sync: {:?}", log[0]);
    }
    // A new revision that changes nothing for this node: a not-ready endpoint elsewhere.
    let mut events = objects(&[("10.0.0.1", "a")]);
    let SourceEvent::Applied(Object::EndpointSlice(s)) = &mut events[1] else { unreachable!() };
    let mut hidden = endpoint("10.0.0.9", "b");
    hidden.ready = false;
    hidden.serving = false;
    s.endpoints = [&s.endpoints[..], &[hidden]].concat().into();
    assert!(writer.apply(events).is_some());
    settle().await;
    assert_eq!(recorder.log.lock().unwrap().len(), 1, "no change set for a no-op revision");
    // A real change: one endpoint added.
    writer.apply(objects(&[("10.0.0.1", "a"), ("10.0.0.2", "b")]));
    settle().await;
    {
        let log = recorder.log.lock().unwrap();
        assert_eq!(log.len(), 2);
        assert!(
            matches!(&log[1][..], [Op::Set(kpng_model::Item::Endpoint { .. }), Op::Sync]),
            "{:?}",
            log[1]
        );
    }
    assert_eq!(stats.enls_revisions(), 2);
    drop(writer);
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_failed_backend_is_retried_with_the_full_state() {
    let (mut writer, reader) = store(&[]);
    let recorder = Recorder::default();
    *recorder.fail.lock().unwrap() = true;
    let stats = Arc::new(NodeStats::default());
    writer.apply(objects(&[("10.0.0.1", "a")]));
    let task = tokio::spawn(run_node(
        reader,
        vec![Box::new(recorder.clone())],
        RunnerOptions::new("a"),
        stats.clone(),
        None,
    ));
    settle().await;
    assert_eq!(stats.failures(), 1);
    writer.apply(objects(&[("10.0.0.1", "a"), ("10.0.0.2", "b")]));
    settle().await;
    assert!(recorder.log.lock().unwrap().is_empty());
    *recorder.fail.lock().unwrap() = false;
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle().await;
    {
        let log = recorder.log.lock().unwrap();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].first(), Some(&Op::Reset));
        assert_eq!(log[0].len(), 5, "reset, service, two endpoints, sync");
    }
    drop(writer);
    task.await.unwrap().unwrap();
}

/// Health is measured on the runtime's clock: with time paused, a change that waits for a
/// failing backend has waited exactly as long as the test advanced time, and readiness
/// (the synced latch) is reached only once the backend applied a state.
#[tokio::test(start_paused = true)]
async fn health_and_readiness_follow_the_runtime_clock() {
    let (mut writer, reader) = store(&[]);
    let recorder = Recorder::default();
    *recorder.fail.lock().unwrap() = true;
    let stats = Arc::new(NodeStats::default());
    writer.apply(objects(&[("10.0.0.1", "a")]));
    let options = RunnerOptions { retry_min: Duration::from_secs(60), ..RunnerOptions::new("a") };
    let task = tokio::spawn(run_node(
        reader,
        vec![Box::new(recorder.clone())],
        options,
        stats.clone(),
        None,
    ));
    settle().await;
    let since = stats.health().pending_since.expect("a change waits");
    assert!(!stats.synced().is_released());
    tokio::time::advance(Duration::from_secs(45)).await;
    assert_eq!(since.elapsed(), Duration::from_secs(45));
    *recorder.fail.lock().unwrap() = false;
    tokio::time::sleep(Duration::from_secs(20)).await;
    settle().await;
    assert_eq!(stats.health().pending_since, None);
    assert!(stats.synced().is_released());
    *recorder.fail.lock().unwrap() = true;
    writer.apply(objects(&[("10.0.0.1", "a"), ("10.0.0.2", "b")]));
    settle().await;
    assert!(stats.health().pending_since.is_some());
    assert!(stats.synced().is_released(), "readiness never goes back");
    drop(writer);
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn once_stops_after_the_first_sync_or_fails() {
    let (mut writer, reader) = store(&[]);
    writer.apply(objects(&[]));
    let mut options = RunnerOptions::new("a");
    options.once = true;
    let ok = Recorder::default();
    run_node(reader.clone(), vec![Box::new(ok.clone())], options.clone(), Default::default(), None)
        .await
        .unwrap();
    assert_eq!(ok.log.lock().unwrap().len(), 1);
    let failing = Recorder::default();
    *failing.fail.lock().unwrap() = true;
    let err = run_node(reader, vec![Box::new(failing)], options, Default::default(), None)
        .await
        .unwrap_err();
    let text = kpng_backend::error_chain(&err);
    assert!(text.contains("injected failure"), "{text}");
}

/// A node's full state from `endpoints`, as a remote `Reset` change set (without `Sync`).
fn remote_reset(endpoints: &[(&str, &str)]) -> Vec<Op> {
    let mut model = kpng_model::GlobalModel::new();
    for event in objects(endpoints) {
        let SourceEvent::Applied(object) = event else { unreachable!() };
        model.apply(object);
    }
    kpng_local::full_state_ops(&kpng_local::project_node_state(&model, "a")).collect()
}

#[tokio::test(start_paused = true)]
async fn remote_change_sets_reach_backends_and_a_same_state_reconnect_costs_nothing() {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let recorder = Recorder::default();
    let stats = Arc::new(NodeStats::default());
    let task = tokio::spawn(run_remote(
        rx,
        vec![Box::new(recorder.clone())],
        RunnerOptions::new("a"),
        stats.clone(),
        None,
    ));
    tx.send(remote_reset(&[("10.0.0.1", "a")])).await.unwrap();
    settle().await;
    assert_eq!(recorder.log.lock().unwrap()[0].len(), 4, "reset, service, endpoint, sync");

    // An incremental change set passes through as it is.
    let two = remote_reset(&[("10.0.0.1", "a"), ("10.0.0.2", "b")]);
    let added = two.last().unwrap().clone();
    tx.send(vec![added.clone()]).await.unwrap();
    settle().await;
    assert_eq!(recorder.log.lock().unwrap()[1], [added, Op::Sync]);

    // A reconnection resends everything: the same state reaches no backend...
    tx.send(two).await.unwrap();
    settle().await;
    assert_eq!(recorder.log.lock().unwrap().len(), 2, "no change set for an unchanged reset");
    // ...and a changed one only as its differences.
    tx.send(remote_reset(&[("10.0.0.2", "b")])).await.unwrap();
    settle().await;
    {
        let log = recorder.log.lock().unwrap();
        assert_eq!(log.len(), 3);
        assert!(
            matches!(&log[2][..], [Op::Delete(kpng_model::ItemRef::Endpoint { .. }), Op::Sync]),
            "{:?}",
            log[2]
        );
    }
    assert_eq!(stats.enls_revisions(), 3);
    drop(tx);
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn min_sync_period_paces_change_sets_and_coalesces_what_waits() {
    let (mut writer, reader) = store(&[]);
    let recorder = Recorder::default();
    writer.apply(objects(&[("10.0.0.1", "a")]));
    let mut options = RunnerOptions::new("a");
    options.min_sync_period = Duration::from_secs(1);
    let task = tokio::spawn(run_node(
        reader,
        vec![Box::new(recorder.clone())],
        options,
        Arc::new(NodeStats::default()),
        None,
    ));
    settle().await;
    // The burst: the first state and the first change go at once.
    writer.apply(objects(&[("10.0.0.1", "a"), ("10.0.0.2", "a")]));
    settle().await;
    assert_eq!(recorder.log.lock().unwrap().len(), 2);
    // Then three changes within the period wait and arrive as one change set.
    writer.apply(objects(&[("10.0.0.1", "a"), ("10.0.0.2", "a"), ("10.0.0.3", "a")]));
    settle().await;
    writer.apply(objects(&[("10.0.0.2", "a"), ("10.0.0.3", "a")]));
    settle().await;
    writer.apply(objects(&[("10.0.0.2", "a"), ("10.0.0.3", "a"), ("10.0.0.4", "a")]));
    settle().await;
    assert_eq!(recorder.log.lock().unwrap().len(), 2, "paced: nothing before the period ends");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    settle().await;
    {
        let log = recorder.log.lock().unwrap();
        assert_eq!(log.len(), 3, "{log:?}");
        let (mut sets, mut deletes) = (0, 0);
        for op in &log[2] {
            match op {
                Op::Set(_) => sets += 1,
                Op::Delete(_) => deletes += 1,
                _ => {}
            }
        }
        assert_eq!((sets, deletes), (2, 1), "10.0.0.3 and .4 set, .1 deleted: {:?}", log[2]);
    }
    drop(writer);
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_drifted_dataplane_gets_the_whole_state_at_the_next_verification() {
    let (mut writer, reader) = store(&[]);
    let recorder = Recorder::default();
    writer.apply(objects(&[("10.0.0.1", "a")]));
    let mut options = RunnerOptions::new("a");
    options.verify_period = Some(Duration::from_secs(30));
    let stats = Arc::new(NodeStats::default());
    let task = tokio::spawn(run_node(
        reader,
        vec![Box::new(recorder.clone())],
        options,
        stats.clone(),
        None,
    ));
    settle().await;
    assert_eq!(recorder.log.lock().unwrap().len(), 1);
    // Verified and intact: nothing sent.
    tokio::time::sleep(Duration::from_secs(31)).await;
    settle().await;
    assert_eq!(recorder.log.lock().unwrap().len(), 1);
    assert_eq!(stats.repairs(), 0);
    // Someone changed the dataplane: the next verification repairs it with a full state.
    *recorder.drifted.lock().unwrap() = true;
    tokio::time::sleep(Duration::from_secs(30)).await;
    settle().await;
    {
        let log = recorder.log.lock().unwrap();
        assert_eq!(log.len(), 2);
        assert_eq!(log[1].first(), Some(&Op::Reset));
        assert_eq!(log[1].len(), 4, "reset, service, endpoint, sync");
    }
    assert_eq!(stats.repairs(), 1);
    drop(writer);
    task.await.unwrap().unwrap();
}

#[test]
fn trigger_times_parse_as_rfc3339() {
    let at = |s: &str| parse_rfc3339(s).map(|t| t.duration_since(std::time::UNIX_EPOCH).unwrap());
    assert_eq!(at("2026-11-22T04:35:06Z"), Some(Duration::from_secs(1_795_322_106)));
    assert_eq!(
        at("2026-11-22T04:35:06.123456789Z"),
        Some(Duration::new(1_795_322_106, 123_456_789))
    );
    assert_eq!(at("2026-11-22T06:35:06+02:00"), Some(Duration::from_secs(1_795_322_106)));
    assert_eq!(at("2000-02-29T00:00:00Z"), Some(Duration::from_secs(951_782_400)));
    assert_eq!(at("2026-13-01T00:00:00Z"), None);
    assert_eq!(at("yesterday"), None);
}

#[tokio::test(start_paused = true)]
async fn services_with_a_local_policy_and_no_local_endpoint_are_counted() {
    let (mut writer, reader) = store(&[]);
    let with_policy = |endpoints: &[(&str, &str)]| {
        let mut events = objects(endpoints);
        let SourceEvent::Applied(Object::Service(s)) = &mut events[0] else { unreachable!() };
        s.internal_traffic_policy = kpng_model::global::TrafficPolicy::Local;
        events
    };
    writer.apply(with_policy(&[("10.0.0.1", "b")]));
    let stats = Arc::new(NodeStats::default());
    let task = tokio::spawn(run_node(
        reader,
        vec![Box::new(Recorder::default())],
        RunnerOptions::new("a"),
        stats.clone(),
        None,
    ));
    settle().await;
    assert_eq!(stats.no_local_endpoints(), (1, 0), "the only endpoint is on node b");
    writer.apply(with_policy(&[("10.0.0.1", "b"), ("10.0.0.2", "a")]));
    settle().await;
    assert_eq!(stats.no_local_endpoints(), (0, 0));
    drop(writer);
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_stopped_runner_applies_nothing_more() {
    let (mut writer, reader) = store(&[]);
    let recorder = Recorder::default();
    let options = RunnerOptions::new("a");
    let stop = options.stop.clone();
    writer.apply(objects(&[("10.0.0.1", "a")]));
    let task = tokio::spawn(run_node(
        reader,
        vec![Box::new(recorder.clone())],
        options,
        Arc::new(NodeStats::default()),
        None,
    ));
    settle().await;
    assert_eq!(recorder.log.lock().unwrap().len(), 1, "the first state is applied");
    stop.stop();
    writer.apply(objects(&[("10.0.0.1", "a"), ("10.0.0.2", "b")]));
    let result = tokio::time::timeout(Duration::from_secs(5), task).await;
    assert!(matches!(result, Ok(Ok(Ok(())))), "it returns Ok: {result:?}");
    assert_eq!(recorder.log.lock().unwrap().len(), 1, "the change after the stop is not applied");
}

/// Fails with a permanent error.
struct Broken;

impl Backend for Broken {
    fn name(&self) -> &'static str {
        "broken"
    }

    fn apply(&mut self, _: &ChangeSet<'_>) -> Result<(), BackendError> {
        Err(BackendError::new("broken", "output closed").permanent())
    }
}

#[tokio::test(start_paused = true)]
async fn a_permanent_failure_ends_the_runner_instead_of_retrying() {
    let (mut writer, reader) = store(&[]);
    writer.apply(objects(&[("10.0.0.1", "a")]));
    let stats = Arc::new(NodeStats::default());
    let run =
        run_node(reader, vec![Box::new(Broken)], RunnerOptions::new("a"), stats.clone(), None);
    let result = tokio::time::timeout(Duration::from_secs(5), run).await.expect("no retry loop");
    let error = result.expect_err("a permanent failure is an error");
    assert!(matches!(error, RunnerError::Permanent { .. }), "{error:?}");
    assert_eq!(stats.failures(), 1, "tried once");
    let text = kpng_backend::error_chain(&error);
    assert!(text.contains("output closed"), "{text}");
}

/// A backend whose every apply takes `took` of real time.
struct Slow {
    took: Duration,
    log: Arc<Mutex<Vec<usize>>>,
}

impl Backend for Slow {
    fn name(&self) -> &'static str {
        "slow"
    }

    fn apply(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError> {
        std::thread::sleep(self.took);
        self.log.lock().unwrap().push(changes.ops().count());
        Ok(())
    }
}

#[tokio::test]
async fn a_storm_against_slow_syncs_coalesces_and_leaves_half_the_time_idle() {
    let (mut writer, reader) = store(&[]);
    writer.apply(objects(&[("10.0.0.1", "a")]));
    let log = Arc::new(Mutex::new(Vec::new()));
    let slow = Slow { took: Duration::from_millis(20), log: log.clone() };
    let task = tokio::spawn(run_node(
        reader,
        vec![Box::new(slow)],
        RunnerOptions::new("a"),
        Arc::new(NodeStats::default()),
        None,
    ));
    // 100 changes over about 0.5 s, one every 5 ms: four times what 20 ms syncs can follow.
    let start = std::time::Instant::now();
    for i in 0..100u32 {
        let ip = format!("10.0.1.{}", i % 250 + 1);
        writer.apply(objects(&[("10.0.0.1", "a"), (ip.as_str(), "a")]));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let elapsed = start.elapsed();
    let syncs = log.lock().unwrap().len();
    // Each sync is followed by a rest as long: at most one sync per 40 ms (plus the first).
    let most = (elapsed.as_millis() / 40) as usize + 2;
    assert!(syncs <= most, "{syncs} syncs in {elapsed:?}");
    assert!(syncs >= 5, "changes still applied as they come: {syncs} syncs");
    drop(writer);
    task.await.unwrap().unwrap();
}

/// Replays the ops of each change set and checks that the state it is given reads the
/// same: the node and every service.
#[derive(Clone, Default)]
struct Mirror {
    replayed: Arc<Mutex<kpng_model::LocalState>>,
    mismatches: Arc<Mutex<Vec<String>>>,
}

impl Backend for Mirror {
    fn name(&self) -> &'static str {
        "mirror"
    }

    fn apply(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError> {
        let mut replayed = self.replayed.lock().unwrap();
        for op in changes.ops() {
            match &*op {
                Op::Reset => *replayed = kpng_model::LocalState::default(),
                Op::Sync => {}
                op => replayed.apply(op).unwrap(),
            }
        }
        let state = changes.state;
        let read: Vec<_> = state.services().map(std::borrow::Cow::into_owned).collect();
        let held: Vec<_> = replayed.services.values().cloned().collect();
        if state.node() != replayed.node.as_ref() || read != held {
            self.mismatches.lock().unwrap().push(format!("read {read:?}, replayed {held:?}"));
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn backends_read_the_state_the_ops_lead_to_also_when_the_nodes_addresses_move() {
    use kpng_local::NodePortSelection;
    let (mut writer, reader) = store(&[]);
    let node = kpng_testkit::builders::node("a", None, &["192.168.0.1"]);
    writer.apply([SourceEvent::Applied(Object::Node(node))]);
    writer.apply(objects(&[("10.0.0.1", "a")]));
    let mirror = Mirror::default();
    let mut options = RunnerOptions::new("a");
    options.local.nodeports = NodePortSelection::Cidrs(vec!["192.168.0.0/16".parse().unwrap()]);
    let (addresses, updates) = tokio::sync::mpsc::channel(4);
    let stats = Arc::new(NodeStats::default());
    let task = tokio::spawn(run_node(
        reader,
        vec![Box::new(mirror.clone())],
        options,
        stats,
        Some(updates),
    ));
    settle().await;
    writer.apply(objects(&[("10.0.0.1", "a"), ("10.0.0.2", "b")]));
    settle().await;
    let moved = ["192.168.0.1", "192.168.7.7", "10.1.0.1"].map(|ip| ip.parse().unwrap());
    addresses.send(moved.to_vec()).await.unwrap();
    settle().await;
    writer.apply(objects(&[("10.0.0.2", "b")]));
    settle().await;
    {
        let replayed = mirror.replayed.lock().unwrap();
        let node = replayed.node.as_ref().expect("the node");
        let accepted: Vec<String> =
            node.nodeport_addresses.addresses.iter().map(ToString::to_string).collect();
        assert_eq!(accepted, ["192.168.0.1", "192.168.7.7"], "the moved addresses arrived");
        let web = replayed.services.values().next().expect("the service");
        let ips: Vec<String> = web.endpoints.keys().map(ToString::to_string).collect();
        assert_eq!(ips, ["10.0.0.2"]);
    }
    assert_eq!(*mirror.mismatches.lock().unwrap(), Vec::<String>::new());
    drop(writer);
    task.await.unwrap().unwrap();
}
