//! Pod fields the node acts on as the kubelet does, on the real node: a pod name longer than a hostname holds
//! is cut to 63 characters (the pod starts), `setHostnameAsFQDN` makes the FQDN the kernel hostname and one
//! longer than 64 characters is refused (`FailedCreatePodSandBox`), `hostnameOverride` is the hostname whole
//! (over `hostname` and `subdomain`, also in `/etc/hosts`); `runtimeClassName` runs the sandbox with its
//! RuntimeClass's handler, and a RuntimeClass deleted before the sandbox is made leaves the pod waiting with the
//! kubelet's event; `activeDeadlineSeconds` fails the pod with `DeadlineExceeded` and kills its container; an
//! HTTPS readiness probe (the server's certificate not verified) turns a pod Ready, and a liveness probe answered
//! with a redirect to another host passes with a `ProbeWarning` event; a `subPath` of an emptyDir that does not
//! exist yet gets the volume's mode and the pod's `fsGroup`, and a non-root container writes there.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::Api;
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::harness::{CLUSTER_DOMAIN, RealNode};

const NS: &str = "rn-fields";

fn busybox(name: &str, spec: serde_json::Value, script: &str) -> anyhow::Result<Pod> {
    let mut spec = spec;
    spec["automountServiceAccountToken"] = serde_json::json!(false);
    spec["terminationGracePeriodSeconds"] = serde_json::json!(1);
    let mut container = serde_json::json!({
        "name": "main", "image": "localhost/busybox:local", "command": ["sh", "-c", script],
    });
    if let Some(extra) = spec.get("container").cloned() {
        for (k, v) in extra.as_object().into_iter().flatten() {
            container[k] = v.clone();
        }
        spec.as_object_mut().map(|o| o.remove("container"));
    }
    spec["containers"] = serde_json::json!([container]);
    Ok(serde_json::from_value(
        serde_json::json!({"metadata": {"name": name}, "spec": spec}),
    )?)
}

async fn events_of(node: &RealNode, pod: &str) -> anyhow::Result<Vec<(String, String)>> {
    let events: Api<Event> = Api::namespaced(node.cp.admin_client().await?, NS);
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect())
}

async fn wait_event(node: &RealNode, pod: &str, reason: &str) -> anyhow::Result<String> {
    wait_for(
        &format!("a {reason} event of {pod}"),
        Duration::from_secs(60),
        || async {
            let events = events_of(node, pod).await?;
            Ok(events.into_iter().find(|(r, _)| r == reason).map(|(_, m)| m))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))
}

/// The first line of the container's log that starts with `prefix`, without it.
async fn logged(pods: &Api<Pod>, pod: &str, prefix: &str) -> anyhow::Result<String> {
    wait_for(
        &format!("{pod} logs {prefix}"),
        Duration::from_secs(60),
        || async {
            let logs = pods.logs(pod, &LogParams::default()).await.unwrap_or_default();
            Ok(logs
                .lines()
                .find_map(|l| l.strip_prefix(prefix))
                .map(str::to_owned))
        },
    )
    .await
}

#[tokio::test]
async fn hostnames_are_cut_and_an_fqdn_hostname_is_set_or_refused() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let report = "echo host=$(hostname); while :; do sleep 1; done";
    // the 63rd character is a '-': cut there, and dropped
    let long = format!("{}-{}", "l".repeat(62), "and-then-some");
    node.create_pod(&pods, &busybox(&long, serde_json::json!({}), report)?)
        .await?;
    let fqdn_spec = |hostname: &str| serde_json::json!({"hostname": hostname, "subdomain": "sub", "setHostnameAsFQDN": true});
    node.create_pod(&pods, &busybox("fqdn", fqdn_spec("fqdn"), report)?)
        .await?;
    node.create_pod(&pods, &busybox("fqdn-long", fqdn_spec(&"x".repeat(40)), report)?)
        .await?;
    let override_spec = serde_json::json!({
        "hostname": "custom-host", "subdomain": "sub", "hostnameOverride": "override.example.host",
    });
    let report_override = "echo host=$(hostname); echo fqdn=$(hostname -f); echo hosts=$(grep -c override /etc/hosts); \
         while :; do sleep 1; done";
    node.create_pod(&pods, &busybox("override", override_spec, report_override)?)
        .await?;

    let t0 = Instant::now();
    assert_eq!(logged(&pods, &long, "host=").await?, "l".repeat(62));
    println!(
        "[real_node] a pod named with {} characters ran after {:?}",
        long.len(),
        t0.elapsed()
    );
    assert_eq!(
        logged(&pods, "fqdn", "host=").await?,
        format!("fqdn.sub.{NS}.svc.{CLUSTER_DOMAIN}")
    );
    let refused = wait_event(node, "fqdn-long", "FailedCreatePodSandBox").await?;
    let fqdn = format!("{}.sub.{NS}.svc.{CLUSTER_DOMAIN}", "x".repeat(40));
    assert_eq!(
        refused,
        format!(
            "Failed to create pod sandbox: failed to construct FQDN from pod hostname and cluster domain, FQDN \
             {fqdn} is too long (64 characters is the max, {} characters requested)",
            fqdn.len()
        )
    );
    let p = pods.get("fqdn-long").await?;
    assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
    // hostnameOverride: the kernel hostname and the pod's own /etc/hosts line, with no subdomain part
    assert_eq!(logged(&pods, "override", "host=").await?, "override.example.host");
    assert_eq!(logged(&pods, "override", "fqdn=").await?, "override.example.host");
    assert_eq!(logged(&pods, "override", "hosts=").await?, "1");
    for name in [long.as_str(), "fqdn", "fqdn-long", "override"] {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}

