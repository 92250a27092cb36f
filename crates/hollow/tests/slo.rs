//! `hollow slo` against the real control plane and hollow fleets: a run produces the table, PerfData JSON
//! and plots, with the cluster-side schedule_to_watch containing the node-side watch_observed →
//! status_reported span; two extra seconds of container start show up in schedule_to_run and the node's
//! containers_started stage and decide the verdicts; a fleet split over two processes gives the merged
//! table; Deployments in bursts over two namespaces with churn, and Jobs from a user's template kept with
//! `--keep`, are measured and cleaned up; bad input is refused before any pod exists.
//!
//! Scale by environment (the CI default is small): `HOLLOW_SLO_PODS` (200), `HOLLOW_SLO_NODES` (50),
//! `HOLLOW_SLO_RATE` (50 pods/s).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use e2e::{init_logging, node_is_ready, nodes_with_prefix, wait_for};
use hollow::client_pool::{ClientPool, PoolLimits, PoolSize};
use hollow::fleet::{Fleet, FleetSpec};
use hollow::slo::cli::SloArgs;
use hollow::slo::measure::Transition;
use hollow::slo::report::PerfData;
use hollow::slo::run::{self, SloResult};
use hollow::{profiles, server};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Api;
use node_agent::Metrics;
use node_agent::pods::PodMetrics;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// The runs here measure latency: one at a time, so they do not load each other's API server.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A control plane whose scheduler and controllers may write fast enough for the load.
async fn control_plane() -> anyhow::Result<&'static testenv::ControlPlane> {
    let fast = vec![
        "--kube-api-qps=500".to_owned(),
        "--kube-api-burst=1000".to_owned(),
    ];
    testenv::shared_with(testenv::Options {
        controller_manager_args: fast.clone(),
        scheduler_args: fast,
        ..Default::default()
    })
    .await
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Profiles labelling every node `fleet=<label>`, so a run's pods land on this fleet alone.
fn profiles_yaml(label: &str) -> String {
    format!(
        "profiles:\n  - name: {label}\n    weight: 1\n    capacity: {{cpu: \"8\", memory: 32Gi, pods: \"110\"}}\n    labels: {{fleet: {label}}}\n"
    )
}

/// A fleet in this process with its own /histograms endpoint.
struct TestFleet {
    fleet: Fleet,
    addr: SocketAddr,
    token: CancellationToken,
}

async fn start_fleet(
    cp: &testenv::ControlPlane,
    prefix: &str,
    nodes: usize,
    runtime: &[(&str, &str)],
) -> anyhow::Result<TestFleet> {
    let spec = FleetSpec {
        register_qps: 200.0,
        runtime_profile: Arc::new(cri_fake::Profile::from_pairs(runtime.iter().copied())?),
        ..FleetSpec::new(
            nodes,
            format!("{prefix}-{{index}}"),
            profiles::parse(&profiles_yaml(prefix), "test")?,
        )?
    };
    let config = cp.admin_config().await?;
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
        &spec,
        &pool,
        Arc::new(Metrics::unregistered()),
        pod_metrics,
        token.clone(),
    )
    .await?;
    let api: Api<Node> = Api::all(cp.admin_client().await?);
    schedulable(&api, prefix, nodes).await?;
    Ok(TestFleet { fleet, addr, token })
}

/// Waits until `count` nodes named `<prefix>-…` are Ready and free of NoSchedule/NoExecute taints (the
/// controller-manager lifts `not-ready` a few seconds after Ready; until then the scheduler skips a node).
async fn schedulable(api: &Api<Node>, prefix: &str, count: usize) -> anyhow::Result<()> {
    wait_for(
        &format!("{count} {prefix} nodes schedulable"),
        Duration::from_secs(120),
        || async {
            let all = nodes_with_prefix(api, prefix).await?;
            let untainted = |n: &Node| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_none_or(|t| t.iter().all(|t| t.effect == "PreferNoSchedule"))
            };
            Ok((all.len() == count && all.iter().all(|n| node_is_ready(n) && untainted(n))).then_some(()))
        },
    )
    .await
}

impl TestFleet {
    async fn stop(self) {
        self.fleet.stop(Duration::from_secs(10)).await;
        self.token.cancel();
    }
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    slo: SloArgs,
}

/// `hollow slo` flags, parsed as the binary parses them.
fn args(flags: &[&str]) -> anyhow::Result<SloArgs> {
    Ok(Cli::try_parse_from(std::iter::once("slo").chain(flags.iter().copied()))?.slo)
}

