//! What a registered CSI driver publishes about this node, kept as the kubelet keeps it: the node's `CSINode`
//! object (created owned by the Node, one entry per driver: name, node ID, topology keys, allocatable volume
//! count), the Node's `csi.volume.kubernetes.io/nodeid` annotation (a JSON map of driver name to node ID) and the
//! driver's topology segments as Node labels. A label already set to another value is a collision and fails
//! the registration. Writes carry the object's resourceVersion and are tried again on a conflict.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::api::{ApiCalls, is_conflict, is_not_found};
use crate::client::ApiClient;

/// The Node annotation holding each driver's node ID.
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";
/// How many times a write is tried when it meets a conflict.
const ATTEMPTS: usize = 5;

/// Why a driver's node information could not be published.
#[derive(Debug, thiserror::Error)]
pub enum NodeInfoError {
    /// An API request failed.
    #[error("{verb} {resource} {name}: {source}")]
    Api {
        /// The verb.
        verb: &'static str,
        /// The resource.
        resource: &'static str,
        /// The object's name.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The driver reported a topology value that another label of the Node contradicts.
    #[error(
        "detected topology value collision: driver reported {key:?}:{value:?} but existing label is {key:?}:{existing:?}"
    )]
    TopologyCollision {
        /// The label.
        key: String,
        /// The driver's value.
        value: String,
        /// The Node's.
        existing: String,
    },
    /// The Node's annotation is not a JSON map of driver name to node ID.
    #[error("the Node's {NODE_ID_ANNOTATION} annotation is not a JSON map: {0}")]
    Annotation(serde_json::Error),
    /// Still conflicting after every attempt.
    #[error("{resource} {name} kept changing under the update")]
    Conflicts {
        /// The resource.
        resource: &'static str,
        /// The object's name.
        name: String,
    },
}

/// What one driver reported for this node (`NodeGetInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverNodeInfo {
    /// The driver's name.
    pub driver: String,
    /// Its ID for this node.
    pub node_id: String,
    /// How many of its volumes the node may hold; 0: no limit.
    pub max_volumes: i64,
    /// Its topology segments for this node.
    pub topology: BTreeMap<String, String>,
}

/// Publishes drivers' node information for one node.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    client: ApiClient,
    calls: ApiCalls,
    node: String,
}

impl NodeInfo {
    /// For the node called `node`, writing with `client` through `calls`.
    pub fn new(client: ApiClient, calls: ApiCalls, node: impl Into<String>) -> Self {
        Self {
            client,
            calls,
            node: node.into(),
        }
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    fn api_err(
        verb: &'static str,
        resource: &'static str,
        name: &str,
    ) -> impl FnOnce(kube::Error) -> NodeInfoError {
        let name = name.to_owned();
        move |source| NodeInfoError::Api {
            verb,
            resource,
            name,
            source,
        }
    }

    /// Records `info` on the Node (node ID annotation, topology labels), then in the `CSINode` object.
    pub async fn install(&self, info: &DriverNodeInfo) -> Result<(), NodeInfoError> {
        self.update_node(|node| {
            let mut ids = node_ids(node)?;
            let mut changed =
                ids.insert(info.driver.clone(), info.node_id.clone()).as_ref() != Some(&info.node_id);
            let labels = node.metadata.labels.clone().unwrap_or_default();
            let mut new_labels = serde_json::Map::new();
            for (key, value) in &info.topology {
                match labels.get(key) {
                    Some(existing) if existing != value => {
                        return Err(NodeInfoError::TopologyCollision {
                            key: key.clone(),
                            value: value.clone(),
                            existing: existing.clone(),
                        });
                    }
                    Some(_) => {}
                    None => {
                        new_labels.insert(key.clone(), value.clone().into());
                        changed = true;
                    }
                }
            }
            Ok(changed.then(|| {
                json!({"metadata": {
                    "labels": new_labels,
                    "annotations": {NODE_ID_ANNOTATION: serde_json::to_string(&ids).unwrap_or_default()},
                }})
            }))
        })
        .await?;
        self.update_csi_node(|drivers| {
            let entry = driver_entry(info);
            let old = drivers.iter().position(|d| d.name == info.driver);
            if let Some(i) = old {
                if drivers[i] == entry {
                    return false;
                }
                drivers.remove(i);
            }
            drivers.push(entry);
            true
        })
        .await
    }

    /// Removes `driver` from the `CSINode` object, then its node ID from the Node.
    pub async fn uninstall(&self, driver: &str) -> Result<(), NodeInfoError> {
        self.update_csi_node(|drivers| {
            let before = drivers.len();
            drivers.retain(|d| d.name != driver);
            drivers.len() != before
        })
        .await?;
        self.update_node(|node| {
            let mut ids = node_ids(node)?;
            if ids.remove(driver).is_none() {
                return Ok(None);
            }
            let value = if ids.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::to_string(&ids).unwrap_or_default().into()
            };
            Ok(Some(
                json!({"metadata": {"annotations": {NODE_ID_ANNOTATION: value}}}),
            ))
        })
        .await
    }

