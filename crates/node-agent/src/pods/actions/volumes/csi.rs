//! CSI PersistentVolumes on a real node, staged and published through their driver with the kubelet's layout:
//!
//! * staging (when the driver has `STAGE_UNSTAGE_VOLUME`): `NodeStageVolume` into
//!   `<root-dir>/plugins/kubernetes.io/csi/<driver>/<sha256 of the volume handle>/globalmount`, with a
//!   `vol_data.json` beside it naming the driver and the volume handle;
//! * publishing: `NodePublishVolume` into `<root-dir>/pods/<pod uid>/volumes/kubernetes.io~csi/<PV name>/mount`
//!   (the driver makes `mount`; the agent makes its parent), with a `vol_data.json` beside it (the PV's name,
//!   volume handle, driver, node, attachment and lifecycle mode, under the kubelet's keys). The containers mount
//!   `mount`.
//!
//! A volume whose `CSIDriver` says `attachRequired` (or that has no `CSIDriver` object, as the kubelet takes it)
//! waits until its `VolumeAttachment` (`csi-<sha256 of handle, driver and node>`, made by the attach/detach
//! controller and attached by the driver's external attacher) reports `attached`; its attachment metadata is the
//! publish context.
//!
//! Teardown reads what is on disk, so it works the same for a pod that went while the agent was down: each
//! published volume of the pod is unpublished (`NodeUnpublishVolume`), its directory removed, and a staged volume
//! no other pod on the node publishes any more is unstaged (`NodeUnstageVolume`). A volume whose driver is not
//! registered is left in place (the error says so) and tried again later.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::PersistentVolume;
use serde::{Deserialize, Serialize};

use crate::csi::v1 as csi;
use crate::csi::v1::node_client::NodeClient;
use crate::csi::{CsiDrivers, Driver, connect};
use crate::pods::actions::context::ActionCtx;
use crate::pods::model::spec::DesiredPod;

/// The pod volume directory of CSI volumes (`volumes/<plugin>/<name>`).
pub const POD_PLUGIN_DIR: &str = "kubernetes.io~csi";
/// The file beside each published or staged volume that says what it is.
pub const VOL_DATA: &str = "vol_data.json";

/// What a `csi` PersistentVolume names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiSource {
    /// The driver's name.
    pub driver: String,
    /// The volume's ID for the driver.
    pub volume_handle: String,
    /// The PV's `csi.readOnly`.
    pub read_only: bool,
    /// The filesystem to mount (`csi.fsType`).
    pub fs_type: String,
    /// The PV's `csi.volumeAttributes`: the volume context.
    pub attributes: BTreeMap<String, String>,
    /// The PV's mount options.
    pub mount_flags: Vec<String>,
    /// The CSI access mode the PV's access modes map to.
    pub access_mode: i32,
}

impl CsiSource {
    /// The CSI source of `pv`, `None` when it is no `csi` volume, an error for what this node does not pass on.
    pub fn from_pv(pv: &PersistentVolume) -> Option<Result<Self, String>> {
        let spec = pv.spec.as_ref()?;
        let c = spec.csi.as_ref()?;
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        let secrets = [
            ("nodeStageSecretRef", c.node_stage_secret_ref.is_some()),
            ("nodePublishSecretRef", c.node_publish_secret_ref.is_some()),
        ];
        if let Some((field, _)) = secrets.iter().find(|(_, set)| *set) {
            return Some(Err(format!(
                "PersistentVolume {name} sets csi.{field}, which node-agent does not pass to the driver yet"
            )));
        }
        use csi::volume_capability::access_mode::Mode;
        let modes = spec.access_modes.clone().unwrap_or_default();
        let has = |m: &str| modes.iter().any(|x| x == m);
        let access_mode = if has("ReadWriteMany") {
            Mode::MultiNodeMultiWriter
        } else if has("ReadOnlyMany") && !has("ReadWriteOnce") && !has("ReadWriteOncePod") {
            Mode::MultiNodeReaderOnly
        } else {
            Mode::SingleNodeWriter
        };
        Some(Ok(Self {
            driver: c.driver.clone(),
            volume_handle: c.volume_handle.clone(),
            read_only: c.read_only.unwrap_or(false),
            fs_type: c.fs_type.clone().unwrap_or_default(),
            attributes: c.volume_attributes.clone().unwrap_or_default(),
            mount_flags: spec.mount_options.clone().unwrap_or_default(),
            access_mode: access_mode as i32,
        }))
    }

    fn capability(&self, block: bool) -> csi::VolumeCapability {
        use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
        csi::VolumeCapability {
            access_type: Some(if block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume {
                    fs_type: self.fs_type.clone(),
                    mount_flags: self.mount_flags.clone(),
                    volume_mount_group: String::new(),
                })
            }),
            access_mode: Some(AccessMode {
                mode: self.access_mode,
            }),
        }
    }
}

