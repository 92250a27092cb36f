//! Kubelet plugin registration: the plugin watcher on `<root-dir>/plugins_registry`.
//!
//! A node-local plugin (a CSI driver through its registrar, later a device plugin or a DRA driver) announces itself
//! by serving the kubelet's `pluginregistration.v1` `Registration` service on a unix socket it creates in the
//! registry directory. The [`PluginWatcher`] finds the socket, asks the plugin who it is (`GetInfo`: kind, name,
//! endpoint, API versions), hands it to the [`PluginHandler`] registered for its kind — which validates it and
//! registers it (a CSI driver: `NodeGetInfo` into the `CSINode` object) — and tells the plugin the verdict
//! (`NotifyRegistrationStatus`). When the socket goes (the plugin stopped) or is replaced by a new one (the plugin
//! restarted), the handler deregisters the plugin; a new socket is registered afresh.
//!
//! This module owns the directory, the protocol and the bookkeeping of which socket is registered; what a
//! registration means belongs to the handlers. The messages are compiled by the build script from the project's
//! own `proto/pluginregistration/v1/api.proto`, wire-compatible with the published API.

mod watcher;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use async_trait::async_trait;

pub use watcher::PluginWatcher;

/// The messages, client and server of the plugin registration API v1 (generated from
/// `proto/pluginregistration/v1`; the server side is what a plugin serves).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("pluginregistration");
}

/// The registry directory's name under the root directory (the kubelet's).
pub const DIR: &str = "plugins_registry";

/// The plugin kind of a CSI driver.
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// The plugin kind of a device plugin.
pub const DEVICE_PLUGIN: &str = "DevicePlugin";
/// The plugin kind of a dynamic resource allocation driver.
pub const DRA_PLUGIN: &str = "DRAPlugin";

/// Where plugins of an agent whose root directory is `root_dir` put their registration sockets.
pub fn registry_dir(root_dir: &Path) -> PathBuf {
    root_dir.join(DIR)
}

/// A plugin as it described itself on its registration socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plugin {
    /// The registration socket.
    pub socket: PathBuf,
    /// The plugin's kind ([`CSI_PLUGIN`], [`DEVICE_PLUGIN`], [`DRA_PLUGIN`]).
    pub kind: String,
    /// Its name, unique among plugins of its kind (a CSI driver's name).
    pub name: String,
    /// Where its own service is served: the endpoint it named, else its registration socket (as the kubelet
    /// takes it).
    pub endpoint: PathBuf,
    /// The versions of its kind's API it speaks.
    pub versions: Vec<String>,
}

/// What registering a plugin of one kind means. Handlers are called one plugin at a time.
#[async_trait]
pub trait PluginHandler: Send + Sync {
    /// Whether the plugin may register (a version the handler speaks, no clash with a registered plugin);
    /// the error is sent back to the plugin.
    async fn validate(&self, plugin: &Plugin) -> Result<(), String>;
    /// Registers the plugin; the error is sent back to the plugin, and registration is tried again later.
    async fn register(&self, plugin: &Plugin) -> Result<(), String>;
    /// The plugin's socket is gone (or replaced): forget it.
    async fn deregister(&self, plugin: &Plugin);
}
