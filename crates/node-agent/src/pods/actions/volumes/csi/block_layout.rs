//! CSI block volumes (`volumeMode: Block`) on a real node: the kubelet's block layout under
//! `<root-dir>/plugins/kubernetes.io/csi/volumeDevices` (staging and publish paths, the volume's data and global
//! map path) and the teardown of a pod's block volume — unmapped
//! ([`block`](crate::pods::actions::volumes::block)), unpublished, and unstaged once no pod maps it. Staging and
//! publishing themselves are [`publish`](super::publish)'s, with a block access type.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::{PublishedData, VOL_DATA, blocking, driver_of, node_client, uid_of, write_json};
use crate::csi::CsiDrivers;
use crate::csi::v1 as csi;
use crate::pods::actions::volumes::block::{self as mapping, BlockPlugin};

/// The directory of a block volume (PersistentVolume `pv`, `volumeMode: Block`) on a node whose root directory is
/// `root_dir`: its data (`data/vol_data.json`) and its global map path (`dev`).
pub fn block_volume_dir(root_dir: &Path, pv: &str) -> PathBuf {
    mapping::csi_volume_dir(root_dir, pv)
}

/// Where block volume `pv` is staged.
pub fn block_staging_path(root_dir: &Path, pv: &str) -> PathBuf {
    root_dir.join(mapping::CSI_BLOCK_DIR).join("staging").join(pv)
}

/// Where block volume `pv` is published for the pod `uid` (the driver makes the device or file there).
pub fn block_publish_path(root_dir: &Path, pv: &str, uid: &str) -> PathBuf {
    root_dir
        .join(mapping::CSI_BLOCK_DIR)
        .join("publish")
        .join(pv)
        .join(uid)
}

/// Writes the data of block volume `pv` (`<volume dir>/data/vol_data.json`).
pub(super) fn write_block_data(root_dir: &Path, pv: &str, data: &PublishedData) -> Result<(), String> {
    let dir = block_volume_dir(root_dir, pv).join("data");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(&dir)
        .map_err(|e| format!("creating {}: {e}", dir.display()))?;
    write_json(&dir.join(VOL_DATA), data)
}

/// The data of block volume `pv`, as its publishing wrote it.
fn block_data(root_dir: &Path, pv: &str) -> Option<PublishedData> {
    let text = std::fs::read(block_volume_dir(root_dir, pv).join("data").join(VOL_DATA)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Unmaps and unpublishes the CSI block volume `pv` of the pod whose directory is `pod_dir`, and unstages it
/// when no other pod maps it.
pub(super) async fn unpublish_block(
    drivers: &CsiDrivers,
    root_dir: &Path,
    pods_dir: &Path,
    pod_dir: &Path,
    pv: &str,
) -> Result<(), String> {
    let (root, pods, pod, name) = (
        root_dir.to_owned(),
        pods_dir.to_owned(),
        pod_dir.to_owned(),
        pv.to_owned(),
    );
    let uid = uid_of(pod_dir);
    let data = block_data(root_dir, pv).ok_or_else(|| {
        let dir = block_volume_dir(root_dir, pv);
        format!(
            "UnmapVolume.UnmapBlockVolume failed for volume {pv:?}: no volume data under {}",
            dir.display()
        )
    })?;
    let driver = driver_of(drivers, &data.driver_name)?;
    let mut client = node_client(&driver).await?;
    let target = block_publish_path(root_dir, pv, &uid);
    {
        let (root, pod, name, uid) = (root.clone(), pod.clone(), name.clone(), uid.clone());
        // the pod's symlink stays until the volume is unpublished: what a later attempt finds it by
        blocking(move || {
            let mapping = mapping::Mapping {
                root_dir: &root,
                pod_dir: &pod,
                uid: &uid,
                plugin: BlockPlugin::Csi,
                pv: &name,
            };
            mapping
                .release_device()
                .map_err(|e| format!("UnmapVolume.UnmapBlockVolume failed for volume {name:?}: {e}"))
        })
        .await?;
    }
    client
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: data.volume_handle.clone(),
            target_path: target.display().to_string(),
        })
        .await
        .map_err(|s| {
            format!(
                "UnmapVolume.UnmapPodDevice failed for volume {pv:?}: rpc error: code = {:?} desc = {}",
                s.code(),
                s.message()
            )
        })?;
    let staging = block_staging_path(root_dir, pv);
    let staged = staging.clone();
    let unstage = blocking(move || {
        // what the driver left at the publish path (it owns no mount there any more)
        match std::fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() => {
                let _ = std::fs::remove_dir(&target);
            }
            Ok(_) => {
                let _ = std::fs::remove_file(&target);
            }
            Err(_) => {}
        }
        if let Some(dir) = target.parent() {
            let _ = std::fs::remove_dir(dir);
        }
        let mapping = mapping::Mapping {
            root_dir: &root,
            pod_dir: &pod,
            uid: &uid,
            plugin: BlockPlugin::Csi,
            pv: &name,
        };
        mapping.remove_link().map_err(|e| e.to_string())?;
        let others = still_mapped(&pods, &name);
        let unstage = !others && staged.exists();
        if !others && !unstage {
            remove_volume_dir(&root, &name);
        }
        Ok(unstage)
    })
    .await?;
    if !unstage {
        return Ok(());
    }
    client
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: data.volume_handle.clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .map_err(|s| {
            format!(
                "UnmapDevice.TearDownDevice failed for volume {pv:?}: rpc error: code = {:?} desc = {}",
                s.code(),
                s.message()
            )
        })?;
    let (root, name) = (root_dir.to_owned(), pv.to_owned());
    blocking(move || {
        let _ = std::fs::remove_dir(&staging);
        remove_volume_dir(&root, &name);
        Ok(())
    })
    .await
}

/// Removes what is left of block volume `pv` once no pod maps it: its data and its (empty) global map path.
fn remove_volume_dir(root_dir: &Path, pv: &str) {
    let dir = block_volume_dir(root_dir, pv);
    let _ = std::fs::remove_file(dir.join("data").join(VOL_DATA));
    let _ = std::fs::remove_dir(dir.join("data"));
    let _ = std::fs::remove_dir(dir.join("dev"));
    let _ = std::fs::remove_dir(&dir);
}

/// Whether any pod under `pods_dir` still maps the CSI block volume `pv`.
fn still_mapped(pods_dir: &Path, pv: &str) -> bool {
    let Ok(pods) = std::fs::read_dir(pods_dir) else {
        return false;
    };
    pods.flatten().any(|pod| {
        std::fs::symlink_metadata(mapping::pod_device_path(&pod.path(), BlockPlugin::Csi, pv)).is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_paths_are_the_kubelets() {
        let root = Path::new("/var/lib/kubelet");
        assert_eq!(
            block_staging_path(root, "pv-1"),
            Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/pv-1")
        );
        assert_eq!(
            block_publish_path(root, "pv-1", "uid-1"),
            Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv-1/uid-1")
        );
        assert_eq!(
            block_volume_dir(root, "pv-1"),
            Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/pv-1")
        );
    }
}
