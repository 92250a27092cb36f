//! Reading a pod's volumes, its containers' volume mounts and the environment sources that name other API
//! objects (configMapKeyRef, secretKeyRef, resourceFieldRef, envFrom) out of the API object, compactly: only
//! what setting the volumes up and resolving the environment read again.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, DownwardAPIVolumeFile, KeyToPath, ResourceFieldSelector, SecretProjection, Volume,
    VolumeMount, VolumeProjection,
};

use crate::density::intern::Interner;

/// One `KeyToPath` item of a configMap / secret volume.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyPath {
    /// The object's key.
    pub key: String,
    /// The relative path it is written to.
    pub path: String,
    /// File mode; the volume's default when unset.
    pub mode: Option<u32>,
}

/// A configMap or secret as a volume (or one source of a projected volume).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectVolume {
    /// The object's name (same namespace as the pod).
    pub name: String,
    /// Which keys go where; every key under its own name when empty.
    pub items: Vec<KeyPath>,
    /// A missing object (or key) is not an error.
    pub optional: bool,
}

/// A `resourceFieldRef`: a container's request or limit, in units of `divisor`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceRef {
    /// The container whose resources are read (the env's own container when empty).
    pub container: String,
    /// `limits.cpu`, `requests.memory`, ...
    pub resource: String,
    /// The divisor as written (`1`, `1m`, `1Mi`); empty means 1.
    pub divisor: String,
}

/// What one downward API file holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DownwardField {
    /// A `fieldRef` path (`metadata.name`, `metadata.labels`, `metadata.annotations['k']`, ...).
    Field(String),
    /// A `resourceFieldRef`.
    Resource(ResourceRef),
}

/// One file of a downward API volume.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DownwardFile {
    /// Relative path.
    pub path: String,
    /// File mode; the volume's default when unset.
    pub mode: Option<u32>,
    /// Content.
    pub field: DownwardField,
}

/// One source of a projected volume.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Projection {
    /// Keys of a ConfigMap.
    ConfigMap(ObjectVolume),
    /// Keys of a Secret.
    Secret(ObjectVolume),
    /// Downward API files.
    DownwardApi(Vec<DownwardFile>),
    /// A service account token from the TokenRequest API, bound to the pod.
    Token {
        /// Audience (the API server's own when empty).
        audience: String,
        /// Requested lifetime in seconds (default 3600).
        expiration_secs: i64,
        /// Relative path of the token file.
        path: String,
    },
    /// A source this agent cannot provide (`clusterTrustBundle`, `podCertificate`).
    Unsupported(&'static str),
}

/// `hostPath.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostPathType {
    /// No check (`""`).
    Unset,
    /// `DirectoryOrCreate`.
    DirectoryOrCreate,
    /// `Directory`.
    Directory,
    /// `FileOrCreate`.
    FileOrCreate,
    /// `File`.
    File,
    /// `Socket`.
    Socket,
    /// `CharDevice`.
    CharDevice,
    /// `BlockDevice`.
    BlockDevice,
}

impl HostPathType {
    pub(crate) fn parse(value: Option<&str>) -> Self {
        match value {
            Some("DirectoryOrCreate") => Self::DirectoryOrCreate,
            Some("Directory") => Self::Directory,
            Some("FileOrCreate") => Self::FileOrCreate,
            Some("File") => Self::File,
            Some("Socket") => Self::Socket,
            Some("CharDevice") => Self::CharDevice,
            Some("BlockDevice") => Self::BlockDevice,
            _ => Self::Unset,
        }
    }
}

