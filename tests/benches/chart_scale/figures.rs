//! What the chart benchmark reads while the fleet runs: each fleet process found on the real node (its
//! container's process, in the node's cgroups), its resident memory and CPU time from /proc; the API server's
//! own request counts (`apiserver_request_total`) and the CPU time of the control plane's API server and etcd;
//! and windows between two such samples.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context;
use testenv::process::{cpu_seconds, machine_ticks, peak_rss_bytes, rss_bytes};

/// The PID of every fleet process of `release` (`<release>-hollow-<i>`, `i` below `processes`) that runs in the
/// cgroups below `cgroup_root` (the real node's own: a fleet of another run on this machine is not counted);
/// an error naming the ones not found.
pub fn fleet_pids(cgroup_root: &str, release: &str, processes: usize) -> anyhow::Result<Vec<u32>> {
    let mut found: BTreeMap<usize, u32> = BTreeMap::new();
    let prefix = format!("--pod-name={release}-hollow-");
    for entry in std::fs::read_dir("/proc")? {
        let Ok(pid) = entry?.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        // a process may end between the listing and the read: it is not one of ours then
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if !(args.first().is_some_and(|a| a.ends_with("hollow")) && args.get(1).is_some_and(|a| a == "run")) {
            continue;
        }
        let Some(ordinal) = args
            .iter()
            .find_map(|a| a.strip_prefix(&prefix).and_then(|i| i.parse::<usize>().ok()))
        else {
            continue;
        };
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if ordinal < processes && cgroup.contains(&format!("{cgroup_root}/")) {
            found.insert(ordinal, pid);
        }
    }
    let missing: Vec<usize> = (0..processes).filter(|i| !found.contains_key(i)).collect();
    anyhow::ensure!(
        missing.is_empty(),
        "no process of fleet pod(s) {missing:?} of {release} in the cgroups below {cgroup_root}"
    );
    Ok(found.into_values().collect())
}

/// The API server's `apiserver_request_total` summed by "VERB resource".
pub async fn api_requests(client: &kube::Client) -> anyhow::Result<BTreeMap<String, f64>> {
    let mut out = BTreeMap::new();
    for c in testenv::server_metrics::request_counts(client).await? {
        *out.entry(format!("{} {}", c.label("verb"), c.label("resource")))
            .or_insert(0.0) += c.value;
    }
    Ok(out)
}

/// Everything read at one moment.
pub struct Sample {
    at: Instant,
    /// Per fleet process: resident bytes, CPU seconds so far.
    fleet: Vec<(u64, f64)>,
    requests: BTreeMap<String, f64>,
    apiserver_cpu: f64,
    etcd_cpu: f64,
    machine: (u64, u64),
}

/// The control plane's processes whose CPU time is read.
pub struct ControlPlanePids {
    /// kube-apiserver's PID.
    pub apiserver: u32,
    /// etcd's PID.
    pub etcd: u32,
}

impl ControlPlanePids {
    /// The PIDs of `cp`'s API server and etcd (a control plane this process started).
    pub fn of(cp: &testenv::ControlPlane) -> anyhow::Result<Self> {
        let pid = |name: &str| {
            cp.info()
                .pids
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, p)| *p)
                .with_context(|| format!("the control plane's {name} process"))
        };
        Ok(Self {
            apiserver: pid("kube-apiserver")?,
            etcd: pid("etcd")?,
        })
    }
}

/// Reads the fleet processes' RSS and CPU, the API server's request counts and the control plane's CPU now.
pub async fn sample(client: &kube::Client, fleet: &[u32], cp: &ControlPlanePids) -> anyhow::Result<Sample> {
    let requests = api_requests(client).await?;
    let fleet = fleet
        .iter()
        .map(|&pid| Ok((rss_bytes(pid)?, cpu_seconds(pid)?)))
        .collect::<anyhow::Result<_>>()?;
    Ok(Sample {
        at: Instant::now(),
        fleet,
        requests,
        apiserver_cpu: cpu_seconds(cp.apiserver)?,
        etcd_cpu: cpu_seconds(cp.etcd)?,
        machine: machine_ticks()?,
    })
}

/// The figures between two samples.
pub struct Window {
    /// The window's length.
    pub secs: f64,
    /// Per fleet process at the window's end: resident bytes.
    pub rss: Vec<u64>,
    /// Per fleet process: CPU cores used over the window.
    pub fleet_cores: Vec<f64>,
    /// API server requests per second by "VERB resource".
    pub requests: BTreeMap<String, f64>,
    /// CPU cores kube-apiserver used over the window.
    pub apiserver_cores: f64,
    /// CPU cores etcd used over the window.
    pub etcd_cores: f64,
    /// The machine's CPU its hypervisor took over the window.
    pub stolen_share: f64,
}

impl Window {
    /// The figures from `a` to `b`.
    pub fn between(a: &Sample, b: &Sample) -> Window {
        let secs = b.at.duration_since(a.at).as_secs_f64().max(1e-3);
        let requests = b
            .requests
            .iter()
            .map(|(k, v)| (k.clone(), (v - a.requests.get(k).copied().unwrap_or(0.0)) / secs))
            .filter(|(_, v)| *v > 0.0)
            .collect();
        Window {
            secs,
            rss: b.fleet.iter().map(|f| f.0).collect(),
            fleet_cores: a
                .fleet
                .iter()
                .zip(&b.fleet)
                .map(|(x, y)| (y.1 - x.1) / secs)
                .collect(),
            requests,
            apiserver_cores: (b.apiserver_cpu - a.apiserver_cpu) / secs,
            etcd_cores: (b.etcd_cpu - a.etcd_cpu) / secs,
            stolen_share: b.machine.1.saturating_sub(a.machine.1) as f64
                / b.machine.0.saturating_sub(a.machine.0).max(1) as f64,
        }
    }

    /// The fleet's resident bytes at the window's end, all processes.
    pub fn total_rss(&self) -> u64 {
        self.rss.iter().sum()
    }

    /// CPU cores the fleet used, all processes.
    pub fn fleet_cores(&self) -> f64 {
        self.fleet_cores.iter().sum()
    }

    /// The fleet's CPU milliseconds per node per minute.
    pub fn cpu_ms_per_node_minute(&self, nodes: usize) -> f64 {
        self.fleet_cores() * 1000.0 * 60.0 / nodes as f64
    }

    /// API server requests per second, every kind.
    pub fn requests_per_sec(&self) -> f64 {
        self.requests.values().sum()
    }

    /// Lease renewals the API server answered per second.
    pub fn lease_updates_per_sec(&self) -> f64 {
        self.requests.get("PUT leases").copied().unwrap_or(0.0)
    }

    /// The `n` request kinds with the highest rate, as "VERB resource R/s".
    pub fn top_requests(&self, n: usize) -> String {
        let mut by_rate: Vec<(&String, &f64)> = self.requests.iter().collect();
        by_rate.sort_by(|a, b| b.1.total_cmp(a.1));
        by_rate
            .iter()
            .take(n)
            .map(|(k, v)| format!("{k} {v:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Each fleet process's most resident memory so far (VmHWM).
pub fn peak_rss(fleet: &[u32]) -> anyhow::Result<Vec<u64>> {
    fleet.iter().map(|&pid| peak_rss_bytes(pid)).collect()
}
