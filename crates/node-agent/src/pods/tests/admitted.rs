//! The pods the pod manager reports as holding the node's resources (the pod-resources API's list): admitted
//! pods until their workers have stopped them — refused pods never, finished pods no longer, a pod being
//! deleted until its containers have stopped.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::pods::manager::control::PodsQuery;

async fn admitted(h: &Harness) -> Vec<String> {
    let mut names: Vec<String> = PodsQuery::new(h.control.clone())
        .admitted_pods()
        .await
        .expect("the manager answers")
        .iter()
        .map(|p| p.name.clone())
        .collect();
    names.sort();
    names
}

#[tokio::test(start_paused = true)]
async fn running_and_terminating_pods_hold_resources_refused_and_finished_ones_do_not() {
    let mut h = Harness::start();
    let web = pod(
        "web",
        json!({"terminationGracePeriodSeconds": 30,
               "containers": [{"name": "app", "image": "nginx:1.27"}]}),
        json!({"cri-fake.node-agent.io/stop-duration": "10s"}),
    );
    let job = pod(
        "job",
        json!({"restartPolicy": "Never", "containers": [{"name": "once", "image": "busybox"}]}),
        json!({"cri-fake.node-agent.io/exit-after": "2s"}),
    );
    let big = pod(
        "big",
        json!({"containers": [{"name": "app", "image": "nginx:1.27", "resources": {"requests": {"cpu": "8"}}}]}),
        json!({}),
    );
    h.send(PodEvent::Snapshot(vec![web.clone(), job, big])).await;
    h.until("web and job Running, big refused", Duration::from_secs(30), |h| {
        h.phase("web") == Some("Running")
            && h.phase("job") == Some("Running")
            && h.phase("big") == Some("Failed")
    })
    .await;
    assert_eq!(
        admitted(&h).await,
        ["job", "web"],
        "the refused pod holds nothing"
    );

    h.until("job Succeeded", Duration::from_secs(30), |h| {
        h.phase("job") == Some("Succeeded")
    })
    .await;
    // the worker reports the pod stopped right after its final status
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        admitted(&h).await,
        ["web"],
        "a finished pod no longer holds anything"
    );

    let mut deleting = web;
    deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    deleting.metadata.deletion_grace_period_seconds = Some(30);
    h.send(PodEvent::Apply(Box::new(deleting))).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        admitted(&h).await,
        ["web"],
        "its container takes 10 s to stop: still holding resources while it terminates"
    );
    h.until("web deleted", Duration::from_secs(30), |h| {
        h.deleted.contains(&"uid-web".to_owned())
    })
    .await;
    assert!(admitted(&h).await.is_empty());
    h.stop().await;
}
