//! The kubelet API's streaming paths: `/exec`, `/attach` and `/portForward` (an upgraded connection — SPDY or
//! WebSocket, whichever the API server asks for — between the client and the container), and `/run` (a
//! command's output in one response).
//!
//! For a stream the node asks the container runtime for a session (`Exec`, `Attach`, `PortForward` over CRI;
//! the answer is a URL on the runtime's own streaming server) and then proxies the client's upgrade request to
//! that URL: the runtime's answer (101 Switching Protocols, or its error) goes back to the client, and after a
//! 101 the two connections are spliced byte for byte until either side closes. The node never interprets the
//! stream protocol, so every protocol version the runtime speaks works. Paths with the pod's UID
//! (`/exec/{ns}/{pod}/{uid}/{container}`) only match that instance of the pod.
//!
//! Status codes as the kubelet's: an unknown pod is 404 (`pod does not exist`), an unknown container 500
//! (`container not found ("c")`), a stream with none of stdin/stdout/stderr 400.
//!
//! A runtime without a streaming server (its `Exec` answers `Unimplemented`, as the fake runtime of hollow
//! nodes does) still gets `/exec`: the node answers the SPDY/3.1 upgrade itself and runs the command with
//! ExecSync ([`remotecommand`](super::remotecommand)); stdin is read and discarded and the output is written
//! when the command ends. Such a node answers `/attach` and `/portForward` 501.

use std::collections::HashMap;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, RawQuery, Request};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use runtime_api::{Code, RuntimeError, cri};

use super::NodeEndpoint;
use super::remotecommand::{self, Negotiation, Outcome, Protocol};
use super::respond::error;
use super::stream_options::{StreamOptions, form_pairs};
use super::stream_proxy::proxy_stream;
use crate::pods::runtime::labels;

/// The pod's ready sandbox: by namespace and name, and UID when the path names one.
async fn find_sandbox(
    node: &NodeEndpoint,
    namespace: &str,
    pod: &str,
    uid: Option<&str>,
) -> Result<cri::PodSandbox, Response> {
    let mut selector = HashMap::from([
        (labels::POD_NAMESPACE.to_owned(), namespace.to_owned()),
        (labels::POD_NAME.to_owned(), pod.to_owned()),
    ]);
    if let Some(uid) = uid {
        selector.insert(labels::POD_UID.to_owned(), uid.to_owned());
    }
    let ready = cri::PodSandboxStateValue {
        state: cri::PodSandboxState::SandboxReady as i32,
    };
    let mut sandboxes = node
        .ctx
        .runtime
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: selector,
                state: Some(ready),
                ..Default::default()
            }),
        })
        .await
        .map_err(|e| runtime_failure("ListPodSandbox", &e))?
        .items;
    sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    sandboxes
        .into_iter()
        .next()
        .ok_or_else(|| error(StatusCode::NOT_FOUND, "pod does not exist"))
}

/// The running container `container` of the pod's sandbox.
async fn find_container(
    node: &NodeEndpoint,
    namespace: &str,
    pod: &str,
    uid: Option<&str>,
    container: &str,
) -> Result<String, Response> {
    let sandbox = find_sandbox(node, namespace, pod, uid).await?;
    let running = cri::ContainerStateValue {
        state: cri::ContainerState::ContainerRunning as i32,
    };
    let containers = node
        .ctx
        .runtime
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                pod_sandbox_id: sandbox.id,
                state: Some(running),
                label_selector: HashMap::from([(labels::CONTAINER_NAME.to_owned(), container.to_owned())]),
                ..Default::default()
            }),
        })
        .await
        .map_err(|e| runtime_failure("ListContainers", &e))?
        .containers;
    containers.into_iter().next().map(|c| c.id).ok_or_else(|| {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("container not found ({container:?})"),
        )
    })
}

/// A runtime error as the kubelet writes a streaming one: the gRPC code mapped to an HTTP status.
fn runtime_failure(call: &str, e: &RuntimeError) -> Response {
    let status = match e.code {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, format!("container runtime {call}: {}", e.message))
}

