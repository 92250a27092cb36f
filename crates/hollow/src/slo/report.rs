//! What a run reports: the terminal table, clusterloader2 PerfData JSON (version, dataItems with
//! data/unit/labels, so existing perf dashboards ingest it), a per-pod CSV, and the report directory with
//! the plots and an index.html linking everything.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use super::apiserver;
use super::measure::{Definition, Percentiles, Transition, View};
use super::run::SloResult;

/// clusterloader2's PerfData.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct PerfData {
    /// Format version.
    pub version: String,
    /// One item per metric.
    #[serde(rename = "dataItems")]
    pub data_items: Vec<DataItem>,
    /// Labels of the whole set.
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub labels: BTreeMap<String, String>,
}

/// One PerfData item.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct DataItem {
    /// Values by name (`Perc50`, `Perc90`, `Perc99`, …).
    pub data: BTreeMap<String, f64>,
    /// Their unit.
    pub unit: String,
    /// What the item is.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

fn item(p: &Percentiles, labels: &[(&str, String)], with_max: bool) -> DataItem {
    let mut data = BTreeMap::from([
        ("Perc50".to_owned(), p.p50),
        ("Perc90".to_owned(), p.p90),
        ("Perc99".to_owned(), p.p99),
    ]);
    if with_max {
        data.insert("Perc100".to_owned(), p.max);
    }
    DataItem {
        data,
        unit: "ms".to_owned(),
        labels: labels.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect(),
    }
}

/// One view's transitions as clusterloader2's PodStartupLatency writes them, labelled with the definition.
fn view_perfdata(r: &SloResult, view: &View) -> PerfData {
    PerfData {
        version: "1.0".to_owned(),
        data_items: view
            .transitions
            .iter()
            .map(|s| {
                item(
                    &s.percentiles,
                    &[("Metric", s.transition.name().to_owned())],
                    false,
                )
            })
            .collect(),
        labels: BTreeMap::from([
            ("RunID".to_owned(), r.run_id.clone()),
            ("Definition".to_owned(), r.cluster.definition.name().to_owned()),
        ]),
    }
}

/// The cluster-side transitions over every pod, as clusterloader2's PodStartupLatency writes them.
pub fn pod_startup_perfdata(r: &SloResult) -> PerfData {
    view_perfdata(r, &r.cluster.all)
}

/// The same over the pods without an image pull or init containers.
pub fn without_pull_or_init_perfdata(r: &SloResult) -> PerfData {
    view_perfdata(r, &r.cluster.without_pull_or_init)
}

/// The fleet's merged node-side stages (and the kubelet SLI), one item per stage.
pub fn node_perfdata(r: &SloResult) -> Option<PerfData> {
    let fleet = r.fleet.as_ref()?;
    let mut items: Vec<DataItem> = fleet
        .rows()
        .iter()
        .map(|(name, p)| {
            item(
                p,
                &[("Metric", (*name).to_owned()), ("Count", p.count.to_string())],
                true,
            )
        })
        .collect();
    let sli = fleet.sli();
    items.push(item(
        &sli,
        &[
            ("Metric", "pod_start_sli".to_owned()),
            ("Count", sli.count.to_string()),
        ],
        true,
    ));
    Some(PerfData {
        version: "1.0".to_owned(),
        data_items: items,
        labels: BTreeMap::from([
            ("RunID".to_owned(), r.run_id.clone()),
            ("FleetProcesses".to_owned(), r.fleet_parts.len().to_string()),
        ]),
    })
}

