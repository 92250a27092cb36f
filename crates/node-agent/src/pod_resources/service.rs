//! The `v1.PodResourcesLister` service: answers from the pod manager, each request first taking a token of the
//! kubelet's rate limit.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::pod_resources;
use super::v1;
use crate::pods::PodsQuery;

/// Requests per second the kubelet allows on this API.
pub const QPS: u32 = 100;
/// Requests the kubelet allows at once above [`QPS`].
pub const BURST: u32 = 10;

/// Serves `List`, `Get` and `GetAllocatableResources` for one agent.
#[derive(Debug)]
pub struct PodResourcesService {
    pods: PodsQuery,
    devices: Option<crate::devices::DeviceManager>,
    dra: Option<Arc<crate::dra::DraManager>>,
    limit: Limit,
}

impl PodResourcesService {
    /// Answers from the pod manager `pods` asks, at most [`QPS`] requests a second (bursts of [`BURST`]).
    pub fn new(pods: PodsQuery) -> Self {
        Self {
            pods,
            devices: None,
            dra: None,
            limit: Limit::new(QPS, BURST),
        }
    }

    /// Also reports the devices `devices` gave the containers, and its healthy devices as allocatable.
    pub fn with_devices(mut self, devices: crate::devices::DeviceManager) -> Self {
        self.devices = Some(devices);
        self
    }

    /// Also reports the resource claims each container uses, with the devices `dra`'s drivers prepared.
    pub fn with_dra(mut self, dra: Arc<crate::dra::DraManager>) -> Self {
        self.dra = Some(dra);
        self
    }

    /// The pods holding the node's resources, by namespace then name.
    async fn pods(&self) -> Result<Vec<v1::PodResources>, Status> {
        let pods = self
            .pods
            .admitted_pods()
            .await
            .ok_or_else(|| Status::unavailable("the pod manager is not running"))?;
        let mut pods: Vec<_> = pods
            .iter()
            .map(|p| {
                let mut out = pod_resources(p);
                if let Some(devices) = &self.devices {
                    super::add_devices(&mut out, devices.pod_devices(&p.uid));
                }
                if let Some(dra) = &self.dra {
                    super::add_dynamic_resources(&mut out, p, &|ns, name| dra.claim(ns, name));
                }
                out
            })
            .collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Ok(pods)
    }
}

#[tonic::async_trait]
impl v1::pod_resources_lister_server::PodResourcesLister for PodResourcesService {
    async fn list(
        &self,
        _request: Request<v1::ListPodResourcesRequest>,
    ) -> Result<Response<v1::ListPodResourcesResponse>, Status> {
        self.limit.take()?;
        Ok(Response::new(v1::ListPodResourcesResponse {
            pod_resources: self.pods().await?,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<v1::AllocatableResourcesRequest>,
    ) -> Result<Response<v1::AllocatableResourcesResponse>, Status> {
        self.limit.take()?;
        // the device plugins' healthy devices; CPU manager policy none (no exclusively assignable CPUs) and
        // memory manager policy none (no NUMA memory blocks): the kubelet answers empty lists for those
        let devices = self
            .devices
            .as_ref()
            .map(|d| super::allocatable_devices(&d.allocatable_devices()))
            .unwrap_or_default();
        Ok(Response::new(v1::AllocatableResourcesResponse {
            devices,
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        request: Request<v1::GetPodResourcesRequest>,
    ) -> Result<Response<v1::GetPodResourcesResponse>, Status> {
        self.limit.take()?;
        let v1::GetPodResourcesRequest {
            pod_name,
            pod_namespace,
        } = request.into_inner();
        let pod = self
            .pods()
            .await?
            .into_iter()
            .find(|p| p.name == pod_name && p.namespace == pod_namespace)
            // the kubelet's words; it returns a plain error, which gRPC carries as UNKNOWN
            .ok_or_else(|| {
                Status::unknown(format!("pod {pod_name} in namespace {pod_namespace} not found"))
            })?;
        Ok(Response::new(v1::GetPodResourcesResponse {
            pod_resources: Some(pod),
        }))
    }
}

/// A token bucket: `burst` tokens, refilled at `qps` a second; a request finding it empty is refused.
#[derive(Debug)]
pub(super) struct Limit {
    per_token: Duration,
    burst: u32,
    /// Tokens left and when they were counted.
    state: Mutex<(f64, Instant)>,
}

impl Limit {
    pub(super) fn new(qps: u32, burst: u32) -> Self {
        Self {
            per_token: Duration::from_secs(1) / qps.max(1),
            burst: burst.max(1),
            state: Mutex::new((f64::from(burst.max(1)), Instant::now())),
        }
    }

    /// Takes a token, or refuses as the kubelet does.
    pub(super) fn take(&self) -> Result<(), Status> {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (tokens, at) = &mut *state;
        let refill = now.saturating_duration_since(*at).as_secs_f64() / self.per_token.as_secs_f64();
        *tokens = (*tokens + refill).min(f64::from(self.burst));
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(Status::resource_exhausted("rejected by rate limit"))
        }
    }
}
