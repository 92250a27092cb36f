//! Density benchmark: the `hollow` binary (release build) and KWOK side by side, each against a fresh real
//! control plane of the same build, per fleet size.
//!
//! For each size and fleet it measures the time until every node is Ready, then over an idle window the fleet
//! process's resident memory per node, its CPU per node-minute and (hollow) its API requests per second by
//! kind. Then, unless the size is above `DENSITY_PODS_MAX_NODES`, it creates `DENSITY_PODS_PER_NODE` pods per
//! node bound straight to the nodes (`spec.nodeName`, the same pods for both fleets), waits for all of them
//! Running and measures the same window again. It prints a table per fleet and the ratio hollow/KWOK of each
//! figure, and each window's CPU split into the fleet's own and the kernel's beside the machine's stolen share,
//! and per lease update the API server answered in the window (its own count: the same footing for both fleets).
//! KWOK (`hack/build-kwok.sh`, a pinned release from the Go module proxy) is built on the first run.
//! Bounded: every wait has a deadline and all processes are stopped afterwards.
//!
//! `DENSITY_KINDS` adds hollow fleets of other nodes, each measured the same way beside the plain one: `dra`
//! nodes each with a DRA driver publishing a ResourceSlice of 8 devices, their pods each with a claim from a
//! ResourceClaimTemplate allocated by the real scheduler; `pvc` nodes each with a CSI driver, their pods each with
//! a PersistentVolumeClaim provisioned by the real external-provisioner (the e2e mock CSI driver's controller)
//! and attached by the real external-attacher. It prints each figure beside the plain fleet's and the ratio; KWOK
//! has no DRA or CSI node side, so those kinds run for hollow alone.
//!
//! ```sh
//! cargo bench -p hollow --bench density     # 1000,5000,10000 nodes, 120 s windows, 10 pods/node up to 1000
//! DENSITY_NODES=1000 DENSITY_IDLE_SECS=60 DENSITY_PODS_PER_NODE=0 cargo bench -p hollow --bench density
//! DENSITY_FLEETS=hollow cargo bench -p hollow --bench density   # without KWOK
//! DENSITY_HOLLOW_BIN=/path/to/hollow cargo bench ...   # measure another build of the fleet binary
//! DENSITY_READY_SECS=1200 cargo bench ...   # how long a fleet may take until all its nodes are Ready (600)
//! DENSITY_HOLLOW_ARGS="--requests-in-flight-per-connection 64" cargo bench ...   # more flags for the fleet
//! DENSITY_KINDS=plain,dra,pvc cargo bench ...   # DRA nodes and pods, CSI nodes and PVC pods beside plain ones
//! ```

#[path = "density/claims.rs"]
mod claims;
#[path = "density/cluster.rs"]
mod cluster;
#[path = "density/kwok.rs"]
mod kwok;
#[path = "density/process.rs"]
mod process;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::Api;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// How long a fleet may take until all its nodes are Ready (`DENSITY_READY_SECS`, 600 s): the benchmark stops
/// at the first fleet that misses it.
fn ready_limit() -> anyhow::Result<Duration> {
    let secs: u64 = env_or("DENSITY_READY_SECS", "600")
        .parse()
        .context("DENSITY_READY_SECS: whole seconds")?;
    Ok(Duration::from_secs(secs))
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
        let get = |key: &str| testenv::server_metrics::label(labels, key);
        *out.entry(format!("{} {}", get("verb"), get("resource")))
            .or_insert(0.0) += value.parse::<f64>()?;
    }
    Ok(out)
}

/// The fleet's heap figures from its allocator (`hollow_heap_bytes` by kind; empty without jemalloc).
async fn heap_figures(port: u16) -> anyhow::Result<BTreeMap<String, u64>> {
    let body = fetch_metrics(port).await?;
    let mut out = BTreeMap::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("hollow_heap_bytes{kind=\"") else {
            continue;
        };
        let (kind, value) = rest.split_once("\"} ").context("heap metric line")?;
        out.insert(kind.to_owned(), value.trim().parse()?);
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

/// Which fleet a row measures.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fleet {
    Hollow,
    Kwok,
}