/// Where a volume's content comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum VolumeSource {
    /// `emptyDir`: a fresh directory, a tmpfs for `medium: Memory`, a hugetlbfs for `medium: HugePages[-<size>]`.
    EmptyDir {
        /// `medium: Memory`.
        memory: bool,
        /// `sizeLimit` in bytes (the tmpfs size for a memory volume).
        size_limit: Option<i64>,
        /// `medium: HugePages` or `HugePages-<size>`, as written: a hugetlbfs of the pod's page size.
        huge_pages: Option<String>,
    },
    /// `hostPath`.
    HostPath {
        /// The path on the node.
        path: String,
        /// The type check.
        kind: HostPathType,
    },
    /// `configMap`.
    ConfigMap(ObjectVolume),
    /// `secret`.
    Secret(ObjectVolume),
    /// `downwardAPI`.
    DownwardApi(Vec<DownwardFile>),
    /// `projected`.
    Projected(Vec<Projection>),
    /// `persistentVolumeClaim`: whatever the claim's bound PersistentVolume names, resolved when the volume is
    /// set up.
    Claim {
        /// The claim's name (same namespace as the pod).
        claim: String,
        /// `readOnly`: every mount of the volume is read-only.
        read_only: bool,
    },
    /// `csi`: a CSI ephemeral inline volume, published by its driver for this pod alone.
    Csi(InlineCsi),
    /// Any other kind (nfs, iscsi, ...): named for the error message.
    Unsupported(&'static str),
}

/// A pod's inline `csi` volume.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InlineCsi {
    /// The driver's name.
    pub driver: String,
    /// `readOnly`.
    pub read_only: bool,
    /// `fsType` (empty: the driver's default).
    pub fs_type: String,
    /// `volumeAttributes`: the volume context.
    pub attributes: std::collections::BTreeMap<String, String>,
    /// `nodePublishSecretRef`: the Secret (in the pod's namespace) whose data the driver is given with
    /// `NodePublishVolume`.
    pub node_publish_secret: Option<String>,
}

/// One pod volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSpec {
    /// The volume's name.
    pub name: String,
    /// Mode of files without their own (`defaultMode`, 0644 unless set).
    pub default_mode: u32,
    /// Its source, one copy shared by every pod whose volume has the same (see [`VolumeSpec::shared`]).
    pub source: Arc<VolumeSource>,
}

/// One `volumeMount` of a container. The volume is named by its place in the pod's `spec.volumes`, not by
/// name: volume names carry per-pod parts (the service-account token volume is `kube-api-access-<random>`), and
/// without them the containers of a template's replicas are equal and shared (see
/// [`Containers`](crate::pods::model::spec::Containers)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    /// The index of the volume in [`DesiredPod::volumes`](crate::pods::model::spec::DesiredPod::volumes) (`None`: the pod has no
    /// volume of the mount's name; API validation refuses such a pod, and the mount is left out).
    pub volume: Option<u16>,
    /// Where it appears in the container.
    pub path: String,
    /// A path inside the volume to mount instead of its root.
    pub sub_path: String,
    /// `subPathExpr`: a `subPath` with `$(VAR)` references to the container's environment, expanded when the
    /// container is created (the API server allows only one of the two).
    pub sub_path_expr: String,
    /// Mounted read-only.
    pub read_only: bool,
    /// `mountPropagation`.
    pub propagation: Propagation,
}

/// One `volumeDevices` entry of a container: a block volume (a claim whose PersistentVolume has
/// `volumeMode: Block`) handed to the container as a device node at `path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The index of the volume in [`DesiredPod::volumes`](crate::pods::model::spec::DesiredPod::volumes) (`None`:
    /// the pod has no volume of that name; API validation refuses such a pod).
    pub volume: Option<u16>,
    /// The volume's name as the entry gives it.
    pub name: String,
    /// `devicePath`: where the device appears in the container.
    pub path: String,
}

impl DeviceSpec {
    pub(crate) fn from_api(d: &k8s_openapi::api::core::v1::VolumeDevice, volumes: &[Volume]) -> Self {
        Self {
            volume: volumes
                .iter()
                .position(|v| v.name == d.name)
                .and_then(|i| u16::try_from(i).ok()),
            name: d.name.clone(),
            path: d.device_path.clone(),
        }
    }
}

