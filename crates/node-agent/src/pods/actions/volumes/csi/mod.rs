//! CSI volumes on a real node, staged and published through their driver with the kubelet's layout:
//!
//! * staging (when the driver has `STAGE_UNSTAGE_VOLUME`): `NodeStageVolume` into
//!   `<root-dir>/plugins/kubernetes.io/csi/<driver>/<sha256 of the volume handle>/globalmount`, with a
//!   `vol_data.json` beside it naming the driver and the volume handle;
//! * publishing: `NodePublishVolume` into `<root-dir>/pods/<pod uid>/volumes/kubernetes.io~csi/<name>/mount`
//!   (the driver makes `mount`; the agent makes its parent), with a `vol_data.json` beside it (the PV's or the
//!   pod volume's name, volume handle, driver, node, attachment and lifecycle mode, under the kubelet's keys).
//!   The containers mount `mount`.
//!
//! A block volume (`volumeMode: Block`) has the kubelet's block layout under
//! `<root-dir>/plugins/kubernetes.io/csi/volumeDevices`: staged (`NodeStageVolume` with a block access type) at
//! `staging/<pv>`, published (`NodePublishVolume`) at `publish/<pv>/<pod uid>`, where the driver makes a device
//! node or a file; its data in `<pv>/data/vol_data.json`. The publish path is then mapped for the pod
//! ([`block`](super::block): `<pv>/dev/<pod uid>` bind-mounted onto it, the pod's
//! `volumeDevices/kubernetes.io~csi/<pv>` symlink to it, a loop device for a file) and handed to the containers
//! as a device. Its teardown unmaps it first, then unpublishes, and unstages once no pod maps it.
//!
//! Two kinds of volume come here: a claim's `csi` PersistentVolume (lifecycle mode `Persistent`), and a pod's
//! inline `csi` volume (`Ephemeral`: published without staging or attaching, under the handle
//! `csi-<sha256 of pod UID and volume name>`, as the kubelet names it). The driver's `CSIDriver` object must
//! list the mode (no object: persistent volumes only). With `podInfoOnMount` the volume context carries the
//! pod's name, namespace, UID, service account and whether the volume is ephemeral. With `tokenRequests` it
//! carries service account tokens bound to the pod, one per audience, as the JSON map the kubelet writes under
//! `csi.storage.k8s.io/serviceAccount.tokens` (in the publish secrets instead when the `CSIDriver` says
//! `serviceAccountTokenInSecrets`). The data of the Secrets a volume names are the secrets of the calls:
//! the PersistentVolume's `nodeStageSecretRef` for `NodeStageVolume`, its (or the inline volume's)
//! `nodePublishSecretRef` for `NodePublishVolume`.
//!
//! A persistent volume whose `CSIDriver` says `attachRequired` (or that has no `CSIDriver` object, as the
//! kubelet takes it) is in use on this node from then on ([`VolumesInUse`](crate::csi::in_use::VolumesInUse),
//! the Node's `volumesInUse`), and waits as the kubelet's volume manager waits: until the Node's status reports
//! it in use, then until the attach/detach controller lists it in the Node's `volumesAttached`, then until its
//! `VolumeAttachment` (`csi-<sha256 of handle, driver and node>`, attached by the driver's external attacher)
//! reports `attached`; its attachment metadata is the publish context.
//!
//! The pod's `fsGroup` is applied as the kubelet applies it: passed to the driver (`volume_mount_group`) when it
//! has `VOLUME_MOUNT_GROUP`; otherwise given to the published directory by the agent when the `CSIDriver`'s
//! `fsGroupPolicy` says so (`File`: always; `ReadWriteOnceWithFSType`, the default: when the volume has an
//! `fsType` and a `ReadWriteOnce` access mode, inline volumes counting as such; `None`: never), never for a
//! read-only volume, under the pod's `fsGroupChangePolicy`.
//!
//! Teardown reads what is on disk, so it works the same for a pod that went while the agent was down: each
//! published volume of the pod is unpublished (`NodeUnpublishVolume`), its directory removed, and a staged volume
//! no other pod on the node publishes any more is unstaged (`NodeUnstageVolume`); then the pod's volumes are no
//! longer in use. A volume whose driver is not registered is left in place (the error says so) and tried again
//! later. File work runs on the blocking pool, off the async workers.