/// The hex SHA-256 of `text`.
fn sha256(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The name of the `VolumeAttachment` of volume `handle` of `driver` on `node` (the attach/detach controller's).
pub fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    format!("csi-{}", sha256(&format!("{handle}{driver}{node}")))
}

/// Where volume `handle` of `driver` is staged on a node whose root directory is `root_dir`.
pub fn staging_path(root_dir: &Path, driver: &str, handle: &str) -> PathBuf {
    root_dir
        .join("plugins/kubernetes.io/csi")
        .join(driver)
        .join(sha256(handle))
        .join("globalmount")
}

/// Where PV `volume` of the pod whose directory is `pod_dir` is published.
pub fn publish_path(pod_dir: &Path, volume: &str) -> PathBuf {
    pod_dir
        .join("volumes")
        .join(POD_PLUGIN_DIR)
        .join(volume)
        .join("mount")
}

/// A published volume's `vol_data.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedData {
    /// The PV's name.
    #[serde(rename = "specVolID")]
    pub spec_vol_id: String,
    /// The volume's ID for the driver.
    #[serde(rename = "volumeHandle")]
    pub volume_handle: String,
    /// The driver.
    #[serde(rename = "driverName")]
    pub driver_name: String,
    /// The node.
    #[serde(rename = "nodeName")]
    pub node_name: String,
    /// The `VolumeAttachment`, when the volume is attached.
    #[serde(rename = "attachmentID", default, skip_serializing_if = "String::is_empty")]
    pub attachment_id: String,
    /// `Persistent` (or `Ephemeral` for an inline volume).
    #[serde(rename = "volumeLifecycleMode")]
    pub lifecycle_mode: String,
}

/// A staged volume's `vol_data.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StagedData {
    #[serde(rename = "driverName")]
    driver_name: String,
    #[serde(rename = "volumeHandle")]
    volume_handle: String,
}

/// A volume to publish for one pod.
#[derive(Debug, Clone)]
pub struct Publish<'a> {
    /// The node's root directory.
    pub root_dir: &'a Path,
    /// The pod's directory.
    pub pod_dir: &'a Path,
    /// The node.
    pub node: &'a str,
    /// The PV's name.
    pub volume: &'a str,
    /// What it names.
    pub source: &'a CsiSource,
    /// Mounted read-only (the claim's or the PV's `readOnly`).
    pub read_only: bool,
    /// `volumeMode: Block`.
    pub block: bool,
    /// The attachment's name and metadata, when it is attached.
    pub attachment: Option<(String, BTreeMap<String, String>)>,
}

fn driver_of(drivers: &CsiDrivers, name: &str) -> Result<Driver, String> {
    drivers
        .get(name)
        .ok_or_else(|| format!("driver name {name} not found in the list of registered CSI drivers"))
}

async fn node_client(driver: &Driver) -> Result<NodeClient<tonic::transport::Channel>, String> {
    connect(&driver.endpoint).await.map(NodeClient::new).map_err(|e| {
        format!(
            "connecting to the CSI driver at {}: {e}",
            driver.endpoint.display()
        )
    })
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<(), String> {
    let text = serde_json::to_vec(value).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Stages (when the driver stages) and publishes one volume; returns the directory the containers mount.
pub async fn publish(drivers: &CsiDrivers, p: &Publish<'_>) -> Result<PathBuf, String> {
    let driver = driver_of(drivers, &p.source.driver)?;
    let mut client = node_client(&driver).await?;
    let capability = p.source.capability(p.block);
    let context = p.attachment.as_ref().map(|(_, m)| m.clone()).unwrap_or_default();
    let staging = if driver.capabilities.stage_unstage {
        let staging = staging_path(p.root_dir, &p.source.driver, &p.source.volume_handle);
        let parent = staging.parent().unwrap_or(p.root_dir).to_owned();
        std::fs::create_dir_all(&staging).map_err(|e| format!("creating {}: {e}", staging.display()))?;
        write_json(
            &parent.join(VOL_DATA),
            &StagedData {
                driver_name: p.source.driver.clone(),
                volume_handle: p.source.volume_handle.clone(),
            },
        )?;
        client
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: p.source.volume_handle.clone(),
                publish_context: context.clone().into_iter().collect(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(capability.clone()),
                secrets: Default::default(),
                volume_context: p.source.attributes.clone().into_iter().collect(),
            })
            .await
            .map_err(|s| {
                format!(
                    "MountDevice failed: rpc error: code = {:?} desc = {}",
                    s.code(),
                    s.message()
                )
            })?;
        Some(staging)
    } else {
        None
    };
    let target = publish_path(p.pod_dir, p.volume);
    let dir = target.parent().unwrap_or(p.pod_dir).to_owned();
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    write_json(
        &dir.join(VOL_DATA),
        &PublishedData {
            spec_vol_id: p.volume.to_owned(),
            volume_handle: p.source.volume_handle.clone(),
            driver_name: p.source.driver.clone(),
            node_name: p.node.to_owned(),
            attachment_id: p.attachment.as_ref().map(|(n, _)| n.clone()).unwrap_or_default(),
            lifecycle_mode: "Persistent".into(),
        },
    )?;
    client
        .node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: p.source.volume_handle.clone(),
            publish_context: context.into_iter().collect(),
            staging_target_path: staging.map(|s| s.display().to_string()).unwrap_or_default(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability),
            readonly: p.read_only || p.source.read_only,
            secrets: Default::default(),
            volume_context: p.source.attributes.clone().into_iter().collect(),
        })
        .await
        .map_err(|s| format!("rpc error: code = {:?} desc = {}", s.code(), s.message()))?;
    Ok(target)
}

