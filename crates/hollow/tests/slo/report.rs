//! One run's table, PerfData JSON and plots; two more seconds of container start in the stages and verdicts.

use super::*;

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
    // Two edges are not ordered, though: the scheduler stamps its event after its bind call returns (before
    // or after a watch sees the binding), and the node marks status_reported when its PATCH's response
    // arrives, which under load can come after the watch has delivered the committed status. In the tail the
    // node's span can be the longer (docs/benchmarks.md, "Pod start-up SLO", has the figures). So the median
    // is asserted, with an allowance for those edges, and p90/p99 are printed.
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
    // The node's stamp trails the commit its watch saw by at most the PATCH's own round trip: add the API
    // server's p90 for status PATCHes in this run (clusterloader2's APIResponsiveness) to the allowance.
    let api = perfdata(report_dir, "APIResponsiveness_")?;
    let patch_p90 = api
        .data_items
        .iter()
        .find(|i| {
            let l = |k: &str| i.labels.get(k).map(String::as_str);
            l("Verb") == Some("PATCH") && l("Resource") == Some("pods") && l("Subresource") == Some("status")
        })
        .and_then(|i| i.data.get("Perc90").copied())
        .unwrap_or(0.0);
    println!("API server PATCH pods/status p90 in this run: {patch_p90:.1} ms");
    let allowance = 5.0 + node_span.p50 * 0.05 + patch_p90;
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
                // 10x the scripted 2 s: a verdict that passes however loaded the machine
                "p99=20s",
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
            .map(|f| f.stage("containers_started"))
            .unwrap_or_default()
    };
    let (quick_start, slow_start) = (node(quick), node(slow));
    let node_moved = slow_start.p50 - quick_start.p50;
    println!("schedule_to_run p50 moved {moved:.0} ms; node containers_started p50 moved {node_moved:.0} ms");
    // startedAt has one-second resolution, so the cluster side moves by 2 s ± 1 s; above that the slow run may
    // lose to load what the quick run lost (its p90 over its p50), as on the node side below
    let quick_run = quick.cluster.get(Transition::ScheduleToRun);
    let most = 3000.0 + (quick_run.p90 - quick_run.p50);
    assert!(
        (1000.0..=most).contains(&moved),
        "schedule_to_run moved {moved} ms (quick run p50 {}, p90 {}): outside 1000..={most}",
        quick_run.p50,
        quick_run.p90
    );
    // The scripted 2 s is a floor of every slow start; above it the slow run may lose to load what the quick
    // run lost (a loaded CI machine: quick p50 332 ms, p90 663), so the ceiling is 2 s over the quick run's p90
    // plus a margin, not over its p50.
    let ceiling = 2000.0 + quick_start.p90 + 300.0;
    assert!(
        (1950.0..=ceiling).contains(&slow_start.p50),
        "containers_started p50 {} ms with 2 s more per start (quick run p50 {}, p90 {}): outside 1950..={ceiling}",
        slow_start.p50,
        quick_start.p50,
        quick_start.p90
    );
    assert!(!slow.verdicts[0].pass, "2 s more start fails p99 <= 1 s");
    assert!(slow.verdicts[1].pass, "and passes p99 <= 20 s");
    Ok(())
}
