//! Pod lifecycle against the real control plane (API server, scheduler, controller-manager): full agents
//! (node half + pod lifecycle) on the in-memory fake runtime, node credentials under the Node authorizer and
//! NodeRestriction. Each test owns its nodes (unique names, a `pool` label its workloads select) and namespace.
//! Here: workloads (a Deployment, Jobs), deletion with grace, an agent restart and a shared watch; in
//! [`container_behaviour`], crash loops, probes, init containers and admission.

#[path = "pod_lifecycle/container_behaviour.rs"]
mod container_behaviour;
#[path = "pod_lifecycle/support.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use node_agent::pods::{PodMetrics, SharedPodFeed};
use runtime_api::{Runtime, cri};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use support::{
    Setup, TIMING, app_status, check_running_pod, condition, containers, create_pod, delete_and_watch,
    namespace, pod_events, pod_json, pod_metric_sum, start_agent, stop, wait_node_ready, wait_pod,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_of_50_on_5_agents_runs_in_each_node_cidr_then_scales_to_zero() -> anyhow::Result<()> {
    init_logging();
    // 50 pods starting at once would disturb the timing tests: they wait for each other
    let _alone = TIMING.write().await;
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    namespace(&admin, "pl-deploy").await?;
    let metrics = Arc::new(PodMetrics::new());
    let mut agents = Vec::new();
    let mut cidrs = std::collections::HashMap::new();
    for i in 1..=5 {
        let name = format!("pl-d{i}");
        agents.push(
            start_agent(
                cp,
                &name,
                "pl-deploy",
                Setup {
                    metrics: Some(metrics.clone()),
                    ..Default::default()
                },
            )
            .await?,
        );
    }
    for (i, a) in agents.iter().enumerate() {
        let name = format!("pl-d{}", i + 1);
        cidrs.insert(name.clone(), wait_node_ready(&admin, a, &name).await?);
    }
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "pl-deploy");
    let deployment = json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 50,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": {"cri-fake.node-agent.io/pull-duration": "200ms"}},
                "spec": {
                    "nodeSelector": {"pool": "pl-deploy"},
                    "containers": [{
                        "name": "web", "image": "nginx:1.27",
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                        "readinessProbe": {"httpGet": {"path": "/", "port": 80}, "periodSeconds": 2}
                    }]
                }
            }
        }
    });
    let started = Instant::now();
    deployments
        .create(&PostParams::default(), &serde_json::from_value(deployment)?)
        .await?;
    wait_for("50 ready replicas", Duration::from_secs(180), || async {
        let d = deployments.get("web").await?;
        Ok((d.status.and_then(|s| s.ready_replicas) == Some(50)).then_some(()))
    })
    .await?;
    println!(
        "deployment: 50/50 ready {:.1} s after creation",
        started.elapsed().as_secs_f64()
    );

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "pl-deploy");
    let list = pods.list(&ListParams::default().labels("app=web")).await?;
    assert_eq!(list.items.len(), 50);
    let mut per_node = std::collections::BTreeMap::<String, usize>::new();
    for p in &list.items {
        let node = check_running_pod(p, &cidrs)?;
        *per_node.entry(node).or_default() += 1;
    }
    println!("pods per node: {per_node:?}");
    println!(
        "per-stage start-up latency, 50 pods on 5 agents:\n{}",
        metrics.stage_report()
    );

    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await?;
    wait_for("all pods gone", Duration::from_secs(120), || async {
        Ok(pods
            .list(&ListParams::default().labels("app=web"))
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    for a in &agents {
        let containers = a
            .runtime
            .list_containers(cri::ListContainersRequest::default())
            .await?
            .containers;
        let sandboxes = a
            .runtime
            .list_pod_sandbox(cri::ListPodSandboxRequest::default())
            .await?
            .items;
        assert!(
            containers.is_empty() && sandboxes.is_empty(),
            "{containers:?} {sandboxes:?}"
        );
    }
    for a in agents {
        stop(a).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_succeed_and_fail() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    namespace(&admin, "pl-jobs").await?;
    let a = start_agent(cp, "pl-job", "pl-job", Setup::default()).await?;
    wait_node_ready(&admin, &a, "pl-job").await?;
    let jobs: Api<Job> = Api::namespaced(admin.clone(), "pl-jobs");
    for (name, code) in [("ok", "0"), ("fail", "1")] {
        let job = json!({
            "metadata": {"name": name},
            "spec": {"backoffLimit": 0, "template": {
                "metadata": {"annotations": {"cri-fake.node-agent.io/exit-after": "1s", "cri-fake.node-agent.io/exit-code": code}},
                "spec": {"restartPolicy": "Never", "nodeSelector": {"pool": "pl-job"},
                         "containers": [{"name": "main", "image": "busybox:1.36"}]}
            }}
        });
        jobs.create(&PostParams::default(), &serde_json::from_value(job)?)
            .await?;
    }
    let job_condition = |name: &'static str, ty: &'static str| {
        let jobs = jobs.clone();
        async move {
            wait_for(&format!("job {name} {ty}"), Duration::from_secs(60), || async {
                let j = jobs.get(name).await?;
                let cs = j.status.and_then(|s| s.conditions).unwrap_or_default();
                Ok(cs
                    .iter()
                    .any(|c| c.type_ == ty && c.status == "True")
                    .then_some(()))
            })
            .await
        }
    };
    job_condition("ok", "Complete").await?;
    job_condition("fail", "Failed").await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "pl-jobs");
    for (job, phase, exit) in [("ok", "Succeeded", 0), ("fail", "Failed", 1)] {
        let list = pods
            .list(&ListParams::default().labels(&format!("job-name={job}")))
            .await?;
        let p = list.items.first().context("job pod")?;
        assert_eq!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some(phase));
        let t = app_status(p)
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.clone())
            .context("terminated")?;
        assert_eq!(t.exit_code, exit);
    }
    stop(a).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_with_grace_runs_pre_stop_then_removes_the_pod() -> anyhow::Result<()> {
    init_logging();
    let _timing = TIMING.read().await;
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    namespace(&admin, "pl-grace").await?;
    let a = start_agent(cp, "pl-grace", "pl-grace", Setup::default()).await?;
    wait_node_ready(&admin, &a, "pl-grace").await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "pl-grace");
    let spec = json!({"terminationGracePeriodSeconds": 30, "containers": [{"name": "app", "image": "nginx:1.27",
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/drain"]}}}}]});
    // preStop takes 2 s; after SIGTERM the container needs 1 s ("polite") or ignores it ("stubborn")
    for (name, stop_after) in [("polite", "1s"), ("stubborn", "60s")] {
        let ann = json!({"cri-fake.node-agent.io/exec": "[{\"cmd\": \"/bin/drain\", \"duration\": \"2s\"}]",
                         "cri-fake.node-agent.io/stop-duration": stop_after});
        create_pod(&pods, pod_json(name, "pl-grace", spec.clone(), ann)).await?;
        wait_pod(&pods, name, "Running", 30, |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .await?;
    }
    let mut took = Vec::new();
    // never before the preStop's 2 s and the stop (1 s), or the 5 s grace (stubborn); how much later is the
    // machine's load, and the exit code below says whether the container left or was killed
    for (name, at_least) in [("polite", 3.0), ("stubborn", 5.0)] {
        let (gone, last) = delete_and_watch(&pods, name, 5).await?;
        let secs = gone.as_secs_f64();
        took.push((name, secs));
        assert!(secs >= at_least, "{name} removed after {secs:.2} s");
        let final_state = last
            .as_ref()
            .and_then(app_status)
            .and_then(|c| c.state.clone())
            .and_then(|s| s.terminated);
        let code = final_state.map(|t| t.exit_code);
        assert_eq!(
            code,
            Some(if name == "polite" { 0 } else { 137 }),
            "{name} final status before removal: {:?}",
            last.as_ref().and_then(|p| p.status.as_ref())
        );
        let events = pod_events(&admin, "pl-grace", name).await?;
        assert!(
            events
                .iter()
                .any(|(r, m)| r == "Killing" && m == "Stopping container app"),
            "{events:?}"
        );
    }
    println!("delete with grace 5 s, preStop 2 s: removed after {took:?} s");
    let left = a
        .runtime
        .list_containers(cri::ListContainersRequest::default())
        .await?
        .containers;
    assert!(left.is_empty(), "{left:?}");
    stop(a).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_restart_starts_nothing_twice_and_keeps_statuses() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    namespace(&admin, "pl-restart").await?;
    let a = start_agent(cp, "pl-restart", "pl-restart", Setup::default()).await?;
    wait_node_ready(&admin, &a, "pl-restart").await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "pl-restart");
    let specs = [
        json!({"containers": [{"name": "app", "image": "nginx:1.27",
            "readinessProbe": {"httpGet": {"path": "/", "port": 80}, "periodSeconds": 1}}]}),
        json!({"initContainers": [{"name": "proxy", "image": "envoy:1.30", "restartPolicy": "Always"}],
               "containers": [{"name": "app", "image": "nginx:1.27"}]}),
        json!({"containers": [{"name": "a", "image": "nginx:1.27"}, {"name": "b", "image": "redis:7"}]}),
    ];
    let names = ["probed", "sidecar", "pair"];
    for (name, spec) in names.iter().zip(specs) {
        create_pod(&pods, pod_json(name, "pl-restart", spec, json!({}))).await?;
    }
    for name in names {
        wait_pod(&pods, name, "Ready", 30, |p| condition(p, "Ready") == Some(true)).await?;
    }
    let runtime = stop(a).await?;
    // what the stopped agent left: from here on only the new agent writes these pods' statuses
    let before: Vec<Pod> = futures::future::try_join_all(names.iter().map(|n| pods.get(n))).await?;
    let held = containers(&runtime).await?;

    let restarted_at = k8s_openapi::jiff::Timestamp::now();
    let metrics = Arc::new(PodMetrics::new());
    let a = start_agent(
        cp,
        "pl-restart",
        "pl-restart",
        Setup {
            runtime: Some(runtime.clone()),
            metrics: Some(metrics.clone()),
            ..Default::default()
        },
    )
    .await?;
    // the new agent is back: its lease renews after the restart ...
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(admin.clone(), "kube-node-lease");
    wait_for(
        "a lease renewal by the new agent",
        Duration::from_secs(30),
        || async {
            let renewed = leases
                .get("pl-restart")
                .await?
                .spec
                .and_then(|s| s.renew_time)
                .is_some_and(|t| t.0 > restarted_at);
            Ok(renewed.then_some(()))
        },
    )
    .await?;
    // ... and it acted on what it found: a sync of each pod, and the probed pod's readiness probed again (a
    // wrong agent would have restarted or duplicated containers, or written a status from scratch, by then)
    let (syncs, probed) = wait_for(
        "the new agent's first syncs and readiness probes",
        Duration::from_secs(60),
        || async {
            let syncs = pod_metric_sum(&metrics, "kubelet_pod_worker_duration_seconds_count{");
            let probed = pod_metric_sum(
                &metrics,
                "prober_probe_total{probe_type=\"Readiness\",result=\"successful\"}",
            );
            Ok((syncs >= names.len() as f64 && probed >= 2.0).then_some((syncs, probed)))
        },
    )
    .await?;
    println!("agent restart: the new agent synced {syncs} times and probed readiness {probed} times");
    assert_eq!(
        containers(&runtime).await?,
        held,
        "same containers, none new, none restarted"
    );
    for (old, name) in before.iter().zip(names) {
        let now = pods.get(name).await?;
        assert_eq!(
            now.status, old.status,
            "{name}: status changed across the restart"
        );
        assert_eq!(
            now.metadata.resource_version, old.metadata.resource_version,
            "{name}: object written again"
        );
    }
    // and it takes new work
    let spec = json!({"containers": [{"name": "app", "image": "nginx:1.27"}]});
    create_pod(&pods, pod_json("after", "pl-restart", spec, json!({}))).await?;
    wait_pod(&pods, "after", "Ready", 30, |p| {
        condition(p, "Ready") == Some(true)
    })
    .await?;
    stop(a).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shared_watch_feeds_two_agents() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    namespace(&admin, "pl-shared").await?;
    let feed = SharedPodFeed::new();
    let mut agents = Vec::new();
    for name in ["pl-s1", "pl-s2"] {
        let setup = Setup {
            source: Some(feed.subscribe(name, 64)),
            ..Default::default()
        };
        let a = start_agent(cp, name, "pl-shared", setup).await?;
        wait_node_ready(&admin, &a, name).await?;
        agents.push(a);
    }
    let token = CancellationToken::new();
    let watch = tokio::spawn(feed.clone().run(admin.clone(), token.clone()));
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "pl-shared");
    for (pod, node) in [("on-s1", "pl-s1"), ("on-s2", "pl-s2")] {
        let spec = json!({"containers": [{"name": "app", "image": "nginx:1.27"}]});
        create_pod(&pods, pod_json(pod, node, spec, json!({}))).await?;
    }
    for (pod, node) in [("on-s1", "pl-s1"), ("on-s2", "pl-s2")] {
        let p = wait_pod(&pods, pod, "Ready", 30, |p| condition(p, "Ready") == Some(true)).await?;
        assert_eq!(p.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(node));
    }
    token.cancel();
    watch.await?;
    for a in agents {
        stop(a).await?;
    }
    Ok(())
}