/// The published volumes of the pod whose directory is `pod_dir`: (volume directory, its data).
fn published(pod_dir: &Path) -> Vec<(PathBuf, PublishedData)> {
    let Ok(entries) = std::fs::read_dir(pod_dir.join("volumes").join(POD_PLUGIN_DIR)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let dir = e.path();
            let text = std::fs::read(dir.join(VOL_DATA)).ok()?;
            Some((dir, serde_json::from_slice(&text).ok()?))
        })
        .collect()
}

/// Unpublishes every CSI volume of the pod whose directory is `pod_dir` (under `pods_dir`), and unstages those
/// no other pod publishes. Every volume is tried; the first error is returned.
pub async fn tear_down(drivers: &CsiDrivers, pods_dir: &Path, pod_dir: &Path) -> Result<(), String> {
    let root_dir = pods_dir.parent().unwrap_or(pods_dir);
    let mut first_error = None;
    for (dir, data) in published(pod_dir) {
        if let Err(e) = unpublish(drivers, root_dir, pods_dir, &dir, &data).await {
            tracing::warn!(volume = %data.spec_vol_id, driver = %data.driver_name, error = %e, "CSI volume not torn down");
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

async fn unpublish(
    drivers: &CsiDrivers,
    root_dir: &Path,
    pods_dir: &Path,
    dir: &Path,
    data: &PublishedData,
) -> Result<(), String> {
    let driver = driver_of(drivers, &data.driver_name)?;
    let mut client = node_client(&driver).await?;
    let target = dir.join("mount");
    client
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: data.volume_handle.clone(),
            target_path: target.display().to_string(),
        })
        .await
        .map_err(|s| {
            format!(
                "UnmountVolume.TearDown failed for volume {:?}: rpc error: code = {:?} desc = {}",
                data.spec_vol_id,
                s.code(),
                s.message()
            )
        })?;
    match std::fs::remove_dir(&target) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!("removing {}: {e}", target.display()));
        }
        _ => {}
    }
    let _ = std::fs::remove_file(dir.join(VOL_DATA));
    let _ = std::fs::remove_dir(dir);
    let staging = staging_path(root_dir, &data.driver_name, &data.volume_handle);
    if !staging.exists() || still_published(pods_dir, data) {
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
                "UnmountDevice failed for volume {:?}: rpc error: code = {:?} desc = {}",
                data.spec_vol_id,
                s.code(),
                s.message()
            )
        })?;
    let _ = std::fs::remove_dir(&staging);
    if let Some(parent) = staging.parent() {
        let _ = std::fs::remove_file(parent.join(VOL_DATA));
        let _ = std::fs::remove_dir(parent);
    }
    Ok(())
}

/// Whether any pod under `pods_dir` still publishes the volume `data` names.
fn still_published(pods_dir: &Path, data: &PublishedData) -> bool {
    let Ok(pods) = std::fs::read_dir(pods_dir) else {
        return false;
    };
    pods.flatten().any(|pod| {
        published(&pod.path())
            .iter()
            .any(|(_, d)| d.driver_name == data.driver_name && d.volume_handle == data.volume_handle)
    })
}

/// Why a CSI volume is not set up yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetUpError {
    /// Waiting for the control plane (the volume's attachment): tried again soon.
    Waiting(String),
    /// The driver or the node failed.
    Failed(String),
}

