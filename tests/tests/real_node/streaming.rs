//! The kubelet API of the real node: `kubectl exec` (output, stdin, exit code), `kubectl port-forward` with an
//! HTTP request through it, and `kubectl logs` (`--tail`, `-f`, `--previous` after a restart) — all through the
//! API server, which reaches the node's port with its kubelet client certificate; the node proxies streams to
//! containerd's streaming server. Then direct requests to the node, as the kubelet's own clients make them:
//! anonymous 401, a service account without `nodes/proxy` 403 on exec, run and logs, with it `/run` answers the
//! command's output; an unknown pod 404, an unknown container 500 with the kubelet's message.

use std::io::{BufRead, Read, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;

use super::harness::{NODE, RealNode};

const NS: &str = "rn-stream";

fn pod(name: &str, restart: &str, script: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1, "restartPolicy": restart,
                 "volumes": [{"name": "data", "emptyDir": {}}],
                 "containers": [{"name": "main", "image": "localhost/busybox:local",
                                 "command": ["sh", "-c", script],
                                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]},
    }))?)
}

/// `kubectl -n rn-stream <args>`: exit code, stdout, stderr.
fn kubectl(node: &RealNode, args: &[&str], stdin: Option<&str>) -> anyhow::Result<(i32, String, String)> {
    let mut cmd = node.cp.kubectl();
    cmd.args(["-n", NS]).args(args);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().context("starting kubectl")?;
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().context("kubectl stdin")?;
        pipe.write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

async fn running(pods: &Api<Pod>, name: &str, restarts: i32) -> anyhow::Result<()> {
    wait_for(
        &format!("{name} running with {restarts} restart(s)"),
        Duration::from_secs(90),
        || async {
            let p = pods.get(name).await?;
            let c = p
                .status
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.into_iter().next());
            Ok(c.filter(|c| {
                c.restart_count >= restarts && c.state.as_ref().is_some_and(|s| s.running.is_some())
            })
            .map(|_| ()))
        },
    )
    .await
}

