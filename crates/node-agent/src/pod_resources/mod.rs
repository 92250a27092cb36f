//! The kubelet's pod-resources API (gRPC, `v1.PodResourcesLister`) on a unix socket under the root directory,
//! `<root-dir>/pod-resources/kubelet.sock`: which node resources the pods and containers of this node hold,
//! for node-local consumers such as device-monitoring agents and topology exporters.
//!
//! This module owns the socket (created, a stale one replaced, removed on stop), the service
//! ([`service::PodResourcesService`]: `List`, `Get`, `GetAllocatableResources`), the conversion of the pod
//! manager's pods into the API's messages ([`pod_resources`]) and the request rate limit the kubelet applies
//! (100 per second, bursts of 10; beyond that `RESOURCE_EXHAUSTED`). The messages are compiled by the build
//! script from the project's own `proto/podresources/v1/api.proto`, wire-compatible with the published API.
//!
//! What it reports is what a kubelet reports with the CPU manager and memory manager policy `none`, because
//! that is all this agent does (`cpuManagerPolicy` and its kin are accepted without effect): every pod the
//! pod manager holds admitted — a pod being deleted until its containers have stopped; not refused pods, not
//! pods that finished — with its sidecars (init containers with `restartPolicy: Always`) and its app
//! containers, each with the device plugins' devices it was given (from the device manager,
//! [`crate::devices`]) and the resource claims it uses with their prepared devices (`dynamic_resources`,
//! from the DRA manager, [`crate::dra`]), no exclusive CPU ids and no memory blocks;
//! `GetAllocatableResources` answers the plugins' healthy devices and empty lists for the rest (claims'
//! devices are not in it, as with the kubelet).
//! The pods come from the pod manager over its control channel ([`PodsQuery::admitted_pods`]), never from
//! the API server.

pub mod service;
#[cfg(test)]
mod tests;

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use crate::dra::claims::ClaimInfo;
use crate::dra::manager::ClaimName;
use crate::pods::PodsQuery;
use crate::pods::model::spec::DesiredPod;

pub use service::PodResourcesService;

/// The messages, server and client of the pod-resources API v1 (generated from `proto/podresources/v1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("v1");
}

/// The socket's directory under the root directory (the kubelet's name for it).
pub const DIR: &str = "pod-resources";
/// The socket's file name in [`DIR`].
pub const SOCKET: &str = "kubelet.sock";

/// Where an agent whose root directory is `root_dir` serves the API.
pub fn socket_path(root_dir: &Path) -> PathBuf {
    root_dir.join(DIR).join(SOCKET)
}

