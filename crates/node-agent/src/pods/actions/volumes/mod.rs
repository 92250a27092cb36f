//! A pod's volumes (the kubelet's volume manager, for the volume kinds a node provides itself): emptyDir,
//! hostPath, configMap, secret, downwardAPI and projected (configMap, secret, downward API and service account
//! token sources).
//!
//! Both modes compute every volume's content from the objects it names, so a missing ConfigMap fails a hollow
//! pod's start (`FailedMount`) as it fails a real one, and a hollow node puts the same read load on the API
//! server. A real node (a [`RuntimeLayout::pods_dir`](crate::pods::runtime::labels::RuntimeLayout)) also writes the content
//! under `<pods_dir>/<uid>/volumes/kubernetes.io~<plugin>/<name>` — atomically, so updates reach running
//! containers as one switch ([`disk`]) — and mounts tmpfs for secrets, projected and memory-backed volumes. The
//! containers get the directories as CRI mounts ([`mounts`]). Every sync calls [`PodVolumes::setup`] again:
//! changed content is rewritten and tokens are renewed at 80 % of their life (at most 24 h). With the pod's
//! `fsGroup`, a real node gives every volume but hostPath that group ([`ownership`]) after each write.
//!
//! A `persistentVolumeClaim` volume is resolved to its bound PersistentVolume ([`claims`]) in both modes, so a
//! pod whose claim is missing or unbound waits in `ContainerCreating` with the kubelet's `FailedMount` event
//! (`Unable to attach or mount volumes: ...`) and runs once the claim is bound. A real node then mounts a
//! `hostPath` or `local` PersistentVolume's path into the containers directly (the hostPath checks, and for a
//! writable `local` volume the pod's `fsGroup` under its `fsGroupChangePolicy`).
//!
//! A claim whose PersistentVolume has `volumeMode: Block` is a block volume: a `local` one on a block device, or a
//! `csi` one, is mapped with the kubelet's layout and handed to the containers that name it in `volumeDevices` as
//! a device node ([`block`], [`devices`]); a block volume of another kind fails with `FailedMapVolume`. As the
//! kubelet, a `Block` volume named in `volumeMounts`, or a `Filesystem` one in `volumeDevices`, is never taken
//! on (`FailedMount`: `failed to process volumes=[v]: volume v has volumeMode ...`).
//!
//! A `csi` PersistentVolume and a pod's inline `csi` volume are attached, staged and published through the
//! driver ([`csi`]). A hollow node with a CSI driver of its profile does the attach part alone: the volume is in
//! use, and the pod waits for its attachment as a real node's pod waits; nothing is staged or published.
//!
//! Other volume kinds (nfs, iscsi, ...) are not provided: on a real node the pod fails to start with a
//! `FailedMount` event naming the kind; a hollow node has no disk to mount and lets the pod run.

pub mod block;
pub mod claims;
pub mod content;
pub mod csi;
pub mod disk;
pub mod loop_device;
pub mod ownership;

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::time::Duration;

use runtime_api::cri;
use tokio::time::Instant;

use self::claims::{BoundClaim, ClaimError, PersistentSource};
use self::content::File;
use crate::pods::actions::context::ActionCtx;
use crate::pods::actions::objects::{ObjectKind, TokenFor};
use crate::pods::model::spec::volumes::{ObjectVolume, Projection, Propagation, VolumeSource};
use crate::pods::model::spec::{ContainerSpec, DesiredPod, VolumeSpec};

/// The longest a pod waiting for its claim waits between two reads of it.
const CLAIM_RETRY_MAX: Duration = Duration::from_secs(4);

/// What [`PodVolumes`] keeps for a volume set up once and for all (a claim's, a CSI volume's: content hashes are
/// for volumes whose content the node computes).
const SET_UP: u64 = 0;
/// What it keeps for a CSI volume whose driver asks to publish it again at every sync (`requiresRepublish`).
const REPUBLISH: u64 = 1;

/// Why a volume could not be set up: the kubelet's `FailedMount` event text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountError {
    /// The volume.
    pub volume: String,
    /// What went wrong.
    pub message: String,
    /// The volume could not even be resolved (a claim missing or unbound): the kubelet's volume manager never
    /// took it on, and says so.
    pub unprocessed: bool,
    /// A block volume failed to be mapped (`FailedMapVolume`, where a filesystem's fails to mount).
    pub map: bool,
}

impl MountError {
    /// The event's reason.
    pub fn reason(&self) -> &'static str {
        if self.map && !self.unprocessed {
            "FailedMapVolume"
        } else {
            "FailedMount"
        }
    }
}

impl std::fmt::Display for MountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.unprocessed {
            let v = &self.volume;
            return write!(
                f,
                "Unable to attach or mount volumes: unmounted volumes=[{v}], unattached volumes=[], failed to \
                 process volumes=[{v}]: {}",
                self.message
            );
        }
        let step = if self.map {
            "MapVolume.MapPodDevice"
        } else {
            "MountVolume.SetUp"
        };
        write!(
            f,
            "{step} failed for volume \"{}\" : {}",
            self.volume, self.message
        )
    }
}