#[tokio::test]
async fn exec_port_forward_and_logs_through_the_api_server() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let web = pod(
        "web",
        "Always",
        "mkdir -p /www && echo forwarded-page > /www/index.html && httpd -p 8080 -h /www && \
         i=0; while :; do echo line-$i; i=$((i+1)); sleep 1; done",
    )?;
    let crasher = pod(
        "crasher",
        "Always",
        "n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; echo attempt-$n; \
         [ $n -ge 2 ] && exec sleep 3600; sleep 1; exit 1",
    )?;
    for p in [&web, &crasher] {
        node.create_pod(&pods, p).await?;
    }
    running(&pods, "web", 0)
        .await
        .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;

    // exec: output, stdin, the command's exit code
    let t0 = Instant::now();
    let (code, out, err) = kubectl(node, &["exec", "web", "--", "echo", "hi"], None)?;
    println!("[real_node] kubectl exec echo: {:?}", t0.elapsed());
    assert_eq!(
        (code, out.as_str()),
        (0, "hi\n"),
        "stderr: {err}\nagent log:\n{}",
        node.agent_log_tail()
    );
    let (code, out, err) = kubectl(node, &["exec", "-i", "web", "--", "cat"], Some("piped through\n"))?;
    assert_eq!((code, out.as_str()), (0, "piped through\n"), "stderr: {err}");
    let (code, _, err) = kubectl(
        node,
        &["exec", "web", "--", "sh", "-c", "echo oops >&2; exit 3"],
        None,
    )?;
    assert_eq!(code, 3, "stderr: {err}");
    assert!(err.contains("oops"), "{err}");
    let (code, out, _) = kubectl(node, &["exec", "web", "--", "cat", "/www/index.html"], None)?;
    assert_eq!((code, out.as_str()), (0, "forwarded-page\n"));

    // port-forward: a local port reaches the container's 8080
    let mut forward = node
        .cp
        .kubectl()
        .args([
            "-n",
            NS,
            "port-forward",
            "--address",
            "127.0.0.1",
            "pod/web",
            ":8080",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let fetched = {
        let stdout = forward.stdout.take().context("port-forward stdout")?;
        // the first line names the local port; kubectl keeps writing a line per connection, so the pipe is
        // drained for its whole life (a closed pipe would kill it at the first connection)
        let (first_tx, first_rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let mut lines = std::io::BufReader::new(stdout).lines();
            let _ = first_tx.send(lines.next());
            lines.for_each(drop);
        });
        let line = first_rx
            .await?
            .context("kubectl port-forward printed nothing")??;
        // "Forwarding from 127.0.0.1:43127 -> 8080"
        let port: u16 = line
            .split_once("127.0.0.1:")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("port-forward said {line:?}"))?;
        tokio::task::spawn_blocking(move || -> anyhow::Result<String> {
            let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port))?;
            tcp.set_read_timeout(Some(Duration::from_secs(20)))?;
            tcp.write_all(b"GET /index.html HTTP/1.0\r\nHost: web\r\n\r\n")?;
            let mut answer = String::new();
            tcp.read_to_string(&mut answer)?;
            Ok(answer)
        })
        .await?
    };
    if fetched.is_err() {
        // let kubectl report what went wrong before it is stopped: SIGINT ends a port-forward cleanly; the wait
        // for its exit is only for the report, so a kubectl that does not exit is killed below all the same
        let pid = nix::unistd::Pid::from_raw(i32::try_from(forward.id())?);
        if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).is_ok() {
            let exited = wait_for("kubectl port-forward to exit", Duration::from_secs(10), || {
                let status = forward.try_wait();
                async move { Ok(status?.map(|_| ())) }
            })
            .await;
            if let Err(e) = exited {
                eprintln!("[real_node] {e}");
            }
        }
    }
    let _ = forward.kill();
    let said = forward
        .wait_with_output()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .unwrap_or_default();
    let fetched = fetched.with_context(|| {
        format!(
            "kubectl port-forward said: {said}\nagent log:\n{}",
            node.agent_log_tail()
        )
    })?;
    assert!(
        fetched.starts_with("HTTP/1.") && fetched.contains(" 200 "),
        "{fetched}"
    );
    assert!(fetched.ends_with("forwarded-page\n"), "{fetched}");

    // logs: the last lines (of three at least), following, the previous instance
    wait_for("web's third log line", Duration::from_secs(30), || async {
        let logs = pods.logs("web", &Default::default()).await?;
        Ok(logs.contains("line-2").then_some(()))
    })
    .await?;
    let (code, out, err) = kubectl(node, &["logs", "web", "--tail", "2"], None)?;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines.iter().all(|l| l.starts_with("line-")), "{out}");
    let mut follow = node
        .cp
        .kubectl()
        .args(["-n", NS, "logs", "-f", "--tail", "0", "web"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = follow.stdout.take().context("logs -f stdout")?;
    let followed = tokio::task::spawn_blocking(move || {
        let mut reader = std::io::BufReader::new(stdout);
        let mut got = Vec::new();
        for _ in 0..3 {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                break;
            }
            got.push(line.trim_end().to_owned());
        }
        Ok::<_, std::io::Error>(got)
    });
    let followed = tokio::time::timeout(Duration::from_secs(20), followed).await;
    let _ = follow.kill();
    let _ = follow.wait();
    let followed = followed.context("3 followed lines within 20 s")???;
    let numbers: Vec<u32> = followed
        .iter()
        .filter_map(|l| l.strip_prefix("line-")?.parse().ok())
        .collect();
    assert_eq!(numbers.len(), 3, "{followed:?}");
    assert!(
        numbers.windows(2).all(|w| w[1] == w[0] + 1),
        "new lines in order: {followed:?}"
    );

    running(&pods, "crasher", 1).await?;
    let (_, now, _) = kubectl(node, &["logs", "crasher"], None)?;
    let (code, previous, err) = kubectl(node, &["logs", "crasher", "--previous"], None)?;
    assert_eq!(code, 0, "{err}");
    assert_eq!((now.as_str(), previous.as_str()), ("attempt-2\n", "attempt-1\n"));
    Ok(())
}