impl Fleet {
    fn name(self) -> &'static str {
        match self {
            Fleet::Hollow => "hollow",
            Fleet::Kwok => "KWOK v0.8.0",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Fleet::Hollow => "bench",
            Fleet::Kwok => "kwok",
        }
    }
}

/// Which nodes and pods a row measures: plain ones, or hollow nodes with a driver and pods with claims on it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Plain,
    /// Nodes with a DRA driver (a ResourceSlice of 8 devices each); pods each with a ResourceClaim.
    Dra,
    /// Nodes with a CSI driver; pods each with a PersistentVolumeClaim of a CSI volume, attached.
    Pvc,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::Dra => "DRA",
            Kind::Pvc => "PVC",
        }
    }

    /// The profile file giving every node its driver, if the kind needs one.
    fn profile(self) -> Option<String> {
        match self {
            Kind::Plain => None,
            Kind::Dra => Some(claims::dra_profile()),
            Kind::Pvc => Some(claims::csi_profile()),
        }
    }
}

struct Row {
    fleet: Fleet,
    kind: Kind,
    nodes: usize,
    pods: usize,
    ready_secs: f64,
    rss: u64,
    /// The process's most RSS so far (start-up and pod bursts included).
    peak_rss: u64,
    /// RSS with pods minus RSS idle, per pod (pod rows only).
    rss_per_pod: Option<f64>,
    /// The file-backed part of `rss` (the binary's pages).
    file_rss: u64,
    /// The allocator's figures at the end of the window (hollow with jemalloc).
    heap: Option<Heap>,
    cpu_ms_per_node_minute: f64,
    /// The kernel's part of that CPU time.
    system_share: f64,
    /// The machine's CPU time its hypervisor took over the window.
    stolen_share: f64,
    requests: BTreeMap<String, f64>,
    /// Lease updates per second the API server answered over the window (its own count).
    lease_updates_per_sec: f64,
}

impl Row {
    /// The fleet, and the kind of nodes unless plain.
    fn label(&self) -> String {
        match self.kind {
            Kind::Plain => self.fleet.name().to_owned(),
            Kind::Dra => format!("{}, DRA nodes / pods with a claim", self.fleet.name()),
            Kind::Pvc => format!("{}, CSI nodes / pods with a PVC", self.fleet.name()),
        }
    }

    fn rss_per_node_kib(&self) -> f64 {
        self.rss as f64 / 1024.0 / self.nodes as f64
    }
}

/// The allocator's own figures (`hollow_heap_bytes`), bytes.
#[derive(Debug, Clone, Copy)]
struct Heap {
    /// Handed out and not freed, each allocation counted at its size class: the live heap.
    allocated: u64,
    /// In pages holding live allocations: the live heap and the free room in part-used pages.
    active: u64,
}

/// A started fleet process: its PID and how to read its request counters.
struct Started {
    child: Child,
    metrics_port: Option<u16>,
}

async fn start_fleet(
    fleet: Fleet,
    kind: Kind,
    cp: &testenv::ControlPlane,
    nodes: usize,
    kwok_bin: Option<&PathBuf>,
) -> anyhow::Result<Started> {
    match fleet {
        Fleet::Hollow => {
            let profiles = match kind.profile() {
                Some(yaml) => {
                    let path = cp.dir().join("density-profiles.yaml");
                    std::fs::write(&path, yaml)?;
                    vec!["--profiles".to_owned(), path.display().to_string()]
                }
                None => Vec::new(),
            };
            let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            // DENSITY_HOLLOW_BIN: another build of the fleet (e.g. one with another allocator) to measure
            let bin = std::env::var_os("DENSITY_HOLLOW_BIN")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_hollow")));
            let child = Command::new(bin)
                .args([
                    "run",
                    "--nodes",
                    &nodes.to_string(),
                    "--name-template",
                    &format!("{}-{{index}}", fleet.prefix()),
                ])
                .args(["--register-qps", "500"])
                .args(&profiles)
                // DENSITY_HOLLOW_ARGS: more flags for the fleet, split at whitespace (one setting against another)
                .args(env_or("DENSITY_HOLLOW_ARGS", "").split_whitespace())
                .arg("--kubeconfig")
                .arg(cp.admin_kubeconfig())
                .args(["--metrics-address", &format!("127.0.0.1:{port}")])
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()?;
            Ok(Started {
                child,
                metrics_port: Some(port),
            })
        }
        Fleet::Kwok => {
            anyhow::ensure!(kind == Kind::Plain, "KWOK has no DRA or CSI node side");
            let bin = kwok_bin.context("KWOK binary")?;
            let child = kwok::start(bin, &cp.admin_kubeconfig())?;
            kwok::create_nodes(&cp.admin_client().await?, fleet.prefix(), nodes).await?;
            Ok(Started {
                child,
                metrics_port: None,
            })
        }
    }
}