/// What a worker keeps of its pod's volumes: a hash of each volume's content as last set up, and when the
/// earliest token needs renewing. A few words per volume, whichever the mode.
#[derive(Debug, Default)]
pub struct PodVolumes {
    /// Per volume (by index in the spec): the content hash last set up (exactly as long as the spec's list:
    /// grown from empty, a `Vec` would keep room for four).
    set_up: Box<[Option<u64>]>,
    /// When a token of a projected volume is due for renewal.
    token_due: Option<Instant>,
    /// Failed set-ups in a row (the retry back-off).
    failures: u32,
    /// The last failure was a claim not yet usable (retried sooner: it is waiting for the control plane).
    waiting_for_claim: bool,
    /// The claims resolved, by volume index: what a container mounts for them.
    claims: Vec<(usize, BoundClaim)>,
}

fn plugin(source: &VolumeSource) -> &'static str {
    match source {
        VolumeSource::EmptyDir { .. } => "kubernetes.io~empty-dir",
        VolumeSource::HostPath { .. } => "kubernetes.io~host-path",
        VolumeSource::ConfigMap(_) => "kubernetes.io~configmap",
        VolumeSource::Secret(_) => "kubernetes.io~secret",
        VolumeSource::DownwardApi(_) => "kubernetes.io~downward-api",
        VolumeSource::Projected(_) => "kubernetes.io~projected",
        VolumeSource::Claim { .. } => "kubernetes.io~persistent-volume",
        VolumeSource::Csi(_) => csi::POD_PLUGIN_DIR,
        VolumeSource::Unsupported(_) => "kubernetes.io~unsupported",
    }
}

/// A pod's directory on a node with a pods directory.
pub fn pod_dir(pods_dir: &std::path::Path, uid: &str) -> PathBuf {
    pods_dir.join(uid)
}

/// Where volume `v` (the `index`th) of `pod` lives on the node (for a hollow node: where it would): a claim's
/// once it is resolved in `vols`.
fn host_path(
    ctx: &ActionCtx,
    pod: &DesiredPod,
    index: usize,
    v: &VolumeSpec,
    vols: Option<&PodVolumes>,
) -> PathBuf {
    if let VolumeSource::HostPath { path, .. } = &*v.source {
        return PathBuf::from(path);
    }
    let root = ctx
        .config
        .layout
        .pods_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/var/lib/kubelet/pods"));
    if let VolumeSource::Csi(_) = &*v.source {
        return csi::publish_path(&pod_dir(&root, &pod.uid), &v.name);
    }
    if let Some(bound) = vols.and_then(|vols| vols.claim(index)) {
        return match bound.source.path() {
            Some(path) => PathBuf::from(path),
            None => csi::publish_path(&pod_dir(&root, &pod.uid), &bound.volume),
        };
    }
    pod_dir(&root, &pod.uid)
        .join("volumes")
        .join(plugin(&v.source))
        .join(&v.name)
}

fn hash_files(files: &[File]) -> u64 {
    let mut h = DefaultHasher::new();
    files.hash(&mut h);
    h.finish()
}

