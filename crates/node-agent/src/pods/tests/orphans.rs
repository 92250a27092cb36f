//! The orphan sweep of a node with a pods directory: what pods the agent neither knows nor runs left behind —
//! a sandbox still in the runtime, pod directories — is removed after the first list, and a directory that
//! appears later by the periodic housekeeping, while the pods the node has keep theirs.

use std::sync::Arc;
use std::time::Duration;

use cri_fake::{FakeConfig, FakeRuntime};
use runtime_api::{Runtime, cri};
use serde_json::json;

use crate::pods::PodConfig;
use crate::pods::runtime::labels::POD_UID;
use crate::pods::source::PodEvent;
use crate::pods::tests::{Harness, pod};

/// Ready sandboxes of pod `uid` in the runtime.
async fn sandboxes(rt: &FakeRuntime, uid: &str) -> usize {
    rt.list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|s| s.labels.get(POD_UID).map(String::as_str) == Some(uid))
        .count()
}

#[tokio::test(start_paused = true)]
async fn what_pods_deleted_while_the_agent_was_down_left_is_swept() {
    let tmp = tempfile::tempdir().unwrap();
    let pods_dir = tmp.path().join("pods");
    let runtime = FakeRuntime::new(FakeConfig {
        pod_cidr: Some("10.128.1.0/24".into()),
        seed: Some(7),
        ..Default::default()
    });
    // a pod deleted while the agent was down: its sandbox still runs, its directory is still there
    crate::pods::tests::leftover_sandbox(&runtime, "gone").await;
    std::fs::create_dir_all(pods_dir.join("uid-gone/containers/app")).unwrap();
    std::fs::write(pods_dir.join("uid-gone/containers/app/0"), "bye").unwrap();
    // and one the runtime no longer knows either
    std::fs::create_dir_all(pods_dir.join("uid-stray/volumes/kubernetes.io~empty-dir/x")).unwrap();

    let mut config = PodConfig::new("n1");
    config.kind = crate::pods::NodeKind::Real;
    config.layout.pods_dir = Some(pods_dir.clone());
    let mut h = Harness::start_configured(runtime.clone(), Arc::new(runtime.clone()), config);
    h.send(PodEvent::Snapshot(vec![pod(
        "kept",
        json!({"containers": [{"name": "app", "image": "nginx:1.27"}]}),
        json!({}),
    )]))
    .await;
    h.until(
        "kept Running, the orphans' directories gone",
        Duration::from_secs(30),
        |h| {
            h.phase("kept") == Some("Running")
                && !pods_dir.join("uid-gone").exists()
                && !pods_dir.join("uid-stray").exists()
        },
    )
    .await;
    assert_eq!(
        sandboxes(&runtime, "uid-gone").await,
        0,
        "the orphan's sandbox removed"
    );
    assert_eq!(sandboxes(&runtime, "uid-kept").await, 1);
    assert!(
        pods_dir.join("uid-kept").is_dir(),
        "the running pod keeps its directory"
    );

    // left later (e.g. by a removal that failed): the periodic housekeeping takes it
    std::fs::create_dir_all(pods_dir.join("uid-later/containers/app")).unwrap();
    let t = h.t0.elapsed();
    let swept = h
        .until("the later directory gone", Duration::from_secs(30), |_| {
            !pods_dir.join("uid-later").exists()
        })
        .await;
    assert!(
        swept - t <= crate::pods::manager::orphans::PERIOD + Duration::from_secs(1),
        "swept {:?} after it appeared",
        swept - t
    );
    assert!(pods_dir.join("uid-kept").is_dir());
    assert_eq!(h.phase("kept"), Some("Running"));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn what_a_pod_deleted_after_the_list_left_is_swept() {
    let tmp = tempfile::tempdir().unwrap();
    let pods_dir = tmp.path().join("pods");
    let runtime = FakeRuntime::new(FakeConfig {
        pod_cidr: Some("10.128.1.0/24".into()),
        seed: Some(7),
        ..Default::default()
    });
    let mut config = PodConfig::new("n1");
    config.kind = crate::pods::NodeKind::Real;
    config.layout.pods_dir = Some(pods_dir.clone());
    let mut h = Harness::start_configured(runtime.clone(), Arc::new(runtime.clone()), config);
    let brief = pod(
        "brief",
        json!({"containers": [{"name": "app", "image": "nginx:1.27"}]}),
        json!({}),
    );
    h.send(PodEvent::Snapshot(vec![brief.clone()])).await;
    h.until("brief Running", Duration::from_secs(30), |h| {
        h.phase("brief") == Some("Running")
    })
    .await;
    // deleted from the API after the list (its worker cleans up), and something of it left behind afterwards
    // (a removal that failed while it ran, as a cgroup still busy): the pod is in no list since, only in the
    // watch's deletion
    h.send(PodEvent::Delete(Box::new(brief))).await;
    h.until("brief's directory gone", Duration::from_secs(30), |_| {
        !pods_dir.join("uid-brief").exists()
    })
    .await;
    std::fs::create_dir_all(pods_dir.join("uid-brief/containers/app")).unwrap();
    h.until(
        "the deleted pod's leftover swept",
        crate::pods::manager::orphans::PERIOD * 3,
        |_| !pods_dir.join("uid-brief").exists(),
    )
    .await;
    assert_eq!(sandboxes(&runtime, "uid-brief").await, 0);
    h.stop().await;
}
