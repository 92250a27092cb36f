//! Containers (CREATED → RUNNING → EXITED → removed), their error codes and ids.

use runtime_api::{Code, Runtime, cri};

use super::*;
use crate::ProbeTarget;

#[tokio::test]
async fn a_containers_log_path_is_under_its_sandboxs_log_directory_whatever_its_form() {
    let rt = fake();
    // the kubelet's form `<root>/<namespace>_<name>_<uid>` (kept as its root), and two that are not
    for (name, dir) in [
        ("k", "/var/log/pods/default_k_uid-k"),
        ("r", "/srv/logs/default_r_uid-r/"),
        ("o", "/var/log/pods/other_o_uid-o"),
        ("b", "default_b_uid-b"),
    ] {
        let mut config = pod_config(name, &[]);
        config.log_directory = dir.to_owned();
        let pod = run_pod_with(&rt, config).await;
        let id = create(&rt, &pod, "app", 1, &[]).await.unwrap();
        let want = format!("{}/app/1.log", dir.trim_end_matches('/'));
        assert_eq!(status(&rt, &id).await.log_path, want, "{dir}");
    }
}

#[tokio::test]
async fn container_created_running_exited_removed() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[]).await;
    let id = create(&rt, &pod, "app", 0, &[("note", "kept")]).await.unwrap();
    let s = status(&rt, &id).await;
    let config = container_config("app", 0, &[("note", "kept")]);
    assert_eq!(state(&s), cri::ContainerState::ContainerCreated);
    assert!(s.created_at > 0 && s.started_at == 0 && s.finished_at == 0);
    assert_eq!((s.exit_code, s.reason.as_str()), (0, ""));
    assert_eq!(s.metadata, config.metadata);
    assert_eq!(s.labels, config.labels);
    assert_eq!(s.annotations, config.annotations);
    assert_eq!(s.image.unwrap().image, IMAGE);
    assert!(s.image_id.starts_with("sha256:") && !s.image_ref.is_empty());
    assert_eq!(s.log_path, "/var/log/pods/default_p/app/0.log");

    start(&rt, &id).await.unwrap();
    let s = status(&rt, &id).await;
    assert_eq!(state(&s), cri::ContainerState::ContainerRunning);
    assert!(s.started_at >= s.created_at && s.finished_at == 0);
    let err = start(&rt, &id).await.unwrap_err();
    assert_eq!(err.code, Code::Unknown, "already running");

    rt.stop_container(cri::StopContainerRequest {
        container_id: id.clone(),
        timeout: 30,
    })
    .await
    .unwrap();
    let s = status(&rt, &id).await;
    assert_eq!(state(&s), cri::ContainerState::ContainerExited);
    assert_eq!((s.exit_code, s.reason.as_str()), (0, "Completed"));
    assert!(s.finished_at >= s.started_at);
    rt.stop_container(cri::StopContainerRequest {
        container_id: id.clone(),
        timeout: 30,
    })
    .await
    .unwrap();
    assert_eq!(
        start(&rt, &id).await.unwrap_err().code,
        Code::Unknown,
        "exited containers do not restart"
    );

    rt.remove_container(cri::RemoveContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap();
    let err = rt
        .container_status(cri::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: false,
        })
        .await;
    assert_eq!(err.unwrap_err().code, Code::NotFound);
    rt.remove_container(cri::RemoveContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap();
    assert_eq!(start(&rt, &id).await.unwrap_err().code, Code::NotFound);
}

#[tokio::test]
async fn stop_kill_and_forced_removal() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[]).await;
    let killed = run_container(&rt, &pod, "killed", &[]).await;
    rt.stop_container(cri::StopContainerRequest {
        container_id: killed.clone(),
        timeout: 0,
    })
    .await
    .unwrap();
    let s = status(&rt, &killed).await;
    assert_eq!(
        (s.exit_code, s.reason.as_str()),
        (137, "Error"),
        "timeout 0 kills at once"
    );

    let created = create(&rt, &pod, "never-started", 0, &[]).await.unwrap();
    rt.stop_container(cri::StopContainerRequest {
        container_id: created.clone(),
        timeout: 10,
    })
    .await
    .unwrap();
    assert_eq!(
        state(&status(&rt, &created).await),
        cri::ContainerState::ContainerCreated,
        "stop leaves CREATED"
    );

    let running = run_container(&rt, &pod, "running", &[]).await;
    rt.remove_container(cri::RemoveContainerRequest {
        container_id: running.clone(),
    })
    .await
    .unwrap();
    let left = rt.list_containers(Default::default()).await.unwrap().containers;
    assert_eq!(left.len(), 2, "a running container is removed by force");

    // stopping the sandbox kills what runs and leaves created containers created
    let busy = run_container(&rt, &pod, "busy", &[]).await;
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    let s = status(&rt, &busy).await;
    assert_eq!(
        (state(&s), s.exit_code),
        (cri::ContainerState::ContainerExited, 137)
    );
    assert_eq!(
        state(&status(&rt, &created).await),
        cri::ContainerState::ContainerCreated
    );

    // starting in a stopped sandbox, creating in it, and after removal
    assert_eq!(start(&rt, &created).await.unwrap_err().code, Code::Unknown);
    assert_eq!(
        create(&rt, &pod, "late", 0, &[]).await.unwrap_err().code,
        Code::NotFound
    );
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    assert_eq!(start(&rt, &created).await.unwrap_err().code, Code::NotFound);
    assert_eq!(
        create(&rt, &pod, "late", 0, &[]).await.unwrap_err().code,
        Code::NotFound
    );
    assert!(
        rt.list_containers(Default::default())
            .await
            .unwrap()
            .containers
            .is_empty()
    );
}

