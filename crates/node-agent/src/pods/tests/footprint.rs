//! What a node holds per pod, checked where a user of a large fleet would feel it: small channel messages,
//! the idle worker's future, and records that share one allocation instead of copying it (image names,
//! sandbox IDs, the pod's UID). The ceilings keep each record or task in the allocation it has today; the
//! figures and their history are in docs/density.md ("Future-size ceilings").

use std::sync::Arc;
use std::time::Duration;

use cri_fake::{FakeConfig, FakeRuntime};
use serde_json::json;

use crate::density::watch;
use crate::pods::PodConfig;
use crate::pods::actions::context::ActionCtx;
use crate::pods::events::{MemoryEvents, Recorder};
use crate::pods::metrics::PodMetrics;
use crate::pods::runtime::observed::Reread;
use crate::pods::source::PodEvent;
use crate::pods::status::StatusHandle;
use crate::pods::tests::{Harness, fake_probes, node_view, pod};
use crate::pods::worker::AgentCtx;

/// A queued message is a node of its channel's queue, sized by the message (`crate::density::chan`), and every
/// hollow node and every pod keeps such channels: messages stay small.
#[test]
fn channel_messages_stay_small() {
    assert!(
        std::mem::size_of::<PodEvent>() <= 32,
        "{}",
        std::mem::size_of::<PodEvent>()
    );
    assert!(std::mem::size_of::<crate::pods::worker::pod_worker::WorkerMsg>() <= 16);
    assert!(std::mem::size_of::<crate::pods::worker::pleg::PlegEvent>() <= 24);
}

/// An agent context on `runtime` for tests that call the lifecycle's parts directly: node n1 with a fixed node
/// view, status messages going nowhere.
fn bare_ctx(runtime: &FakeRuntime) -> AgentCtx {
    let (status, _status_rx) = StatusHandle::channel();
    let (_node_tx, node_rx) = watch::channel(Some(node_view()));
    AgentCtx {
        actions: ActionCtx {
            config: PodConfig::new("n1"),
            runtime: Arc::new(runtime.clone()),
            runtime_type: "cri-fake".into(),
            probes: Arc::new(fake_probes(runtime.clone())),
            events: Recorder::new(Arc::new(MemoryEvents::default())),
            metrics: Arc::new(PodMetrics::new()),
            probe_metrics: Arc::new(crate::pods::ProbeMetrics::default()),
            status,
            node: node_rx.into(),
            objects: Arc::new(crate::pods::actions::objects::NoObjects),
            pulls: Arc::default(),
        },
        reports: crate::density::chan::unbounded_channel().0,
        tasks: tokio_util::task::TaskTracker::new(),
    }
}

/// A waiting pod costs its worker's state, boxed in the pod manager's table (no task, channel or timer: the
/// manager holds its wake time and spawns a task for each turn); a turn's task holds the worker's box and its
/// step, boxed apart.
#[tokio::test]
async fn a_waiting_pod_worker_stays_small() {
    let ctx = Arc::new(bare_ctx(&FakeRuntime::new(FakeConfig::default())));
    let p = pod(
        "sized",
        json!({"containers": [{"name": "app", "image": "pause"}]}),
        json!({}),
    );
    let init = crate::pods::worker::pod_worker::WorkerInit {
        pod: crate::pods::model::spec::DesiredPod::from_pod(&p).expect("a valid pod"),
        api_status: None,
        rejected: None,
        timeline: None,
    };
    let (pleg_tx, _pleg_rx) = crate::density::chan::unbounded_channel();
    let pleg =
        size_of_val(&crate::pods::worker::pleg::Pleg::new(ctx.clone(), pleg_tx).run(std::future::pending()));
    println!("PLEG run future {pleg} bytes");
    // joined into the pod side's task for the node's life: its retry back-off and relisting loop are boxed
    assert!(pleg <= 528, "the PLEG's run future is {pleg} bytes");
    let mut view = crate::pods::runtime::observed::RuntimeView::default();
    let refresh = size_of_val(&view.refresh(ctx.view_source(), "u1", Reread::Kept));
    println!("runtime view refresh {refresh} bytes");
    // a sync or a termination holds it (boxed with the step, while the step runs): the status answer is matched
    // where it is awaited, and the termination message is read in a box of its own
    assert!(refresh <= 1_792, "a runtime view refresh is {refresh} bytes");
    let worker = Box::new(crate::pods::worker::pod_worker::PodWorker::new(ctx, init));
    let worker_size = size_of_val(&*worker);
    let turn = size_of_val(&worker.turn());
    println!("PodWorker {worker_size} bytes, a turn's future {turn} bytes");
    // a waiting worker is this box in the manager's table, for the pod's life: no task, channel or timer of its
    // own
    assert!(
        worker_size <= 256,
        "a pod worker is {worker_size} bytes (past jemalloc's 256-byte class)"
    );
    // a turn's task (alive only while a step runs) in the smallest task cell that holds it
    assert!(turn <= 144, "a turn's future is {turn} bytes");
}

