//! Evictions through the real pod manager and workers: the active-pod list the eviction manager ranks, and an
//! evicted pod stopped within the override grace period and reported as the kubelet reports it.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::pods::manager::control::{EvictOrder, ManagerControl};

async fn active(h: &Harness) -> Vec<crate::pods::manager::control::ActivePod> {
    let (answer, wait) = tokio::sync::oneshot::channel();
    h.control.send(ManagerControl::ActivePods(answer)).unwrap();
    let mut pods = wait.await.unwrap();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    pods
}

#[tokio::test(start_paused = true)]
async fn an_evicted_pod_stops_within_the_override_and_fails_with_the_message() {
    let mut h = Harness::start();
    let hog = pod(
        "hog",
        json!({"terminationGracePeriodSeconds": 30,
               "containers": [{"name": "app", "image": "nginx:1.27"}]}),
        json!({"cri-fake.node-agent.io/stop-duration": "20s"}),
    );
    let small = pod(
        "small",
        json!({"priority": 100, "containers": [{"name": "app", "image": "nginx:1.27",
               "resources": {"requests": {"memory": "64Mi", "ephemeral-storage": "1Gi"}}}]}),
        json!({}),
    );
    h.send(PodEvent::Snapshot(vec![hog, small])).await;
    h.until("both Running", Duration::from_secs(30), |h| {
        h.phase("hog") == Some("Running") && h.phase("small") == Some("Running")
    })
    .await;

    let pods = active(&h).await;
    let names: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["hog", "small"]);
    assert_eq!(pods[1].priority, 100);
    assert_eq!(pods[1].memory_request, 64 << 20);
    assert_eq!(pods[1].ephemeral_request, 1 << 30);
    assert_eq!(pods[1].containers, [("app".to_owned(), 64 << 20, 1 << 30)]);
    assert_eq!(pods[0].grace_secs, 30);
    assert!(!pods[0].critical);

    let message = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 10Mi. ";
    let (done, stopped) = tokio::sync::oneshot::channel();
    let start = h.t0.elapsed();
    h.control
        .send(ManagerControl::Evict(Box::new(EvictOrder {
            uid: "uid-hog".into(),
            grace_secs: 1,
            reason: "Evicted".into(),
            message: message.into(),
            done,
        })))
        .unwrap();
    let took = h
        .until("hog evicted", Duration::from_secs(10), |h| {
            h.phase("hog") == Some("Failed")
        })
        .await
        - start;
    // the container would take 20 s to stop on its own; the override kills it after 1 s
    assert!(
        took < Duration::from_secs(3),
        "evicted within the 1 s override: {took:?}"
    );
    let s = h.status("hog").unwrap();
    assert_eq!(s.reason.as_deref(), Some("Evicted"));
    assert_eq!(s.message.as_deref(), Some(message));
    assert_eq!(h.condition("hog", "DisruptionTarget"), Some(true));
    assert!(
        stopped.await.unwrap(),
        "the order is answered once the pod stopped"
    );
    assert_eq!(h.phase("small"), Some("Running"));

    let names: Vec<String> = active(&h).await.into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["small"], "an evicted pod is no longer active");

    // no such pod: answered false at once
    let (done, answer) = tokio::sync::oneshot::channel();
    h.control
        .send(ManagerControl::Evict(Box::new(EvictOrder {
            uid: "uid-nope".into(),
            grace_secs: 1,
            reason: "Evicted".into(),
            message: message.into(),
            done,
        })))
        .unwrap();
    assert!(!answer.await.unwrap());
    h.stop().await;
}
