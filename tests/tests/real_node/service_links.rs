//! Service links on the real node: a Service of the pod's namespace shows in the container's environment as the
//! kubelet's docker-link variables (`<NAME>_SERVICE_HOST`, `_SERVICE_PORT_<PORT>`, `_PORT_<port>_TCP_ADDR`...),
//! the container's own variables win and can refer to them; `enableServiceLinks: false` leaves them out but keeps
//! the `kubernetes` Service's.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::{LogParams, PostParams};

use super::harness::RealNode;

const NS: &str = "rn-links";

fn pod(name: &str, links: bool) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "enableServiceLinks": links,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", "env | sort; echo END; while :; do sleep 1; done"],
                "env": [
                    {"name": "MY_WEB_SERVICE_PORT", "value": "overridden"},
                    {"name": "WEB_URL", "value": "http://$(MY_WEB_SERVICE_HOST):$(MY_WEB_SERVICE_PORT_HTTP)"},
                ],
            }],
        },
    }))?)
}

async fn env_of(node: &RealNode, pods: &Api<Pod>, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let logs = wait_for(
        &format!("{name}'s environment"),
        Duration::from_secs(90),
        || async {
            let logs = pods.logs(name, &LogParams::default()).await.unwrap_or_default();
            Ok(logs.contains("END").then_some(logs))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    Ok(logs
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect())
}

#[tokio::test]
async fn services_of_the_namespace_show_in_the_environment_unless_links_are_off() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let client = node.cp.admin_client().await?;
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "my-web", "namespace": NS},
        "spec": {"selector": {"app": "none"}, "ports": [
            {"name": "http", "port": 80, "targetPort": 8080},
            {"name": "metrics", "port": 9090, "protocol": "UDP"},
        ]},
    }))?;
    let created = Api::<Service>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &svc)
        .await?;
    let ip = created.spec.and_then(|s| s.cluster_ip).context("clusterIP")?;
    let master_ip = Api::<Service>::namespaced(client, "default")
        .get("kubernetes")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("kubernetes clusterIP")?;
    node.create_pod(&pods, &pod("linked", true)?).await?;
    node.create_pod(&pods, &pod("unlinked", false)?).await?;

    let env = env_of(node, &pods, "linked").await?;
    let get = |k: &str| env.get(k).map(String::as_str);
    assert_eq!(get("MY_WEB_SERVICE_HOST"), Some(ip.as_str()), "{env:?}");
    assert_eq!(get("MY_WEB_SERVICE_PORT_HTTP"), Some("80"));
    assert_eq!(get("MY_WEB_SERVICE_PORT_METRICS"), Some("9090"));
    assert_eq!(get("MY_WEB_PORT"), Some(format!("tcp://{ip}:80").as_str()));
    assert_eq!(get("MY_WEB_PORT_80_TCP_ADDR"), Some(ip.as_str()));
    assert_eq!(get("MY_WEB_PORT_9090_UDP_PROTO"), Some("udp"));
    assert_eq!(
        get("MY_WEB_SERVICE_PORT"),
        Some("overridden"),
        "the container's own value wins"
    );
    assert_eq!(
        get("WEB_URL"),
        Some(format!("http://{ip}:80").as_str()),
        "$(VAR) refers to links"
    );
    assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some(master_ip.as_str()));
    assert_eq!(get("KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));

    let env = env_of(node, &pods, "unlinked").await?;
    assert!(!env.contains_key("MY_WEB_SERVICE_HOST"), "{env:?}");
    assert_eq!(
        env.get("KUBERNETES_SERVICE_HOST"),
        Some(&master_ip),
        "the API server's always"
    );
    assert_eq!(
        env.get("WEB_URL").map(String::as_str),
        Some("http://$(MY_WEB_SERVICE_HOST):$(MY_WEB_SERVICE_PORT_HTTP)"),
        "unknown references stay as written"
    );
    // a Service made just before a pod, while the namespace's Services read for the pods above are still kept
    let late: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "late-web", "namespace": NS},
        "spec": {"selector": {"app": "none"}, "ports": [{"port": 81}]},
    }))?;
    let late_ip = Api::<Service>::namespaced(node.cp.admin_client().await?, NS)
        .create(&PostParams::default(), &late)
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("late clusterIP")?;
    node.create_pod(&pods, &pod("late", true)?).await?;
    let env = env_of(node, &pods, "late").await?;
    assert_eq!(
        env.get("LATE_WEB_SERVICE_HOST"),
        Some(&late_ip),
        "a Service made just before the pod: {env:?}"
    );
    println!("[real_node] service links: MY_WEB_SERVICE_HOST={ip} with links, absent without");
    Ok(())
}
