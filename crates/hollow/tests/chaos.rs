//! Chaos on a hollow fleet against the real control plane: a runtime outage makes exactly the chosen share of
//! nodes NotReady with the runtime's reason; stopped heartbeats make the real controller-manager mark nodes
//! Unknown and taint them unreachable; churn deletes leaving nodes and registers fresh ones. Every node
//! recovers when its disruption ends.

use std::sync::Arc;
use std::time::Duration;

use e2e::{init_logging, nodes_with_prefix, ready_condition, wait_for};
use hollow::chaos::{self, ChaosMetrics, ChaosSpec, Churn, Disruption};
use hollow::client_pool::{ClientPool, PoolLimits, PoolSize};
use hollow::fleet::{Fleet, FleetSpec};
use hollow::profiles;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::Api;
use node_agent::Metrics;
use node_agent::pods::PodMetrics;
use tokio_util::sync::CancellationToken;

const GRACE: Duration = Duration::from_secs(20);
const NODES: usize = 10;

async fn control_plane() -> anyhow::Result<&'static testenv::ControlPlane> {
    testenv::shared_with(testenv::Options {
        node_monitor_grace_period: Some(GRACE),
        ..Default::default()
    })
    .await
}

fn spec(prefix: &str) -> anyhow::Result<FleetSpec> {
    Ok(FleetSpec::new(
        NODES,
        format!("{prefix}-{{index}}"),
        profiles::default_profiles(),
    )?)
}

fn name(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

fn tainted_unreachable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/unreachable"))
}

async fn all_ready(api: &Api<Node>, prefix: &str, count: usize) -> anyhow::Result<()> {
    wait_for(
        &format!("{count} {prefix} nodes Ready and untainted"),
        Duration::from_secs(120),
        || async {
            let nodes = nodes_with_prefix(api, prefix).await?;
            let ok = nodes
                .iter()
                .filter(|n| ready_condition(n).is_some_and(|c| c.status == "True") && !tainted_unreachable(n))
                .count();
            Ok((ok == count && nodes.len() == count).then_some(()))
        },
    )
    .await
}

async fn start_fleet(prefix: &str) -> anyhow::Result<(Fleet, Api<Node>, CancellationToken)> {
    let cp = control_plane().await?;
    let config = cp.admin_config().await?;
    let api: Api<Node> = Api::all(cp.admin_client().await?);
    let pool = ClientPool::new(&config, PoolSize::for_fleet(NODES, true, PoolLimits::default()))?;
    let token = CancellationToken::new();
    let fleet = Fleet::start(
        &spec(prefix)?,
        &pool,
        Arc::new(Metrics::unregistered()),
        Arc::new(PodMetrics::new()),
        token.clone(),
    )
    .await?;
    all_ready(&api, prefix, NODES).await?;
    Ok((fleet, api, token))
}

