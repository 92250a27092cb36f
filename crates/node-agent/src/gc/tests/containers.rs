//! The container collector: what a pass removes from the runtime, which pods it leaves alone, its clock, its loop.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use runtime_api::{Runtime, cri};

use super::*;
use crate::events::{CapturedEvents, EventType};

#[tokio::test(start_paused = true)]
async fn dead_containers_and_sandboxes_go_by_the_policy() {
    let rt = runtime();
    // built before time moves: its clock and the fake runtime's agree only from a common start
    let gc = ContainerGc::new(
        Arc::new(rt.clone()),
        &settings(1, Duration::ZERO),
        pods_answering(known(&["p"])),
        None,
    );
    pull(&rt, "busybox", "5Mi").await;
    let sb = sandbox(&rt, "p").await;
    crash_looped(&rt, &sb, "p", 4).await;
    let gone = sandbox(&rt, "gone").await;
    start(&rt, &gone, "gone", "app", 0, "busybox", false).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: gone.clone(),
    })
    .await
    .unwrap();

    let report = gc.collect().await.unwrap();
    assert_eq!(
        (report.containers, report.sandboxes, report.failed),
        (4, 1, 0),
        "{report:?}"
    );
    assert_eq!(
        containers(&rt).await,
        [
            ("p".into(), "app".into(), 3, false),
            ("p".into(), "app".into(), 4, true)
        ],
        "the running instance and the newest dead one stay; the gone pod's container goes"
    );
    let sandboxes = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .items;
    assert_eq!(sandboxes.len(), 1);
    assert_eq!(sandboxes[0].id, sb);
    // a second pass finds nothing more
    assert_eq!(gc.collect().await.unwrap(), ContainerGcReport::default());
}

#[tokio::test(start_paused = true)]
async fn container_age_is_counted_on_the_agents_clock() {
    let rt = runtime();
    let gc = ContainerGc::new(
        Arc::new(rt.clone()),
        &settings(0, Duration::from_secs(60)),
        pods_answering(known(&["p"])),
        None,
    );
    pull(&rt, "busybox", "5Mi").await;
    let sb = sandbox(&rt, "p").await;
    crash_looped(&rt, &sb, "p", 3).await;
    // instances 0..2 are dead, at most 6 s old: too young
    assert_eq!(gc.collect().await.unwrap().containers, 0);
    tokio::time::sleep(Duration::from_secs(61)).await;
    // 0 and 1 go; 2, the newest dead instance, stays behind the running one
    let report = gc.collect().await.unwrap();
    assert_eq!(report.containers, 2, "{:?}", containers(&rt).await);
    assert_eq!(
        containers(&rt).await,
        [
            ("p".into(), "app".into(), 2, false),
            ("p".into(), "app".into(), 3, true)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn pods_count_as_living_until_the_manager_has_seen_every_source() {
    let rt = runtime();
    let answer = Arc::new(Mutex::new(None));
    let gc = ContainerGc::new(
        Arc::new(rt.clone()),
        &settings(0, Duration::ZERO),
        pods_answering(answer.clone()),
        None,
    );
    pull(&rt, "busybox", "5Mi").await;
    let sb = sandbox(&rt, "old").await;
    for r in 0..3 {
        start(&rt, &sb, "old", "app", r, "busybox", false).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    })
    .await
    .unwrap();
    // not known yet: the policy applies, the two newest instances and the sandbox stay
    let report = gc.collect().await.unwrap();
    assert_eq!((report.containers, report.sandboxes), (1, 0));
    assert_eq!(containers(&rt).await.len(), 2);
    // the manager has seen every source and has no such pod: it is gone, everything of it goes
    *answer.lock().unwrap() = Some(KnownPods::default());
    let report = gc.collect().await.unwrap();
    assert_eq!((report.containers, report.sandboxes), (2, 1));
    assert_eq!(rt.counts().containers + rt.counts().sandboxes, 0);
}

#[tokio::test(start_paused = true)]
async fn reclaiming_takes_the_containers_of_terminated_pods_too() {
    let rt = runtime();
    let mut pods = KnownPods::default();
    pods.insert("done", true);
    let gc = ContainerGc::new(
        Arc::new(rt.clone()),
        &settings(1, Duration::ZERO),
        pods_answering(Arc::new(Mutex::new(Some(pods)))),
        None,
    );
    pull(&rt, "busybox", "5Mi").await;
    let sb = sandbox(&rt, "done").await;
    start(&rt, &sb, "done", "app", 0, "busybox", false).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        gc.collect().await.unwrap().containers,
        0,
        "its status still needs it"
    );
    assert_eq!(gc.delete_all_unused().await.unwrap().containers, 1);
}

#[tokio::test(start_paused = true)]
async fn the_container_loop_runs_once_a_period_and_reports_failures_on_the_node() {
    let rt = runtime();
    let gc = ContainerGc::new(
        Arc::new(rt.clone()),
        &settings(1, Duration::ZERO),
        pods_answering(known(&["p"])),
        None,
    );
    pull(&rt, "busybox", "5Mi").await;
    let sb = sandbox(&rt, "p").await;
    crash_looped(&rt, &sb, "p", 3).await;
    let (events, mut seen) = CapturedEvents::new();
    let token = tokio_util::sync::CancellationToken::new();
    let collectors = GarbageCollectors {
        containers: gc,
        images: image_gc_off(&rt, events.clone()),
    };
    let task = tokio::spawn(token.clone().run_until_cancelled_owned(run(
        collectors,
        events,
        "n1".into(),
        periods(60, 300),
        crate::density::timer::Timer::new(),
    )));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(containers(&rt).await.len(), 2, "one pass within the first period");
    rt.set_reachable(false);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let events = seen.drain();
    assert_eq!(events.len(), 1, "{events:?}");
    let (kind, reason, message, object) = &events[0];
    assert_eq!(
        (*kind, reason.as_str(), object.as_str()),
        (EventType::Warning, CONTAINER_GC_FAILED, "n1")
    );
    assert!(message.starts_with("failed to list containers"), "{message}");
    token.cancel();
    task.await.unwrap();
}