/// The pod side's three long-lived futures (status writer, PLEG, pod watch) run joined in one task for the
/// node's life; the join stops the PLEG and the watch itself, so neither holds a cancellation wait.
#[tokio::test]
async fn the_pod_sides_joined_task_stays_small() {
    let ctx = Arc::new(bare_ctx(&FakeRuntime::new(FakeConfig::default())));
    let service = tower::service_fn(|_req: http::Request<kube::client::Body>| {
        std::future::pending::<Result<http::Response<kube::client::Body>, std::convert::Infallible>>()
    });
    let client = crate::client::ApiClient::from(kube::Client::new(service, "default"));
    let (_status, status_rx) = StatusHandle::channel();
    let writer = crate::pods::status::StatusManager::new(
        client.clone(),
        crate::api::ApiCalls::new(Arc::new(crate::metrics::Metrics::unregistered()), 5, 10),
        status_rx,
        Arc::new(PodMetrics::new()),
        crate::pods::static_pods::Mirrors::default(),
    );
    let token = tokio_util::sync::CancellationToken::new();
    let (pleg_tx, _pleg_rx) = crate::density::chan::unbounded_channel();
    let (tx, _rx) = crate::density::chan::channel(1);
    let (writer, pleg, watch) = (
        writer.run(token.clone()),
        crate::pods::worker::pleg::Pleg::new(ctx, pleg_tx).run(std::future::pending()),
        crate::pods::source::watch_node_pods(client, "n1", tx, std::future::pending()),
    );
    let parts = [size_of_val(&writer), size_of_val(&pleg), size_of_val(&watch)];
    let joined = size_of_val(&crate::density::join::join3_stop(token, writer, pleg, watch));
    println!("pod side: status writer, PLEG, pod watch {parts:?} bytes, joined {joined} bytes");
    // held for the node's life once it has pods: the join stops the PLEG and the watch (neither waits on the
    // agent's token), the writer uses a fixed hasher and boxes its flush list, and the watch keeps no empty
    // queue nor a copy of its selector; the ceiling keeps the task in its current cell
    assert!(
        joined <= 912,
        "the pod side's joined future ({joined} bytes) no longer fits a 1,024-byte task"
    );
}

/// Every container's record shares its image name and digest with the other containers of that image, and its
/// sandbox ID with its pod's sandbox record: one allocation each, not one per container.
#[tokio::test(start_paused = true)]
async fn runtime_records_share_image_names_and_sandbox_ids() {
    let mut h = Harness::start();
    let spec = json!({"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]});
    let pods = vec![pod("a", spec.clone(), json!({})), pod("b", spec, json!({}))];
    h.send(PodEvent::Snapshot(pods)).await;
    h.until("both Running", Duration::from_secs(30), |h| {
        h.phase("a") == Some("Running") && h.phase("b") == Some("Running")
    })
    .await;
    let reported = &h.status("a").unwrap().container_statuses.as_ref().unwrap()[0];
    let ctx = bare_ctx(&h.runtime);
    let (mut a, mut b) = (
        crate::pods::runtime::observed::RuntimeView::default(),
        crate::pods::runtime::observed::RuntimeView::default(),
    );
    a.refresh(ctx.view_source(), "uid-a", Reread::Kept).await.unwrap();
    b.refresh(ctx.view_source(), "uid-b", Reread::Kept).await.unwrap();
    let (ca, cb) = (a.latest("app").unwrap(), b.latest("app").unwrap());
    assert_eq!(ca.image(), reported.image.as_str());
    assert_eq!(ca.image_ref(), reported.image_id.as_str());
    assert!(!ca.image_ref().is_empty());
    assert!(
        Arc::ptr_eq(&ca.images, &cb.images),
        "one copy of the image name and digest"
    );
    assert!(Arc::ptr_eq(&ca.sandbox_id, &a.sandbox().unwrap().id));
    assert_ne!(ca.sandbox_id, cb.sandbox_id);
    h.stop().await;
}

/// A pod's UID is one allocation for the pod's life: the desired state of every update takes the one the pod
/// manager keys its worker on, and the status writer's table keys on what the worker sends.
#[tokio::test(start_paused = true)]
async fn a_pods_uid_is_one_allocation_across_its_updates() {
    let mut h = Harness::start();
    let spec = json!({"containers": [{"name": "app", "image": "pause"}]});
    let first = pod("a", spec, json!({}));
    h.send(PodEvent::Snapshot(vec![first.clone()])).await;
    h.until("Running", Duration::from_secs(30), |h| {
        h.phase("a") == Some("Running")
    })
    .await;
    let mut labelled = first.clone();
    labelled.metadata.labels = Some([("tier".to_owned(), "web".to_owned())].into());
    h.send(PodEvent::Apply(Box::new(labelled.clone()))).await;
    let mut gone = labelled;
    gone.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    gone.metadata.deletion_grace_period_seconds = Some(0);
    h.send(PodEvent::Apply(Box::new(gone))).await;
    h.until("deleted", Duration::from_secs(30), |h| {
        h.deleted.iter().any(|u| u == "uid-a")
    })
    .await;
    let terminal = h.status("a").and_then(|s| s.phase.clone());
    assert!(
        matches!(terminal.as_deref(), Some("Succeeded" | "Failed")),
        "a final status after the updates: {terminal:?}"
    );
    let (running, rest) = h.uids.split_first().expect("statuses were sent");
    assert!(
        rest.len() >= 2,
        "a final status and the deletion after the updates"
    );
    for uid in rest {
        assert_eq!(**uid, *"uid-a");
        assert!(
            Arc::ptr_eq(running, uid),
            "every message carries the first desired state's UID"
        );
    }
    h.stop().await;
}

/// One per agent, shared by its pod workers: the context and the `Arc`'s two counts stay within the allocation
/// they have today (the runtime's name is an exact-size string).
#[test]
fn the_pod_sides_shared_context_fits_its_class() {
    let size = size_of::<AgentCtx>();
    println!("AgentCtx {size} bytes");
    assert!(size + 16 <= 448, "AgentCtx is {size} bytes");
}
