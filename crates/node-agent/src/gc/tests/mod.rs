//! The collectors against the in-memory fake runtime under paused time: shared set-up; the container
//! collector's tests in `containers`, the image collector's in `images`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cri_fake::{ANNOTATION_PREFIX, FakeConfig, FakeRuntime};
use runtime_api::{Runtime, cri};

use super::*;
use crate::config::GcSettings;
use crate::metrics::Metrics;
use crate::pods::{KnownPods, ManagerControl, PodsQuery, runtime::labels};

mod containers;
mod images;

pub(super) const PAUSE: &str = "registry.k8s.io/pause:3.10";
pub(super) const MI: u64 = 1 << 20;

/// A stand-in pod manager answering with whatever `known` holds at the time of the question.
pub(super) fn pods_answering(known: Arc<Mutex<Option<KnownPods>>>) -> PodsQuery {
    let (tx, mut rx) = crate::density::chan::unbounded_channel();
    tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            if let ManagerControl::KnownPods(answer) = msg {
                let _ = answer.send(known.lock().unwrap().clone());
            }
        }
    });
    PodsQuery::new(tx)
}

pub(super) fn known(uids: &[&str]) -> Arc<Mutex<Option<KnownPods>>> {
    Arc::new(Mutex::new(Some(KnownPods::running(uids.iter().copied()))))
}

pub(super) fn runtime() -> FakeRuntime {
    FakeRuntime::new(FakeConfig {
        pod_cidr: Some("10.128.1.0/24".into()),
        pinned_images: vec![PAUSE.into()],
        seed: Some(3),
        ..Default::default()
    })
}

pub(super) async fn pull(rt: &FakeRuntime, image: &str, size: &str) {
    let annotations = [(format!("{ANNOTATION_PREFIX}image-size"), size.to_owned())].into();
    rt.pull_image(cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        sandbox_config: Some(cri::PodSandboxConfig {
            annotations,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
}

pub(super) async fn sandbox(rt: &FakeRuntime, uid: &str) -> String {
    crate::testing::run_sandbox(rt, uid, uid).await
}

/// Starts instance `restart` of container `name` of pod `uid` from `image`; it exits a second later unless
/// `keeps_running`. Returns its id.
pub(super) async fn start(
    rt: &FakeRuntime,
    sandbox: &str,
    uid: &str,
    name: &str,
    restart: u32,
    image: &str,
    keeps_running: bool,
) -> String {
    let mut annotations =
        std::collections::HashMap::from([(labels::RESTART_COUNT.to_owned(), restart.to_string())]);
    if !keeps_running {
        annotations.insert(format!("{ANNOTATION_PREFIX}exit-after"), "1s".into());
        annotations.insert(format!("{ANNOTATION_PREFIX}exit-code"), "1".into());
    }
    let mut container_labels = labels::selector(uid);
    container_labels.insert(labels::CONTAINER_NAME.into(), name.into());
    let id = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: name.into(),
                    attempt: restart,
                }),
                image: Some(cri::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                labels: container_labels,
                annotations,
                ..Default::default()
            }),
            sandbox_config: None,
        })
        .await
        .unwrap()
        .container_id;
    rt.start_container(cri::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap();
    id
}

/// `(pod uid, name, restart count, running)` of every container, sorted.
pub(super) async fn containers(rt: &FakeRuntime) -> Vec<(String, String, u32, bool)> {
    let mut v: Vec<_> = rt
        .list_containers(cri::ListContainersRequest::default())
        .await
        .unwrap()
        .containers
        .into_iter()
        .map(|c| {
            (
                c.labels[labels::POD_UID].clone(),
                c.labels[labels::CONTAINER_NAME].clone(),
                labels::restart_count(&c.annotations),
                c.state == cri::ContainerState::ContainerRunning as i32,
            )
        })
        .collect();
    v.sort();
    v
}

/// A container that crashed `dead` times (instances 0..dead, a few seconds apart) and runs instance `dead`.
pub(super) async fn crash_looped(rt: &FakeRuntime, sandbox: &str, uid: &str, dead: u32) {
    for r in 0..dead {
        start(rt, sandbox, uid, "app", r, "busybox", false).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    start(rt, sandbox, uid, "app", dead, "busybox", true).await;
}

pub(super) fn settings(max_per_container: i32, min_age: Duration) -> GcSettings {
    GcSettings {
        minimum_container_ttl: min_age,
        max_dead_per_container: max_per_container,
        ..GcSettings::default()
    }
}

pub(super) fn periods(containers: u64, images: u64) -> Periods {
    Periods {
        containers: Duration::from_secs(containers),
        images: Duration::from_secs(images),
    }
}

/// An image collector whose policy turns it off.
pub(super) fn image_gc_off(rt: &FakeRuntime, events: crate::events::EventRecorder) -> ImageGc {
    let off = ImagePolicy {
        high_threshold_percent: 100,
        low_threshold_percent: 80,
        min_age: Duration::ZERO,
        max_age: Duration::ZERO,
    };
    ImageGc::new(
        Arc::new(rt.clone()),
        off,
        Arc::new(NoFs),
        events,
        "n1",
        Arc::new(Metrics::unregistered()),
    )
}

/// An image filesystem that cannot be measured.
pub(super) struct NoFs;

#[async_trait::async_trait]
impl ImageFsSource for NoFs {
    async fn image_fs(&self) -> Result<FsStats, String> {
        Err("no image filesystem here".into())
    }
}
