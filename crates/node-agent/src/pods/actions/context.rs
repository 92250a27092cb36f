//! What every action on a pod of one agent shares: configuration, the runtime, the probe transport, the event
//! recorder, metrics, the status manager's handle, the node view, the source of referenced API objects and the
//! image pull gate. The pod workers hold it inside their own context ([`crate::pods::worker::AgentCtx`]).

use std::future::Future;
use std::sync::Arc;

use runtime_api::{Runtime, RuntimeError};

use crate::pods::PodConfig;
use crate::pods::actions::objects::PodObjects;
use crate::pods::events::Recorder;
use crate::pods::metrics::PodMetrics;
use crate::pods::model::spec::DesiredPod;
use crate::pods::probes::{ProbeMetrics, ProbeTransport};
use crate::pods::runtime::observed::{SandboxRecord, ViewSource};
use crate::pods::status::StatusHandle;

pub(crate) struct ActionCtx {
    pub config: PodConfig,
    pub runtime: Arc<dyn Runtime>,
    /// `containerID` prefix: the runtime's name, e.g. `containerd` in `containerd://<id>`.
    pub runtime_type: Box<str>,
    pub probes: Arc<dyn ProbeTransport>,
    pub events: Recorder,
    pub metrics: Arc<PodMetrics>,
    /// This node's per-probe series (`/metrics/probes`).
    pub probe_metrics: Arc<ProbeMetrics>,
    pub status: StatusHandle,
    pub node: crate::pods::NodeViews,
    /// ConfigMaps, Secrets and tokens that pods' volumes and environment name.
    pub objects: Arc<dyn PodObjects>,
    /// The node's image pull gate.
    pub pulls: Arc<crate::pods::actions::pull_gate::PullGate>,
}

impl ActionCtx {
    /// Runs one runtime call, timed as `op`.
    pub async fn rt<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, RuntimeError>>,
    ) -> Result<T, RuntimeError> {
        self.metrics.runtime_op(op, fut).await
    }

    /// The pod's primary IP as its containers' environment, probes and hooks see it: for a host-network pod
    /// the node's (the runtime reports no sandbox IP there; the kubelet takes the host's as the pod's), the
    /// sandbox's otherwise.
    pub fn pod_ip(&self, pod: &DesiredPod, sandbox: Option<&SandboxRecord>) -> String {
        if pod.host_network {
            return self.host_ips().into_iter().next().unwrap_or_default();
        }
        sandbox.and_then(|s| s.ips.first().cloned()).unwrap_or_default()
    }

    /// Where this node reads a pod's runtime view.
    pub fn view_source(&self) -> ViewSource<'_> {
        ViewSource {
            runtime: &*self.runtime,
            metrics: &self.metrics,
            termination_messages: self.config.kind == crate::pods::NodeKind::Real,
        }
    }

    /// The node's host IPs (InternalIP first).
    pub fn host_ips(&self) -> Vec<String> {
        self.node.host_ips()
    }
}