#[tokio::test]
async fn runtime_class_handler_and_a_missing_runtime_class() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let client = node.cp.admin_client().await?;
    let classes: Api<RuntimeClass> = Api::all(client.clone());
    let pp = PostParams::default();
    // named unlike its handler: the sandbox runs only if the handler, not the name, reaches containerd
    for name in ["fields-runc", "fields-gone"] {
        let rc: RuntimeClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
            "metadata": {"name": name}, "handler": "runc",
        }))?;
        match classes.create(&pp, &rc).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let report = "echo up=yes; while :; do sleep 1; done";
    node.create_pod(
        &pods,
        &busybox(
            "classed",
            serde_json::json!({"runtimeClassName": "fields-runc"}),
            report,
        )?,
    )
    .await?;
    // this pod waits for a ConfigMap first; its RuntimeClass is deleted meanwhile
    let waiting = serde_json::json!({
        "runtimeClassName": "fields-gone",
        "volumes": [{"name": "cfg", "configMap": {"name": "fields-later"}}],
        "container": {"volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]},
    });
    node.create_pod(&pods, &busybox("unclassed", waiting, report)?)
        .await?;
    assert_eq!(logged(&pods, "classed", "up=").await?, "yes");
    wait_event(node, "unclassed", "FailedMount").await?;
    classes.delete("fields-gone", &DeleteParams::default()).await?;
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "fields-later", "namespace": NS}, "data": {"k": "v"},
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .create(&pp, &cm)
        .await?;
    let refused = wait_event(node, "unclassed", "FailedCreatePodSandBox").await?;
    assert_eq!(
        refused,
        "Failed to create pod sandbox: runtimeclass.node.k8s.io \"fields-gone\" not found"
    );
    let p = pods.get("unclassed").await?;
    assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
    for name in ["classed", "unclassed"] {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    classes.delete("fields-runc", &DeleteParams::default()).await?;
    Ok(())
}

#[tokio::test]
async fn active_deadline_fails_the_pod_and_kills_its_container() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let pod = busybox(
        "deadline",
        serde_json::json!({"activeDeadlineSeconds": 5, "restartPolicy": "Always"}),
        "while :; do sleep 1; done",
    )?;
    node.create_pod(&pods, &pod).await?;
    let failed = wait_for("deadline Failed", Duration::from_secs(60), || async {
        let p = pods.get("deadline").await?;
        let failed = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed");
        Ok(failed.then_some(p))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let status = failed.status.context("status")?;
    assert_eq!(status.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline")
    );
    let start = status.start_time.context("startTime")?.0;
    let main = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "main")
        .context("main's status")?;
    let terminated = main
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .context("main terminated")?;
    let finished = terminated.finished_at.as_ref().context("finishedAt")?.0;
    let active = finished.duration_since(start).as_secs_f64();
    println!("[real_node] activeDeadlineSeconds 5: container killed {active:.1} s after the pod's start");
    assert!((5.0..15.0).contains(&active), "killed {active} s after the start");
    assert_ne!(terminated.exit_code, 0, "{terminated:?}");
    let message = wait_event(node, "deadline", "DeadlineExceeded").await?;
    assert_eq!(
        message,
        "Pod was active on the node longer than the specified deadline"
    );
    // not restarted after the kill, though its restart policy is Always
    tokio::time::sleep(Duration::from_secs(3)).await;
    let p = pods.get("deadline").await?;
    let restarts = p
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .map(|c| c.restart_count);
    assert_eq!(restarts, Some(0));
    pods.delete("deadline", &DeleteParams::default()).await?;
    Ok(())
}

