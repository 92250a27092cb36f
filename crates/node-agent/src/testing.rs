//! A minimal scriptable [`Runtime`] for this crate's unit tests: `Status`, `Version`, `ListImages` and
//! `UpdateRuntimeConfig` answer; everything else is `Unimplemented`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use runtime_api::{EventStream, Result, Runtime, RuntimeError, cri};

#[derive(Debug, Default)]
pub(crate) struct TestRuntime {
    runtime_down: AtomicBool,
    network_down: AtomicBool,
    unreachable: AtomicBool,
    status_calls: AtomicUsize,
    version_calls: AtomicUsize,
    images: Mutex<Vec<cri::Image>>,
    pod_cidrs: Mutex<Vec<String>>,
}

impl TestRuntime {
    pub(crate) fn new() -> Self {
        Self::default()
    }
    pub(crate) fn set_runtime_ready(&self, ready: bool) {
        self.runtime_down.store(!ready, Ordering::SeqCst);
    }
    pub(crate) fn set_network_ready(&self, ready: bool) {
        self.network_down.store(!ready, Ordering::SeqCst);
    }
    pub(crate) fn set_unreachable(&self, unreachable: bool) {
        self.unreachable.store(unreachable, Ordering::SeqCst);
    }
    pub(crate) fn status_calls(&self) -> usize {
        self.status_calls.load(Ordering::SeqCst)
    }
    pub(crate) fn version_calls(&self) -> usize {
        self.version_calls.load(Ordering::SeqCst)
    }
    pub(crate) fn set_images(&self, images: Vec<cri::Image>) {
        *self.images.lock().unwrap_or_else(|p| p.into_inner()) = images;
    }
    pub(crate) fn pod_cidrs(&self) -> Vec<String> {
        self.pod_cidrs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    fn check(&self) -> Result<()> {
        if self.unreachable.load(Ordering::SeqCst) {
            Err(RuntimeError::unavailable("connection refused"))
        } else {
            Ok(())
        }
    }
}

fn cond(t: &str, ok: bool, reason: &str) -> cri::RuntimeCondition {
    cri::RuntimeCondition {
        r#type: t.into(),
        status: ok,
        reason: if ok { String::new() } else { reason.into() },
        message: if ok { String::new() } else { "test says so".into() },
    }
}

macro_rules! runtime_impl {
    ($($name:ident($req:ty) -> $resp:ty;)*) => {
#[async_trait]
impl Runtime for TestRuntime {
    $(
        async fn $name(&self, _req: $req) -> Result<$resp> {
            Err(RuntimeError::unimplemented(stringify!($name)))
        }
    )*

    async fn version(&self, _req: cri::VersionRequest) -> Result<cri::VersionResponse> {
        self.check()?;
        self.version_calls.fetch_add(1, Ordering::SeqCst);
        Ok(cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake-runtime".into(),
            runtime_version: "0.1.0".into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn status(&self, _req: cri::StatusRequest) -> Result<cri::StatusResponse> {
        self.status_calls.fetch_add(1, Ordering::SeqCst);
        self.check()?;
        Ok(cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: vec![
                    cond("RuntimeReady", !self.runtime_down.load(Ordering::SeqCst), "RuntimeDown"),
                    cond("NetworkReady", !self.network_down.load(Ordering::SeqCst), "NetworkPluginNotReady"),
                ],
            }),
            ..Default::default()
        })
    }

    async fn list_images(&self, _req: cri::ListImagesRequest) -> Result<cri::ListImagesResponse> {
        self.check()?;
        Ok(cri::ListImagesResponse { images: self.images.lock().unwrap_or_else(|p| p.into_inner()).clone() })
    }

    async fn update_runtime_config(
        &self,
        req: cri::UpdateRuntimeConfigRequest,
    ) -> Result<cri::UpdateRuntimeConfigResponse> {
        self.check()?;
        if let Some(cidr) = req.runtime_config.and_then(|c| c.network_config).map(|n| n.pod_cidr) {
            self.pod_cidrs.lock().unwrap_or_else(|p| p.into_inner()).push(cidr);
        }
        Ok(cri::UpdateRuntimeConfigResponse {})
    }

    async fn get_container_events(&self, _req: cri::GetEventsRequest) -> Result<EventStream> {
        Err(RuntimeError::unimplemented("get_container_events"))
    }
}
    };
}