impl Hash for File {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.path.hash(state);
        self.data.hash(state);
        self.mode.hash(state);
        self.owner.hash(state);
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, String> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// The pod's `fsGroup` as a group id.
fn fs_group(pod: &DesiredPod) -> Result<Option<u32>, String> {
    let Some(group) = pod.security.as_deref().and_then(|s| s.fs_group) else {
        return Ok(None);
    };
    u32::try_from(group)
        .map(Some)
        .map_err(|_| format!("fsGroup {group} is not a valid group id"))
}

/// The user the pod's service account tokens belong to, as the kubelet's `FsUserFrom`: the effective
/// `runAsUser` (the container's, else the pod's) when every init and app container has one and they are all the
/// same; `None` otherwise (the token stays the node's, mode `defaultMode`).
fn fs_user(pod: &DesiredPod) -> Option<u32> {
    let pod_user = pod.security.as_deref().and_then(|s| s.run_as_user);
    let mut users = pod
        .init_containers
        .iter()
        .chain(pod.containers.iter())
        .map(|c| c.security.as_deref().and_then(|s| s.run_as_user).or(pod_user));
    let first = users.next()??;
    if users.all(|u| u == Some(first)) {
        u32::try_from(first).ok()
    } else {
        None
    }
}

/// Whether the containers of `pod` use volume `index` in `volumeMounts` and in `volumeDevices` (init, app and
/// ephemeral containers alike).
fn uses(pod: &DesiredPod, index: usize) -> (bool, bool) {
    let index = u16::try_from(index).ok();
    let containers = pod
        .init_containers
        .iter()
        .chain(pod.containers.iter())
        .chain(pod.ephemeral().iter().map(|e| &e.container));
    let (mut mounted, mut device) = (false, false);
    for c in containers {
        mounted |= c.mounts.iter().any(|m| m.volume.is_some() && m.volume == index);
        device |= c.devices.iter().any(|d| d.volume.is_some() && d.volume == index);
    }
    (mounted, device)
}

/// The kubelet's check of a claim's volume mode against its use, before it takes the volume on: a `Block`
/// volume may not be in `volumeMounts`, a `Filesystem` one not in `volumeDevices`.
fn mode_mismatch(pod: &DesiredPod, index: usize, name: &str, block: bool) -> Option<String> {
    let (mounted, device) = uses(pod, index);
    let mode = if block { "Block" } else { "Filesystem" };
    if mounted && block {
        return Some(format!(
            "volume {name} has volumeMode {mode}, but is specified in volumeMounts"
        ));
    }
    if device && !block {
        return Some(format!(
            "volume {name} has volumeMode {mode}, but is specified in volumeDevices"
        ));
    }
    None
}

/// Maps a `local` block volume for the pod (see [`block`]); nothing for other claims.
fn map_local(
    bound: &BoundClaim,
    root_dir: &std::path::Path,
    pod_dir: &std::path::Path,
    uid: &str,
) -> Result<(), String> {
    let (true, PersistentSource::Local { path }) = (bound.block, &bound.source) else {
        return Ok(());
    };
    let mapping = block::Mapping {
        root_dir,
        pod_dir,
        uid,
        plugin: block::BlockPlugin::Local,
        pv: &bound.volume,
    };
    mapping
        .map(std::path::Path::new(path))
        .map_err(|e| format!("MapBlockVolume failed: {e}"))
}

/// Checks (and prepares) the node path of a resolved claim on a real node: hostPath's type check; a `local`
/// volume's directory must exist, and a writable one gets the pod's `fsGroup` (all of it, or with
/// `OnRootMismatch` only when its root lacks the group). A block volume must be a `local` one on a block device,
/// or a `csi` one.
fn prepare_claim(bound: &BoundClaim, fs_group: Option<u32>, on_root_mismatch: bool) -> Result<(), String> {
    if bound.block {
        return match &bound.source {
            PersistentSource::Local { path } => {
                let meta = std::fs::metadata(path);
                if meta.is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type())) {
                    Ok(())
                } else {
                    Err(format!(
                        "local volume path {path} of PersistentVolume {} (volumeMode Block) is not a block device on \
                         this node",
                        bound.volume
                    ))
                }
            }
            PersistentSource::Csi(_) => Ok(()),
            PersistentSource::HostPath { .. } => Err(format!(
                "PersistentVolume {} has volumeMode Block, but its kind hostPath has no block volume plugin (only \
                 local and csi volumes are mapped as block devices)",
                bound.volume
            )),
        };
    }
    match &bound.source {
        PersistentSource::HostPath { path, kind } => disk::check_host_path(path, *kind),
        PersistentSource::Local { path } => {
            let dir = std::path::Path::new(path);
            if !dir.is_dir() {
                return Err(format!(
                    "local volume path {path} is not a directory on this node"
                ));
            }
            let (Some(gid), false) = (fs_group, bound.read_only) else {
                return Ok(());
            };
            let keep =
                on_root_mismatch && ownership::root_matches(dir, gid, false).map_err(|e| e.to_string())?;
            if keep {
                return Ok(());
            }
            ownership::set(dir, gid, false).map_err(|e| e.to_string())
        }
        // published by its driver once checked here ([`csi::set_up`])
        PersistentSource::Csi(_) => Ok(()),
    }
}

/// The page sizes of the huge pages `pod` requests: the pod level's (where it has resources of its own), then its
/// containers'.
fn hugepage_sizes(pod: &DesiredPod) -> Vec<u64> {
    let pod_level = pod
        .pod_level()
        .map(|_| pod.pod_level_hugepages())
        .unwrap_or_default();
    pod_level
        .iter()
        .map(|(size, _)| *size)
        .chain(pod.hugepage_requests().iter().map(|(_, size, _)| *size))
        .collect()
}

impl PodVolumes {
    /// The claim of volume `index`, once resolved.
    pub fn claim(&self, index: usize) -> Option<&BoundClaim> {
        self.claims.iter().find(|(i, _)| *i == index).map(|(_, b)| b)
    }

