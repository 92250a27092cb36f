//! The device manager against plugins: in memory (fakes), and a plugin served over gRPC on a unix socket that
//! registers on the manager's registration socket as a real one does.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::fake::{self, FakeDevices};
use super::v1beta1 as api;
use super::v1beta1::device_plugin_server::{DevicePlugin as PluginApi, DevicePluginServer};
use super::v1beta1::registration_client::RegistrationClient;
use super::*;

fn counts(m: &DeviceManager, resource: &str) -> Option<Counts> {
    m.counts().borrow().get(resource).copied()
}

fn wants(container: &str, resource: &str, n: u64) -> Vec<(String, String, u64)> {
    vec![(container.to_owned(), resource.to_owned(), n)]
}

#[tokio::test(start_paused = true)]
async fn a_fake_plugin_fills_capacity_and_admission_counts_free_devices() {
    let m = DeviceManager::in_memory();
    let token = CancellationToken::new();
    let flap = fake::start(
        &m,
        &FakeDevices {
            resource: "example.com/gpu".into(),
            count: 2,
            flap_every: None,
        },
        token.clone(),
    );
    assert!(flap.is_none());
    assert_eq!(
        counts(&m, "example.com/gpu"),
        Some(Counts {
            capacity: 2,
            allocatable: 2
        })
    );
    // two pods of one device each fit, a third does not: the kubelet's message
    m.admit("p1", &wants("c", "example.com/gpu", 1)).unwrap();
    m.admit("p2", &wants("c", "example.com/gpu", 1)).unwrap();
    let refused = m.admit("p3", &wants("c", "example.com/gpu", 1)).unwrap_err();
    assert_eq!(
        refused,
        "Allocate failed due to requested number of devices unavailable for example.com/gpu. Requested: 1, \
         Available: 0, which is unexpected"
    );
    // resources no plugin serves are not the manager's
    m.admit("p3", &wants("c", "example.com/other", 5)).unwrap();
    let a1 = m
        .container_allocation("p1", "c", &[("example.com/gpu".into(), 1)])
        .await
        .unwrap()
        .unwrap();
    let a2 = m
        .container_allocation("p2", "c", &[("example.com/gpu".into(), 1)])
        .await
        .unwrap()
        .unwrap();
    let env = fake::env_name("example.com/gpu");
    assert_eq!(env, "EXAMPLE_COM_GPU_DEVICES");
    assert_ne!(a1.envs[&env], a2.envs[&env], "each pod has its own device");
    // the same container asking again (a restart) keeps its device
    let again = m
        .container_allocation("p1", "c", &[("example.com/gpu".into(), 1)])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again, a1);
    assert_eq!(m.pod_devices("p1").len(), 1);
    m.release("p1");
    assert!(m.pod_devices("p1").is_empty());
    m.admit("p3", &wants("c", "example.com/gpu", 1)).unwrap();
    token.cancel();
}