/// The path of a container stream: `{ns}/{pod}/{container}` or `{ns}/{pod}/{uid}/{container}`.
type ContainerPath = (String, String, Option<String>, String);

fn container_path(mut p: HashMap<String, String>) -> ContainerPath {
    let mut take = |k: &str| p.remove(k);
    (
        take("namespace").unwrap_or_default(),
        take("pod").unwrap_or_default(),
        take("uid"),
        take("container").unwrap_or_default(),
    )
}

/// `/exec/{ns}/{pod}[/{uid}]/{container}?command=...&stdin=1&stdout=1&tty=1`.
pub(super) async fn exec(
    Extension(node): Extension<NodeEndpoint>,
    Path(parts): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let (ns, pod, uid, container) = container_path(parts);
    let opts = match StreamOptions::from_query(query.as_deref()) {
        Ok(o) => o,
        Err(m) => return error(StatusCode::BAD_REQUEST, m),
    };
    if opts.command.is_empty() {
        return error(StatusCode::BAD_REQUEST, "missing command");
    }
    let id = match find_container(&node, &ns, &pod, uid.as_deref(), &container).await {
        Ok(id) => id,
        Err(resp) => return resp,
    };
    let asked = cri::ExecRequest {
        container_id: id.clone(),
        cmd: opts.command.clone(),
        tty: opts.tty,
        stdin: opts.stdin,
        stdout: opts.stdout,
        stderr: opts.stderr,
    };
    match node.ctx.runtime.exec(asked).await {
        Ok(r) => proxy_stream(req, &r.url).await,
        Err(e) if e.code == Code::Unimplemented => exec_here(node, req, id, opts),
        Err(e) => runtime_failure("Exec", &e),
    }
}

/// Whether the request's `header` lists `token` (comma-separated, any case).
fn lists(req: &Request, header: header::HeaderName, token: &str) -> bool {
    req.headers()
        .get_all(header)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Exec on a runtime without a streaming server: the node answers the SPDY/3.1 upgrade itself and runs the
/// command with ExecSync (see [`remotecommand`](super::remotecommand)); stdin is read and discarded.
fn exec_here(node: NodeEndpoint, mut req: Request, container_id: String, opts: StreamOptions) -> Response {
    let protocol = match spdy_upgrade(&req) {
        Ok(p) => p,
        Err(resp) => return *resp,
    };
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let io = match upgrade.await {
            Ok(u) => TokioIo::new(u),
            Err(e) => {
                tracing::debug!(error = %e, "exec upgrade failed");
                return;
            }
        };
        let timeout = node.ctx.config.kubelet.runtime_request_timeout.as_secs();
        let run = || async {
            let asked = cri::ExecSyncRequest {
                container_id,
                cmd: opts.command.clone(),
                timeout: i64::try_from(timeout).unwrap_or(i64::MAX),
            };
            node.ctx
                .runtime
                .exec_sync(asked)
                .await
                .map(|r| Outcome {
                    stdout: r.stdout,
                    stderr: r.stderr,
                    exit_code: r.exit_code,
                })
                .map_err(|e| e.message)
        };
        match remotecommand::serve_exec(io, protocol, &opts, run).await {
            Ok(()) => tracing::debug!(command = ?opts.command, "exec stream done"),
            Err(e) => tracing::debug!(error = %e, "exec stream ended early"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1")
        .header(PROTOCOL_VERSION, protocol.name())
        .body(Body::empty())
        .unwrap_or_else(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// The remote-command version of a request the node serves itself: a SPDY/3.1 upgrade naming a version it
/// speaks. Otherwise the refusal: 400 for no upgrade, an upgrade to anything else or no version named; 403
/// listing the versions spoken when none is common.
fn spdy_upgrade(req: &Request) -> Result<Protocol, Box<Response>> {
    if !lists(req, header::CONNECTION, "upgrade") {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "Upgrade request required",
        )));
    }
    if !lists(req, header::UPGRADE, "spdy/3.1") {
        let asked = req
            .headers()
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            format!(
                "the container runtime has no streaming server, so this node serves exec itself over SPDY/3.1 \
                 only; the request asked to upgrade to {asked:?}"
            ),
        )));
    }
    let versions = req
        .headers()
        .get_all(PROTOCOL_VERSION)
        .iter()
        .filter_map(|v| v.to_str().ok());
    let protocol = match remotecommand::negotiate(versions) {
        Ok(p) => p,
        Err(Negotiation::Missing) => {
            return Err(Box::new(error(
                StatusCode::BAD_REQUEST,
                format!("unable to upgrade: header {PROTOCOL_VERSION} names no protocol"),
            )));
        }
        Err(Negotiation::NoCommon(asked)) => {
            let spoken: Vec<_> = Protocol::ALL.iter().map(|p| p.name()).collect();
            let mut resp = error(
                StatusCode::FORBIDDEN,
                format!(
                    "unable to upgrade: unable to negotiate protocol: client supports {asked:?}, server accepts {spoken:?}"
                ),
            );
            for p in spoken {
                resp.headers_mut()
                    .append(ACCEPTED_PROTOCOL_VERSIONS, header::HeaderValue::from_static(p));
            }
            return Err(Box::new(resp));
        }
    };
    Ok(protocol)
}

