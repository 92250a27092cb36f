//! The CSI node side: the CSI drivers registered on this node and what their registration publishes.
//!
//! A CSI driver's node plugin registers through the kubelet plugin registration socket
//! ([`crate::plugins`]); [`registration::CsiPluginHandler`] checks the CSI versions it offers, asks the driver
//! for its node ID, volume limit and topology (`NodeGetInfo`) and capabilities (`NodeGetCapabilities`), keeps it
//! in [`CsiDrivers`] for the volume code, and publishes it as the kubelet does ([`node_info`]): an entry in the
//! node's `CSINode` object (driver name, node ID, topology keys, allocatable volume count), the driver's node ID
//! in the Node's `csi.volume.kubernetes.io/nodeid` annotation, and its topology segments as Node labels. When the
//! driver goes, its `CSINode` entry and node ID go with it (labels stay, as the kubelet leaves them).
//!
//! The attachable volumes the node's pods use ([`in_use`]) are kept beside the drivers, for the node status, and
//! so are the volumes published for each pod ([`volume_stats`]), for their statistics, and the service account
//! tokens handed to the drivers ([`tokens`]), until they are due for renewal.
//!
//! A node without disk (a hollow node) has no driver socket to call: its drivers' node side may be answered in
//! process instead ([`InProcessNodeSide`]), with the time and failures its owner scripts.
//!
//! The messages and clients are compiled by the build script from the project's own `proto/csi/v1/csi.proto`
//! (the part of the CSI spec a node agent calls), wire-compatible with the published spec.