pub mod block_layout;

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::CSIDriver;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use self::block_layout::{block_publish_path, block_staging_path, unpublish_block, write_block_data};
use super::block::BlockPlugin;
use super::ownership;
use crate::csi::in_use::unique_name;
use crate::csi::tokens::TokenKey;
use crate::csi::v1 as csi;
use crate::csi::v1::node_client::NodeClient;
use crate::csi::volume_stats::PublishedVolume;
use crate::csi::{CsiDrivers, Driver, connect};
use crate::pods::actions::context::ActionCtx;
use crate::pods::actions::objects::{ObjectError, ObjectKind, PodObjects, TokenFor};
use crate::pods::model::spec::DesiredPod;
use crate::pods::model::spec::volumes::InlineCsi;

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
    /// The access modes include `ReadWriteOnce` (an inline volume counts as such): the default
    /// `fsGroupPolicy` applies the pod's `fsGroup` only then.
    pub read_write_once: bool,
    /// `Persistent` (a PersistentVolume) or `Ephemeral` (a pod's inline volume).
    pub lifecycle: Lifecycle,
    /// `nodeStageSecretRef` as (namespace, name): the secrets of `NodeStageVolume`.
    pub stage_secret: Option<(String, String)>,
    /// `nodePublishSecretRef` as (namespace, name): the secrets of `NodePublishVolume`.
    pub publish_secret: Option<(String, String)>,
}

/// A CSI volume's lifecycle mode (`CSIDriver.spec.volumeLifecycleModes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// A PersistentVolume's.
    Persistent,
    /// A pod's inline volume.
    Ephemeral,
}

impl Lifecycle {
    /// The mode's API name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Persistent => "Persistent",
            Self::Ephemeral => "Ephemeral",
        }
    }
}

