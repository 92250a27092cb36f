//! Control-plane faults under the real node: the API server restarted and etcd restarted while pods run (the
//! pods untouched, the node Ready, the agent's watches resume: a pod created afterwards starts, one deleted
//! afterwards goes); a watch answered 410 Gone after etcd was compacted under it (the agent lists again and
//! goes on; no pod restarted); and the API server unreachable from the node (its connections cut by the relay
//! the node's kubeconfig names) for longer than the node's lease: the node-lifecycle controller marks the node
//! Unknown and its pods not ready, and once the node is reachable again it is Ready and its pods ready, with
//! their containers untouched.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use e2e::{init_logging, wait_for};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, WatchEvent, WatchParams};

use super::harness::{NODE, RealNode};
use super::{
    RELAY, all_running, delete_all, fault_pods, held_by_uid, main_container, name, node, pod_ready,
    ready_condition, sleeper, uid, wait_clean,
};

/// Starts `count` sleepers in `pods` and answers their container IDs by name.
async fn steady(
    node: &RealNode,
    pods: &Api<Pod>,
    count: usize,
) -> anyhow::Result<BTreeMap<String, Option<String>>> {
    for i in 0..count {
        node.create_pod(pods, &sleeper(&format!("steady-{i}"))?).await?;
    }
    Ok(all_running(node, pods, count, Duration::from_secs(90))
        .await?
        .iter()
        .map(|p| (name(p), main_container(p).1))
        .collect())
}

