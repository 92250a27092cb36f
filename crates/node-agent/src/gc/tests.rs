//! The collectors against the in-memory fake runtime under paused time: what a pass removes from the runtime,
//! which pods it leaves alone, the image records' clocks, thresholds and events.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cri_fake::{ANNOTATION_PREFIX, FakeConfig, FakeRuntime};
use runtime_api::{Runtime, cri};
use tokio::sync::mpsc;

use super::*;
use crate::config::GcSettings;
use crate::events::{CapturedEvents, EventType};
use crate::metrics::Metrics;
use crate::pods::{KnownPods, ManagerControl, PodsQuery, labels};

const PAUSE: &str = "registry.k8s.io/pause:3.10";
const MI: u64 = 1 << 20;

/// A stand-in pod manager answering with whatever `known` holds at the time of the question.
fn pods_answering(known: Arc<Mutex<Option<KnownPods>>>) -> PodsQuery {
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            if let ManagerControl::KnownPods(answer) = msg {
                let _ = answer.send(known.lock().unwrap().clone());
            }
        }
    });
    PodsQuery::new(tx)
}

fn known(uids: &[&str]) -> Arc<Mutex<Option<KnownPods>>> {
    Arc::new(Mutex::new(Some(KnownPods::running(uids.iter().copied()))))
}

fn runtime() -> FakeRuntime {
    FakeRuntime::new(FakeConfig {
        pod_cidr: Some("10.128.1.0/24".into()),
        pinned_images: vec![PAUSE.into()],
        seed: Some(3),
        ..Default::default()
    })
}

