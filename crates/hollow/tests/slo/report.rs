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

    // schedule_to_watch (first seen bound -> first seen Running, one watch, full precision) holds the node's
    // whole watch_observed -> status_reported span plus the binding's delivery to the node and the Running
    // status's delivery back to the measuring watch. One edge is not ordered: the node marks status_reported
    // when its PATCH's response arrives, which under load can come after the measuring watch delivered the
    // committed status. So the median is asserted, with that PATCH's round trip as the allowance.
    let sched_to_watch = result.cluster.get(Transition::ScheduleToWatch);
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

    // The SLO's figure is what the pods take: its median within tens of milliseconds of the scheduler's share
    // plus the fleet's own pod_start (the same span less the two deliveries), not the hundreds a one-second
    // creationTimestamp adds.
    let startup = result.cluster.get(Transition::PodStartup);
    let create_to_run = result.cluster.get(Transition::CreateToRun);
    let legacy = ClusterSide::from_records(&result.records, Definition::Legacy);
    println!(
        "pod_startup p50/p90/p99 {:.1}/{:.1}/{:.1} ms (legacy definition on the same pods {:.1}/{:.1}/{:.1}); node pod_start p50 {:.1} ms",
        startup.p50,
        startup.p90,
        startup.p99,
        legacy.get(Transition::PodStartup).p50,
        legacy.get(Transition::PodStartup).p90,
        legacy.get(Transition::PodStartup).p99,
        node_span.p50
    );
    assert_eq!(
        startup.count,
        usize::try_from(pods)?,
        "pod_startup over every pod"
    );
    // What the pods take is the scheduler's share (create_to_schedule, from the same watch) and then the fleet's
    // own span; the two watch deliveries slow down with the machine as the fleet does: the allowance is 50 ms
    // plus a quarter of the fleet's own median. The median of a sum is the sum of the medians only for narrow
    // spreads: a loaded machine spreads both parts over seconds, so half of each part's p50-to-p90 spread is
    // allowed too (on a fast fleet that is a few milliseconds).
    let scheduling = result.cluster.get(Transition::CreateToSchedule);
    let expected = scheduling.p50 + node_span.p50;
    let spread = (node_span.p90 - node_span.p50) + (scheduling.p90 - scheduling.p50);
    let apart = 50.0 + node_span.p50 / 4.0 + spread / 2.0;
    assert!(
        (startup.p50 - expected).abs() <= apart,
        "pod_startup p50 {} ms against create_to_schedule p50 {} ms plus the fleet's pod_start p50 {} ms: more \
         than {apart} ms apart",
        startup.p50,
        scheduling.p50,
        node_span.p50
    );
    // Where the fleet's own stages say its pods start fast (pod_start p50 ≤ 50 ms), the SLO's figure is under
    // 100 ms. A machine busy enough to slow the fleet itself moves both; the bound above holds then too.
    if node_span.p50 <= 50.0 {
        assert!(
            startup.p50 < 100.0,
            "pod_startup p50 {} ms where the fleet's pod_start p50 is {} ms",
            startup.p50,
            node_span.p50
        );
    } else {
        println!(
            "the fleet's own pod_start p50 is {:.1} ms on this machine now: pod_startup < 100 ms is not checked",
            node_span.p50
        );
    }
    assert_eq!(
        create_to_run.count,
        usize::try_from(pods)?,
        "create_to_run over every pod"
    );
    assert!(table.contains("create_to_run") && metric(&cl2, "create_to_run")["Perc50"] > 0.0);
    // every phase from one watch in delivery order: nothing to clamp, schedule_to_run never below 0
    for r in &result.records {
        let raw = r.raw_latency_ms(Definition::Current, Transition::ScheduleToRun);
        assert!(
            raw.is_some_and(|ms| ms >= 0.0),
            "{}: schedule_to_run {raw:?}",
            r.name
        );
    }
    assert!(result.cluster.all.transitions.iter().all(|t| t.clamped == 0));
    assert!(!table.contains("counted as 0"), "{table}");
    // the legacy definition only adds: a truncated creationTimestamp is never after the first sighting
    assert!(legacy.get(Transition::PodStartup).p50 >= startup.p50);
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
    // The watch's sightings are precise, so every slow pod's schedule_to_run spans the scripted 2 s, and the
    // median moves by about that. Load shifts either run by up to its own spread (p90 over p50): the slow run
    // may lose more than the quick one, or the quick one more than the slow (a loaded CI machine: quick p50
    // 855 ms, p90 1,180, and the median moved 1,577 ms).
    let quick_run = quick.cluster.get(Transition::ScheduleToRun);
    let slow_run = slow.cluster.get(Transition::ScheduleToRun);
    assert!(
        slow_run.p50 >= 1900.0,
        "schedule_to_run p50 {} ms with 2 s more per start",
        slow_run.p50
    );
    let least = 1900.0 - (quick_run.p90 - quick_run.p50);
    let most = 2300.0 + (quick_run.p90 - quick_run.p50);
    assert!(
        (least..=most).contains(&moved),
        "schedule_to_run moved {moved} ms (quick run p50 {}, p90 {}): outside {least}..={most}",
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