    /// Sets up (or refreshes) every volume of `pod`; the first failure stops it.
    pub async fn setup(&mut self, ctx: &ActionCtx, pod: &DesiredPod) -> Result<(), MountError> {
        if self.set_up.len() != pod.volumes.len() {
            let mut set_up = std::mem::take(&mut self.set_up).into_vec();
            set_up.resize(pod.volumes.len(), None);
            self.set_up = set_up.into_boxed_slice();
        }
        let now = Instant::now();
        let renew_tokens = self.token_due.is_none_or(|due| now >= due);
        let mut token_due: Option<Instant> = None;
        for (i, v) in pod.volumes.iter().enumerate() {
            let err = |message: String| MountError {
                volume: v.name.clone(),
                message,
                unprocessed: false,
                map: false,
            };
            let dir = host_path(ctx, pod, i, v, Some(self));
            let on_disk = ctx.config.kind == crate::pods::NodeKind::Real;
            let fs_group = fs_group(pod).map_err(err)?;
            let files = match &*v.source {
                VolumeSource::EmptyDir {
                    memory,
                    size_limit,
                    huge_pages,
                } => {
                    let page_size = match huge_pages {
                        Some(medium) => Some(disk::page_size_option(medium, hugepage_sizes(pod)).map_err(err)?),
                        None => None,
                    };
                    if self.set_up[i].is_none() && on_disk {
                        let (tmpfs, size) = (*memory, *size_limit);
                        blocking(move || {
                            match page_size {
                                Some(option) => disk::make_hugetlbfs_dir(&dir, &option)?,
                                None => disk::make_dir(&dir, tmpfs, size)?,
                            }
                            match fs_group {
                                Some(gid) => ownership::set(&dir, gid, false),
                                None => Ok(()),
                            }
                        })
                        .await
                        .map_err(err)?;
                    }
                    self.set_up[i] = Some(0);
                    continue;
                }
                VolumeSource::HostPath { path, kind } => {
                    if self.set_up[i].is_none() && on_disk {
                        let (path, kind) = (path.clone(), *kind);
                        match tokio::task::spawn_blocking(move || disk::check_host_path(&path, kind)).await {
                            Ok(Ok(())) => {}
                            Ok(Err(message)) => return Err(err(message)),
                            Err(e) => return Err(err(e.to_string())),
                        }
                    }
                    self.set_up[i] = Some(0);
                    continue;
                }
                VolumeSource::Claim { claim, read_only } => {
                    if self.set_up[i].is_none() {
                        self.waiting_for_claim = false;
                        let bound = match claims::resolve(&*ctx.objects, &pod.namespace, claim, *read_only).await {
                            Ok(bound) => bound,
                            Err(ClaimError::Waiting(message)) => {
                                self.waiting_for_claim = true;
                                return Err(MountError {
                                    volume: v.name.clone(),
                                    message,
                                    unprocessed: true,
                                    map: false,
                                });
                            }
                            Err(ClaimError::Refused(message)) => return Err(err(message)),
                        };
                        if let Some(message) = mode_mismatch(pod, i, &v.name, bound.block) {
                            return Err(MountError {
                                volume: v.name.clone(),
                                message,
                                unprocessed: true,
                                map: false,
                            });
                        }
                        let block = bound.block;
                        let err = |message: String| MountError {
                            volume: v.name.clone(),
                            message,
                            unprocessed: false,
                            map: block,
                        };
                        if on_disk {
                            let policy = pod.security.as_deref().is_some_and(|s| s.fs_group_on_root_mismatch);
                            let check = bound.clone();
                            let root = PathBuf::from(ctx.config.layout.root_dir());
                            let pods = ctx.config.layout.pods_dir.clone().unwrap_or_else(|| root.join("pods"));
                            let own_dir = pod_dir(&pods, &pod.uid);
                            let uid = pod.uid.to_string();
                            let prepare = move || {
                                prepare_claim(&check, fs_group, policy)?;
                                map_local(&check, &root, &own_dir, &uid)
                            };
                            match tokio::task::spawn_blocking(prepare).await {
                                Ok(Ok(())) => {}
                                Ok(Err(message)) => return Err(err(message)),
                                Err(e) => return Err(err(e.to_string())),
                            }
                            if let PersistentSource::Csi(source) = &bound.source {
                                let using = csi::VolumeUse {
                                    volume: &bound.volume,
                                    name: &v.name,
                                    claim: Some(claim),
                                    read_only: bound.read_only,
                                    block: bound.block,
                                    republish: false,
                                };
                                match csi::set_up(ctx, pod, using, source).await {
                                    Ok(republish) => self.set_up[i] = Some(if republish { REPUBLISH } else { SET_UP }),
                                    Err(csi::SetUpError::Waiting(message)) => {
                                        self.waiting_for_claim = true;
                                        return Err(err(message));
                                    }
                                    Err(csi::SetUpError::Failed(message)) => return Err(err(message)),
                                }
                            }
                        } else if let PersistentSource::Csi(source) = &bound.source {
                            match csi::attach_only(ctx, pod, source).await {
                                Ok(()) => {}
                                Err(csi::SetUpError::Waiting(message)) => {
                                    self.waiting_for_claim = true;
                                    return Err(err(message));
                                }
                                Err(csi::SetUpError::Failed(message)) => return Err(err(message)),
                            }
                        }
                        self.claims.retain(|(index, _)| *index != i);
                        self.claims.push((i, bound));
                        self.set_up[i].get_or_insert(SET_UP);
                    } else if self.set_up[i] == Some(REPUBLISH)
                        && let Some(bound) = self.claim(i).cloned()
                        && let PersistentSource::Csi(source) = &bound.source
                    {
                        let using = csi::VolumeUse {
                            volume: &bound.volume,
                            name: &v.name,
                            claim: Some(claim),
                            read_only: bound.read_only,
                            block: bound.block,
                            republish: true,
                        };
                        match csi::set_up(ctx, pod, using, source).await {
                            Ok(republish) => self.set_up[i] = Some(if republish { REPUBLISH } else { SET_UP }),
                            Err(csi::SetUpError::Waiting(message) | csi::SetUpError::Failed(message)) => {
                                return Err(err(message));
                            }
                        }
                    }
                    continue;
                }
                VolumeSource::Csi(inline) => {
                    let republish = self.set_up[i] == Some(REPUBLISH);
                    if (self.set_up[i].is_none() || republish) && on_disk {
                        let source = csi::CsiSource::inline(&pod.uid, &pod.namespace, &v.name, inline);
                        let using = csi::VolumeUse {
                            volume: &v.name,
                            name: &v.name,
                            claim: None,
                            read_only: inline.read_only,
                            block: false,
                            republish,
                        };
                        match csi::set_up(ctx, pod, using, &source).await {
                            Ok(again) => self.set_up[i] = Some(if again { REPUBLISH } else { SET_UP }),
                            Err(csi::SetUpError::Waiting(message)) => {
                                self.waiting_for_claim = true;
                                return Err(err(message));
                            }
                            Err(csi::SetUpError::Failed(message)) => return Err(err(message)),
                        }
                    }
                    self.set_up[i].get_or_insert(SET_UP);
                    continue;
                }
                VolumeSource::Unsupported(kind) => {
                    if on_disk {
                        return Err(err(format!(
                            "volume kind {kind} is not supported by node-agent (only emptyDir, hostPath, configMap, \
                             secret, downwardAPI, projected, persistentVolumeClaim and csi)"
                        )));
                    }
                    self.set_up[i] = Some(0);
                    continue;
                }
                VolumeSource::ConfigMap(o) => object(ctx, pod, ObjectKind::ConfigMap, o, v.default_mode).await,
                VolumeSource::Secret(o) => object(ctx, pod, ObjectKind::Secret, o, v.default_mode).await,
                VolumeSource::DownwardApi(items) => {
                    content::downward_files(pod, items, v.default_mode, ctx.node.get().as_ref())
                }
                VolumeSource::Projected(sources) => {
                    let mut files = Vec::new();
                    for source in sources {
                        let part = match source {
                            Projection::ConfigMap(o) => {
                                object(ctx, pod, ObjectKind::ConfigMap, o, v.default_mode).await
                            }
                            Projection::Secret(o) => object(ctx, pod, ObjectKind::Secret, o, v.default_mode).await,
                            Projection::DownwardApi(items) => {
                                content::downward_files(pod, items, v.default_mode, ctx.node.get().as_ref())
                            }
                            Projection::Token {
                                audience,
                                expiration_secs,
                                path,
                            } => {
                                let token = if renew_tokens || self.set_up[i].is_none() {
                                    let issued = ctx
                                        .objects
                                        .token(TokenFor {
                                            namespace: &pod.namespace,
                                            service_account: &pod.service_account,
                                            audience,
                                            expiration_secs: *expiration_secs,
                                            pod_name: &pod.name,
                                            pod_uid: &pod.uid,
                                        })
                                        .await
                                        .map_err(|e| err(e.0))?;
                                    let life = issued
                                        .expires
                                        .duration_since(k8s_openapi::jiff::Timestamp::now())
                                        .unsigned_abs();
                                    // the rule the tokens handed to CSI drivers follow too
                                    let due = crate::csi::tokens::renewal_due(now, life);
                                    token_due = Some(token_due.map_or(due, |d| d.min(due)));
                                    Some(issued.token.into_bytes())
                                } else if on_disk {
                                    // not yet due: keep the token the volume holds
                                    let dir = dir.clone();
                                    let path = path.clone();
                                    tokio::task::spawn_blocking(move || disk::read_current(&dir, &path))
                                        .await
                                        .ok()
                                        .flatten()
                                } else {
                                    // a hollow node keeps no token: nothing would be written anyway
                                    None
                                };
                                // with the pod's one runAsUser or an fsGroup the token is private to that
                                // user (and the group: 0640 below), as the kubelet's projected volume
                                let owner = fs_user(pod);
                                let mode = if owner.is_some() || fs_group.is_some() {
                                    0o600
                                } else {
                                    v.default_mode
                                };
                                Ok(token
                                    .map(|data| File {
                                        path: path.clone(),
                                        data,
                                        mode,
                                        owner,
                                    })
                                    .into_iter()
                                    .collect())
                            }
                            Projection::Unsupported(kind) if on_disk => Err(format!(
                                "projected volume source {kind} is not supported by node-agent"
                            )),
                            Projection::Unsupported(_) => Ok(Vec::new()),
                        };
                        files.extend(part.map_err(err)?);
                    }
                    Ok(files)
                }
            }
            .map_err(err)?;
            let hash = hash_files(&files);
            if self.set_up[i] == Some(hash) {
                continue;
            }
            if on_disk {
                let memory = matches!(*v.source, VolumeSource::Secret(_) | VolumeSource::Projected(_));
                blocking(move || {
                    disk::make_dir(&dir, memory, None)?;
                    disk::write_atomic(&dir, &files)?;
                    match fs_group {
                        Some(gid) => ownership::set(&dir, gid, true),
                        None => Ok(()),
                    }
                })
                .await
                .map_err(err)?;
            }
            self.set_up[i] = Some(hash);
        }
        if renew_tokens {
            self.token_due = token_due;
        }
        self.failures = 0;
        Ok(())
    }

