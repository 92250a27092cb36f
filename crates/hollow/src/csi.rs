//! Hollow CSI drivers: a profile's `csi:` section gives each of its nodes a CSI driver, registered in the node's
//! agent as a real driver's node plugin registers through `plugins_registry`. The node publishes it as a kubelet
//! does (its `CSINode` entry and the Node's `csi.volume.kubernetes.io/nodeid` annotation, through the agent's own
//! [`NodeInfo`]), so the scheduler's volume limits and the attach/detach controller see a storage node. A pod
//! whose claim is bound to a PersistentVolume of the driver then goes through the agent's own attach path: the
//! volume is in the Node's `volumesInUse`, and the pod waits for the controller's `volumesAttached` and, when the
//! driver's `CSIDriver` says `attachRequired`, for the `VolumeAttachment` its external attacher marks attached.
//! Nothing is staged or published on disk: a hollow node has none. Once the volume is attached, the driver's node
//! side answers staging and publishing in process, each after its scripted latency; scripted failures answer the
//! first calls for a volume (staging) or a volume and pod (publishing) with `code = Internal`, so the pod shows
//! what a slow or failing driver gives a kubelet: `FailedMount` events in the kubelet's words, set-up retried with
//! the kubelet's back-off, the pod Running once a retry succeeds.
//!
//! ```yaml
//! profiles:
//!   - name: storage
//!     count: 100
//!     csi: {driver: hollow.csi.node-agent.io, maxVolumes: 64}   # nodeId: the node's name unless given
//!   - name: slow-storage
//!     count: 10
//!     csi: {stageLatency: 2s, publishLatency: 200ms, stageFailures: 2, publishFailures: 1}
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use node_agent::RunningAgent;
use node_agent::csi::node_info::{DriverNodeInfo, NodeInfo};
use node_agent::csi::{CsiDrivers, Driver, InProcessNodeSide, NodeCapabilities, Version};
use serde::Deserialize;

/// The driver name when the profile names none.
pub const DEFAULT_DRIVER: &str = "hollow.csi.node-agent.io";

fn default_driver() -> String {
    DEFAULT_DRIVER.to_owned()
}

/// A profile's `csi:` section.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CsiSpec {
    /// The driver's name (what `CSIDriver` objects, StorageClasses and PersistentVolumes name).
    #[serde(default = "default_driver")]
    pub driver: String,
    /// The driver's ID for every node of the profile; unset: each node's own name. A controller that knows a
    /// single node (as the e2e suite's mock driver, whose node ID is its name) is served by naming it here.
    #[serde(default)]
    pub node_id: Option<String>,
    /// How many of the driver's volumes a node may hold (the `CSINode` allocatable count); 0: no limit.
    #[serde(default)]
    pub max_volumes: i64,
    /// How long the driver takes to stage a volume (`NodeStageVolume`).
    #[serde(default, with = "crate::duration::text_opt")]
    pub stage_latency: Option<Duration>,
    /// How long the driver takes to publish a volume for a pod (`NodePublishVolume`).
    #[serde(default, with = "crate::duration::text_opt")]
    pub publish_latency: Option<Duration>,
    /// The first this many stagings of each volume on a node fail.
    #[serde(default)]
    pub stage_failures: u32,
    /// The first this many publishings of each volume for each pod fail.
    #[serde(default)]
    pub publish_failures: u32,
}

impl CsiSpec {
    /// Why the section cannot be used, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        let d = &self.driver;
        let ok = !d.is_empty()
            && d.len() <= 63
            && d.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
        if !ok {
            return Err(format!(
                "csi.driver {d:?} is not a CSI driver name (at most 63 lowercase letters, digits, '.' or '-')"
            ));
        }
        if self.node_id.as_deref() == Some("") {
            return Err("csi.nodeId is empty (leave it out for each node's own name)".into());
        }
        if self.max_volumes < 0 {
            return Err(format!("csi.maxVolumes {} is negative", self.max_volumes));
        }
        Ok(())
    }

    /// What the driver reports for `node` (`NodeGetInfo`).
    pub fn node_info(&self, node: &str) -> DriverNodeInfo {
        DriverNodeInfo {
            driver: self.driver.clone(),
            node_id: self.node_id.clone().unwrap_or_else(|| node.to_owned()),
            max_volumes: self.max_volumes,
            topology: Default::default(),
        }
    }

    /// The node's CSI drivers with this one registered.
    pub fn drivers(&self, node: &str) -> CsiDrivers {
        let drivers = CsiDrivers::default();
        drivers.insert(
            &self.driver,
            Driver {
                // never dialled: the node side is answered in process
                endpoint: Default::default(),
                version: Version(1, 0, 0),
                node_id: self.node_info(node).node_id,
                capabilities: NodeCapabilities::default(),
            },
        );
        if self.scripted() {
            drivers.insert_in_process(&self.driver, Arc::new(ScriptedNodeSide::new(self)));
        }
        drivers
    }

    /// Whether the section scripts the node side (latency or failures); without, nothing is kept per node.
    fn scripted(&self) -> bool {
        self.stage_latency.is_some()
            || self.publish_latency.is_some()
            || self.stage_failures > 0
            || self.publish_failures > 0
    }
}

/// One node's driver node side as its profile scripts it. A volume staged once stays staged, as the kubelet
/// stages a volume once per node (a hollow node never unstages: there is nothing on disk); of the failures, only
/// the volumes (or volumes and pods) still failing are kept.
#[derive(Debug)]
pub struct ScriptedNodeSide {
    stage_latency: Duration,
    publish_latency: Duration,
    stage_failures: u32,
    publish_failures: u32,
    /// Failed calls so far, by volume (staging) or volume and pod (publishing).
    failed: Mutex<BTreeMap<(String, String), u32>>,
    /// The volumes staged on the node.
    staged: Mutex<BTreeSet<String>>,
}