    /// Creates the node's `CSINode` object with no drivers if there is none (the kubelet does so at start, so
    /// the scheduler finds one for every node).
    pub async fn ensure_csi_node(&self) -> Result<(), NodeInfoError> {
        self.update_csi_node(|_| false).await
    }

    /// Applies `change` (a merge patch, or `None` for no change) to the Node, read afresh on each attempt.
    async fn update_node(
        &self,
        mut change: impl FnMut(&Node) -> Result<Option<serde_json::Value>, NodeInfoError>,
    ) -> Result<(), NodeInfoError> {
        let api: Api<Node> = Api::all(self.client.kube());
        for _ in 0..ATTEMPTS {
            let node = self
                .calls
                .run("get", "nodes", api.get(&self.node))
                .await
                .map_err(Self::api_err("get", "nodes", &self.node))?;
            let Some(mut patch) = change(&node)? else {
                return Ok(());
            };
            patch["metadata"]["resourceVersion"] = node.metadata.resource_version.clone().into();
            match self
                .calls
                .run(
                    "patch",
                    "nodes",
                    api.patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch)),
                )
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(Self::api_err("patch", "nodes", &self.node)(e)),
            }
        }
        Err(NodeInfoError::Conflicts {
            resource: "nodes",
            name: self.node.clone(),
        })
    }

    /// Applies `change` (true when it changed the drivers) to the `CSINode` object, created if missing.
    async fn update_csi_node(
        &self,
        mut change: impl FnMut(&mut Vec<CSINodeDriver>) -> bool,
    ) -> Result<(), NodeInfoError> {
        let api: Api<CSINode> = Api::all(self.client.kube());
        for _ in 0..ATTEMPTS {
            let existing = self
                .calls
                .run("get", "csinodes", api.get_opt(&self.node))
                .await
                .map_err(Self::api_err("get", "csinodes", &self.node))?;
            let result = match existing {
                Some(mut csi_node) => {
                    if !change(&mut csi_node.spec.drivers) {
                        return Ok(());
                    }
                    self.calls
                        .run(
                            "update",
                            "csinodes",
                            api.replace(&self.node, &PostParams::default(), &csi_node),
                        )
                        .await
                        .map(drop)
                }
                None => {
                    let mut drivers = Vec::new();
                    change(&mut drivers);
                    let owner = self.owner().await?;
                    let csi_node = CSINode {
                        metadata: ObjectMeta {
                            name: Some(self.node.clone()),
                            owner_references: owner.map(|o| vec![o]),
                            ..Default::default()
                        },
                        spec: CSINodeSpec { drivers },
                    };
                    self.calls
                        .run(
                            "create",
                            "csinodes",
                            api.create(&PostParams::default(), &csi_node),
                        )
                        .await
                        .map(drop)
                }
            };
            match result {
                Ok(()) => return Ok(()),
                Err(e) if is_conflict(&e) || crate::api::is_already_exists(&e) => continue,
                Err(e) => return Err(Self::api_err("write", "csinodes", &self.node)(e)),
            }
        }
        Err(NodeInfoError::Conflicts {
            resource: "csinodes",
            name: self.node.clone(),
        })
    }

    /// The Node as the `CSINode` object's owner (so it goes when the Node is deleted); `None` when the Node is
    /// not there.
    async fn owner(&self) -> Result<Option<OwnerReference>, NodeInfoError> {
        let api: Api<Node> = Api::all(self.client.kube());
        match self.calls.run("get", "nodes", api.get(&self.node)).await {
            Ok(node) => Ok(node.metadata.uid.map(|uid| OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: self.node.clone(),
                uid,
                ..Default::default()
            })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(Self::api_err("get", "nodes", &self.node)(e)),
        }
    }
}

/// The Node's driver -> node ID map.
fn node_ids(node: &Node) -> Result<BTreeMap<String, String>, NodeInfoError> {
    match node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_ID_ANNOTATION))
    {
        None => Ok(BTreeMap::new()),
        Some(text) if text.is_empty() => Ok(BTreeMap::new()),
        Some(text) => serde_json::from_str(text).map_err(NodeInfoError::Annotation),
    }
}

/// The `CSINode` entry for `info`: topology keys sorted; the volume limit only when the driver gives one (capped
/// at the field's 32 bits, as the kubelet caps it).
pub fn driver_entry(info: &DriverNodeInfo) -> CSINodeDriver {
    CSINodeDriver {
        name: info.driver.clone(),
        node_id: info.node_id.clone(),
        topology_keys: (!info.topology.is_empty()).then(|| info.topology.keys().cloned().collect()),
        allocatable: (info.max_volumes > 0).then(|| VolumeNodeResources {
            count: Some(i32::try_from(info.max_volumes).unwrap_or(i32::MAX)),
        }),
    }
}