impl CsiSource {
    /// The CSI source of `pv`, `None` when it is no `csi` volume, an error for what this node does not pass on.
    pub fn from_pv(pv: &PersistentVolume) -> Option<Result<Self, String>> {
        let spec = pv.spec.as_ref()?;
        let c = spec.csi.as_ref()?;
        let reference = |r: &Option<k8s_openapi::api::core::v1::SecretReference>| {
            r.as_ref().map(|r| {
                (
                    r.namespace.clone().unwrap_or_default(),
                    r.name.clone().unwrap_or_default(),
                )
            })
        };
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
            read_write_once: has("ReadWriteOnce"),
            lifecycle: Lifecycle::Persistent,
            stage_secret: reference(&c.node_stage_secret_ref),
            publish_secret: reference(&c.node_publish_secret_ref),
        }))
    }

    /// The CSI source of the inline volume `name` of the pod `uid` in `namespace`: the kubelet's volume handle
    /// for it, mounted read-write-once.
    pub fn inline(uid: &str, namespace: &str, name: &str, c: &InlineCsi) -> Self {
        use csi::volume_capability::access_mode::Mode;
        Self {
            driver: c.driver.clone(),
            volume_handle: inline_handle(uid, name),
            read_only: c.read_only,
            fs_type: c.fs_type.clone(),
            attributes: c.attributes.clone(),
            mount_flags: Vec::new(),
            access_mode: Mode::SingleNodeWriter as i32,
            read_write_once: true,
            lifecycle: Lifecycle::Ephemeral,
            stage_secret: None,
            publish_secret: c
                .node_publish_secret
                .as_ref()
                .map(|secret| (namespace.to_owned(), secret.clone())),
        }
    }

    fn capability(&self, block: bool, mount_group: Option<u32>) -> csi::VolumeCapability {
        use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
        csi::VolumeCapability {
            access_type: Some(if block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume {
                    fs_type: self.fs_type.clone(),
                    mount_flags: self.mount_flags.clone(),
                    volume_mount_group: mount_group.map(|g| g.to_string()).unwrap_or_default(),
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

/// The kubelet's volume handle of the inline volume `name` of the pod `uid`.
pub fn inline_handle(uid: &str, name: &str) -> String {
    format!("csi-{}", sha256(&format!("{uid}{name}")))
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
    /// The PV's name (an inline volume: the pod volume's).
    pub volume: &'a str,
    /// What it names.
    pub source: &'a CsiSource,
    /// The volume context: the source's attributes, with the pod's when the driver asks for them.
    pub context: BTreeMap<String, String>,
    /// The pod's `fsGroup`, for a driver that applies it itself (`VOLUME_MOUNT_GROUP`).
    pub mount_group: Option<u32>,
    /// Mounted read-only (the claim's or the PV's `readOnly`).
    pub read_only: bool,
    /// `volumeMode: Block`.
    pub block: bool,
    /// The attachment's name and metadata, when it is attached.
    pub attachment: Option<(String, BTreeMap<String, String>)>,
    /// The secrets of `NodeStageVolume`.
    pub stage_secrets: BTreeMap<String, String>,
    /// The secrets of `NodePublishVolume`.
    pub publish_secrets: BTreeMap<String, String>,
    /// Published before (the driver's `requiresRepublish`): published again, not staged again.
    pub republish: bool,
}

pub(super) fn driver_of(drivers: &CsiDrivers, name: &str) -> Result<Driver, String> {
    drivers
        .get(name)
        .ok_or_else(|| format!("driver name {name} not found in the list of registered CSI drivers"))
}

pub(super) async fn node_client(driver: &Driver) -> Result<NodeClient<tonic::transport::Channel>, String> {
    connect(&driver.endpoint).await.map(NodeClient::new).map_err(|e| {
        format!(
            "connecting to the CSI driver at {}: {e}",
            driver.endpoint.display()
        )
    })
}

pub(super) fn write_json(path: &Path, value: &impl Serialize) -> Result<(), String> {
    let text = serde_json::to_vec(value).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Runs the file work `f` on the blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
}

/// Stages (when the driver stages a persistent volume) and publishes one volume; returns the directory the
/// containers mount.
pub async fn publish(drivers: &CsiDrivers, p: &Publish<'_>) -> Result<PathBuf, String> {
    let driver = driver_of(drivers, &p.source.driver)?;
    let mut client = node_client(&driver).await?;
    let mount_group = p.mount_group.filter(|_| driver.capabilities.volume_mount_group);
    let capability = p.source.capability(p.block, mount_group);
    let publish_context = p.attachment.as_ref().map(|(_, m)| m.clone()).unwrap_or_default();
    let stages = driver.capabilities.stage_unstage && p.source.lifecycle == Lifecycle::Persistent;
    let data = PublishedData {
        spec_vol_id: p.volume.to_owned(),
        volume_handle: p.source.volume_handle.clone(),
        driver_name: p.source.driver.clone(),
        node_name: p.node.to_owned(),
        attachment_id: p.attachment.as_ref().map(|(n, _)| n.clone()).unwrap_or_default(),
        lifecycle_mode: p.source.lifecycle.name().into(),
    };
    let staging_at = if p.block {
        block_staging_path(p.root_dir, p.volume)
    } else {
        staging_path(p.root_dir, &p.source.driver, &p.source.volume_handle)
    };
    let staging = if stages && p.republish {
        Some(staging_at)
    } else if stages {
        let staging = staging_at;
        let (dir, root) = (staging.clone(), p.root_dir.to_owned());
        let (block, volume) = (p.block, p.volume.to_owned());
        let (staged, published) = (
            StagedData {
                driver_name: p.source.driver.clone(),
                volume_handle: p.source.volume_handle.clone(),
            },
            data.clone(),
        );
        blocking(move || {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(&dir)
                .map_err(|e| format!("creating {}: {e}", dir.display()))?;
            if block {
                // a block volume's data is kept beside its global map path, for its teardown
                write_block_data(&root, &volume, &published)
            } else {
                write_json(&dir.parent().unwrap_or(&root).join(VOL_DATA), &staged)
            }
        })
        .await?;
        client
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: p.source.volume_handle.clone(),
                publish_context: publish_context.clone().into_iter().collect(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(capability.clone()),
                secrets: p.stage_secrets.clone().into_iter().collect(),
                volume_context: p.context.clone().into_iter().collect(),
            })
            .await
            .map_err(|s| {
                // the kubelet's step: a block volume's device is set up, a filesystem's mounted
                let step = if p.block { "SetUpDevice" } else { "MountDevice" };
                format!(
                    "{step} failed: rpc error: code = {:?} desc = {}",
                    s.code(),
                    s.message()
                )
            })?;
        Some(staging)
    } else {
        None
    };
    let target = if p.block {
        block_publish_path(p.root_dir, p.volume, &uid_of(p.pod_dir))
    } else {
        publish_path(p.pod_dir, p.volume)
    };
    let dir = target.parent().unwrap_or(p.pod_dir).to_owned();
    let (block, root, volume) = (p.block, p.root_dir.to_owned(), p.volume.to_owned());
    blocking(move || {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&dir)
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        if block {
            write_block_data(&root, &volume, &data)
        } else {
            write_json(&dir.join(VOL_DATA), &data)
        }
    })
    .await?;
    client
        .node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: p.source.volume_handle.clone(),
            publish_context: publish_context.into_iter().collect(),
            staging_target_path: staging.map(|s| s.display().to_string()).unwrap_or_default(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability),
            readonly: p.read_only || p.source.read_only,
            secrets: p.publish_secrets.clone().into_iter().collect(),
            volume_context: p.context.clone().into_iter().collect(),
        })
        .await
        .map_err(|s| format!("rpc error: code = {:?} desc = {}", s.code(), s.message()))?;
    Ok(target)
}

