//! The image collector: records, least recently used order, thresholds, ages, events, its loop.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cri_fake::FakeRuntime;
use runtime_api::{Runtime, cri};

use super::*;
use crate::events::{CapturedEvents, EventType};

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
    let task = tokio::spawn(token.clone().run_until_cancelled_owned(run(
        collectors,
        t.recorder.clone(),
        "n1".into(),
        periods(86_400, 300),
        crate::density::timer::Timer::new(),
    )));
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
    let task = tokio::spawn(token.clone().run_until_cancelled_owned(run(
        collectors,
        events,
        "n1".into(),
        periods(86_400, 300),
        crate::density::timer::Timer::new(),
    )));
    // were it on, its passes would fail (the filesystem cannot be measured) and say so from the second one
    tokio::time::sleep(Duration::from_secs(1800)).await;
    assert!(seen.drain().is_empty());
    token.cancel();
    task.await.unwrap();
}
