//! Density benchmark: the `hollow` binary (release build) against a fresh real control plane per fleet size.
//!
//! For each size it measures the time until every node is Ready, then over an idle window the fleet process's
//! resident memory per node, its CPU seconds per node-minute, and its API requests per second by kind. Then,
//! unless the size is above `DENSITY_PODS_MAX_NODES`, it creates a Deployment of `DENSITY_PODS_PER_NODE` pods
//! per node, waits for all of them Running and measures the same window again. It prints a table. Bounded:
//! every run has a deadline and all processes are stopped afterwards.
//!
//! ```sh
//! cargo bench -p hollow --bench density     # 1000,5000,10000 nodes, 120 s windows, 10 pods/node up to 1000
//! DENSITY_NODES=1000 DENSITY_IDLE_SECS=60 DENSITY_PODS_PER_NODE=0 cargo bench -p hollow --bench density
//! ```

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// utime+stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').map(|(_, r)| r).context("stat format")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // after the command name: state is field 3 (index 0); utime is field 14, stime 15
    let utime: f64 = fields.get(11).context("utime")?.parse()?;
    let stime: f64 = fields.get(12).context("stime")?.parse()?;
    Ok((utime + stime) / 100.0)
}

fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .context("VmRSS")?
        .parse()?;
    Ok(kb * 1024)
}

/// node_agent_api_requests_total by (verb, resource), summed over codes.
async fn api_requests(port: u16) -> anyhow::Result<BTreeMap<String, f64>> {
    let body = fetch_metrics(port).await?;
    let mut out = BTreeMap::new();
    for line in body
        .lines()
        .filter(|l| l.starts_with("node_agent_api_requests_total{"))
    {
        let (labels, value) = line.rsplit_once(' ').context("metric line")?;
        let get = |key: &str| {
            labels
                .split(&format!("{key}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_owned()
        };
        *out.entry(format!("{} {}", get("verb"), get("resource")))
            .or_insert(0.0) += value.parse::<f64>()?;
    }
    Ok(out)
}

async fn fetch_metrics(port: u16) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    Ok(buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default())
}

struct Row {
    nodes: usize,
    pods: usize,
    ready_secs: f64,
    rss_per_node_kib: f64,
    rss_mib: f64,
    cpu_ms_per_node_minute: f64,
    requests: BTreeMap<String, f64>,
}

/// Nodes listed, and of those Ready.
async fn ready_nodes(api: &Api<Node>) -> anyhow::Result<(usize, usize)> {
    let full = api.list(&ListParams::default()).await?;
    let ready = full
        .items
        .iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count();
    Ok((full.items.len(), ready))
}

/// Fleet process figures over one window.
struct Window {
    rss: u64,
    cpu_ms_per_node_minute: f64,
    requests: BTreeMap<String, f64>,
}

async fn window(pid: u32, port: u16, nodes: usize, idle: Duration) -> anyhow::Result<Window> {
    let cpu0 = cpu_seconds(pid)?;
    let req0 = api_requests(port).await?;
    let t0 = tokio::time::Instant::now();
    tokio::time::sleep(idle).await;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid)? - cpu0;
    let req1 = api_requests(port).await?;
    let requests = req1
        .iter()
        .map(|(k, v)| (k.clone(), (v - req0.get(k).copied().unwrap_or(0.0)) / secs))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    Ok(Window {
        rss: rss_bytes(pid)?,
        cpu_ms_per_node_minute: cpu * 1000.0 / nodes as f64 / (secs / 60.0),
        requests,
    })
}