/// The pod's UID: the name of its directory.
pub(super) fn uid_of(pod_dir: &Path) -> String {
    pod_dir
        .file_name()
        .map(|u| u.to_string_lossy().into_owned())
        .unwrap_or_default()
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
/// no other pod publishes; then the pod's volumes are no longer in use. Every volume is tried; the first error
/// is returned (and the pod's volumes stay in use).
pub async fn tear_down(drivers: &CsiDrivers, pods_dir: &Path, pod_dir: &Path) -> Result<(), String> {
    let root_dir = pods_dir.parent().unwrap_or(pods_dir);
    let mut first_error = None;
    let dir = pod_dir.to_owned();
    for (dir, data) in blocking(move || Ok(published(&dir))).await? {
        if let Err(e) = unpublish(drivers, root_dir, pods_dir, &dir, &data).await {
            tracing::warn!(volume = %data.spec_vol_id, driver = %data.driver_name, error = %e, "CSI volume not torn down");
            first_error.get_or_insert(e);
        }
    }
    let dir = pod_dir.to_owned();
    let mapped = blocking(move || Ok(super::block::mapped(&dir))).await?;
    for (_, pv) in mapped.into_iter().filter(|(p, _)| *p == BlockPlugin::Csi) {
        if let Err(e) = unpublish_block(drivers, root_dir, pods_dir, pod_dir, &pv).await {
            tracing::warn!(volume = %pv, error = %e, "CSI block volume not torn down");
            first_error.get_or_insert(e);
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => {
            if let Some(uid) = pod_dir.file_name() {
                let uid = uid.to_string_lossy();
                drivers.in_use().release_pod(&uid);
                drivers.published().release_pod(&uid);
                drivers.release_tokens(&uid);
            }
            Ok(())
        }
    }
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
    let (dir, pods, d) = (dir.to_owned(), pods_dir.to_owned(), data.clone());
    let staging = staging_path(root_dir, &data.driver_name, &data.volume_handle);
    let staged = staging.clone();
    let unstage = blocking(move || {
        match std::fs::remove_dir(&target) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("removing {}: {e}", target.display()));
            }
            _ => {}
        }
        let _ = std::fs::remove_file(dir.join(VOL_DATA));
        let _ = std::fs::remove_dir(&dir);
        Ok(staged.exists() && !still_published(&pods, &d))
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
                "UnmountDevice failed for volume {:?}: rpc error: code = {:?} desc = {}",
                data.spec_vol_id,
                s.code(),
                s.message()
            )
        })?;
    blocking(move || {
        let _ = std::fs::remove_dir(&staging);
        if let Some(parent) = staging.parent() {
            let _ = std::fs::remove_file(parent.join(VOL_DATA));
            let _ = std::fs::remove_dir(parent);
        }
        Ok(())
    })
    .await
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

/// Checks that the driver's `CSIDriver` object (`None`: there is none) lists the volume's lifecycle mode.
fn check_lifecycle(object: Option<&CSIDriver>, source: &CsiSource) -> Result<(), String> {
    let mode = source.lifecycle.name();
    let driver = &source.driver;
    let Some(object) = object else {
        return match source.lifecycle {
            // no information, which is fine for persistent volumes only
            Lifecycle::Persistent => Ok(()),
            Lifecycle::Ephemeral => Err(format!(
                "volume mode {mode:?} not supported by driver {driver} (no CSIDriver object)"
            )),
        };
    };
    let modes = object
        .spec
        .volume_lifecycle_modes
        .clone()
        .unwrap_or_else(|| vec!["Persistent".to_owned()]);
    if modes.iter().any(|m| m == mode) {
        Ok(())
    } else {
        Err(format!(
            "volume mode {mode:?} not supported by driver {driver} (only supports {modes:?})"
        ))
    }
}

/// Whether the agent gives the published volume the pod's `fsGroup` itself, under the driver's `fsGroupPolicy`
/// (no `CSIDriver` object: `ReadWriteOnceWithFSType`).
fn applies_fs_group(object: Option<&CSIDriver>, source: &CsiSource, read_only: bool) -> bool {
    let policy = object
        .and_then(|d| d.spec.fs_group_policy.as_deref())
        .unwrap_or("ReadWriteOnceWithFSType");
    match policy {
        _ if read_only => false,
        "None" => false,
        "File" => true,
        _ => !source.fs_type.is_empty() && source.read_write_once,
    }
}

/// The volume context key of the service account tokens a `CSIDriver`'s `tokenRequests` ask for.
pub const TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// The data of the Secret `(namespace, name)` a volume names in `field`, as text.
async fn secret(
    ctx: &ActionCtx,
    field: &str,
    (namespace, name): &(String, String),
) -> Result<BTreeMap<String, String>, SetUpError> {
    let failed = |why: String| {
        SetUpError::Failed(format!(
            "kubernetes.io/csi: fetching {field} {namespace}/{name} failed: {why}"
        ))
    };
    let data = ctx
        .objects
        .get(ObjectKind::Secret, namespace, name)
        .await
        .map_err(|e| failed(e.0))?
        .ok_or_else(|| {
            failed(format!(
                "failed to find the secret {name} in the namespace {namespace} with error: secrets \"{name}\" not found"
            ))
        })?;
    Ok(data
        .iter()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
        .collect())
}

