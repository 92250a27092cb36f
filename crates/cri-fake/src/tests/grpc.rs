//! The fake served over gRPC on a unix socket and driven by the generated CRI v1 clients, where it departs
//! from containerd to follow the CRI api.proto: idempotent stops, one image under several tags, the image
//! config's user in ImageStatus, and PullImage bounded by the request's deadline (`grpc-timeout`).

// the generated clients' call futures are large; these tests await them once each, nothing holds them
#![allow(clippy::large_futures)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use runtime_api::cri;
use tonic::transport::{Channel, Endpoint, Uri};

use super::*;
use crate::Profile;

/// A fake served on a fresh socket, and clients on one channel to it; the server stops when this is dropped.
struct Served {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    _stop: tokio::sync::oneshot::Sender<()>,
    socket: PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

async fn serve(fake: FakeRuntime) -> Served {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let socket = std::env::temp_dir().join(format!(
        "cri-fake-grpc-{}-{}.sock",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let listener = crate::bind(&socket).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(crate::serve_on(listener, Arc::new(fake), async move {
        let _ = stopped.await;
    }));
    let path = socket.clone();
    let channel = Endpoint::try_from("http://cri-fake.invalid")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .unwrap();
    Served {
        runtime: RuntimeServiceClient::new(channel.clone()),
        images: ImageServiceClient::new(channel),
        _stop: stop,
        socket,
    }
}

const UNKNOWN: &str = "f00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeed";

#[tokio::test]
async fn stopping_an_unknown_sandbox_or_container_succeeds() {
    let mut s = serve(fake()).await;
    s.runtime
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: UNKNOWN.into(),
        })
        .await
        .expect("StopPodSandbox of an unknown id");
    s.runtime
        .stop_container(cri::StopContainerRequest {
            container_id: UNKNOWN.into(),
            timeout: 10,
        })
        .await
        .expect("StopContainer of an unknown id");
    // ... and of a sandbox and container that existed and are removed
    let pod = s
        .runtime
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(pod_config("p", &[])),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let c = s
        .runtime
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(container_config("c", 0, &[])),
            sandbox_config: Some(pod_config("p", &[])),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;
    s.runtime
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap();
    let gone = s
        .runtime
        .container_status(cri::ContainerStatusRequest {
            container_id: c.clone(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(
        gone.code(),
        tonic::Code::NotFound,
        "the container went with its sandbox"
    );
    s.runtime
        .stop_container(cri::StopContainerRequest {
            container_id: c,
            timeout: 0,
        })
        .await
        .expect("StopContainer of a removed container");
    s.runtime
        .stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: pod })
        .await
        .expect("StopPodSandbox of a removed sandbox");
}

async fn pull(s: &mut Served, image: &str) -> String {
    s.images
        .pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .image_ref
}

async fn list(s: &mut Served) -> Vec<cri::Image> {
    s.images
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .images
}

async fn image_status(s: &mut Served, image: &str) -> Option<cri::Image> {
    s.images
        .image_status(cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .image
}

#[tokio::test]
async fn an_image_with_several_tags_is_one_image() {
    let mut s = serve(FakeRuntime::new(FakeConfig::default())).await;
    let a = pull(&mut s, "registry-a.test/team/app:1").await;
    let b = pull(&mut s, "registry-b.test/team/app:1").await;
    assert_eq!(a, b, "the same image from two registries keeps one id");
    let by_digest = format!("registry-a.test/team/app@{}", {
        let img = image_status(&mut s, "registry-a.test/team/app:1").await.unwrap();
        img.repo_digests[0].split_once('@').unwrap().1.to_owned()
    });
    assert_eq!(
        pull(&mut s, &by_digest).await,
        a,
        "pulled by its digest: the same image"
    );
    let other = pull(&mut s, "registry-a.test/team/app:2").await;
    assert_ne!(other, a, "another tag of the repository is other content");

    let images = list(&mut s).await;
    assert_eq!(images.len(), 2, "{images:?}");
    let app1 = images.iter().find(|i| i.id == a).unwrap();
    assert_eq!(
        app1.repo_tags,
        ["registry-a.test/team/app:1", "registry-b.test/team/app:1"]
    );
    assert_eq!(app1.repo_digests.len(), 2, "{:?}", app1.repo_digests);
    for tag in ["registry-a.test/team/app:1", "registry-b.test/team/app:1"] {
        assert_eq!(
            image_status(&mut s, tag).await.map(|i| i.id),
            Some(a.clone()),
            "{tag}"
        );
    }

    s.images
        .remove_image(cri::RemoveImageRequest {
            image: Some(cri::ImageSpec {
                image: "registry-b.test/team/app:1".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    for tag in ["registry-a.test/team/app:1", "registry-b.test/team/app:1"] {
        assert_eq!(
            image_status(&mut s, tag).await,
            None,
            "removed under every tag: {tag}"
        );
    }
    let left: Vec<String> = list(&mut s).await.into_iter().map(|i| i.id).collect();
    assert_eq!(left, [other]);
}

#[tokio::test]
async fn image_status_reports_the_config_user() {
    let mut s = serve(FakeRuntime::new(FakeConfig::default())).await;
    let pull_as = |user: &str| cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: format!("registry.test/user-{}:1", user.replace(':', "-")),
            ..Default::default()
        }),
        sandbox_config: Some(cri::PodSandboxConfig {
            annotations: map(&[("cri-fake.node-agent.io/image-user", user)]),
            ..Default::default()
        }),
        ..Default::default()
    };
    for (user, uid, username) in [
        ("1000", Some(1000), ""),
        ("1001:1001", Some(1001), ""),
        ("nginx", None, "nginx"),
        ("app:staff", None, "app"),
    ] {
        s.images.pull_image(pull_as(user)).await.unwrap();
        let img = image_status(
            &mut s,
            &format!("registry.test/user-{}:1", user.replace(':', "-")),
        )
        .await
        .unwrap();
        assert_eq!(img.uid.map(|u| u.value), uid, "{user}");
        assert_eq!(img.username, username, "{user}");
    }
    pull(&mut s, "registry.test/no-user:1").await;
    let img = image_status(&mut s, "registry.test/no-user:1").await.unwrap();
    assert_eq!(
        (img.uid, img.username.as_str()),
        (None, ""),
        "no User in the config"
    );
}

fn slow_puller() -> FakeRuntime {
    let profile = Profile::from_pairs([("pull-duration", "3s")]).unwrap();
    FakeRuntime::new(FakeConfig {
        profile: Arc::new(profile),
        ..FakeConfig::default()
    })
}

fn slow_pull() -> cri::PullImageRequest {
    cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: "registry.test/slow:1".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn pull_image_gives_up_at_the_request_deadline() {
    let mut s = serve(slow_puller()).await;
    let mut req = tonic::Request::new(slow_pull());
    req.set_timeout(Duration::from_millis(300));
    let started = tokio::time::Instant::now();
    let err = s.images.pull_image(req).await.unwrap_err();
    let took = started.elapsed();
    // the fake's DEADLINE_EXCEEDED, or this (tonic) client's own CANCELLED when its deadline fires first
    assert!(
        matches!(err.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled),
        "{err:?}"
    );
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(2),
        "answered at the deadline, not after the 3 s pull: {took:?}"
    );
    assert_eq!(image_status(&mut s, "registry.test/slow:1").await, None);
}

/// The service itself, on paused time: the pull is abandoned at the `grpc-timeout` the request carries, with
/// DEADLINE_EXCEEDED, and never completes later.
#[tokio::test(start_paused = true)]
async fn an_abandoned_pull_answers_deadline_exceeded_and_pulls_nothing() {
    use k8s_cri::v1::image_service_server::ImageService;
    let fake = slow_puller();
    let server = crate::CriServer::new(Arc::new(fake.clone()));
    let mut req = tonic::Request::new(slow_pull());
    req.metadata_mut()
        .insert("grpc-timeout", "300000u".parse().unwrap());
    let started = tokio::time::Instant::now();
    let err = server.pull_image(req).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
    assert!(
        took >= Duration::from_millis(200) && took <= Duration::from_millis(300),
        "{took:?}"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let listed = fake
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .unwrap();
    assert!(listed.images.is_empty(), "{listed:?}");

    // without a deadline the same pull completes
    let pulled = server.pull_image(tonic::Request::new(slow_pull())).await;
    assert!(pulled.is_ok(), "{pulled:?}");
}
