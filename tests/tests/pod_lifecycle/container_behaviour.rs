//! Container behaviour inside one pod on a full agent: a crash loop backing off (events, waiting reason,
//! restart count), readiness, liveness and startup probes answered by the fake runtime's script, init
//! containers in order with a restartable sidecar, and a pod too big for the node refused at admission.

use std::time::Duration;

use anyhow::{Context, bail};
use e2e::init_logging;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use runtime_api::{Runtime, cri};
use serde_json::json;
use tokio::time::Instant;

use super::support::{
    Setup, TIMING, app_status, condition, create_pod, namespace, pod_events, pod_json, start_agent, stop,
    wait_node_ready, wait_pod,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_loop_backs_off_with_events_and_waiting_reason() -> anyhow::Result<()> {
    init_logging();
    let _timing = TIMING.read().await;
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    namespace(&admin, "pl-crash").await?;
    let a = start_agent(cp, "pl-crash", "pl-crash", Setup::default()).await?;
    wait_node_ready(&admin, &a, "pl-crash").await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "pl-crash");
    let ann = json!({"cri-fake.node-agent.io/exit-after": "1s", "cri-fake.node-agent.io/exit-code": "1"});
    create_pod(
        &pods,
        pod_json(
            "crash",
            "pl-crash",
            json!({"containers": [{"name": "app", "image": "busybox:1.36"}]}),
            ann,
        ),
    )
    .await?;
    let t0 = Instant::now();
    let mut seen = Vec::new();
    let mut backoff_seen = false;
    while seen.len() < 3 {
        if t0.elapsed() > Duration::from_secs(90) {
            bail!("restarts seen so far: {seen:?}");
        }
        let p = pods.get("crash").await?;
        if let Some(c) = app_status(&p) {
            let rc = c.restart_count;
            if rc as usize > seen.len() {
                seen.push((rc, t0.elapsed().as_secs_f64()));
            }
            let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref());
            if waiting.and_then(|w| w.reason.as_deref()) == Some("CrashLoopBackOff") {
                backoff_seen = true;
                assert!(
                    waiting
                        .and_then(|w| w.message.as_deref())
                        .is_some_and(|m| m.starts_with("back-off "))
                );
                assert_eq!(
                    c.last_state
                        .as_ref()
                        .and_then(|l| l.terminated.as_ref())
                        .map(|t| t.exit_code),
                    Some(1)
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("crash loop: (restartCount, seconds after creation) = {seen:?}");
    assert!(backoff_seen, "CrashLoopBackOff waiting reason observed");
    // restart 1 right after the first exit, restart 2 ten seconds after the second exit, restart 3 twenty after
    let gap2 = seen[1].1 - seen[0].1;
    let gap3 = seen[2].1 - seen[1].1;
    assert!(
        (10.5..12.5).contains(&gap2) && (20.5..22.5).contains(&gap3),
        "gaps {gap2:.1} s, {gap3:.1} s"
    );
    let events = pod_events(&admin, "pl-crash", "crash").await?;
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "BackOff" && m.starts_with("Back-off restarting failed container app")),
        "{events:?}"
    );
    stop(a).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_readiness_liveness_and_startup() -> anyhow::Result<()> {
    init_logging();
    let _timing = TIMING.read().await;
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    namespace(&admin, "pl-probes").await?;
    let a = start_agent(cp, "pl-probe", "pl-probe", Setup::default()).await?;
    wait_node_ready(&admin, &a, "pl-probe").await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "pl-probes");
    let ready = json!({"containers": [{"name": "app", "image": "nginx:1.27",
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 1}}]});
    let live = json!({"containers": [{"name": "app", "image": "nginx:1.27",
        "livenessProbe": {"tcpSocket": {"port": 9000}, "periodSeconds": 1, "failureThreshold": 3}}]});
    let slow = json!({"containers": [{"name": "app", "image": "nginx:1.27",
        "startupProbe": {"httpGet": {"path": "/started", "port": 8081}, "periodSeconds": 1, "failureThreshold": 30},
        "livenessProbe": {"tcpSocket": {"port": 9000}, "periodSeconds": 1, "failureThreshold": 1}}]});
    create_pod(
        &pods,
        pod_json(
            "ready",
            "pl-probe",
            ready,
            json!({"cri-fake.node-agent.io/probe": "http:8080/ready=fail, ok@20s"}),
        ),
    )
    .await?;
    create_pod(
        &pods,
        pod_json(
            "live",
            "pl-probe",
            live,
            json!({"cri-fake.node-agent.io/probe": "tcp:9000=ok, fail@5s"}),
        ),
    )
    .await?;
    create_pod(
        &pods,
        pod_json(
            "slow",
            "pl-probe",
            slow,
            json!({"cri-fake.node-agent.io/probe": "http:8081/started=fail, ok@10s; tcp:9000=fail, ok@10s"}),
        ),
    )
    .await?;

    let running = wait_pod(&pods, "ready", "running, not ready", 30, |p| {
        app_status(p).is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
    })
    .await?;
    assert_eq!(condition(&running, "Ready"), Some(false));
    let t_running = Instant::now();
    let p = wait_pod(&pods, "ready", "Ready", 40, |p| {
        condition(p, "Ready") == Some(true)
    })
    .await?;
    let flip = t_running.elapsed().as_secs_f64();
    let started_at = app_status(&p)
        .and_then(|c| c.state.as_ref()?.running.as_ref()?.started_at.clone())
        .context("startedAt")?;
    let ready_at = p.status.as_ref().and_then(|s| {
        s.conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "Ready")?
            .last_transition_time
            .clone()
    });
    let by_api = ready_at.map(|t| t.0.as_second() - started_at.0.as_second());
    println!(
        "readiness: Ready flipped ~{flip:.1} s after Running was seen; lastTransitionTime - startedAt = {by_api:?} s"
    );
    assert!(
        by_api.is_some_and(|d| (19..=22).contains(&d)),
        "Ready {by_api:?} s after start"
    );

    let p = wait_pod(&pods, "live", "restarted by liveness", 40, |p| {
        app_status(p).is_some_and(|c| c.restart_count >= 1)
    })
    .await?;
    assert!(app_status(&p).is_some());
    let events = pod_events(&admin, "pl-probes", "live").await?;
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Killing" && m == "Container app failed liveness probe, will be restarted"),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Unhealthy" && m.starts_with("Liveness probe failed")),
        "{events:?}"
    );

    let p = wait_pod(&pods, "slow", "started", 40, |p| {
        app_status(p).is_some_and(|c| c.started == Some(true))
    })
    .await?;
    assert_eq!(
        app_status(&p).map(|c| c.restart_count),
        Some(0),
        "liveness held back until startup passed"
    );
    assert_eq!(condition(&p, "Ready"), Some(true));
    stop(a).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_in_order_sidecar_stays_and_oversized_pod_is_refused() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    namespace(&admin, "pl-init").await?;
    let a = start_agent(cp, "pl-init", "pl-init", Setup::default()).await?;
    wait_node_ready(&admin, &a, "pl-init").await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "pl-init");
    let spec = json!({
        "initContainers": [
            {"name": "init1", "image": "busybox:1.36"},
            {"name": "proxy", "image": "envoy:1.30", "restartPolicy": "Always"},
            {"name": "init2", "image": "busybox:1.36"}
        ],
        "containers": [{"name": "app", "image": "nginx:1.27"}]
    });
    let ann = json!({"cri-fake.node-agent.io/exit-after.init1": "1s", "cri-fake.node-agent.io/exit-after.init2": "1s"});
    create_pod(&pods, pod_json("ordered", "pl-init", spec, ann)).await?;
    let p = wait_pod(&pods, "ordered", "Ready", 30, |p| {
        condition(p, "Ready") == Some(true)
    })
    .await?;
    let inits = p
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.clone())
        .context("init statuses")?;
    let names: Vec<&str> = inits.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, vec!["init1", "proxy", "init2"]);
    for done in [&inits[0], &inits[2]] {
        let t = done
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .context("init terminated")?;
        assert_eq!((t.exit_code, t.reason.as_deref()), (0, Some("Completed")));
    }
    assert!(
        inits[1].state.as_ref().is_some_and(|s| s.running.is_some()) && inits[1].ready,
        "sidecar running and ready"
    );
    // the runtime saw them created in order
    let mut created: Vec<(i64, String)> = a
        .runtime
        .list_containers(cri::ListContainersRequest::default())
        .await?
        .containers
        .into_iter()
        .map(|c| (c.created_at, c.metadata.map(|m| m.name).unwrap_or_default()))
        .collect();
    created.sort();
    let order: Vec<&str> = created.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(order, vec!["init1", "proxy", "init2", "app"]);

    let big = json!({"containers": [{"name": "app", "image": "nginx:1.27", "resources": {"requests": {"cpu": "64"}}}]});
    create_pod(&pods, pod_json("big", "pl-init", big, json!({}))).await?;
    let p = wait_pod(&pods, "big", "Failed", 30, |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
    })
    .await?;
    let s = p.status.as_ref().context("status")?;
    assert_eq!(s.reason.as_deref(), Some("OutOfcpu"));
    assert!(
        s.message
            .as_deref()
            .is_some_and(|m| m
                .starts_with("Pod was rejected: Node didn't have enough resource: cpu, requested: 64000")),
        "{s:?}"
    );
    // the event is written on its own, after the status the wait above saw
    e2e::wait_for("big: an OutOfcpu event", Duration::from_secs(30), || async {
        let events = pod_events(&admin, "pl-init", "big").await?;
        Ok(events.iter().any(|(r, _)| r == "OutOfcpu").then_some(()))
    })
    .await?;
    stop(a).await?;
    Ok(())
}