#[tokio::test(start_paused = true)]
async fn flapping_health_keeps_one_device_at_a_time_out_of_allocatable() {
    let m = DeviceManager::in_memory();
    let token = CancellationToken::new();
    let flap = fake::start(
        &m,
        &FakeDevices {
            resource: "example.com/gpu".into(),
            count: 3,
            flap_every: Some(Duration::from_secs(10)),
        },
        token.clone(),
    )
    .unwrap();
    let task = tokio::spawn(flap);
    let seen = |m: &DeviceManager| counts(m, "example.com/gpu").unwrap();
    let healthy = |m: &DeviceManager| -> Vec<String> {
        m.allocatable_devices()["example.com/gpu"]
            .iter()
            .map(|(id, _)| id.clone())
            .collect()
    };
    assert_eq!(seen(&m).allocatable, 3);
    let one_down = Counts {
        capacity: 3,
        allocatable: 2,
    };
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(seen(&m), one_down);
    assert_eq!(healthy(&m), ["dev-1", "dev-2"]);
    // the next device fails as the first recovers: one is out of allocatable at every moment
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(seen(&m), one_down);
    assert_eq!(healthy(&m), ["dev-0", "dev-2"]);
    m.admit("p", &wants("c", "example.com/gpu", 2)).unwrap();
    assert_eq!(
        m.admit("q", &wants("c", "example.com/gpu", 1)),
        Err(
            "Allocate failed due to requested number of devices unavailable for example.com/gpu. \
             Requested: 1, Available: 0, which is unexpected"
                .into()
        ),
        "the unhealthy device is not offered"
    );
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(healthy(&m), ["dev-1", "dev-2"], "round again to the first");
    token.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_plugin_gone_leaves_capacity_until_the_grace_period_ends() {
    let m = DeviceManager::with_grace(None, Duration::from_secs(300));
    fake::start(
        &m,
        &FakeDevices {
            resource: "example.com/gpu".into(),
            count: 2,
            flap_every: None,
        },
        CancellationToken::new(),
    );
    let connection = {
        // the fake's connection is the first this manager made
        1
    };
    m.disconnected("example.com/gpu", connection);
    assert_eq!(
        counts(&m, "example.com/gpu"),
        Some(Counts {
            capacity: 2,
            allocatable: 0
        })
    );
    assert!(m.admit("p", &wants("c", "example.com/gpu", 1)).is_err());
    tokio::time::sleep(Duration::from_secs(301)).await;
    assert_eq!(
        counts(&m, "example.com/gpu"),
        Some(Counts {
            capacity: 0,
            allocatable: 0
        })
    );
}

/// A device plugin over gRPC, as a real one: two devices, `Allocate` answering an env, a mount, a device node,
/// an annotation and a CDI device per device; records the calls it got.
#[derive(Clone, Default)]
struct TestPlugin {
    calls: Arc<Mutex<Vec<String>>>,
    devices: Arc<tokio::sync::watch::Sender<Vec<api::Device>>>,
    /// Ends the `ListAndWatch` streams (the plugin going away).
    stop: CancellationToken,
}

#[tonic::async_trait]
impl PluginApi for TestPlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let rx = self.devices.subscribe();
        let stream = tokio_stream::wrappers::WatchStream::new(rx)
            .map(|devices| Ok(api::ListAndWatchResponse { devices }))
            .take_until(self.stop.clone().cancelled_owned());
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        r: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        self.calls.lock().unwrap().push("preferred".into());
        // prefers the last device offered
        let responses = r
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| api::ContainerPreferredAllocationResponse {
                device_i_ds: c.available_device_i_ds.last().cloned().into_iter().collect(),
            })
            .collect();
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses: responses,
        }))
    }

    async fn allocate(
        &self,
        r: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        self.calls.lock().unwrap().push("allocate".into());
        let responses = r
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| {
                let id = c.devices_ids.join(",");
                api::ContainerAllocateResponse {
                    envs: [("DEVICE".to_owned(), id.clone())].into(),
                    mounts: vec![api::Mount {
                        container_path: format!("/dev-data/{id}"),
                        host_path: format!("/tmp/{id}"),
                        read_only: true,
                    }],
                    devices: vec![api::DeviceSpec {
                        container_path: "/dev/fake0".into(),
                        host_path: "/dev/null".into(),
                        permissions: "rw".into(),
                    }],
                    annotations: [("example.com/device".to_owned(), id.clone())].into(),
                    cdi_devices: vec![api::CdiDevice {
                        name: format!("example.com/resource={id}"),
                    }],
                }
            })
            .collect();
        Ok(Response::new(api::AllocateResponse {
            container_responses: responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        self.calls.lock().unwrap().push("pre_start".into());
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

use futures::StreamExt as _;

fn device(id: &str, healthy: bool) -> api::Device {
    api::Device {
        id: id.into(),
        health: if healthy { "Healthy" } else { "Unhealthy" }.into(),
        topology: None,
    }
}

/// Serves `plugin` on `<dir>/<name>` until the task is aborted (the plugin dies, its streams with it).
fn serve_plugin(dir: &Path, name: &str, plugin: TestPlugin) -> tokio::task::JoinHandle<()> {
    let listener = UnixListener::bind(dir.join(name)).unwrap();
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(plugin))
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await;
    })
}

