//! Pod networking of hollow nodes against the real control plane (its controller-manager allocates node CIDRs):
//! a node is NotReady with the runtime's `NetworkReady=false` reason until the controller-manager assigns its
//! podCIDR — never Ready without one — and pods bound to it get IPs inside its podCIDR, distinct across nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use e2e::{init_logging, node_is_ready, ready_condition, wait_for};
use futures::StreamExt;
use hollow::client_pool::{ClientPool, PoolLimits, PoolSize};
use hollow::fleet::{Fleet, FleetSpec};
use hollow::profiles;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::runtime::watcher;
use node_agent::Metrics;
use node_agent::pods::PodMetrics;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const PREFIX: &str = "netw";
const NODES: usize = 5;
const PODS_PER_NODE: usize = 3;
const NOT_READY: &str = "container runtime network not ready: NetworkReady=false \
    reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized";

/// What one version of a Node showed: its podCIDR, Ready status and Ready message.
#[derive(Debug, Clone)]
struct Seen {
    cidr: Option<String>,
    ready: bool,
    message: String,
}

fn seen(node: &Node) -> Seen {
    let cond = ready_condition(node);
    Seen {
        cidr: node.spec.as_ref().and_then(|s| s.pod_cidr.clone()),
        ready: node_is_ready(node),
        message: cond.and_then(|c| c.message.clone()).unwrap_or_default(),
    }
}

fn inside(ip: &str, cidr: &str) -> bool {
    let (Ok(ip), Some((base, bits))) = (ip.parse::<Ipv4Addr>(), cidr.split_once('/')) else {
        return false;
    };
    let (Ok(base), Ok(bits)) = (base.parse::<Ipv4Addr>(), bits.parse::<u32>()) else {
        return false;
    };
    let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
    u32::from(ip) & mask == u32::from(base) & mask
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_not_ready_until_their_pod_cidr_and_pods_get_ips_inside_it() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());

    // Every version of every node of this fleet, from before the first one is created.
    let history: Arc<Mutex<BTreeMap<String, Vec<Seen>>>> = Arc::default();
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let recorder = {
        let (history, nodes) = (history.clone(), nodes.clone());
        tokio::spawn(async move {
            let mut stream = watcher::watcher(nodes, watcher::Config::default()).boxed();
            let mut listed_tx = Some(listed_tx);
            while let Some(event) = stream.next().await {
                let node = match event {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => n,
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = listed_tx.take() {
                            // the receiver waits for this until the test ends
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    _ => continue,
                };
                let name = node.metadata.name.clone().unwrap_or_default();
                if name.starts_with(&format!("{PREFIX}-")) {
                    let mut h = history.lock().unwrap_or_else(|p| p.into_inner());
                    h.entry(name).or_default().push(seen(&node));
                }
            }
        })
    };
    // the recorder's initial list has been answered before the fleet starts
    tokio::time::timeout(Duration::from_secs(60), listed).await??;

    let config = cp.admin_config().await?;
    let pool = ClientPool::new(&config, PoolSize::for_fleet(NODES, true, PoolLimits::default()))?;
    let token = CancellationToken::new();
    let spec = FleetSpec::new(NODES, format!("{PREFIX}-{{index}}"), profiles::default_profiles())?;
    let fleet = Fleet::start(
        &spec,
        &pool,
        Arc::new(Metrics::unregistered()),
        Arc::new(PodMetrics::new()),
        token.clone(),
    )
    .await?;

    let cidrs: BTreeMap<String, String> = wait_for("every node Ready", Duration::from_secs(60), || {
        let nodes = nodes.clone();
        async move {
            let list = nodes.list(&ListParams::default()).await?;
            let ready: BTreeMap<String, String> = list
                .items
                .iter()
                .filter(|n| n.metadata.name.as_deref().is_some_and(|x| x.starts_with(PREFIX)))
                .filter(|n| node_is_ready(n))
                .filter_map(|n| Some((n.metadata.name.clone()?, n.spec.as_ref()?.pod_cidr.clone()?)))
                .collect();
            Ok((ready.len() == NODES).then_some(ready))
        }
    })
    .await?;
    // the recorder has seen what the list saw: every node Ready with its podCIDR
    wait_for(
        "the recorder to see every node Ready",
        Duration::from_secs(60),
        || async {
            let history = history.lock().unwrap_or_else(|p| p.into_inner());
            let seen = cidrs.iter().all(|(name, cidr)| {
                history
                    .get(name)
                    .is_some_and(|v| v.iter().any(|s| s.ready && s.cidr.as_ref() == Some(cidr)))
            });
            Ok(seen.then_some(()))
        },
    )
    .await?;
    {
        let history = history.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!(history.len(), NODES, "{history:?}");
        for (name, versions) in history.iter() {
            let first = &versions[0];
            assert!(
                first.cidr.is_none() && !first.ready && first.message == NOT_READY,
                "{name} is created NotReady, without a podCIDR, with the runtime's reason: {versions:?}"
            );
            assert!(
                versions.iter().all(|v| !v.ready || v.cidr.is_some()),
                "{name} is never Ready without a podCIDR: {versions:?}"
            );
            assert!(versions.iter().any(|v| v.ready), "{name}: {versions:?}");
            println!(
                "[network] {name}: {} versions; NotReady ({:?}) until podCIDR {}",
                versions.len(),
                first.message,
                cidrs[name]
            );
        }
    }
    let distinct: BTreeSet<&String> = cidrs.values().collect();
    assert_eq!(distinct.len(), NODES, "every node its own podCIDR: {cidrs:?}");

    // Pods bound straight to each node get addresses from that node's podCIDR.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    for node in cidrs.keys() {
        for i in 0..PODS_PER_NODE {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": format!("{node}-p{i}"), "labels": {"app": PREFIX}},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.test/web:1"}]},
            }))?;
            pods.create(&PostParams::default(), &pod).await?;
        }
    }
    let ips: Vec<(String, String)> =
        wait_for("every pod Running with an IP", Duration::from_secs(60), || {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(&ListParams::default().labels(&format!("app={PREFIX}")))
                    .await?;
                let running: Vec<(String, String)> = list
                    .items
                    .iter()
                    .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                    .filter_map(|p| {
                        Some((
                            p.spec.as_ref()?.node_name.clone()?,
                            p.status.as_ref()?.pod_ip.clone()?,
                        ))
                    })
                    .collect();
                Ok((running.len() == NODES * PODS_PER_NODE).then_some(running))
            }
        })
        .await?;
    for (node, ip) in &ips {
        assert!(
            inside(ip, &cidrs[node]),
            "pod IP {ip} on {node} is inside {}",
            cidrs[node]
        );
    }
    let unique: BTreeSet<&String> = ips.iter().map(|(_, ip)| ip).collect();
    assert_eq!(
        unique.len(),
        ips.len(),
        "pod IPs are distinct across nodes: {ips:?}"
    );
    println!(
        "[network] {} pods on {NODES} nodes, IPs inside their node's podCIDR: {ips:?}",
        ips.len()
    );

    recorder.abort();
    token.cancel();
    fleet.stop(Duration::from_secs(10)).await;
    Ok(())
}