/// Why the socket could not be set up or served.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// The socket's directory could not be created.
    #[error("creating the pod-resources socket directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Something other than a socket is in the socket's place; it is left alone.
    #[error("{0} exists and is not a socket; remove it to serve the pod-resources API there")]
    NotASocket(PathBuf),
    /// An old socket could not be removed.
    #[error("removing the stale pod-resources socket {path}: {source}")]
    Stale {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Binding the socket failed.
    #[error("binding the pod-resources socket {path}: {source}")]
    Bind {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The gRPC server failed.
    #[error("serving the pod-resources API: {0}")]
    Serve(#[source] tonic::transport::Error),
}

/// The API converted from one pod: its name, namespace and containers (sidecars first, in spec order, then the
/// app containers; plain init containers hold nothing once the pod runs and are left out, as the kubelet
/// does). Nothing is assigned per container: see the module docs.
pub fn pod_resources(pod: &DesiredPod) -> v1::PodResources {
    let containers = pod
        .init_containers
        .iter()
        .filter(|c| c.sidecar)
        .chain(pod.containers.iter())
        .map(|c| v1::ContainerResources {
            name: c.name.clone(),
            ..Default::default()
        })
        .collect();
    v1::PodResources {
        name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        containers,
    }
}

/// Adds `devices` — (container, resource, device IDs) — to the containers of `pod`.
pub fn add_devices(pod: &mut v1::PodResources, devices: Vec<(String, String, Vec<String>)>) {
    for (container, resource, ids) in devices {
        if let Some(c) = pod.containers.iter_mut().find(|c| c.name == container) {
            c.devices.push(v1::ContainerDevices {
                resource_name: resource,
                device_ids: ids,
                topology: None,
            });
        }
    }
}

/// The claims container `container` of `pod` names in `resources.claims`, each with the devices its drivers
/// prepared, as the kubelet reports them: in the order of the pod's `spec.resourceClaims`, each claim once,
/// its devices driver by driver, each device with its own CDI devices. `claim` finds a claim this node knows
/// by namespace and name. As the kubelet does, a claim the node does not know (not prepared yet, or its name
/// not resolved yet) leaves the container with no dynamic resources at all.
pub fn dynamic_resources(
    pod: &DesiredPod,
    container: &str,
    claim: &dyn Fn(&str, &str) -> Option<ClaimInfo>,
) -> Vec<v1::DynamicResource> {
    let uses = pod.container_claims(container);
    let mut out = Vec::new();
    for pc in pod.resource_claims() {
        if !uses.iter().any(|(name, _)| *name == pc.name) {
            continue;
        }
        let name = match &pc.claim {
            ClaimName::Named(n) | ClaimName::Generated(n) => n,
            ClaimName::NotNeeded => continue,
            ClaimName::NotCreatedYet | ClaimName::Unsupported => return Vec::new(),
        };
        let Some(info) = claim(&pod.namespace, name) else {
            return Vec::new();
        };
        out.push(v1::DynamicResource {
            claim_name: name.clone(),
            claim_namespace: pod.namespace.clone(),
            claim_resources: info
                .drivers
                .iter()
                .flat_map(|(driver, devices)| {
                    devices.iter().map(move |d| v1::ClaimResource {
                        cdi_devices: d
                            .cdi_ids
                            .iter()
                            .map(|id| v1::CdiDevice { name: id.clone() })
                            .collect(),
                        driver_name: driver.clone(),
                        pool_name: d.pool.clone(),
                        device_name: d.device.clone(),
                        share_id: d.share_id.clone(),
                    })
                })
                .collect(),
        });
    }
    out
}

/// Adds to each container of `out` (converted from `pod`) the claims it uses ([`dynamic_resources`]).
pub fn add_dynamic_resources(
    out: &mut v1::PodResources,
    pod: &DesiredPod,
    claim: &dyn Fn(&str, &str) -> Option<ClaimInfo>,
) {
    for c in &mut out.containers {
        c.dynamic_resources = dynamic_resources(pod, &c.name, claim);
    }
}

/// The API form of the device plugins' healthy devices, one entry per device as the kubelet lists them.
pub fn allocatable_devices(
    devices: &std::collections::BTreeMap<String, Vec<(String, Vec<i64>)>>,
) -> Vec<v1::ContainerDevices> {
    devices
        .iter()
        .flat_map(|(resource, ids)| {
            ids.iter().map(move |(id, numa)| v1::ContainerDevices {
                resource_name: resource.clone(),
                device_ids: vec![id.clone()],
                topology: (!numa.is_empty()).then(|| v1::TopologyInfo {
                    nodes: numa.iter().map(|n| v1::NumaNode { id: *n }).collect(),
                }),
            })
        })
        .collect()
}

/// A client of the pod-resources API on the unix socket `path` (the API's consumers' view; the tests use it).
pub async fn connect(
    path: impl Into<PathBuf>,
) -> Result<
    v1::pod_resources_lister_client::PodResourcesListerClient<tonic::transport::Channel>,
    tonic::transport::Error,
> {
    let path = path.into();
    // the URI is required by the channel but not used: every connection goes to the socket
    let channel = tonic::transport::Endpoint::from_static("http://pod-resources.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::codegen::http::Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await?;
    Ok(v1::pod_resources_lister_client::PodResourcesListerClient::new(
        channel,
    ))
}

/// The pod-resources API bound to its socket, not yet serving.
#[derive(Debug)]
pub struct PodResourcesServer {
    path: PathBuf,
    listener: UnixListener,
    service: PodResourcesService,
}

impl PodResourcesServer {
    /// Binds `path` (its directory made with mode 0750 if missing; a socket left there by an earlier run is
    /// replaced, anything else is an error), answering from the pod manager `pods` asks. Must be called
    /// inside a tokio runtime.
    pub fn bind(path: impl Into<PathBuf>, pods: PodsQuery) -> Result<Self, PodResourcesError> {
        Self::bind_with(path, PodResourcesService::new(pods))
    }

    /// Binds `path` as [`bind`](Self::bind) does, answering with `service`.
    pub fn bind_with(
        path: impl Into<PathBuf>,
        service: PodResourcesService,
    ) -> Result<Self, PodResourcesError> {
        let path = path.into();
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(dir)
                .map_err(|source| PodResourcesError::Dir {
                    path: dir.to_owned(),
                    source,
                })?;
        }
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_socket() => {
                std::fs::remove_file(&path).map_err(|source| PodResourcesError::Stale {
                    path: path.clone(),
                    source,
                })?;
            }
            Ok(_) => return Err(PodResourcesError::NotASocket(path)),
            Err(_) => {}
        }
        let listener = UnixListener::bind(&path).map_err(|source| PodResourcesError::Bind {
            path: path.clone(),
            source,
        })?;
        Ok(Self {
            path,
            listener,
            service,
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves until `token` fires, then removes the socket.
    pub async fn run(self, token: CancellationToken) -> Result<(), PodResourcesError> {
        let Self {
            path,
            listener,
            service,
        } = self;
        tracing::info!(socket = %path.display(), "serving the pod-resources API");
        let served = tonic::transport::Server::builder()
            .add_service(v1::pod_resources_lister_server::PodResourcesListerServer::new(
                service,
            ))
            .serve_with_incoming_shutdown(crate::grpc_unix::incoming(listener), token.cancelled_owned())
            .await
            .map_err(PodResourcesError::Serve);
        if let Err(error) = std::fs::remove_file(&path)
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(socket = %path.display(), %error, "could not remove the pod-resources socket");
        }
        served
    }
}
