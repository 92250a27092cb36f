//! The kubelet API of hollow nodes against the real control plane: `kubectl logs` through the API server returns
//! a hollow container's scripted log lines; `/stats/summary` and `/metrics/resource` answer for the node asked
//! (each node has a port of its own) with the scripted usage on top of the profile's baseline, which a node
//! without pods reports alone (CPU and memory above 0, its CPU counter growing); credentials are checked as the kubelet checks
//! them: anonymous 401, a token without RBAC 403 from our SubjectAccessReview, a token with it 200, a client
//! certificate from the cluster CA 200.
//!
//! The API server refuses to proxy to loopback node addresses (`/api/v1/nodes/N/proxy/...` answers "address not
//! allowed"), so node-scoped endpoints are called directly, as metrics-server does; logs go through the API
//! server, which verifies the node's serving certificate against the cluster CA and presents its kubelet client
//! certificate. `kubectl exec` goes through the API server too: the node serves the SPDY stream itself (the fake
//! runtime has no streaming server) and runs the command with the pod's scripted exec rules. `/metrics/probes`
//! counts each pod's scripted probe results under the kubelet's names and drops a pod's series when it goes.
//! [`authz`] checks every path against every kind of caller.

use std::sync::Arc;
use std::time::Duration;

use e2e::{init_logging, wait_for};
use hollow::client_pool::{ClientPool, PoolLimits, PoolSize};
use hollow::fleet::{Fleet, FleetSpec, KubeletApi};
use hollow::profiles;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::{LogParams, PostParams};
use node_agent::pods::PodMetrics;
use node_agent::{KubeletConfig, Metrics};
use prometheus_client::registry::Registry;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[path = "kubelet_api/authz.rs"]
mod authz;

/// An HTTPS client of the kubelet API.
type HttpsClient =
    HttpClient<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>, String>;

const NODES: usize = 2;
/// The default profile's baseline: 2% of 32 GiB, 1% of 8 CPUs.
const BASELINE_MEMORY: u64 = (32 << 30) / 50;
const BASELINE_NANO_CORES: u64 = 80_000_000;
const NS: &str = "default";

/// A base port with `n` free consecutive loopback ports above it.
fn free_port_range(n: u16) -> anyhow::Result<u16> {
    for _ in 0..200 {
        let base = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if base > 65535 - n {
            continue;
        }
        if (0..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return Ok(base);
        }
    }
    anyhow::bail!("no {n} consecutive free ports")
}

/// An HTTPS client trusting the cluster CA, presenting `identity` (certificate, key PEM) when given.
fn https(cp: &testenv::ControlPlane, identity: Option<&testenv::pki::Pem>) -> anyhow::Result<HttpsClient> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(cp.client_ca_file())? {
        roots.add(cert?)?;
    }
    let builder =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
    let config = match identity {
        Some(pem) => builder.with_client_auth_cert(
            CertificateDer::pem_slice_iter(pem.cert.as_bytes()).collect::<Result<Vec<_>, _>>()?,
            PrivateKeyDer::from_pem_slice(pem.key.as_bytes())?,
        )?,
        None => builder.with_no_client_auth(),
    };
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .enable_http1()
        .build();
    Ok(HttpClient::builder(TokioExecutor::new()).build(connector))
}

/// GET `https://127.0.0.1:<port><path>`: status and body.
async fn get(
    client: &HttpClient<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        String,
    >,
    port: u16,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    let mut req = http::Request::get(format!("https://127.0.0.1:{port}{path}"));
    if let Some(token) = token {
        req = req.header("Authorization", format!("Bearer {token}"));
    }
    let resp = client.request(req.body(String::new())?).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A token for service account `name` (created if missing).
async fn service_account_token(client: &kube::Client, name: &str) -> anyhow::Result<String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match accounts.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let answer = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await?;
    answer
        .status
        .and_then(|s| s.token)
        .ok_or_else(|| anyhow::anyhow!("no token for {name}"))
}

