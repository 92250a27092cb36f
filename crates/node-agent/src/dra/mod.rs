//! Dynamic resource allocation on the node: the kubelet's half of DRA.
//!
//! The scheduler allocates devices from the ResourceSlices drivers publish to a pod's ResourceClaims and reserves
//! the claims for the pod; the node then asks each driver whose devices a claim holds to prepare them
//! (`NodePrepareResources`) before the pod's sandbox is created, passes the CDI device IDs the drivers answer
//! to the runtime for the containers that name the claim, and asks the drivers to release the claims
//! (`NodeUnprepareResources`) once the pod's containers have stopped and no other pod on the node uses them.
//!
//! * [`registration`] — DRA drivers' kubelet plugins register through the plugin watcher ([`crate::plugins`],
//!   kind `DRAPlugin`) naming the gRPC services they serve (`v1.DRAPlugin`, `v1beta1.DRAPlugin`).
//! * [`grpc`] — the client of a driver's kubelet plugin on its unix socket.
//! * [`claims`] — which claims are prepared for which pods with which devices, checkpointed to the node's disk
//!   so that a restarted agent still knows what to pass to the runtime and what to release.
//! * [`manager`] — [`DraManager`]: prepare for a pod, the CDI devices of one container, unprepare.
//!
//! A driver is anything that implements [`Driver`]: on a real node the gRPC client of its plugin, on a hollow
//! node an in-process driver of the fleet's. The messages are compiled by the build script from the project's
//! own `proto/dra/{v1,v1beta1}/api.proto`, wire-compatible with the published API.

pub mod claims;
pub mod grpc;
pub mod manager;
pub mod registration;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use manager::{DraManager, PodClaim, PodRef};

/// The messages and client of the DRA driver API v1 (generated from `proto/dra/v1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// The messages and client of the DRA driver API v1beta1 (generated from `proto/dra/v1beta1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// A ResourceClaim as a driver is told of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClaimRef {
    /// The claim's namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

/// A device a driver prepared for a claim.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The claim's requests the device serves (empty: all of them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request_names: Vec<String>,
    /// The device's pool in the driver's ResourceSlices.
    pub pool: String,
    /// The device's name in its pool.
    pub device: String,
    /// The fully qualified CDI device IDs the runtime injects into the containers that use the device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cdi_ids: Vec<String>,
    /// The share of the device this claim holds, when the device is shared by several allocations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
}

/// Per claim UID, the devices prepared or why the claim was not.
pub type Prepared = BTreeMap<String, Result<Vec<PreparedDevice>, String>>;
/// Per claim UID, whether the claim was released, or why not.
pub type Unprepared = BTreeMap<String, Result<(), String>>;

/// A DRA driver's node side: what the kubelet asks of it.
#[async_trait]
pub trait Driver: Send + Sync {
    /// Prepares the devices allocated to `claims`. The outer error is a failure of the call as a whole.
    async fn prepare(&self, claims: &[ClaimRef]) -> Result<Prepared, String>;
    /// Releases what preparing `claims` set up. The outer error is a failure of the call as a whole.
    async fn unprepare(&self, claims: &[ClaimRef]) -> Result<Unprepared, String>;
}

/// The DRA drivers registered on this node, by driver name (shared between the registration handler, which
/// fills it, and the [`DraManager`], which calls them).
#[derive(Clone, Default)]
pub struct Drivers(Arc<RwLock<BTreeMap<String, Arc<dyn Driver>>>>);

impl std::fmt::Debug for Drivers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl Drivers {
    /// Registers (or replaces) the driver `name`.
    pub fn insert(&self, name: &str, driver: Arc<dyn Driver>) {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.to_owned(), driver);
    }

    /// Forgets the driver `name`.
    pub fn remove(&self, name: &str) {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(name);
    }

    /// The driver `name`, if registered.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Driver>> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// The names of the registered drivers.
    pub fn names(&self) -> Vec<String> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }
}
