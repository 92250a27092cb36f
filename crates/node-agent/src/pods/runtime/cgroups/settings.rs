//! The values written into the cgroups' files, as the kubelet computes them: `cpu.shares` from millicores, the CFS
//! quota of a cpu limit, a pod cgroup's `(file, value)` pairs by QoS class, and the cgroup v2 file and value
//! that stand for each v1 setting (`cpu.weight`, `cpu.max`, `memory.max`). Nothing here touches the machine.

use crate::pods::model::resources::QosClass;
use crate::pods::model::spec::DesiredPod;

/// The kernel's smallest `cpu.shares`.
pub(super) const MIN_SHARES: i64 = 2;

/// The kernel's largest `cpu.shares`.
pub(super) const MAX_SHARES: i64 = 262_144;

/// The CFS period the kubelet uses, in microseconds.
const CFS_PERIOD_US: i64 = 100_000;

/// The smallest CFS quota, in microseconds.
pub(super) const MIN_QUOTA_US: i64 = 1000;

/// `cpu.shares` for `milli` millicores.
pub fn shares(milli: i64) -> i64 {
    if milli <= 0 {
        return MIN_SHARES;
    }
    (milli * 1024 / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// `cpu.weight` (cgroup v2) for `cpu.shares`, mapping the shares' range `[2, 262144]` onto `[1, 10000]` as
/// the kubelet does.
pub fn weight(shares: i64) -> i64 {
    if shares >= MAX_SHARES {
        return 10_000;
    }
    1 + (shares.max(MIN_SHARES) - MIN_SHARES) * 9999 / (MAX_SHARES - MIN_SHARES)
}

/// The cgroup v2 file and value that stand for the v1 setting `(file, value)`: `cpu.shares` becomes
/// `cpu.weight`, `memory.limit_in_bytes` `memory.max`, `pids.max` stays; the CFS period and quota become one
/// `cpu.max` (`quota period`), written when the quota comes. `None`: nothing to write for this one.
pub fn v2_setting(file: &str, value: &str) -> Option<(&'static str, String)> {
    match file {
        "cpu.shares" => Some((
            "cpu.weight",
            weight(value.parse().unwrap_or(MIN_SHARES)).to_string(),
        )),
        "cpu.cfs_period_us" => None,
        "cpu.cfs_quota_us" => Some(("cpu.max", format!("{value} {CFS_PERIOD_US}"))),
        "memory.limit_in_bytes" => Some(("memory.max", value.to_owned())),
        "pids.max" => Some(("pids.max", value.to_owned())),
        _ => None,
    }
}

/// `cpu.cfs_quota_us` for a limit of `milli` millicores over the 100 ms period.
pub(super) fn quota(milli: i64) -> i64 {
    (milli * CFS_PERIOD_US / 1000).max(MIN_QUOTA_US)
}

/// What a pod cgroup is given: `(file, value)` pairs, written in order.
pub fn pod_settings(pod: &DesiredPod, pids_limit: i64) -> Vec<(&'static str, String)> {
    let limits = pod.limits();
    let mut out = Vec::new();
    match pod.qos {
        QosClass::BestEffort => out.push(("cpu.shares", MIN_SHARES.to_string())),
        QosClass::Guaranteed | QosClass::Burstable => {
            out.push(("cpu.shares", shares(pod.requests().cpu_milli).to_string()));
            if let Some(cpu) = limits.cpu_milli.filter(|m| *m > 0) {
                out.push(("cpu.cfs_period_us", CFS_PERIOD_US.to_string()));
                out.push(("cpu.cfs_quota_us", quota(cpu).to_string()));
            }
            if let Some(memory) = limits.memory.filter(|m| *m > 0) {
                out.push(("memory.limit_in_bytes", memory.to_string()));
            }
        }
    }
    if pids_limit > 0 {
        out.push(("pids.max", pids_limit.to_string()));
    }
    out
}