    /// How long to wait before retrying a failed set-up: 0.5 s doubling up to about 2 minutes, as the
    /// kubelet's volume operations back off.
    /// A claim not yet bound is read again at least every few seconds, so the pod starts soon after it is bound
    /// (the kubelet's volume manager looks every 100 ms).
    pub fn retry_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let exp = self.failures.min(9) - 1;
        let cap = if self.waiting_for_claim {
            CLAIM_RETRY_MAX
        } else {
            Duration::from_secs(122)
        };
        Duration::from_millis(500 << exp).min(cap)
    }

    /// Whether every volume was set up at least once.
    pub fn ready(&self, pod: &DesiredPod) -> bool {
        self.set_up.len() == pod.volumes.len() && self.set_up.iter().all(Option::is_some)
    }
}

async fn object(
    ctx: &ActionCtx,
    pod: &DesiredPod,
    kind: ObjectKind,
    o: &ObjectVolume,
    default_mode: u32,
) -> Result<Vec<File>, String> {
    let data = ctx
        .objects
        .get(kind, &pod.namespace, &o.name)
        .await
        .map_err(|e| e.0)?;
    content::object_files(kind.name(), o, data.as_deref(), default_mode)
}

/// Prepares the mounts of container `c` before it is made, with `sub_paths` its mounts' `subPath`s (in the
/// order of `c.mounts`, see [`env::sub_paths`](crate::pods::actions::env::sub_paths)): `Bidirectional`
/// propagation only for a privileged container; and on a real node the missing `subPath` directories, created
/// as the kubelet creates them: with the volume's mode, so the runtime does not make them root's 0755.
pub async fn prepare_mounts(
    ctx: &ActionCtx,
    pod: &DesiredPod,
    c: &ContainerSpec,
    vols: Option<&PodVolumes>,
    sub_paths: &[String],
) -> Result<(), String> {
    let privileged = c.security.as_deref().is_some_and(|s| s.privileged);
    for m in &c.mounts {
        match m.propagation {
            Propagation::Invalid => return Err("invalid MountPropagation mode".to_owned()),
            Propagation::Bidirectional if !privileged => {
                return Err(
                    "Bidirectional mount propagation is available only to privileged containers".to_owned(),
                );
            }
            _ => {}
        }
    }
    if ctx.config.layout.pods_dir.is_none() {
        return Ok(());
    }
    for (m, sub) in c.mounts.iter().zip(sub_paths).filter(|(_, sub)| !sub.is_empty()) {
        let Some((i, v)) = m
            .volume
            .map(usize::from)
            .and_then(|i| Some((i, pod.volumes.get(i)?)))
        else {
            continue;
        };
        let (base, sub) = (host_path(ctx, pod, i, v, vols), sub.clone());
        if let Err(error) = blocking(move || disk::make_sub_path(&base, &sub)).await {
            tracing::warn!(pod = %pod.display(), volume = %v.name, %error, "cannot create a subPath directory");
            // the kubelet's message, which keeps the node's paths to itself
            return Err(format!(
                "failed to create subPath directory for volumeMount {:?} of container {:?}",
                v.name, c.name
            ));
        }
    }
    Ok(())
}