/// 501 for attach or port-forward on a runtime without a streaming server, saying what the node does serve.
fn no_streaming_server(call: &str, e: &RuntimeError) -> Response {
    error(
        StatusCode::NOT_IMPLEMENTED,
        format!(
            "container runtime {call}: {}; without a runtime streaming server this node serves exec only \
             (attach and port-forward need one)",
            e.message
        ),
    )
}

/// The header a stream client lists its protocol versions in, and the node answers the chosen one.
const PROTOCOL_VERSION: &str = "x-stream-protocol-version";
/// The header listing the versions the node speaks, on a 403 for a failed negotiation.
const ACCEPTED_PROTOCOL_VERSIONS: &str = "x-accepted-stream-protocol-versions";

/// `/attach/{ns}/{pod}[/{uid}]/{container}?stdin=1&stdout=1&tty=1`.
pub(super) async fn attach(
    Extension(node): Extension<NodeEndpoint>,
    Path(parts): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let (ns, pod, uid, container) = container_path(parts);
    let opts = match StreamOptions::from_query(query.as_deref()) {
        Ok(o) => o,
        Err(m) => return error(StatusCode::BAD_REQUEST, m),
    };
    let id = match find_container(&node, &ns, &pod, uid.as_deref(), &container).await {
        Ok(id) => id,
        Err(resp) => return resp,
    };
    let asked = cri::AttachRequest {
        container_id: id,
        stdin: opts.stdin,
        tty: opts.tty,
        stdout: opts.stdout,
        stderr: opts.stderr,
    };
    match node.ctx.runtime.attach(asked).await {
        Ok(r) => proxy_stream(req, &r.url).await,
        Err(e) if e.code == Code::Unimplemented => no_streaming_server("Attach", &e),
        Err(e) => runtime_failure("Attach", &e),
    }
}

/// `/portForward/{ns}/{pod}[/{uid}]`: the ports travel inside the stream (one pair of streams per port).
pub(super) async fn port_forward(
    Extension(node): Extension<NodeEndpoint>,
    Path(parts): Path<HashMap<String, String>>,
    req: Request,
) -> Response {
    let (ns, pod, uid, _) = container_path(parts);
    let sandbox = match find_sandbox(&node, &ns, &pod, uid.as_deref()).await {
        Ok(s) => s,
        Err(resp) => return resp,
    };
    let asked = cri::PortForwardRequest {
        pod_sandbox_id: sandbox.id,
        port: Vec::new(),
    };
    match node.ctx.runtime.port_forward(asked).await {
        Ok(r) => proxy_stream(req, &r.url).await,
        Err(e) if e.code == Code::Unimplemented => no_streaming_server("PortForward", &e),
        Err(e) => runtime_failure("PortForward", &e),
    }
}

