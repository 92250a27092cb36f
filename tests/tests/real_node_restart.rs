//! Disruptions of the real node, each a test that holds the node alone (they run one after another): restart
//! adoption ([`adoption`]: node-agent stopped with SIGTERM and SIGKILL takes its running pods back), pods
//! deleted while the agent was down ([`orphans`]: what they left — runtime objects, directory, mounts, cgroup —
//! is swept at the next start, nothing else touched), and static pods through an API server outage
//! ([`api_outage`]: a pod from `staticPodURL`, served by this binary on 127.0.0.1, and one from
//! `staticPodPath` keep running while the API server is stopped, and are mirrored again when it returns), a
//! resized pod's allocation kept by a restarted agent ([`resize`]), and a damaged client certificate replaced by
//! TLS bootstrap at the next start ([`client_certificate`]).
//! A binary of its own (its own node and control plane), since it stops the agent and the API server that every
//! test of a node would share. Needs root (or `NODE_AGENT_SKIP_REAL_NODE=1` to skip).

/// The containerd the node runs on (Debian's 1.6).
const CONTAINERD: &str = "1.6";

#[allow(dead_code)]
#[path = "real_node/harness.rs"]
mod harness;

#[path = "real_node_restart/adoption.rs"]
mod adoption;
#[path = "real_node_restart/api_outage.rs"]
mod api_outage;
#[path = "real_node_restart/client_certificate.rs"]
mod client_certificate;
#[path = "real_node_restart/orphans.rs"]
mod orphans;
#[path = "real_node_restart/resize.rs"]
mod resize;

use std::io::{Read, Write};
use std::sync::{Mutex, OnceLock};

use harness::{NODE, NodeOptions, RealNode};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::Api;
use runtime_api::{Runtime, cri};

/// Held by each test for its whole run: every test here disrupts the node the others use.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What the node's `staticPodURL` serves now (empty: no pods).
static URL_BODY: Mutex<String> = Mutex::new(String::new());

/// How many times the node's `staticPodURL` has been answered.
static URL_READS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many times the node has read its `staticPodURL` so far.
fn url_reads() -> usize {
    URL_READS.load(std::sync::atomic::Ordering::SeqCst)
}

/// Serves [`URL_BODY`] over HTTP on 127.0.0.1 from a thread of this process (one connection at a time, each
/// answered and closed); returns the URL. Started once, before the node, since the node's configuration
/// names it.
fn static_pod_url() -> anyhow::Result<&'static str> {
    static URL: OnceLock<String> = OnceLock::new();
    if let Some(url) = URL.get() {
        return Ok(url);
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}/pods.yaml", listener.local_addr()?);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            // the request: read until its head ends (a GET has no body)
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let body = URL_BODY.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/yaml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            if conn.write_all(reply.as_bytes()).is_ok() {
                URL_READS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    Ok(URL.get_or_init(|| url))
}

/// Sets what the node's `staticPodURL` serves.
fn serve_static_pods(body: &str) {
    *URL_BODY.lock().unwrap_or_else(|p| p.into_inner()) = body.to_owned();
}

/// The node (started by the first test that asks, with a `staticPodURL` served by [`static_pod_url`]) and the
/// lock that gives the calling test the node alone; `None` when the real-node tests are not enabled.
async fn node() -> anyhow::Result<Option<(&'static RealNode, tokio::sync::MutexGuard<'static, ()>)>> {
    let serial = SERIAL.lock().await;
    let options = NodeOptions {
        extra_config: format!(
            "staticPodURL: {}\nhttpCheckFrequency: 5s\nfileCheckFrequency: 5s\n",
            static_pod_url()?
        ),
        ..Default::default()
    };
    Ok(RealNode::get_with(&options).await?.map(|n| (n, serial)))
}

fn pod(name: &str, script: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "localhost/busybox:local", "command": ["sh", "-c", script]}],
        },
    }))?)
}

fn container(p: &Pod) -> Option<ContainerStatus> {
    p.status.as_ref()?.container_statuses.as_ref()?.first().cloned()
}

/// (sandboxes, running containers) containerd holds for the pod.
async fn in_runtime(node: &RealNode, uid: &str) -> anyhow::Result<(usize, usize)> {
    let cri = node.cri().await?;
    let selector = || [("io.kubernetes.pod.uid".to_owned(), uid.to_owned())].into();
    let sandboxes = cri
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: selector(),
                ..Default::default()
            }),
        })
        .await?
        .items
        .len();
    let running = cri
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: selector(),
                ..Default::default()
            }),
        })
        .await?
        .containers
        .iter()
        .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        .count();
    Ok((sandboxes, running))
}

async fn renew_time(leases: &Api<Lease>) -> anyhow::Result<Option<k8s_openapi::jiff::Timestamp>> {
    Ok(leases
        .get(NODE)
        .await?
        .spec
        .and_then(|s| s.renew_time)
        .map(|t| t.0))
}