/// The tokens the driver's `tokenRequests` ask for, bound to the pod, as the kubelet passes them: a JSON map of
/// audience to the token request's status (`token`, `expirationTimestamp`). `None` when it asks for none.
async fn service_account_tokens(
    ctx: &ActionCtx,
    pod: &DesiredPod,
    object: Option<&CSIDriver>,
) -> Result<Option<String>, SetUpError> {
    let requests = object
        .and_then(|d| d.spec.token_requests.as_ref())
        .filter(|r| !r.is_empty());
    let Some(requests) = requests else {
        return Ok(None);
    };
    let Some(drivers) = &ctx.config.csi_drivers else {
        return Ok(None);
    };
    let mut tokens = serde_json::Map::new();
    for request in requests {
        let (token, expires) = kept_token(
            drivers,
            &*ctx.objects,
            TokenFor {
                namespace: &pod.namespace,
                service_account: &pod.service_account,
                audience: &request.audience,
                // the API server's default lifetime when the driver names none
                expiration_secs: request.expiration_seconds.unwrap_or(3600),
                pod_name: &pod.name,
                pod_uid: &pod.uid,
            },
        )
        .await
        .map_err(|e| {
            SetUpError::Failed(format!(
                "kubernetes.io/csi: mounter.SetUpAt failed to get service account token attributes: {}",
                e.0
            ))
        })?;
        tokens.insert(
            request.audience.clone(),
            serde_json::json!({"token": token, "expirationTimestamp": expires}),
        );
    }
    Ok(Some(serde_json::Value::Object(tokens).to_string()))
}

/// The token `request` asks for, with its expiry as handed on: the one the node keeps while it is not due for
/// renewal ([`tokens`](crate::csi::tokens)), else a new one from the API server, kept from then on.
async fn kept_token(
    drivers: &CsiDrivers,
    objects: &dyn PodObjects,
    request: TokenFor<'_>,
) -> Result<(String, String), ObjectError> {
    let key = TokenKey {
        namespace: request.namespace.to_owned(),
        service_account: request.service_account.to_owned(),
        audience: request.audience.to_owned(),
        expiration_secs: request.expiration_secs,
        pod_uid: request.pod_uid.to_owned(),
    };
    if let Some(kept) = drivers.kept_token(&key, Instant::now()) {
        return Ok(kept);
    }
    let issued = objects.token(request).await?;
    let now = Instant::now();
    let life = issued
        .expires
        .duration_since(k8s_openapi::jiff::Timestamp::now())
        .unsigned_abs();
    let expires = issued.expires.to_string();
    drivers.keep_token(key, issued.token.clone(), expires.clone(), now, life);
    Ok((issued.token, expires))
}

