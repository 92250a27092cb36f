//! Pods on the hollow fleet against the real control plane: a Deployment of 1,500 pods (`HOLLOW_PODS`; the
//! benchmark's figure is 5,000) scheduled by the real scheduler reaches Running, with per-stage start-up percentiles from `/metrics` and from the raw HDR endpoint
//! agreeing; and watch mode `shared` gives the same outcome as `per-node` with one API watch instead of one per
//! node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, list_paged, wait_for};
use hollow::client_pool::{ClientPool, PoolLimits, PoolSize};
use hollow::fleet::{Fleet, FleetSpec, WatchMode};
use hollow::{profiles, server};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, PostParams};
use node_agent::Metrics;
use node_agent::pods::{PodMetrics, Stage};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The tests here count API watches and share one API server: run them one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This binary's control plane: the controller-manager and scheduler may write fast enough for thousands of
/// pods (their default client QPS would make a 5,000-pod rollout take minutes of throttling).
async fn control_plane() -> anyhow::Result<&'static testenv::ControlPlane> {
    let fast = vec![
        "--kube-api-qps=500".to_owned(),
        "--kube-api-burst=1000".to_owned(),
    ];
    testenv::shared_with(testenv::Options {
        controller_manager_args: [fast.clone(), vec!["--concurrent-replicaset-syncs=10".into()]].concat(),
        scheduler_args: fast,
        ..Default::default()
    })
    .await
}

fn spec(prefix: &str, nodes: usize, watch_mode: WatchMode) -> anyhow::Result<FleetSpec> {
    let yaml = format!(
        "profiles:\n  - name: {prefix}\n    weight: 1\n    capacity: {{cpu: \"64\", memory: 256Gi, pods: \"110\"}}\n    labels: {{fleet: {prefix}}}\n"
    );
    Ok(FleetSpec {
        register_qps: 200.0,
        runtime_profile: Arc::new(cri_fake::Profile::from_pairs([(
            "pull-duration",
            "uniform(20ms,200ms)",
        )])?),
        watch_mode,
        ..FleetSpec::new(
            nodes,
            format!("{prefix}-{{index}}"),
            profiles::parse(&yaml, "test")?,
        )?
    })
}

async fn deploy(client: &kube::Client, name: &str, fleet: &str, replicas: i32) -> anyhow::Result<()> {
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"fleet": fleet},
                    "containers": [{"name": "web", "image": format!("registry.test/{name}:1"),
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
                },
            },
        },
    }))?;
    Api::<Deployment>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &d)
        .await?;
    Ok(())
}

async fn running(client: &kube::Client, app: &str) -> anyhow::Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let list = list_paged(&pods, &ListParams::default().labels(&format!("app={app}"))).await?;
    Ok(list
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect())
}

async fn get(port: u16, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    buf.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .context("HTTP response")
}