/// Whether the volume of `driver` must be attached first, and when it is, the attachment's name and metadata.
async fn attachment(
    ctx: &ActionCtx,
    source: &CsiSource,
) -> Result<Option<(String, BTreeMap<String, String>)>, SetUpError> {
    let driver = ctx
        .objects
        .csi_driver(&source.driver)
        .await
        .map_err(|e| SetUpError::Waiting(format!("reading CSIDriver {}: {}", source.driver, e.0)))?;
    // no CSIDriver object: attach, as the kubelet assumes
    let required = driver
        .as_ref()
        .and_then(|d| d.spec.attach_required)
        .unwrap_or(true);
    if !required {
        return Ok(None);
    }
    let name = attachment_name(&source.volume_handle, &source.driver, &ctx.config.node_name);
    let found = ctx
        .objects
        .volume_attachment(&name)
        .await
        .map_err(|e| SetUpError::Waiting(format!("reading VolumeAttachment {name}: {}", e.0)))?;
    let status = found.as_ref().and_then(|va| va.status.as_ref());
    match status {
        Some(s) if s.attached => Ok(Some((name, s.attachment_metadata.clone().unwrap_or_default()))),
        Some(s) if s.attach_error.is_some() => Err(SetUpError::Waiting(format!(
            "volume {} has not been attached yet: VolumeAttachment {name}: {}",
            source.volume_handle,
            s.attach_error
                .as_ref()
                .and_then(|e| e.message.clone())
                .unwrap_or_default()
        ))),
        _ => Err(SetUpError::Waiting(format!(
            "volume {} has not been attached yet (waiting for VolumeAttachment {name})",
            source.volume_handle
        ))),
    }
}

/// A claim's CSI volume as the pod uses it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClaimUse<'a> {
    /// The PersistentVolume's name.
    pub volume: &'a str,
    /// Mounted read-only by the pod.
    pub read_only: bool,
    /// `volumeMode: Block`.
    pub block: bool,
}

/// Attaches (waits for the attachment), stages and publishes the CSI volume `source` of a claim for `pod`.
pub(crate) async fn set_up(
    ctx: &ActionCtx,
    pod: &DesiredPod,
    bound: ClaimUse<'_>,
    source: &CsiSource,
) -> Result<(), SetUpError> {
    let (Some(drivers), Some(pods_dir)) = (&ctx.config.csi_drivers, &ctx.config.layout.pods_dir) else {
        return Err(SetUpError::Failed(format!(
            "driver name {} not found in the list of registered CSI drivers",
            source.driver
        )));
    };
    let attachment = attachment(ctx, source).await?;
    let pod_dir = super::pod_dir(pods_dir, &pod.uid);
    let p = Publish {
        root_dir: pods_dir.parent().unwrap_or(pods_dir),
        pod_dir: &pod_dir,
        node: &ctx.config.node_name,
        volume: bound.volume,
        source,
        read_only: bound.read_only,
        block: bound.block,
        attachment,
    };
    publish(drivers, &p)
        .await
        .map(drop)
        .map_err(|e| SetUpError::Failed(format!("kubernetes.io/csi: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names and paths the kubelet gives a CSI volume (its attach/detach controller and volume manager
    /// compute the same).
    #[test]
    fn attachment_name_and_paths_are_the_kubelets() {
        assert_eq!(
            attachment_name("2", "csi.example.com", "node-1"),
            format!("csi-{}", sha256("2csi.example.comnode-1"))
        );
        assert_eq!(
            sha256("2"),
            "d4735e3a265e16eee03f59718b9b5d03019c07d8b6c51f90da3a666eec13ab35"
        );
        assert_eq!(
            staging_path(Path::new("/var/lib/kubelet"), "csi.example.com", "2"),
            Path::new(
                "/var/lib/kubelet/plugins/kubernetes.io/csi/csi.example.com/\
                 d4735e3a265e16eee03f59718b9b5d03019c07d8b6c51f90da3a666eec13ab35/globalmount"
            )
        );
        assert_eq!(
            publish_path(Path::new("/var/lib/kubelet/pods/uid-1"), "pv-1"),
            Path::new("/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount")
        );
    }

    #[test]
    fn vol_data_uses_the_kubelets_keys() {
        let data = PublishedData {
            spec_vol_id: "pv-1".into(),
            volume_handle: "2".into(),
            driver_name: "csi.example.com".into(),
            node_name: "node-1".into(),
            attachment_id: String::new(),
            lifecycle_mode: "Persistent".into(),
        };
        assert_eq!(
            serde_json::to_value(&data).unwrap(),
            serde_json::json!({"specVolID": "pv-1", "volumeHandle": "2", "driverName": "csi.example.com",
                               "nodeName": "node-1", "volumeLifecycleMode": "Persistent"})
        );
    }
}