#[tokio::test]
async fn container_creation_errors() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[]).await;
    let err = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert_eq!(
        create(&rt, "f00d", "x", 0, &[]).await.unwrap_err().code,
        Code::NotFound
    );
    let mut config = container_config("x", 0, &[]);
    config.image = Some(cri::ImageSpec {
        image: "nginx:missing".into(),
        ..Default::default()
    });
    let err = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(config),
            sandbox_config: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::NotFound, "image not present");
    create(&rt, &pod, "x", 0, &[]).await.unwrap();
    assert_eq!(
        create(&rt, &pod, "x", 0, &[]).await.unwrap_err().code,
        Code::Unknown,
        "name reserved"
    );
    let retry = create(&rt, &pod, "x", 1, &[]).await.unwrap();
    assert_eq!(status(&rt, &retry).await.metadata.unwrap().attempt, 1);
}

#[tokio::test]
async fn unknown_ids() {
    let rt = fake();
    let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let code = |r: runtime_api::Result<()>| r.unwrap_err().code;
    assert_eq!(code(start(&rt, id).await), Code::NotFound);
    rt.stop_container(cri::StopContainerRequest {
        container_id: id.into(),
        timeout: 0,
    })
    .await
    .expect("StopContainer is idempotent");
    let r = rt
        .container_status(cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        })
        .await;
    assert_eq!(code(r.map(drop)), Code::NotFound);
    let r = rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.into(),
            cmd: vec!["true".into()],
            timeout: 1,
        })
        .await;
    assert_eq!(code(r.map(drop)), Code::NotFound);
    let r = rt
        .container_stats(cri::ContainerStatsRequest {
            container_id: id.into(),
        })
        .await;
    assert_eq!(code(r.map(drop)), Code::NotFound);
    let r = rt
        .pod_sandbox_stats(cri::PodSandboxStatsRequest {
            pod_sandbox_id: id.into(),
        })
        .await;
    assert_eq!(code(r.map(drop)), Code::NotFound);
    assert!(
        rt.remove_container(cri::RemoveContainerRequest {
            container_id: id.into()
        })
        .await
        .is_ok()
    );
    assert!(
        rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.into()
        })
        .await
        .is_ok()
    );
    assert_eq!(
        rt.probe_result(id, ProbeTarget::Tcp { port: 1 })
            .unwrap_err()
            .code,
        Code::NotFound
    );
    assert_eq!(rt.container_logs(id).unwrap_err().code, Code::NotFound);
}

#[tokio::test]
async fn ids_resolve_by_unique_prefix() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[]).await;
    let a = create(&rt, &pod, "a", 0, &[]).await.unwrap();
    let b = create(&rt, &pod, "b", 0, &[]).await.unwrap();
    assert_ne!(a, b);
    assert_ne!(a[..12], b[..12]);
    assert_eq!(status(&rt, &a[..12]).await.id, a);
    assert_eq!(sandbox(&rt, &pod[..12]).await.id, pod);
    let other = fake();
    let err = other
        .container_status(cri::ContainerStatusRequest {
            container_id: a.clone(),
            verbose: false,
        })
        .await;
    assert_eq!(
        err.unwrap_err().code,
        Code::NotFound,
        "same seed, different runtime objects"
    );
}

#[tokio::test]
async fn reopen_container_log_answers_for_running_containers_only() {
    let rt = fake();
    let pod = run_pod(&rt, "reopen", &[]).await;
    let id = create(&rt, &pod, "app", 0, &[]).await.unwrap();
    let reopen = |id: &str| {
        rt.reopen_container_log(cri::ReopenContainerLogRequest {
            container_id: id.to_owned(),
        })
    };
    assert_eq!(
        reopen(&id).await.unwrap_err().code,
        Code::Unknown,
        "created, not running"
    );
    start(&rt, &id).await.unwrap();
    reopen(&id).await.unwrap();
    assert_eq!(reopen("nope").await.unwrap_err().code, Code::NotFound);
}