/// Cumulative buckets (upper bound seconds, count) of one stage of the Prometheus stage histogram.
fn prometheus_buckets(text: &str, stage: &str) -> Vec<(f64, u64)> {
    let prefix = "node_agent_pod_start_stage_duration_seconds_bucket{";
    let mut out = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(prefix)) {
        if !line.contains(&format!("stage=\"{stage}\"")) {
            continue;
        }
        let le = line
            .split("le=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("");
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::NAN)
        };
        let count = line
            .rsplit(' ')
            .next()
            .and_then(|c| c.parse::<f64>().ok())
            .unwrap_or(0.0) as u64;
        out.push((le, count));
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// The (lower, upper] bucket bounds holding quantile `q`.
fn bucket_of(buckets: &[(f64, u64)], q: f64) -> (f64, f64) {
    let total = buckets.last().map_or(0, |b| b.1);
    let rank = ((q * total as f64).ceil() as u64).max(1);
    let mut lower = 0.0;
    for (le, count) in buckets {
        if *count >= rank {
            return (lower, *le);
        }
        lower = *le;
    }
    (lower, f64::INFINITY)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_of_thousands_runs_and_both_histogram_views_agree() -> anyhow::Result<()> {
    init_logging();
    let _serial = SERIAL.lock().await;
    let pods_wanted: i32 = std::env::var("HOLLOW_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    let nodes = usize::try_from(pods_wanted)?.div_ceil(50).max(1);
    let cp = control_plane().await?;
    let config = cp.admin_config().await?;
    let admin = cp.admin_client().await?;
    let pool = ClientPool::new(&config, PoolSize::for_fleet(nodes, true, PoolLimits::default()))?;
    let mut registry = Registry::default();
    let pod_metrics = Arc::new(PodMetrics::new());
    pod_metrics.register(&mut registry);
    let token = CancellationToken::new();
    let (addr, _server) = server::serve(
        "127.0.0.1:0".parse()?,
        registry,
        pod_metrics.clone(),
        token.clone(),
    )
    .await?;
    let fleet = Fleet::start(
        &spec("dense", nodes, WatchMode::PerNode)?,
        &pool,
        Arc::new(Metrics::unregistered()),
        pod_metrics.clone(),
        token.clone(),
    )
    .await?;
    wait_for("the fleet registered", Duration::from_secs(120), || async {
        Ok((fleet.view().registered() == nodes).then_some(()))
    })
    .await?;
    let started = tokio::time::Instant::now();
    deploy(&admin, "dense", "dense", pods_wanted).await?;
    let wanted = usize::try_from(pods_wanted)?;
    let run = wait_for("every pod Running", Duration::from_secs(1500), || async {
        let r = running(&admin, "dense").await?;
        Ok((r.len() == wanted).then_some(r))
    })
    .await?;
    let elapsed = started.elapsed();
    let on_fleet = run
        .iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| n.starts_with("dense-"))
        })
        .count();
    assert_eq!(on_fleet, wanted, "every pod runs on a hollow node");

    let text = get(addr.port(), "/metrics").await?;
    let hdr: BTreeMap<String, String> = serde_json::from_str(&get(addr.port(), "/histograms").await?)?;
    println!(
        "{wanted} pods Running on {nodes} hollow nodes {:.1}s after the Deployment was created",
        elapsed.as_secs_f64()
    );
    println!("| stage | count | p50 ms | p90 ms | p99 ms | /metrics bucket of p50, p90, p99 (s) |");
    for stage in Stage::ALL.iter().filter(|s| **s != Stage::WatchObserved) {
        let name = stage.name();
        let h = server::decode_histogram(hdr.get(name).with_context(|| format!("{name} in /histograms"))?)
            .map_err(anyhow::Error::msg)?;
        let buckets = prometheus_buckets(&text, name);
        let prom_count = buckets.last().map_or(0, |b| b.1);
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        let bounds: Vec<(f64, f64)> = [0.5, 0.9, 0.99].iter().map(|q| bucket_of(&buckets, *q)).collect();
        println!(
            "| {name} | {} | {:.1} | {:.1} | {:.1} | {:?} |",
            h.len(),
            ms(0.5),
            ms(0.9),
            ms(0.99),
            bounds
        );
        assert_eq!(
            h.len(),
            prom_count,
            "{name}: both views count the same observations"
        );
        assert!(
            h.len() >= wanted as u64,
            "{name}: every pod recorded ({} < {wanted})",
            h.len()
        );
        for (q, (lo, hi)) in [0.5, 0.9, 0.99].iter().zip(&bounds) {
            let v = ms(*q) / 1000.0;
            // HDR keeps 3 significant digits; allow that much at the bucket edges
            assert!(
                v >= lo * 0.999 && v <= hi * 1.001,
                "{name} p{}: HDR {v}s outside /metrics bucket ({lo}, {hi}]",
                q * 100.0
            );
        }
    }
    fleet.stop(Duration::from_secs(10)).await;
    token.cancel();
    Ok(())
}

/// Pod watches the API server holds open right now.
async fn pod_watches(client: &kube::Client) -> anyhow::Result<u64> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    Ok(text
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_longrunning_requests{")
                && l.contains("resource=\"pods\"")
                && l.contains("verb=\"WATCH\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_watch_mode_runs_the_same_pods_with_one_watch() -> anyhow::Result<()> {
    init_logging();
    let _serial = SERIAL.lock().await;
    let cp = control_plane().await?;
    let config = cp.admin_config().await?;
    let admin = cp.admin_client().await?;
    let mut outcomes = Vec::new();
    for (prefix, mode) in [("pernode", WatchMode::PerNode), ("shared", WatchMode::Shared)] {
        let nodes = 20;
        let before = pod_watches(&admin).await?;
        let token = CancellationToken::new();
        let fleet = Fleet::start(
            &spec(prefix, nodes, mode)?,
            &ClientPool::new(
                &config,
                PoolSize::for_fleet(nodes, mode == WatchMode::PerNode, PoolLimits::default()),
            )?,
            Arc::new(Metrics::unregistered()),
            Arc::new(PodMetrics::new()),
            token.clone(),
        )
        .await?;
        wait_for("the fleet registered", Duration::from_secs(60), || async {
            Ok((fleet.view().registered() == nodes).then_some(()))
        })
        .await?;
        let watches = wait_for("the fleet's watches open", Duration::from_secs(30), || async {
            let now = pod_watches(&admin).await?.saturating_sub(before);
            let expected = if mode == WatchMode::Shared {
                1
            } else {
                nodes as u64
            };
            Ok((now >= expected).then_some(now))
        })
        .await?;
        deploy(&admin, prefix, prefix, 100).await?;
        let run = wait_for("100 pods Running", Duration::from_secs(120), || async {
            let r = running(&admin, prefix).await?;
            Ok((r.len() == 100).then_some(r))
        })
        .await?;
        let with_ip = run
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some())
            .count();
        println!(
            "watch mode {mode:?}: {nodes} nodes opened {watches} pod watches; 100/100 pods Running, {with_ip} with an IP"
        );
        outcomes.push((mode, watches, run.len(), with_ip));
        fleet.stop(Duration::from_secs(10)).await;
    }
    let (per_node, shared) = (&outcomes[0], &outcomes[1]);
    assert_eq!(per_node.1, 20, "per-node: one watch per node");
    assert_eq!(shared.1, 1, "shared: one watch for the fleet");
    assert_eq!(
        (per_node.2, per_node.3),
        (shared.2, shared.3),
        "same outcome in both modes"
    );
    Ok(())
}