/// The run's API request latency per verb and resource, as clusterloader2's APIResponsiveness.
pub fn api_perfdata(r: &SloResult) -> Option<PerfData> {
    let scrapes = r.api.as_ref().ok()?;
    let (first, last) = (scrapes.first()?, scrapes.last()?);
    let run = apiserver::delta(&last.by_resource, &first.by_resource);
    let items = run
        .iter()
        .filter(|(_, b)| apiserver::total(b) > 0)
        .map(|(key, b)| {
            let (verb, resource) = key.split_once(' ').unwrap_or((key, ""));
            let (resource, sub) = resource.split_once('/').unwrap_or((resource, ""));
            let q = |x| apiserver::quantile_ms(b, x);
            let p = Percentiles {
                count: usize::try_from(apiserver::total(b)).unwrap_or(usize::MAX),
                p50: q(0.5),
                p90: q(0.9),
                p99: q(0.99),
                max: 0.0,
            };
            item(
                &p,
                &[
                    ("Verb", verb.to_owned()),
                    ("Resource", resource.to_owned()),
                    ("Subresource", sub.to_owned()),
                    ("Count", p.count.to_string()),
                ],
                false,
            )
        })
        .collect();
    Some(PerfData {
        version: "v1".to_owned(),
        data_items: items,
        labels: BTreeMap::from([("RunID".to_owned(), r.run_id.clone())]),
    })
}

fn row(out: &mut String, name: &str, p: &Percentiles, extra: &str) {
    let line = format!(
        "  {name:<22} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1}  {extra}",
        p.count, p.p50, p.p90, p.p99, p.max
    );
    let _ = writeln!(out, "{}", line.trim_end());
}

/// A view's transitions, one row each; pods whose latency was negative as measured are named beside it.
fn view_rows(out: &mut String, view: &View, slo_figure: bool) {
    for t in &view.transitions {
        let mut extra = String::new();
        if slo_figure && t.transition == Transition::PodStartup {
            extra.push_str("<- the SLO's figure");
        }
        if t.clamped > 0 {
            if !extra.is_empty() {
                extra.push_str("; ");
            }
            let _ = write!(extra, "{} negative, counted as 0", t.clamped);
        }
        row(out, t.transition.name(), &t.percentiles, &extra);
    }
}

/// The terminal table.
pub fn table(r: &SloResult) -> String {
    let mut out = String::new();
    let c = &r.cluster;
    let _ = writeln!(
        out,
        "Pod start-up, run {} — {} pods measured, {} Running ({} pulled an image, {} have init containers){}",
        r.run_id,
        c.pods,
        c.running,
        c.pulled_image,
        c.init_containers,
        if c.schedule_from_watch > 0 {
            format!(
                "; {} pods' schedule time from the watch (no Scheduled event)",
                c.schedule_from_watch
            )
        } else {
            String::new()
        }
    );
    let header = format!(
        "  {:<22} {:>6} {:>9} {:>9} {:>9} {:>9}",
        "", "count", "p50 ms", "p90 ms", "p99 ms", "max ms"
    );
    let how = match c.definition {
        Definition::Current => "phases as its watch first saw them",
        Definition::Legacy => "legacy definition: creationTimestamp, Scheduled event, startedAt, watch",
    };
    let _ = writeln!(
        out,
        "Cluster side (clusterloader2 PodStartupLatency, {how}; every pod, nearest rank):"
    );
    let _ = writeln!(out, "{header}");
    view_rows(&mut out, &c.all, true);
    if c.without_pull_or_init.pods < c.all.pods {
        let _ = writeln!(
            out,
            "Cluster side without the {} pods that pulled an image or have init containers ({} pods):",
            c.all.pods - c.without_pull_or_init.pods,
            c.without_pull_or_init.pods
        );
        let _ = writeln!(out, "{header}");
        view_rows(&mut out, &c.without_pull_or_init, false);
    }
    if let Some(fleet) = &r.fleet {
        let _ = writeln!(
            out,
            "Node side ({} fleet process{}, HDR merged exactly, this run's pods only; each stage since the previous one):",
            r.fleet_parts.len(),
            if r.fleet_parts.len() == 1 { "" } else { "es" }
        );
        let _ = writeln!(out, "{header}");
        for (name, p) in fleet.rows() {
            let extra = if name == "pod_start" {
                "<- watch_observed -> status_reported"
            } else {
                ""
            };
            row(&mut out, name, &p, extra);
        }
        row(
            &mut out,
            "kubelet pod_start_sli",
            &fleet.sli(),
            "<- Prometheus buckets, interpolated",
        );
    }
    match &r.api {
        Ok(s) if s.len() >= 2 => {
            let run = apiserver::delta(&s[s.len() - 1].by_verb, &s[0].by_verb);
            let _ = writeln!(
                out,
                "API server request latency during the run (its /metrics, interpolated):"
            );
            let _ = writeln!(
                out,
                "  {:<22} {:>6} {:>9} {:>9} {:>9}",
                "verb", "count", "p50 ms", "p90 ms", "p99 ms"
            );
            for (verb, b) in run.iter().filter(|(_, b)| apiserver::total(b) > 0) {
                let q = |x| apiserver::quantile_ms(b, x);
                let _ = writeln!(
                    out,
                    "  {verb:<22} {:>6} {:>9.1} {:>9.1} {:>9.1}",
                    apiserver::total(b),
                    q(0.5),
                    q(0.9),
                    q(0.99)
                );
            }
        }
        Ok(_) => {}
        Err(e) => {
            let _ = writeln!(out, "API server /metrics not reachable: {e}");
        }
    }
    let l = &r.load;
    let _ = writeln!(
        out,
        "Load: {} objects created ({} pods expected), {} failed{}, {} churned; asked {:.1}/s, achieved {:.1}/s; creation phase {:.1}s, run {:.1}s",
        l.created,
        r.expected_pods,
        l.failed,
        l.first_error
            .as_ref()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default(),
        l.churned,
        l.asked_rate,
        l.achieved_rate,
        l.creation_phase.as_secs_f64(),
        r.elapsed.as_secs_f64()
    );
    if r.not_running > 0 {
        let _ = writeln!(
            out,
            "SLO not met: {} pods were not Running when the wait ended (--wait)",
            r.not_running
        );
    }
    for v in &r.verdicts {
        let _ = writeln!(
            out,
            "SLO {}: {} ({:.1} ms over {} pods)",
            v.threshold,
            if v.pass { "PASS" } else { "FAIL" },
            v.value_ms,
            v.samples
        );
    }
    out
}

