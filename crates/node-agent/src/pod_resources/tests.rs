//! The conversion from the pod manager's pods, the rate limit, and the service over a real unix socket with a
//! pod manager's control channel answered from pods built by the agent's own pod parsing.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::service::Limit;
use super::*;
use crate::pods::ManagerControl;

fn desired(name: &str, namespace: &str, spec: serde_json::Value) -> Arc<DesiredPod> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{namespace}-{name}")},
        "spec": spec,
    }))
    .expect("pod");
    DesiredPod::from_pod(&pod).expect("desired pod")
}

fn container(name: &str) -> serde_json::Value {
    json!({"name": name, "image": "busybox"})
}

fn names(pod: &v1::PodResources) -> Vec<&str> {
    pod.containers.iter().map(|c| c.name.as_str()).collect()
}

#[test]
fn sidecars_then_app_containers_are_listed_plain_init_containers_are_not() {
    let pod = desired(
        "web",
        "shop",
        json!({
            "initContainers": [
                container("migrate"),
                {"name": "proxy", "image": "envoy", "restartPolicy": "Always"},
                container("warm"),
                {"name": "logs", "image": "fluent", "restartPolicy": "Always"},
            ],
            "containers": [container("app"), container("metrics")],
        }),
    );
    let r = pod_resources(&pod);
    assert_eq!((r.name.as_str(), r.namespace.as_str()), ("web", "shop"));
    assert_eq!(names(&r), ["proxy", "logs", "app", "metrics"]);
    for c in r.containers.iter() {
        assert_eq!(
            c,
            &v1::ContainerResources {
                name: c.name.clone(),
                ..Default::default()
            },
            "nothing is assigned without device plugins, CPU or memory manager or DRA"
        );
    }
}

#[test]
fn a_guaranteed_pod_with_whole_cpus_gets_no_cpu_ids_under_policy_none() {
    let pod = desired(
        "pinned",
        "default",
        json!({"containers": [{"name": "app", "image": "busybox",
            "resources": {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}}]}),
    );
    let r = pod_resources(&pod);
    assert_eq!(names(&r), ["app"]);
    assert!(r.containers[0].cpu_ids.is_empty());
    assert!(r.containers[0].memory.is_empty());
}

/// Per driver, its devices with their share IDs.
type Devices<'a> = &'a [(&'a str, &'a [(&'a str, Option<&'a str>)])];

fn claim_info(name: &str, drivers: Devices<'_>) -> ClaimInfo {
    ClaimInfo {
        claim: crate::dra::ClaimRef {
            namespace: "ml".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        },
        drivers: drivers
            .iter()
            .map(|(driver, devices)| {
                let devices = devices
                    .iter()
                    .map(|(device, share)| crate::dra::PreparedDevice {
                        request_names: Vec::new(),
                        pool: "node-1".into(),
                        device: (*device).into(),
                        cdi_ids: vec![format!("{driver}/dev={device}")],
                        share_id: share.map(str::to_owned),
                    })
                    .collect();
                ((*driver).to_owned(), devices)
            })
            .collect(),
        prepared: true,
        pods: Default::default(),
    }
}

#[test]
fn each_container_lists_the_claims_it_uses_with_their_prepared_devices() {
    let pod = desired(
        "train",
        "ml",
        json!({
            "resourceClaims": [
                {"name": "gpu", "resourceClaimName": "gpus"},
                {"name": "nic", "resourceClaimName": "nics"},
                {"name": "spare", "resourceClaimName": "spares"},
            ],
            "initContainers": [{"name": "side", "image": "busybox", "restartPolicy": "Always",
                "resources": {"claims": [{"name": "gpu", "request": "one"}, {"name": "nic"}]}}],
            "containers": [
                {"name": "app", "image": "busybox", "resources": {"claims": [{"name": "gpu"}, {"name": "gpu", "request": "two"}]}},
                container("idle"),
            ],
        }),
    );
    // the node knows the GPU claim (two drivers) but not the NIC claim (not prepared yet)
    let gpus = claim_info(
        "gpus",
        &[
            ("b.example.com", &[("shared-0", Some("share-7"))]),
            ("a.example.com", &[("gpu-0", None), ("gpu-1", None)]),
        ],
    );
    let known = move |ns: &str, name: &str| (ns == "ml" && name == "gpus").then(|| gpus.clone());
    let mut r = pod_resources(&pod);
    add_dynamic_resources(&mut r, &pod, &known);
    assert_eq!(names(&r), ["side", "app", "idle"]);
    let resource = |driver: &str, device: &str, share: Option<&str>| v1::ClaimResource {
        cdi_devices: vec![v1::CdiDevice {
            name: format!("{driver}/dev={device}"),
        }],
        driver_name: driver.into(),
        pool_name: "node-1".into(),
        device_name: device.into(),
        share_id: share.map(str::to_owned),
    };
    assert_eq!(
        r.containers[1].dynamic_resources,
        [v1::DynamicResource {
            claim_name: "gpus".into(),
            claim_namespace: "ml".into(),
            claim_resources: vec![
                resource("a.example.com", "gpu-0", None),
                resource("a.example.com", "gpu-1", None),
                resource("b.example.com", "shared-0", Some("share-7")),
            ],
        }],
        "the claim once, however many of its requests the container names"
    );
    assert!(
        r.containers[0].dynamic_resources.is_empty(),
        "a claim the node does not know leaves the container without any: {:?}",
        r.containers[0].dynamic_resources
    );
    assert!(r.containers[2].dynamic_resources.is_empty());
}

