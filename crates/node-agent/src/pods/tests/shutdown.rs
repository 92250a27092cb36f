//! Graceful node shutdown through the real pod manager and workers: regular pods first, critical pods after,
//! each group within its share of the period, statuses as the kubelet writes them.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::pods::manager::shutdown::{self, MESSAGE, ShutdownRequest};
use crate::pods::model::spec::SYSTEM_CRITICAL_PRIORITY;

fn stopped_by_shutdown(h: &Harness, name: &str) -> bool {
    h.status(name).is_some_and(|s| {
        s.phase.as_deref() == Some("Failed")
            && s.reason.as_deref() == Some("Terminated")
            && s.message.as_deref() == Some(MESSAGE)
    })
}

#[tokio::test(start_paused = true)]
async fn regular_pods_stop_first_then_critical_ones_within_their_periods() {
    let mut h = Harness::start();
    let app = |name: &str, priority: i32, stop: &str| {
        pod(
            name,
            json!({"priority": priority, "containers": [{"name": "app", "image": "nginx:1.27"}]}),
            json!({"cri-fake.node-agent.io/stop-duration": stop}),
        )
    };
    let pods = vec![
        app("web", 0, "3s"),
        app("slow", 1000, "60s"),
        app("dns", SYSTEM_CRITICAL_PRIORITY, "1s"),
    ];
    h.send(PodEvent::Snapshot(pods)).await;
    h.until("all Running", Duration::from_secs(30), |h| {
        ["web", "slow", "dns"]
            .iter()
            .all(|p| h.phase(p) == Some("Running"))
    })
    .await;

    let (done, mut wait) = tokio::sync::oneshot::channel();
    let groups = shutdown::groups(Duration::from_secs(10), Duration::from_secs(4), &[]);
    h.control.send(ShutdownRequest { groups, done }.into()).unwrap();
    let start = h.t0.elapsed();
    // a pod arriving during the shutdown is refused
    h.send(PodEvent::Apply(Box::new(app("late", 0, "0s")))).await;

    let web = h
        .until("web stopped", Duration::from_secs(20), |h| {
            stopped_by_shutdown(h, "web")
        })
        .await
        - start;
    let slow = h
        .until("slow stopped", Duration::from_secs(20), |h| {
            stopped_by_shutdown(h, "slow")
        })
        .await
        - start;
    let dns = h
        .until("dns stopped", Duration::from_secs(20), |h| {
            stopped_by_shutdown(h, "dns")
        })
        .await
        - start;
    let secs = |d: Duration| d.as_secs_f64();
    assert!(
        (2.9..3.6).contains(&secs(web)),
        "web stops in its own 3 s: {web:?}"
    );
    assert!(
        (5.9..6.6).contains(&secs(slow)),
        "slow is killed when the regular pods' 6 s are over: {slow:?}"
    );
    assert!(
        (6.9..7.6).contains(&secs(dns)),
        "the critical pod is stopped only after the regular group, taking its 1 s: {dns:?}"
    );
    let killed = h.status("slow").unwrap().container_statuses.as_ref().unwrap()[0]
        .state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap()
        .exit_code;
    assert_eq!(killed, 137);
    for p in ["web", "slow", "dns"] {
        let c = h
            .status(p)
            .unwrap()
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "DisruptionTarget")
            .cloned()
            .expect("DisruptionTarget");
        assert_eq!(c.status, "True");
        assert_eq!(c.reason.as_deref(), Some("TerminationByKubelet"));
    }
    h.until("late refused", Duration::from_secs(5), |h| {
        h.status("late")
            .is_some_and(|s| s.reason.as_deref() == Some("NodeShutdown"))
    })
    .await;
    let mut answered = false;
    for _ in 0..100 {
        h.pump();
        if wait.try_recv().is_ok() {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(answered, "the request is answered once every group is done");
    h.stop().await;
}