fn csv_time(t: Option<k8s_openapi::jiff::Timestamp>) -> String {
    t.map(|t| t.to_string()).unwrap_or_default()
}

/// One line per pod: its phases and flags.
pub fn pods_csv(r: &SloResult) -> String {
    let mut out = String::from(
        "namespace,name,node,created,first_seen,bound_seen,scheduled_event,started,running_seen,init_containers,pulled_image,deleted\n",
    );
    for p in &r.records {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{}",
            p.namespace,
            p.name,
            p.node.as_deref().unwrap_or(""),
            csv_time(p.created),
            p.first_seen,
            csv_time(p.bound_seen),
            csv_time(p.scheduled_event),
            csv_time(p.started),
            csv_time(p.running_seen),
            p.init_containers,
            p.pulled_image,
            p.deleted
        );
    }
    out
}

/// Files of a written report.
#[derive(Debug, Clone)]
pub struct Written {
    /// The directory.
    pub dir: PathBuf,
    /// Every file written, relative to `dir`.
    pub files: Vec<String>,
}

fn write(dir: &Path, name: &str, bytes: &[u8], files: &mut Vec<String>) -> anyhow::Result<()> {
    std::fs::write(dir.join(name), bytes).with_context(|| format!("writing {}", dir.join(name).display()))?;
    files.push(name.to_owned());
    Ok(())
}