fn once(fraction: f64, secs: u64) -> Option<Disruption> {
    Some(Disruption {
        fraction,
        duration: Duration::from_secs(secs),
        every: Duration::ZERO,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_outage_makes_its_share_not_ready_until_it_ends() -> anyhow::Result<()> {
    init_logging();
    let (fleet, api, token) = start_fleet("rtdown").await?;
    let metrics = ChaosMetrics::default();
    let chaos = tokio::spawn(chaos::run(
        ChaosSpec {
            runtime_down: once(0.3, 30),
            ..ChaosSpec::default()
        },
        chaos::targets(&fleet),
        fleet.factory(),
        metrics.clone(),
        token.child_token(),
    ));
    let down = wait_for("3 nodes NotReady", Duration::from_secs(25), || async {
        let nodes = nodes_with_prefix(&api, "rtdown").await?;
        let down: Vec<(String, NodeCondition)> = nodes
            .iter()
            .filter_map(|n| {
                ready_condition(n)
                    .filter(|c| c.status == "False")
                    .map(|c| (name(n), c.clone()))
            })
            .collect();
        Ok((down.len() == 3).then_some(down))
    })
    .await?;
    assert_eq!(metrics.disrupted("runtime_down"), 3);
    for (node, c) in &down {
        assert_eq!(c.reason.as_deref(), Some("KubeletNotReady"), "{node}");
        assert!(
            c.message
                .as_deref()
                .unwrap_or("")
                .contains("container runtime not ready"),
            "{node}: {:?}",
            c.message
        );
    }
    println!(
        "runtime down on 3 of {NODES}: {:?} NotReady: {:?}",
        down.iter().map(|d| &d.0).collect::<Vec<_>>(),
        down[0].1.message
    );
    chaos.await?;
    assert_eq!(metrics.disrupted("runtime_down"), 0);
    all_ready(&api, "rtdown", NODES).await?;
    fleet.stop(Duration::from_secs(10)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_heartbeats_go_unknown_and_come_back() -> anyhow::Result<()> {
    init_logging();
    let (fleet, api, token) = start_fleet("flap").await?;
    let metrics = ChaosMetrics::default();
    let started = tokio::time::Instant::now();
    let chaos = tokio::spawn(chaos::run(
        ChaosSpec {
            flapping: once(0.2, 60),
            ..ChaosSpec::default()
        },
        chaos::targets(&fleet),
        fleet.factory(),
        metrics.clone(),
        token.child_token(),
    ));
    let unknown = wait_for("2 nodes Unknown and tainted", Duration::from_secs(60), || async {
        let nodes = nodes_with_prefix(&api, "flap").await?;
        let lost: Vec<String> = nodes
            .iter()
            .filter(|n| ready_condition(n).is_some_and(|c| c.status == "Unknown") && tainted_unreachable(n))
            .map(name)
            .collect();
        Ok((lost.len() == 2).then_some(lost))
    })
    .await?;
    let marked_after = started.elapsed();
    let others_ready = nodes_with_prefix(&api, "flap")
        .await?
        .iter()
        .filter(|n| ready_condition(n).is_some_and(|c| c.status == "True"))
        .count();
    assert_eq!(others_ready, NODES - 2, "only the flapping nodes are lost");
    println!(
        "heartbeats stopped on 2 of {NODES}: {unknown:?} Unknown + unreachable {:.1}s later (grace {GRACE:?})",
        marked_after.as_secs_f64()
    );
    // the last renewal before the pause was up to one renew interval (10 s) earlier
    assert!(
        marked_after + Duration::from_secs(11) >= GRACE,
        "not before the grace period: {marked_after:?}"
    );
    chaos.await?;
    let resumed = tokio::time::Instant::now();
    all_ready(&api, "flap", NODES).await?;
    println!(
        "all Ready and untainted {:.1}s after heartbeats resumed",
        resumed.elapsed().as_secs_f64()
    );
    fleet.stop(Duration::from_secs(10)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_deletes_leaving_nodes_and_registers_new_ones() -> anyhow::Result<()> {
    init_logging();
    let (fleet, api, token) = start_fleet("churn").await?;
    let metrics = ChaosMetrics::default();
    let chaos_token = token.child_token();
    let chaos = tokio::spawn(chaos::run(
        ChaosSpec {
            churn: Some(Churn {
                nodes: 2,
                per_minute: 12.0,
                shutdown: false,
            }),
            ..ChaosSpec::default()
        },
        chaos::targets(&fleet),
        fleet.factory(),
        metrics.clone(),
        chaos_token.clone(),
    ));
    // 2 churn nodes, one replaced every 5 s: after three replacements churn-10..12 have left
    wait_for("three churn replacements", Duration::from_secs(60), || async {
        Ok((metrics.churned("left") >= 3).then_some(()))
    })
    .await?;
    let present: Vec<String> = nodes_with_prefix(&api, "churn").await?.iter().map(name).collect();
    for gone in ["churn-10", "churn-11", "churn-12"] {
        assert!(!present.contains(&gone.to_owned()), "{gone} left: {present:?}");
    }
    let joined = metrics.churned("joined");
    assert!(joined >= 5, "2 at start + a node per replacement: {joined}");
    let newest = format!("churn-{}", NODES + usize::try_from(joined)? - 1);
    wait_for(&format!("{newest} Ready"), Duration::from_secs(30), || async {
        let n = api.get_opt(&newest).await?;
        Ok(
            n.filter(|n| ready_condition(n).is_some_and(|c| c.status == "True"))
                .map(|_| ()),
        )
    })
    .await?;
    println!(
        "churn: {joined} joined, {} left; Nodes now: {} (newest {newest} Ready)",
        metrics.churned("left"),
        present.len()
    );
    chaos_token.cancel();
    chaos.await?;
    // stopping churn deletes its nodes; the fleet's own stay
    all_ready(&api, "churn", NODES).await?;
    fleet.stop(Duration::from_secs(10)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_chaos_flags_are_refused_before_any_node_starts() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hollow"))
        .args(["run", "--nodes", "3", "--name-template", "badchaos-{index}"])
        .args(["--flap-fraction", "1.5", "--flap-for", "10s"])
        .args(["--metrics-address", "127.0.0.1:0"])
        .arg("--kubeconfig")
        .arg(cp.admin_kubeconfig())
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("flapping: fraction must be between 0 and 1, got 1.5"),
        "{stderr}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hollow"))
        .args([
            "run",
            "--runtime-down-fraction",
            "0.1",
            "--runtime-down-for",
            "soon",
        ])
        .output()?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a duration"));
    let api: Api<Node> = Api::all(cp.admin_client().await?);
    assert!(
        nodes_with_prefix(&api, "badchaos").await?.is_empty(),
        "no node started"
    );
    Ok(())
}

/// Churn with graceful shutdown: a leaving node runs the kubelet's graceful node shutdown before its Node is
/// deleted — the pod running on it ends Failed with the kubelet's `Terminated` reason and message and a
/// `DisruptionTarget` condition, instead of vanishing with its node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_with_shutdown_drains_leaving_nodes_gracefully() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{DeleteParams, PostParams};

    init_logging();
    let cp = control_plane().await?;
    let config = cp.admin_config().await?;
    let admin = cp.admin_client().await?;
    let api: Api<Node> = Api::all(admin.clone());
    let prefix = "drain";
    let spec = FleetSpec {
        kubelet: node_agent::KubeletConfig {
            shutdown_grace_period: Duration::from_secs(4),
            shutdown_grace_period_critical_pods: Duration::from_secs(1),
            ..Default::default()
        },
        ..spec(prefix)?
    };
    let pool = ClientPool::new(&config, PoolSize::for_fleet(NODES, true, PoolLimits::default()))?;
    let token = CancellationToken::new();
    let fleet = Fleet::start(
        &spec,
        &pool,
        Arc::new(Metrics::unregistered()),
        Arc::new(PodMetrics::new()),
        token.clone(),
    )
    .await?;
    let metrics = ChaosMetrics::default();
    let chaos_token = token.child_token();
    let chaos = tokio::spawn(chaos::run(
        ChaosSpec {
            churn: Some(Churn {
                nodes: 1,
                per_minute: 3.0,
                shutdown: true,
            }),
            ..ChaosSpec::default()
        },
        chaos::targets(&fleet),
        fleet.factory(),
        metrics.clone(),
        chaos_token.clone(),
    ));
    // the one churn node, drain-10, leaves 20 s after it joined; a pod runs on it before that
    let leaving = format!("{prefix}-{NODES}");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "drain-pod"},
        "spec": {"nodeName": leaving, "containers": [{"name": "c", "image": "registry.test/drain:1"}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    wait_for(
        "the pod on the churn node Running",
        Duration::from_secs(20),
        || async {
            let phase = pods.get("drain-pod").await?.status.and_then(|s| s.phase);
            Ok((phase.as_deref() == Some("Running")).then_some(()))
        },
    )
    .await?;
    wait_for("the churn node left", Duration::from_secs(60), || async {
        Ok((metrics.churned("left") >= 1).then_some(()))
    })
    .await?;
    let status = pods.get("drain-pod").await?.status.unwrap_or_default();
    println!(
        "churn shutdown: {leaving} left; its pod is {:?} / {:?}: {:?}",
        status.phase, status.reason, status.message
    );
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert_eq!(status.reason.as_deref(), Some("Terminated"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was terminated in response to imminent node shutdown.")
    );
    assert!(
        status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "DisruptionTarget" && c.status == "True"),
        "{:?}",
        status.conditions
    );
    assert!(
        api.get_opt(&leaving).await?.is_none(),
        "{leaving} deleted after its shutdown"
    );
    chaos_token.cancel();
    chaos.await?;
    fleet.stop(Duration::from_secs(10)).await;
    for node in nodes_with_prefix(&api, prefix).await? {
        let _ = api.delete(&name(&node), &DeleteParams::default()).await;
    }
    pods.delete("drain-pod", &DeleteParams::default().grace_period(0))
        .await?;
    Ok(())
}

/// The API server unreachable from a whole fleet (every connection of its pool cut by a relay, which refuses new
/// ones) for longer than the nodes' lease and the controller-manager's grace period: the node-lifecycle
/// controller, which still reaches the API server, marks every node Unknown and its pods not ready; once the
/// relay lets the fleet through again every node is Ready and untainted and every pod ready, with the container
/// it had before and no restart. `NA_OUTAGE_NODES` and `NA_OUTAGE_PODS` set the size (50 nodes and 100 pods by
/// default; docs/reliability.md has the 1,000-node run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_outage_past_the_lease_leaves_the_pods_untouched() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{DeleteParams, ListParams, PostParams};
    use std::collections::BTreeMap;

    init_logging();
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (nodes, pod_count) = (env("NA_OUTAGE_NODES", 50), env("NA_OUTAGE_PODS", 100));
    // the waits grow with the fleet: a thousand nodes register and start their pods in minutes on 2 cores
    let within = Duration::from_secs(120 + nodes as u64 / 5);
    let prefix = "outage";
    let cp = control_plane().await?;
    let admin = cp.admin_client().await?;
    let api: Api<Node> = Api::all(admin.clone());
    let relay = e2e::relay::Relay::start(cp.server().trim_start_matches("https://").parse()?)?;
    let mut config = cp.admin_config().await?;
    config.cluster_url = format!("https://{}", relay.addr()).parse()?;
    let pool = ClientPool::new(&config, PoolSize::for_fleet(nodes, true, PoolLimits::default()))?;
    let token = CancellationToken::new();
    let t0 = tokio::time::Instant::now();
    let fleet = Fleet::start(
        &FleetSpec::new(nodes, format!("{prefix}-{{index}}"), profiles::default_profiles())?,
        &pool,
        Arc::new(Metrics::unregistered()),
        Arc::new(PodMetrics::new()),
        token.clone(),
    )
    .await?;
    let ready_nodes = |count: usize| {
        let api = api.clone();
        async move {
            e2e::wait_for_progress(
                &format!("{count} {prefix} nodes Ready and untainted"),
                within,
                within * 2,
                || async {
                    let all = nodes_with_prefix(&api, prefix).await?;
                    let ok = all
                        .iter()
                        .filter(|n| {
                            ready_condition(n).is_some_and(|c| c.status == "True") && !tainted_unreachable(n)
                        })
                        .count();
                    Ok((ok, (ok == count && all.len() == count).then_some(())))
                },
            )
            .await
        }
    };
    ready_nodes(nodes).await?;
    println!(
        "outage: {nodes} nodes Ready {:.1}s after start",
        t0.elapsed().as_secs_f64()
    );

    let ns = "default";
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let selector = ListParams::default().labels("fault=outage");
    for i in 0..pod_count {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("outage-{i:04}"), "labels": {"fault": "outage"}},
            "spec": {
                "nodeName": format!("{prefix}-{}", i % nodes),
                "containers": [{"name": "c", "image": "registry.test/outage:1"}],
            },
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
    }
    // each pod's (ready: its Ready condition, which the node-lifecycle controller sets False on a lost node, and
    // its container ready; container ID; restart count)
    let container = |p: &Pod| {
        let status = p.status.as_ref();
        let c = status
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.first());
        let pod_ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        (
            pod_ready && c.is_some_and(|c| c.ready),
            c.and_then(|c| c.container_id.clone()),
            c.map_or(0, |c| c.restart_count),
        )
    };
    let all_ready = || async {
        e2e::wait_for_progress(&format!("{pod_count} pods ready"), within, within * 2, || async {
            let list = pods.list(&selector).await?.items;
            let ready = list.iter().filter(|p| container(p).0).count();
            Ok((
                ready,
                (ready == pod_count && list.len() == pod_count).then_some(list),
            ))
        })
        .await
    };
    let before: BTreeMap<String, (Option<String>, i32)> = all_ready()
        .await?
        .iter()
        .map(|p| {
            let (_, id, restarts) = container(p);
            (p.metadata.name.clone().unwrap_or_default(), (id, restarts))
        })
        .collect();

    let cut = tokio::time::Instant::now();
    relay.cut();
    let lost = wait_for(
        &format!("{nodes} nodes Unknown and their pods not ready"),
        GRACE + within,
        || async {
            let unknown = nodes_with_prefix(&api, prefix)
                .await?
                .iter()
                .filter(|n| ready_condition(n).is_some_and(|c| c.status == "Unknown"))
                .count();
            if unknown < nodes {
                return Ok(None);
            }
            let list = pods.list(&selector).await?.items;
            Ok(list.iter().all(|p| !container(p).0).then(|| cut.elapsed()))
        },
    )
    .await;
    let outage = cut.elapsed();
    relay.restore();
    let lost = lost?;
    let restored = tokio::time::Instant::now();
    ready_nodes(nodes).await?;
    let nodes_back = restored.elapsed();
    let after = all_ready().await?;
    let pods_back = restored.elapsed();
    assert_eq!(after.len(), before.len(), "no pod lost");
    for p in &after {
        let name = p.metadata.name.clone().unwrap_or_default();
        let (_, id, restarts) = container(p);
        assert_eq!(before.get(&name), Some(&(id, restarts)), "{name} untouched");
        assert_eq!(restarts, 0, "{name} restarted");
    }
    println!(
        "outage: API server unreachable from {nodes} nodes for {:.1}s: all Unknown and {pod_count} pods not ready \
         {:.1}s after the cut; all Ready and untainted {:.1}s and all pods ready {:.1}s after it ended, \
         {pod_count} containers kept, 0 restarts",
        outage.as_secs_f64(),
        lost.as_secs_f64(),
        nodes_back.as_secs_f64(),
        pods_back.as_secs_f64()
    );

    pods.delete_collection(&DeleteParams::default().grace_period(0), &selector)
        .await?;
    fleet.stop(Duration::from_secs(10)).await;
    for node in nodes_with_prefix(&api, prefix).await? {
        let _ = api.delete(&name(&node), &DeleteParams::default()).await;
    }
    Ok(())
}