/// An HTTPS request to the node's kubelet port (the cluster CA signs its serving certificate); `token` as a
/// bearer token. Answers the status and body.
async fn node_request(
    node: &RealNode,
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    use std::sync::Arc;

    use http_body_util::BodyExt;
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(node.cp.client_ca_file())? {
        roots.add(cert?)?;
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .enable_http1()
        .build();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, String>(connector);
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("https://127.0.0.1:{port}{path}"));
    if let Some(token) = token {
        req = req.header("Authorization", format!("Bearer {token}"));
    }
    let resp = client.request(req.body(String::new())?).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A token of service account `name` in [`NS`] (created if missing), allowed `nodes/proxy` when `proxy`.
async fn token(client: &kube::Client, name: &str, proxy: bool) -> anyhow::Result<String> {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::api::PostParams;

    let ignore_exists = |r: Result<(), kube::Error>| match r {
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        other => other,
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    let sa = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    ignore_exists(accounts.create(&PostParams::default(), &sa).await.map(|_| ()))?;
    if proxy {
        let role: ClusterRole = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "rn-stream-node-proxy"},
            "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get", "create"]}],
        }))?;
        let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("rn-stream-node-proxy-{name}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "rn-stream-node-proxy"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NS}],
        }))?;
        ignore_exists(
            Api::<ClusterRole>::all(client.clone())
                .create(&PostParams::default(), &role)
                .await
                .map(|_| ()),
        )?;
        ignore_exists(
            Api::<ClusterRoleBinding>::all(client.clone())
                .create(&PostParams::default(), &binding)
                .await
                .map(|_| ()),
        )?;
    }
    let request: TokenRequest =
        serde_json::from_value(serde_json::json!({"spec": {"expirationSeconds": 3600}}))?;
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .context("no token issued")
}

#[tokio::test]
async fn direct_requests_are_authenticated_authorized_and_checked() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    node.create_pod(&pods, &pod("direct", "Always", "exec sleep 3600")?)
        .await?;
    running(&pods, "direct", 0).await?;
    let admin = node.cp.admin_client().await?;
    let port = Api::<Node>::all(admin.clone())
        .get(NODE)
        .await?
        .status
        .and_then(|s| s.daemon_endpoints)
        .and_then(|d| d.kubelet_endpoint)
        .map(|e| e.port)
        .context("the node's kubelet port")?;
    let port = u16::try_from(port)?;
    let (nobody, allowed) = (
        token(&admin, "rn-stream-nobody", false).await?,
        token(&admin, "rn-stream-operator", true).await?,
    );
    let run = format!("/run/{NS}/direct/main?cmd=echo+direct+run");
    let exec = format!("/exec/{NS}/direct/main?command=true&stdout=1");
    let logs = format!("/containerLogs/{NS}/direct/main");

    let (status, _) = node_request(node, port, "POST", &run, None).await?;
    assert_eq!(status, 401, "anonymous");
    for (method, path) in [("POST", &run), ("POST", &exec), ("GET", &logs)] {
        let (status, body) = node_request(node, port, method, path, Some(&nobody)).await?;
        assert_eq!(status, 403, "{method} {path} without nodes/proxy: {body}");
        // the kubelet's refusal names what was missing
        assert!(body.contains("resource=nodes, subresource(s)=[proxy]"), "{body}");
    }
    // the authorizer's answer may be cached for a moment after the binding: retry until allowed
    let (status, body) = wait_for("nodes/proxy granted", Duration::from_secs(30), || async {
        let (status, body) = node_request(node, port, "POST", &run, Some(&allowed)).await?;
        Ok((status != 403).then_some((status, body)))
    })
    .await?;
    assert_eq!((status, body.as_str()), (200, "direct run\n"));

    let (status, body) = node_request(
        node,
        port,
        "POST",
        &format!("/run/{NS}/nosuchpod/main?cmd=true"),
        Some(&allowed),
    )
    .await?;
    assert_eq!((status, body.as_str()), (404, "pod does not exist"));
    let (status, body) = node_request(
        node,
        port,
        "POST",
        &format!("/run/{NS}/direct/nope?cmd=true"),
        Some(&allowed),
    )
    .await?;
    assert_eq!((status, body.as_str()), (500, "container not found (\"nope\")"));
    let (status, body) = node_request(
        node,
        port,
        "POST",
        &format!("/exec/{NS}/direct/main?command=true"),
        Some(&allowed),
    )
    .await?;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("at least 1 of stdin, stdout, stderr"), "{body}");
    Ok(())
}