/// The CRI mounts of container `c`: each `volumeMount` onto its volume's directory (with `subPath`); mounts of
/// configMap, secret, downward API and projected volumes are read-only, as the kubelet makes them, and so are
/// those of a claim mounted `readOnly`. `sub_paths` are the mounts' `subPath`s, as [`prepare_mounts`] took
/// them; each mount's propagation is passed on.
pub fn mounts(
    ctx: &ActionCtx,
    pod: &DesiredPod,
    c: &ContainerSpec,
    vols: Option<&PodVolumes>,
    sub_paths: &[String],
) -> Vec<cri::Mount> {
    c.mounts
        .iter()
        .enumerate()
        .filter_map(|(n, m)| {
            let i = usize::from(m.volume?);
            let v = pod.volumes.get(i)?;
            let mut host = host_path(ctx, pod, i, v, vols);
            if let Some(sub) = sub_paths.get(n).filter(|s| !s.is_empty()) {
                host = host.join(sub);
            }
            let forced_ro = matches!(
                *v.source,
                VolumeSource::ConfigMap(_)
                    | VolumeSource::Secret(_)
                    | VolumeSource::DownwardApi(_)
                    | VolumeSource::Projected(_)
                    | VolumeSource::Claim { read_only: true, .. }
            ) || matches!(&*v.source, VolumeSource::Csi(c) if c.read_only);
            let propagation = match m.propagation {
                Propagation::HostToContainer => cri::MountPropagation::PropagationHostToContainer,
                Propagation::Bidirectional => cri::MountPropagation::PropagationBidirectional,
                Propagation::None | Propagation::Invalid => cri::MountPropagation::PropagationPrivate,
            };
            Some(cri::Mount {
                container_path: m.path.clone(),
                host_path: host.display().to_string(),
                readonly: m.read_only || forced_ro,
                propagation: propagation as i32,
                ..Default::default()
            })
        })
        .collect()
}

