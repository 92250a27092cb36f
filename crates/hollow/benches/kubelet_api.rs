//! Kubelet API benchmark for a hollow fleet process: what a listener per node costs in resident memory, and a
//! `/metrics/resource` scrape of every node (metrics-server's round) — latency and bytes.
//!
//! No control plane: `KAPI_NODES` agents (default 1,000) are built but not started, each over its own fake
//! runtime holding `KAPI_PODS_PER_NODE` running pods (default 10) with scripted usage; the server runs with
//! `authorization.mode: AlwaysAllow` and anonymous requests enabled so that no API server is asked (the
//! TokenReview / SubjectAccessReview round trips are the API server's cost, cached per user afterwards).
//!
//! ```sh
//! cargo bench -p hollow --bench kubelet_api
//! KAPI_NODES=5000 KAPI_PODS_PER_NODE=10 cargo bench -p hollow --bench kubelet_api
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cri_fake::{FakeConfig, FakeRuntime};
use http_body_util::BodyExt;
use node_agent::config::AuthorizationMode;
use node_agent::server::{KubeletServer, NodeEndpoint, ScriptedLogs, ServingIdentity};
use node_agent::{Agent, AgentConfig, KubeletConfig, MachineInfo};
use runtime_api::{Runtime, cri};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_util::sync::CancellationToken;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_bytes() -> u64 {
    hollow::server::rss_bytes()
}

async fn pods(fake: &FakeRuntime, node: usize, n: usize) -> anyhow::Result<()> {
    for p in 0..n {
        let name = format!("pod-{node}-{p}");
        let sandbox = fake
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(cri::PodSandboxConfig {
                    metadata: Some(cri::PodSandboxMetadata {
                        name: name.clone(),
                        uid: format!("uid-{name}"),
                        namespace: "default".into(),
                        attempt: 0,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await?
            .pod_sandbox_id;
        let prefix = cri_fake::ANNOTATION_PREFIX;
        let id = fake
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox,
                config: Some(cri::ContainerConfig {
                    metadata: Some(cri::ContainerMetadata {
                        name: "app".into(),
                        attempt: 0,
                    }),
                    image: Some(cri::ImageSpec {
                        image: "registry.k8s.io/pause:3.10".into(),
                        ..Default::default()
                    }),
                    annotations: [
                        (format!("{prefix}memory"), "32Mi, ~64Mi@10m".to_owned()),
                        (format!("{prefix}cpu"), "100m".to_owned()),
                    ]
                    .into(),
                    ..Default::default()
                }),
                sandbox_config: None,
            })
            .await?
            .container_id;
        fake.start_container(cri::StartContainerRequest { container_id: id })
            .await?;
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let nodes = env_or("KAPI_NODES", 1000);
    let per_node = env_or("KAPI_PODS_PER_NODE", 10);
    let dir = tempfile_dir()?;
    let ca = testenv::pki::Ca::generate("kapi-bench-ca")?;
    let serving = ca.issue(&testenv::pki::CertSpec {
        common_name: "hollow".into(),
        ips: vec!["127.0.0.1".parse()?],
        server: true,
        ..Default::default()
    })?;
    std::fs::write(dir.join("tls.crt"), &serving.cert)?;
    std::fs::write(dir.join("tls.key"), &serving.key)?;
    let defaults = KubeletConfig::default();
    let kubelet = Arc::new(KubeletConfig {
        tls_cert_file: Some(dir.join("tls.crt")),
        tls_private_key_file: Some(dir.join("tls.key")),
        authentication: node_agent::config::Authentication {
            anonymous_enabled: true,
            ..defaults.authentication.clone()
        },
        authorization: node_agent::config::Authorization {
            mode: AuthorizationMode::AlwaysAllow,
            ..defaults.authorization.clone()
        },
        ..defaults
    });
    // never contacted: the agents are not started and authorization asks no one
    let client = kube::Client::try_from(kube::Config::new("https://127.0.0.1:9".parse()?))?;
    let token = CancellationToken::new();

    let mut agents = Vec::with_capacity(nodes);
    for i in 0..nodes {
        let fake = FakeRuntime::new(FakeConfig {
            images: vec!["registry.k8s.io/pause:3.10".into()],
            ..FakeConfig::default()
        });
        pods(&fake, i, per_node).await?;
        let name = format!("kapi-{i}");
        let config = AgentConfig::new(
            name.clone(),
            "127.0.0.1".parse()?,
            kubelet.clone(),
            MachineInfo::synthetic(&name),
        );
        let agent = Agent::builder(config, client.clone(), Arc::new(fake.clone()) as Arc<dyn Runtime>)
            .token(token.child_token())
            .build()?;
        agents.push((agent, fake));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = rss_bytes();
    let server = KubeletServer::new(kubelet.clone(), &ServingIdentity::default(), None, token.clone())?;
    let mut ports = Vec::with_capacity(nodes);
    for (agent, fake) in &agents {
        let script = fake.clone();
        let logs = ScriptedLogs::new(move |id| script.container_logs(id).map_err(|e| e.to_string()));
        let endpoint = NodeEndpoint::new(agent.context().clone()).with_logs(Arc::new(logs));
        ports.push(server.serve_node(SocketAddr::from(([127, 0, 0, 1], 0)), endpoint)?);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_bytes();

    // one scrape round: every node's /metrics/resource, 16 at a time, over fresh TLS connections
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.pem().cert.as_bytes()) {
        roots.add(cert?)?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, String>(connector);
    let mut latencies = Vec::with_capacity(nodes);
    let mut bytes = 0usize;
    let round = std::time::Instant::now();
    for chunk in ports.chunks(16) {
        let fetches = chunk.iter().map(|addr| {
            let http = http.clone();
            async move {
                let start = std::time::Instant::now();
                let req =
                    http::Request::get(format!("https://{addr}/metrics/resource")).body(String::new())?;
                let resp = http.request(req).await?;
                anyhow::ensure!(resp.status() == 200, "{addr}: {}", resp.status());
                let body = resp.into_body().collect().await?.to_bytes();
                anyhow::Ok((start.elapsed(), body.len()))
            }
        });
        for r in futures::future::join_all(fetches).await {
            let (latency, len) = r?;
            latencies.push(latency);
            bytes += len;
        }
    }
    let round = round.elapsed();
    latencies.sort();
    let pct = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "kubelet API benchmark: {nodes} nodes, {per_node} pods per node ({} pods)",
        nodes * per_node
    );
    println!(
        "  listeners: {:.0} bytes RSS per node ({:.1} MiB for {nodes})",
        (after.saturating_sub(before)) as f64 / nodes as f64,
        (after.saturating_sub(before)) as f64 / 1048576.0
    );
    println!(
        "  /metrics/resource of every node: round {:.2} s (16 concurrent), per scrape p50 {:.1} ms p99 {:.1} ms, {} bytes per node, {:.1} MiB in all",
        round.as_secs_f64(),
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        bytes / nodes.max(1),
        bytes as f64 / 1048576.0
    );
    token.cancel();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("kapi-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