runtime_impl! {
    run_pod_sandbox(cri::RunPodSandboxRequest) -> cri::RunPodSandboxResponse;
    stop_pod_sandbox(cri::StopPodSandboxRequest) -> cri::StopPodSandboxResponse;
    remove_pod_sandbox(cri::RemovePodSandboxRequest) -> cri::RemovePodSandboxResponse;
    pod_sandbox_status(cri::PodSandboxStatusRequest) -> cri::PodSandboxStatusResponse;
    list_pod_sandbox(cri::ListPodSandboxRequest) -> cri::ListPodSandboxResponse;
    create_container(cri::CreateContainerRequest) -> cri::CreateContainerResponse;
    start_container(cri::StartContainerRequest) -> cri::StartContainerResponse;
    stop_container(cri::StopContainerRequest) -> cri::StopContainerResponse;
    remove_container(cri::RemoveContainerRequest) -> cri::RemoveContainerResponse;
    list_containers(cri::ListContainersRequest) -> cri::ListContainersResponse;
    container_status(cri::ContainerStatusRequest) -> cri::ContainerStatusResponse;
    exec_sync(cri::ExecSyncRequest) -> cri::ExecSyncResponse;
    container_stats(cri::ContainerStatsRequest) -> cri::ContainerStatsResponse;
    list_container_stats(cri::ListContainerStatsRequest) -> cri::ListContainerStatsResponse;
    pod_sandbox_stats(cri::PodSandboxStatsRequest) -> cri::PodSandboxStatsResponse;
    list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest) -> cri::ListPodSandboxStatsResponse;
    image_status(cri::ImageStatusRequest) -> cri::ImageStatusResponse;
    pull_image(cri::PullImageRequest) -> cri::PullImageResponse;
    remove_image(cri::RemoveImageRequest) -> cri::RemoveImageResponse;
    image_fs_info(cri::ImageFsInfoRequest) -> cri::ImageFsInfoResponse;
}

/// An in-process stand-in for the few API server endpoints the node side uses (nodes, nodes/status, leases,
/// events), with request recording and fault injection. Merge semantics are simplified: objects merge, `null`
/// deletes, `conditions`/`addresses` merge by `type`, other lists replace.
pub(crate) mod fake_api {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use http::{Method, Request, Response, StatusCode};
    use http_body_util::BodyExt;
    use kube::client::Body;
    use serde_json::{Value, json};

    #[derive(Debug, Default)]
    pub(crate) struct State {
        pub nodes: BTreeMap<String, Value>,
        pub leases: BTreeMap<String, Value>,
        pub events: Vec<Value>,
        /// (method, path) of every request.
        pub requests: Vec<(String, String)>,
        /// Fail this many upcoming requests with 500.
        pub fail_next: usize,
        /// Fail every request whose path contains this with 500.
        pub fail_path: Option<String>,
        rv: u64,
        uid: u64,
    }

    #[derive(Debug, Clone, Default)]
    pub(crate) struct FakeApi {
        pub state: Arc<Mutex<State>>,
    }

    fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
        (
            code,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": message}),
        )
    }

    fn merge(target: &mut Value, patch: &Value) {
        match (target, patch) {
            (Value::Object(t), Value::Object(p)) => {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                        continue;
                    }
                    if (k == "conditions" || k == "addresses") && v.is_array() {
                        let entry = t.entry(k.clone()).or_insert_with(|| json!([]));
                        if let (Value::Array(existing), Value::Array(new)) = (entry, v) {
                            for item in new {
                                match existing.iter_mut().find(|e| e["type"] == item["type"]) {
                                    Some(e) => *e = item.clone(),
                                    None => existing.push(item.clone()),
                                }
                            }
                        }
                        continue;
                    }
                    match t.get_mut(k) {
                        Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                        _ => {
                            t.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            (t, p) => *t = p.clone(),
        }
    }

    impl State {
        fn stamp(&mut self, obj: &mut Value, new: bool) {
            self.rv += 1;
            obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
            if new {
                self.uid += 1;
                obj["metadata"]["uid"] = json!(format!("uid-{}", self.uid));
            }
        }

        fn handle(&mut self, method: &Method, path: &str, body: Option<Value>) -> (u16, Value) {
            self.requests.push((method.to_string(), path.to_owned()));
            if self.fail_next > 0 {
                self.fail_next -= 1;
                return status(500, "InternalError", "injected");
            }
            if self.fail_path.as_deref().is_some_and(|p| path.contains(p)) {
                return status(500, "InternalError", "injected");
            }
            let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
            match (method.as_str(), parts.as_slice()) {
                ("POST", ["api", "v1", "nodes"]) => {
                    let mut obj = body.unwrap_or_default();
                    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                    if self.nodes.contains_key(&name) {
                        return status(409, "AlreadyExists", "nodes already exists");
                    }
                    self.stamp(&mut obj, true);
                    self.nodes.insert(name, obj.clone());
                    (201, obj)
                }
                ("GET", ["api", "v1", "nodes", name]) => match self.nodes.get(*name) {
                    Some(n) => (200, n.clone()),
                    None => status(404, "NotFound", "node not found"),
                },
                ("PATCH", ["api", "v1", "nodes", name, ..]) => {
                    let Some(mut node) = self.nodes.get(*name).cloned() else {
                        return status(404, "NotFound", "node not found");
                    };
                    merge(&mut node, &body.unwrap_or_default());
                    self.stamp(&mut node, false);
                    self.nodes.insert((*name).to_owned(), node.clone());
                    (200, node)
                }
                (
                    "GET",
                    [
                        "apis",
                        "coordination.k8s.io",
                        "v1",
                        "namespaces",
                        _,
                        "leases",
                        name,
                    ],
                ) => match self.leases.get(*name) {
                    Some(l) => (200, l.clone()),
                    None => status(404, "NotFound", "lease not found"),
                },
                ("POST", ["apis", "coordination.k8s.io", "v1", "namespaces", _, "leases"]) => {
                    let mut obj = body.unwrap_or_default();
                    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                    if self.leases.contains_key(&name) {
                        return status(409, "AlreadyExists", "lease already exists");
                    }
                    self.stamp(&mut obj, true);
                    self.leases.insert(name, obj.clone());
                    (201, obj)
                }
                (
                    "PUT",
                    [
                        "apis",
                        "coordination.k8s.io",
                        "v1",
                        "namespaces",
                        _,
                        "leases",
                        name,
                    ],
                ) => {
                    let Some(cur) = self.leases.get(*name) else {
                        return status(404, "NotFound", "lease not found");
                    };
                    let mut obj = body.unwrap_or_default();
                    if obj["metadata"]["resourceVersion"] != cur["metadata"]["resourceVersion"] {
                        return status(409, "Conflict", "the object has been modified");
                    }
                    obj["metadata"]["uid"] = cur["metadata"]["uid"].clone();
                    self.stamp(&mut obj, false);
                    self.leases.insert((*name).to_owned(), obj.clone());
                    (200, obj)
                }
                ("POST", ["api", "v1", "namespaces", _, "events"]) => {
                    let obj = body.unwrap_or_default();
                    self.events.push(obj.clone());
                    (201, obj)
                }
                ("PATCH", ["api", "v1", "namespaces", _, "events", name]) => {
                    let patch = body.unwrap_or_default();
                    match self.events.iter_mut().find(|e| e["metadata"]["name"] == *name) {
                        Some(e) => {
                            merge(e, &patch);
                            (200, e.clone())
                        }
                        None => status(404, "NotFound", "event not found"),
                    }
                }
                _ => status(
                    404,
                    "NotFound",
                    &format!("fake API has no route for {method} {path}"),
                ),
            }
        }
    }

    impl FakeApi {
        pub(crate) fn new() -> Self {
            Self::default()
        }

        pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(|p| p.into_inner())
        }

        /// A kube client served by this fake.
        pub(crate) fn client(&self) -> kube::Client {
            let state = self.state.clone();
            let svc = tower::service_fn(move |req: Request<Body>| {
                let state = state.clone();
                async move {
                    let method = req.method().clone();
                    let path = req.uri().path().to_owned();
                    let bytes = req
                        .into_body()
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    let body = if bytes.is_empty() {
                        None
                    } else {
                        serde_json::from_slice(&bytes).ok()
                    };
                    let (code, value) = state
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .handle(&method, &path, body);
                    let resp = Response::builder()
                        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
                        .header("content-type", "application/json")
                        .body(Body::from(serde_json::to_vec(&value).unwrap_or_default()))
                        .unwrap_or_else(|_| Response::new(Body::empty()));
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            kube::Client::new(svc, "default")
        }

        pub(crate) fn count(&self, method: &str, path_contains: &str) -> usize {
            self.lock()
                .requests
                .iter()
                .filter(|(m, p)| m == method && p.contains(path_contains))
                .count()
        }

        pub(crate) fn node(&self, name: &str) -> Option<Value> {
            self.lock().nodes.get(name).cloned()
        }

        pub(crate) fn event_reasons(&self) -> Vec<String> {
            self.lock()
                .events
                .iter()
                .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
                .collect()
        }
    }
}
