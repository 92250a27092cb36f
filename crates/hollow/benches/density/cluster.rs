//! What the benchmark does to the cluster, the same for both fleets: count Ready nodes, create pods bound
//! straight to the fleet's nodes (no scheduler in the way) and wait until they run (pods with claims:
//! `claims.rs`).

use std::time::Duration;

use anyhow::bail;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, PostParams};

/// Nodes named `<prefix>-…` listed, and of those Ready.
pub async fn ready_nodes(api: &Api<Node>, prefix: &str) -> anyhow::Result<(usize, usize)> {
    let full = api.list(&ListParams::default()).await?;
    let ours: Vec<&Node> = full
        .items
        .iter()
        .filter(|n| n.metadata.name.as_deref().is_some_and(|x| x.starts_with(prefix)))
        .collect();
    let ready = ours
        .iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count();
    Ok((ours.len(), ready))
}

/// Waits until `nodes` nodes named `<prefix>-…` are Ready (at most `limit`).
pub async fn wait_ready(api: &Api<Node>, prefix: &str, nodes: usize, limit: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    let (mut listed, mut seen_ready) = (0, 0);
    loop {
        // a loaded API server may drop a request now and then: poll again rather than give up
        match ready_nodes(api, prefix).await {
            Ok((registered, ready)) => {
                (listed, seen_ready) = (registered, ready);
                if ready >= nodes {
                    return Ok(());
                }
            }
            Err(e) => eprintln!("density: listing nodes failed ({e}); polling again"),
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{nodes} nodes not Ready within {limit:?} ({listed} registered, {seen_ready} Ready)");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Creates `per_node` pause pods bound to each of `nodes` (`<prefix>-0` …), 64 requests in flight, and waits
/// until all of them are Running. Returns the seconds from the first create to all Running.
pub async fn run_bound_pods(
    client: &kube::Client,
    prefix: &str,
    nodes: usize,
    per_node: usize,
) -> anyhow::Result<f64> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let total = nodes * per_node;
    let start = tokio::time::Instant::now();
    create_all(&pods, total, |i| {
        let node = format!("{prefix}-{}", i % nodes);
        serde_json::json!({
            "metadata": {"name": format!("density-{i}"), "labels": {"app": "density"}},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}],
                "tolerations": [{"operator": "Exists"}],
            },
        })
    })
    .await?;
    eprintln!(
        "density: {total} pods created after {:.1} s",
        start.elapsed().as_secs_f64()
    );
    wait_running(&pods, total, start).await
}

/// Waits until `total` pods labelled `app=density` are Running (at most 1800 s after `start`); the seconds since
/// `start`.
pub async fn wait_running(pods: &Api<Pod>, total: usize, start: tokio::time::Instant) -> anyhow::Result<f64> {
    let deadline = start + Duration::from_secs(1800);
    loop {
        let listed = pods
            .list_metadata(
                &ListParams::default()
                    .labels("app=density")
                    .fields("status.phase=Running"),
            )
            .await;
        let running = match listed {
            Ok(list) => list.items.len(),
            Err(e) => {
                eprintln!("density: listing pods failed ({e}); polling again");
                0
            }
        };
        if running >= total {
            return Ok(start.elapsed().as_secs_f64());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{running} of {total} pods Running after 1800 s");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Lease updates the API server has answered so far (`PUT` on `leases`, from its own `apiserver_request_total`).
/// Read before and after a window, the difference is the renewals both fleets make, on the same footing; an
/// idle fleet makes little else, and the controller-manager's own requests (after a registration burst its TTL
/// controller patches every Node, its node controller posts an event for each) stay out of the count. The control
/// plane's own leader-election and identity leases are in it: a few a second, beside hundreds.
pub async fn server_lease_updates(client: &kube::Client) -> anyhow::Result<f64> {
    Ok(testenv::server_metrics::request_counts(client)
        .await?
        .iter()
        .filter(|c| c.label("resource") == "leases" && c.label("verb") == "PUT")
        .map(|c| c.value)
        .sum())
}

/// Creates `count` objects from `make(i)` through `create`, 64 in flight, a failed create tried again up to 5
/// times (an object already there counts as made).
pub async fn create_all<K, F>(api: &Api<K>, count: usize, make: F) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    F: Fn(usize) -> serde_json::Value,
{
    let creates = (0..count).map(|i| {
        let api = api.clone();
        let object = make(i);
        async move {
            let object: K = serde_json::from_value(object)?;
            let mut tries = 0;
            loop {
                match api.create(&PostParams::default(), &object).await {
                    Ok(_) => return anyhow::Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 409 => return Ok(()),
                    Err(e) if tries < 5 => {
                        tries += 1;
                        eprintln!("density: creating an object failed ({e}); again");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    });
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(creates)
        .buffer_unordered(64)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(())
}
