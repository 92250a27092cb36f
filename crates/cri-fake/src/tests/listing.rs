//! List filters, images, runtime config and behaviour-annotation errors.

use runtime_api::{Code, Runtime, cri};

use super::*;
use crate::Profile;

fn names(list: &[cri::Container]) -> Vec<String> {
    let mut v: Vec<String> = list
        .iter()
        .map(|c| c.metadata.as_ref().unwrap().name.clone())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn list_containers_filters() {
    let rt = fake();
    let p1 = run_pod(&rt, "p1", &[]).await;
    let p2 = run_pod(&rt, "p2", &[]).await;
    let a = run_container(&rt, &p1, "a", &[]).await;
    let _b = create(&rt, &p1, "b", 0, &[]).await.unwrap();
    let c = run_container(&rt, &p2, "c", &[]).await;
    rt.stop_container(cri::StopContainerRequest {
        container_id: c.clone(),
        timeout: 0,
    })
    .await
    .unwrap();

    let list = |filter: cri::ContainerFilter| {
        let rt = rt.clone();
        async move {
            names(
                &rt.list_containers(cri::ListContainersRequest { filter: Some(filter) })
                    .await
                    .unwrap()
                    .containers,
            )
        }
    };
    let st = |s: cri::ContainerState| Some(cri::ContainerStateValue { state: s as i32 });
    assert_eq!(list(Default::default()).await, ["a", "b", "c"]);
    assert_eq!(
        list(cri::ContainerFilter {
            id: a.clone(),
            ..Default::default()
        })
        .await,
        ["a"]
    );
    assert_eq!(
        list(cri::ContainerFilter {
            id: a[..10].into(),
            ..Default::default()
        })
        .await,
        ["a"]
    );
    assert!(
        list(cri::ContainerFilter {
            id: "ffff".into(),
            ..Default::default()
        })
        .await
        .len()
            <= 1
    );
    assert_eq!(
        list(cri::ContainerFilter {
            pod_sandbox_id: p1.clone(),
            ..Default::default()
        })
        .await,
        ["a", "b"]
    );
    assert_eq!(
        list(cri::ContainerFilter {
            state: st(cri::ContainerState::ContainerRunning),
            ..Default::default()
        })
        .await,
        ["a"]
    );
    assert_eq!(
        list(cri::ContainerFilter {
            state: st(cri::ContainerState::ContainerCreated),
            ..Default::default()
        })
        .await,
        ["b"]
    );
    assert_eq!(
        list(cri::ContainerFilter {
            state: st(cri::ContainerState::ContainerExited),
            ..Default::default()
        })
        .await,
        ["c"]
    );
    assert!(
        list(cri::ContainerFilter {
            state: st(cri::ContainerState::ContainerUnknown),
            ..Default::default()
        })
        .await
        .is_empty()
    );
    let by_label = |v: &str| cri::ContainerFilter {
        label_selector: map(&[("io.kubernetes.container.name", v)]),
        ..Default::default()
    };
    assert_eq!(list(by_label("c")).await, ["c"]);
    assert!(list(by_label("zzz")).await.is_empty());
    // fields are ANDed
    assert!(
        list(cri::ContainerFilter {
            pod_sandbox_id: p2.clone(),
            ..by_label("a")
        })
        .await
        .is_empty()
    );
    assert_eq!(
        list(cri::ContainerFilter {
            id: a.clone(),
            pod_sandbox_id: p1.clone(),
            ..by_label("a")
        })
        .await,
        ["a"]
    );
    assert!(
        list(cri::ContainerFilter {
            id: a,
            state: st(cri::ContainerState::ContainerExited),
            ..Default::default()
        })
        .await
        .is_empty()
    );
    // list items carry the sandbox id, image and state
    let item = rt
        .list_containers(Default::default())
        .await
        .unwrap()
        .containers
        .into_iter()
        .find(|x| x.id == c)
        .unwrap();
    assert_eq!(item.pod_sandbox_id, p2);
    assert_eq!(item.state, cri::ContainerState::ContainerExited as i32);
    assert!(item.image_id.starts_with("sha256:"));
}

#[tokio::test]
async fn list_sandboxes_filters() {
    let rt = fake();
    let p1 = run_pod(&rt, "p1", &[]).await;
    let p2 = run_pod(&rt, "p2", &[]).await;
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: p2.clone(),
    })
    .await
    .unwrap();
    let list = |filter: Option<cri::PodSandboxFilter>| {
        let rt = rt.clone();
        async move {
            let mut v: Vec<String> = rt
                .list_pod_sandbox(cri::ListPodSandboxRequest { filter })
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|p| p.metadata.unwrap().name)
                .collect();
            v.sort();
            v
        }
    };
    let st = |s: cri::PodSandboxState| Some(cri::PodSandboxStateValue { state: s as i32 });
    assert_eq!(list(None).await, ["p1", "p2"]);
    assert_eq!(
        list(Some(cri::PodSandboxFilter {
            id: p1.clone(),
            ..Default::default()
        }))
        .await,
        ["p1"]
    );
    assert_eq!(
        list(Some(cri::PodSandboxFilter {
            id: p2[..8].into(),
            ..Default::default()
        }))
        .await,
        ["p2"]
    );
    assert_eq!(
        list(Some(cri::PodSandboxFilter {
            state: st(cri::PodSandboxState::SandboxReady),
            ..Default::default()
        }))
        .await,
        ["p1"]
    );
    assert_eq!(
        list(Some(cri::PodSandboxFilter {
            state: st(cri::PodSandboxState::SandboxNotready),
            ..Default::default()
        }))
        .await,
        ["p2"]
    );
    let label = |v: &str| cri::PodSandboxFilter {
        label_selector: map(&[("app", v)]),
        ..Default::default()
    };
    assert_eq!(list(Some(label("p2"))).await, ["p2"]);
    assert!(
        list(Some(cri::PodSandboxFilter {
            state: st(cri::PodSandboxState::SandboxReady),
            ..label("p2")
        }))
        .await
        .is_empty()
    );
    assert!(
        list(Some(cri::PodSandboxFilter {
            id: "0000".into(),
            ..Default::default()
        }))
        .await
        .len()
            <= 1
    );
    let item = rt
        .list_pod_sandbox(Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| p.id == p1)
        .unwrap();
    assert_eq!(item.labels, pod_config("p1", &[]).labels);
    assert_eq!(item.state, cri::PodSandboxState::SandboxReady as i32);
}

