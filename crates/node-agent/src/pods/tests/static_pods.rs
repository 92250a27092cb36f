//! Static pods through the real pod manager and workers: they run without any API pod, keep their UID's
//! identity across re-reads, stop when their manifest goes, and mirror pods from the API are never run.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::pods::static_pods::manifest::{self, Origin};

fn static_pod(name: &str, image: &str) -> Pod {
    let m: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": image}]}
    }))
    .unwrap();
    manifest::prepare(m, Origin::File(&format!("/etc/manifests/{name}.yaml")), "n1").unwrap()
}

async fn running_names(h: &Harness) -> Vec<String> {
    let sandboxes = h
        .runtime
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await
        .unwrap();
    let mut v: Vec<String> = sandboxes
        .items
        .into_iter()
        .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
        .filter_map(|s| s.metadata.map(|m| m.name))
        .collect();
    v.sort();
    v
}

#[tokio::test(start_paused = true)]
async fn static_pods_run_change_and_stop_with_their_manifests() {
    let mut h = Harness::start();
    let kp = static_pod("kube-proxy", "proxy:1");
    let kp_uid = kp.metadata.uid.clone().unwrap();
    h.statics
        .send(StaticUpdate {
            source: "file:/etc/manifests".into(),
            pods: Some(vec![kp.clone()]),
        })
        .await
        .unwrap();
    h.until("static pod Running", Duration::from_secs(10), |h| {
        h.statuses
            .get(&kp_uid)
            .is_some_and(|s| s.phase.as_deref() == Some("Running"))
    })
    .await;
    assert_eq!(running_names(&h).await, vec!["kube-proxy-n1"]);
    assert_eq!(
        h.desired.borrow().len(),
        1,
        "the mirror manager is asked for one mirror"
    );

    // a mirror pod from the API server is passed to the mirror manager, never run
    let mut mirror = crate::pods::static_pods::mirror::mirror_of(&kp, "n1", "node-uid");
    mirror.metadata.uid = Some("mirror-uid".into());
    h.send(PodEvent::Snapshot(vec![mirror])).await;
    let got = h.mirror_rx.recv().await.unwrap();
    assert!(
        matches!(got, MirrorMsg::Snapshot(ref m) if m.len() == 1),
        "{got:?}"
    );
    // and an API snapshot without the static pod does not stop it
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(running_names(&h).await, vec!["kube-proxy-n1"]);

    // a re-read of the same manifest changes nothing; a changed one replaces the pod
    h.statics
        .send(StaticUpdate {
            source: "file:/etc/manifests".into(),
            pods: Some(vec![static_pod("kube-proxy", "proxy:1")]),
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(h.containers().await.len(), 1, "nothing restarted");
    let kp2 = static_pod("kube-proxy", "proxy:2");
    assert_ne!(kp2.metadata.uid, kp.metadata.uid);
    h.statics
        .send(StaticUpdate {
            source: "file:/etc/manifests".into(),
            pods: Some(vec![kp2]),
        })
        .await
        .unwrap();
    for _ in 0..200 {
        if running_names(&h).await == vec!["kube-proxy-n1"] && h.containers().await.len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let containers = h.containers().await;
    assert_eq!(
        containers.len(),
        1,
        "old container removed, new one running: {containers:?}"
    );

    // a failed read keeps the set; an empty set stops everything
    h.statics
        .send(StaticUpdate {
            source: "file:/etc/manifests".into(),
            pods: None,
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(running_names(&h).await, vec!["kube-proxy-n1"]);
    h.statics
        .send(StaticUpdate {
            source: "file:/etc/manifests".into(),
            pods: Some(Vec::new()),
        })
        .await
        .unwrap();
    for _ in 0..200 {
        if running_names(&h).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(running_names(&h).await.is_empty());
    assert!(h.desired.borrow().is_empty());
    h.stop().await;
}