/// `mountPropagation` of a volume mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    /// `None` (or unset): private.
    #[default]
    None,
    /// `HostToContainer`: mounts made on the host later appear in the container.
    HostToContainer,
    /// `Bidirectional`: and the container's mounts appear on the host (privileged containers only).
    Bidirectional,
    /// A value the API does not define (refused when the container is created).
    Invalid,
}

impl MountSpec {
    pub(crate) fn from_api(m: &VolumeMount, volumes: &[Volume]) -> Self {
        Self {
            volume: volumes
                .iter()
                .position(|v| v.name == m.name)
                .and_then(|i| u16::try_from(i).ok()),
            path: m.mount_path.clone(),
            sub_path: m.sub_path.clone().unwrap_or_default(),
            sub_path_expr: m.sub_path_expr.clone().unwrap_or_default(),
            read_only: m.read_only.unwrap_or(false),
            propagation: match m.mount_propagation.as_deref() {
                None | Some("None") => Propagation::None,
                Some("HostToContainer") => Propagation::HostToContainer,
                Some("Bidirectional") => Propagation::Bidirectional,
                Some(_) => Propagation::Invalid,
            },
        }
    }
}

/// One `envFrom` source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvFrom {
    /// A Secret (else a ConfigMap).
    pub secret: bool,
    /// The object's name.
    pub name: String,
    /// Prepended to every key.
    pub prefix: String,
    /// A missing object is not an error.
    pub optional: bool,
}

/// `0644`, the default mode of files in configMap, secret, downward API and projected volumes.
pub const DEFAULT_MODE: u32 = 0o644;

fn mode(value: Option<i32>) -> Option<u32> {
    value.and_then(|m| u32::try_from(m).ok())
}

fn key_paths(items: Option<&Vec<KeyToPath>>) -> Vec<KeyPath> {
    items
        .into_iter()
        .flatten()
        .map(|i| KeyPath {
            key: i.key.clone(),
            path: i.path.clone(),
            mode: mode(i.mode),
        })
        .collect()
}

pub(crate) fn resource_ref(r: &ResourceFieldSelector) -> ResourceRef {
    ResourceRef {
        container: r.container_name.clone().unwrap_or_default(),
        resource: r.resource.clone(),
        divisor: r.divisor.as_ref().map(|q| q.0.clone()).unwrap_or_default(),
    }
}

fn downward_files(items: Option<&Vec<DownwardAPIVolumeFile>>) -> Vec<DownwardFile> {
    items
        .into_iter()
        .flatten()
        .filter_map(|f| {
            let field = if let Some(r) = &f.field_ref {
                DownwardField::Field(r.field_path.clone())
            } else {
                DownwardField::Resource(resource_ref(f.resource_field_ref.as_ref()?))
            };
            Some(DownwardFile {
                path: f.path.clone(),
                mode: mode(f.mode),
                field,
            })
        })
        .collect()
}

fn config_map_projection(c: &ConfigMapProjection) -> ObjectVolume {
    ObjectVolume {
        name: c.name.clone(),
        items: key_paths(c.items.as_ref()),
        optional: c.optional.unwrap_or(false),
    }
}

fn secret_projection(s: &SecretProjection) -> ObjectVolume {
    ObjectVolume {
        name: s.name.clone(),
        items: key_paths(s.items.as_ref()),
        optional: s.optional.unwrap_or(false),
    }
}

fn projection(p: &VolumeProjection) -> Projection {
    if let Some(c) = &p.config_map {
        Projection::ConfigMap(config_map_projection(c))
    } else if let Some(s) = &p.secret {
        Projection::Secret(secret_projection(s))
    } else if let Some(d) = &p.downward_api {
        Projection::DownwardApi(downward_files(d.items.as_ref()))
    } else if let Some(t) = &p.service_account_token {
        Projection::Token {
            audience: t.audience.clone().unwrap_or_default(),
            expiration_secs: t.expiration_seconds.unwrap_or(3600),
            path: t.path.clone(),
        }
    } else if p.cluster_trust_bundle.is_some() {
        Projection::Unsupported("clusterTrustBundle")
    } else {
        Projection::Unsupported("podCertificate")
    }
}