#[tokio::test]
async fn sandbox_status_lists_its_containers() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[]).await;
    run_container(&rt, &pod, "a", &[]).await;
    create(&rt, &pod, "b", 0, &[]).await.unwrap();
    let r = rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: pod,
            verbose: false,
        })
        .await
        .unwrap();
    assert_eq!(r.containers_statuses.len(), 2);
    assert!(r.timestamp > 0);
}

#[tokio::test]
async fn images_pull_status_list_remove() {
    let rt = fake();
    let pulled = rt
        .pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: "nginx:1.25".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(pulled.image_ref.starts_with("sha256:"));
    let status = |image: &str| {
        let rt = rt.clone();
        let image = image.to_owned();
        async move {
            rt.image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image,
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
            .unwrap()
            .image
        }
    };
    let img = status("docker.io/library/nginx:1.25").await.unwrap();
    assert_eq!(img.id, pulled.image_ref);
    assert_eq!(img.repo_tags, ["docker.io/library/nginx:1.25"]);
    assert_eq!(img.repo_digests.len(), 1);
    assert_eq!(img.size, 10 << 20);
    assert!(status(&img.id).await.is_some());
    assert!(status("nginx:1.26").await.is_none());

    let all = rt.list_images(Default::default()).await.unwrap().images;
    assert_eq!(all.len(), 2, "preloaded busybox and nginx");
    let one = rt
        .list_images(cri::ListImagesRequest {
            filter: Some(cri::ImageFilter {
                image: Some(cri::ImageSpec {
                    image: "nginx:1.25".into(),
                    ..Default::default()
                }),
            }),
        })
        .await
        .unwrap()
        .images;
    assert_eq!(one.len(), 1);
    let fs = rt.image_fs_info(Default::default()).await.unwrap();
    assert_eq!(
        fs.image_filesystems[0].used_bytes.as_ref().unwrap().value,
        2 * (10 << 20)
    );

    let spec = Some(cri::ImageSpec {
        image: "nginx:1.25".into(),
        ..Default::default()
    });
    rt.remove_image(cri::RemoveImageRequest { image: spec.clone() })
        .await
        .unwrap();
    rt.remove_image(cri::RemoveImageRequest { image: spec })
        .await
        .unwrap();
    assert!(status("nginx:1.25").await.is_none());
    let err = rt
        .pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: "bad ref".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
}

#[tokio::test]
async fn update_runtime_config_sets_the_pod_cidr() {
    let rt = FakeRuntime::new(FakeConfig::default());
    assert_eq!(rt.pod_cidr().as_deref(), Some(crate::DEFAULT_POD_CIDR));
    let cfg = |cidr: &str| cri::UpdateRuntimeConfigRequest {
        runtime_config: Some(cri::RuntimeConfig {
            network_config: Some(cri::NetworkConfig {
                pod_cidr: cidr.into(),
            }),
        }),
    };
    rt.update_runtime_config(cfg("10.9.8.0/24,fd00::/64"))
        .await
        .unwrap();
    let pod = run_pod(&rt, "p", &[]).await;
    let net = sandbox(&rt, &pod).await.network.unwrap();
    assert_eq!(net.ip, "10.9.8.2");
    assert_eq!(net.additional_ips[0].ip, "fd00::2");
    assert_eq!(
        rt.update_runtime_config(cfg("nonsense")).await.unwrap_err().code,
        Code::InvalidArgument
    );
    rt.update_runtime_config(cfg("")).await.unwrap();
    assert_eq!(rt.pod_cidr().as_deref(), Some("10.9.8.0/24,fd00::/64"));
    assert!(
        FakeRuntime::try_new(FakeConfig {
            pod_cidr: Some("x".into()),
            ..Default::default()
        })
        .is_err()
    );
    assert!(
        FakeRuntime::try_new(FakeConfig {
            images: vec!["a b".into()],
            ..Default::default()
        })
        .is_err()
    );
    assert_eq!(
        FakeRuntime::new(FakeConfig {
            pod_cidr: Some("x".into()),
            ..Default::default()
        })
        .pod_cidr()
        .as_deref(),
        Some(crate::DEFAULT_POD_CIDR)
    );
}

#[tokio::test]
async fn invalid_behaviour_annotations_are_clear_errors() {
    let rt = fake();
    let err = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(pod_config(
                "p",
                &[("cri-fake.node-agent.io/exit-after.app", "soon")],
            )),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(
        err.message.contains("exit-after") && err.message.contains("soon"),
        "{err}"
    );
    let pod = run_pod(&rt, "q", &[]).await;
    let err = create(&rt, &pod, "c", 0, &[("cri-fake.node-agent.io/memroy", "1Gi")])
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(err.message.contains("memroy"), "{err}");
    let profile = Profile::from_pairs([("exit-code", "x")]);
    assert!(profile.is_err());
}
