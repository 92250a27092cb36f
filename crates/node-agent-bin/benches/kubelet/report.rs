//! One agent's figures, and the printed comparison: each figure for node-agent and the kubelet, the ratio
//! node-agent/kubelet and whether it meets the aim (≤ 0.8 for latencies, ≤ 0.25 for RSS and CPU).

use crate::agent::{Kind, Leftovers};

/// What one agent measured.
pub struct Figures {
    pub kind: Kind,
    /// Agent start → its Node Ready with a pod CIDR.
    pub ready_secs: f64,
    pub idle_rss: u64,
    /// CPU seconds per minute over the idle window.
    pub idle_cpu: f64,
    /// Each single pod's create → Running, in seconds, in order.
    pub single: Vec<f64>,
    /// The burst's replicas.
    pub burst_pods: usize,
    /// The burst's Deployment create → all pods Running.
    pub burst_secs: f64,
    pub busy_rss: u64,
    pub busy_cpu: f64,
    /// What it left behind (removed).
    pub leftovers: Option<Leftovers>,
    /// What it changed outside its directories (undone).
    pub host_changes: Vec<String>,
}

impl Figures {
    pub fn new(kind: Kind) -> Self {
        Self {
            kind,
            ready_secs: 0.0,
            idle_rss: 0,
            idle_cpu: 0.0,
            single: Vec::new(),
            burst_pods: 0,
            burst_secs: 0.0,
            busy_rss: 0,
            busy_cpu: 0.0,
            leftovers: None,
            host_changes: Vec::new(),
        }
    }

    fn single_sorted(&self) -> Vec<f64> {
        let mut v = self.single.clone();
        v.sort_by(f64::total_cmp);
        v
    }