/// Writes the report directory: summary.txt, the PerfData JSON files, pods.csv, the plots and index.html.
pub fn write_dir(r: &SloResult, dir: &Path) -> anyhow::Result<Written> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut files = Vec::new();
    let text = table(r);
    write(dir, "summary.txt", text.as_bytes(), &mut files)?;
    let json = |p: &PerfData| serde_json::to_vec_pretty(p);
    write(
        dir,
        &format!("PodStartupLatency_{}.json", r.run_id),
        &json(&pod_startup_perfdata(r))?,
        &mut files,
    )?;
    write(
        dir,
        &format!("WithoutPullOrInitPodStartupLatency_{}.json", r.run_id),
        &json(&without_pull_or_init_perfdata(r))?,
        &mut files,
    )?;
    if let Some(p) = node_perfdata(r) {
        write(
            dir,
            &format!("NodeStartupStages_{}.json", r.run_id),
            &json(&p)?,
            &mut files,
        )?;
    }
    if let Some(p) = api_perfdata(r) {
        write(
            dir,
            &format!("APIResponsiveness_{}.json", r.run_id),
            &json(&p)?,
            &mut files,
        )?;
    }
    write(dir, "pods.csv", pods_csv(r).as_bytes(), &mut files)?;
    let plots = super::plots::write_all(r, dir)?;
    files.extend(plots.iter().cloned());
    let html = index_html(r, &text, &files);
    write(dir, "index.html", html.as_bytes(), &mut files)?;
    Ok(Written {
        dir: dir.to_owned(),
        files,
    })
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn index_html(r: &SloResult, text: &str, files: &[String]) -> String {
    let mut body = String::new();
    let _ = writeln!(body, "<h1>Pod start-up SLO, run {}</h1>", escape(&r.run_id));
    let _ = writeln!(
        body,
        "<p>Started {}; {}.</p>",
        r.started,
        if r.pass() {
            "<b>SLO met</b>"
        } else {
            "<b>SLO not met</b>"
        }
    );
    let _ = writeln!(body, "<pre>{}</pre>", escape(text));
    for f in files.iter().filter(|f| f.ends_with(".svg")) {
        let png = f.replace(".svg", ".png");
        let _ = writeln!(
            body,
            "<figure><a href=\"{f}\"><img src=\"{f}\" width=\"900\" alt=\"{f}\"></a>\
             <figcaption><a href=\"{f}\">{f}</a> · <a href=\"{png}\">{png}</a></figcaption></figure>"
        );
    }
    let _ = writeln!(body, "<h2>Data</h2><ul>");
    for f in files
        .iter()
        .filter(|f| !f.ends_with(".svg") && !f.ends_with(".png"))
    {
        let _ = writeln!(body, "<li><a href=\"{f}\">{f}</a></li>");
    }
    let _ = writeln!(body, "</ul>");
    format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Pod start-up SLO {}</title>\
         <style>body{{font-family:sans-serif;margin:2em}} pre{{background:#f4f4f4;padding:1em}}</style></head>\
         <body>\n{body}</body></html>\n",
        escape(&r.run_id)
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::slo::load::LoadOutcome;
    use crate::slo::measure::side_with_pod_startup;
    use crate::slo::threshold::{Threshold, verdicts};

    fn result(not_running: usize) -> SloResult {
        let mut cluster = side_with_pod_startup(vec![800.0, 1200.0]);
        cluster.pods += not_running;
        SloResult {
            run_id: "r".into(),
            started: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            records: Vec::new(),
            verdicts: verdicts(&cluster, &[Threshold::default()]),
            cluster,
            fleet: None,
            fleet_parts: Vec::new(),
            load: LoadOutcome {
                created: 2 + not_running as u64,
                failed: 0,
                first_error: None,
                churned: 0,
                asked_rate: 10.0,
                achieved_rate: 9.5,
                creation_phase: Duration::from_secs(1),
                created_namespaces: Vec::new(),
            },
            expected_pods: 2 + not_running as u64,
            not_running,
            api: Err("forbidden".into()),
            elapsed: Duration::from_secs(2),
        }
    }

    #[test]
    fn the_table_says_the_verdict_and_pods_that_never_ran_fail_it() {
        let ok = result(0);
        assert!(ok.pass());
        let text = table(&ok);
        assert!(
            text.contains("SLO pod_startup p99 <= 5000ms: PASS (1200.0 ms over 2 pods)"),
            "{text}"
        );
        assert!(text.contains("asked 10.0/s, achieved 9.5/s"), "{text}");
        assert!(
            text.contains("API server /metrics not reachable: forbidden"),
            "{text}"
        );
        assert!(text.lines().all(|l| l == l.trim_end()), "no trailing blanks");
        let stuck = result(3);
        assert!(
            !stuck.pass(),
            "3 pods never ran: the SLO is not met whatever the percentiles"
        );
        assert!(table(&stuck).contains("SLO not met: 3 pods were not Running"));
        let perf = pod_startup_perfdata(&ok);
        assert_eq!(perf.version, "1.0");
        let item = &perf.data_items[0];
        assert_eq!(
            (item.unit.as_str(), item.labels["Metric"].as_str()),
            ("ms", "pod_startup")
        );
        assert_eq!(item.data["Perc99"], 1200.0);
    }
}