/// A measuring window over the fleet process, and the lease updates per second the API server answered meanwhile.
async fn counted_window<F, Fut>(
    client: &kube::Client,
    pid: u32,
    nodes: usize,
    idle: Duration,
    requests: F,
) -> anyhow::Result<(process::Window, f64)>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<BTreeMap<String, f64>>>,
{
    let before = cluster::server_lease_updates(client).await?;
    let t0 = tokio::time::Instant::now();
    let w = process::window(pid, nodes, idle, requests).await?;
    let after = cluster::server_lease_updates(client).await?;
    Ok((w, (after - before) / t0.elapsed().as_secs_f64()))
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    fleet: Fleet,
    kind: Kind,
    cp: &testenv::ControlPlane,
    nodes: usize,
    ready_limit: Duration,
    idle: Duration,
    pods_per_node: usize,
    kwok_bin: Option<&PathBuf>,
) -> anyhow::Result<Vec<Row>> {
    let start = tokio::time::Instant::now();
    let mut started = start_fleet(fleet, kind, cp, nodes, kwok_bin).await?;
    let pid = started.child.id();
    let port = started.metrics_port;
    let requests = move || async move {
        match port {
            Some(port) => api_requests(port).await,
            None => Ok(BTreeMap::new()),
        }
    };
    // the allocator's figures, if the fleet reports them
    let read_heap = |port: Option<u16>| async move {
        let figures = heap_figures(port?).await.ok()?;
        Some(Heap {
            allocated: *figures.get("allocated")?,
            active: *figures.get("active")?,
        })
    };
    let out = async {
        let client = cp.admin_client().await?;
        let api: Api<Node> = Api::all(client.clone());
        cluster::wait_ready(&api, fleet.prefix(), nodes, ready_limit).await?;
        let ready_secs = start.elapsed().as_secs_f64();
        eprintln!(
            "density: {} ({} nodes) {nodes} nodes Ready after {ready_secs:.1} s; the idle window opens in 20 s",
            fleet.name(),
            kind.name()
        );
        // let registration bursts settle before the idle window
        tokio::time::sleep(Duration::from_secs(20)).await;
        let (w, lease_updates_per_sec) = counted_window(&client, pid, nodes, idle, requests).await?;
        let idle_rss = w.rss;
        let heap = read_heap(port).await;
        let mut rows = vec![Row {
            fleet,
            kind,
            nodes,
            pods: 0,
            ready_secs,
            rss: w.rss,
            peak_rss: w.peak_rss,
            rss_per_pod: None,
            file_rss: w.file_rss,
            heap,
            cpu_ms_per_node_minute: w.cpu_ms_per_node_minute,
            system_share: w.system_share,
            stolen_share: w.stolen_share,
            requests: w.requests,
            lease_updates_per_sec,
        }];
        if pods_per_node > 0 {
            let pods = nodes * pods_per_node;
            eprintln!(
                "density: {} {nodes} nodes idle measured; starting {pods} pods ...",
                fleet.name()
            );
            let pods_secs = match kind {
                Kind::Plain => cluster::run_bound_pods(&client, fleet.prefix(), nodes, pods_per_node).await?,
                Kind::Dra => claims::run_dra_pods(&client, pods).await?,
                Kind::Pvc => claims::run_pvc_pods(&client, fleet.prefix(), nodes, pods).await?,
            };
            tokio::time::sleep(Duration::from_secs(20)).await;
            let (w, lease_updates_per_sec) = counted_window(&client, pid, nodes, idle, requests).await?;
            let heap = read_heap(port).await;
            rows.push(Row {
                fleet,
                kind,
                nodes,
                pods,
                ready_secs: pods_secs,
                rss: w.rss,
                peak_rss: w.peak_rss,
                rss_per_pod: Some((w.rss as f64 - idle_rss as f64) / pods as f64),
                file_rss: w.file_rss,
                heap,
                cpu_ms_per_node_minute: w.cpu_ms_per_node_minute,
                system_share: w.system_share,
                stolen_share: w.stolen_share,
                requests: w.requests,
                lease_updates_per_sec,
            });
        }
        Ok(rows)
    }
    .await;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid)?),
        nix::sys::signal::SIGTERM,
    );
    let _ = started.child.wait();
    out
}

