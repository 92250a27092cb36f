//! The Helm chart at scale: `CHART_PROCESSES` fleet processes × `CHART_NODES_PER_PROCESS` hollow nodes (10 ×
//! 1,000 by default) installed with `helm install charts/hollow` against one control plane, the fleet's pods run
//! by the real-mode node-agent on containerd (the chart test's real node, `tests/real_node/harness.rs`, with
//! its development image of this build's `hollow` pushed to a loopback registry), and then the pod start-up SLO
//! over all of them: `hollow slo` creating `CHART_PODS_PER_NODE` pods per hollow node at `CHART_POD_RATE` a
//! second, tolerating the nodes' taint, with `--fleet` naming every process's metrics endpoint so that its
//! node-side stages are merged over the processes.
//!
//! It prints the time until every node is Ready and every pod Running; each process's resident memory and CPU
//! (read from /proc of the fleet containers' processes on the real node) over an idle window, during the load
//! and over a window with the pods running; RSS per node and per running pod; the API server's request rate (its
//! own `apiserver_request_total`), the lease renewals it answered and its and etcd's CPU; and the SLO report's
//! table. With `CHART_COMPARE_ONE=1` it then uninstalls the release and does the same with one process holding
//! all the nodes, and prints both rows side by side.
//!
//! The control plane runs its controller-manager and scheduler at `--kube-api-qps=300` and the API server with
//! room for 3,000 requests in flight, as the density benchmark's. The node needs root and a pod subnet of its
//! own beside other real-node runs (`NA_CRI_SUBNET`, 100.64.0.0/10 by default, /24s per node). Not part of the
//! test suite:
//!
//! ```sh
//! cargo bench -p e2e --bench chart_scale                                   # 10 × 1,000 nodes, 2 pods per node
//! CHART_PROCESSES=3 CHART_NODES_PER_PROCESS=200 cargo bench -p e2e --bench chart_scale
//! CHART_COMPARE_ONE=1 cargo bench -p e2e --bench chart_scale               # and 1 × 10,000 after it
//! HOLLOW_BIN=target/release/hollow cargo bench -p e2e --bench chart_scale  # pack another build of the fleet
//! ```
//!
//! More settings: `CHART_POD_RATE` (50 pods/s), `CHART_REGISTER_QPS` (each process's registrations per second,
//! 50), `CHART_READY_SECS` (how long the nodes may take to be Ready, 1200), `CHART_WINDOW_SECS` (each measuring
//! window, 60), `CHART_REPORT_DIR` (where the SLO reports go; a directory under the temp dir by default).

/// The containerd the node runs on (Debian's 1.6), as the chart test's.
const CONTAINERD: &str = "1.6";

/// The cluster's pod range (the controller-manager's `--cluster-cidr`, and the real node's subnet) unless
/// `NA_CRI_SUBNET` says otherwise: a /10 of /24s holds 16,384 nodes. The hollow nodes' pods never use it, but a
/// node without a pod CIDR of its own has no pod network and stays NotReady, as a kubelet's would.
const DEFAULT_SUBNET: &str = "100.64.0.0/10";
/// Each node's pod CIDR, as the kubelet's usual /24.
const NODE_CIDR_MASK: u32 = 24;

/// How many nodes the cluster range gives a pod CIDR: the real node's and the hollow nodes'.
fn node_cidrs() -> anyhow::Result<usize> {
    let subnet = std::env::var("NA_CRI_SUBNET").unwrap_or_else(|_| DEFAULT_SUBNET.into());
    let prefix: u32 = subnet
        .split_once('/')
        .and_then(|(_, p)| p.parse().ok())
        .with_context(|| format!("NA_CRI_SUBNET {subnet:?}: not an IPv4 CIDR"))?;
    // the controller-manager's allocator refuses more than 16 bits between the two masks
    anyhow::ensure!(
        (NODE_CIDR_MASK - 16..=NODE_CIDR_MASK).contains(&prefix),
        "NA_CRI_SUBNET {subnet}: the prefix must be /{} to /{NODE_CIDR_MASK} for /{NODE_CIDR_MASK} node CIDRs",
        NODE_CIDR_MASK - 16
    );
    Ok(1 << (NODE_CIDR_MASK - prefix))
}

#[allow(dead_code)]
#[path = "../tests/real_node/harness.rs"]
mod harness;

#[path = "chart_scale/figures.rs"]
mod figures;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::chart::{Image, TAINT, fleet_nodes, free_ports, helm, helm_install, push_image, run};
use e2e::node_is_ready;
use figures::{ControlPlanePids, Window};
use harness::{LoopbackRegistry, NodeOptions, RealNode};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::Api;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(text) => text
            .trim()
            .parse()
            .map_err(|e| anyhow::anyhow!("{name}={text:?}: {e}")),
        Err(_) => Ok(default),
    }
}