    /// The median single-pod time (the mean of the middle two for an even count).
    fn single_median(&self) -> f64 {
        let v = self.single_sorted();
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    fn single_spread(&self) -> String {
        let v = self.single_sorted();
        match (v.first(), v.last()) {
            (Some(lo), Some(hi)) => format!("{lo:.2}–{hi:.2} s"),
            _ => "—".to_owned(),
        }
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1_048_576.0
}

/// A table row: figure name, both values (as printed), the ratio and the aim (if the figure has one).
struct Row {
    what: String,
    ours: String,
    theirs: String,
    ratio: f64,
    aim: Option<f64>,
}

fn rows(ours: &Figures, theirs: &Figures) -> Vec<Row> {
    let secs = |v: f64| format!("{v:.2} s");
    let cpu = |v: f64| format!("{v:.3} CPU-s");
    let n = ours.single.len();
    vec![
        Row {
            what: format!("single pod create → Running, median of {n}"),
            ours: format!("{} ({})", secs(ours.single_median()), ours.single_spread()),
            theirs: format!("{} ({})", secs(theirs.single_median()), theirs.single_spread()),
            ratio: ours.single_median() / theirs.single_median(),
            aim: Some(0.8),
        },
        Row {
            what: format!("Deployment of {} create → all Running", ours.burst_pods),
            ours: secs(ours.burst_secs),
            theirs: secs(theirs.burst_secs),
            ratio: ours.burst_secs / theirs.burst_secs,
            aim: Some(0.8),
        },
        Row {
            what: "RSS idle".to_owned(),
            ours: format!("{:.1} MiB", mib(ours.idle_rss)),
            theirs: format!("{:.1} MiB", mib(theirs.idle_rss)),
            ratio: ours.idle_rss as f64 / theirs.idle_rss as f64,
            aim: Some(0.25),
        },
        Row {
            what: format!("RSS with {} pods running", ours.burst_pods),
            ours: format!("{:.1} MiB", mib(ours.busy_rss)),
            theirs: format!("{:.1} MiB", mib(theirs.busy_rss)),
            ratio: ours.busy_rss as f64 / theirs.busy_rss as f64,
            aim: Some(0.25),
        },
        Row {
            what: "CPU per idle minute".to_owned(),
            ours: cpu(ours.idle_cpu),
            theirs: cpu(theirs.idle_cpu),
            ratio: ours.idle_cpu / theirs.idle_cpu,
            aim: Some(0.25),
        },
        Row {
            what: format!("CPU per minute with {} pods running", ours.burst_pods),
            ours: cpu(ours.busy_cpu),
            theirs: cpu(theirs.busy_cpu),
            ratio: ours.busy_cpu / theirs.busy_cpu,
            aim: Some(0.25),
        },
        Row {
            what: "agent start → node Ready".to_owned(),
            ours: secs(ours.ready_secs),
            theirs: secs(theirs.ready_secs),
            ratio: ours.ready_secs / theirs.ready_secs,
            aim: None,
        },
    ]
}

/// "no pod cgroups", or how many per hierarchy with one example each.
fn pod_cgroups(paths: &[std::path::PathBuf]) -> String {
    if paths.is_empty() {
        return "no pod cgroups".to_owned();
    }
    let mut by_hierarchy: std::collections::BTreeMap<String, (usize, String)> = Default::default();
    for p in paths {
        let hierarchy = p
            .strip_prefix("/sys/fs/cgroup")
            .ok()
            .and_then(|r| r.components().next())
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .unwrap_or_default();
        let entry = by_hierarchy
            .entry(hierarchy)
            .or_insert_with(|| (0, p.display().to_string()));
        entry.0 += 1;
    }
    let parts: Vec<String> = by_hierarchy
        .iter()
        .map(|(h, (n, example))| format!("{n} in {h}, e.g. {example}"))
        .collect();
    format!("{} pod cgroups ({})", paths.len(), parts.join("; "))
}

fn leftovers_line(f: &Figures) -> String {
    let mut parts = Vec::new();
    if let Some(l) = &f.leftovers {
        if let Some(pid) = l.pid {
            parts.push(format!("stopped by PID {pid}, gone"));
        }
        parts.push(if l.mounts.is_empty() {
            "no mounts below its directory".to_owned()
        } else {
            format!(
                "{} mounts below its directory ({})",
                l.mounts.len(),
                l.mounts.join(", ")
            )
        });
        parts.push(format!(
            "{} cgroup directories under its cgroupRoot over all hierarchies, {}",
            l.cgroup_dirs,
            pod_cgroups(&l.pod_cgroups)
        ));
        let r = &l.runtime;
        parts.push(if r.is_empty() {
            "containerd empty".to_owned()
        } else {
            format!(
                "in containerd {} ready + {} stopped sandboxes, {} running + {} exited containers",
                r.ready_sandboxes, r.other_sandboxes, r.running_containers, r.other_containers
            )
        });
    }
    parts.push(if f.host_changes.is_empty() {
        "nothing changed outside its directories".to_owned()
    } else {
        format!("outside its directories: {}", f.host_changes.join(", "))
    });
    parts.join("; ")
}

/// Prints every agent's leftovers and, when both ran, the comparison table.
pub fn print(figures: &[Figures], settings: &str, load_before: &str, load_after: &str) {
    println!("\nkubelet benchmark: {settings}");
    println!("load average (1, 5, 15 min) at the start: {load_before}; at the end: {load_after}");
    let version = testenv::assets::kubernetes_version();
    for f in figures {
        let name = match f.kind {
            Kind::Kubelet => format!("kubelet {version}"),
            Kind::NodeAgent => "node-agent".to_owned(),
        };
        println!("{name} after it stopped (all removed): {}", leftovers_line(f));
        let singles: Vec<String> = f.single.iter().map(|s| format!("{s:.2}")).collect();
        println!("{name} single pods in order (s): {}", singles.join(" "));
    }
    let ours = figures.iter().find(|f| f.kind == Kind::NodeAgent);
    let theirs = figures.iter().find(|f| f.kind == Kind::Kubelet);
    let (Some(ours), Some(theirs)) = (ours, theirs) else {
        return;
    };
    println!("\n| figure | node-agent | kubelet {version} | node-agent/kubelet | aim | |");
    println!("|---|---:|---:|---:|---:|---|");
    for r in rows(ours, theirs) {
        let (aim, verdict) = match r.aim {
            Some(a) => (
                format!("≤ {a}"),
                if r.ratio <= a { "pass" } else { "fail" }.to_owned(),
            ),
            None => ("—".to_owned(), String::new()),
        };
        println!(
            "| {} | {} | {} | {:.2} | {aim} | {verdict} |",
            r.what, r.ours, r.theirs, r.ratio
        );
    }
}
