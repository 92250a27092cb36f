//! Security contexts through the pod workers: `runAsNonRoot` without `runAsUser` is checked against the user the
//! image declares (the fake runtime's `image-user` script), as the kubelet checks it.

use std::time::Duration;

use serde_json::json;

use crate::pods::source::PodEvent;
use crate::pods::tests::{Harness, pod};

fn message(h: &Harness, pod: &str) -> Option<String> {
    let s = h.status(pod)?;
    let c = s.container_statuses.iter().flatten().find(|c| c.name == "app")?;
    c.state.as_ref()?.waiting.as_ref()?.message.clone()
}

#[tokio::test(start_paused = true)]
async fn run_as_non_root_checks_the_images_user() {
    let mut h = Harness::start();
    let non_root = |name: &str, image: &str, user: Option<&str>| {
        let annotations = match user {
            Some(u) => json!({"cri-fake.node-agent.io/image-user": u}),
            None => json!({}),
        };
        pod(
            name,
            json!({"securityContext": {"runAsNonRoot": true},
                   "containers": [{"name": "app", "image": image}]}),
            annotations,
        )
    };
    h.send(PodEvent::Snapshot(vec![
        non_root("rootimg", "example.com/root:1", None),
        non_root("named", "example.com/named:1", Some("nginx")),
        non_root("numeric", "example.com/numeric:1", Some("1000:1000")),
    ]))
    .await;
    h.until("numeric Running", Duration::from_secs(10), |h| {
        h.phase("numeric") == Some("Running")
    })
    .await;
    let refused = |pod: &'static str| {
        move |h: &Harness| h.waiting_reason(pod, "app").as_deref() == Some("CreateContainerConfigError")
    };
    h.until("rootimg refused", Duration::from_secs(10), refused("rootimg"))
        .await;
    h.until("named refused", Duration::from_secs(10), refused("named"))
        .await;
    assert_eq!(
        message(&h, "rootimg").as_deref(),
        Some(
            "container has runAsNonRoot and image will run as root (pod: \"rootimg_default(uid-rootimg)\", \
             container: app)"
        )
    );
    assert_eq!(
        message(&h, "named").as_deref(),
        Some(
            "container has runAsNonRoot and image has non-numeric user (nginx), cannot verify user is non-root \
             (pod: \"named_default(uid-named)\", container: app)"
        )
    );
    let created: Vec<String> = h.containers().await.into_iter().map(|c| c.0).collect();
    assert_eq!(created, ["app"], "only the numeric user's container was created");
    h.stop().await;
}
