//! Probes and hooks under paused time: readiness flipping, liveness restarts, startup gating, exec probes,
//! a failing postStart hook.

use std::time::Duration;

use serde_json::json;

use crate::pods::source::PodEvent;
use crate::pods::tests::{Harness, pod};

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[tokio::test(start_paused = true)]
async fn readiness_flips_when_the_probe_starts_passing() {
    let mut h = Harness::start();
    let p = pod(
        "ready",
        json!({"containers": [{"name": "app", "image": "nginx:1.27",
            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 1}}]}),
        json!({"cri-fake.node-agent.io/probe": "http:8080/ready=fail, ok@20s"}),
    );
    h.send(PodEvent::Snapshot(vec![p])).await;
    h.until("Running", Duration::from_secs(5), |h| {
        h.phase("ready") == Some("Running")
    })
    .await;
    assert_eq!(h.condition("ready", "Ready"), Some(false));
    let t = h
        .until("Ready", Duration::from_secs(40), |h| {
            h.condition("ready", "Ready") == Some(true)
        })
        .await;
    assert!(secs(t) >= 20.0 && secs(t) < 21.2, "Ready at {t:?}");
    assert!(
        h.event_reasons()
            .iter()
            .any(|(r, m)| *r == "Unhealthy" && m.starts_with("Readiness probe failed"))
    );
    println!("ready after {:.2} s", secs(t));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn liveness_failure_restarts_the_container() {
    let mut h = Harness::start();
    let p = pod(
        "live",
        json!({"containers": [{"name": "app", "image": "nginx:1.27",
            "livenessProbe": {"tcpSocket": {"port": 9000}, "periodSeconds": 1, "failureThreshold": 3}}]}),
        json!({"cri-fake.node-agent.io/probe": "tcp:9000=ok, fail@5s"}),
    );
    h.send(PodEvent::Snapshot(vec![p])).await;
    let t = h
        .until("restart", Duration::from_secs(30), |h| {
            h.restart_count("live", "app") == Some(1)
        })
        .await;
    assert!(
        secs(t) >= 7.0 && secs(t) < 8.0,
        "three failures from 5 s, then a kill: {t:?}"
    );
    let reasons = h.event_reasons();
    assert!(
        reasons
            .iter()
            .any(|(r, m)| *r == "Killing" && m == "Container app failed liveness probe, will be restarted")
    );
    assert_eq!(
        reasons
            .iter()
            .filter(|(r, m)| *r == "Unhealthy" && m.starts_with("Liveness probe failed"))
            .count(),
        3
    );
    // /metrics/probes: the runs in the first 5 s passed (and the new container's first), three failed; the
    // series outlive the container's restart
    let series = |result: &str| {
        format!(
            "prober_probe_total{{container=\"app\",namespace=\"default\",pod=\"live\",pod_uid=\"uid-live\",\
             probe_type=\"Liveness\",result=\"{result}\"}}"
        )
    };
    let count = |text: &str, result: &str| -> u64 {
        let prefix = series(result);
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    let text = h.probe_metrics.encode();
    assert_eq!(count(&text, "failed"), 3, "{text}");
    assert!(count(&text, "successful") >= 5, "{text}");
    assert!(
        text.contains(
            "prober_probe_duration_seconds_count{container=\"app\",namespace=\"default\",pod=\"live\",\
             probe_type=\"Liveness\"}"
        ),
        "{text}"
    );
    // the pod goes: so do its series
    let gone = pod(
        "live",
        json!({"containers": [{"name": "app", "image": "nginx:1.27"}]}),
        json!({}),
    );
    h.send(PodEvent::Delete(Box::new(gone))).await;
    h.until("series removed", Duration::from_secs(60), |h| {
        h.probe_metrics.pods() == 0
    })
    .await;
    assert!(!h.probe_metrics.encode().contains("pod=\"live\""));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn startup_probe_holds_liveness_until_it_passes() {
    let mut h = Harness::start();
    let p = pod(
        "slow",
        json!({"containers": [{"name": "app", "image": "nginx:1.27",
            "startupProbe": {"httpGet": {"path": "/started", "port": 8081}, "periodSeconds": 1, "failureThreshold": 30},
            "livenessProbe": {"tcpSocket": {"port": 9000}, "periodSeconds": 1, "failureThreshold": 1}}]}),
        json!({"cri-fake.node-agent.io/probe": "http:8081/started=fail, ok@10s; tcp:9000=fail, ok@10s"}),
    );
    h.send(PodEvent::Snapshot(vec![p])).await;
    h.until("Running", Duration::from_secs(5), |h| {
        h.phase("slow") == Some("Running")
    })
    .await;
    let started = |h: &Harness| {
        h.status("slow")
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c[0].started)
            == Some(true)
    };
    let t = h.until("started", Duration::from_secs(30), started).await;
    assert!(secs(t) >= 10.0 && secs(t) < 11.2, "started at {t:?}");
    assert_eq!(h.condition("slow", "Ready"), Some(true));
    tokio::time::sleep(Duration::from_secs(5)).await;
    h.until("settled", Duration::from_secs(1), |_| true).await;
    assert_eq!(
        h.restart_count("slow", "app"),
        Some(0),
        "liveness never ran before startup passed"
    );
    assert!(
        !h.event_reasons()
            .iter()
            .any(|(r, m)| *r == "Unhealthy" && m.starts_with("Liveness"))
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn exec_probes_and_a_failing_post_start_hook() {
    let mut h = Harness::start();
    let p = pod(
        "hooks",
        json!({"containers": [
            {"name": "hooked", "image": "nginx:1.27", "lifecycle": {"postStart": {"exec": {"command": ["/bin/warmup"]}}}},
            {"name": "checked", "image": "nginx:1.27",
             "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 1}}
        ]}),
        json!({
            "cri-fake.node-agent.io/exec.hooked": "[{\"cmd\": \"/bin/warmup\", \"exitCode\": 1, \"stderr\": \"cold\"}]",
            "cri-fake.node-agent.io/exec.checked":
                "[{\"cmd\": \"*\", \"exitCode\": 1, \"stdout\": \"no\"}, {\"cmd\": \"cat /tmp/ready\", \"after\": \"5s\"}]"
        }),
    );
    h.send(PodEvent::Snapshot(vec![p])).await;
    h.until("hook kill and restart", Duration::from_secs(30), |h| {
        h.restart_count("hooks", "hooked") >= Some(1)
    })
    .await;
    let reasons = h.event_reasons();
    assert!(
        reasons
            .iter()
            .any(|(r, m)| *r == "FailedPostStartHook" && m.contains("cold")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|(r, m)| *r == "Killing" && m == "FailedPostStartHook")
    );
    let checked_ready = |h: &Harness| {
        let s = h
            .status("hooks")
            .and_then(|s| s.container_statuses.clone())
            .unwrap_or_default();
        s.iter().any(|c| c.name == "checked" && c.ready)
    };
    let t = h
        .until("exec readiness", Duration::from_secs(30), checked_ready)
        .await;
    assert!((5.0..6.2).contains(&secs(t)), "ready at {t:?}");
    assert!(
        h.event_reasons()
            .iter()
            .any(|(r, m)| *r == "Unhealthy" && m == "Readiness probe failed: no")
    );
    h.stop().await;
}