/// Creates a Deployment of `replicas` pause pods (no resource requests) and waits until all run.
async fn run_pods(client: &kube::Client, replicas: usize) -> anyhow::Result<f64> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;
    let d: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "density", "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "density"}},
            "template": {
                "metadata": {"labels": {"app": "density"}},
                "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]}
            }
        }
    }))?;
    let start = tokio::time::Instant::now();
    Api::<Deployment>::namespaced(client.clone(), "default")
        .create(&Default::default(), &d)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
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
        if running >= replicas {
            return Ok(start.elapsed().as_secs_f64());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{running} of {replicas} pods Running after 1800 s");
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

async fn run_size(nodes: usize, idle: Duration, pods_per_node: usize) -> anyhow::Result<Vec<Row>> {
    let cp = testenv::ControlPlane::start(testenv::Options {
        apiserver_args: vec![
            "--max-requests-inflight=3000".into(),
            "--max-mutating-requests-inflight=1500".into(),
        ],
        // the ReplicaSet controller's client limit (20/s by default) would pace pod creation, not the fleet
        controller_manager_args: vec!["--kube-api-qps=300".into(), "--kube-api-burst=600".into()],
        start_timeout: Duration::from_secs(120),
        ..Default::default()
    })
    .await?;
    let result = measure(&cp, nodes, idle, pods_per_node).await;
    cp.stop().await?;
    result
}

async fn measure(
    cp: &testenv::ControlPlane,
    nodes: usize,
    idle: Duration,
    pods_per_node: usize,
) -> anyhow::Result<Vec<Row>> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_hollow"))
        .args([
            "run",
            "--nodes",
            &nodes.to_string(),
            "--name-template",
            "bench-{index}",
        ])
        .args(["--register-qps", "500"])
        .arg("--kubeconfig")
        .arg(cp.admin_kubeconfig())
        .args(["--metrics-address", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let pid = child.id();
    let out = async {
        let api: Api<Node> = Api::all(cp.admin_client().await?);
        let start = tokio::time::Instant::now();
        let deadline = start + Duration::from_secs(600);
        let mut listed = 0;
        loop {
            // a loaded API server may drop a request now and then: poll again rather than give up
            match ready_nodes(&api).await {
                Ok((registered, ready)) => {
                    listed = registered;
                    if ready >= nodes {
                        break;
                    }
                }
                Err(e) => eprintln!("density: listing nodes failed ({e}); polling again"),
            }
            if tokio::time::Instant::now() > deadline {
                bail!("{nodes} nodes not Ready within 600 s ({listed} registered)");
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let ready_secs = start.elapsed().as_secs_f64();
        // let registration bursts settle before the idle window
        tokio::time::sleep(Duration::from_secs(20)).await;
        let w = window(pid, port, nodes, idle).await?;
        let mut rows = vec![Row {
            nodes,
            pods: 0,
            ready_secs,
            rss_per_node_kib: w.rss as f64 / 1024.0 / nodes as f64,
            rss_mib: w.rss as f64 / 1048576.0,
            cpu_ms_per_node_minute: w.cpu_ms_per_node_minute,
            requests: w.requests,
        }];
        if pods_per_node > 0 {
            let replicas = nodes * pods_per_node;
            eprintln!("density: {nodes} nodes idle measured; starting {replicas} pods ...");
            let pods_secs = run_pods(&cp.admin_client().await?, replicas).await?;
            tokio::time::sleep(Duration::from_secs(20)).await;
            let w = window(pid, port, nodes, idle).await?;
            rows.push(Row {
                nodes,
                pods: replicas,
                ready_secs: pods_secs,
                rss_per_node_kib: w.rss as f64 / 1024.0 / nodes as f64,
                rss_mib: w.rss as f64 / 1048576.0,
                cpu_ms_per_node_minute: w.cpu_ms_per_node_minute,
                requests: w.requests,
            });
        }
        Ok(rows)
    }
    .await;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid)?),
        nix::sys::signal::SIGTERM,
    );
    let _ = child.wait();
    out
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // `cargo bench` passes --bench. `cargo test --all-targets` runs bench targets too, without it: a
    // benchmark of minutes has no place in the test suite, so that run only says how to start it.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("density: skipped (not run by cargo bench); run `cargo bench -p hollow --bench density`");
        return Ok(());
    }
    let sizes: Vec<usize> = env_or("DENSITY_NODES", "1000,5000,10000")
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()
        .context("DENSITY_NODES: comma-separated node counts")?;
    let idle = Duration::from_secs(env_or("DENSITY_IDLE_SECS", "120").parse()?);
    let pods_per_node: usize = env_or("DENSITY_PODS_PER_NODE", "10").parse()?;
    let pods_max_nodes: usize = env_or("DENSITY_PODS_MAX_NODES", "1000").parse()?;
    let mut rows = Vec::new();
    for n in sizes {
        eprintln!("density: {n} nodes ...");
        let ppn = if n <= pods_max_nodes { pods_per_node } else { 0 };
        let measured = run_size(n, idle, ppn)
            .await
            .with_context(|| format!("{n} nodes"))?;
        for row in measured {
            eprintln!(
                "density: {n} nodes, {} pods: Ready/Running after {:.1}s, {:.1} KiB/node, {:.3} ms CPU/node-minute",
                row.pods, row.ready_secs, row.rss_per_node_kib, row.cpu_ms_per_node_minute
            );
            rows.push(row);
        }
    }
    println!(
        "\n| nodes | pods | all Ready (nodes) / Running (pods) after | fleet RSS | RSS per node | CPU per node-minute | API requests/s (steady) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---|");
    for r in &rows {
        let reqs: Vec<String> = r.requests.iter().map(|(k, v)| format!("{k} {v:.1}")).collect();
        println!(
            "| {} | {} | {:.1} s | {:.0} MiB | {:.1} KiB | {:.2} ms | {} |",
            r.nodes,
            r.pods,
            r.ready_secs,
            r.rss_mib,
            r.rss_per_node_kib,
            r.cpu_ms_per_node_minute,
            reqs.join(", ")
        );
    }
    Ok(())
}
