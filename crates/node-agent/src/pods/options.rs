//! What a pod lifecycle takes besides its configuration when an agent runs it ([`PodOptions`]): how probes reach
//! containers, where start-up timing goes, where pods come from, in-memory static manifests, and on a real node
//! the root directory, QoS cgroups and registered CSI drivers. The agent's side of the wiring lives with the agent.

use std::sync::Arc;

use crate::pods::runtime::cgroups::QosCgroups;
use crate::pods::{NetworkProbes, NodeKind, PodMetrics, PodSource, ProbeTransport};

/// What an agent's pod lifecycle uses besides the agent context.
pub struct PodOptions {
    /// How network probes reach containers (default: the real network).
    pub probes: Arc<dyn ProbeTransport>,
    /// Where start-up timing goes (share one across a fleet).
    pub metrics: Arc<PodMetrics>,
    /// Where pods come from (default: the agent's own watch).
    pub source: PodSource,
    /// Static pod manifests handed over in memory (a hollow fleet's per-node pods), each with the name that
    /// stands for its file; run besides `staticPodPath` / `staticPodURL`.
    pub static_manifests: Vec<(String, Arc<k8s_openapi::api::core::v1::Pod>)>,
    /// Which kind of node this is ([`with_root_dir`](Self::with_root_dir) makes it a real one).
    pub kind: NodeKind,
    /// The agent's root directory (`--root-dir`) on a real node: pod volumes are written under its `pods/`.
    pub root_dir: Option<std::path::PathBuf>,
    /// The node's QoS cgroups (a real node with `cgroupsPerQOS`; see [`QosCgroups::start`]). `None`: the machine's
    /// cgroups are not touched.
    pub cgroups: Option<Arc<QosCgroups>>,
    /// The CSI drivers registered on a real node (see [`with_csi_drivers`](Self::with_csi_drivers)); `None`: CSI
    /// volumes are not published.
    pub csi_drivers: Option<crate::csi::CsiDrivers>,
    /// The node's device manager (see [`with_devices`](Self::with_devices)); `None`: no device plugins.
    pub devices: Option<crate::devices::DeviceManager>,
    /// The node's DRA manager (see [`with_dra`](Self::with_dra)); `None`: resource claims are not prepared.
    pub dra: Option<Arc<crate::dra::DraManager>>,
    /// Cluster-wide informers shared with other nodes (a hollow fleet's); `None`: the node starts its own when
    /// its pod side starts.
    pub informers: Option<Arc<crate::informers::ClusterInformers>>,
}

impl PodOptions {
    /// Network probes through `probes`, own start-up metrics, the agent's own watch. An agent on an in-memory
    /// runtime passes a [`ScriptedProbes`](crate::pods::ScriptedProbes) here: nothing of the real network is built.
    pub fn with_probes(probes: Arc<dyn ProbeTransport>) -> Self {
        Self {
            probes,
            metrics: Arc::new(PodMetrics::new()),
            source: PodSource::Watch,
            static_manifests: Vec::new(),
            kind: NodeKind::Hollow,
            root_dir: None,
            cgroups: None,
            csi_drivers: None,
            devices: None,
            dra: None,
            informers: None,
        }
    }

    /// A real node whose agent keeps its files under `root_dir` (pod volumes under `root_dir/pods`).
    pub fn with_root_dir(mut self, root_dir: impl Into<std::path::PathBuf>) -> Self {
        self.kind = NodeKind::Real;
        self.root_dir = Some(root_dir.into());
        self
    }

    /// Admits device plugin resources against `devices` and gives containers their devices (a real node's
    /// registered plugins, or a hollow node's fakes).
    pub fn with_devices(mut self, devices: crate::devices::DeviceManager) -> Self {
        self.devices = Some(devices);
        self
    }

    /// Publishes CSI volumes through the drivers registered in `drivers` (a real node; the plugin watcher's CSI
    /// handler fills it).
    pub fn with_csi_drivers(mut self, drivers: crate::csi::CsiDrivers) -> Self {
        self.csi_drivers = Some(drivers);
        self
    }

    /// Prepares pods' resource claims through `dra` (its drivers registered by the plugin watcher on a real
    /// node, by the fleet on a hollow one).
    pub fn with_dra(mut self, dra: Arc<crate::dra::DraManager>) -> Self {
        self.dra = Some(dra);
        self
    }

    /// Puts pods in the node's QoS cgroups (a real node).
    pub fn with_cgroups(mut self, cgroups: Arc<QosCgroups>) -> Self {
        self.cgroups = Some(cgroups);
        self
    }
}

/// Probes over the real network ([`NetworkProbes`]), own metrics, own watch.
impl Default for PodOptions {
    fn default() -> Self {
        Self::with_probes(Arc::new(NetworkProbes::new()))
    }
}

impl std::fmt::Debug for PodOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodOptions")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}