#[test]
fn a_claim_from_a_template_not_created_yet_lists_nothing() {
    let pod = desired(
        "infer",
        "ml",
        json!({
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{"name": "app", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
        }),
    );
    let mut r = pod_resources(&pod);
    add_dynamic_resources(&mut r, &pod, &|_, _| {
        Some(claim_info("x", &[("a.example.com", &[("gpu-0", None)])]))
    });
    assert!(r.containers[0].dynamic_resources.is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_rate_limit_allows_a_burst_of_ten_then_a_hundred_a_second() {
    let limit = Limit::new(service::QPS, service::BURST);
    for i in 0..10 {
        assert!(limit.take().is_ok(), "request {i} of the burst");
    }
    let refused = limit.take().expect_err("the 11th at once");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert_eq!(refused.message(), "rejected by rate limit");
    tokio::time::advance(Duration::from_millis(10)).await;
    assert!(limit.take().is_ok(), "one token back after 10 ms");
    assert!(limit.take().is_err());
    tokio::time::advance(Duration::from_secs(60)).await;
    for i in 0..10 {
        assert!(
            limit.take().is_ok(),
            "request {i}: a long pause refills only up to the burst"
        );
    }
    assert!(limit.take().is_err());
}

/// A pod manager's control channel that answers `AdmittedPods` with `pods` until dropped.
fn manager_answering(pods: Vec<Arc<DesiredPod>>) -> PodsQuery {
    let (tx, mut rx) = crate::density::chan::unbounded_channel();
    tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            if let ManagerControl::AdmittedPods(answer) = msg {
                let _ = answer.send(pods.clone());
            }
        }
    });
    PodsQuery::new(tx)
}

#[tokio::test]
async fn list_get_and_allocatable_over_the_socket() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = socket_path(dir.path());
    let pods = manager_answering(vec![
        desired("b", "default", json!({"containers": [container("main")]})),
        desired(
            "a",
            "kube-system",
            json!({"containers": [container("dns"), container("sidecar")]}),
        ),
        desired("a", "default", json!({"containers": [container("one")]})),
    ]);
    let server = PodResourcesServer::bind(&path, pods)?;
    assert_eq!(server.path(), dir.path().join("pod-resources/kubelet.sock"));
    let token = CancellationToken::new();
    let serving = tokio::spawn(server.run(token.clone()));

    let mut client = connect(&path).await?;
    let list = client.list(v1::ListPodResourcesRequest {}).await?.into_inner();
    let listed: Vec<(&str, &str, Vec<&str>)> = list
        .pod_resources
        .iter()
        .map(|p| (p.namespace.as_str(), p.name.as_str(), names(p)))
        .collect();
    assert_eq!(
        listed,
        [
            ("default", "a", vec!["one"]),
            ("default", "b", vec!["main"]),
            ("kube-system", "a", vec!["dns", "sidecar"]),
        ]
    );

    let got = client
        .get(v1::GetPodResourcesRequest {
            pod_name: "a".into(),
            pod_namespace: "kube-system".into(),
        })
        .await?
        .into_inner()
        .pod_resources
        .expect("the pod");
    assert_eq!(got, list.pod_resources[2]);

    let missing = client
        .get(v1::GetPodResourcesRequest {
            pod_name: "c".into(),
            pod_namespace: "default".into(),
        })
        .await
        .expect_err("no pod c");
    assert_eq!(missing.code(), tonic::Code::Unknown);
    assert_eq!(missing.message(), "pod c in namespace default not found");

    let allocatable = client
        .get_allocatable_resources(v1::AllocatableResourcesRequest {})
        .await?
        .into_inner();
    assert_eq!(allocatable, v1::AllocatableResourcesResponse::default());

    token.cancel();
    serving.await??;
    assert!(!path.exists(), "the socket is removed on stop");
    Ok(())
}

#[tokio::test]
async fn a_stopped_pod_manager_is_unavailable() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = socket_path(dir.path());
    let (tx, rx) = crate::density::chan::unbounded_channel();
    drop(rx);
    let token = CancellationToken::new();
    let serving = tokio::spawn(PodResourcesServer::bind(&path, PodsQuery::new(tx))?.run(token.clone()));
    let mut client = connect(&path).await?;
    let refused = client
        .list(v1::ListPodResourcesRequest {})
        .await
        .expect_err("no manager");
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    token.cancel();
    serving.await??;
    Ok(())
}

#[tokio::test]
async fn a_stale_socket_is_replaced_and_anything_else_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = socket_path(dir.path());
    std::fs::create_dir_all(path.parent().expect("parent"))?;
    // a socket an earlier run left behind (bound, then its listener dropped)
    drop(std::os::unix::net::UnixListener::bind(&path)?);
    assert!(path.exists());
    let server = PodResourcesServer::bind(&path, manager_answering(vec![]))?;
    let token = CancellationToken::new();
    let serving = tokio::spawn(server.run(token.clone()));
    let list = connect(&path)
        .await?
        .list(v1::ListPodResourcesRequest {})
        .await?
        .into_inner();
    assert!(list.pod_resources.is_empty());
    token.cancel();
    serving.await??;

    std::fs::write(&path, "not a socket")?;
    let error = PodResourcesServer::bind(&path, manager_answering(vec![])).expect_err("a regular file");
    assert!(matches!(error, PodResourcesError::NotASocket(_)), "{error}");
    assert!(
        error.to_string().contains("exists and is not a socket"),
        "{error}"
    );
    assert_eq!(std::fs::read_to_string(&path)?, "not a socket", "left alone");
    Ok(())
}