/// Waits until the node's lease is renewed after `since`; answers how long that took from now.
async fn lease_renewed_after(
    node: &RealNode,
    since: k8s_openapi::jiff::Timestamp,
) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    let leases: Api<Lease> = Api::namespaced(node.cp.admin_client().await?, "kube-node-lease");
    wait_for("a lease renewal", Duration::from_secs(90), || async {
        let renewed = leases
            .get(NODE)
            .await?
            .spec
            .and_then(|s| s.renew_time)
            .map(|t| t.0);
        Ok(renewed.filter(|t| *t > since).map(|_| ()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    Ok(t0.elapsed())
}

/// Every pod of `pods` ready and running with the container it had in `before` (restart count 0), and the
/// runtime holding one ready sandbox and one running container for each.
async fn untouched(
    node: &RealNode,
    pods: &Api<Pod>,
    before: &BTreeMap<String, Option<String>>,
) -> anyhow::Result<()> {
    let all = all_running(node, pods, before.len(), Duration::from_secs(120)).await?;
    let held = held_by_uid(node).await?;
    for p in &all {
        let (_, id, restarts) = main_container(p);
        assert_eq!(restarts, 0, "{} restarted", name(p));
        assert_eq!(before.get(&name(p)), Some(&id), "{} kept its container", name(p));
        let h = held.get(&uid(p)).copied().unwrap_or_default();
        assert_eq!((h.ready_sandboxes, h.running), (1, 1), "{}: {h:?}", name(p));
    }
    Ok(())
}

/// The agent still follows the API: a pod created now runs, and pod `gone` deleted now leaves the API (its
/// deletion finished by the agent). Answers how long each took.
async fn still_following(
    node: &RealNode,
    pods: &Api<Pod>,
    new: &str,
    gone: &str,
    count_after: usize,
) -> anyhow::Result<(Duration, Duration)> {
    let t0 = Instant::now();
    node.create_pod(pods, &sleeper(new)?).await?;
    pods.delete(gone, &DeleteParams::default()).await?;
    let deleted = wait_for(
        &format!("{gone} deleted by the agent"),
        Duration::from_secs(90),
        || async { Ok(pods.get_opt(gone).await?.is_none().then(|| t0.elapsed())) },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    all_running(node, pods, count_after, Duration::from_secs(90)).await?;
    Ok((t0.elapsed(), deleted))
}

#[tokio::test]
async fn api_server_and_etcd_restarted() -> anyhow::Result<()> {
    init_logging();
    let Some((node, _serial)) = node().await? else {
        return Ok(());
    };
    let pods = node.namespace("rf-cp").await?;
    let mut before = steady(node, &pods, 3).await?;

    // the API server stopped for 10 s and started again
    let stopped_at = k8s_openapi::jiff::Timestamp::now();
    node.cp.stop_apiserver().await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    node.cp.start_apiserver().await?;
    let api_renewed = lease_renewed_after(node, stopped_at).await?;
    // Ready (the controller may have marked it Unknown meanwhile: its grace period is short here)
    wait_for("the node Ready", Duration::from_secs(60), || async {
        Ok(ready_condition(node).await?.filter(|c| c.status == "True"))
    })
    .await?;
    untouched(node, &pods, &before).await?;
    let (api_new, api_deleted) = still_following(node, &pods, "after-api", "steady-0", 3).await?;
    before.remove("steady-0");
    before.insert(
        "after-api".into(),
        main_container(&pods.get("after-api").await?).1,
    );

    // etcd stopped for 10 s and started again (the API server stays up, answering errors meanwhile)
    let stopped_at = k8s_openapi::jiff::Timestamp::now();
    node.cp.stop_etcd().await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    node.cp.start_etcd().await?;
    let etcd_renewed = lease_renewed_after(node, stopped_at).await?;
    // Ready (the controller may have marked it Unknown meanwhile: its grace period is short here)
    wait_for("the node Ready", Duration::from_secs(60), || async {
        Ok(ready_condition(node).await?.filter(|c| c.status == "True"))
    })
    .await?;
    untouched(node, &pods, &before).await?;
    let (etcd_new, etcd_deleted) = still_following(node, &pods, "after-etcd", "steady-1", 3).await?;
    println!(
        "[real_node_faults] API server stopped 10 s: lease renewed {api_renewed:?} after it was ready again, node \
         Ready, 3 pods untouched; a new pod Running {api_new:?} and a deleted one gone {api_deleted:?} later. \
         etcd stopped 10 s: lease renewed {etcd_renewed:?} after the API server was ready again, pods untouched; \
         a new pod Running {etcd_new:?}, a deleted one gone {etcd_deleted:?} later"
    );
    delete_all(node, &pods).await?;
    wait_clean(node).await?;
    Ok(())
}

/// POSTs `body` (JSON) to etcd's gRPC gateway at `path`; answers the JSON reply.
fn etcd_post(url: &str, path: &str, body: &str) -> anyhow::Result<serde_json::Value> {
    let host = url.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(host).with_context(|| format!("connecting to etcd {url}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut reply = String::new();
    conn.read_to_string(&mut reply)?;
    let (head, json) = reply.split_once("\r\n\r\n").context("no HTTP reply from etcd")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("etcd {path}: {head}\n{json}");
    }
    // a chunked reply: the JSON object is the one line that starts with '{'
    let line = json
        .lines()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("etcd {path}: {json}"))?;
    Ok(serde_json::from_str(line)?)
}

/// Writes a key outside the API server's prefix (moving etcd's revision on) and compacts etcd up to its
/// current revision; answers that revision.
fn compact_etcd(url: &str) -> anyhow::Result<i64> {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let put = etcd_post(
        url,
        "/v3/kv/put",
        &format!(r#"{{"key":"{}","value":"{}"}}"#, b64("/faults/bump"), b64("x")),
    )?;
    let revision: i64 = put["header"]["revision"]
        .as_str()
        .context("etcd put: no revision")?
        .parse()?;
    etcd_post(
        url,
        "/v3/kv/compaction",
        &format!(r#"{{"revision":"{revision}","physical":true}}"#),
    )?;
    Ok(revision)
}

#[tokio::test]
async fn a_watch_answered_410_after_etcd_compaction() -> anyhow::Result<()> {
    init_logging();
    let Some((node, _serial)) = node().await? else {
        return Ok(());
    };
    let pods = node.namespace("rf-compact").await?;
    let mut before = steady(node, &pods, 2).await?;
    let old_version = pods
        .list(&Default::default())
        .await?
        .metadata
        .resource_version
        .context("list resourceVersion")?;

    // the API server away while etcd moves on and is compacted: every watch resumes from a version etcd no
    // longer has
    let stopped_at = k8s_openapi::jiff::Timestamp::now();
    node.cp.stop_apiserver().await?;
    let url = node.cp.etcd_url().context("etcd URL")?.to_owned();
    let compacted = tokio::task::spawn_blocking(move || compact_etcd(&url)).await??;
    node.cp.start_apiserver().await?;

    // what any client resuming from before now is answered
    let mut stream = pods
        .watch(&WatchParams::default().timeout(10), &old_version)
        .await?
        .boxed();
    let first = tokio::time::timeout(Duration::from_secs(15), stream.next()).await;
    match first {
        Ok(Some(Ok(WatchEvent::Error(e)))) if e.code == 410 => {}
        Ok(Some(Err(kube::Error::Api(e)))) if e.code == 410 => {}
        other => bail!("a watch from resourceVersion {old_version} was answered {other:?}, not 410 Gone"),
    }
    drop(stream);

    let renewed = lease_renewed_after(node, stopped_at).await?;
    untouched(node, &pods, &before).await?;
    let (new, deleted) = still_following(node, &pods, "after-compaction", "steady-0", 2).await?;
    before.remove("steady-0");
    before.insert(
        "after-compaction".into(),
        main_container(&pods.get("after-compaction").await?).1,
    );
    untouched(node, &pods, &before).await?;
    println!(
        "[real_node_faults] etcd compacted at revision {compacted} while the API server was down (a watch from \
         {old_version} answered 410 Gone): lease renewed {renewed:?} after it was back, pods untouched; a new \
         pod Running {new:?} and a deleted one gone {deleted:?} later"
    );
    delete_all(node, &pods).await?;
    wait_clean(node).await?;
    Ok(())
}

#[tokio::test]
async fn api_server_unreachable_past_the_lease() -> anyhow::Result<()> {
    init_logging();
    let Some((node, _serial)) = node().await? else {
        return Ok(());
    };
    let relay = RELAY.get().context("the node's API server relay")?;
    let pods = node.namespace("rf-unreachable").await?;
    let before = steady(node, &pods, 3).await?;

    let cut = Instant::now();
    relay.cut();
    let unknown = wait_for(
        "the node Unknown (node-lifecycle controller)",
        Duration::from_secs(120),
        || async { Ok(ready_condition(node).await?.filter(|c| c.status == "Unknown")) },
    )
    .await;
    let unknown_after = cut.elapsed();
    let unknown = match unknown {
        Ok(c) => c,
        Err(e) => {
            relay.restore();
            return Err(e);
        }
    };
    // the controller marks the node's pods not ready (their Ready condition; the containers' statuses are the
    // node's to write, and the containers run on)
    let not_ready = wait_for(
        "the node's pods marked not ready",
        Duration::from_secs(60),
        || async {
            let all = fault_pods(&pods).await?;
            Ok(all.iter().all(|p| !pod_ready(p)).then_some(()))
        },
    )
    .await;
    let outage = cut.elapsed();
    relay.restore();
    not_ready?;
    let restored = Instant::now();
    wait_for("the node Ready again", Duration::from_secs(90), || async {
        Ok(ready_condition(node).await?.filter(|c| c.status == "True"))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let ready_after = restored.elapsed();
    untouched(node, &pods, &before).await?;
    // the agent writes the Ready condition the controller overwrote back
    wait_for("the pods ready again", Duration::from_secs(60), || async {
        let all = fault_pods(&pods).await?;
        Ok(all.iter().all(pod_ready).then_some(()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let pods_ready_after = restored.elapsed();
    println!(
        "[real_node_faults] API server unreachable from the node for {outage:?}: Unknown after {unknown_after:?} \
         ({:?}: {:?}), pods marked not ready; Ready {ready_after:?} after it was reachable, the 3 pods ready \
         with their containers untouched {pods_ready_after:?} after",
        unknown.reason.as_deref().unwrap_or_default(),
        unknown.message.as_deref().unwrap_or_default()
    );
    delete_all(node, &pods).await?;
    wait_clean(node).await?;
    Ok(())
}
