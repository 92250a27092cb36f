//! The manager against the in-memory runtime, its containers' logs in a temp directory: what a pass rotates,
//! and when passes run (paused tokio time).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cri_fake::{FakeConfig, FakeRuntime};
use runtime_api::{Runtime, cri};

use super::{LogRotationManager, RotationError, RotationPolicy};
use crate::config::KubeletConfig;

const IMAGE: &str = "docker.io/library/busybox:1.36";
/// 2026-01-01T00:00:00Z: the wall clock the tests' rotated files are named by.
const NEW_YEAR: u64 = 1_767_225_600;

fn fake() -> Arc<FakeRuntime> {
    Arc::new(FakeRuntime::new(FakeConfig {
        pod_cidr: Some("10.244.7.0/24".into()),
        images: vec![IMAGE.into()],
        seed: Some(3),
        ..FakeConfig::default()
    }))
}

fn policy(max_size: u64, max_files: usize, workers: usize) -> RotationPolicy {
    RotationPolicy {
        max_size,
        max_files,
        workers,
        interval: Duration::from_secs(10),
    }
}

fn manager(rt: &Arc<FakeRuntime>, policy: RotationPolicy) -> LogRotationManager {
    LogRotationManager::new(rt.clone(), policy)
        .with_wall_clock(SystemTime::UNIX_EPOCH + Duration::from_secs(NEW_YEAR))
}

/// A container of a pod whose log directory is `dir/<pod>`, started unless `running` is false; its ID and
/// log path (the directory made, the file not written).
async fn container(rt: &FakeRuntime, dir: &Path, pod: &str, running: bool) -> (String, PathBuf) {
    let labels = HashMap::from([("io.kubernetes.pod.name".to_owned(), pod.to_owned())]);
    let sandbox = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: pod.into(),
                    uid: format!("uid-{pod}"),
                    namespace: "default".into(),
                    attempt: 0,
                }),
                log_directory: dir.join(pod).display().to_string(),
                labels,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .pod_sandbox_id;
    let id = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox,
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "app".into(),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: IMAGE.into(),
                    ..Default::default()
                }),
                log_path: "app/0.log".into(),
                ..Default::default()
            }),
            sandbox_config: None,
        })
        .await
        .unwrap()
        .container_id;
    if running {
        rt.start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap();
    }
    let log = dir.join(pod).join("app/0.log");
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    (id, log)
}

/// The names of the files beside `log`.
fn files(log: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(log.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

fn write(log: &Path, bytes: usize) {
    std::fs::write(log, "x".repeat(bytes)).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_pass_runs_at_start_and_then_every_interval() {
    let dir = tempfile::tempdir().unwrap();
    let rt = fake();
    let (_, log) = container(&rt, dir.path(), "p", true).await;
    write(&log, 2000);
    let start = tokio::time::Instant::now();
    let task = tokio::spawn(manager(&rt, policy(1000, 3, 1)).run());

    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(files(&log), ["0.log.20260101-000000"], "rotated at once");
    write(&log, 2000);
    tokio::time::sleep_until(start + Duration::from_millis(9_900)).await;
    assert_eq!(
        files(&log),
        ["0.log", "0.log.20260101-000000"],
        "no pass before the interval"
    );
    tokio::time::sleep_until(start + Duration::from_millis(10_100)).await;
    assert_eq!(
        files(&log),
        ["0.log.20260101-000000.gz", "0.log.20260101-000010"],
        "the second pass compressed the first rotation"
    );
    write(&log, 500);
    tokio::time::sleep_until(start + Duration::from_millis(20_100)).await;
    assert_eq!(files(&log).len(), 3, "a log under the size is not rotated");
    write(&log, 1000);
    tokio::time::sleep_until(start + Duration::from_millis(30_100)).await;
    assert_eq!(
        files(&log),
        ["0.log.20260101-000010.gz", "0.log.20260101-000030"],
        "3 files at most: the oldest is gone"
    );
    task.abort();
}

#[tokio::test]
async fn a_pass_rotates_running_containers_at_the_size_only() {
    let dir = tempfile::tempdir().unwrap();
    let rt = fake();
    let (_, big) = container(&rt, dir.path(), "big", true).await;
    let (_, exact) = container(&rt, dir.path(), "exact", true).await;
    let (_, small) = container(&rt, dir.path(), "small", true).await;
    let (_, created) = container(&rt, dir.path(), "created", false).await;
    write(&big, 5000);
    write(&exact, 1000);
    write(&small, 999);
    write(&created, 5000);
    manager(&rt, policy(1000, 5, 2)).pass().await.unwrap();
    assert_eq!(files(&big), ["0.log.20260101-000000"]);
    assert_eq!(files(&exact), ["0.log.20260101-000000"]);
    assert_eq!(files(&small), ["0.log"]);
    assert_eq!(
        files(&created),
        ["0.log"],
        "a container that does not run is left alone"
    );
}

#[tokio::test]
async fn a_missing_log_is_reopened_first() {
    let dir = tempfile::tempdir().unwrap();
    let rt = fake();
    let (id, log) = container(&rt, dir.path(), "gone", true).await;
    // the in-memory runtime reopens without writing a file: the log is still missing after the reopen
    let err = manager(&rt, policy(1000, 5, 1)).check(&id).await.unwrap_err();
    assert!(matches!(err, RotationError::Stat { .. }), "{err}");
    assert!(err.to_string().contains(&log.display().to_string()), "{err}");
    // a container the runtime no longer has: its status fails
    let err = manager(&rt, policy(1000, 5, 1)).check("nope").await.unwrap_err();
    assert!(matches!(err, RotationError::Status(_)), "{err}");
}

#[test]
fn the_policy_is_the_configurations_and_a_negative_size_turns_rotation_off() {
    let k = KubeletConfig::default();
    assert_eq!(
        RotationPolicy::from_config(&k),
        Some(RotationPolicy {
            max_size: 10 << 20,
            max_files: 5,
            workers: 1,
            interval: Duration::from_secs(10),
        })
    );
    let off = KubeletConfig {
        container_log_max_size: "-1".parse().unwrap(),
        ..KubeletConfig::default()
    };
    assert_eq!(RotationPolicy::from_config(&off), None);
}
