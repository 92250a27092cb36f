//! What a worker keeps of an in-place resize it has not finished applying (see
//! [`actuate`](crate::pods::worker::actuate)): per running container, the resources it still runs with.

use std::collections::BTreeMap;

use crate::pods::model::resources::ContainerResources;

/// The containers whose resources are being brought to their allocation.
#[derive(Debug, Default)]
pub(crate) struct Resizing {
    /// Per running container (by runtime ID): the resources it runs with.
    pub actuated: BTreeMap<String, ContainerResources>,
    /// Why the last attempt failed.
    pub error: Option<String>,
    /// The pod generation the resize was accepted at.
    pub generation: Option<i64>,
    /// When the worker took it, seconds since the epoch.
    pub since: i64,
}
