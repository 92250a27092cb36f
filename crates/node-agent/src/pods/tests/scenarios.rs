//! Scenarios a user would see, under paused time: start order, crash-loop and image-pull back-off, jobs,
//! admission, termination with preStop and grace, an agent restart, the relist fallback.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use crate::pods::source::PodEvent;
use crate::pods::tests::{Harness, pod};

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn started_order(h: &Harness) -> Vec<String> {
    h.event_reasons()
        .into_iter()
        .filter(|(r, _)| *r == "Started")
        .map(|(_, m)| m.trim_start_matches("Started container ").to_owned())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn init_containers_in_order_then_sidecar_then_app() {
    let mut h = Harness::start();
    let p = pod(
        "web",
        json!({
            "initContainers": [
                {"name": "init1", "image": "busybox:1.36"},
                {"name": "side", "image": "envoy:1.30", "restartPolicy": "Always"},
                {"name": "init2", "image": "busybox:1.36"}
            ],
            "containers": [{"name": "app", "image": "nginx:1.27"}]
        }),
        json!({"cri-fake.node-agent.io/exit-after.init1": "1s", "cri-fake.node-agent.io/exit-after.init2": "2s"}),
    );
    h.send(PodEvent::Snapshot(vec![p])).await;
    let t = h
        .until("pod Running", Duration::from_secs(30), |h| {
            h.phase("web") == Some("Running")
        })
        .await;
    assert!(
        secs(t) >= 3.0 && secs(t) < 3.5,
        "init1 (1 s) then init2 (2 s) before the app: {t:?}"
    );
    assert_eq!(started_order(&h), vec!["init1", "side", "init2", "app"]);
    let s = h.status("web").unwrap();
    assert!(
        s.pod_ip.as_deref().unwrap().starts_with("10.128.1."),
        "{:?}",
        s.pod_ip
    );
    assert_eq!(s.host_ip.as_deref(), Some("127.0.0.1"));
    assert_eq!(h.condition("web", "Initialized"), Some(true));
    h.until("Ready", Duration::from_secs(5), |h| {
        h.condition("web", "Ready") == Some(true)
    })
    .await;
    let s = h.status("web").unwrap();
    let side = s
        .init_container_statuses
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.name == "side")
        .unwrap();
    assert!(
        side.state.as_ref().unwrap().running.is_some(),
        "the sidecar keeps running"
    );
    assert_eq!(side.started, Some(true));
    let init1 = &s.init_container_statuses.as_ref().unwrap()[0];
    assert_eq!(
        init1
            .state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .reason
            .as_deref(),
        Some("Completed")
    );
    assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn crash_loop_restarts_with_doubling_back_off() {
    let mut h = Harness::start();
    let p = pod(
        "crash",
        json!({"containers": [{"name": "app", "image": "busybox:1.36"}]}),
        json!({"cri-fake.node-agent.io/exit-after": "1s", "cri-fake.node-agent.io/exit-code": "1"}),
    );
    h.send(PodEvent::Snapshot(vec![p])).await;
    let mut at = Vec::new();
    for n in 1..=5 {
        let t = h
            .until(&format!("restart {n}"), Duration::from_secs(400), |h| {
                h.restart_count("crash", "app") == Some(n)
            })
            .await;
        at.push(secs(t));
    }
    // each instance runs 1 s; restarts wait 0, 10, 20, 40, 80 s after the exit
    let expected = [1.0, 12.0, 33.0, 74.0, 155.0];
    for (got, want) in at.iter().zip(expected) {
        assert!(
            (got - want).abs() < 0.3,
            "restart times {at:?}, expected {expected:?}"
        );
    }
    let waiting = h
        .until("CrashLoopBackOff", Duration::from_secs(5), |h| {
            h.waiting_reason("crash", "app").is_some()
        })
        .await;
    let _ = waiting;
    assert_eq!(
        h.waiting_reason("crash", "app").as_deref(),
        Some("CrashLoopBackOff")
    );
    let s = h.status("crash").unwrap();
    let app = &s.container_statuses.as_ref().unwrap()[0];
    let msg = app
        .state
        .as_ref()
        .unwrap()
        .waiting
        .as_ref()
        .unwrap()
        .message
        .clone()
        .unwrap();
    assert_eq!(
        msg,
        "back-off 2m40s restarting failed container=app pod=crash_default(uid-crash)"
    );
    assert_eq!(
        app.last_state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        1
    );
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert!(
        h.event_reasons()
            .iter()
            .any(|(r, m)| *r == "BackOff" && m.starts_with("Back-off restarting failed container app"))
    );
    // the pod worker removes no dead instance of a running pod: that is the container garbage collector's
    // job (see tests/gc.rs), so every instance is still there
    let exited = h.containers().await.iter().filter(|c| c.2 == 2).count();
    assert!(exited >= 5, "{:?}", h.containers().await);
    println!("crash loop restart times (s): {at:?}");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn jobs_end_succeeded_or_failed_and_are_cleaned_up_on_delete() {
    let mut h = Harness::start();
    let job = |name: &str, code: &str| {
        pod(
            name,
            json!({"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox:1.36"}]}),
            json!({"cri-fake.node-agent.io/exit-after": "2s", "cri-fake.node-agent.io/exit-code": code}),
        )
    };
    let (ok, bad) = (job("ok", "0"), job("bad", "1"));
    h.send(PodEvent::Snapshot(vec![ok.clone(), bad])).await;
    h.until("terminal", Duration::from_secs(10), |h| {
        h.phase("ok") == Some("Succeeded") && h.phase("bad") == Some("Failed")
    })
    .await;
    let s = h.status("bad").unwrap();
    let term = s.container_statuses.as_ref().unwrap()[0]
        .state
        .as_ref()
        .unwrap()
        .terminated
        .clone()
        .unwrap();
    assert_eq!((term.exit_code, term.reason.as_deref()), (1, Some("Error")));
    assert_eq!(h.condition("ok", "Ready"), Some(false));
    assert_eq!(h.restart_count("bad", "main"), Some(0));
    // the terminal pods keep their containers until the object is deleted
    assert_eq!(h.containers().await.len(), 2);
    let mut deleting = ok.clone();
    deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    deleting.metadata.deletion_grace_period_seconds = Some(30);
    h.send(PodEvent::Apply(Box::new(deleting))).await;
    h.until("delete", Duration::from_secs(5), |h| {
        h.deleted.contains(&"uid-ok".to_owned())
    })
    .await;
    assert_eq!(
        h.containers().await.len(),
        1,
        "the deleted job's container is removed"
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn admission_refuses_a_pod_larger_than_allocatable() {
    let mut h = Harness::start();
    let big = pod(
        "big",
        json!({"containers": [{"name": "app", "image": "nginx:1.27", "resources": {"requests": {"cpu": "8"}}}]}),
        json!({}),
    );
    h.send(PodEvent::Snapshot(vec![big])).await;
    h.until("rejected", Duration::from_secs(5), |h| {
        h.phase("big") == Some("Failed")
    })
    .await;
    let s = h.status("big").unwrap();
    assert_eq!(s.reason.as_deref(), Some("OutOfcpu"));
    assert_eq!(
        s.message.as_deref(),
        Some(
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 8000, used: 0, capacity: 4000"
        )
    );
    assert!(h.event_reasons().iter().any(|(r, _)| *r == "OutOfcpu"));
    assert!(h.containers().await.is_empty(), "nothing ran");
    h.stop().await;
}

fn deleting(mut p: Pod, grace: i64) -> Pod {
    p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    p.metadata.deletion_grace_period_seconds = Some(grace);
    p
}

#[tokio::test(start_paused = true)]
async fn delete_runs_pre_stop_within_the_grace_period() {
    let mut h = Harness::start();
    let p = pod(
        "graceful",
        json!({"containers": [{"name": "app", "image": "nginx:1.27",
            "lifecycle": {"preStop": {"exec": {"command": ["/bin/drain"]}}}}]}),
        json!({
            "cri-fake.node-agent.io/exec": "[{\"cmd\": \"/bin/drain\", \"duration\": \"2s\"}]",
            "cri-fake.node-agent.io/stop-duration": "60s"
        }),
    );
    h.send(PodEvent::Snapshot(vec![p.clone()])).await;
    h.until("Running", Duration::from_secs(5), |h| {
        h.phase("graceful") == Some("Running")
    })
    .await;
    let asked = h.t0.elapsed();
    h.send(PodEvent::Apply(Box::new(deleting(p.clone(), 5)))).await;
    let gone = h
        .until("deleted", Duration::from_secs(20), |h| {
            h.deleted.contains(&"uid-graceful".to_owned())
        })
        .await;
    let took = secs(gone - asked);
    // preStop 2 s, then StopContainer with the 3 s left; the container ignores SIGTERM and is killed
    assert!(
        (5.0..5.5).contains(&took),
        "deleted {took:.2} s after the request"
    );
    let s = h.status("graceful").unwrap();
    let term = s.container_statuses.as_ref().unwrap()[0]
        .state
        .as_ref()
        .unwrap()
        .terminated
        .clone()
        .unwrap();
    assert_eq!(term.exit_code, 137);
    assert!(
        h.event_reasons()
            .iter()
            .any(|(r, m)| *r == "Killing" && m == "Stopping container app")
    );
    assert!(h.containers().await.is_empty(), "containers removed");
    // The watch may still deliver the pod (with the final status just written) after its worker is gone and
    // before the DELETE lands: nothing may run for it again, nor report a status from the emptied runtime.
    let mut echo = deleting(p, 5);
    echo.status = Some(s.clone());
    h.send(PodEvent::Apply(Box::new(echo))).await;
    let sets_before = h.sets;
    tokio::time::sleep(Duration::from_secs(3)).await;
    h.pump();
    assert_eq!(
        h.sets,
        sets_before,
        "a status after the pod was finished: {:?}",
        h.status("graceful")
    );
    println!("pod deleted {took:.2} s after the delete request (grace 5 s, preStop 2 s)");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn agent_restart_starts_nothing_twice_and_changes_no_status() {
    let mut h = Harness::start();
    let pods = vec![
        pod(
            "a",
            json!({"containers": [{"name": "app", "image": "nginx:1.27",
            "readinessProbe": {"httpGet": {"path": "/", "port": 80}, "periodSeconds": 1}}]}),
            json!({}),
        ),
        pod(
            "b",
            json!({"initContainers": [{"name": "side", "image": "envoy", "restartPolicy": "Always"}],
            "containers": [{"name": "app", "image": "nginx:1.27"}]}),
            json!({}),
        ),
    ];
    h.send(PodEvent::Snapshot(pods.clone())).await;
    h.until("both ready", Duration::from_secs(10), |h| {
        h.condition("a", "Ready") == Some(true) && h.condition("b", "Ready") == Some(true)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    h.until("settled", Duration::from_secs(1), |_| true).await;
    let before = h.containers().await;
    let statuses = h.statuses.clone();
    let runtime = h.stop().await;

    // a new agent on the same runtime; the API server hands it the pods with the statuses it holds
    let mut h = Harness::start_with(runtime);
    let with_status: Vec<Pod> = pods
        .into_iter()
        .map(|mut p| {
            p.status = statuses.get(p.metadata.uid.as_deref().unwrap()).cloned();
            p
        })
        .collect();
    let with_status_again = with_status.clone();
    h.send(PodEvent::Snapshot(with_status)).await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    h.until("settled", Duration::from_secs(1), |_| true).await;
    assert_eq!(
        h.containers().await,
        before,
        "no container created, started or removed"
    );
    for (uid, status) in &h.statuses {
        assert_eq!(
            Some(status),
            statuses.get(uid),
            "status of {uid} changed after the restart"
        );
    }
    assert!(
        !h.event_reasons()
            .iter()
            .any(|(r, _)| *r == "Started" || *r == "Killing")
    );
    // the new agent is working, not merely idle: a pod added now runs
    let mut with_new = with_status_again;
    with_new.push(pod(
        "c",
        json!({"containers": [{"name": "app", "image": "nginx:1.27"}]}),
        json!({}),
    ));
    h.send(PodEvent::Snapshot(with_new)).await;
    h.until("the new pod ready", Duration::from_secs(10), |h| {
        h.condition("c", "Ready") == Some(true)
    })
    .await;
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn failed_pulls_show_err_image_pull_then_back_off() {
    let mut h = Harness::start();
    let p = pod(
        "nopull",
        json!({"containers": [{"name": "app", "image": "example.com/missing:1", "imagePullPolicy": "Always"}]}),
        json!({"cri-fake.node-agent.io/pull-error": "manifest unknown"}),
    );
    h.send(PodEvent::Snapshot(vec![p])).await;
    let pulling =
        |n: usize| move |h: &Harness| h.event_reasons().iter().filter(|(r, _)| *r == "Pulling").count() >= n;
    let mut pulls = Vec::new();
    for n in 1..=3 {
        pulls.push(secs(h.until("a pull", Duration::from_secs(60), pulling(n)).await));
        if n > 1 {
            // (after the first pull, the sync the new sandbox's events trigger already shows the back-off)
            assert_eq!(
                h.waiting_reason("nopull", "app").as_deref(),
                Some("ErrImagePull"),
                "after pull {n}"
            );
        }
        let backoff = |h: &Harness| h.waiting_reason("nopull", "app").as_deref() == Some("ImagePullBackOff");
        h.until("ImagePullBackOff", Duration::from_secs(5), backoff).await;
    }
    // pulls at 0 s, then 10 s and 20 s more (back-off doubling from 10 s)
    assert!(
        pulls[0] < 0.2 && (pulls[1] - 10.0).abs() < 0.2 && (pulls[2] - 30.0).abs() < 0.2,
        "{pulls:?}"
    );
    let reasons = h.event_reasons();
    assert_eq!(reasons.iter().filter(|(r, _)| *r == "Pulling").count(), 3);
    assert!(
        reasons
            .iter()
            .any(|(r, m)| *r == "Failed" && m == "Error: ImagePullBackOff")
    );
    assert!(
        reasons
            .iter()
            .any(|(r, m)| *r == "BackOff" && m.starts_with("Back-off pulling image"))
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn without_runtime_events_a_relist_every_second_notices_exits() {
    let runtime = cri_fake::FakeRuntime::new(cri_fake::FakeConfig::default());
    let mut h = Harness::start_on(
        runtime.clone(),
        std::sync::Arc::new(crate::pods::tests::NoEventStream(runtime, None)),
    );
    let p = pod(
        "relist",
        json!({"containers": [{"name": "app", "image": "busybox:1.36"}]}),
        json!({"cri-fake.node-agent.io/exit-after": "1500ms", "cri-fake.node-agent.io/exit-code": "1"}),
    );
    h.send(PodEvent::Snapshot(vec![p])).await;
    let t = h
        .until("restart", Duration::from_secs(10), |h| {
            h.restart_count("relist", "app") == Some(1)
        })
        .await;
    // the exit at 1.5 s is seen by the relist at 2 s
    assert!((1.9..2.3).contains(&secs(t)), "restarted at {t:?}");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_oom_kill_the_runtime_reports_late_still_ends_as_oom_killed() {
    let runtime = cri_fake::FakeRuntime::new(cri_fake::FakeConfig::default());
    let late = std::sync::Arc::new(crate::pods::tests::OomSeenLate::default());
    let mut h = Harness::start_on(
        runtime.clone(),
        std::sync::Arc::new(crate::pods::tests::NoEventStream(runtime, Some(late.clone()))),
    );
    let p = pod(
        "oom",
        json!({"restartPolicy": "Never", "containers": [{"name": "app", "image": "busybox:1.36"}]}),
        json!({"cri-fake.node-agent.io/oom-after": "1s"}),
    );
    h.send(PodEvent::Snapshot(vec![p])).await;
    let terminated = |h: &Harness| {
        let s = h.status("oom")?.container_statuses.as_ref()?.first()?;
        let t = s.state.as_ref()?.terminated.as_ref()?;
        Some((t.reason.clone().unwrap_or_default(), t.exit_code))
    };
    h.until("the pod's final status", Duration::from_secs(10), |h| {
        h.phase("oom") == Some("Failed") && terminated(h).is_some_and(|(reason, _)| reason == "OOMKilled")
    })
    .await;
    // the exit was first seen as `Error`, and the pod's final status read the container again
    assert_eq!(late.held_back(), 1);
    assert_eq!(terminated(&h), Some(("OOMKilled".to_owned(), 137)));
    h.stop().await;
}

/// The count of `kubelet_pod_worker_duration_seconds` for `operation`, as `/metrics` shows it.
fn worker_syncs(h: &Harness, operation: &str) -> u64 {
    let mut registry = prometheus_client::registry::Registry::default();
    h.metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("metrics encode");
    let series = format!("kubelet_pod_worker_duration_seconds_count{{operation=\"{operation}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map_or(0, |n| n.parse().expect("a count"))
}

/// With nothing happening, a running pod is still synced every `syncFrequency` (60 s, jittered up to half of
/// it): its worker waits for messages only, and the pod manager's timer wakes it.
#[tokio::test(start_paused = true)]
async fn an_idle_pod_is_synced_again_every_sync_period() {
    let mut h = Harness::start();
    let p = pod(
        "idle",
        json!({"containers": [{"name": "app", "image": "pause"}]}),
        json!({}),
    );
    h.send(PodEvent::Snapshot(vec![p])).await;
    h.until("Running", Duration::from_secs(30), |h| {
        h.phase("idle") == Some("Running")
    })
    .await;
    let before = worker_syncs(&h, "sync");
    tokio::time::sleep(Duration::from_secs(600)).await;
    let periodic = worker_syncs(&h, "sync") - before;
    // at least one sync per 90 s, and not many more than one per 60 s
    assert!(
        (6..=11).contains(&periodic),
        "{periodic} syncs in 10 idle minutes"
    );
    h.stop().await;
}
