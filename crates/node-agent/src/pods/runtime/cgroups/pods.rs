//! The pods' cgroups: their names and the path the runtime is handed as the sandbox's `cgroup_parent`, made with
//! the pod's limits before its sandbox, written again on an in-place resize, removed with the pod, and found and
//! removed when the node no longer has the pod (the orphan sweep); and the burstable cgroup's `cpu.shares`, which
//! follows the sum of the Burstable pods' cpu requests.

use std::path::PathBuf;
use std::sync::Arc;

use super::settings::{pod_settings, shares};
use super::{CgroupError, QosCgroups, blocking, systemd};
use crate::pods::model::resources::QosClass;
use crate::pods::model::spec::DesiredPod;

impl QosCgroups {
    /// The pod's cgroup as the runtime is handed it (its `cgroup_parent`): `…/kubepods[/burstable|/besteffort]/pod<uid>`
    /// with cgroupfs, the slice `kubepods[-burstable|-besteffort]-pod<uid>.slice` with systemd.
    pub fn pod_path(&self, qos: QosClass, uid: &str) -> String {
        let name = self.pod_name(qos, uid);
        if self.systemd.is_some() {
            systemd::unit_and_parent(&systemd::expand(&name)).0
        } else {
            name
        }
    }

    /// The directory of pod `uid`'s cgroup in the unified hierarchy of a cgroup v2 host, whatever its QoS class,
    /// where it exists (the pod's figures are read there when the runtime gives none). Blocking (a stat or
    /// three).
    pub fn pod_dir_v2(&self, uid: &str) -> Option<PathBuf> {
        if !self.v2 {
            return None;
        }
        let h = self.hierarchies.first()?;
        [QosClass::Guaranteed, QosClass::Burstable, QosClass::BestEffort]
            .into_iter()
            .map(|qos| self.dir(h, &self.pod_name(qos, uid)))
            .find(|dir| dir.is_dir())
    }

    /// The pod's cgroup name: `…/kubepods[/burstable|/besteffort]/pod<uid>`.
    pub(super) fn pod_name(&self, qos: QosClass, uid: &str) -> String {
        match qos {
            QosClass::Guaranteed => format!("{}/pod{uid}", self.kubepods),
            QosClass::Burstable => format!("{}/burstable/pod{uid}", self.kubepods),
            QosClass::BestEffort => format!("{}/besteffort/pod{uid}", self.kubepods),
        }
    }

    /// The burstable cgroup's `cpu.shares`: from the sum of its pods' cpu requests.
    fn burstable_settings(&self) -> Vec<(&'static str, String)> {
        let sum: i64 = self
            .burstable
            .lock()
            .map(|m| m.values().sum())
            .unwrap_or_default();
        vec![("cpu.shares", shares(sum).to_string())]
    }

    pub(super) fn write_burstable(&self) -> Result<(), CgroupError> {
        for (file, value) in self.burstable_settings() {
            self.write(&format!("{}/burstable", self.kubepods), file, &value)?;
        }
        Ok(())
    }

    pub(super) async fn update_burstable(self: &Arc<Self>) -> Result<(), CgroupError> {
        let settings = self.burstable_settings();
        self.apply(&format!("{}/burstable", self.kubepods), settings, false)
            .await
    }

    /// Records `pod`'s cpu request when it is Burstable, and writes the burstable cgroup's shares again when that
    /// changed their sum.
    async fn track_burstable(self: &Arc<Self>, pod: &DesiredPod) -> Result<(), CgroupError> {
        let changed = match self.burstable.lock() {
            Ok(mut m) if pod.qos == QosClass::Burstable => {
                m.insert(pod.uid.to_string(), pod.requests().cpu_milli) != Some(pod.requests().cpu_milli)
            }
            _ => false,
        };
        if changed {
            self.update_burstable().await?;
        }
        Ok(())
    }