/// The pod's attributes the kubelet adds to the volume context of a driver with `podInfoOnMount`.
fn pod_info(pod: &DesiredPod, lifecycle: Lifecycle) -> [(&'static str, String); 5] {
    [
        ("csi.storage.k8s.io/pod.name", pod.name.clone()),
        ("csi.storage.k8s.io/pod.namespace", pod.namespace.clone()),
        ("csi.storage.k8s.io/pod.uid", pod.uid.to_string()),
        (
            "csi.storage.k8s.io/serviceAccount.name",
            pod.service_account.to_string(),
        ),
        (
            "csi.storage.k8s.io/ephemeral",
            (lifecycle == Lifecycle::Ephemeral).to_string(),
        ),
    ]
}

/// Whether the volume must be attached first, and when it is, the attachment's name and metadata. A volume
/// to attach is in use on this node from here on.
async fn attachment(
    ctx: &ActionCtx,
    drivers: &CsiDrivers,
    pod: &DesiredPod,
    object: Option<&CSIDriver>,
    source: &CsiSource,
) -> Result<Option<(String, BTreeMap<String, String>)>, SetUpError> {
    // no CSIDriver object: attach, as the kubelet assumes; an inline volume is never attached
    let required = object.and_then(|d| d.spec.attach_required).unwrap_or(true);
    if !required || source.lifecycle == Lifecycle::Ephemeral {
        return Ok(None);
    }
    let unique = unique_name(&source.driver, &source.volume_handle);
    drivers.in_use().add(&unique, &pod.uid);
    // the kubelet's checks before it waits for the attachment: the node reports the volume in use (so the
    // attach/detach controller will not detach it under the pod), and the controller reports it attached
    let node_name = &ctx.config.node_name;
    let node = ctx
        .objects
        .node(node_name)
        .await
        .map_err(|e| SetUpError::Waiting(format!("reading Node {node_name}: {}", e.0)))?;
    let status = node.as_ref().and_then(|n| n.status.as_ref());
    let in_use = status
        .and_then(|s| s.volumes_in_use.as_ref())
        .is_some_and(|v| v.contains(&unique));
    if !in_use {
        return Err(SetUpError::Waiting(format!(
            "volume {unique} has not been added to the list of VolumesInUse in the node's volume status"
        )));
    }
    let attached = status
        .and_then(|s| s.volumes_attached.as_ref())
        .is_some_and(|v| v.iter().any(|a| a.name == unique));
    if !attached {
        return Err(SetUpError::Waiting(format!(
            "volume {unique} is not attached according to the node status (waiting for the attach/detach \
             controller)"
        )));
    }
    let name = attachment_name(&source.volume_handle, &source.driver, node_name);
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

/// On a node without disk (a hollow node): the attach part of [`set_up`] alone — the driver must be registered
/// and its `CSIDriver` must list the volume's mode, an attachable volume is in use from here on, and the pod
/// waits for its attachment. A driver answered in process is then asked to stage and publish the volume, its
/// failures reported as the real calls' are. A node without CSI drivers lets the pod run.
pub(crate) async fn attach_only(
    ctx: &ActionCtx,
    pod: &DesiredPod,
    source: &CsiSource,
) -> Result<(), SetUpError> {
    let Some(drivers) = &ctx.config.csi_drivers else {
        return Ok(());
    };
    driver_of(drivers, &source.driver).map_err(|e| SetUpError::Failed(format!("kubernetes.io/csi: {e}")))?;
    let object = ctx
        .objects
        .csi_driver(&source.driver)
        .await
        .map_err(|e| SetUpError::Waiting(format!("reading CSIDriver {}: {}", source.driver, e.0)))?;
    check_lifecycle(object.as_ref(), source)
        .map_err(|e| SetUpError::Waiting(format!("kubernetes.io/csi: {e}")))?;
    attachment(ctx, drivers, pod, object.as_ref(), source).await?;
    let Some(side) = drivers.in_process(&source.driver) else {
        return Ok(());
    };
    let status = |s: tonic::Status| format!("rpc error: code = {:?} desc = {}", s.code(), s.message());
    side.stage(&source.volume_handle)
        .await
        .map_err(|s| SetUpError::Failed(format!("kubernetes.io/csi: MountDevice failed: {}", status(s))))?;
    side.publish(&source.volume_handle, &pod.uid)
        .await
        .map_err(|s| SetUpError::Failed(format!("kubernetes.io/csi: {}", status(s))))
}

/// On a node without disk: the pod's volumes are no longer in use once it is gone (nothing to unpublish).
pub(crate) fn release_hollow(ctx: &ActionCtx, uid: &str) {
    if let Some(drivers) = &ctx.config.csi_drivers {
        drivers.in_use().release_pod(uid);
    }
}

/// A CSI volume as the pod uses it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct VolumeUse<'a> {
    /// The PersistentVolume's name, or the inline volume's.
    pub volume: &'a str,
    /// The pod volume's name.
    pub name: &'a str,
    /// The claim it comes from.
    pub claim: Option<&'a str>,
    /// Mounted read-only by the pod.
    pub read_only: bool,
    /// `volumeMode: Block`.
    pub block: bool,
    /// Set up before: published again because the driver asks for it (`requiresRepublish`).
    pub republish: bool,
}

/// Attaches (waits for the attachment), stages and publishes the CSI volume `source` for `pod`, and applies the
/// pod's `fsGroup`. Returns whether the driver wants the volume published again at every sync of the pod
/// (`requiresRepublish`: its tokens and secrets renewed), as the kubelet's volume manager remounts it.
pub(crate) async fn set_up(
    ctx: &ActionCtx,
    pod: &DesiredPod,
    using: VolumeUse<'_>,
    source: &CsiSource,
) -> Result<bool, SetUpError> {
    let (Some(drivers), Some(pods_dir)) = (&ctx.config.csi_drivers, &ctx.config.layout.pods_dir) else {
        return Err(SetUpError::Failed(format!(
            "driver name {} not found in the list of registered CSI drivers",
            source.driver
        )));
    };
    let object = ctx
        .objects
        .csi_driver(&source.driver)
        .await
        .map_err(|e| SetUpError::Waiting(format!("reading CSIDriver {}: {}", source.driver, e.0)))?;
    check_lifecycle(object.as_ref(), source)
        .map_err(|e| SetUpError::Waiting(format!("kubernetes.io/csi: {e}")))?;
    let attachment = attachment(ctx, drivers, pod, object.as_ref(), source).await?;
    let republish = object.as_ref().and_then(|d| d.spec.requires_republish) == Some(true);
    let fs_group = super::fs_group(pod).map_err(SetUpError::Failed)?;
    let mut context = source.attributes.clone();
    if object.as_ref().and_then(|d| d.spec.pod_info_on_mount) == Some(true) {
        context.extend(pod_info(pod, source.lifecycle).map(|(k, v)| (k.to_owned(), v)));
    }
    let stage_secrets = match &source.stage_secret {
        Some(r) => secret(ctx, "NodeStageSecretRef", r).await?,
        None => BTreeMap::new(),
    };
    let mut publish_secrets = match &source.publish_secret {
        Some(r) => secret(ctx, "NodePublishSecretRef", r).await?,
        None => BTreeMap::new(),
    };
    if let Some(tokens) = service_account_tokens(ctx, pod, object.as_ref()).await? {
        let in_secrets = object
            .as_ref()
            .and_then(|d| d.spec.service_account_token_in_secrets)
            == Some(true);
        let into = if in_secrets {
            &mut publish_secrets
        } else {
            &mut context
        };
        into.insert(TOKENS_KEY.to_owned(), tokens);
    }
    let pod_dir = super::pod_dir(pods_dir, &pod.uid);
    let read_only = using.read_only || source.read_only;
    let p = Publish {
        root_dir: pods_dir.parent().unwrap_or(pods_dir),
        pod_dir: &pod_dir,
        node: &ctx.config.node_name,
        volume: using.volume,
        source,
        context,
        mount_group: fs_group,
        read_only: using.read_only,
        block: using.block,
        attachment,
        stage_secrets,
        publish_secrets,
        republish: using.republish,
    };
    let target = publish(drivers, &p)
        .await
        .map_err(|e| SetUpError::Failed(format!("kubernetes.io/csi: {e}")))?;
    if using.block {
        let (root, dir, uid, pv, device) = (
            p.root_dir.to_owned(),
            pod_dir.clone(),
            pod.uid.to_string(),
            using.volume.to_owned(),
            target.clone(),
        );
        blocking(move || {
            let mapping = super::block::Mapping {
                root_dir: &root,
                pod_dir: &dir,
                uid: &uid,
                plugin: BlockPlugin::Csi,
                pv: &pv,
            };
            mapping
                .map(&device)
                .map_err(|e| format!("MapBlockVolume failed: {e}"))
        })
        .await
        .map_err(|e| SetUpError::Failed(format!("kubernetes.io/csi: {e}")))?;
    }
    let stages = drivers
        .get(&source.driver)
        .is_some_and(|d| d.capabilities.stage_unstage)
        && source.lifecycle == Lifecycle::Persistent;
    drivers.published().add(
        &pod.uid,
        PublishedVolume {
            name: using.name.to_owned(),
            claim: using.claim.map(|c| (pod.namespace.to_string(), c.to_owned())),
            driver: source.driver.clone(),
            handle: source.volume_handle.clone(),
            target: target.clone(),
            staging: stages.then(|| {
                if using.block {
                    block_staging_path(p.root_dir, using.volume)
                } else {
                    staging_path(p.root_dir, &source.driver, &source.volume_handle)
                }
            }),
        },
    );
    let driver_applies = drivers
        .get(&source.driver)
        .is_some_and(|d| d.capabilities.volume_mount_group);
    let Some(gid) = fs_group.filter(|_| !driver_applies && !using.block) else {
        return Ok(republish);
    };
    if !applies_fs_group(object.as_ref(), source, read_only) {
        return Ok(republish);
    }
    let on_root_mismatch = pod
        .security
        .as_deref()
        .is_some_and(|s| s.fs_group_on_root_mismatch);
    blocking(move || {
        let keep =
            on_root_mismatch && ownership::root_matches(&target, gid, false).map_err(|e| e.to_string())?;
        if keep {
            return Ok(());
        }
        ownership::set(&target, gid, false)
            .map_err(|e| format!("applyFSGroup failed for {}: {e}", target.display()))
    })
    .await
    .map_err(|e| SetUpError::Failed(format!("kubernetes.io/csi: {e}")))?;
    Ok(republish)
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

    fn source(fs_type: &str, rwo: bool, lifecycle: Lifecycle) -> CsiSource {
        CsiSource {
            driver: "d".into(),
            volume_handle: "1".into(),
            read_only: false,
            fs_type: fs_type.into(),
            attributes: BTreeMap::new(),
            mount_flags: Vec::new(),
            access_mode: 1,
            read_write_once: rwo,
            lifecycle,
            stage_secret: None,
            publish_secret: None,
        }
    }

    fn driver(spec: serde_json::Value) -> CSIDriver {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "d"}, "spec": spec})).unwrap()
    }

    #[test]
    fn an_inline_volume_needs_a_csidriver_listing_ephemeral() {
        let inline = source("", true, Lifecycle::Ephemeral);
        let persistent = source("", true, Lifecycle::Persistent);
        assert_eq!(
            check_lifecycle(None, &inline),
            Err("volume mode \"Ephemeral\" not supported by driver d (no CSIDriver object)".into())
        );
        assert_eq!(check_lifecycle(None, &persistent), Ok(()));
        // no modes listed: Persistent only
        let plain = driver(serde_json::json!({}));
        assert_eq!(
            check_lifecycle(Some(&plain), &inline),
            Err(
                "volume mode \"Ephemeral\" not supported by driver d (only supports [\"Persistent\"])".into()
            )
        );
        let both = driver(serde_json::json!({"volumeLifecycleModes": ["Persistent", "Ephemeral"]}));
        assert_eq!(check_lifecycle(Some(&both), &inline), Ok(()));
        assert_eq!(check_lifecycle(Some(&both), &persistent), Ok(()));
    }

    #[test]
    fn fs_group_follows_the_drivers_policy() {
        let ext4_rwo = source("ext4", true, Lifecycle::Persistent);
        let no_fs_type = source("", true, Lifecycle::Persistent);
        let ext4_rwx = source("ext4", false, Lifecycle::Persistent);
        let policy = |p: &str| driver(serde_json::json!({"fsGroupPolicy": p}));
        // the default (also with no CSIDriver): an fsType and ReadWriteOnce
        assert!(applies_fs_group(None, &ext4_rwo, false));
        assert!(!applies_fs_group(None, &no_fs_type, false));
        assert!(!applies_fs_group(None, &ext4_rwx, false));
        assert!(applies_fs_group(
            Some(&policy("ReadWriteOnceWithFSType")),
            &ext4_rwo,
            false
        ));
        assert!(applies_fs_group(Some(&policy("File")), &no_fs_type, false));
        assert!(applies_fs_group(Some(&policy("File")), &ext4_rwx, false));
        assert!(!applies_fs_group(Some(&policy("None")), &ext4_rwo, false));
        // never on a read-only volume
        assert!(!applies_fs_group(Some(&policy("File")), &ext4_rwo, true));
    }

    /// Issues numbered tokens of the requested lifetime, counting the requests.
    #[derive(Default)]
    struct NumberedTokens(std::sync::atomic::AtomicUsize);

    #[async_trait::async_trait]
    impl PodObjects for NumberedTokens {
        async fn get(
            &self,
            _: ObjectKind,
            _: &str,
            _: &str,
        ) -> Result<Option<std::sync::Arc<crate::pods::actions::objects::ObjectData>>, ObjectError> {
            Ok(None)
        }

        async fn token(&self, r: TokenFor<'_>) -> Result<crate::pods::actions::objects::Token, ObjectError> {
            let n = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            let expires = k8s_openapi::jiff::Timestamp::now()
                .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(r.expiration_secs))
                .unwrap();
            Ok(crate::pods::actions::objects::Token {
                token: format!("token-{n}"),
                expires,
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_republish_reuses_the_token_until_80_percent_of_its_life() {
        use std::sync::atomic::Ordering;
        use std::time::Duration;
        let drivers = CsiDrivers::default();
        let objects = NumberedTokens::default();
        let request = |audience| TokenFor {
            namespace: "ns",
            service_account: "default",
            audience,
            expiration_secs: 3600,
            pod_name: "p",
            pod_uid: "uid-1",
        };
        let token = |audience| kept_token(&drivers, &objects, request(audience));
        let requested = || objects.0.load(Ordering::SeqCst);
        let (first, expires) = token("aud").await.unwrap();
        assert_eq!((first.as_str(), requested()), ("token-1", 1));
        // republished before 80 % of the hour: the same token and expiry, no request
        tokio::time::advance(Duration::from_secs(2870)).await;
        assert_eq!(token("aud").await.unwrap(), (first.clone(), expires));
        assert_eq!(requested(), 1);
        // another audience is another token
        assert_eq!(token("other").await.unwrap().0, "token-2");
        // past 80 %: a new token, kept in turn
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(token("aud").await.unwrap().0, "token-3");
        assert_eq!(token("aud").await.unwrap().0, "token-3");
        assert_eq!(requested(), 3);
        // the pod's volumes torn down: its tokens are gone
        drivers.release_tokens("uid-1");
        assert_eq!(token("aud").await.unwrap().0, "token-4");
    }

    #[test]
    fn an_inline_volume_has_the_kubelets_handle() {
        assert_eq!(
            inline_handle("uid-1", "scratch"),
            format!("csi-{}", sha256("uid-1scratch"))
        );
        let inline = InlineCsi {
            driver: "d".into(),
            read_only: false,
            fs_type: String::new(),
            attributes: BTreeMap::new(),
            node_publish_secret: Some("creds".into()),
        };
        let source = CsiSource::inline("uid-1", "ns-1", "scratch", &inline);
        // an inline volume's publish secret is in the pod's namespace
        assert_eq!(source.publish_secret, Some(("ns-1".into(), "creds".into())));
        assert_eq!(source.stage_secret, None);
    }
}