async fn register(dir: &Path, req: api::RegisterRequest) -> Result<(), Status> {
    let channel = endpoint::channel(&dir.join(SOCKET)).await.unwrap();
    RegistrationClient::new(channel).register(req).await.map(|_| ())
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

fn request(resource: &str, endpoint: &str) -> api::RegisterRequest {
    api::RegisterRequest {
        version: VERSION.into(),
        endpoint: endpoint.into(),
        resource_name: resource.into(),
        options: Some(api::DevicePluginOptions::default()),
    }
}

#[tokio::test]
async fn a_grpc_plugin_registers_lists_and_allocates_and_the_checkpoint_keeps_its_devices() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(DIR);
    let token = CancellationToken::new();
    let m = DeviceManager::with_checkpoint(&dir);
    let server = registration::RegistrationServer::bind(&dir, m.clone()).unwrap();
    tokio::spawn(server.run(token.clone()));

    // refused: another version, a resource name that is not an extended resource's
    let wrong = api::RegisterRequest {
        version: "v1alpha".into(),
        ..request("example.com/resource", "p.sock")
    };
    let e = register(&dir, wrong).await.unwrap_err();
    assert!(e.message().contains("not supported by kubelet"), "{e:?}");
    let e = register(&dir, request("gpu", "p.sock")).await.unwrap_err();
    assert_eq!(e.message(), "the ResourceName \"gpu\" is invalid");

    let plugin = TestPlugin::default();
    plugin
        .devices
        .send_replace(vec![device("d1", true), device("d2", true), device("d3", false)]);
    let plugin_task = serve_plugin(&dir, "p.sock", plugin.clone());
    register(&dir, request("example.com/resource", "p.sock"))
        .await
        .unwrap();
    until("the devices listed", || {
        counts(&m, "example.com/resource")
            == Some(Counts {
                capacity: 3,
                allocatable: 2,
            })
    })
    .await;

    m.admit("pod", &wants("c", "example.com/resource", 1)).unwrap();
    let a = m
        .container_allocation("pod", "c", &[("example.com/resource".into(), 1)])
        .await
        .unwrap()
        .unwrap();
    // the plugin's preferred device (the last free healthy one) was given
    assert_eq!(a.envs["DEVICE"], "d2");
    assert_eq!(a.mounts, vec![("/dev-data/d2".into(), "/tmp/d2".into(), true)]);
    assert_eq!(
        a.devices,
        vec![("/dev/fake0".into(), "/dev/null".into(), "rw".into())]
    );
    assert_eq!(a.annotations["example.com/device"], "d2");
    assert_eq!(a.cdi_devices, vec!["example.com/resource=d2".to_owned()]);
    assert_eq!(
        *plugin.calls.lock().unwrap(),
        ["preferred", "allocate", "pre_start"]
    );

    // health: d2 turns unhealthy, allocatable follows, capacity stays
    plugin
        .devices
        .send_replace(vec![device("d1", true), device("d2", false), device("d3", false)]);
    until("d2 unhealthy", || {
        counts(&m, "example.com/resource").map(|c| c.allocatable) == Some(1)
    })
    .await;

    // a manager started again from the checkpoint gives the container the same devices without asking
    let restarted = DeviceManager::with_checkpoint(&dir);
    assert_eq!(
        restarted.pod_devices("pod"),
        vec![("c".into(), "example.com/resource".into(), vec!["d2".into()])]
    );
    let calls = plugin.calls.lock().unwrap().len();
    let again = restarted
        .container_allocation("pod", "c", &[("example.com/resource".into(), 1)])
        .await;
    // no plugin is connected to the restarted manager: the kept answer alone
    assert_eq!(again.unwrap().unwrap(), a);
    assert_eq!(plugin.calls.lock().unwrap().len(), calls);
    assert_eq!(
        counts(&restarted, "example.com/resource"),
        Some(Counts {
            capacity: 3,
            allocatable: 0
        }),
        "restored devices wait for their plugin"
    );
    // a pod gone while the agent was down: its devices are freed, and the checkpoint says so
    assert!(
        !restarted.retain_pods(|uid| uid == "pod"),
        "an active pod keeps them"
    );
    assert!(restarted.retain_pods(|_| false));
    assert!(restarted.pod_devices("pod").is_empty());
    assert!(DeviceManager::with_checkpoint(&dir).pod_devices("pod").is_empty());

    // the plugin stops: allocatable 0, capacity kept
    plugin.stop.cancel();
    plugin_task.abort();
    until("the plugin gone", || {
        counts(&m, "example.com/resource")
            == Some(Counts {
                capacity: 3,
                allocatable: 0,
            })
    })
    .await;
    token.cancel();
    until("the registration socket removed on stop", || {
        !dir.join(SOCKET).exists()
    })
    .await;
}

#[test]
fn extended_resource_names() {
    use registration::is_extended_resource;
    assert!(is_extended_resource("example.com/resource"));
    assert!(is_extended_resource("nvidia.com/gpu"));
    assert!(!is_extended_resource("gpu"));
    assert!(!is_extended_resource("kubernetes.io/gpu"));
    assert!(!is_extended_resource("requests.example.com/x"));
    assert!(!is_extended_resource("example.com/a/b"));
    assert!(!is_extended_resource("example.com/"));
}

#[test]
fn a_corrupt_checkpoint_is_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join(checkpoint::FILE), b"{\"data\":{}}").unwrap();
    assert!(matches!(
        checkpoint::read(&tmp.path().join(checkpoint::FILE)),
        Err(checkpoint::CheckpointError::Corrupt(_))
    ));
    let data = checkpoint::Checkpoint {
        assigned: Vec::new(),
        devices: BTreeMap::from([("example.com/r".to_owned(), vec!["a".to_owned()])]),
    };
    checkpoint::write(&tmp.path().join(checkpoint::FILE), &data).unwrap();
    assert_eq!(
        checkpoint::read(&tmp.path().join(checkpoint::FILE)).unwrap(),
        Some(data)
    );
}
