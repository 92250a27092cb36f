//! One registered device plugin, reached on its own socket: the agent's client of the plugin's `DevicePlugin`
//! service ([`GrpcPlugin`]) and the task that follows its `ListAndWatch` stream into the device manager
//! ([`follow`]) until the stream ends, when the plugin's devices stop being allocatable.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::v1beta1::device_plugin_client::DevicePluginClient;
use super::v1beta1::{self as api};
use super::{Allocation, DeviceInfo, DeviceManager, DevicePlugin, PluginOptions};

/// How long connecting to a plugin's socket may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `PreStartContainer` may take (the kubelet's limit).
const PRE_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the other calls may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A gRPC channel to the unix socket `path`.
pub async fn channel(path: &Path) -> Result<Channel, String> {
    let path: PathBuf = path.to_owned();
    let shown = path.display().to_string();
    // the URI is required by the channel but not used: every connection goes to the socket
    let endpoint = tonic::transport::Endpoint::from_static("http://device-plugin.invalid");
    let connect = endpoint.connect_with_connector(tower::service_fn(move |_: tonic::codegen::http::Uri| {
        let path = path.clone();
        async move {
            tokio::net::UnixStream::connect(path)
                .await
                .map(hyper_util::rt::TokioIo::new)
        }
    }));
    match tokio::time::timeout(DIAL_TIMEOUT, connect).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(e)) => Err(format!("connecting to {shown}: {e}")),
        Err(_) => Err(format!("connecting to {shown}: timed out")),
    }
}

/// A device plugin served over gRPC on its socket.
pub struct GrpcPlugin {
    client: DevicePluginClient<Channel>,
    options: PluginOptions,
}

impl GrpcPlugin {
    /// A plugin on `channel` with the options it registered with.
    pub fn new(channel: Channel, options: PluginOptions) -> Self {
        Self {
            client: DevicePluginClient::new(channel),
            options,
        }
    }
}

fn status(e: &tonic::Status) -> String {
    format!("{}: {}", e.code(), e.message())
}

async fn timed<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(e)) => Err(status(&e)),
        Err(_) => Err("timed out".to_owned()),
    }
}

/// The plugin's answer for one container, as the device manager keeps it.
pub fn allocation(r: api::ContainerAllocateResponse) -> Allocation {
    Allocation {
        envs: r.envs.into_iter().collect(),
        mounts: r
            .mounts
            .into_iter()
            .map(|m| (m.container_path, m.host_path, m.read_only))
            .collect(),
        devices: r
            .devices
            .into_iter()
            .map(|d| (d.container_path, d.host_path, d.permissions))
            .collect(),
        annotations: r.annotations.into_iter().collect(),
        cdi_devices: r.cdi_devices.into_iter().map(|d| d.name).collect(),
    }
}

#[async_trait::async_trait]
impl DevicePlugin for GrpcPlugin {
    fn options(&self) -> PluginOptions {
        self.options
    }

    async fn preferred(
        &self,
        available: Vec<String>,
        must_include: Vec<String>,
        size: u64,
    ) -> Result<Vec<String>, String> {
        let req = api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
                must_include_device_i_ds: must_include,
                allocation_size: i32::try_from(size).unwrap_or(i32::MAX),
            }],
        };
        let mut client = self.client.clone();
        let resp = timed(CALL_TIMEOUT, client.get_preferred_allocation(req)).await?;
        Ok(resp
            .container_responses
            .into_iter()
            .next()
            .map(|c| c.device_i_ds)
            .unwrap_or_default())
    }

    async fn allocate(&self, device_ids: Vec<String>) -> Result<Allocation, String> {
        let req = api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: device_ids,
            }],
        };
        let mut client = self.client.clone();
        let resp = timed(CALL_TIMEOUT, client.allocate(req)).await?;
        let mut responses = resp.container_responses.into_iter();
        match (responses.next(), responses.next()) {
            (Some(one), None) => Ok(allocation(one)),
            _ => Err("the plugin did not answer for exactly one container".to_owned()),
        }
    }

    async fn pre_start(&self, device_ids: Vec<String>) -> Result<(), String> {
        let mut client = self.client.clone();
        timed(
            PRE_START_TIMEOUT,
            client.pre_start_container(api::PreStartContainerRequest {
                devices_ids: device_ids,
            }),
        )
        .await
        .map(|_| ())
    }
}

/// The devices of one `ListAndWatch` answer.
pub fn devices(resp: api::ListAndWatchResponse) -> BTreeMap<String, DeviceInfo> {
    resp.devices
        .into_iter()
        .map(|d| {
            let info = DeviceInfo {
                healthy: d.health == "Healthy",
                numa_nodes: d
                    .topology
                    .map(|t| t.nodes.into_iter().map(|n| n.id).collect())
                    .unwrap_or_default(),
            };
            (d.id, info)
        })
        .collect()
}

/// Follows the devices of the plugin of `resource` on `channel` into `manager` until the stream ends or
/// `token` fires.
pub async fn follow(
    manager: DeviceManager,
    resource: String,
    channel: Channel,
    options: PluginOptions,
    token: CancellationToken,
) {
    let mut client = DevicePluginClient::new(channel.clone());
    // the options the plugin answers now win over those it registered with
    let options = match timed(CALL_TIMEOUT, client.get_device_plugin_options(api::Empty {})).await {
        Ok(o) => PluginOptions {
            pre_start_required: o.pre_start_required,
            preferred_allocation: o.get_preferred_allocation_available,
        },
        Err(error) => {
            tracing::debug!(%resource, %error, "GetDevicePluginOptions failed; keeping the registered options");
            options
        }
    };
    let plugin = GrpcPlugin::new(channel, options);
    let connection = manager.connected(&resource, Arc::new(plugin));
    tracing::info!(%resource, "device plugin registered");
    let stream = tokio::select! {
        r = client.list_and_watch(api::Empty {}) => r,
        () = token.cancelled() => return,
    };
    match stream {
        Ok(stream) => {
            let mut stream = stream.into_inner();
            loop {
                let next = tokio::select! {
                    m = stream.message() => m,
                    () = token.cancelled() => return,
                };
                match next {
                    Ok(Some(resp)) => manager.listed(&resource, connection, devices(resp)),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::info!(%resource, error = %status(&e), "device plugin stream ended");
                        break;
                    }
                }
            }
        }
        Err(e) => tracing::warn!(%resource, error = %status(&e), "ListAndWatch failed"),
    }
    tracing::info!(%resource, "device plugin gone; its devices are no longer allocatable");
    manager.disconnected(&resource, connection);
}
