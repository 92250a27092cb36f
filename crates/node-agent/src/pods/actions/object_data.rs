//! What a ConfigMap or a Secret holds for a pod ([`ObjectData`]: its keys and values), which of the two an object
//! is ([`ObjectKind`]), and why one could not be read ([`ObjectError`]); shared by the reads
//! ([`objects`](super::objects)) and the watches ([`object_watches`](super::object_watches)).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};

/// The keys and values of a ConfigMap (`data` and `binaryData`) or a Secret.
pub type ObjectData = BTreeMap<String, Vec<u8>>;

/// The content of a ConfigMap: `data`, then `binaryData`.
pub(crate) fn config_map_data(cm: ConfigMap) -> ObjectData {
    let mut data: ObjectData = cm
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    data.extend(
        cm.binary_data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0)),
    );
    data
}

/// The content of a Secret: `data` (and `stringData`, write-only, which an object that skipped the API server
/// may carry).
pub(crate) fn secret_data(s: Secret) -> ObjectData {
    let mut data: ObjectData = s
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    data.extend(
        s.string_data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes())),
    );
    data
}

/// A ConfigMap or a Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    /// `configmaps`.
    ConfigMap,
    /// `secrets`.
    Secret,
}

impl ObjectKind {
    /// The kind as the kubelet's messages name it.
    pub fn name(self) -> &'static str {
        match self {
            Self::ConfigMap => "ConfigMap",
            Self::Secret => "Secret",
        }
    }

    /// The API resource, as in `configmaps "x" not found`.
    pub fn resource(self) -> &'static str {
        match self {
            Self::ConfigMap => "configmaps",
            Self::Secret => "secrets",
        }
    }
}

/// Why an object could not be read.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ObjectError(pub String);