/// The CRI devices of container `c` on a real node: each `volumeDevices` entry as its block volume's node
/// path (see [`block`]) at its `devicePath`, `mrw` (`r` for a read-only claim), as the kubelet makes them. None on
/// a hollow node, which maps nothing. An entry whose volume is not a mapped block volume fails the container.
pub async fn devices(
    ctx: &ActionCtx,
    pod: &DesiredPod,
    c: &ContainerSpec,
    vols: Option<&PodVolumes>,
) -> Result<Vec<cri::Device>, String> {
    let Some(pods_dir) = ctx.config.layout.pods_dir.as_deref() else {
        return Ok(Vec::new());
    };
    if c.devices.is_empty() {
        return Ok(Vec::new());
    }
    let root = PathBuf::from(ctx.config.layout.root_dir());
    let own_dir = pod_dir(pods_dir, &pod.uid);
    let mut wanted = Vec::new();
    for d in c.devices.iter() {
        if !d.path.starts_with('/') {
            return Err(format!("error DevicePath `{}` must be an absolute path", d.path));
        }
        let missing = || {
            format!(
                "cannot find volume {:?} to pass into container {:?}",
                d.name, c.name
            )
        };
        let bound = d
            .volume
            .and_then(|i| vols?.claim(usize::from(i)))
            .filter(|b| b.block)
            .ok_or_else(missing)?;
        let (plugin, read_only) = match &bound.source {
            PersistentSource::Local { .. } => (block::BlockPlugin::Local, bound.read_only),
            PersistentSource::Csi(source) => (block::BlockPlugin::Csi, bound.read_only || source.read_only),
            PersistentSource::HostPath { .. } => return Err(missing()),
        };
        wanted.push((plugin, bound.volume.clone(), d.path.clone(), read_only));
    }
    let uid = pod.uid.to_string();
    blocking(move || {
        wanted
            .into_iter()
            .map(|(plugin, pv, container_path, read_only)| {
                let mapping = block::Mapping {
                    root_dir: &root,
                    pod_dir: &own_dir,
                    uid: &uid,
                    plugin,
                    pv: &pv,
                };
                Ok(cri::Device {
                    container_path,
                    host_path: mapping.host_device()?.display().to_string(),
                    permissions: if read_only { "r" } else { "mrw" }.to_owned(),
                })
            })
            .collect()
    })
    .await
}