/// `POST /run/{ns}/{pod}[/{uid}]/{container}?cmd=...`: runs the command (split on whitespace) to completion
/// and answers its stdout followed by its stderr.
pub(super) async fn run(
    Extension(node): Extension<NodeEndpoint>,
    Path(parts): Path<HashMap<String, String>>,
    RawQuery(query): RawQuery,
) -> Response {
    let (ns, pod, uid, container) = container_path(parts);
    let cmd: Vec<String> = form_pairs(query.as_deref().unwrap_or(""))
        .into_iter()
        .filter(|(k, _)| k == "cmd")
        .flat_map(|(_, v)| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .collect();
    if cmd.is_empty() {
        return error(StatusCode::BAD_REQUEST, "missing cmd");
    }
    let id = match find_container(&node, &ns, &pod, uid.as_deref(), &container).await {
        Ok(id) => id,
        Err(resp) => return resp,
    };
    let timeout = node.ctx.config.kubelet.runtime_request_timeout.as_secs();
    let asked = cri::ExecSyncRequest {
        container_id: id,
        cmd,
        timeout: i64::try_from(timeout).unwrap_or(i64::MAX),
    };
    match node.ctx.runtime.exec_sync(asked).await {
        Ok(r) => {
            let mut out = r.stdout;
            out.extend_from_slice(&r.stderr);
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                out,
            )
                .into_response()
        }
        Err(e) => runtime_failure("ExecSync", &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_with_and_without_the_pod_uid() {
        let p = |v: &[(&str, &str)]| {
            container_path(
                v.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            )
        };
        assert_eq!(
            p(&[("namespace", "ns"), ("pod", "web"), ("container", "app")]),
            ("ns".into(), "web".into(), None, "app".into())
        );
        assert_eq!(
            p(&[
                ("namespace", "ns"),
                ("pod", "web"),
                ("uid", "u-1"),
                ("container", "app")
            ]),
            ("ns".into(), "web".into(), Some("u-1".into()), "app".into())
        );
    }

    #[tokio::test]
    async fn only_spdy_upgrades_with_a_known_version_are_served_here() {
        let req = |headers: &[(&str, &str)]| {
            let mut r = Request::builder().uri("/exec/ns/p/c?command=ls&stdout=1");
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            r.body(Body::empty()).unwrap()
        };
        let body = |r: Response| async move {
            use http_body_util::BodyExt;
            let b = r.into_body().collect().await.unwrap().to_bytes();
            String::from_utf8_lossy(&b).into_owned()
        };
        let spdy = [("connection", "Upgrade"), ("upgrade", "SPDY/3.1")];
        let ok = req(&[
            spdy[0],
            spdy[1],
            ("x-stream-protocol-version", "v5.channel.k8s.io,v4.channel.k8s.io"),
        ]);
        assert_eq!(spdy_upgrade(&ok).unwrap(), Protocol::V5);
        let r = spdy_upgrade(&req(&[])).unwrap_err();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert!(body(*r).await.contains("Upgrade request required"));
        let ws = req(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("x-stream-protocol-version", "v5.channel.k8s.io"),
        ]);
        let r = spdy_upgrade(&ws).unwrap_err();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let m = body(*r).await;
        assert!(m.contains("SPDY/3.1") && m.contains("websocket"), "{m}");
        let r = spdy_upgrade(&req(&spdy)).unwrap_err();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let r = spdy_upgrade(&req(&[
            spdy[0],
            spdy[1],
            ("x-stream-protocol-version", "v9.channel.k8s.io"),
        ]))
        .unwrap_err();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert_eq!(r.headers().get_all(ACCEPTED_PROTOCOL_VERSIONS).iter().count(), 5);
    }

    #[test]
    fn runtime_codes_map_to_http_statuses() {
        let r = runtime_failure("Exec", &RuntimeError::unimplemented("no"));
        assert_eq!(r.status(), StatusCode::NOT_IMPLEMENTED);
        assert!(r.headers().get(header::CONTENT_TYPE).is_some());
        let r = no_streaming_server("Attach", &RuntimeError::unimplemented("no streams"));
        assert_eq!(r.status(), StatusCode::NOT_IMPLEMENTED);
        let r = runtime_failure("Exec", &RuntimeError::not_found("gone"));
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }
}