async fn pull(rt: &FakeRuntime, image: &str, size: &str) {
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

async fn sandbox(rt: &FakeRuntime, uid: &str) -> String {
    rt.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: uid.into(),
                uid: uid.into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            labels: labels::selector(uid),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap()
    .pod_sandbox_id
}

/// Starts instance `restart` of container `name` of pod `uid` from `image`; it exits a second later unless
/// `keeps_running`. Returns its id.
async fn start(
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
async fn containers(rt: &FakeRuntime) -> Vec<(String, String, u32, bool)> {
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
async fn crash_looped(rt: &FakeRuntime, sandbox: &str, uid: &str, dead: u32) {
    for r in 0..dead {
        start(rt, sandbox, uid, "app", r, "busybox", false).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    start(rt, sandbox, uid, "app", dead, "busybox", true).await;
}

fn settings(max_per_container: i32, min_age: Duration) -> GcSettings {
    GcSettings {
        minimum_container_ttl: min_age,
        max_dead_per_container: max_per_container,
        ..GcSettings::default()
    }
}

#[tokio::test(start_paused = true)]
async fn dead_containers_and_sandboxes_go_by_the_policy() {
    let rt = runtime();
    // built before time moves: its clock and the fake runtime's agree only from a common start
    let gc = ContainerGc::new(
        Arc::new(rt.clone()),
        &settings(1, Duration::ZERO),
        pods_answering(known(&["p"])),
        None,
    );
    pull(&rt, "busybox", "5Mi").await;
    let sb = sandbox(&rt, "p").await;
    crash_looped(&rt, &sb, "p", 4).await;
    let gone = sandbox(&rt, "gone").await;
    start(&rt, &gone, "gone", "app", 0, "busybox", false).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: gone.clone(),
    })
    .await
    .unwrap();

    let report = gc.collect().await.unwrap();
    assert_eq!(
        (report.containers, report.sandboxes, report.failed),
        (4, 1, 0),
        "{report:?}"
    );
    assert_eq!(
        containers(&rt).await,
        [
            ("p".into(), "app".into(), 3, false),
            ("p".into(), "app".into(), 4, true)
        ],
        "the running instance and the newest dead one stay; the gone pod's container goes"
    );
    let sandboxes = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .items;
    assert_eq!(sandboxes.len(), 1);
    assert_eq!(sandboxes[0].id, sb);
    // a second pass finds nothing more
    assert_eq!(gc.collect().await.unwrap(), ContainerGcReport::default());
}

#[tokio::test(start_paused = true)]
async fn container_age_is_counted_on_the_agents_clock() {
    let rt = runtime();
    let gc = ContainerGc::new(
        Arc::new(rt.clone()),
        &settings(0, Duration::from_secs(60)),
        pods_answering(known(&["p"])),
        None,
    );
    pull(&rt, "busybox", "5Mi").await;
    let sb = sandbox(&rt, "p").await;
    crash_looped(&rt, &sb, "p", 3).await;
    // instances 0..2 are dead, at most 6 s old: too young
    assert_eq!(gc.collect().await.unwrap().containers, 0);
    tokio::time::sleep(Duration::from_secs(61)).await;
    // 0 and 1 go; 2, the newest dead instance, stays behind the running one
    let report = gc.collect().await.unwrap();
    assert_eq!(report.containers, 2, "{:?}", containers(&rt).await);
    assert_eq!(
        containers(&rt).await,
        [
            ("p".into(), "app".into(), 2, false),
            ("p".into(), "app".into(), 3, true)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn pods_count_as_living_until_the_manager_has_seen_every_source() {
    let rt = runtime();
    let answer = Arc::new(Mutex::new(None));
    let gc = ContainerGc::new(
        Arc::new(rt.clone()),
        &settings(0, Duration::ZERO),
        pods_answering(answer.clone()),
        None,
    );
    pull(&rt, "busybox", "5Mi").await;
    let sb = sandbox(&rt, "old").await;
    for r in 0..3 {
        start(&rt, &sb, "old", "app", r, "busybox", false).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    })
    .await
    .unwrap();
    // not known yet: the policy applies, the two newest instances and the sandbox stay
    let report = gc.collect().await.unwrap();
    assert_eq!((report.containers, report.sandboxes), (1, 0));
    assert_eq!(containers(&rt).await.len(), 2);
    // the manager has seen every source and has no such pod: it is gone, everything of it goes
    *answer.lock().unwrap() = Some(KnownPods::default());
    let report = gc.collect().await.unwrap();
    assert_eq!((report.containers, report.sandboxes), (2, 1));
    assert_eq!(rt.counts().containers + rt.counts().sandboxes, 0);
}

#[tokio::test(start_paused = true)]
async fn reclaiming_takes_the_containers_of_terminated_pods_too() {
    let rt = runtime();
    let mut pods = KnownPods::default();
    pods.insert("done", true);
    let gc = ContainerGc::new(
        Arc::new(rt.clone()),
        &settings(1, Duration::ZERO),
        pods_answering(Arc::new(Mutex::new(Some(pods)))),
        None,
    );
    pull(&rt, "busybox", "5Mi").await;
    let sb = sandbox(&rt, "done").await;
    start(&rt, &sb, "done", "app", 0, "busybox", false).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        gc.collect().await.unwrap().containers,
        0,
        "its status still needs it"
    );
    assert_eq!(gc.delete_all_unused().await.unwrap().containers, 1);
}

#[tokio::test(start_paused = true)]
async fn the_container_loop_runs_once_a_period_and_reports_failures_on_the_node() {
    let rt = runtime();
    let gc = ContainerGc::new(
        Arc::new(rt.clone()),
        &settings(1, Duration::ZERO),
        pods_answering(known(&["p"])),
        None,
    );
    pull(&rt, "busybox", "5Mi").await;
    let sb = sandbox(&rt, "p").await;
    crash_looped(&rt, &sb, "p", 3).await;
    let (events, mut seen) = CapturedEvents::new();
    let token = tokio_util::sync::CancellationToken::new();
    let collectors = GarbageCollectors {
        containers: gc,
        images: image_gc_off(&rt, events.clone()),
    };
    let task = tokio::spawn(run(
        collectors,
        events,
        "n1".into(),
        periods(60, 300),
        token.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(containers(&rt).await.len(), 2, "one pass within the first period");
    rt.set_reachable(false);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let events = seen.drain();
    assert_eq!(events.len(), 1, "{events:?}");
    let (kind, reason, message, object) = &events[0];
    assert_eq!(
        (*kind, reason.as_str(), object.as_str()),
        (EventType::Warning, CONTAINER_GC_FAILED, "n1")
    );
    assert!(message.starts_with("failed to list containers"), "{message}");
    token.cancel();
    task.await.unwrap();
}

fn periods(containers: u64, images: u64) -> Periods {
    Periods {
        containers: Duration::from_secs(containers),
        images: Duration::from_secs(images),
    }
}

/// An image collector whose policy turns it off.
fn image_gc_off(rt: &FakeRuntime, events: crate::events::EventRecorder) -> ImageGc {
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
struct NoFs;

#[async_trait::async_trait]
impl ImageFsSource for NoFs {
    async fn image_fs(&self) -> Result<FsStats, String> {
        Err("no image filesystem here".into())
    }
}

// ---- images ----

struct Images {
    rt: FakeRuntime,
    gc: ImageGc,
    metrics: Arc<Metrics>,
    events: CapturedEvents,
    /// Records into `events` too.
    recorder: crate::events::EventRecorder,
    /// The sandbox of the containers that use images.
    sandbox: String,
}

/// pause (pinned, 10Mi), a 100Mi, b 200Mi, c 300Mi, used 100Mi on a 1000Mi image filesystem: 71 % used.
async fn images(policy: ImagePolicy) -> Images {
    let rt = runtime();
    for (image, size) in [("a", "100Mi"), ("b", "200Mi"), ("c", "300Mi"), ("used", "100Mi")] {
        pull(&rt, image, size).await;
    }
    let sandbox = sandbox(&rt, "p").await;
    let metrics = Arc::new(Metrics::unregistered());
    let (recorder, events) = CapturedEvents::new();
    let fs = RuntimeImageFs::new(Arc::new(rt.clone()), ImageFsKind::Capacity(1000 * MI));
    let gc = ImageGc::new(
        Arc::new(rt.clone()),
        policy,
        Arc::new(fs),
        recorder.clone(),
        "n1",
        metrics.clone(),
    );
    Images {
        rt,
        gc,
        metrics,
        events,
        recorder,
        sandbox,
    }
}

async fn image_names(rt: &FakeRuntime) -> Vec<String> {
    let mut names: Vec<String> = rt
        .list_images(cri::ListImagesRequest::default())
        .await
        .unwrap()
        .images
        .into_iter()
        .flat_map(|i| i.repo_tags)
        .map(|t| {
            t.trim_start_matches("docker.io/library/")
                .trim_end_matches(":latest")
                .to_owned()
        })
        .collect();
    names.sort();
    names
}

/// Stops and removes a container.
async fn remove(rt: &FakeRuntime, id: &str) {
    rt.stop_container(cri::StopContainerRequest {
        container_id: id.into(),
        timeout: 0,
    })
    .await
    .unwrap();
    rt.remove_container(cri::RemoveContainerRequest {
        container_id: id.into(),
    })
    .await
    .unwrap();
}

#[tokio::test(start_paused = true)]
async fn unused_images_go_least_recently_used_first_down_to_the_low_threshold() {
    let policy = ImagePolicy {
        high_threshold_percent: 70,
        low_threshold_percent: 50,
        min_age: Duration::from_secs(120),
        max_age: Duration::ZERO,
    };
    let mut t = images(policy).await;
    let sb = t.sandbox.clone();
    let uses_b = start(&t.rt, &sb, "p", "b", 0, "b", false).await;
    let uses_c = start(&t.rt, &sb, "p", "c", 0, "c", true).await;
    start(&t.rt, &sb, "p", "used", 0, "used", true).await;

    // 71 % >= 70 %: 210Mi to free, but every image is younger than the minimum age
    let error = t.gc.collect().await.unwrap_err();
    assert!(matches!(error, ImageGcError::NotEnoughFreed(_)), "{error}");
    let events = t.events.drain();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        (events[0].0, events[0].1.as_str(), events[0].3.as_str()),
        (EventType::Warning, FREE_DISK_SPACE_FAILED, "n1")
    );
    assert_eq!(
        events[0].2,
        "Insufficient free disk space on the node's image filesystem (71% of 1000.0 MiB used). Failed to free \
         sufficient space by deleting unused images (freed 0 bytes). Investigate disk usage, as it could be used \
         by active images, logs, volumes, or other data."
    );
    assert_eq!(error.to_string(), events[0].2);

    // b's container goes (its exited container kept b in use until now), a minute later c's
    remove(&t.rt, &uses_b).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(t.gc.collect().await.is_err(), "still too young");
    remove(&t.rt, &uses_c).await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    // never used a, then b (last used at 0 s), then c (at 60 s): a + b free 300Mi >= 210Mi, c stays
    let freed = t.gc.collect().await.unwrap();
    assert_eq!(freed, 300 * MI);
    assert_eq!(
        image_names(&t.rt).await,
        ["c", "registry.k8s.io/pause:3.10", "used"]
    );
    assert_eq!(t.metrics.images_collected("space"), 2);

    // below the high threshold nothing is collected, however old
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(t.gc.collect().await.unwrap(), 0);
    // reclaiming for eviction takes every unused image old enough: c; never the one in use or the pinned pause
    assert_eq!(t.gc.delete_unused_images().await.unwrap(), 300 * MI);
    assert_eq!(image_names(&t.rt).await, ["registry.k8s.io/pause:3.10", "used"]);
    assert_eq!(t.gc.delete_unused_images().await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn reclaiming_honours_the_minimum_age() {
    let policy = ImagePolicy {
        high_threshold_percent: 85,
        low_threshold_percent: 80,
        min_age: Duration::from_secs(120),
        max_age: Duration::ZERO,
    };
    let t = images(policy).await;
    assert_eq!(
        t.gc.delete_unused_images().await.unwrap(),
        0,
        "first seen just now"
    );
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(t.gc.delete_unused_images().await.unwrap(), 700 * MI);
    assert_eq!(image_names(&t.rt).await, ["registry.k8s.io/pause:3.10"]);
}

#[tokio::test(start_paused = true)]
async fn images_unused_longer_than_the_maximum_age_go_whatever_the_usage() {
    let policy = ImagePolicy {
        high_threshold_percent: 100,
        low_threshold_percent: 99,
        min_age: Duration::from_secs(60),
        max_age: Duration::from_secs(300),
    };
    let t = images(policy).await;
    assert!(!policy.disabled());
    let sb = t.sandbox.clone();
    let uses_b = start(&t.rt, &sb, "p", "b", 0, "b", true).await;
    start(&t.rt, &sb, "p", "used", 0, "used", true).await;
    let minute = Duration::from_secs(60);
    // seen in use at 0 s and 120 s; unused from then on
    t.gc.collect().await.unwrap();
    tokio::time::sleep(2 * minute).await;
    t.gc.collect().await.unwrap();
    remove(&t.rt, &uses_b).await;
    tokio::time::sleep(2 * minute).await;
    assert_eq!(
        t.gc.collect().await.unwrap(),
        0,
        "the collector has not run 5 min yet"
    );
    tokio::time::sleep(2 * minute).await;
    // at 6 min: a and c were never seen in use; b was, 4 min ago
    assert_eq!(t.gc.collect().await.unwrap(), 400 * MI);
    assert_eq!(
        image_names(&t.rt).await,
        ["b", "registry.k8s.io/pause:3.10", "used"]
    );
    tokio::time::sleep(2 * minute).await;
    assert_eq!(t.gc.collect().await.unwrap(), 200 * MI);
    assert_eq!(image_names(&t.rt).await, ["registry.k8s.io/pause:3.10", "used"]);
    assert_eq!(t.metrics.images_collected("age"), 3);
    assert_eq!(t.metrics.images_collected("space"), 0);
}

#[tokio::test(start_paused = true)]
async fn the_image_loop_reports_a_repeated_failure_as_image_gc_failed() {
    let policy = ImagePolicy {
        high_threshold_percent: 70,
        low_threshold_percent: 50,
        min_age: Duration::from_secs(3600),
        max_age: Duration::ZERO,
    };
    let mut t = images(policy).await;
    let token = tokio_util::sync::CancellationToken::new();
    let period = Duration::from_secs(300);
    let collectors = GarbageCollectors {
        containers: ContainerGc::new(
            Arc::new(t.rt.clone()),
            &GcSettings::default(),
            pods_answering(Arc::new(Mutex::new(None))),
            None,
        ),
        images: t.gc.clone(),
    };
    let task = tokio::spawn(run(
        collectors,
        t.recorder.clone(),
        "n1".into(),
        periods(86_400, 300),
        token.clone(),
    ));
    tokio::time::sleep(period).await;
    let reasons: Vec<String> = t.events.drain().into_iter().map(|e| e.1).collect();
    assert_eq!(reasons, [FREE_DISK_SPACE_FAILED], "one pass, failed once");
    tokio::time::sleep(period).await;
    let reasons: Vec<String> = t.events.drain().into_iter().map(|e| e.1).collect();
    assert_eq!(
        reasons,
        [FREE_DISK_SPACE_FAILED, IMAGE_GC_FAILED],
        "failed twice in a row"
    );
    token.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_high_threshold_of_100_without_a_maximum_age_turns_image_gc_off() {
    let rt = runtime();
    let (events, mut seen) = CapturedEvents::new();
    let collectors = GarbageCollectors {
        containers: ContainerGc::new(
            Arc::new(rt.clone()),
            &GcSettings::default(),
            pods_answering(Arc::new(Mutex::new(None))),
            None,
        ),
        images: image_gc_off(&rt, events.clone()),
    };
    assert!(collectors.images.policy().disabled());
    let token = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(run(
        collectors,
        events,
        "n1".into(),
        periods(86_400, 300),
        token.clone(),
    ));
    // were it on, its passes would fail (the filesystem cannot be measured) and say so from the second one
    tokio::time::sleep(Duration::from_secs(1800)).await;
    assert!(seen.drain().is_empty());
    token.cancel();
    task.await.unwrap();
}
