//! The client of a DRA driver's kubelet plugin: `NodePrepareResources` and `NodeUnprepareResources` over the
//! unix socket the plugin named when it registered, in the API version chosen at registration. Each call may
//! take 45 s (the kubelet's default: half its retry period).

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use tonic::transport::Channel;

use super::{ClaimRef, Driver, Prepared, PreparedDevice, Unprepared, v1, v1beta1};

/// How long one call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(45);

/// The DRA API versions this node speaks, as plugins name them at registration, newest first.
pub const SERVICES: [&str; 2] = [V1_SERVICE, V1BETA1_SERVICE];
/// The v1 service.
pub const V1_SERVICE: &str = "v1.DRAPlugin";
/// The v1beta1 service.
pub const V1BETA1_SERVICE: &str = "v1beta1.DRAPlugin";

/// Which API version a plugin is spoken to in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// `v1.DRAPlugin`.
    V1,
    /// `v1beta1.DRAPlugin`.
    V1beta1,
}

impl Service {
    /// The newest of `offered` this node speaks, or why there is none (the kubelet's words).
    pub fn choose(offered: &[String]) -> Result<Self, String> {
        if offered.is_empty() {
            return Err("empty list of supported gRPC services (aka supported versions)".into());
        }
        if offered.iter().any(|s| s == V1_SERVICE) {
            return Ok(Self::V1);
        }
        if offered.iter().any(|s| s == V1BETA1_SERVICE) {
            return Ok(Self::V1beta1);
        }
        Err(format!(
            "none of services supported by the plugin ({offered:?}) are supported by the kubelet ({SERVICES:?})"
        ))
    }
}

/// A driver's kubelet plugin reached over gRPC.
#[derive(Debug, Clone)]
pub struct GrpcDriver {
    endpoint: PathBuf,
    service: Service,
    channel: Channel,
}

impl GrpcDriver {
    /// A client of the plugin on `endpoint` speaking `service`. The connection is made lazily, on each call as
    /// needed, so a plugin that restarts on the same socket is reached again.
    pub fn new(endpoint: &Path, service: Service) -> Self {
        let path = endpoint.to_owned();
        // the URI is required by the channel but not used: every connection goes to the socket
        let channel = tonic::transport::Endpoint::from_static("http://dra-plugin.invalid")
            .timeout(CALL_TIMEOUT)
            .connect_with_connector_lazy(tower::service_fn(move |_: tonic::codegen::http::Uri| {
                let path = path.clone();
                async move {
                    tokio::net::UnixStream::connect(path)
                        .await
                        .map(hyper_util::rt::TokioIo::new)
                }
            }));
        Self {
            endpoint: endpoint.to_owned(),
            service,
            channel,
        }
    }

    /// The plugin's socket.
    pub fn endpoint(&self) -> &Path {
        &self.endpoint
    }
}

fn v1_claims(claims: &[ClaimRef]) -> Vec<v1::Claim> {
    claims
        .iter()
        .map(|c| v1::Claim {
            namespace: c.namespace.clone(),
            uid: c.uid.clone(),
            name: c.name.clone(),
        })
        .collect()
}

fn v1beta1_claims(claims: &[ClaimRef]) -> Vec<v1beta1::Claim> {
    claims
        .iter()
        .map(|c| v1beta1::Claim {
            namespace: c.namespace.clone(),
            uid: c.uid.clone(),
            name: c.name.clone(),
        })
        .collect()
}

fn outcome(error: String) -> Result<(), String> {
    if error.is_empty() { Ok(()) } else { Err(error) }
}

#[async_trait]
impl Driver for GrpcDriver {
    async fn prepare(&self, claims: &[ClaimRef]) -> Result<Prepared, String> {
        let status = |s: tonic::Status| format!("{}: {}", s.code(), s.message());
        match self.service {
            Service::V1 => {
                let mut client = v1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let req = v1::NodePrepareResourcesRequest {
                    claims: v1_claims(claims),
                };
                let resp = client
                    .node_prepare_resources(req)
                    .await
                    .map_err(status)?
                    .into_inner();
                Ok(resp
                    .claims
                    .into_iter()
                    .map(|(uid, r)| {
                        let devices = r
                            .devices
                            .into_iter()
                            .map(|d| PreparedDevice {
                                request_names: d.request_names,
                                pool: d.pool_name,
                                device: d.device_name,
                                cdi_ids: d.cdi_device_ids,
                                share_id: d.share_id,
                            })
                            .collect();
                        (uid, outcome(r.error).map(|()| devices))
                    })
                    .collect())
            }
            Service::V1beta1 => {
                let mut client = v1beta1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let req = v1beta1::NodePrepareResourcesRequest {
                    claims: v1beta1_claims(claims),
                };
                let resp = client
                    .node_prepare_resources(req)
                    .await
                    .map_err(status)?
                    .into_inner();
                Ok(resp
                    .claims
                    .into_iter()
                    .map(|(uid, r)| {
                        let devices = r
                            .devices
                            .into_iter()
                            .map(|d| PreparedDevice {
                                request_names: d.request_names,
                                pool: d.pool_name,
                                device: d.device_name,
                                cdi_ids: d.cdi_device_ids,
                                // v1beta1 does not carry shares
                                share_id: None,
                            })
                            .collect();
                        (uid, outcome(r.error).map(|()| devices))
                    })
                    .collect())
            }
        }
    }

    async fn unprepare(&self, claims: &[ClaimRef]) -> Result<Unprepared, String> {
        let status = |s: tonic::Status| format!("{}: {}", s.code(), s.message());
        match self.service {
            Service::V1 => {
                let mut client = v1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let req = v1::NodeUnprepareResourcesRequest {
                    claims: v1_claims(claims),
                };
                let resp = client
                    .node_unprepare_resources(req)
                    .await
                    .map_err(status)?
                    .into_inner();
                Ok(resp
                    .claims
                    .into_iter()
                    .map(|(uid, r)| (uid, outcome(r.error)))
                    .collect())
            }
            Service::V1beta1 => {
                let mut client = v1beta1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let req = v1beta1::NodeUnprepareResourcesRequest {
                    claims: v1beta1_claims(claims),
                };
                let resp = client
                    .node_unprepare_resources(req)
                    .await
                    .map_err(status)?
                    .into_inner();
                Ok(resp
                    .claims
                    .into_iter()
                    .map(|(uid, r)| (uid, outcome(r.error)))
                    .collect())
            }
        }
    }
}
