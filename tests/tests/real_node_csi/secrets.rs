//! What a driver is given besides the volume: the stage and publish secrets, service account tokens for its
//! audience bound to the pod (one token kept across publishes until it is due for renewal), and publishing again
//! at every sync of the pod with `requiresRepublish`.

use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::wait_for;
use kube::Api;

use crate::driver::{Driver, calls, last_request};
use crate::harness::RealNode;
use crate::objects::{create_claim, ensure_csi_driver, ensure_pv, running};

#[tokio::test]
async fn csi_secrets_and_service_account_tokens_reach_the_driver() -> anyhow::Result<()> {
    use k8s_openapi::api::authentication::v1::TokenReview;
    use k8s_openapi::api::core::v1::{Pod, Secret};
    use kube::api::{DeleteParams, PostParams};

    e2e::init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let _agent = crate::AGENT.read().await;
    let name = "csi-mock-secrets.node-agent.test";
    let driver = Driver::registered(node, name, &["--disable-attach"]).await?;
    let admin = node.cp.admin_client().await?;
    let audience = "csi-secrets-audience";
    // tokens for an audience of the driver's, in the volume context, renewed by publishing again at every sync
    // of the pod; inline volumes allowed
    ensure_csi_driver(
        &admin,
        name,
        serde_json::json!({"attachRequired": false, "podInfoOnMount": true, "requiresRepublish": true,
                 "tokenRequests": [{"audience": audience, "expirationSeconds": 3600}],
                 "volumeLifecycleModes": ["Persistent", "Ephemeral"]}),
    )
    .await?;
    let ns = "csi-secrets";
    let pods = node.namespace(ns).await?;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), ns);
    for (secret, key, value) in [
        ("stage-creds", "user", "stager"),
        ("publish-creds", "password", "publisher"),
        ("inline-creds", "key", "inline-secret"),
    ] {
        let s: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": secret}, "stringData": {key: value},
        }))?;
        secrets.create(&PostParams::default(), &s).await?;
    }
    // the mock driver's volume "1" with a stage and a publish secret
    let pv_name = "csi-mock-secrets-volume-1";
    ensure_pv(
        &admin,
        pv_name,
        serde_json::json!({"driver": name, "volumeHandle": "1",
                    "nodeStageSecretRef": {"name": "stage-creds", "namespace": ns},
                    "nodePublishSecretRef": {"name": "publish-creds", "namespace": ns}}),
    )
    .await?;
    create_claim(&admin, ns, pv_name).await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "with-secrets"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"},
                                 {"name": "inline", "mountPath": "/inline"}],
            }],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "inline", "csi": {"driver": name, "nodePublishSecretRef": {"name": "inline-creds"}}},
            ],
        },
    }))?;
    let created = node.create_pod(&pods, &pod).await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    running(&pods, "with-secrets", Duration::from_secs(90))
        .await
        .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;

    // the stage secret with NodeStageVolume, the publish secrets with each NodePublishVolume
    let (staged, outcome) = last_request(&driver, "NodeStageVolume")?;
    assert_eq!(outcome, "ok");
    assert_eq!(staged["secrets"], serde_json::json!({"user": "stager"}));
    let published: Vec<serde_json::Value> = calls(&driver, "NodePublishVolume")
        .iter()
        .filter_map(|l| serde_json::from_str(l.rsplit_once(" -> ")?.0).ok())
        .collect();
    assert!(published.len() >= 2, "{published:?}");
    let by_target = |part: &str| {
        published
            .iter()
            .find(|r| r["target_path"].as_str().is_some_and(|t| t.contains(part)))
            .cloned()
            .with_context(|| format!("a NodePublishVolume into {part}"))
    };
    let pv_publish = by_target(&format!("/volumes/kubernetes.io~csi/{pv_name}/"))?;
    let inline_publish = by_target("/volumes/kubernetes.io~csi/inline/")?;
    assert_eq!(
        pv_publish["secrets"],
        serde_json::json!({"password": "publisher"})
    );
    assert_eq!(
        inline_publish["secrets"],
        serde_json::json!({"key": "inline-secret"})
    );

    // a token for the driver's audience, bound to the pod, in each volume context
    for request in [&pv_publish, &inline_publish] {
        let context = &request["volume_context"];
        assert_eq!(context["csi.storage.k8s.io/pod.name"], "with-secrets");
        let tokens: serde_json::Value = serde_json::from_str(
            context["csi.storage.k8s.io/serviceAccount.tokens"]
                .as_str()
                .context("the tokens in the volume context")?,
        )?;
        let token = tokens[audience]["token"].as_str().context("a token")?;
        assert!(
            tokens[audience]["expirationTimestamp"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z'))
        );
        let review: TokenReview = serde_json::from_value(serde_json::json!({
            "spec": {"token": token, "audiences": [audience]},
        }))?;
        let reviewed = Api::<TokenReview>::all(admin.clone())
            .create(&PostParams::default(), &review)
            .await?
            .status
            .context("a review")?;
        assert_eq!(reviewed.authenticated, Some(true), "{reviewed:?}");
        let user = reviewed.user.context("a user")?;
        assert_eq!(
            user.username.as_deref(),
            Some("system:serviceaccount:csi-secrets:default")
        );
        let extra = user.extra.unwrap_or_default();
        assert_eq!(
            extra.get("authentication.kubernetes.io/pod-uid"),
            Some(&vec![uid.clone()]),
            "the token is bound to the pod"
        );
    }

    // requiresRepublish: both volumes published again (with their secrets) at the pod's next syncs, the
    // claim's volume never staged again
    let t0 = Instant::now();
    wait_for(
        "both volumes published again",
        Duration::from_secs(60),
        || async {
            let again = calls(&driver, "NodePublishVolume")
                .iter()
                .filter(|l| l.contains("\"secrets\":{\"") && l.ends_with("-> ok"))
                .count();
            Ok((again >= 4).then_some(()))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    println!(
        "[real_node_csi] volumes of a driver with requiresRepublish published again within {:?}",
        t0.elapsed()
    );
    assert_eq!(calls(&driver, "NodeStageVolume").len(), 1, "staged once");
    // the token is kept between publishes, as the kubelet's token manager keeps it until 80 % of its hour:
    // every publish of both volumes (the same request: pod, audience, lifetime) carried the one token
    let tokens: std::collections::BTreeSet<String> = calls(&driver, "NodePublishVolume")
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l.rsplit_once(" -> ")?.0).ok())
        .filter_map(|r| {
            let tokens = r["volume_context"]["csi.storage.k8s.io/serviceAccount.tokens"]
                .as_str()?
                .to_owned();
            let tokens: serde_json::Value = serde_json::from_str(&tokens).ok()?;
            tokens[audience]["token"].as_str().map(str::to_owned)
        })
        .collect();
    let publishes = calls(&driver, "NodePublishVolume").len();
    println!(
        "[real_node_csi] {publishes} publishes with requiresRepublish carried {} distinct token(s)",
        tokens.len()
    );
    assert_eq!(tokens.len(), 1, "one token across {publishes} publishes");

    pods.delete("with-secrets", &DeleteParams::default()).await?;
    driver
        .called("NodeUnstageVolume", Duration::from_secs(60))
        .await
        .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    driver.proc.stop(Duration::from_secs(10)).await?;
    Ok(())
}
