//! The attachable CSI volumes this node uses, as the Node's `status.volumesInUse` reports them.
//!
//! The kubelet reports a volume in use from the moment a pod that needs it is admitted until it is unmounted
//! and unstaged, so the attach/detach controller never detaches a volume still mounted. Here a pod's volume is
//! added when its set-up decides the volume must be attached ([`VolumesInUse::add`]) and the pod's entries go
//! once its CSI volumes are torn down ([`VolumesInUse::release_pod`]); a restarted agent takes the published
//! volumes it finds on disk back ([`VolumesInUse::seed_from_disk`]) before it reports anything. Names are the
//! kubelet's unique volume names, `kubernetes.io/csi/<driver>^<volume handle>`.
//!
//! The set is a `watch` channel, so the node status task is told of each change and reports it at once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::density::watch;

/// Unique volume name -> the pods (by UID) that use it.
pub type InUse = BTreeMap<String, BTreeSet<String>>;

/// The kubelet's unique name of volume `handle` of CSI driver `driver`.
pub fn unique_name(driver: &str, handle: &str) -> String {
    format!("kubernetes.io/csi/{driver}^{handle}")
}

/// The attachable volumes in use on this node. Clones share the set.
#[derive(Debug, Clone)]
pub struct VolumesInUse(watch::Sender<InUse>);

impl Default for VolumesInUse {
    fn default() -> Self {
        Self(watch::Sender::new(InUse::new()))
    }
}

impl VolumesInUse {
    /// Pod `uid` uses volume `name`.
    pub fn add(&self, name: &str, uid: &str) {
        self.0
            .send_if_modified(|set| set.entry(name.to_owned()).or_default().insert(uid.to_owned()));
    }

    /// Pod `uid` uses none of its volumes any more (they are torn down).
    pub fn release_pod(&self, uid: &str) {
        self.0.send_if_modified(|set| {
            let mut changed = false;
            set.retain(|_, pods| {
                changed |= pods.remove(uid);
                !pods.is_empty()
            });
            changed
        });
    }

    /// The names in use, sorted (what `status.volumesInUse` lists).
    pub fn names(&self) -> Vec<String> {
        self.0.borrow().keys().cloned().collect()
    }

    /// Whether volume `name` is in use.
    pub fn contains(&self, name: &str) -> bool {
        self.0.borrow().contains_key(name)
    }

    /// A receiver told of every change.
    pub fn subscribe(&self) -> watch::Receiver<InUse> {
        self.0.subscribe()
    }

    /// Adds the attached volumes published under `pods_dir` (`<pod uid>/volumes/kubernetes.io~csi/*/`
    /// `vol_data.json` with an attachment): what an agent finds mounted when it starts.
    pub fn seed_from_disk(&self, pods_dir: &Path) {
        let Ok(pods) = std::fs::read_dir(pods_dir) else {
            return;
        };
        for pod in pods.flatten() {
            let uid = pod.file_name().to_string_lossy().into_owned();
            let Ok(volumes) = std::fs::read_dir(pod.path().join("volumes/kubernetes.io~csi")) else {
                continue;
            };
            for volume in volumes.flatten() {
                let Ok(text) = std::fs::read(volume.path().join("vol_data.json")) else {
                    continue;
                };
                let Ok(data) = serde_json::from_slice::<serde_json::Value>(&text) else {
                    continue;
                };
                let field = |k: &str| {
                    data.get(k)
                        .and_then(|v| v.as_str())
                        .unwrap_or_default()
                        .to_owned()
                };
                if field("attachmentID").is_empty() {
                    continue;
                }
                self.add(&unique_name(&field("driverName"), &field("volumeHandle")), &uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_stays_in_use_until_its_last_pod_releases_it() {
        let set = VolumesInUse::default();
        let mut rx = set.subscribe();
        set.add("kubernetes.io/csi/d^1", "pod-a");
        set.add("kubernetes.io/csi/d^1", "pod-b");
        set.add("kubernetes.io/csi/d^0", "pod-a");
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        assert_eq!(set.names(), ["kubernetes.io/csi/d^0", "kubernetes.io/csi/d^1"]);
        set.release_pod("pod-a");
        assert_eq!(set.names(), ["kubernetes.io/csi/d^1"]);
        rx.borrow_and_update();
        // releasing a pod that uses nothing is no change
        set.release_pod("pod-c");
        assert!(!rx.has_changed().unwrap());
        set.release_pod("pod-b");
        assert!(set.names().is_empty());
        assert!(rx.has_changed().unwrap());
    }

    #[test]
    fn published_attached_volumes_on_disk_are_in_use_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let write = |uid: &str, volume: &str, data: serde_json::Value| {
            let d = dir
                .path()
                .join(uid)
                .join("volumes/kubernetes.io~csi")
                .join(volume);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("vol_data.json"), data.to_string()).unwrap();
        };
        write(
            "uid-1",
            "pv-1",
            serde_json::json!({"driverName": "d", "volumeHandle": "1", "attachmentID": "csi-abc"}),
        );
        // not attachable: not reported
        write(
            "uid-2",
            "pv-2",
            serde_json::json!({"driverName": "d", "volumeHandle": "2"}),
        );
        let set = VolumesInUse::default();
        set.seed_from_disk(dir.path());
        assert_eq!(set.names(), [unique_name("d", "1")]);
        assert_eq!(unique_name("d", "1"), "kubernetes.io/csi/d^1");
    }
}