/// The kubelet-managed `/etc/hosts` of a pod on a real node: written to `<pod dir>/etc-hosts` when a container is
/// created — localhost entries and the pod's IP with its hostname (and FQDN with a `subdomain`), or the node's
/// own hosts file for a host-network pod, then `hostAliases` — and mounted at `/etc/hosts` unless the container
/// mounts something there itself. `None` on a hollow node, or before the pod has an IP.
pub async fn etc_hosts(
    ctx: &ActionCtx,
    pod: &DesiredPod,
    c: &ContainerSpec,
    pod_ip: &str,
) -> Result<Option<cri::Mount>, String> {
    let Some(pods_dir) = ctx.config.layout.pods_dir.clone() else {
        return Ok(None);
    };
    if c.mounts.iter().any(|m| m.path == "/etc/hosts") || (pod_ip.is_empty() && !pod.host_network) {
        return Ok(None);
    }
    let mut aliases = String::new();
    if !pod.host_aliases().is_empty() {
        aliases.push_str("\n# Entries added by HostAliases.\n");
        for (ip, names) in pod.host_aliases() {
            aliases.push_str(&format!("{ip}\t{}\n", names.join("\t")));
        }
    }
    let domain = &ctx.config.layout.dns.cluster_domain;
    let entry = if pod.subdomain().is_empty() || domain.is_empty() {
        format!("{pod_ip}\t{}\n", pod.hostname())
    } else {
        let fqdn = format!(
            "{}.{}.{}.svc.{domain}",
            pod.hostname(),
            pod.subdomain(),
            pod.namespace
        );
        format!("{pod_ip}\t{fqdn}\t{}\n", pod.hostname())
    };
    let host_network = pod.host_network;
    let file = pod_dir(&pods_dir, &pod.uid).join("etc-hosts");
    let path = file.clone();
    blocking(move || {
        let content = if host_network {
            let node = std::fs::read_to_string("/etc/hosts")?;
            format!("# Kubernetes-managed hosts file (host network).\n{node}{aliases}")
        } else {
            format!(
                "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
                 fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n\
                 {entry}{aliases}"
            )
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // a container may read it the moment it starts: never half-written (a full disk fails the write whole)
        crate::state_file::write_atomic(&path, content.as_bytes(), 0o644)
    })
    .await?;
    Ok(Some(cri::Mount {
        container_path: "/etc/hosts".to_owned(),
        host_path: file.display().to_string(),
        readonly: false,
        ..Default::default()
    }))
}

/// Tears down the volumes of a pod that ran to its end (terminal, or stopped by an eviction or a shutdown)
/// while its object stays: memory-backed emptyDirs give their memory back, disk-backed ones their space, as
/// the kubelet unmounts the volumes of terminated pods. The rest of the pod's directory stays until
/// [`cleanup`].
pub async fn release(ctx: &ActionCtx, uid: &str) {
    let Some(pods_dir) = ctx.config.layout.pods_dir.clone() else {
        csi::release_hollow(ctx, uid);
        return;
    };
    let dir = pod_dir(&pods_dir, uid);
    if let Some(drivers) = &ctx.config.csi_drivers
        && let Err(error) = csi::tear_down(drivers, &pods_dir, &dir).await
    {
        tracing::warn!(%uid, %error, "cannot tear down the terminated pod's CSI volumes");
        return;
    }
    let root = pods_dir.parent().unwrap_or(&pods_dir).to_owned();
    let removed = blocking(move || {
        block::unmap_local(&root, &dir)?;
        disk::remove_volumes(&dir)
    });
    if let Err(error) = removed.await {
        tracing::warn!(%uid, %error, "cannot remove the terminated pod's volumes");
    }
}

/// Removes the pod's directory on a node that keeps one (volumes unmounted first).
pub async fn cleanup(ctx: &ActionCtx, uid: &str) {
    let Some(pods_dir) = ctx.config.layout.pods_dir.clone() else {
        csi::release_hollow(ctx, uid);
        return;
    };
    let dir = pod_dir(&pods_dir, uid);
    if let Some(drivers) = &ctx.config.csi_drivers
        && let Err(error) = csi::tear_down(drivers, &pods_dir, &dir).await
    {
        tracing::warn!(%uid, %error, "cannot tear down the pod's CSI volumes");
        return;
    }
    let root = pods_dir.parent().unwrap_or(&pods_dir).to_owned();
    let removed = blocking(move || {
        block::unmap_local(&root, &dir)?;
        disk::remove_pod_dir(&dir)
    });
    if let Err(error) = removed.await {
        tracing::warn!(%uid, %error, "cannot remove the pod's directory");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn pod(spec: serde_json::Value) -> Arc<DesiredPod> {
        let pod =
            serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec})).unwrap();
        DesiredPod::from_pod(&pod).unwrap()
    }

    fn container(name: &str, user: Option<i64>) -> serde_json::Value {
        match user {
            Some(u) => json!({"name": name, "image": "i", "securityContext": {"runAsUser": u}}),
            None => json!({"name": name, "image": "i"}),
        }
    }

    #[test]
    fn a_claims_volume_mode_must_match_its_use() {
        let pod = pod(json!({
            "initContainers": [{"name": "i", "image": "i", "volumeDevices": [{"name": "dev", "devicePath": "/dev/x"}]}],
            "containers": [{"name": "a", "image": "i", "volumeMounts": [{"name": "fs", "mountPath": "/fs"}]}],
            "volumes": [{"name": "fs", "persistentVolumeClaim": {"claimName": "c1"}},
                        {"name": "dev", "persistentVolumeClaim": {"claimName": "c2"}}],
        }));
        assert_eq!(mode_mismatch(&pod, 0, "fs", false), None);
        assert_eq!(mode_mismatch(&pod, 1, "dev", true), None);
        assert_eq!(
            mode_mismatch(&pod, 0, "fs", true).as_deref(),
            Some("volume fs has volumeMode Block, but is specified in volumeMounts")
        );
        assert_eq!(
            mode_mismatch(&pod, 1, "dev", false).as_deref(),
            Some("volume dev has volumeMode Filesystem, but is specified in volumeDevices")
        );
    }

    #[test]
    fn a_block_volume_that_cannot_be_mapped_is_failed_map_volume() {
        let error = |map, unprocessed| MountError {
            volume: "data".into(),
            message: "m".into(),
            unprocessed,
            map,
        };
        assert_eq!(error(true, false).reason(), "FailedMapVolume");
        assert_eq!(
            error(true, false).to_string(),
            "MapVolume.MapPodDevice failed for volume \"data\" : m"
        );
        assert_eq!(error(false, false).reason(), "FailedMount");
        assert_eq!(
            error(false, false).to_string(),
            "MountVolume.SetUp failed for volume \"data\" : m"
        );
        // not even taken on: the volume manager's message, whatever the mode
        assert_eq!(error(true, true).reason(), "FailedMount");
    }

    #[test]
    fn tokens_belong_to_the_pods_one_run_as_user() {
        let cases = [
            // the pod's user for every container
            (
                json!({"securityContext": {"runAsUser": 1000}, "containers": [container("a", None)]}),
                Some(1000),
            ),
            // each container's own, all the same (init containers count)
            (
                json!({"initContainers": [container("i", Some(7))], "containers": [container("a", Some(7))]}),
                Some(7),
            ),
            // a container's own wins over the pod's
            (
                json!({"securityContext": {"runAsUser": 1000}, "containers": [container("a", Some(0))]}),
                Some(0),
            ),
            // two users, or one container without any: nobody's
            (
                json!({"containers": [container("a", Some(1)), container("b", Some(2))]}),
                None,
            ),
            (
                json!({"containers": [container("a", Some(1)), container("b", None)]}),
                None,
            ),
            (json!({"containers": [container("a", None)]}), None),
        ];
        for (spec, want) in cases {
            assert_eq!(fs_user(&pod(spec.clone())), want, "{spec}");
        }
    }
}
