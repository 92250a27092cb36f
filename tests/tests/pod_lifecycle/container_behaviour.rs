//! Container behaviour inside one pod on a full agent: a crash loop backing off (events, waiting reason,
//! restart count), readiness, liveness and startup probes answered by the fake runtime's script, init
//! containers in order with a restartable sidecar (each finished one reported ready), a pod too big for the node
//! refused at admission, and pods refused for their sysctls (`SysctlForbidden`, `allowedUnsafeSysctls`
//! widening the safe set) or their OS (`PodOSNotSupported`, `PodOSSelectorNodeLabelDoesNotMatch`).

use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
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
    // each run of the container as its status tells it, by the second it started: when it finished
    let runs = std::sync::Mutex::new(std::collections::BTreeMap::<i64, Option<i64>>::new());
    let backoff_seen = std::sync::atomic::AtomicBool::new(false);
    // a guard against hanging only: the three restarts come about 35 s after the pod
    wait_for("three restarts", Duration::from_secs(360), || async {
        let p = pods.get("crash").await?;
        let Some(c) = app_status(&p) else {
            return Ok(None);
        };
        let mut runs = runs.lock().unwrap_or_else(|p| p.into_inner());
        let mut note = |started: Option<&Time>, finished: Option<&Time>| {
            if let Some(started) = started {
                let seen = runs.entry(started.0.as_second()).or_default();
                if let Some(finished) = finished {
                    *seen = Some(finished.0.as_second());
                }
            }
        };
        let state = c.state.as_ref();
        note(state.and_then(|s| s.running.as_ref()?.started_at.as_ref()), None);
        for t in [
            state.and_then(|s| s.terminated.as_ref()),
            c.last_state.as_ref().and_then(|l| l.terminated.as_ref()),
        ]
        .into_iter()
        .flatten()
        {
            note(t.started_at.as_ref(), t.finished_at.as_ref());
        }
        let waiting = state.and_then(|s| s.waiting.as_ref());
        if waiting.and_then(|w| w.reason.as_deref()) == Some("CrashLoopBackOff") {
            backoff_seen.store(true, std::sync::atomic::Ordering::SeqCst);
            anyhow::ensure!(
                waiting
                    .and_then(|w| w.message.as_deref())
                    .is_some_and(|m| m.starts_with("back-off ")),
                "{waiting:?}"
            );
            anyhow::ensure!(
                c.last_state
                    .as_ref()
                    .and_then(|l| l.terminated.as_ref())
                    .map(|t| t.exit_code)
                    == Some(1),
                "{:?}",
                c.last_state
            );
        }
        // Four runs seen, the second and third with their ends. The first run's end shows only while the
        // second (restarted at once) runs for its one second, so a poll slowed by load may miss it; the later
        // ends stay in lastState through a back-off of ten seconds or more.
        let done =
            c.restart_count >= 3 && runs.len() >= 4 && runs.values().skip(1).take(2).all(Option::is_some);
        Ok(done.then_some(()))
    })
    .await
    .with_context(|| format!("runs (started, finished) seen: {runs:?}"))?;
    let runs: Vec<(i64, Option<i64>)> = runs
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .collect();
    println!("crash loop: runs (started, finished), seconds = {runs:?}");
    assert!(
        backoff_seen.load(std::sync::atomic::Ordering::SeqCst),
        "CrashLoopBackOff waiting reason observed"
    );
    // the back-off before each restart, from the container's own times (whole seconds): none before the first,
    // ten seconds before the second, twenty before the third — at least that, more on a loaded machine, each
    // longer than the one before
    let gap = |k: usize| runs[k - 1].1.map(|finished| runs[k].0 - finished);
    let (gap2, gap3) = (
        gap(2).context("second run's end")?,
        gap(3).context("third run's end")?,
    );
    assert!(
        gap2 < gap3 && gap2 >= 10 && gap3 >= 20,
        "back-offs {gap2} s, {gap3} s"
    );
    match gap(1) {
        Some(gap1) => assert!(gap1 < gap2, "back-offs {gap1} s, {gap2} s, {gap3} s"),
        None => println!("the first run's end was not seen between polls"),
    }
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
    // a guard against hanging only (the script passes the probe after 20 s)
    let p = wait_pod(&pods, "ready", "Ready", 200, |p| {
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
    // not before the probe passes (20 s after the start, whole seconds)
    assert!(by_api.is_some_and(|d| d >= 19), "Ready {by_api:?} s after start");

    // guards against hanging only (liveness fails after 5 s; the startup probe passes after 10 s)
    let p = wait_pod(&pods, "live", "restarted by liveness", 100, |p| {
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

    let p = wait_pod(&pods, "slow", "started", 100, |p| {
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
async fn init_containers_run_in_order_sidecar_stays_and_oversized_or_unsupported_pods_are_refused()
-> anyhow::Result<()> {
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
        assert!(done.ready, "a completed init container is ready: {done:?}");
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

    // a field the node does not honour: refused, naming each such field, never run as though it were absent
    let labelled = json!({"volumes": [{"name": "v", "emptyDir": {}}],
        "containers": [{"name": "app", "image": "nginx:1.27",
            "volumeMounts": [{"name": "v", "mountPath": "/v", "readOnly": true,
                              "recursiveReadOnly": "Enabled"}]}]});
    create_pod(&pods, pod_json("labelled", "pl-init", labelled, json!({}))).await?;
    let p = wait_pod(&pods, "labelled", "Failed", 30, |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
    })
    .await?;
    let s = p.status.as_ref().context("status")?;
    assert_eq!(s.reason.as_deref(), Some("UnsupportedPodField"));
    let message = s.message.as_deref().unwrap_or_default();
    let field = "spec.containers[0].volumeMounts[0].recursiveReadOnly";
    assert!(
        message.contains(field),
        "the status does not name {field}: {message}"
    );
    e2e::wait_for(
        "labelled: an UnsupportedPodField event",
        Duration::from_secs(30),
        || async {
            let events = pod_events(&admin, "pl-init", "labelled").await?;
            Ok(events
                .iter()
                .any(|(r, m)| r == "UnsupportedPodField" && m.contains("recursiveReadOnly"))
                .then_some(()))
        },
    )
    .await?;
    let sandboxes = a
        .runtime
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await?
        .items;
    assert!(
        sandboxes
            .iter()
            .all(|sb| sb.metadata.as_ref().is_none_or(|m| m.name != "labelled")),
        "a refused pod got a sandbox"
    );
    stop(a).await?;
    Ok(())
}

#[tokio::test]
async fn sysctls_and_the_pods_os_are_judged_at_admission() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    namespace(&admin, "pl-admit").await?;
    let kubelet = node_agent::KubeletConfig {
        allowed_unsafe_sysctls: vec!["kernel.msg*".into()],
        ..Default::default()
    };
    let setup = Setup {
        kubelet: Some(kubelet),
        ..Default::default()
    };
    let a = start_agent(cp, "pl-admit", "pl-admit", setup).await?;
    wait_node_ready(&admin, &a, "pl-admit").await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "pl-admit");
    let app = json!([{"name": "app", "image": "nginx:1.27"}]);
    let with_sysctls = |names: &[&str]| {
        let sysctls: Vec<_> = names.iter().map(|n| json!({"name": n, "value": "1"})).collect();
        json!({"containers": app, "securityContext": {"sysctls": sysctls}})
    };
    let t0 = Instant::now();
    let cases = [
        ("safe", with_sysctls(&["net.ipv4.tcp_syncookies"]), json!(null)),
        ("allowed", with_sysctls(&["kernel.msgmax"]), json!(null)),
        ("forbidden", with_sysctls(&["kernel.sem"]), json!(null)),
        (
            "windows",
            json!({"containers": app, "os": {"name": "windows"}}),
            json!(null),
        ),
        (
            "labelled",
            json!({"containers": app}),
            json!({"kubernetes.io/os": "windows"}),
        ),
    ];
    for (name, spec, labels) in &cases {
        let mut v = pod_json(name, "pl-admit", spec.clone(), json!({}));
        v["metadata"]["labels"] = labels.clone();
        create_pod(&pods, v).await?;
    }
    for name in ["safe", "allowed"] {
        wait_pod(&pods, name, "Running", 30, |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .await?;
    }
    let refused = [
        (
            "forbidden",
            "SysctlForbidden",
            "Pod was rejected: forbidden sysctl: \"kernel.sem\" not allowlisted",
        ),
        (
            "windows",
            "PodOSNotSupported",
            "Pod was rejected: Failed to admit pod as the OS field doesn't match node OS",
        ),
        (
            "labelled",
            "PodOSSelectorNodeLabelDoesNotMatch",
            "Pod was rejected: Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
        ),
    ];
    for (name, reason, message) in refused {
        let p = wait_pod(&pods, name, "Failed", 30, |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
        })
        .await?;
        let s = p.status.as_ref().context("status")?;
        assert_eq!(
            (s.reason.as_deref(), s.message.as_deref()),
            (Some(reason), Some(message))
        );
        wait_for(
            &format!("{name}: a {reason} event"),
            Duration::from_secs(30),
            || async {
                let events = pod_events(&admin, "pl-admit", name).await?;
                Ok(events.iter().any(|(r, _)| r == reason).then_some(()))
            },
        )
        .await?;
    }
    println!(
        "[pod_lifecycle] 2 pods admitted and 3 refused by sysctls or OS within {:?}",
        t0.elapsed()
    );
    stop(a).await?;
    Ok(())
}