#[allow(clippy::too_many_arguments)]
async fn run_size(
    fleet: Fleet,
    kind: Kind,
    nodes: usize,
    ready_limit: Duration,
    idle: Duration,
    pods_per_node: usize,
    kwok_bin: Option<&PathBuf>,
) -> anyhow::Result<Vec<Row>> {
    let cp = testenv::ControlPlane::start(testenv::Options {
        apiserver_args: vec![
            "--max-requests-inflight=3000".into(),
            "--max-mutating-requests-inflight=1500".into(),
        ],
        controller_manager_args: vec!["--kube-api-qps=300".into(), "--kube-api-burst=600".into()],
        // plain pods are bound straight to their nodes; pods with a DRA claim go through the scheduler, whose
        // writes (the claim's allocation, the binding) should not pace the run either
        scheduler_args: vec!["--kube-api-qps=300".into(), "--kube-api-burst=600".into()],
        start_timeout: Duration::from_secs(120),
        ..Default::default()
    })
    .await?;
    let storage = match kind {
        Kind::Pvc => match claims::Storage::start(&cp.admin_kubeconfig()).await {
            Ok(storage) => Some(storage),
            Err(error) => {
                cp.stop().await?;
                return Err(error);
            }
        },
        _ => None,
    };
    let result = measure(
        fleet,
        kind,
        &cp,
        nodes,
        ready_limit,
        idle,
        pods_per_node,
        kwok_bin,
    )
    .await;
    if let Some(storage) = storage {
        storage.stop().await?;
    }
    cp.stop().await?;
    result
}