/// A server on loopback (where the node's probes reach it through `httpGet.host`) answering every request with
/// `response`, over TLS with a self-signed certificate when `tls`; its port. It lives as long as the test's
/// runtime.
async fn serve(response: String, tls: bool) -> anyhow::Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let acceptor = if tls {
        let cert = rcgen::generate_simple_self_signed(vec!["probe.test".to_owned()])?;
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_no_client_auth()
                .with_single_cert(vec![cert.cert.der().clone()], key)?;
        Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    } else {
        None
    };
    async fn answer<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S, response: &str) {
        let mut buf = [0u8; 2048];
        let _ = s.read(&mut buf).await;
        let _ = s.write_all(response.as_bytes()).await;
        let _ = s.shutdown().await;
    }
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let (response, acceptor) = (response.clone(), acceptor.clone());
            tokio::spawn(async move {
                match acceptor {
                    Some(a) => {
                        if let Ok(s) = a.accept(sock).await {
                            answer(s, &response).await;
                        }
                    }
                    None => answer(sock, &response).await,
                }
            });
        }
    });
    Ok(port)
}

#[tokio::test]
async fn https_readiness_and_a_redirect_elsewhere_warned() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let https = serve("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".into(), true).await?;
    let redirect = serve(
        "HTTP/1.1 302 Found\r\nlocation: http://elsewhere.invalid/\r\ncontent-length: 5\r\n\r\nmoved".into(),
        false,
    )
    .await?;
    let probe = |scheme: &str, port: u16| {
        serde_json::json!({"httpGet": {"scheme": scheme, "host": "127.0.0.1", "port": port, "path": "/"},
                           "periodSeconds": 1, "failureThreshold": 1})
    };
    let idle = "while :; do sleep 1; done";
    node.create_pod(
        &pods,
        &busybox(
            "https-ready",
            serde_json::json!({"container": {"readinessProbe": probe("HTTPS", https)}}),
            idle,
        )?,
    )
    .await?;
    node.create_pod(
        &pods,
        &busybox(
            "redirected",
            serde_json::json!({"container": {"livenessProbe": probe("HTTP", redirect)}}),
            idle,
        )?,
    )
    .await?;
    let t0 = Instant::now();
    wait_for("https-ready Ready", Duration::from_secs(60), || async {
        let p = pods.get("https-ready").await?;
        let ready = p
            .status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        Ok(ready.then_some(()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    println!(
        "[real_node] a pod with an HTTPS readiness probe Ready {:?} after creation",
        t0.elapsed()
    );
    let warning = wait_event(node, "redirected", "ProbeWarning").await?;
    assert_eq!(
        warning,
        "Liveness probe warning: Probe terminated redirects, Response body: moved"
    );
    // a warning is a pass: the container is not restarted (failureThreshold 1, one probe a second)
    tokio::time::sleep(Duration::from_secs(3)).await;
    let p = pods.get("redirected").await?;
    let restarts = p
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .map(|c| c.restart_count);
    assert_eq!(restarts, Some(0));
    assert!(
        !events_of(node, "redirected")
            .await?
            .iter()
            .any(|(r, _)| r == "Unhealthy"),
        "no Unhealthy event"
    );
    for name in ["https-ready", "redirected"] {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_new_sub_path_of_an_empty_dir_has_the_volumes_mode_and_fs_group() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let spec = serde_json::json!({
        "securityContext": {"fsGroup": 123, "runAsUser": 1001},
        "volumes": [{"name": "mem", "emptyDir": {"medium": "Memory"}}, {"name": "disk", "emptyDir": {}}],
        "container": {"volumeMounts": [
            {"name": "mem", "mountPath": "/mem", "subPath": "test-sub"},
            {"name": "disk", "mountPath": "/disk", "subPath": "a/b"},
        ]},
    });
    let script = "echo mem=$(stat -c '%a %g' /mem); echo disk=$(stat -c '%a %g' /disk); \
                  touch /mem/f /disk/f && echo wrote=yes; while :; do sleep 1; done";
    node.create_pod(&pods, &busybox("sub-path", spec, script)?)
        .await?;
    // the kubelet's: a tmpfs root is 1777, and fsGroup adds the setgid bit
    assert_eq!(logged(&pods, "sub-path", "mem=").await?, "3777 123");
    assert_eq!(logged(&pods, "sub-path", "disk=").await?, "2777 123");
    assert_eq!(logged(&pods, "sub-path", "wrote=").await?, "yes");
    pods.delete("sub-path", &DeleteParams::default()).await?;
    Ok(())
}