/// The run's settings, from the environment.
struct Settings {
    processes: usize,
    nodes_per_process: usize,
    pods_per_node: usize,
    /// Pods created per second by `hollow slo`.
    pod_rate: f64,
    /// Each process's node registrations per second (the chart's `fleet.registerQps`).
    register_qps: u32,
    /// How long the fleet may take until every node is Ready.
    ready_limit: Duration,
    /// Length of the idle window and of the window with pods.
    window: Duration,
    compare_one: bool,
}

impl Settings {
    fn from_env() -> anyhow::Result<Self> {
        let s = Settings {
            processes: env_or("CHART_PROCESSES", 10)?,
            nodes_per_process: env_or("CHART_NODES_PER_PROCESS", 1000)?,
            pods_per_node: env_or("CHART_PODS_PER_NODE", 2)?,
            pod_rate: env_or("CHART_POD_RATE", 50.0)?,
            register_qps: env_or("CHART_REGISTER_QPS", 50)?,
            ready_limit: Duration::from_secs(env_or("CHART_READY_SECS", 1200)?),
            window: Duration::from_secs(env_or("CHART_WINDOW_SECS", 60)?),
            compare_one: env_or("CHART_COMPARE_ONE", 0u8)? == 1,
        };
        anyhow::ensure!(
            s.processes > 0 && s.nodes_per_process > 0,
            "CHART_PROCESSES and CHART_NODES_PER_PROCESS: at least 1"
        );
        anyhow::ensure!(s.pod_rate > 0.0, "CHART_POD_RATE: above 0");
        // the real node takes one CIDR too
        let cidrs = node_cidrs()?;
        anyhow::ensure!(
            s.processes * s.nodes_per_process < cidrs,
            "{} × {} nodes: the controller-manager has {cidrs} pod CIDRs (/{NODE_CIDR_MASK}s of the cluster range), \
             one of them the real node's; a node without one stays NotReady",
            s.processes,
            s.nodes_per_process
        );
        Ok(s)
    }
}

/// One release measured.
struct Row {
    processes: usize,
    nodes: usize,
    pods: usize,
    ready_secs: f64,
    /// First pod created → last pod seen Running (the SLO run's own records), and how many ran.
    pods_running: Option<(f64, usize)>,
    idle: Window,
    load: Window,
    with_pods: Option<Window>,
    peak_rss: Vec<u64>,
    /// `hollow slo`'s report (its table), as it printed it.
    slo_report: String,
}

impl Row {
    fn label(&self) -> String {
        format!("{} × {}", self.processes, self.nodes / self.processes)
    }
}

/// The chart's values for a release of `processes` × `nodes_per_process` on the real node's host network.
fn values(
    image: &Image,
    cp: &testenv::ControlPlane,
    s: &Settings,
    processes: usize,
    nodes_per_process: usize,
    metrics_port: u16,
) -> Vec<String> {
    vec![
        format!("image.repository={}", image.repository),
        format!("image.tag={}", image.tag),
        format!("replicas={processes}"),
        format!("fleet.nodesPerProcess={nodes_per_process}"),
        format!("fleet.registerQps={}", s.register_qps),
        "fleet.deleteNodesOnExit=true".into(),
        format!("fleet.metricsPort={metrics_port}"),
        "hostNetwork=true".into(),
        format!("apiServer.url={}", cp.server()),
        // the chart's sized requests (100m CPU + 1m per 10 nodes) of ten processes would take every CPU the
        // 2-core real node has: request little, keep the chart's memory limit (128Mi + 1Mi per node)
        "resources.requests.cpu=20m".into(),
        "resources.requests.memory=64Mi".into(),
        format!("resources.limits.memory={}Mi", 128 + nodes_per_process),
    ]
}

