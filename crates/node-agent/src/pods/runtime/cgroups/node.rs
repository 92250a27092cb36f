//! The node-level limits (node allocatable enforcement): those of `kubepods`, and of the existing cgroups of
//! `kube-reserved` and `system-reserved`.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::settings::shares;
use super::{CgroupError, QosCgroups, systemd};

/// What a node-level cgroup is limited to (node allocatable enforcement): `None` leaves that limit as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeLimits {
    /// Millicores, given as `cpu.shares` (a weight, as the kubelet gives it, never a quota).
    pub cpu_milli: Option<i64>,
    /// Bytes of memory.
    pub memory: Option<i64>,
    /// Processes.
    pub pids: Option<i64>,
}

impl NodeLimits {
    /// The settings written for these limits: all of them, or with `compressible_only` the cpu weight alone.
    pub fn settings(&self, compressible_only: bool) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(cpu) = self.cpu_milli {
            out.push(("cpu.shares", shares(cpu).to_string()));
        }
        if compressible_only {
            return out;
        }
        if let Some(memory) = self.memory {
            out.push(("memory.limit_in_bytes", memory.to_string()));
        }
        if let Some(pids) = self.pids {
            out.push(("pids.max", pids.to_string()));
        }
        out
    }
}

impl QosCgroups {
    /// Limits `kubepods` (node allocatable enforcement; the node's capacity when only the weight is to be
    /// right), its huge pages to `hugepages` (bytes by page size; 0 for a size not named).
    pub async fn limit_kubepods(
        self: &Arc<Self>,
        limits: &NodeLimits,
        hugepages: &BTreeMap<u64, u64>,
    ) -> Result<(), CgroupError> {
        self.apply(&self.kubepods.clone(), limits.settings(false), false)
            .await?;
        self.apply_hugetlb(self.kubepods.clone(), hugepages, 0).await
    }

    /// Limits the existing cgroup at `path` (as in the hierarchy, e.g. `/system.slice` with the systemd driver)
    /// to `limits`, or with `compressible_only` its cpu weight alone, and its huge pages to `hugepages` (0 for the
    /// sizes not named, whatever `compressible_only` says, as the kubelet writes them): the enforcement of
    /// `kube-reserved` / `system-reserved` on their cgroups. A cgroup that does not exist is an error, as with the kubelet.
    pub async fn limit_existing(
        self: &Arc<Self>,
        path: &str,
        limits: &NodeLimits,
        compressible_only: bool,
        hugepages: &BTreeMap<u64, u64>,
    ) -> Result<(), CgroupError> {
        let name = if self.systemd.is_some() {
            systemd::cgroup_name(path)
        } else {
            path.to_owned()
        };
        if !self.hierarchies.iter().all(|h| self.dir(h, &name).is_dir()) {
            let dir = self.dir(&self.hierarchies[0], &name);
            return Err(CgroupError::Io {
                path: dir,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "the cgroup does not exist"),
            });
        }
        self.apply(&name, limits.settings(compressible_only), false)
            .await?;
        self.apply_hugetlb(name, hugepages, 0).await
    }
}