pub mod in_use;
pub mod node_info;
pub mod registration;
pub mod tokens;
pub mod volume_stats;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The CSI messages and the Identity and Node clients (generated from `proto/csi/v1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("csi.v1");
}

/// A version a driver offers, `major.minor[.patch]` with an optional leading `v` (extra parts are ignored, as
/// the kubelet ignores them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u64, pub u64, pub u64);

impl Version {
    /// Parses `text`; `None` when it is not a version.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let text = text.strip_prefix('v').unwrap_or(text);
        let core = text.split(['-', '+']).next()?;
        let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
        let major = parts.next()??;
        let minor = parts.next()??;
        let patch = match parts.next() {
            Some(p) => p?,
            None => 0,
        };
        Some(Self(major, minor, patch))
    }

    /// The highest of `versions` this node speaks (CSI 1.x and the 0.x before it), or why there is none.
    pub fn highest_supported(versions: &[String]) -> Result<Self, String> {
        if versions.is_empty() {
            return Err("the plugin returned an empty list for supported versions".into());
        }
        versions
            .iter()
            .filter_map(|v| Self::parse(v))
            .filter(|v| v.0 <= 1)
            .max()
            .ok_or_else(|| format!("none of the versions specified {versions:?} are supported"))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// What a driver's node plugin says it does (`NodeGetCapabilities`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCapabilities {
    /// `STAGE_UNSTAGE_VOLUME`: volumes are staged at the global mount path before they are published.
    pub stage_unstage: bool,
    /// `GET_VOLUME_STATS`: `NodeGetVolumeStats` answers.
    pub volume_stats: bool,
    /// `VOLUME_CONDITION`: the stats carry the volume's condition.
    pub volume_condition: bool,
    /// `EXPAND_VOLUME`: `NodeExpandVolume` answers.
    pub expand: bool,
    /// `VOLUME_MOUNT_GROUP`: the driver applies a pod's fsGroup itself.
    pub volume_mount_group: bool,
}

impl NodeCapabilities {
    /// The capabilities of a `NodeGetCapabilities` answer (unknown ones ignored).
    pub fn of(answer: &v1::NodeGetCapabilitiesResponse) -> Self {
        use v1::node_service_capability::Type;
        use v1::node_service_capability::rpc::Type as Rpc;
        let mut caps = Self::default();
        for cap in &answer.capabilities {
            let Some(Type::Rpc(rpc)) = &cap.r#type else {
                continue;
            };
            match Rpc::try_from(rpc.r#type) {
                Ok(Rpc::StageUnstageVolume) => caps.stage_unstage = true,
                Ok(Rpc::GetVolumeStats) => caps.volume_stats = true,
                Ok(Rpc::VolumeCondition) => caps.volume_condition = true,
                Ok(Rpc::ExpandVolume) => caps.expand = true,
                Ok(Rpc::VolumeMountGroup) => caps.volume_mount_group = true,
                _ => {}
            }
        }
        caps
    }
}

/// A registered CSI driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Driver {
    /// The driver's CSI socket.
    pub endpoint: PathBuf,
    /// The highest CSI version both sides speak.
    pub version: Version,
    /// The driver's ID for this node.
    pub node_id: String,
    /// What its node plugin does.
    pub capabilities: NodeCapabilities,
}

/// A driver's node side answered in process, on a node without disk: what staging and publishing a volume
/// take, and the driver's answer. `Err` is the status a driver would answer the call with.
#[async_trait::async_trait]
pub trait InProcessNodeSide: Send + Sync + fmt::Debug {
    /// `NodeStageVolume` of the volume `handle`.
    async fn stage(&self, handle: &str) -> Result<(), tonic::Status>;
    /// `NodePublishVolume` of the volume `handle` for the pod `pod_uid`.
    async fn publish(&self, handle: &str, pod_uid: &str) -> Result<(), tonic::Status>;
}

/// The CSI drivers registered on this node, by name, the attachable volumes in use and the volumes published.
/// Clones share all of them.
#[derive(Debug, Clone, Default)]
pub struct CsiDrivers {
    // one shared cell for both maps: every node's managers hold a clone, so each pointer here counts per node
    registry: Arc<RwLock<Registry>>,
    in_use: in_use::VolumesInUse,
    published: volume_stats::PublishedVolumes,
}

/// The drivers registered on the node, and those whose node side is answered in process.
#[derive(Debug, Default)]
struct Registry {
    drivers: BTreeMap<String, Driver>,
    /// Drivers whose node side is answered in process (a node without disk), by name.
    in_process: BTreeMap<String, Arc<dyn InProcessNodeSide>>,
    /// The service account tokens handed to drivers, until they are due for renewal.
    tokens: tokens::TokenCache,
}

impl CsiDrivers {
    /// The attachable volumes the node's pods use (`status.volumesInUse`).
    pub fn in_use(&self) -> &in_use::VolumesInUse {
        &self.in_use
    }

    /// The volumes published for the node's pods.
    pub fn published(&self) -> &volume_stats::PublishedVolumes {
        &self.published
    }

    /// The token kept for `key`, with its expiry, unless it is due for renewal at `now`.
    pub fn kept_token(&self, key: &tokens::TokenKey, now: tokio::time::Instant) -> Option<(String, String)> {
        let registry = self.registry.read().unwrap_or_else(|p| p.into_inner());
        registry.tokens.get(key, now)
    }

    /// Keeps `token` (expiring at `expires`, `life` from `now`) for `key`.
    pub fn keep_token(
        &self,
        key: tokens::TokenKey,
        token: String,
        expires: String,
        now: tokio::time::Instant,
        life: std::time::Duration,
    ) {
        let registry = self.registry.read().unwrap_or_else(|p| p.into_inner());
        registry.tokens.keep(key, token, expires, now, life);
    }

    /// Drops the tokens bound to pod `uid` (its volumes are torn down).
    pub fn release_tokens(&self, uid: &str) {
        let registry = self.registry.read().unwrap_or_else(|p| p.into_inner());
        registry.tokens.release_pod(uid);
    }

    /// The driver called `name`, if registered.
    pub fn get(&self, name: &str) -> Option<Driver> {
        self.registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .drivers
            .get(name)
            .cloned()
    }

    /// The registered drivers' names.
    pub fn names(&self) -> Vec<String> {
        self.registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .drivers
            .keys()
            .cloned()
            .collect()
    }

    /// Registers `driver` as `name` (what the registration handler does when a driver's node plugin registers;
    /// a hollow node registers its profile's driver so).
    pub fn insert(&self, name: &str, driver: Driver) {
        self.registry
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .drivers
            .insert(name.to_owned(), driver);
    }

    /// Answers the node side of the driver `name` in process (a node without disk has no socket to call).
    pub fn insert_in_process(&self, name: &str, side: Arc<dyn InProcessNodeSide>) {
        self.registry
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .in_process
            .insert(name.to_owned(), side);
    }

    /// The in-process node side of the driver `name`, if it has one.
    pub fn in_process(&self, name: &str) -> Option<Arc<dyn InProcessNodeSide>> {
        self.registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .in_process
            .get(name)
            .cloned()
    }

    fn remove(&self, name: &str) -> Option<Driver> {
        self.registry
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .drivers
            .remove(name)
    }
}

/// A gRPC channel to a driver's CSI socket (`unix://` prefix allowed, as drivers name their endpoints).
pub async fn connect(endpoint: &Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let text = endpoint.to_string_lossy();
    let path = PathBuf::from(text.strip_prefix("unix://").unwrap_or(&text));
    // the URI is required by the channel but not used: every connection goes to the socket
    tonic::transport::Endpoint::from_static("http://csi.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::codegen::http::Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
}