async fn slo(cp: &testenv::ControlPlane, flags: &[&str]) -> anyhow::Result<SloResult> {
    let opts = args(flags)?.options()?;
    run::run(cp.admin_client().await?, opts).await
}

fn perfdata(dir: &std::path::Path, prefix: &str) -> anyhow::Result<PerfData> {
    let entry = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .ok_or_else(|| anyhow::anyhow!("no {prefix}*.json in {}", dir.display()))?;
    Ok(serde_json::from_slice(&std::fs::read(entry.path())?)?)
}

fn metric<'a>(p: &'a PerfData, name: &str) -> &'a BTreeMap<String, f64> {
    &p.data_items
        .iter()
        .find(|i| i.labels.get("Metric").map(String::as_str) == Some(name))
        .unwrap_or_else(|| panic!("{name} in the PerfData"))
        .data
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_reports_table_json_and_plots_and_schedule_to_watch_contains_the_node_span()
-> anyhow::Result<()> {
    init_logging();
    let _serial = SERIAL.lock().await;
    let pods = env_or("HOLLOW_SLO_PODS", 200);
    let nodes = usize::try_from(env_or("HOLLOW_SLO_NODES", 50))?;
    let rate = env_or("HOLLOW_SLO_RATE", 50);
    let cp = control_plane().await?;
    let fleet = start_fleet(cp, "slo", nodes, &[]).await?;
    let dir = tempfile::tempdir()?;
    // HOLLOW_SLO_REPORT keeps the report directory (for a demonstration run)
    let kept = std::env::var_os("HOLLOW_SLO_REPORT").map(std::path::PathBuf::from);
    let report_dir = kept.as_deref().unwrap_or(dir.path());
    let url = format!("http://{}", fleet.addr);
    let (count, rate) = (pods.to_string(), rate.to_string());
    let result = slo(
        cp,
        &[
            "--count",
            &count,
            "--rate",
            &rate,
            "--node-selector",
            "fleet=slo",
            "--fleet",
            &url,
            "--namespace",
            "slo-main",
        ],
    )
    .await?;
    fleet.stop().await;
    let written = hollow::slo::report::write_dir(&result, report_dir)?;
    let table = hollow::slo::report::table(&result);
    println!("{table}");
    println!("report files: {:?}", written.files);

    assert_eq!(result.load.created, pods, "every object created");
    assert_eq!(
        result.cluster.running,
        usize::try_from(pods)?,
        "every pod seen Running"
    );
    let node = result.fleet.as_ref().expect("the fleet's stages");
    assert_eq!(
        node.stage("status_reported").count,
        usize::try_from(pods)?,
        "the node side counts this run's pods, no more, no less"
    );
    // what a user reads: the table, the JSON, the plots
    for needle in [
        "schedule_to_watch",
        "pod_start_sli",
        "containers_started",
        "SLO pod_startup p99 <= 5000ms",
    ] {
        assert!(table.contains(needle), "{needle} in the table");
    }
    for f in [
        "summary.txt",
        "pods.csv",
        "index.html",
        "cluster_cdf.svg",
        "cluster_cdf.png",
        "node_cdf.svg",
        "node_cdf.png",
        "timeline.svg",
        "timeline.png",
        "api_latency.svg",
        "api_latency.png",
    ] {
        let meta = std::fs::metadata(report_dir.join(f))?;
        assert!(meta.len() > 100, "{f} has content");
    }
    let html = std::fs::read_to_string(report_dir.join("index.html"))?;
    assert!(html.contains("cluster_cdf.png") && html.contains("PodStartupLatency_"));
    let cl2 = perfdata(report_dir, "PodStartupLatency_")?;
    assert_eq!(cl2.version, "1.0");
    for t in Transition::ALL {
        let data = metric(&cl2, t.name());
        let p = result.cluster.get(t);
        assert!(
            (data["Perc99"] - p.p99).abs() < 1e-6,
            "{} in the JSON is the table's",
            t.name()
        );
        assert!(data["Perc50"] <= data["Perc90"] && data["Perc90"] <= data["Perc99"]);
    }
    assert!(cl2.data_items.iter().all(|i| i.unit == "ms"));
    let stages = perfdata(report_dir, "NodeStartupStages_")?;
    assert_eq!(metric(&stages, "status_reported").len(), 4);

    // schedule_to_watch holds the node's whole watch_observed → status_reported span plus the delivery of
    // the binding to the node and of the Running status back to the measuring watch, so over the same pods
    // (all of them: the node side cannot leave out the SLO's exclusions) it is the longer one at the median.
    // Two edges are not ordered, though: the scheduler stamps its event after its bind call returns
    // (measured: from 60 ms before to 124 ms after the watch saw the binding, 1,000 pods at 50/s), and the
    // node marks status_reported when its PATCH's response arrives, which under load can come after the
    // watch has delivered the committed status. In the tail the node's span can be the longer (1,000 pods:
    // p99 362 ms on the node, 262 ms cluster side; 200 pods beside another run: p90 116 vs 108 ms). So the
    // median is asserted, with an allowance for those edges, and p90/p99 are printed.
    let sched_to_watch = hollow::slo::measure::Percentiles::nearest_rank(
        result
            .records
            .iter()
            .filter_map(|r| r.latency_ms(Transition::ScheduleToWatch))
            .collect(),
    );
    let node_span = node.stage("pod_start");
    println!(
        "schedule_to_watch p50/p90/p99 {:.1}/{:.1}/{:.1} ms vs node watch_observed->status_reported {:.1}/{:.1}/{:.1} ms",
        sched_to_watch.p50,
        sched_to_watch.p90,
        sched_to_watch.p99,
        node_span.p50,
        node_span.p90,
        node_span.p99
    );
    let allowance = 5.0 + node_span.p50 * 0.05;
    assert!(
        sched_to_watch.p50 >= node_span.p50 - allowance,
        "p50: cluster schedule_to_watch {} < node span {}",
        sched_to_watch.p50,
        node_span.p50
    );
    let v = &result.verdicts[0];
    assert_eq!(
        v.pass,
        v.value_ms <= 5000.0 && v.samples > 0,
        "the verdict follows the data"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_more_seconds_of_container_start_show_in_schedule_to_run_and_decide_the_verdicts()
-> anyhow::Result<()> {
    init_logging();
    let _serial = SERIAL.lock().await;
    let cp = control_plane().await?;
    let mut runs = Vec::new();
    for (prefix, runtime) in [("quick", vec![]), ("slowstart", vec![("start-latency", "2s")])] {
        let fleet = start_fleet(cp, prefix, 10, &runtime).await?;
        let url = format!("http://{}", fleet.addr);
        let selector = format!("fleet={prefix}");
        let ns = format!("slo-{prefix}");
        let result = slo(
            cp,
            &[
                "--count",
                "40",
                "--rate",
                "20",
                "--node-selector",
                &selector,
                "--fleet",
                &url,
                "--namespace",
                &ns,
                "--threshold",
                "p99=1s",
                "--threshold",
                "p99=5s",
            ],
        )
        .await?;
        fleet.stop().await;
        println!("{prefix}:\n{}", hollow::slo::report::table(&result));
        for v in &result.verdicts {
            assert_eq!(
                v.pass,
                v.samples > 0 && v.value_ms <= v.threshold.limit.as_secs_f64() * 1000.0,
                "{prefix}: verdict {} follows the data",
                v.threshold
            );
        }
        runs.push(result);
    }
    let (quick, slow) = (&runs[0], &runs[1]);
    let p50 = |r: &SloResult, t| r.cluster.get(t).p50;
    let moved = p50(slow, Transition::ScheduleToRun) - p50(quick, Transition::ScheduleToRun);
    let node = |r: &SloResult| {
        r.fleet
            .as_ref()
            .map(|f| f.stage("containers_started").p50)
            .unwrap_or_default()
    };
    let node_moved = node(slow) - node(quick);
    println!("schedule_to_run p50 moved {moved:.0} ms; node containers_started p50 moved {node_moved:.0} ms");
    // startedAt has one-second resolution, so the cluster side moves by 2 s ± 1 s
    assert!(
        (1000.0..=3000.0).contains(&moved),
        "schedule_to_run moved {moved} ms"
    );
    assert!(
        (1900.0..=2300.0).contains(&node_moved),
        "containers_started moved {node_moved} ms"
    );
    assert!(!slow.verdicts[0].pass, "2 s more start fails p99 <= 1 s");
    assert!(slow.verdicts[1].pass, "and passes p99 <= 5 s");
    Ok(())
}

fn hollow_bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hollow"));
    c.env("RUST_LOG", "warn").stdin(Stdio::null());
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_split_over_two_processes_gives_the_merged_table() -> anyhow::Result<()> {
    init_logging();
    let _serial = SERIAL.lock().await;
    let cp = control_plane().await?;
    let dir = tempfile::tempdir()?;
    let profiles = dir.path().join("profiles.yaml");
    std::fs::write(&profiles, profiles_yaml("split"))?;
    let mut children = Vec::new();
    let mut urls = Vec::new();
    for half in ["split-a", "split-b"] {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = hollow_bin()
            .args([
                "run",
                "--nodes",
                "10",
                "--name-template",
                &format!("{half}-{{index}}"),
            ])
            .arg("--kubeconfig")
            .arg(cp.admin_kubeconfig())
            .arg("--profiles")
            .arg(&profiles)
            .args(["--metrics-address", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        children.push(child);
        urls.push(format!("http://127.0.0.1:{port}"));
    }
    let api: Api<Node> = Api::all(cp.admin_client().await?);
    schedulable(&api, "split", 20).await?;
    let report = dir.path().join("report");
    let out = hollow_bin()
        .args([
            "slo",
            "--count",
            "40",
            "--rate",
            "20",
            "--node-selector",
            "fleet=split",
            "--namespace",
            "slo-split",
        ])
        .args(["--fleet", &urls[0], "--fleet", &urls[1]])
        .arg("--kubeconfig")
        .arg(cp.admin_kubeconfig())
        .arg("--report")
        .arg(&report)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // each process's own share, read directly
    let mut shares = Vec::new();
    for url in &urls {
        shares.push(hollow::slo::node_side::fetch(url).await?);
    }
    for mut c in children {
        c.kill()?;
        c.wait()?;
    }
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "the run completes (met or not): {:?}",
        out.status
    );
    assert!(stdout.contains("Node side (2 fleet processes"), "{stdout}");
    let csv = std::fs::read_to_string(report.join("pods.csv"))?;
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for line in csv.lines().skip(1) {
        *per_node.entry(line.split(',').nth(2).unwrap_or("")).or_default() += 1;
    }
    println!("pods per node: {per_node:?}");
    let counts: Vec<usize> = shares.iter().map(|s| s.stage("status_reported").count).collect();
    assert!(
        counts.iter().all(|c| *c > 0),
        "both processes ran pods: {counts:?}"
    );
    assert_eq!(counts.iter().sum::<usize>(), 40);
    let merged = hollow::slo::node_side::FleetSnapshot::merge(&shares)?;
    let stages = perfdata(&report, "NodeStartupStages_")?;
    assert_eq!(stages.labels["FleetProcesses"], "2");
    for (name, p) in merged.rows() {
        let item = stages
            .data_items
            .iter()
            .find(|i| i.labels.get("Metric").map(String::as_str) == Some(name))
            .unwrap_or_else(|| panic!("{name}"));
        assert_eq!(item.labels["Count"], p.count.to_string(), "{name} count");
        assert!(
            (item.data["Perc99"] - p.p99).abs() < 1e-6,
            "{name}: the table is the exact merge of both processes"
        );
    }
    Ok(())
}

/// Pods in `namespace` right now.
async fn pods_in(cp: &testenv::ControlPlane, namespace: &str) -> anyhow::Result<usize> {
    let api: Api<Pod> = Api::namespaced(cp.admin_client().await?, namespace);
    Ok(api.list(&Default::default()).await?.items.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_before_any_pod_is_created() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = cp.admin_kubeconfig();
    let run = |extra: &[&str]| -> anyhow::Result<(bool, String)> {
        let out = hollow_bin()
            .args(["slo", "--count", "5"])
            .args(extra)
            .arg("--report")
            .arg(dir.path().join("r"))
            .output()?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    };
    let kc = kubeconfig.to_str().unwrap_or_default();
    let namespaces: Api<Namespace> = Api::all(cp.admin_client().await?);

    let (ok, err) = run(&["--rate", "0", "--kubeconfig", kc, "--namespace", "slo-bad-rate"])?;
    assert!(!ok && err.contains("--rate must be a positive"), "{err}");
    assert!(
        namespaces.get_opt("slo-bad-rate").await?.is_none(),
        "nothing touched the cluster"
    );

    let not_template = dir.path().join("cm.yaml");
    std::fs::write(
        &not_template,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\n",
    )?;
    let (ok, err) = run(&[
        "--rate",
        "5",
        "--kubeconfig",
        kc,
        "--template",
        not_template.to_str().unwrap_or_default(),
    ])?;
    assert!(!ok && err.contains("not a pod template: kind ConfigMap"), "{err}");

    let unreachable = dir.path().join("unreachable.kubeconfig");
    std::fs::write(
        &unreachable,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\", insecure-skip-tls-verify: true}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )?;
    let (ok, err) = run(&[
        "--rate",
        "5",
        "--kubeconfig",
        unreachable.to_str().unwrap_or_default(),
    ])?;
    assert!(
        !ok && err.contains("cannot reach the API server") && err.contains("127.0.0.1:1"),
        "{err}"
    );

    // the first namespace can be made, the second cannot: the error comes before any pod, and the first
    // is removed again
    let (ok, err) = run(&[
        "--rate",
        "5",
        "--kubeconfig",
        kc,
        "--namespace",
        "slo-bad-ok",
        "--namespace",
        "Bad_Name",
    ])?;
    assert!(
        !ok && err.contains("namespace Bad_Name cannot be created"),
        "{err}"
    );
    assert_eq!(pods_in(cp, "slo-bad-ok").await?, 0, "no pod created");
    let left = namespaces.get_opt("slo-bad-ok").await?;
    assert!(
        left.is_none_or(|n| n.metadata.deletion_timestamp.is_some()),
        "the namespace made for the run is deleted"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_in_bursts_with_churn_and_jobs_from_a_template_are_measured_and_cleaned_up()
-> anyhow::Result<()> {
    init_logging();
    let _serial = SERIAL.lock().await;
    let cp = control_plane().await?;
    let fleet = start_fleet(cp, "kinds", 10, &[]).await?;
    let url = format!("http://{}", fleet.addr);
    let namespaces: Api<Namespace> = Api::all(cp.admin_client().await?);

    // bursts of 4 Deployments (3 replicas each) every second for 2 s, over two namespaces, then 1 s of churn:
    // the first burst's 4 objects are deleted and 4 new ones made
    let result = slo(
        cp,
        &[
            "--kind",
            "deployment",
            "--replicas",
            "3",
            "--burst-size",
            "4",
            "--burst-every",
            "1s",
            "--duration",
            "2s",
            "--churn",
            "1s",
            "--namespace",
            "slo-k1",
            "--namespace",
            "slo-k2",
            "--node-selector",
            "fleet=kinds",
            "--fleet",
            &url,
        ],
    )
    .await?;
    println!("{}", hollow::slo::report::table(&result));
    assert_eq!(
        (result.load.created, result.load.churned),
        (12, 4),
        "8 in bursts, 4 by churn"
    );
    assert_eq!(result.expected_pods, 36);
    assert_eq!(result.load.asked_rate, 4.0);
    assert_eq!(result.cluster.pods, 36, "every Deployment's pods measured");
    assert_eq!(result.not_running, 0);
    let of_churn = result
        .records
        .iter()
        .filter(|r| (8..12).any(|i| r.name.starts_with(&format!("slo-{}-{i}-", result.run_id))))
        .count();
    assert_eq!(of_churn, 12, "the Deployments churn made ran their pods");
    for ns in ["slo-k1", "slo-k2"] {
        assert!(result.records.iter().any(|r| r.namespace == ns), "pods in {ns}");
        let left = namespaces.get_opt(ns).await?;
        assert!(
            left.is_none_or(|n| n.metadata.deletion_timestamp.is_some()),
            "{ns}, made for the run, is deleted at cleanup"
        );
    }

    // Jobs from a user's Pod manifest, kept afterwards
    let dir = tempfile::tempdir()?;
    let template = dir.path().join("pod.yaml");
    std::fs::write(
        &template,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: ignored, labels: {team: perf}}\n\
         spec: {containers: [{name: worker, image: registry.test/worker:1, resources: {requests: {cpu: 100m}}}]}\n",
    )?;
    let result = slo(
        cp,
        &[
            "--kind",
            "job",
            "--replicas",
            "2",
            "--count",
            "3",
            "--rate",
            "10",
            "--namespace",
            "slo-jobs",
            "--keep",
            "--node-selector",
            "fleet=kinds",
            "--template",
            template.to_str().unwrap_or_default(),
        ],
    )
    .await?;
    fleet.stop().await;
    assert_eq!(result.cluster.running, 6, "3 Jobs of 2 pods each ran");
    let pods: Api<Pod> = Api::namespaced(cp.admin_client().await?, "slo-jobs");
    let kept = pods
        .list(&kube::api::ListParams::default().labels("team=perf"))
        .await?
        .items;
    assert_eq!(
        kept.len(),
        6,
        "--keep leaves the pods, with the template's labels"
    );
    assert!(
        kept.iter()
            .all(|p| p.spec.as_ref().is_some_and(|s| s.containers[0].name == "worker"))
    );
    namespaces.delete("slo-jobs", &Default::default()).await?;
    Ok(())
}
