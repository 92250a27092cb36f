//! Container events pushed to subscribers, and the per-runtime timer that pushes them, under paused time.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use runtime_api::{Runtime, cri};
use tokio::time::{Instant, advance};

use super::*;

fn kind(e: &cri::ContainerEventResponse) -> cri::ContainerEventType {
    cri::ContainerEventType::try_from(e.container_event_type).unwrap()
}

#[tokio::test(start_paused = true)]
async fn events_are_pushed_without_polling() {
    use cri::ContainerEventType::*;
    let rt = fake();
    let mut events = rt.get_container_events(Default::default()).await.unwrap();
    let pod = run_pod(&rt, "p", &[]).await;
    let id = run_scripted(&rt, &pod, "c", &[("exit-after", "10s"), ("exit-code", "2")]).await;
    let t0 = Instant::now();
    let mut seen = Vec::new();
    for _ in 0..5 {
        let e = events.next().await.unwrap().unwrap();
        seen.push((kind(&e), e.container_id.clone()));
        if kind(&e) == ContainerStoppedEvent {
            // pushed by the runtime's timer at the scripted time: nobody called the runtime meanwhile
            assert_eq!(t0.elapsed(), Duration::from_secs(10));
            let statuses = &e.containers_statuses;
            assert_eq!(statuses.len(), 1);
            assert_eq!((statuses[0].exit_code, statuses[0].reason.as_str()), (2, "Error"));
            assert_eq!(e.pod_sandbox_status.as_ref().unwrap().id, pod);
            assert_eq!(e.created_at, statuses[0].finished_at);
        }
    }
    assert_eq!(
        seen,
        [
            (ContainerCreatedEvent, pod.clone()),
            (ContainerStartedEvent, pod.clone()),
            (ContainerCreatedEvent, id.clone()),
            (ContainerStartedEvent, id.clone()),
            (ContainerStoppedEvent, id.clone()),
        ]
    );

    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    let mut rest = Vec::new();
    for _ in 0..3 {
        let e = events.next().await.unwrap().unwrap();
        rest.push((kind(&e), e.container_id));
    }
    assert_eq!(
        rest,
        [
            (ContainerStoppedEvent, pod.clone()),
            (ContainerDeletedEvent, id),
            (ContainerDeletedEvent, pod)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn every_subscriber_gets_every_event_and_closed_ones_are_dropped() {
    let rt = fake();
    let mut a = rt.get_container_events(Default::default()).await.unwrap();
    let b = rt.get_container_events(Default::default()).await.unwrap();
    drop(b);
    run_pod(&rt, "p", &[]).await;
    assert!(a.next().await.is_some());
    assert!(a.next().await.is_some());
    assert_eq!(
        rt.counts().events_sent,
        2,
        "the closed subscriber was dropped at the first event"
    );
    assert_eq!(rt.lock().subscribers.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_runtime_ends_its_timer() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[]).await;
    run_scripted(&rt, &pod, "c", &[("exit-after", "1h")]).await;
    let weak = Arc::downgrade(&rt.inner);
    drop(rt);
    assert!(weak.upgrade().is_none(), "the timer holds no strong reference");
    advance(Duration::from_secs(3600)).await;
}

#[tokio::test(start_paused = true)]
async fn an_earlier_deadline_wakes_the_timer() {
    let rt = fake();
    let mut events = rt.get_container_events(Default::default()).await.unwrap();
    let pod = run_pod(&rt, "p", &[]).await;
    run_scripted(&rt, &pod, "late", &[("exit-after", "1h")]).await;
    let early = run_scripted(&rt, &pod, "early", &[("exit-after", "5s")]).await;
    let t0 = Instant::now();
    loop {
        let e = events.next().await.unwrap().unwrap();
        if kind(&e) == cri::ContainerEventType::ContainerStoppedEvent {
            assert_eq!(e.container_id, early);
            assert_eq!(t0.elapsed(), Duration::from_secs(5));
            break;
        }
    }
}

#[test]
fn a_runtime_outliving_its_tokio_runtime_gets_a_new_timer() {
    let paused = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
    };
    let rt = fake();
    paused().block_on(async {
        let pod = run_pod(&rt, "p", &[]).await;
        run_scripted(&rt, &pod, "first", &[("exit-after", "1h")]).await;
    });
    // the first tokio runtime is gone, and its timer task with it
    paused().block_on(async {
        let mut events = rt.get_container_events(Default::default()).await.unwrap();
        let pod = rt.list_pod_sandbox(Default::default()).await.unwrap().items[0]
            .id
            .clone();
        let id = run_scripted(&rt, &pod, "second", &[("exit-after", "5s")]).await;
        loop {
            let e = events.next().await.unwrap().unwrap();
            if kind(&e) == cri::ContainerEventType::ContainerStoppedEvent {
                assert_eq!(e.container_id, id);
                break;
            }
        }
    });
}