/// Lets service account `name` read node stats and metrics (what metrics-server's role grants).
async fn grant_stats(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "kubelet-api-test-scraper"},
        "rules": [{"apiGroups": [""], "resources": ["nodes/stats", "nodes/metrics"], "verbs": ["get"]}],
    }))?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "kubelet-api-test-scraper"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kubelet-api-test-scraper"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NS}],
    }))?;
    for r in [
        Api::<ClusterRole>::all(client.clone())
            .create(&PostParams::default(), &role)
            .await
            .map(|_| ()),
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .map(|_| ()),
    ] {
        match r {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn scripted_pod(name: &str, node: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {
            "cri-fake.node-agent.io/logs": "hello from the hollow node\nsecond line\nthird line",
            "cri-fake.node-agent.io/memory": "48Mi",
            "cri-fake.node-agent.io/cpu": "250m",
            "cri-fake.node-agent.io/exec": r#"[{"cmd": "check", "exitCode": 3, "stdout": "checked out\n", "stderr": "checked err\n"}]"#,
        }},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        },
    }))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_stats_and_resource_metrics_of_hollow_nodes_with_the_kubelets_auth() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    let base = free_port_range(NODES as u16)?;
    let (cert, key) = cp.kubelet_serving_certificate("hollow-kapi")?;
    let defaults = KubeletConfig::default();
    let kubelet = KubeletConfig {
        tls_cert_file: Some(cert),
        tls_private_key_file: Some(key),
        authentication: node_agent::config::Authentication {
            client_ca_file: Some(cp.client_ca_file()),
            ..defaults.authentication.clone()
        },
        ..defaults
    };
    let spec = FleetSpec {
        register_qps: 200.0,
        kubelet_port: base,
        kubelet,
        kubelet_api: Some(KubeletApi {
            registry: Some(Arc::new(Registry::default())),
        }),
        ..FleetSpec::new(NODES, "kapi-{index}", profiles::default_profiles())?
    };
    let pool = ClientPool::new(
        &cp.admin_config().await?,
        PoolSize::for_fleet(NODES, true, PoolLimits::default()),
    )?;
    let token = CancellationToken::new();
    let fleet = Fleet::start(
        &spec,
        &pool,
        Arc::new(Metrics::unregistered()),
        Arc::new(PodMetrics::new()),
        token.clone(),
    )
    .await?;

    // each node publishes its own port
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    for i in 0..NODES {
        let name = format!("kapi-{i}");
        let port = wait_for(&format!("{name} registered"), Duration::from_secs(60), || async {
            Ok(nodes
                .get_opt(&name)
                .await?
                .and_then(|n| n.status?.daemon_endpoints?.kubelet_endpoint.map(|e| e.port)))
        })
        .await?;
        assert_eq!(port, i32::from(base) + i32::try_from(i)?, "{name}'s kubelet port");
    }

    // a pod with scripted logs and usage on kapi-1
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    pods.create(&PostParams::default(), &scripted_pod("kapi-logs", "kapi-1")?)
        .await?;
    let running = wait_for("kapi-logs Running", Duration::from_secs(60), || async {
        let pod = pods.get("kapi-logs").await?;
        Ok((pod.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
    })
    .await;
    if let Err(e) = running {
        anyhow::bail!("{e:#}\n{}", e2e::pod_report(&admin, NS, "kapi-logs").await);
    }

    // kubectl logs, through the API server
    let all = pods.logs("kapi-logs", &LogParams::default()).await?;
    println!("[kubelet_api] logs through the API server: {all:?}");
    assert_eq!(all, "hello from the hollow node\nsecond line\nthird line\n");
    let tail = pods
        .logs(
            "kapi-logs",
            &LogParams {
                tail_lines: Some(1),
                timestamps: true,
                ..LogParams::default()
            },
        )
        .await?;
    assert!(
        tail.ends_with(" third line\n") && tail.lines().count() == 1,
        "{tail:?}"
    );
    let limited = pods
        .logs(
            "kapi-logs",
            &LogParams {
                limit_bytes: Some(5),
                ..LogParams::default()
            },
        )
        .await?;
    assert_eq!(limited, "hello");
    let unknown = pods
        .logs(
            "kapi-logs",
            &LogParams {
                container: Some("nope".into()),
                ..LogParams::default()
            },
        )
        .await;
    assert!(unknown.is_err(), "an unknown container is refused: {unknown:?}");

    // credentials, checked as the kubelet checks them
    let port1 = base + 1;
    let anonymous = https(cp, None)?;
    let (status, body) = get(&anonymous, port1, "/stats/summary", None).await?;
    assert_eq!((status, body.as_str()), (401, "Unauthorized"), "anonymous");
    let nobody = service_account_token(&admin, "kapi-nobody").await?;
    let (status, body) = get(&anonymous, port1, "/stats/summary", Some(&nobody)).await?;
    println!("[kubelet_api] token without RBAC: {status} {body}");
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("user=system:serviceaccount:default:kapi-nobody")
            && body.contains("resource=nodes")
            && body.contains("subresource(s)=[stats]"),
        "{body}"
    );
    let (status, _) = get(
        &anonymous,
        port1,
        "/containerLogs/default/kapi-logs/app",
        Some(&nobody),
    )
    .await?;
    assert_eq!(status, 403, "logs need nodes/proxy");
    let (status, _) = get(&anonymous, port1, "/stats/summary", Some("not-a-token")).await?;
    assert_eq!(status, 401, "a token the API server does not know");
    let scraper = service_account_token(&admin, "kapi-scraper").await?;
    grant_stats(&admin, "kapi-scraper").await?;

    // /stats/summary of kapi-1 lists its pod with the scripted usage; kapi-0's lists none
    let summary = wait_for("RBAC for kapi-scraper", Duration::from_secs(30), || async {
        let (status, body) = get(&anonymous, port1, "/stats/summary", Some(&scraper)).await?;
        Ok((status == 200).then_some(body))
    })
    .await?;
    let summary: serde_json::Value = serde_json::from_str(&summary)?;
    assert_eq!(summary["node"]["nodeName"], "kapi-1");
    let listed: Vec<&str> = summary["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["podRef"]["name"].as_str())
        .collect();
    assert_eq!(listed, ["kapi-logs"], "the node's pods");
    let pod = &summary["pods"][0];
    assert_eq!(pod["containers"][0]["name"], "app");
    assert_eq!(pod["memory"]["workingSetBytes"], 48 << 20, "scripted memory");
    assert_eq!(pod["cpu"]["usageNanoCores"], 250_000_000, "scripted CPU");
    // the node: the default profile's baseline (1% of 8 CPUs, 2% of 32 GiB) plus its pod
    assert_eq!(
        summary["node"]["memory"]["workingSetBytes"],
        BASELINE_MEMORY + (48 << 20)
    );
    assert_eq!(
        summary["node"]["cpu"]["usageNanoCores"],
        BASELINE_NANO_CORES + 250_000_000
    );
    let (status, other) = get(&anonymous, base, "/stats/summary", Some(&scraper)).await?;
    assert_eq!(status, 200);
    let other: serde_json::Value = serde_json::from_str(&other)?;
    assert_eq!(other["node"]["nodeName"], "kapi-0");
    assert_eq!(
        other["pods"].as_array().map(Vec::len),
        Some(0),
        "kapi-0 runs no pod"
    );
    // a node without pods still reports the machine's own use, never 0 (metrics-server drops a node at 0)
    assert_eq!(other["node"]["memory"]["workingSetBytes"], BASELINE_MEMORY);
    assert_eq!(other["node"]["cpu"]["usageNanoCores"], BASELINE_NANO_CORES);
    let node_cpu_seconds = |text: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix("node_cpu_usage_seconds_total "))
            .and_then(|rest| rest.split(' ').next())
            .and_then(|v| v.parse().ok())
    };
    let (status, idle) = get(&anonymous, base, "/metrics/resource", Some(&scraper)).await?;
    assert_eq!(status, 200, "{idle}");
    assert!(
        idle.contains(&format!("node_memory_working_set_bytes {BASELINE_MEMORY} ")),
        "{idle}"
    );
    let first = node_cpu_seconds(&idle).expect("node_cpu_usage_seconds_total");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, later) = get(&anonymous, base, "/metrics/resource", Some(&scraper)).await?;
    let second = node_cpu_seconds(&later).expect("node_cpu_usage_seconds_total");
    // metrics-server takes the node's CPU as the rate of this counter between two scrapes
    assert!(
        first > 0.0 && second > first,
        "an idle node's CPU counter grows: {first} then {second}"
    );

    // /metrics/resource: the kubelet's names and labels
    let (status, text) = get(&anonymous, port1, "/metrics/resource", Some(&scraper)).await?;
    assert_eq!(status, 200, "{text}");
    assert!(
        text.lines().any(|l| l.starts_with(
            "container_memory_working_set_bytes{container=\"app\",namespace=\"default\",pod=\"kapi-logs\"} 50331648 "
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "node_memory_working_set_bytes {} ",
            BASELINE_MEMORY + 50_331_648
        )),
        "{text}"
    );
    assert!(text.contains("pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"kapi-logs\"}"));
    // the scraper may not read logs (nodes/proxy)
    let (status, _) = get(
        &anonymous,
        port1,
        "/containerLogs/default/kapi-logs/app",
        Some(&scraper),
    )
    .await?;
    assert_eq!(status, 403);

    // a client certificate from the cluster CA in system:masters: everything, including logs with options
    let masters = https(
        cp,
        Some(&cp.client_certificate("kapi-admin", &["system:masters"])?),
    )?;
    let (status, body) = get(
        &masters,
        port1,
        "/containerLogs/default/kapi-logs/app?tailLines=2",
        None,
    )
    .await?;
    assert_eq!((status, body.as_str()), (200, "second line\nthird line\n"));
    let (status, body) = get(
        &masters,
        port1,
        "/containerLogs/default/kapi-logs/app?tailLines=x",
        None,
    )
    .await?;
    assert_eq!(status, 400, "{body}");
    let (status, body) = get(&masters, port1, "/containerLogs/default/nope/app", None).await?;
    assert_eq!(status, 404, "{body}");
    let (status, body) = get(&masters, port1, "/containerLogs/default/kapi-logs/nope", None).await?;
    assert_eq!(status, 404, "{body}");
    let (status, body) = get(&masters, port1, "/pods", None).await?;
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(list["items"][0]["metadata"]["name"], "kapi-logs");
    let (status, body) = get(&masters, port1, "/healthz", None).await?;
    assert_eq!((status, body.as_str()), (200, "ok"));
    let (status, body) = get(&masters, port1, "/configz", None).await?;
    assert_eq!(status, 200);
    let configz: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(configz["kubeletconfig"]["port"], i64::from(port1));
    assert_eq!(configz["kubeletconfig"]["authorization"]["mode"], "Webhook");

    // kubectl exec, through the API server (WebSocket to it, SPDY from it to the node, which serves the
    // stream itself: the fake runtime has no streaming server)
    let kubectl = |args: &[&str]| {
        let mut cmd = cp.kubectl();
        cmd.args(["exec", "-n", NS, "kapi-logs", "-c", "app", "--"])
            .args(args);
        tokio::task::spawn_blocking(move || cmd.output())
    };
    let out = kubectl(&["echo", "hi"]).await??;
    println!("[kubelet_api] kubectl exec echo hi: {out:?}");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    let out = kubectl(&["check"]).await??;
    println!("[kubelet_api] kubectl exec check: {out:?}");
    assert_eq!(out.status.code(), Some(3), "the scripted exit code: {out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "checked out\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("checked err\n"), "{stderr}");
    assert!(stderr.contains("command terminated with exit code 3"), "{stderr}");
    let out = kubectl(&["false"]).await??;
    assert_eq!(out.status.code(), Some(1), "{out:?}");

    pods.delete("kapi-logs", &Default::default()).await?;
    fleet.stop(Duration::from_secs(10)).await;
    token.cancel();
    Ok(())
}

