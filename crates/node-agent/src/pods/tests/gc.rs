//! The container garbage collector beside the real pod manager and workers: it asks the manager which pods
//! exist, trims a crash-looping container's dead instances to the policy while the restart count keeps rising
//! and `lastState` stays, and takes nothing of a pod before the manager has seen its sources.

use std::time::Duration;

use serde_json::json;

use crate::config::GcSettings;
use crate::gc::{ContainerGc, GarbageCollectors, ImageGc, ImagePolicy, Periods, RuntimeImageFs};
use crate::pods::PodsQuery;
use crate::pods::source::PodEvent;
use crate::pods::tests::{Harness, pod};

fn exited(list: &[(String, u32, i32, String)]) -> usize {
    list.iter().filter(|c| c.2 == 2).count()
}

#[tokio::test(start_paused = true)]
async fn the_manager_answers_which_pods_exist_once_its_sources_are_seen() {
    let h = Harness::start();
    let query = PodsQuery::new(h.control.clone());
    assert_eq!(query.known_pods().await, None, "no pod list yet");
    let p = pod(
        "web",
        json!({"containers": [{"name": "app", "image": "nginx"}]}),
        json!({}),
    );
    h.send(PodEvent::Snapshot(vec![p.clone()])).await;
    // the question may overtake the list on its way to the manager: ask until the list is in
    let mut known = None;
    for _ in 0..10 {
        known = query.known_pods().await;
        if known.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let known = known.expect("sources seen");
    assert!(known.exists("uid-web") && !known.terminated("uid-web"));
    assert!(!known.exists("uid-other"));
    h.send(PodEvent::Delete(Box::new(p))).await;
    let mut gone = false;
    for _ in 0..100 {
        if !query.known_pods().await.expect("seen").exists("uid-web") {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "a removed pod leaves the answer once its worker is done");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_crash_loop_keeps_its_restart_count_and_last_state_while_dead_instances_are_collected() {
    let mut h = Harness::start();
    let gc = ContainerGc::new(
        std::sync::Arc::new(h.runtime.clone()),
        &GcSettings::default(),
        PodsQuery::new(h.control.clone()),
        None,
    );
    let (events, _seen) = crate::events::CapturedEvents::new();
    let images = ImageGc::new(
        std::sync::Arc::new(h.runtime.clone()),
        ImagePolicy::from_config(&crate::config::KubeletConfig::default()),
        std::sync::Arc::new(RuntimeImageFs::new(
            std::sync::Arc::new(h.runtime.clone()),
            crate::gc::ImageFsKind::Capacity(100 << 30),
        )),
        events.clone(),
        "n1",
        std::sync::Arc::new(crate::metrics::Metrics::unregistered()),
    );
    let token = tokio_util::sync::CancellationToken::new();
    let periods = Periods {
        containers: Duration::from_secs(60),
        images: Duration::from_secs(300),
    };
    let collectors = GarbageCollectors {
        containers: gc,
        images,
    };
    let task = tokio::spawn(token.clone().run_until_cancelled_owned(crate::gc::run(
        collectors,
        events,
        "n1".into(),
        periods,
        crate::density::timer::Timer::new(),
    )));
    let p = pod(
        "crash",
        json!({"containers": [{"name": "app", "image": "busybox:1.36"}]}),
        json!({"cri-fake.node-agent.io/exit-after": "1s", "cri-fake.node-agent.io/exit-code": "1"}),
    );
    h.send(PodEvent::Snapshot(vec![p])).await;
    // restarts at 1, 12, 33, 74, 155 s; the collector passes once a minute meanwhile
    h.until("restart 5", Duration::from_secs(400), |h| {
        h.restart_count("crash", "app") == Some(5)
    })
    .await;
    // after a pass past the last exit: the newest instance (waiting in back-off) and the one before stay
    tokio::time::sleep(Duration::from_secs(65)).await;
    let list = h.containers().await;
    assert_eq!(exited(&list), 2, "{list:?}");
    let attempts: Vec<u32> = list.iter().map(|c| c.1).collect();
    assert_eq!(attempts, [4, 5], "{list:?}");
    h.pump();
    assert_eq!(h.restart_count("crash", "app"), Some(5));
    assert_eq!(
        h.waiting_reason("crash", "app").as_deref(),
        Some("CrashLoopBackOff")
    );
    let last = |h: &Harness| {
        h.status("crash")
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.last_state.as_ref())
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code)
    };
    assert_eq!(last(&h), Some(1));
    // the count keeps rising from the instances that are left
    h.until("restart 6", Duration::from_secs(200), |h| {
        h.restart_count("crash", "app") == Some(6)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(65)).await;
    let list = h.containers().await;
    assert!(exited(&list) <= 2, "{list:?}");
    assert_eq!(list.iter().map(|c| c.1).max(), Some(6));
    h.pump();
    assert_eq!(last(&h), Some(1));
    token.cancel();
    task.await.unwrap();
    h.stop().await;
}