    /// Makes sure `pod`'s cgroup exists with its limits (created once; an existing one is left as it is).
    pub async fn ensure(self: &Arc<Self>, pod: &DesiredPod) -> Result<(), CgroupError> {
        self.track_burstable(pod).await?;
        let name = self.pod_name(pod.qos, &pod.uid);
        // a stat per hierarchy: cheap enough not to leave the async thread
        if self.hierarchies.iter().all(|h| self.dir(h, &name).is_dir()) {
            return Ok(());
        }
        self.apply(&name, pod_settings(pod, self.pids_limit), true)
            .await?;
        self.apply_hugetlb(name, &pod.hugepages(), 0).await
    }

    /// Writes `pod`'s limits again into its existing cgroup (an in-place resize changed them), and the
    /// burstable cgroup's shares.
    pub async fn resize(self: &Arc<Self>, pod: &DesiredPod) -> Result<(), CgroupError> {
        self.track_burstable(pod).await?;
        let name = self.pod_name(pod.qos, &pod.uid);
        self.apply(&name, pod_settings(pod, self.pids_limit), false)
            .await?;
        self.apply_hugetlb(name, &pod.hugepages(), 0).await
    }

    /// Removes `pod`'s cgroup (and whatever the runtime left inside, processes killed: see [`super::leftovers`])
    /// from every hierarchy — with systemd, stops its slice first; a cgroup whose processes do not go stays
    /// (logged).
    pub async fn remove(self: &Arc<Self>, pod: &DesiredPod) {
        let changed = self
            .burstable
            .lock()
            .map(|mut m| m.remove(&*pod.uid).is_some())
            .unwrap_or(false);
        let name = self.pod_name(pod.qos, &pod.uid);
        let mut result = self.remove_cgroup(name).await;
        if changed && result.is_ok() {
            result = self.update_burstable().await;
        }
        if let Err(error) = result {
            tracing::warn!(pod = %pod.display(), %error, "cannot remove the pod's cgroup");
        }
    }

    /// Stops the slice of `cgroup` (systemd driver) and removes its directories wherever they are.
    async fn remove_cgroup(self: &Arc<Self>, cgroup: String) -> Result<(), CgroupError> {
        if let Some(sd) = &self.systemd {
            let (unit, _) = systemd::unit_and_parent(&self.fs_name(&cgroup));
            sd.stop(&unit).await?;
        }
        let this = self.clone();
        blocking(move || this.remove_everywhere(&cgroup)).await
    }

    /// The UIDs of the pods that have a cgroup under `kubepods` (in any QoS class, in any hierarchy), as the
    /// kubelet finds them for its orphan cleanup. Blocking.
    pub fn pod_uids(&self) -> Vec<String> {
        let mut uids = std::collections::BTreeSet::new();
        for class in ["", "/burstable", "/besteffort"] {
            for dir in self.everywhere(&format!("{}{class}", self.kubepods)) {
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for entry in entries.flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let uid = if self.systemd.is_some() {
                        systemd::pod_uid(&name)
                    } else {
                        name.strip_prefix("pod").map(str::to_owned)
                    };
                    if let Some(uid) = uid
                        && entry.file_type().is_ok_and(|t| t.is_dir())
                    {
                        uids.insert(uid);
                    }
                }
            }
        }
        uids.into_iter().collect()
    }

    /// Removes the cgroup of pod `uid`, whatever its QoS class, from every hierarchy: for a pod the node no
    /// longer knows (deleted while the agent was down). Processes left inside are killed
    /// ([`super::leftovers`]); a cgroup whose processes do not go stays (the error says so; the next housekeeping
    /// tries again).
    pub async fn remove_orphan(self: &Arc<Self>, uid: &str) -> Result<(), CgroupError> {
        let known = self
            .burstable
            .lock()
            .map(|mut m| m.remove(uid).is_some())
            .unwrap_or(false);
        if known {
            self.update_burstable().await?;
        }
        for qos in [QosClass::Guaranteed, QosClass::Burstable, QosClass::BestEffort] {
            self.remove_cgroup(self.pod_name(qos, uid)).await?;
        }
        Ok(())
    }
}
