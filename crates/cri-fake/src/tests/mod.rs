//! Unit tests of the fake runtime through its CRI surface: every state transition and error code (`sandboxes`,
//! `containers`), filters and images (`listing`), and under paused tokio time the scripted behaviours
//! (`scripted`) and pushed events (`events`); where the fake follows the CRI spec rather than containerd, over
//! gRPC (`grpc`).

mod containers;
mod events;
mod grpc;
mod listing;
mod sandboxes;
mod scripted;

use std::collections::HashMap;

use runtime_api::{Runtime, cri};

use crate::{FakeConfig, FakeRuntime};

pub(crate) const IMAGE: &str = "docker.io/library/busybox:1.36";

pub(crate) fn fake() -> FakeRuntime {
    FakeRuntime::new(FakeConfig {
        pod_cidr: Some("10.244.7.0/24".into()),
        images: vec![IMAGE.into()],
        seed: Some(11),
        ..FakeConfig::default()
    })
}

pub(crate) fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

pub(crate) fn pod_config(name: &str, annotations: &[(&str, &str)]) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: format!("/var/log/pods/default_{name}"),
        labels: map(&[("app", name), ("io.kubernetes.pod.name", name)]),
        annotations: map(annotations),
        ..Default::default()
    }
}

pub(crate) fn container_config(
    name: &str,
    attempt: u32,
    annotations: &[(&str, &str)],
) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: name.into(),
            attempt,
        }),
        image: Some(cri::ImageSpec {
            image: "busybox:1.36".into(),
            ..Default::default()
        }),
        labels: map(&[("io.kubernetes.container.name", name)]),
        annotations: map(annotations),
        log_path: format!("{name}/{attempt}.log"),
        ..Default::default()
    }
}

pub(crate) async fn run_pod(rt: &FakeRuntime, name: &str, annotations: &[(&str, &str)]) -> String {
    run_pod_with(rt, pod_config(name, annotations)).await
}

/// Runs a sandbox of `config`, answering its ID.
pub(crate) async fn run_pod_with(rt: &FakeRuntime, config: cri::PodSandboxConfig) -> String {
    rt.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(config),
        ..Default::default()
    })
    .await
    .unwrap()
    .pod_sandbox_id
}

pub(crate) async fn create(
    rt: &FakeRuntime,
    pod: &str,
    name: &str,
    attempt: u32,
    annotations: &[(&str, &str)],
) -> runtime_api::Result<String> {
    rt.create_container(cri::CreateContainerRequest {
        pod_sandbox_id: pod.into(),
        config: Some(container_config(name, attempt, annotations)),
        sandbox_config: None,
    })
    .await
    .map(|r| r.container_id)
}

pub(crate) async fn start(rt: &FakeRuntime, id: &str) -> runtime_api::Result<()> {
    rt.start_container(cri::StartContainerRequest {
        container_id: id.into(),
    })
    .await
    .map(|_| ())
}

pub(crate) async fn run_container(
    rt: &FakeRuntime,
    pod: &str,
    name: &str,
    annotations: &[(&str, &str)],
) -> String {
    let id = create(rt, pod, name, 0, annotations).await.unwrap();
    start(rt, &id).await.unwrap();
    id
}

pub(crate) async fn status(rt: &FakeRuntime, id: &str) -> cri::ContainerStatus {
    rt.container_status(cri::ContainerStatusRequest {
        container_id: id.into(),
        verbose: false,
    })
    .await
    .unwrap()
    .status
    .unwrap()
}

pub(crate) async fn sandbox(rt: &FakeRuntime, id: &str) -> cri::PodSandboxStatus {
    rt.pod_sandbox_status(cri::PodSandboxStatusRequest {
        pod_sandbox_id: id.into(),
        verbose: false,
    })
    .await
    .unwrap()
    .status
    .unwrap()
}

pub(crate) fn state(s: &cri::ContainerStatus) -> cri::ContainerState {
    cri::ContainerState::try_from(s.state).unwrap()
}

/// The records ten thousand runtimes keep per object stay small (a guard against accidental growth; the
/// `footprint` example measures the whole cost, docs/density.md has the history).
#[test]
fn records_stay_small() {
    use std::mem::size_of;
    // each keeps its strings, labels and annotations in one allocation (`Meta`)
    assert!(
        size_of::<crate::store::Sandbox>() <= 80,
        "Sandbox {}",
        size_of::<crate::store::Sandbox>()
    );
    assert!(
        size_of::<crate::store::Container>() <= 128,
        "Container {}",
        size_of::<crate::store::Container>()
    );
    // the planned transitions and the timer task's handles are boxed at the first plan (most runtimes of a fleet
    // plan none)
    assert!(
        size_of::<crate::store::State>() <= 192,
        "State {}",
        size_of::<crate::store::State>()
    );
    // one per node of a fleet, with the `Arc`'s two counts: the name and version are one shared copy, the
    // planned transitions boxed
    let inner = size_of::<crate::runtime::Inner>();
    println!("runtime state {inner} bytes");
    assert!(inner + 16 <= 256, "Inner {inner}");
}

pub(crate) fn key(k: &str) -> String {
    format!("{}{k}", crate::ANNOTATION_PREFIX)
}

/// Container annotations with the behaviour prefix added.
pub(crate) fn script(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (key(k), (*v).to_owned())).collect()
}

pub(crate) async fn run_scripted(rt: &FakeRuntime, pod: &str, name: &str, pairs: &[(&str, &str)]) -> String {
    let owned = script(pairs);
    let refs: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    run_container(rt, pod, name, &refs).await
}
