//! Sandboxes (READY → NOTREADY → removed), runtime status and reachability.

use runtime_api::{Code, Runtime, cri};

use super::*;

#[tokio::test]
async fn version_and_status() {
    let rt = fake();
    let v = rt
        .version(cri::VersionRequest { version: "v1".into() })
        .await
        .unwrap();
    assert_eq!(v.runtime_name, "cri-fake");
    assert_eq!(v.runtime_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(v.runtime_api_version, "v1");

    let conditions = |s: cri::StatusResponse| -> Vec<(String, bool, String)> {
        s.status
            .unwrap()
            .conditions
            .into_iter()
            .map(|c| (c.r#type, c.status, c.reason))
            .collect()
    };
    let s = rt.status(cri::StatusRequest::default()).await.unwrap();
    assert_eq!(
        conditions(s),
        [
            ("RuntimeReady".into(), true, String::new()),
            ("NetworkReady".into(), true, String::new())
        ]
    );
    rt.set_runtime_ready(false);
    rt.set_network_ready(false);
    let s = rt.status(cri::StatusRequest::default()).await.unwrap();
    let c = s.status.unwrap().conditions;
    assert!(!c[0].status && c[0].reason == "RuntimeNotReady" && !c[0].message.is_empty());
    assert!(!c[1].status && c[1].reason == "NetworkPluginNotReady" && !c[1].message.is_empty());
}

#[tokio::test]
async fn unreachable_runtime_answers_unavailable() {
    let rt = fake();
    rt.set_reachable(false);
    assert_eq!(
        rt.version(Default::default()).await.unwrap_err().code,
        Code::Unavailable
    );
    assert_eq!(
        rt.list_containers(Default::default()).await.unwrap_err().code,
        Code::Unavailable
    );
    assert_eq!(
        rt.get_container_events(Default::default())
            .await
            .err()
            .unwrap()
            .code,
        Code::Unavailable
    );
    rt.set_reachable(true);
    assert!(rt.version(Default::default()).await.is_ok());
}

#[tokio::test]
async fn sandbox_ready_notready_removed() {
    let rt = fake();
    let id = run_pod(&rt, "web", &[("note", "kept")]).await;
    assert_eq!(id.len(), 64);
    let s = sandbox(&rt, &id).await;
    assert_eq!(s.id, id);
    assert_eq!(s.state, cri::PodSandboxState::SandboxReady as i32);
    assert!(s.created_at > 1_600_000_000_000_000_000, "wall-clock nanoseconds");
    assert_eq!(s.network.as_ref().unwrap().ip, "10.244.7.2");
    let config = pod_config("web", &[("note", "kept")]);
    assert_eq!(s.metadata, config.metadata);
    assert_eq!(s.labels, config.labels);
    assert_eq!(s.annotations, config.annotations);
    let network_mode = s.linux.unwrap().namespaces.unwrap().options.unwrap().network;
    assert_eq!(network_mode, cri::NamespaceMode::Pod as i32);

    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: id.clone(),
    })
    .await
    .unwrap();
    let s = sandbox(&rt, &id).await;
    assert_eq!(s.state, cri::PodSandboxState::SandboxNotready as i32);
    assert_eq!(s.network.unwrap().ip, "", "network torn down");
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: id.clone(),
    })
    .await
    .unwrap();

    // the address is free again
    let other = run_pod(&rt, "other", &[]).await;
    assert_eq!(
        sandbox(&rt, &other).await.network.unwrap().ip,
        "10.244.7.3",
        "round robin, like host-local"
    );
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: id.clone(),
    })
    .await
    .unwrap();
    let err = rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.clone(),
            verbose: false,
        })
        .await;
    assert_eq!(err.unwrap_err().code, Code::NotFound);
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: id.clone(),
    })
    .await
    .unwrap();
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: id })
        .await
        .expect("StopPodSandbox is idempotent: a removed sandbox stops fine");
}

#[tokio::test]
async fn host_network_sandbox_has_no_pod_ip_and_ignores_network_readiness() {
    let rt = fake();
    rt.set_network_ready(false);
    let mut config = pod_config("host", &[]);
    config.linux = Some(cri::LinuxPodSandboxConfig {
        security_context: Some(cri::LinuxSandboxSecurityContext {
            namespace_options: Some(cri::NamespaceOption {
                network: cri::NamespaceMode::Node as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = run_pod_with(&rt, config).await;
    let s = sandbox(&rt, &id).await;
    assert_eq!(s.network.unwrap().ip, "");
    assert_eq!(
        s.linux.unwrap().namespaces.unwrap().options.unwrap().network,
        cri::NamespaceMode::Node as i32
    );
    let err = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(pod_config("net", &[])),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::Unknown);
    assert!(err.message.contains("cni plugin not initialized"), "{err}");
}

#[tokio::test]
async fn sandbox_creation_errors() {
    let rt = fake();
    let err = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    run_pod(&rt, "dup", &[]).await;
    let err = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(pod_config("dup", &[])),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::Unknown, "name reserved");
    let mut next = pod_config("dup", &[]);
    next.metadata.as_mut().unwrap().attempt = 1;
    rt.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(next),
        ..Default::default()
    })
    .await
    .unwrap();

    let tiny = FakeRuntime::new(FakeConfig {
        pod_cidr: Some("10.0.0.0/30".into()),
        ..Default::default()
    });
    run_pod(&tiny, "a", &[]).await;
    let err = tiny
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(pod_config("b", &[])),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        err.code == Code::Unknown && err.message.contains("no IP addresses"),
        "{err}"
    );
}

#[tokio::test]
async fn removing_a_ready_sandbox_removes_its_containers() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[]).await;
    let keep = run_pod(&rt, "keep", &[]).await;
    run_container(&rt, &pod, "a", &[]).await;
    let other = run_container(&rt, &keep, "b", &[]).await;
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: pod })
        .await
        .unwrap();
    let left = rt.list_containers(Default::default()).await.unwrap().containers;
    assert_eq!(
        left.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        [other.as_str()]
    );
    assert_eq!(rt.counts().sandboxes, 1);
}

#[tokio::test]
async fn without_a_pod_cidr_the_network_is_not_ready_until_update_runtime_config() {
    let rt = FakeRuntime::new(FakeConfig {
        pod_cidr: None,
        ..FakeConfig::default()
    });
    assert_eq!(rt.pod_cidr(), None);
    let network = |s: cri::StatusResponse| {
        s.status
            .unwrap()
            .conditions
            .into_iter()
            .find(|c| c.r#type == "NetworkReady")
            .unwrap()
    };
    let c = network(rt.status(cri::StatusRequest::default()).await.unwrap());
    assert!(!c.status);
    assert_eq!(c.reason, "NetworkPluginNotReady");
    assert_eq!(
        c.message,
        "Network plugin returns error: cni plugin not initialized"
    );
    let err = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(pod_config("early", &[])),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::Unknown);
    assert!(err.message.contains("cni plugin not initialized"), "{err:?}");

    rt.update_runtime_config(cri::UpdateRuntimeConfigRequest {
        runtime_config: Some(cri::RuntimeConfig {
            network_config: Some(cri::NetworkConfig {
                pod_cidr: "10.130.4.0/24".into(),
            }),
        }),
    })
    .await
    .unwrap();
    let c = network(rt.status(cri::StatusRequest::default()).await.unwrap());
    assert!(c.status && c.reason.is_empty(), "{c:?}");
    let id = run_pod(&rt, "late", &[]).await;
    assert_eq!(sandbox(&rt, &id).await.network.unwrap().ip, "10.130.4.2");
}
