//! What a real node's kubelet does to the machine outside its pods: node allocatable enforcement
//! (`enforceNodeAllocatable`) on the pods' cgroup `kubepods` and on the reservation cgroups
//! (`kubeReservedCgroup`, `systemReservedCgroup`), and its own `oom_score_adj` (`oomScoreAdj`).
//!
//! As the kubelet, `kubepods` is always given the node's capacity (cpu as a weight, memory, processes), and with
//! `pods` enforced the capacity less `kubeReserved` and `systemReserved` — the hard eviction thresholds are not
//! subtracted there: they are the eviction manager's to keep. `kube-reserved` / `system-reserved` limit their
//! cgroup to the reservation (`-compressible`: its cpu weight alone). Huge pages go the same way: `kubepods` gets
//! the node's huge pages of each size (less those reserved, with `pods` enforced), a reservation cgroup the huge
//! pages its reservation names ([`hugepages`]).

use std::sync::Arc;

use crate::config::{AgentConfig, KubeletConfig};
use crate::pods::runtime::cgroups::{CgroupError, NodeLimits, QosCgroups};
use crate::quantity::Quantity;
use std::collections::BTreeMap;

/// The most processes the machine can have, as the kubelet counts its `pid` capacity: the lower of
/// `kernel.pid_max` and `kernel.threads-max`. `None` when neither can be read.
pub fn pid_capacity() -> Option<i64> {
    let read = |f: &str| {
        std::fs::read_to_string(f)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
    };
    match (
        read("/proc/sys/kernel/pid_max"),
        read("/proc/sys/kernel/threads-max"),
    ) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The node's capacity as the cgroups see it: cpu, memory and processes.
pub fn capacity(config: &AgentConfig, pids: Option<i64>) -> NodeLimits {
    NodeLimits {
        cpu_milli: Some(i64::try_from(config.machine.cpu_millis).unwrap_or(i64::MAX)),
        memory: Some(i64::try_from(config.machine.memory_bytes).unwrap_or(i64::MAX)),
        pids,
    }
}

fn reserved(map: &BTreeMap<String, Quantity>, name: &str, milli: bool) -> i64 {
    map.get(name)
        .map(|q| if milli { q.milli() } else { q.value() })
        .and_then(|v| i64::try_from(v).ok())
        .unwrap_or(0)
}

/// What `kubepods` is limited to: `capacity`, less the kube and system reservations when `pods` is enforced,
/// never below zero.
pub fn kubepods_limits(k: &KubeletConfig, capacity: NodeLimits) -> NodeLimits {
    if !k.enforce_node_allocatable.iter().any(|v| v == "pods") {
        return capacity;
    }
    let less = |v: Option<i64>, name: &str, milli: bool| {
        v.map(|v| {
            (v - reserved(&k.kube_reserved, name, milli) - reserved(&k.system_reserved, name, milli)).max(0)
        })
    };
    NodeLimits {
        cpu_milli: less(capacity.cpu_milli, "cpu", true),
        memory: less(capacity.memory, "memory", false),
        pids: less(capacity.pids, "pid", false),
    }
}

/// A reservation as the limits of its cgroup: only what it names.
pub fn reservation_limits(map: &BTreeMap<String, Quantity>) -> NodeLimits {
    let get = |name: &str, milli: bool| map.contains_key(name).then(|| reserved(map, name, milli));
    NodeLimits {
        cpu_milli: get("cpu", true),
        memory: get("memory", false),
        pids: get("pid", false),
    }
}

/// The huge pages `kubepods` (with `reserved`: less the reservations, never below zero) or a reservation cgroup is
/// limited to, bytes by page size: `capacity` (page size, total) less what `reserved` names, or with no capacity
/// given, what `reserved` names.
pub fn hugepages(
    capacity: Option<&[(u64, u64)]>,
    reserved: &[&BTreeMap<String, Quantity>],
) -> BTreeMap<u64, u64> {
    let named = |size: u64| -> u64 {
        reserved
            .iter()
            .flat_map(|map| map.iter())
            .filter(|(name, _)| crate::pods::model::resources::hugepage_size(name) == Some(size))
            .map(|(_, q)| u64::try_from(q.value()).unwrap_or(0))
            .sum()
    };
    match capacity {
        Some(capacity) => capacity
            .iter()
            .map(|(size, total)| (*size, total.saturating_sub(named(*size))))
            .collect(),
        None => reserved
            .iter()
            .flat_map(|map| map.keys())
            .filter_map(|name| crate::pods::model::resources::hugepage_size(name))
            .map(|size| (size, named(size)))
            .collect(),
    }
}

/// Applies node allocatable enforcement to `cgroups` as `config` asks.
pub async fn enforce(cgroups: &Arc<QosCgroups>, config: &AgentConfig) -> Result<(), CgroupError> {
    let k = &config.kubelet;
    let limits = kubepods_limits(k, capacity(config, pid_capacity()));
    let pods_enforced = k.enforce_node_allocatable.iter().any(|v| v == "pods");
    let reserved: &[&BTreeMap<String, Quantity>] = if pods_enforced {
        &[&k.kube_reserved, &k.system_reserved]
    } else {
        &[]
    };
    let huge = hugepages(Some(&config.machine.hugepages), reserved);
    cgroups.limit_kubepods(&limits, &huge).await?;
    tracing::info!(kubepods = %cgroups.kubepods(), ?limits, "node allocatable enforced on the pods' cgroup");
    for (value, cgroup, map) in [
        ("kube-reserved", &k.kube_reserved_cgroup, &k.kube_reserved),
        ("system-reserved", &k.system_reserved_cgroup, &k.system_reserved),
    ] {
        let compressible = format!("{value}-compressible");
        let full = k.enforce_node_allocatable.iter().any(|v| v == value);
        let cpu_only = k.enforce_node_allocatable.contains(&compressible);
        if !full && !cpu_only {
            continue;
        }
        cgroups
            .limit_existing(
                cgroup,
                &reservation_limits(map),
                cpu_only,
                &if cpu_only {
                    BTreeMap::new()
                } else {
                    hugepages(None, &[map])
                },
            )
            .await?;
        tracing::info!(%cgroup, enforcement = value, "reservation enforced on its cgroup");
    }
    Ok(())
}

/// Sets the agent's own `oom_score_adj` to `oomScoreAdj`; a failure (no privilege to lower it) is logged, as the
/// kubelet logs it, and the agent goes on.
pub fn apply_own_oom_score(score: i64) {
    let file = "/proc/self/oom_score_adj";
    match std::fs::write(file, score.to_string()) {
        Ok(()) => tracing::info!(score, "oom_score_adj of the agent set"),
        Err(error) => tracing::warn!(score, %error, "cannot set the agent's oom_score_adj (oomScoreAdj)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubelet(yaml: &str) -> KubeletConfig {
        let text = format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{yaml}");
        crate::config::resolve_kubelet_config(&crate::config::LoadedConfig::parse(&text, "t.yaml").unwrap())
            .unwrap()
    }

    const GI: i64 = 1 << 30;

    #[test]
    fn kubepods_gets_capacity_less_the_reservations_when_pods_are_enforced() {
        let capacity = NodeLimits {
            cpu_milli: Some(4000),
            memory: Some(8 * GI),
            pids: Some(100_000),
        };
        let k = kubelet(
            "kubeReserved: {cpu: 500m, memory: 1Gi, pid: \"1000\"}\nsystemReserved: {cpu: 250m, memory: 512Mi}\n\
             evictionHard: {memory.available: 300Mi}\n",
        );
        assert_eq!(k.enforce_node_allocatable, ["pods"]);
        let limits = kubepods_limits(&k, capacity);
        assert_eq!(
            limits,
            NodeLimits {
                cpu_milli: Some(3250),
                memory: Some(8 * GI - GI - GI / 2),
                pids: Some(99_000),
            },
            "the eviction threshold stays out of the cgroup's limit"
        );
        assert_eq!(
            limits.settings(false),
            [
                ("cpu.shares", "3328".to_owned()),
                ("memory.limit_in_bytes", (6 * GI + GI / 2).to_string()),
                ("pids.max", "99000".to_owned()),
            ]
        );
        let none = kubelet("kubeReserved: {cpu: 500m}\nenforceNodeAllocatable: [none]\n");
        assert_eq!(kubepods_limits(&none, capacity), capacity);
    }

    #[test]
    fn huge_pages_are_the_capacity_less_the_reservations() {
        let k = kubelet("kubeReserved: {hugepages-2Mi: 4Mi}\nsystemReserved: {hugepages-2048Ki: 2Mi}\n");
        let capacity = [(2 << 20, 16 << 20), (1 << 30, 0)];
        assert_eq!(
            hugepages(Some(&capacity), &[&k.kube_reserved, &k.system_reserved]),
            BTreeMap::from([(2 << 20, 10 << 20), (1 << 30, 0)]),
            "two spellings of one size both count"
        );
        assert_eq!(
            hugepages(None, &[&k.kube_reserved]),
            BTreeMap::from([(2 << 20, 4 << 20)])
        );
    }

    #[test]
    fn a_reservation_limits_only_what_it_names() {
        let k = kubelet(
            "kubeReserved: {memory: 1Gi}\nkubeReservedCgroup: /kube.slice\n\
             enforceNodeAllocatable: [pods, kube-reserved-compressible]\n",
        );
        let r = reservation_limits(&k.kube_reserved);
        assert_eq!(
            r,
            NodeLimits {
                cpu_milli: None,
                memory: Some(GI),
                pids: None
            }
        );
        assert!(r.settings(true).is_empty());
    }
}