/// The value of the `prober_probe_total` sample of `pod`'s `probe_type` probe with `result`, if there is one.
fn probe_count(text: &str, pod: &Pod, probe_type: &str, result: &str) -> Option<u64> {
    let name = pod.metadata.name.as_deref()?;
    let uid = pod.metadata.uid.as_deref()?;
    let series = format!(
        "prober_probe_total{{container=\"app\",namespace=\"{NS}\",pod=\"{name}\",pod_uid=\"{uid}\",\
         probe_type=\"{probe_type}\",result=\"{result}\"}}"
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_metrics_of_a_hollow_node_count_scripted_probes() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    let base = free_port_range(1)?;
    let (cert, key) = cp.kubelet_serving_certificate("hollow-kprobe")?;
    let defaults = KubeletConfig::default();
    let kubelet = KubeletConfig {
        tls_cert_file: Some(cert),
        tls_private_key_file: Some(key),
        authentication: node_agent::config::Authentication {
            client_ca_file: Some(cp.client_ca_file()),
            ..defaults.authentication.clone()
        },
        ..defaults
    };
    let spec = FleetSpec {
        register_qps: 200.0,
        kubelet_port: base,
        kubelet,
        kubelet_api: Some(KubeletApi { registry: None }),
        ..FleetSpec::new(1, "kprobe-{index}", profiles::default_profiles())?
    };
    let pool = ClientPool::new(
        &cp.admin_config().await?,
        PoolSize::for_fleet(1, true, PoolLimits::default()),
    )?;
    let token = CancellationToken::new();
    let fleet = Fleet::start(
        &spec,
        &pool,
        Arc::new(Metrics::unregistered()),
        Arc::new(PodMetrics::new()),
        token.clone(),
    )
    .await?;

    // a pod whose readiness probe passes, one whose liveness probe fails
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let probed = |name: &str, probe: serde_json::Value, script: &str| -> anyhow::Result<Pod> {
        let mut container = json!({"name": "app", "image": "registry.k8s.io/pause:3.10"});
        let (field, value) = probe
            .as_object()
            .and_then(|o| o.iter().next())
            .expect("one probe");
        container[field] = value.clone();
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {"cri-fake.node-agent.io/probe": script}},
            "spec": {"nodeName": "kprobe-0", "containers": [container], "terminationGracePeriodSeconds": 0},
        }))?)
    };
    let ready = probed(
        "kprobe-ready",
        json!({"readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 1}}),
        "http:8080/ready=ok",
    )?;
    let live = probed(
        "kprobe-live",
        json!({"livenessProbe": {"tcpSocket": {"port": 9000}, "periodSeconds": 1, "failureThreshold": 3}}),
        "tcp:9000=fail",
    )?;
    let ready = pods.create(&PostParams::default(), &ready).await?;
    let live = pods.create(&PostParams::default(), &live).await?;

    let anonymous = https(cp, None)?;
    let (status, body) = get(&anonymous, base, "/metrics/probes", None).await?;
    assert_eq!((status, body.as_str()), (401, "Unauthorized"), "anonymous");
    let nobody = service_account_token(&admin, "kprobe-nobody").await?;
    let (status, body) = get(&anonymous, base, "/metrics/probes", Some(&nobody)).await?;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("subresource(s)=[metrics]"), "{body}");
    let scraper = https(
        cp,
        Some(&cp.client_certificate("kprobe-scraper", &["system:masters"])?),
    )?;
    let scrape = || async {
        let (status, text) = get(&scraper, base, "/metrics/probes", None).await?;
        anyhow::ensure!(status == 200, "/metrics/probes: {status} {text}");
        Ok(text)
    };

    // the readiness probe's successes rise; the liveness probe's failures are counted
    let first = wait_for("readiness successes counted", Duration::from_secs(60), || async {
        let text = scrape().await?;
        Ok(probe_count(&text, &ready, "Readiness", "successful").map(|n| (n, text)))
    })
    .await;
    let (first, text) = match first {
        Ok(found) => found,
        Err(e) => anyhow::bail!("{e:#}\n{}", e2e::pod_report(&admin, NS, "kprobe-ready").await),
    };
    println!("[kubelet_api] /metrics/probes:\n{text}");
    assert!(text.contains("# TYPE prober_probe_total counter"), "{text}");
    assert!(
        text.contains(
            "prober_probe_duration_seconds_count{container=\"app\",namespace=\"default\",pod=\"kprobe-ready\",\
             probe_type=\"Readiness\"}"
        ),
        "{text}"
    );
    wait_for("readiness successes rising", Duration::from_secs(30), || async {
        let text = scrape().await?;
        let now = probe_count(&text, &ready, "Readiness", "successful").unwrap_or(0);
        Ok((now > first).then_some(()))
    })
    .await?;
    let failed = wait_for("liveness failures counted", Duration::from_secs(60), || async {
        let text = scrape().await?;
        Ok(probe_count(&text, &live, "Liveness", "failed").filter(|&n| n >= 3))
    })
    .await?;
    println!("[kubelet_api] kprobe-live liveness failures: {failed}");
    let text = scrape().await?;
    assert_eq!(
        probe_count(&text, &live, "Liveness", "successful"),
        None,
        "a probe that never passed has no successful series: {text}"
    );
    // the pod is Ready: the agent acted on the same results
    let readied = pods.get("kprobe-ready").await?;
    let conditions = readied.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "{conditions:?}"
    );

    // the pods go, and so do their series
    for name in ["kprobe-ready", "kprobe-live"] {
        pods.delete(name, &Default::default()).await?;
    }
    wait_for(
        "series of deleted pods dropped",
        Duration::from_secs(60),
        || async {
            let text = scrape().await?;
            Ok((!text.contains("pod=\"kprobe-")).then_some(()))
        },
    )
    .await?;
    fleet.stop(Duration::from_secs(10)).await;
    token.cancel();
    Ok(())
}