fn print_tables(rows: &[Row]) {
    println!(
        "\n| fleet | nodes | pods | all Ready (nodes) / Running (pods) after | fleet RSS | peak RSS | RSS per node | RSS per running pod | CPU per node-minute | API requests/s (steady) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in rows {
        let reqs: Vec<String> = r.requests.iter().map(|(k, v)| format!("{k} {v:.1}")).collect();
        println!(
            "| {} | {} | {} | {:.1} s | {:.0} MiB | {:.0} MiB | {:.1} KiB | {} | {:.2} ms | {} |",
            r.label(),
            r.nodes,
            r.pods,
            r.ready_secs,
            r.rss as f64 / 1_048_576.0,
            r.peak_rss as f64 / 1_048_576.0,
            r.rss_per_node_kib(),
            r.rss_per_pod
                .map_or("—".to_owned(), |b| format!("{:.1} KiB", b / 1024.0)),
            r.cpu_ms_per_node_minute,
            if reqs.is_empty() {
                "—".to_owned()
            } else {
                reqs.join(", ")
            }
        );
    }
    print_targets(rows);
    print_memory_split(rows);
    print_cpu_split(rows);
    print_beside_plain(rows);
    let pairs: Vec<(&Row, &Row)> = rows
        .iter()
        .filter(|r| r.fleet == Fleet::Hollow && r.kind == Kind::Plain)
        .filter_map(|h| {
            rows.iter()
                .find(|k| {
                    k.fleet == Fleet::Kwok && k.kind == Kind::Plain && k.nodes == h.nodes && k.pods == h.pods
                })
                .map(|k| (h, k))
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    println!(
        "\n| nodes | pods | Ready / Running time hollow/KWOK | RSS per node hollow/KWOK | RSS per running pod hollow/KWOK | CPU per node-minute hollow/KWOK |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for (h, k) in pairs {
        let per_pod = match (h.rss_per_pod, k.rss_per_pod) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
            _ => "—".to_owned(),
        };
        println!(
            "| {} | {} | {:.2} | {:.2} | {} | {:.2} |",
            h.nodes,
            h.pods,
            h.ready_secs / k.ready_secs,
            h.rss_per_node_kib() / k.rss_per_node_kib(),
            per_pod,
            h.cpu_ms_per_node_minute / k.cpu_ms_per_node_minute
        );
    }
}

/// Each hollow fleet of DRA or CSI nodes beside the plain hollow fleet of the same size: RSS and CPU per idle
/// node, and RSS per running pod (a pod with a claim beside a plain pod), with the ratio. KWOK has no DRA or CSI
/// node side: nothing of its own to set beside them.
fn print_beside_plain(rows: &[Row]) {
    let others: Vec<&Row> = rows
        .iter()
        .filter(|r| r.fleet == Fleet::Hollow && r.kind != Kind::Plain)
        .collect();
    if others.is_empty() {
        return;
    }
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.2}", a / b)
        } else {
            "—".to_owned()
        }
    };
    println!(
        "\n| nodes | kind | pods (kind / plain) | RSS per node (kind / plain, ratio) | CPU per node-minute (kind / plain, \
         ratio) | RSS per running pod (kind / plain, ratio) | KWOK |"
    );
    println!("|---:|---|---:|---:|---:|---:|---|");
    let plain = |nodes: usize, with_pods: bool| {
        rows.iter().find(|p| {
            p.fleet == Fleet::Hollow && p.kind == Kind::Plain && p.nodes == nodes && (p.pods > 0) == with_pods
        })
    };
    for r in others {
        let Some(p) = plain(r.nodes, r.pods > 0) else {
            println!(
                "| {} | {} | {} | {:.1} KiB / — | {:.2} ms / — | {} / — | no DRA or CSI node side |",
                r.nodes,
                r.kind.name(),
                r.pods,
                r.rss_per_node_kib(),
                r.cpu_ms_per_node_minute,
                r.rss_per_pod
                    .map_or("—".to_owned(), |b| format!("{:.1} KiB", b / 1024.0)),
            );
            continue;
        };
        let per_pod = match (r.rss_per_pod, p.rss_per_pod) {
            (Some(a), Some(b)) => format!("{:.1} KiB / {:.1} KiB, {}", a / 1024.0, b / 1024.0, ratio(a, b)),
            _ => "—".to_owned(),
        };
        println!(
            "| {} | {} | {} / {} | {:.1} KiB / {:.1} KiB, {} | {:.2} ms / {:.2} ms, {} | {per_pod} | no DRA or CSI \
             node side |",
            r.nodes,
            r.kind.name(),
            r.pods,
            p.pods,
            r.rss_per_node_kib(),
            p.rss_per_node_kib(),
            ratio(r.rss_per_node_kib(), p.rss_per_node_kib()),
            r.cpu_ms_per_node_minute,
            p.cpu_ms_per_node_minute,
            ratio(r.cpu_ms_per_node_minute, p.cpu_ms_per_node_minute),
        );
    }
}

