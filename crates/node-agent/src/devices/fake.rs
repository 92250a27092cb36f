//! In-memory device plugins for hollow nodes: a resource with a number of devices, all healthy, or with one
//! device at a time unhealthy, a different one each period (health flapping: the unhealthy device recovers as
//! the next one fails, in one listing). They go through the
//! device manager as a connected plugin does, so capacity, allocatable, admission, the devices' checkpointing
//! and the pod-resources answers come out of the same code as on a real node. `Allocate` answers an
//! environment variable naming the devices given.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Allocation, DeviceInfo, DeviceManager, DevicePlugin, PluginOptions};

/// One fake plugin's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeDevices {
    /// The extended resource (`example.com/gpu`).
    pub resource: String,
    /// How many devices.
    pub count: u32,
    /// From one period after the start, one device is unhealthy; every period the next one turns unhealthy
    /// and the one before healthy again, so the healthy count stays one below the count. `None`: always
    /// healthy.
    pub flap_every: Option<Duration>,
}

/// The environment variable a fake plugin's `Allocate` sets: `<RESOURCE>_DEVICES` with the resource name in
/// upper case, every other character than a letter or digit an underscore.
pub fn env_name(resource: &str) -> String {
    let base: String = resource
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{base}_DEVICES")
}

struct FakePlugin {
    env: String,
}

#[async_trait::async_trait]
impl DevicePlugin for FakePlugin {
    fn options(&self) -> PluginOptions {
        PluginOptions::default()
    }

    async fn preferred(&self, _: Vec<String>, _: Vec<String>, _: u64) -> Result<Vec<String>, String> {
        Ok(Vec::new())
    }

    async fn allocate(&self, device_ids: Vec<String>) -> Result<Allocation, String> {
        Ok(Allocation {
            envs: BTreeMap::from([(self.env.clone(), device_ids.join(","))]),
            ..Allocation::default()
        })
    }

    async fn pre_start(&self, _: Vec<String>) -> Result<(), String> {
        Ok(())
    }
}

fn listing(count: u32, unhealthy: Option<u32>) -> BTreeMap<String, DeviceInfo> {
    (0..count)
        .map(|i| {
            (
                format!("dev-{i}"),
                DeviceInfo {
                    healthy: Some(i) != unhealthy,
                    numa_nodes: Vec::new(),
                },
            )
        })
        .collect()
}

/// Registers the fake plugin `devices` with `manager`; returns the task that flaps its devices' health until
/// `token` fires, when it flaps.
pub fn start(
    manager: &DeviceManager,
    devices: &FakeDevices,
    token: CancellationToken,
) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
    let plugin = Arc::new(FakePlugin {
        env: env_name(&devices.resource),
    });
    let connection = manager.connected(&devices.resource, plugin);
    manager.listed(&devices.resource, connection, listing(devices.count, None));
    let every = devices.flap_every?;
    let (manager, resource, count) = (manager.clone(), devices.resource.clone(), devices.count);
    Some(async move {
        let mut down = 0u32;
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = token.cancelled() => return,
            }
            if count > 0 {
                manager.listed(&resource, connection, listing(count, Some(down)));
                down = (down + 1) % count;
            }
        }
    })
}
