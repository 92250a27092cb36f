//! DRA drivers' registration through the plugin watcher (kind `DRAPlugin`): a plugin registers under its
//! driver's name and lists the gRPC services it serves as its "versions"; the newest this node speaks is chosen
//! ([`Service::choose`]), and the driver is callable until its registration socket goes. A driver registered
//! again (its plugin restarted, or a second plugin of the same driver) replaces the earlier one.

use std::sync::Arc;

use async_trait::async_trait;

use super::Drivers;
use super::grpc::{GrpcDriver, Service};
use crate::plugins::{Plugin, PluginHandler};

/// The plugin watcher's handler for DRA drivers.
#[derive(Debug, Clone)]
pub struct DraPluginHandler {
    drivers: Drivers,
}

impl DraPluginHandler {
    /// A handler registering into `drivers`.
    pub fn new(drivers: Drivers) -> Self {
        Self { drivers }
    }
}

fn invalid(plugin: &Plugin, why: &str) -> String {
    format!(
        "invalid supported gRPC versions of DRA driver plugin {} at endpoint {}: {why}",
        plugin.name,
        plugin.endpoint.display()
    )
}

#[async_trait]
impl PluginHandler for DraPluginHandler {
    async fn validate(&self, plugin: &Plugin) -> Result<(), String> {
        Service::choose(&plugin.versions)
            .map(|_| ())
            .map_err(|why| invalid(plugin, &why))
    }

    async fn register(&self, plugin: &Plugin) -> Result<(), String> {
        let service = Service::choose(&plugin.versions).map_err(|why| invalid(plugin, &why))?;
        let driver = GrpcDriver::new(&plugin.endpoint, service);
        tracing::info!(driver = %plugin.name, endpoint = %plugin.endpoint.display(), ?service, "DRA driver registered");
        self.drivers.insert(&plugin.name, Arc::new(driver));
        Ok(())
    }

    async fn deregister(&self, plugin: &Plugin) {
        tracing::info!(driver = %plugin.name, "DRA driver deregistered");
        self.drivers.remove(&plugin.name);
    }
}