/// Where each hollow row's resident memory is, per node, in parts that add up to it: the live heap (what the
/// allocator has handed out, at its size classes); the free room in the allocator's part-used pages (active −
/// allocated); the rest of the anonymous memory (the allocator's metadata and the freed pages it has not
/// given back yet, thread stacks, memory outside the allocator); and the binary's pages (file-backed).
fn print_memory_split(rows: &[Row]) {
    let split: Vec<_> = rows.iter().filter_map(|r| r.heap.map(|heap| (r, heap))).collect();
    if split.is_empty() {
        return;
    }
    println!(
        "\n| hollow | RSS per node | live heap | free room in part-used pages | other anonymous | binary's pages |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (r, heap) in split {
        let per_node = |bytes: u64| bytes as f64 / 1024.0 / r.nodes as f64;
        let anonymous = r.rss.saturating_sub(r.file_rss);
        let active = heap.active.min(anonymous);
        println!(
            "| {}{} nodes, {} pods | {:.1} KiB | {:.1} KiB | {:.1} KiB | {:.1} KiB | {:.1} KiB |",
            match r.kind {
                Kind::Plain => String::new(),
                kind => format!("{} ", kind.name()),
            },
            r.nodes,
            r.pods,
            r.rss_per_node_kib(),
            per_node(heap.allocated),
            per_node(active.saturating_sub(heap.allocated)),
            per_node(anonymous - active),
            per_node(r.file_rss),
        );
    }
}

/// Each row's CPU time split into the fleet's own and the kernel's work for it, beside the share of the whole
/// machine's CPU its hypervisor took meanwhile: a figure measured while much was stolen says as much about the
/// machine's host as about the fleet.
fn print_cpu_split(rows: &[Row]) {
    println!(
        "\n| fleet | nodes | pods | CPU per node-minute | of it in the kernel | machine's CPU stolen meanwhile | \
         lease updates/s (API server's count) | fleet CPU per lease update |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        // the fleet's CPU milliseconds per second over the window, per lease update the server answered in it (an
        // idle fleet's requests are nearly all renewals; with pods it does more for the same count)
        let cpu_ms_per_sec = r.cpu_ms_per_node_minute * r.nodes as f64 / 60.0;
        let per_update = if r.lease_updates_per_sec > 0.0 {
            format!("{:.3} ms", cpu_ms_per_sec / r.lease_updates_per_sec)
        } else {
            "—".to_owned()
        };
        println!(
            "| {} | {} | {} | {:.2} ms | {:.0} % | {:.1} % | {:.1} | {per_update} |",
            r.label(),
            r.nodes,
            r.pods,
            r.cpu_ms_per_node_minute,
            r.system_share * 100.0,
            r.stolen_share * 100.0,
            r.lease_updates_per_sec,
        );
    }
}

/// The hollow fleet's memory and CPU targets: ≤ 16 KiB per idle node at 5,000 nodes and more,
/// ≤ 3 KiB per running pod, ≤ 1.3 ms CPU per idle node-minute at 5,000 nodes and more.
const TARGET_IDLE_KIB: f64 = 16.0;
const TARGET_POD_KIB: f64 = 3.0;
const TARGET_IDLE_CPU_MS: f64 = 1.3;
const TARGETS_FROM_NODES: usize = 5_000;