impl ScriptedNodeSide {
    fn new(spec: &CsiSpec) -> Self {
        Self {
            stage_latency: spec.stage_latency.unwrap_or_default(),
            publish_latency: spec.publish_latency.unwrap_or_default(),
            stage_failures: spec.stage_failures,
            publish_failures: spec.publish_failures,
            failed: Mutex::default(),
            staged: Mutex::default(),
        }
    }

    /// After `latency`, fails the first `failures` calls for `key`.
    async fn answer(
        &self,
        call: &str,
        key: (String, String),
        latency: Duration,
        failures: u32,
    ) -> Result<(), tonic::Status> {
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if failures == 0 {
            return Ok(());
        }
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        let so_far = failed.entry(key.clone()).or_insert(0);
        if *so_far < failures {
            *so_far += 1;
            return Err(tonic::Status::internal(format!(
                "{call} of volume {}: scripted failure {so_far} of {failures}",
                key.0
            )));
        }
        failed.remove(&key);
        Ok(())
    }
}

#[async_trait::async_trait]
impl InProcessNodeSide for ScriptedNodeSide {
    async fn stage(&self, handle: &str) -> Result<(), tonic::Status> {
        if self
            .staged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(handle)
        {
            return Ok(());
        }
        let key = (handle.to_owned(), String::new());
        self.answer("NodeStageVolume", key, self.stage_latency, self.stage_failures)
            .await?;
        self.staged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(handle.to_owned());
        Ok(())
    }

    async fn publish(&self, handle: &str, pod_uid: &str) -> Result<(), tonic::Status> {
        let key = (handle.to_owned(), pod_uid.to_owned());
        self.answer(
            "NodePublishVolume",
            key,
            self.publish_latency,
            self.publish_failures,
        )
        .await
    }
}

/// Publishes the driver for `agent`'s node once the Node is registered (its `CSINode` entry and node ID
/// annotation, written with the node's own credentials as a kubelet writes them), trying again until it is
/// done or the agent stops.
pub fn publish(agent: &RunningAgent, spec: &CsiSpec) {
    let ctx = agent.context();
    let node = ctx.config.node_name.clone();
    let node_info = NodeInfo::new(ctx.client.clone(), ctx.api.clone(), node.clone());
    let info = spec.node_info(&node);
    let mut registered = ctx.registered.clone();
    agent.spawn(async move {
        while registered.borrow_and_update().is_none() {
            if registered.changed().await.is_err() {
                return;
            }
        }
        let mut delay = Duration::from_secs(1);
        loop {
            match node_info.install(&info).await {
                Ok(()) => return,
                Err(error) => {
                    tracing::warn!(%node, %error, "publishing the node's CSI driver; trying again");
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(60));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_is_checked_and_names_each_node() {
        let spec: CsiSpec = serde_yaml::from_str("{maxVolumes: 8}").unwrap();
        assert_eq!(spec.check(), Ok(()));
        assert_eq!(spec.driver, DEFAULT_DRIVER);
        let info = spec.node_info("hollow-1");
        assert_eq!((info.node_id.as_str(), info.max_volumes), ("hollow-1", 8));
        let fixed: CsiSpec = serde_yaml::from_str("{driver: csi.example.com, nodeId: shared}").unwrap();
        assert_eq!(fixed.node_info("hollow-1").node_id, "shared");
        assert_eq!(
            fixed
                .drivers("hollow-1")
                .get("csi.example.com")
                .map(|d| d.node_id),
            Some("shared".into())
        );
        let bad: CsiSpec = serde_yaml::from_str("{driver: Not_A_Name}").unwrap();
        assert!(bad.check().unwrap_err().contains("csi.driver"));
        assert!(serde_yaml::from_str::<CsiSpec>("{attachLatency: 1s}").is_err());
        assert!(fixed.drivers("hollow-1").in_process("csi.example.com").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_scripted_node_side_fails_first_then_answers_after_its_latency() {
        let spec: CsiSpec = serde_yaml::from_str(
            "{stageLatency: 2s, publishLatency: 100ms, stageFailures: 2, publishFailures: 1}",
        )
        .unwrap();
        let side = spec.drivers("hollow-1").in_process(DEFAULT_DRIVER).unwrap();
        let t0 = tokio::time::Instant::now();
        let first = side.stage("vol-1").await.unwrap_err();
        assert_eq!(first.code(), tonic::Code::Internal);
        assert_eq!(
            first.message(),
            "NodeStageVolume of volume vol-1: scripted failure 1 of 2"
        );
        assert_eq!(t0.elapsed(), Duration::from_secs(2));
        assert!(side.stage("vol-1").await.is_err());
        // another volume has failures of its own
        assert!(side.stage("vol-2").await.is_err());
        side.stage("vol-1").await.unwrap();
        assert_eq!(t0.elapsed(), Duration::from_secs(8));
        // staged once: a retry after a failed publishing finds it staged, without its latency
        side.stage("vol-1").await.unwrap();
        assert_eq!(t0.elapsed(), Duration::from_secs(8));
        assert!(side.publish("vol-1", "pod-a").await.is_err());
        side.publish("vol-1", "pod-a").await.unwrap();
        assert!(side.publish("vol-1", "pod-b").await.is_err());
    }
}
