//! A fleet split over two processes gives the merged table.

use super::*;

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