/// Prints each hollow row's figures against the targets that apply to it, pass or fail.
fn print_targets(rows: &[Row]) {
    let verdict = |ok: bool| if ok { "pass" } else { "FAIL" };
    let mut lines = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.fleet == Fleet::Hollow && r.kind == Kind::Plain)
    {
        if r.pods == 0 && r.nodes >= TARGETS_FROM_NODES {
            let kib = r.rss_per_node_kib();
            lines.push(format!(
                "| {} idle nodes | RSS per node {kib:.1} KiB (target ≤ {TARGET_IDLE_KIB} KiB) | {} |",
                r.nodes,
                verdict(kib <= TARGET_IDLE_KIB)
            ));
            let cpu = r.cpu_ms_per_node_minute;
            lines.push(format!(
                "| {} idle nodes | CPU per node-minute {cpu:.2} ms (target ≤ {TARGET_IDLE_CPU_MS} ms) | {} |",
                r.nodes,
                verdict(cpu <= TARGET_IDLE_CPU_MS)
            ));
        }
        if let Some(per_pod) = r.rss_per_pod {
            let kib = per_pod / 1024.0;
            lines.push(format!(
                "| {} nodes, {} pods | RSS per running pod {kib:.1} KiB (target ≤ {TARGET_POD_KIB} KiB) | {} |",
                r.nodes,
                r.pods,
                verdict(kib <= TARGET_POD_KIB)
            ));
        }
    }
    if lines.is_empty() {
        return;
    }
    println!("\n| hollow | figure against its target | verdict |");
    println!("|---|---|---|");
    for line in lines {
        println!("{line}");
    }
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
    let ready = ready_limit()?;
    let pods_per_node: usize = env_or("DENSITY_PODS_PER_NODE", "10").parse()?;
    let pods_max_nodes: usize = env_or("DENSITY_PODS_MAX_NODES", "1000").parse()?;
    let mut kinds = Vec::new();
    for k in env_or("DENSITY_KINDS", "plain").split(',') {
        kinds.push(match k.trim() {
            "plain" => Kind::Plain,
            "dra" => Kind::Dra,
            "pvc" => Kind::Pvc,
            other => anyhow::bail!("DENSITY_KINDS: unknown kind {other:?} (plain, dra, pvc)"),
        });
    }
    let mut fleets = Vec::new();
    for f in env_or("DENSITY_FLEETS", "hollow,kwok").split(',') {
        fleets.push(match f.trim() {
            "hollow" => Fleet::Hollow,
            "kwok" => Fleet::Kwok,
            other => anyhow::bail!("DENSITY_FLEETS: unknown fleet {other:?} (hollow, kwok)"),
        });
    }
    let kwok_bin = if fleets.contains(&Fleet::Kwok) {
        Some(kwok::binary()?)
    } else {
        None
    };
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for n in sizes {
        let ppn = if n <= pods_max_nodes { pods_per_node } else { 0 };
        for (fleet, kind) in fleets.iter().flat_map(|&f| kinds.iter().map(move |&k| (f, k))) {
            // KWOK has no DRA or CSI node side: those kinds are hollow's alone (the table says so)
            if fleet == Fleet::Kwok && kind != Kind::Plain {
                continue;
            }
            // a DRA node has 8 devices: at most 8 pods with a claim each
            let ppn = if kind == Kind::Dra {
                ppn.min(claims::DRA_DEVICES)
            } else {
                ppn
            };
            eprintln!("density: {} ({} nodes) {n} nodes ...", fleet.name(), kind.name());
            // a fleet that fails at one size (e.g. not all Ready within the limit) is reported with the tables;
            // the other fleets and sizes are still measured
            let measured = match run_size(fleet, kind, n, ready, idle, ppn, kwok_bin.as_ref()).await {
                Ok(measured) => measured,
                Err(error) => {
                    eprintln!(
                        "density: {} ({} nodes) {n} nodes failed: {error:#}",
                        fleet.name(),
                        kind.name()
                    );
                    failed.push(format!(
                        "{} ({} nodes) at {n} nodes: {error:#}",
                        fleet.name(),
                        kind.name()
                    ));
                    continue;
                }
            };
            for row in measured {
                eprintln!(
                    "density: {} {n} nodes, {} pods: Ready/Running after {:.1}s, {:.1} KiB/node (peak {:.0} MiB), {:.3} ms CPU/node-minute, {} per running pod",
                    row.label(),
                    row.pods,
                    row.ready_secs,
                    row.rss_per_node_kib(),
                    row.peak_rss as f64 / 1_048_576.0,
                    row.cpu_ms_per_node_minute,
                    row.rss_per_pod
                        .map_or("—".to_owned(), |b| format!("{:.1} KiB", b / 1024.0)),
                );
                rows.push(row);
            }
        }
    }
    print_tables(&rows);
    if failed.is_empty() {
        return Ok(());
    }
    println!("\nNot measured:");
    for line in &failed {
        println!("- {line}");
    }
    anyhow::bail!("{} of the runs failed", failed.len())
}
