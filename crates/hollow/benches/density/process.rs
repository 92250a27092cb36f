//! Figures of one fleet process (hollow or KWOK) read from /proc: CPU seconds and resident memory, and a
//! measuring window over them.

use std::collections::BTreeMap;
use std::time::Duration;

pub use testenv::process::{cpu_split, file_rss_bytes, machine_ticks, peak_rss_bytes, rss_bytes};

/// A fleet process's figures over one window.
pub struct Window {
    /// RSS at the end of the window.
    pub rss: u64,
    /// The most RSS the process has had since it started (its start-up and bursts included).
    pub peak_rss: u64,
    /// The file-backed part of `rss` (the binary's pages).
    pub file_rss: u64,
    /// CPU milliseconds per node per minute over the window.
    pub cpu_ms_per_node_minute: f64,
    /// The part of that CPU time the kernel spent for the process (system time).
    pub system_share: f64,
    /// The share of the machine's CPU time its hypervisor took over the window (steal).
    pub stolen_share: f64,
    /// API requests per second by "verb resource" (hollow's own accounting; empty for KWOK).
    pub requests: BTreeMap<String, f64>,
}

/// Measures `pid` over `idle`; `requests` reads the process's cumulative request counts (if it has any).
pub async fn window<F, Fut>(pid: u32, nodes: usize, idle: Duration, requests: F) -> anyhow::Result<Window>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<BTreeMap<String, f64>>>,
{
    let (user0, system0) = cpu_split(pid)?;
    let machine0 = machine_ticks()?;
    let req0 = requests().await?;
    let t0 = tokio::time::Instant::now();
    tokio::time::sleep(idle).await;
    let secs = t0.elapsed().as_secs_f64();
    let (user1, system1) = cpu_split(pid)?;
    let machine1 = machine_ticks()?;
    let (user, system) = (user1 - user0, system1 - system0);
    let cpu = user + system;
    let machine_total = machine1.0.saturating_sub(machine0.0).max(1);
    let req1 = requests().await?;
    let requests = req1
        .iter()
        .map(|(k, v)| (k.clone(), (v - req0.get(k).copied().unwrap_or(0.0)) / secs))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    Ok(Window {
        rss: rss_bytes(pid)?,
        peak_rss: peak_rss_bytes(pid)?,
        file_rss: file_rss_bytes(pid)?,
        cpu_ms_per_node_minute: cpu * 1000.0 / nodes as f64 / (secs / 60.0),
        system_share: if cpu > 0.0 { system / cpu } else { 0.0 },
        stolen_share: machine1.1.saturating_sub(machine0.1) as f64 / machine_total as f64,
        requests,
    })
}