/// Polls the release's nodes (the API server's cache, every 10 s) until `expected` are Ready; the seconds since
/// `start`.
async fn wait_all_ready(
    nodes: &Api<Node>,
    release: &str,
    expected: usize,
    start: Instant,
    limit: Duration,
) -> anyhow::Result<f64> {
    let mut last = (usize::MAX, usize::MAX);
    loop {
        // a loaded API server may drop a request now and then: poll again rather than give up
        match fleet_nodes(nodes, release, true).await {
            Ok(list) => {
                let ready = list.iter().filter(|n| node_is_ready(n)).count();
                if (list.len(), ready) != last {
                    last = (list.len(), ready);
                    println!(
                        "[chart_scale] {release}: {} nodes registered, {ready} Ready after {:.0} s",
                        list.len(),
                        start.elapsed().as_secs_f64()
                    );
                }
                if ready >= expected {
                    return Ok(start.elapsed().as_secs_f64());
                }
            }
            Err(e) => println!("[chart_scale] listing nodes failed ({e}); polling again"),
        }
        anyhow::ensure!(
            start.elapsed() < limit,
            "{expected} nodes of {release} not Ready within {limit:?} (last seen: {} registered, {} Ready)",
            last.0,
            last.1
        );
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}

/// Runs `hollow slo` over the release's nodes and every process's endpoint, keeping the pods; its report's
/// table.
#[allow(clippy::too_many_arguments)]
fn slo(
    cp: &testenv::ControlPlane,
    release: &str,
    namespace: &str,
    pods: usize,
    rate: f64,
    metrics_port: u16,
    processes: usize,
    report: &Path,
) -> anyhow::Result<String> {
    let mut cmd = Command::new(e2e::hollow_binary()?);
    cmd.arg("slo")
        .arg("--kubeconfig")
        .arg(cp.admin_kubeconfig())
        .args(["--count", &pods.to_string(), "--rate", &rate.to_string()])
        .args(["--namespace", namespace])
        .args(["--toleration", &format!("{TAINT}=true:NoSchedule")])
        .args([
            "--node-selector",
            &format!("hollow.node-agent.io/fleet={release}"),
        ])
        .args(["--client-qps", &(rate * 2.0).max(100.0).ceil().to_string()])
        .args(["--wait", "15m", "--keep"])
        .arg("--report")
        .arg(report)
        .env("RUST_LOG", "info");
    for i in 0..processes {
        cmd.args([
            "--fleet",
            &format!("http://127.0.0.1:{}", metrics_port as usize + i),
        ]);
    }
    let out = cmd.output().context("running hollow slo")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    // 3: the SLO was not met — a result to report, not a failure of the run
    anyhow::ensure!(
        out.status.success() || out.status.code() == Some(3),
        "hollow slo failed ({}): {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// From the SLO report's `pods.csv`: the seconds from the first pod created to the last seen Running, and how
/// many were seen Running.
fn pods_running(report: &Path) -> anyhow::Result<(f64, usize)> {
    use k8s_openapi::jiff::Timestamp;
    let text = std::fs::read_to_string(report.join("pods.csv"))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().context("pods.csv is empty")?.split(',').collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .with_context(|| format!("pods.csv has no {name}"))
    };
    let (created, running) = (column("created")?, column("running_seen")?);
    let (mut first, mut last, mut count) = (None::<Timestamp>, None::<Timestamp>, 0);
    for line in lines {
        let fields: Vec<&str> = line.split(',').collect();
        if let Some(t) = fields.get(created).and_then(|t| t.parse::<Timestamp>().ok()) {
            first = Some(first.map_or(t, |f| f.min(t)));
        }
        if let Some(t) = fields.get(running).and_then(|t| t.parse::<Timestamp>().ok()) {
            last = Some(last.map_or(t, |l| l.max(t)));
            count += 1;
        }
    }
    let (first, last) = (first.context("no pod created")?, last.context("no pod Running")?);
    Ok((last.duration_since(first).as_secs_f64(), count))
}

/// Installs the release, waits for its nodes, measures idle, runs the SLO load and measures with the pods.
async fn measure(
    node: &RealNode,
    image: &Image,
    s: &Settings,
    release: &str,
    processes: usize,
    nodes_per_process: usize,
    report_dir: &Path,
) -> anyhow::Result<Row> {
    let cp = node.cp;
    let client = cp.admin_client().await?;
    let nodes = processes * nodes_per_process;
    let ns = format!("hollow-{release}");
    let metrics_port = free_ports(u16::try_from(processes)?)?;
    println!("[chart_scale] {release}: helm install, {processes} processes × {nodes_per_process} nodes ...");
    let start = Instant::now();
    let values = values(image, cp, s, processes, nodes_per_process, metrics_port);
    tokio::task::block_in_place(|| helm_install(cp, release, &ns, &values, "10m"))?;
    let ready_secs = wait_all_ready(&Api::all(client.clone()), release, nodes, start, s.ready_limit).await?;
    println!("[chart_scale] {release}: all {nodes} nodes Ready {ready_secs:.1} s after helm install began");
    let fleet = figures::fleet_pids(&node.cgroup_root, release, processes)?;
    let cp_pids = ControlPlanePids::of(cp)?;

    // let the registration burst settle, then the idle window
    tokio::time::sleep(Duration::from_secs(20)).await;
    let a = figures::sample(&client, &fleet, &cp_pids).await?;
    tokio::time::sleep(s.window).await;
    let b = figures::sample(&client, &fleet, &cp_pids).await?;
    let idle = Window::between(&a, &b);
    println!(
        "[chart_scale] {release}: idle {:.1} KiB per node, {:.2} ms CPU per node-minute, API server {:.0} requests/s",
        idle.total_rss() as f64 / 1024.0 / nodes as f64,
        idle.cpu_ms_per_node_minute(nodes),
        idle.requests_per_sec()
    );

    let pods = nodes * s.pods_per_node;
    let (load, with_pods, pods_running, slo_report) = if pods > 0 {
        println!(
            "[chart_scale] {release}: hollow slo, {pods} pods at {}/s ...",
            s.pod_rate
        );
        let report = report_dir.join(format!("slo-{release}"));
        let slo_ns = format!("slo-{release}");
        let text = tokio::task::block_in_place(|| {
            slo(
                cp,
                release,
                &slo_ns,
                pods,
                s.pod_rate,
                metrics_port,
                processes,
                &report,
            )
        })?;
        let c = figures::sample(&client, &fleet, &cp_pids).await?;
        let load = Window::between(&b, &c);
        let running = pods_running(&report)
            .inspect_err(|e| println!("[chart_scale] {}: {e:#}", report.display()))
            .ok();
        tokio::time::sleep(Duration::from_secs(20)).await;
        let d = figures::sample(&client, &fleet, &cp_pids).await?;
        tokio::time::sleep(s.window).await;
        let e = figures::sample(&client, &fleet, &cp_pids).await?;
        (load, Some(Window::between(&d, &e)), running, text)
    } else {
        let c = figures::sample(&client, &fleet, &cp_pids).await?;
        (Window::between(&b, &c), None, None, String::new())
    };
    Ok(Row {
        processes,
        nodes,
        pods,
        ready_secs,
        pods_running,
        idle,
        load,
        with_pods,
        peak_rss: figures::peak_rss(&fleet)?,
        slo_report,
    })
}

/// Removes the release and its SLO pods, and waits until its nodes are gone (before the next release).
async fn remove(cp: &testenv::ControlPlane, release: &str) -> anyhow::Result<()> {
    let client = cp.admin_client().await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let slo_ns = format!("slo-{release}");
    let _ = namespaces.delete(&slo_ns, &Default::default()).await;
    e2e::wait_for("the SLO namespace gone", Duration::from_secs(900), || async {
        Ok(namespaces.get_opt(&slo_ns).await?.is_none().then_some(()))
    })
    .await?;
    tokio::task::block_in_place(|| {
        run(helm(Some(cp))?.args([
            "uninstall",
            release,
            "--namespace",
            &format!("hollow-{release}"),
            "--wait",
            "--timeout",
            "15m",
        ]))
    })?;
    let nodes: Api<Node> = Api::all(client);
    e2e::wait_for(
        "the release's nodes deleted",
        Duration::from_secs(900),
        || async { Ok(fleet_nodes(&nodes, release, true).await?.is_empty().then_some(())) },
    )
    .await
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1_048_576.0
}

fn print_row(r: &Row) {
    let per_process: Vec<String> = r.idle.rss.iter().map(|b| format!("{:.0}", mib(*b))).collect();
    println!(
        "\n### {} nodes in {} process(es), {} pods\n",
        r.nodes, r.processes, r.pods
    );
    println!(
        "| process | nodes | RSS idle | RSS with pods | peak RSS | CPU idle | CPU during the load | CPU with pods |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let per = r.nodes / r.processes;
    for i in 0..r.processes {
        let with = r.with_pods.as_ref();
        println!(
            "| {i} | {per} | {:.1} MiB | {} | {:.1} MiB | {:.1} m | {:.1} m | {} |",
            mib(r.idle.rss[i]),
            with.map_or("—".into(), |w| format!("{:.1} MiB", mib(w.rss[i]))),
            mib(r.peak_rss[i]),
            r.idle.fleet_cores[i] * 1000.0,
            r.load.fleet_cores[i] * 1000.0,
            with.map_or("—".into(), |w| format!("{:.1} m", w.fleet_cores[i] * 1000.0)),
        );
    }
    println!("\nidle RSS by process (MiB): {}", per_process.join(", "));
    for (name, w) in [
        ("idle", Some(&r.idle)),
        ("during the load", Some(&r.load)),
        ("with pods", r.with_pods.as_ref()),
    ] {
        let Some(w) = w else { continue };
        println!(
            "API server {name} ({:.0} s): {:.0} requests/s, {:.1} lease updates/s, kube-apiserver {:.2} cores, etcd {:.2} \
             cores, fleet {:.2} cores, stolen {:.1} %; most: {}",
            w.secs,
            w.requests_per_sec(),
            w.lease_updates_per_sec(),
            w.apiserver_cores,
            w.etcd_cores,
            w.fleet_cores(),
            w.stolen_share * 100.0,
            w.top_requests(6)
        );
    }
    if !r.slo_report.is_empty() {
        println!("\nhollow slo:\n```\n{}```", r.slo_report);
    }
}

fn print_summary(rows: &[Row]) {
    println!(
        "\n| processes × nodes | pods | nodes Ready after | pods Running after | fleet RSS idle / with pods | RSS per node \
         | RSS per running pod | CPU per node-minute idle / with pods | API server requests/s idle / load / with pods \
         | lease updates/s | kube-apiserver cores idle / load | etcd cores idle / load |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let with = r.with_pods.as_ref();
        let per_pod = with.filter(|_| r.pods > 0).map_or("—".into(), |w| {
            format!(
                "{:.1} KiB",
                (w.total_rss() as f64 - r.idle.total_rss() as f64) / 1024.0 / r.pods as f64
            )
        });
        println!(
            "| {} | {} | {:.1} s | {} | {:.0} / {} MiB | {:.1} KiB | {per_pod} | {:.2} / {} ms | {:.0} / {:.0} / {} | {:.1} \
             | {:.2} / {:.2} | {:.2} / {:.2} |",
            r.label(),
            r.pods,
            r.ready_secs,
            r.pods_running
                .map_or("—".into(), |(secs, n)| format!("{secs:.1} s ({n} Running)")),
            mib(r.idle.total_rss()),
            with.map_or("—".into(), |w| format!("{:.0}", mib(w.total_rss()))),
            r.idle.total_rss() as f64 / 1024.0 / r.nodes as f64,
            r.idle.cpu_ms_per_node_minute(r.nodes),
            with.map_or("—".into(), |w| format!(
                "{:.2}",
                w.cpu_ms_per_node_minute(r.nodes)
            )),
            r.idle.requests_per_sec(),
            r.load.requests_per_sec(),
            with.map_or("—".into(), |w| format!("{:.0}", w.requests_per_sec())),
            r.idle.lease_updates_per_sec(),
            r.idle.apiserver_cores,
            r.load.apiserver_cores,
            r.idle.etcd_cores,
            r.load.etcd_cores,
        );
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs bench targets without it
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!(
            "chart_scale: skipped (not run by cargo bench); run `cargo bench -p e2e --bench chart_scale`"
        );
        return Ok(());
    }
    e2e::init_logging();
    let s = Settings::from_env()?;
    let options = NodeOptions {
        apiserver_args: vec![
            "--max-requests-inflight=3000".into(),
            "--max-mutating-requests-inflight=1500".into(),
        ],
        controller_manager_args: vec![
            "--kube-api-qps=300".into(),
            "--kube-api-burst=600".into(),
            format!("--node-cidr-mask-size={NODE_CIDR_MASK}"),
        ],
        scheduler_args: vec!["--kube-api-qps=300".into(), "--kube-api-burst=600".into()],
        default_subnet: Some(DEFAULT_SUBNET),
        ..Default::default()
    };
    let node = RealNode::get_with(&options)
        .await?
        .context("the real node is skipped (NODE_AGENT_SKIP_REAL_NODE): nothing to run the fleet on")?;
    let registry = LoopbackRegistry::start(node, "chart-scale", None)?;
    let image = push_image(
        &registry.addr,
        &node.containerd_dir.with_file_name("image-chart-scale"),
    )?;
    // kept after the run (the node's own directory is removed with it)
    let report_dir = match std::env::var_os("CHART_REPORT_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::temp_dir().join(format!("chart-scale-{}", std::process::id())),
    };
    std::fs::create_dir_all(&report_dir)?;

    let mut rows = vec![
        measure(
            node,
            &image,
            &s,
            "fleet",
            s.processes,
            s.nodes_per_process,
            &report_dir,
        )
        .await?,
    ];
    print_row(&rows[0]);
    if s.compare_one && s.processes > 1 {
        println!("[chart_scale] removing the release before one process with all the nodes ...");
        remove(node.cp, "fleet").await?;
        let one = measure(
            node,
            &image,
            &s,
            "one",
            1,
            s.processes * s.nodes_per_process,
            &report_dir,
        )
        .await?;
        print_row(&one);
        rows.push(one);
    }
    print_summary(&rows);
    println!("\nSLO reports: {}", report_dir.display());
    Ok(())
}
