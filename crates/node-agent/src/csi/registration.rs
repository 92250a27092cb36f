//! The plugin handler for CSI drivers: validation of the versions a driver offers, and registration —
//! `NodeGetInfo` and `NodeGetCapabilities` on the driver's socket, the driver kept in [`CsiDrivers`], its node
//! information published ([`NodeInfo::install`]). A driver whose registration fails half-way is forgotten again,
//! so the next attempt starts clean; a deregistered driver's node information is removed.

use std::time::Duration;

use async_trait::async_trait;

use super::node_info::{DriverNodeInfo, NodeInfo};
use super::v1::node_client::NodeClient;
use super::v1::{NodeGetCapabilitiesRequest, NodeGetInfoRequest};
use super::{CsiDrivers, Driver, NodeCapabilities, Version, connect};
use crate::plugins::{Plugin, PluginHandler};

/// How long the driver may take over its node information (the kubelet's CSI call timeout).
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Registers CSI drivers (plugin kind [`crate::plugins::CSI_PLUGIN`]).
#[derive(Debug, Clone)]
pub struct CsiPluginHandler {
    drivers: CsiDrivers,
    node_info: NodeInfo,
}

impl CsiPluginHandler {
    /// Keeps registered drivers in `drivers`, publishes them with `node_info`.
    pub fn new(drivers: CsiDrivers, node_info: NodeInfo) -> Self {
        Self { drivers, node_info }
    }

    /// The highest version of `plugin` this node speaks, unless a driver of that name registered with the same
    /// or a higher one.
    fn version(&self, plugin: &Plugin) -> Result<Version, String> {
        let version = Version::highest_supported(&plugin.versions)
            .map_err(|e| format!("CSI driver {:?}: {e}", plugin.name))?;
        if let Some(existing) = self.drivers.get(&plugin.name)
            && existing.version >= version
        {
            return Err(format!(
                "CSI driver {:?}: another driver with the same name is already registered with a higher supported version: {}",
                plugin.name, existing.version
            ));
        }
        Ok(version)
    }

    /// Asks the driver about this node.
    async fn ask(&self, plugin: &Plugin) -> Result<(DriverNodeInfo, NodeCapabilities), String> {
        let channel = connect(&plugin.endpoint)
            .await
            .map_err(|e| format!("connecting to {}: {e}", plugin.endpoint.display()))?;
        let mut node = NodeClient::new(channel);
        let info = tokio::time::timeout(CALL_TIMEOUT, node.node_get_info(NodeGetInfoRequest {}))
            .await
            .map_err(|_| "NodeGetInfo timed out".to_owned())?
            .map_err(|s| format!("NodeGetInfo: {}", s.message()))?
            .into_inner();
        if info.node_id.is_empty() {
            return Err("error adding CSI driver node info: driverNodeID must not be empty".into());
        }
        let caps = tokio::time::timeout(
            CALL_TIMEOUT,
            node.node_get_capabilities(NodeGetCapabilitiesRequest {}),
        )
        .await
        .map_err(|_| "NodeGetCapabilities timed out".to_owned())?
        .map_err(|s| format!("NodeGetCapabilities: {}", s.message()))?
        .into_inner();
        if info.max_volumes_per_node < 0 {
            tracing::warn!(driver = %plugin.name, limit = info.max_volumes_per_node, "the driver's volume limit is negative; left out of CSINode");
        }
        Ok((
            DriverNodeInfo {
                driver: plugin.name.clone(),
                node_id: info.node_id,
                max_volumes: info.max_volumes_per_node,
                topology: info
                    .accessible_topology
                    .map(|t| t.segments.into_iter().collect())
                    .unwrap_or_default(),
            },
            NodeCapabilities::of(&caps),
        ))
    }
}

#[async_trait]
impl PluginHandler for CsiPluginHandler {
    async fn validate(&self, plugin: &Plugin) -> Result<(), String> {
        self.version(plugin).map(drop).map_err(|e| {
            format!(
                "validation failed for CSI Driver {} at endpoint {}: {e}",
                plugin.name,
                plugin.endpoint.display()
            )
        })
    }

    async fn register(&self, plugin: &Plugin) -> Result<(), String> {
        let version = self.version(plugin)?;
        let (info, capabilities) = self.ask(plugin).await?;
        self.drivers.insert(
            &plugin.name,
            Driver {
                endpoint: plugin.endpoint.clone(),
                version,
                node_id: info.node_id.clone(),
                capabilities,
            },
        );
        if let Err(e) = self.node_info.install(&info).await {
            self.drivers.remove(&plugin.name);
            if let Err(error) = self.node_info.uninstall(&plugin.name).await {
                tracing::warn!(driver = %plugin.name, %error, "removing a half-registered CSI driver's node information");
            }
            return Err(format!("error updating the node's CSI driver information: {e}"));
        }
        tracing::info!(driver = %plugin.name, node_id = %info.node_id, %version, ?capabilities, "CSI driver registered");
        Ok(())
    }

    async fn deregister(&self, plugin: &Plugin) {
        self.drivers.remove(&plugin.name);
        if let Err(error) = self.node_info.uninstall(&plugin.name).await {
            tracing::warn!(driver = %plugin.name, %error, "removing a CSI driver's node information");
        }
    }
}