/// The name of a volume kind this agent does not set up.
fn unsupported_kind(v: &Volume) -> &'static str {
    let kinds: [(&'static str, bool); 10] = [
        ("csi", v.csi.is_some()),
        ("ephemeral", v.ephemeral.is_some()),
        ("nfs", v.nfs.is_some()),
        ("iscsi", v.iscsi.is_some()),
        ("image", v.image.is_some()),
        ("fc", v.fc.is_some()),
        ("rbd", v.rbd.is_some()),
        ("cephfs", v.cephfs.is_some()),
        ("glusterfs", v.glusterfs.is_some()),
        ("gitRepo", v.git_repo.is_some()),
    ];
    kinds
        .iter()
        .find(|(_, present)| *present)
        .map_or("unknown", |(name, _)| *name)
}

impl VolumeSpec {
    pub(crate) fn from_api(v: &Volume) -> Self {
        let (default_mode, source) = if let Some(e) = &v.empty_dir {
            let size_limit = e
                .size_limit
                .as_ref()
                .and_then(|q| crate::quantity::Quantity::from_api(q).ok())
                .and_then(|q| i64::try_from(q.value()).ok());
            let memory = e.medium.as_deref() == Some("Memory");
            let huge_pages = e.medium.clone().filter(|m| m.starts_with("HugePages"));
            (
                None,
                VolumeSource::EmptyDir {
                    memory,
                    size_limit,
                    huge_pages,
                },
            )
        } else if let Some(h) = &v.host_path {
            let kind = HostPathType::parse(h.type_.as_deref());
            (
                None,
                VolumeSource::HostPath {
                    path: h.path.clone(),
                    kind,
                },
            )
        } else if let Some(c) = &v.config_map {
            let volume = ObjectVolume {
                name: c.name.clone(),
                items: key_paths(c.items.as_ref()),
                optional: c.optional.unwrap_or(false),
            };
            (c.default_mode, VolumeSource::ConfigMap(volume))
        } else if let Some(s) = &v.secret {
            let volume = ObjectVolume {
                name: s.secret_name.clone().unwrap_or_default(),
                items: key_paths(s.items.as_ref()),
                optional: s.optional.unwrap_or(false),
            };
            (s.default_mode, VolumeSource::Secret(volume))
        } else if let Some(d) = &v.downward_api {
            (
                d.default_mode,
                VolumeSource::DownwardApi(downward_files(d.items.as_ref())),
            )
        } else if let Some(p) = &v.projected {
            let sources = p.sources.iter().flatten().map(projection).collect();
            (p.default_mode, VolumeSource::Projected(sources))
        } else if let Some(c) = &v.persistent_volume_claim {
            let source = VolumeSource::Claim {
                claim: c.claim_name.clone(),
                read_only: c.read_only.unwrap_or(false),
            };
            (None, source)
        } else if let Some(c) = &v.csi {
            let source = VolumeSource::Csi(InlineCsi {
                driver: c.driver.clone(),
                read_only: c.read_only.unwrap_or(false),
                fs_type: c.fs_type.clone().unwrap_or_default(),
                attributes: c.volume_attributes.clone().unwrap_or_default(),
                node_publish_secret: c.node_publish_secret_ref.as_ref().map(|r| r.name.clone()),
            });
            (None, source)
        } else {
            (None, VolumeSource::Unsupported(unsupported_kind(v)))
        };
        Self {
            name: v.name.clone(),
            default_mode: mode(default_mode).unwrap_or(DEFAULT_MODE),
            source: Self::shared(source),
        }
    }

    /// `source`, shared with the volumes already holding an equal one: every pod of a service account has the
    /// same `kube-api-access` projection under a name of its own, which would otherwise be a copy per pod.
    pub fn shared(source: VolumeSource) -> Arc<VolumeSource> {
        static SOURCES: Interner<VolumeSource> = Interner::new();
        SOURCES.intern(source)
    }
}
