//! The pod side of a hollow node without pods: only the source runs until the first pod arrives (see
//! `first_pod`); a real node builds it at once.
//! Seen here through the node's views (`NodeViewFeed::Make`, as an agent's), which the lifecycle makes when it
//! builds its pod side, and through the first pod's sandbox in the fake runtime (admitted on the views made).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cri_fake::{FakeConfig, FakeRuntime};
use futures::FutureExt;
use runtime_api::{Runtime, cri};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::density::watch;
use crate::pods::events::MemoryEvents;
use crate::pods::source::{PodEvent, PodSource};
use crate::pods::tests::{fake_probes, node_view, pod};
use crate::pods::{NodeKind, NodeViewFeed, NodeViews, PodConfig, PodLifecycle};

/// A client whose requests never get an answer (the status writer's patches wait forever).
fn client() -> kube::Client {
    let service = tower::service_fn(|_req: http::Request<kube::client::Body>| {
        std::future::pending::<Result<http::Response<kube::client::Body>, std::convert::Infallible>>()
    });
    kube::Client::new(service, "default")
}

struct Node {
    runtime: FakeRuntime,
    _view: watch::Sender<Option<crate::pods::NodeView>>,
    feed: crate::density::chan::Sender<PodEvent>,
    built: Arc<AtomicBool>,
    cancel: CancellationToken,
    run: tokio::task::JoinHandle<()>,
}

/// Node n1's pod lifecycle over `runtime`; its node view comes from `view`.
fn lifecycle(runtime: &FakeRuntime, view: impl Into<NodeViewFeed>) -> PodLifecycle {
    lifecycle_of(PodConfig::new("n1"), runtime, view)
}

fn lifecycle_of(config: PodConfig, runtime: &FakeRuntime, view: impl Into<NodeViewFeed>) -> PodLifecycle {
    PodLifecycle::new(
        config,
        client(),
        Arc::new(runtime.clone()),
        Arc::new(fake_probes(runtime.clone())),
        view,
    )
}

fn start(runtime: FakeRuntime) -> Node {
    start_as(PodConfig::new("n1"), runtime)
}

fn start_as(config: PodConfig, runtime: FakeRuntime) -> Node {
    let (feed, source) = PodSource::channel(8);
    let built = Arc::new(AtomicBool::new(false));
    let flag = built.clone();
    // the views made here are the only node view: a pod admitted on them shows the lifecycle made them
    let (view_tx, view_rx) = watch::channel(Some(node_view()));
    let view = NodeViewFeed::Make(Box::new(move || {
        flag.store(true, Ordering::SeqCst);
        NodeViews::from(view_rx)
    }));
    let lifecycle = lifecycle_of(config, &runtime, view)
        .with_events(Arc::new(MemoryEvents::default()))
        .with_source(source);
    let cancel = CancellationToken::new();
    let run = tokio::spawn(
        lifecycle
            .run(cancel.clone())
            .map(|r| r.expect("the runtime answers")),
    );
    Node {
        runtime,
        _view: view_tx,
        feed,
        built,
        cancel,
        run,
    }
}

async fn sandboxes(runtime: &FakeRuntime) -> usize {
    runtime
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .items
        .len()
}

async fn settle() {
    tokio::time::sleep(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn a_node_builds_its_pod_side_at_its_first_pod_and_runs_it() {
    let node = start(FakeRuntime::new(FakeConfig::default()));
    node.feed.send(PodEvent::Snapshot(Vec::new())).await.unwrap();
    settle().await;
    assert!(
        !node.built.load(Ordering::SeqCst),
        "no pod yet: only the source runs"
    );

    let web = pod(
        "web",
        json!({"containers": [{"name": "c", "image": "img"}]}),
        json!({}),
    );
    node.feed.send(PodEvent::Apply(Box::new(web))).await.unwrap();
    let mut waited = Duration::ZERO;
    while sandboxes(&node.runtime).await == 0 {
        assert!(
            waited < Duration::from_secs(30),
            "the first pod never got a sandbox"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
    assert!(
        node.built.load(Ordering::SeqCst),
        "the pod side is built for the first pod"
    );
    node.cancel.cancel();
    node.run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_node_whose_runtime_holds_a_sandbox_builds_its_pod_side_at_once() {
    let runtime = FakeRuntime::new(FakeConfig::default());
    crate::pods::tests::leftover_sandbox(&runtime, "left").await;
    let node = start(runtime);
    settle().await;
    assert!(
        node.built.load(Ordering::SeqCst),
        "what a previous run left must be met before any pod arrives"
    );
    node.cancel.cancel();
    node.run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_real_node_builds_its_pod_side_at_once() {
    let root = tempfile::tempdir().expect("a temporary root directory");
    let mut config = PodConfig::new("n1");
    config.kind = NodeKind::Real;
    config.layout.pods_dir = Some(root.path().join("pods"));
    let node = start_as(config, FakeRuntime::new(FakeConfig::default()));
    node.feed.send(PodEvent::Snapshot(Vec::new())).await.unwrap();
    settle().await;
    assert!(
        node.built.load(Ordering::SeqCst),
        "a real node has no first-pod wait: its pod side runs from the start"
    );
    node.cancel.cancel();
    node.run.await.unwrap();
}

/// What a node without pods holds of its pod side while it waits, besides the source's watch and the lifecycle's
/// task: the lifecycle's parts (boxed) and this wait, the boxed future that builds the rest (its task tracker
/// and the token stopping its tasks are made only then). The wait polls its inputs by hand, boxes the wait for
/// the runtime's first answer, and the parts box the static pod sources' settings: the ceilings keep both in
/// the allocations they have today (the figures and their history: docs/density.md, "The first-pod wait").
#[tokio::test]
async fn a_node_without_pods_waits_in_little() {
    let runtime = FakeRuntime::new(FakeConfig::default());
    let (_view, view_rx) = watch::channel(Some(node_view()));
    let lifecycle = lifecycle(&runtime, view_rx);
    let cancel = CancellationToken::new();
    let parts = size_of::<PodLifecycle>();
    let wait = size_of_val(&Box::new(lifecycle).start(&cancel));
    println!("lifecycle parts {parts} bytes, wait {wait} bytes");
    // the parts are boxed in jemalloc's 448 class
    assert!(parts <= 400, "the lifecycle's parts grew: {parts} bytes");
    assert!(wait <= 320, "the wait for the first pod grew: {wait} bytes");
}
