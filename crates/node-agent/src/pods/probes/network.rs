//! The real-mode probe transport: TCP connect, HTTP GET (HTTP/1.1, status 200–399 passes, redirects not
//! followed but counted as success like the kubelet does for off-host redirects) and the gRPC health check,
//! all against the pod IP unless the action names a host.

use std::time::Duration;

use async_trait::async_trait;
use http_body_util::Empty;
use hyper::body::Bytes;
use tokio::net::TcpStream;

use crate::pods::model::spec::{Action, HttpGet};
use crate::pods::probes::{ProbeOutcome, ProbeTarget, ProbeTransport};

/// Probes over the real network.
#[derive(Debug, Clone, Default)]
pub struct NetworkProbes {
    _private: (),
}

impl NetworkProbes {
    /// A transport using the host network stack.
    pub fn new() -> Self {
        Self::default()
    }
}

fn host<'a>(explicit: Option<&'a str>, target: &'a ProbeTarget<'_>) -> &'a str {
    explicit.unwrap_or(target.pod_ip)
}

fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

async fn connect(host: &str, port: u16, timeout: Duration) -> Result<TcpStream, String> {
    let addr = authority(host, port);
    match tokio::time::timeout(timeout, TcpStream::connect(&addr)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(format!("dial tcp {addr}: connect: {e}")),
        Err(_) => Err(format!("dial tcp {addr}: i/o timeout")),
    }
}

async fn http(get: &HttpGet, target: &ProbeTarget<'_>, timeout: Duration) -> ProbeOutcome {
    if get.https {
        return ProbeOutcome::Unknown("HTTPS probes are not supported by this agent".into());
    }
    let host = host(get.host.as_deref(), target);
    let addr = authority(host, get.port);
    let work = async {
        let stream = connect(host, get.port, timeout).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        let driver = tokio::spawn(conn);
        let mut req = hyper::Request::get(get.path.as_str())
            .header(hyper::header::HOST, &addr)
            .header(hyper::header::USER_AGENT, "kube-probe/1.36")
            .header(hyper::header::ACCEPT, "*/*");
        for (k, v) in &get.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string());
        driver.abort();
        resp
    };
    match tokio::time::timeout(timeout, work).await {
        Err(_) => ProbeOutcome::Failure(format!(
            "Get \"http://{addr}{}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
            get.path
        )),
        Ok(Err(e)) => ProbeOutcome::Failure(format!("Get \"http://{addr}{}\": {e}", get.path)),
        Ok(Ok(resp)) => {
            let code = resp.status().as_u16();
            if (200..400).contains(&code) {
                ProbeOutcome::Success
            } else {
                ProbeOutcome::Failure(format!("HTTP probe failed with statuscode: {code}"))
            }
        }
    }
}

async fn grpc(host: &str, port: u16, service: &str, timeout: Duration) -> ProbeOutcome {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let uri = format!("http://{}", authority(host, port));
    let endpoint = match tonic::transport::Endpoint::from_shared(uri) {
        Ok(e) => e.connect_timeout(timeout).timeout(timeout),
        Err(e) => return ProbeOutcome::Unknown(e.to_string()),
    };
    let channel = match endpoint.connect().await {
        Ok(c) => c,
        Err(e) => {
            return ProbeOutcome::Failure(format!(
                "timeout: failed to connect service {:?} within {timeout:?}: {e}",
                authority(host, port)
            ));
        }
    };
    let request = HealthCheckRequest {
        service: service.to_owned(),
    };
    match HealthClient::new(channel).check(request).await {
        Ok(resp) if resp.get_ref().status == ServingStatus::Serving as i32 => ProbeOutcome::Success,
        Ok(resp) => ProbeOutcome::Failure(format!(
            "service unhealthy (responded with {:?})",
            ServingStatus::try_from(resp.get_ref().status).unwrap_or(ServingStatus::Unknown)
        )),
        Err(status) => ProbeOutcome::Failure(format!(
            "rpc error: code = {:?} desc = {}",
            status.code(),
            status.message()
        )),
    }
}

#[async_trait]
impl ProbeTransport for NetworkProbes {
    async fn check(&self, target: &ProbeTarget<'_>, action: &Action, timeout: Duration) -> ProbeOutcome {
        match action {
            Action::Tcp { host: h, port } => {
                match connect(host(h.as_deref(), target), *port, timeout).await {
                    Ok(_) => ProbeOutcome::Success,
                    Err(e) => ProbeOutcome::Failure(e),
                }
            }
            Action::Http(get) => http(get, target, timeout).await,
            Action::Grpc { port, service } => grpc(target.pod_ip, *port, service, timeout).await,
            Action::Exec(_) | Action::Sleep(_) => {
                ProbeOutcome::Unknown("exec and sleep actions do not use the network".into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn target(ip: &str) -> ProbeTarget<'_> {
        ProbeTarget {
            namespace: "ns",
            pod: "p",
            container: "c",
            container_id: "id",
            pod_ip: ip,
        }
    }

    async fn serve_once(status: &'static str) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = sock.read(&mut buf).await;
                let resp = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
                let _ = sock.write_all(resp.as_bytes()).await;
            }
        });
        port
    }

    #[tokio::test]
    async fn http_and_tcp_against_local_listeners() {
        let ok = serve_once("200 OK").await;
        let bad = serve_once("503 Service Unavailable").await;
        let probes = NetworkProbes::new();
        let get = |port| {
            Action::Http(HttpGet {
                https: false,
                host: None,
                port,
                path: "/healthz".into(),
                headers: vec![],
            })
        };
        let t = target("127.0.0.1");
        assert_eq!(
            probes.check(&t, &get(ok), Duration::from_secs(2)).await,
            ProbeOutcome::Success
        );
        assert_eq!(
            probes.check(&t, &get(bad), Duration::from_secs(2)).await,
            ProbeOutcome::Failure("HTTP probe failed with statuscode: 503".into())
        );
        let tcp = Action::Tcp { host: None, port: ok };
        assert_eq!(
            probes.check(&t, &tcp, Duration::from_secs(2)).await,
            ProbeOutcome::Success
        );
        // a port nobody listens on
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let refused = probes
            .check(
                &t,
                &Action::Tcp {
                    host: None,
                    port: closed,
                },
                Duration::from_secs(2),
            )
            .await;
        assert!(
            matches!(refused, ProbeOutcome::Failure(ref m) if m.starts_with("dial tcp 127.0.0.1:")),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn grpc_health_check_against_a_local_server() {
        use tonic_health::ServingStatus;
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter.set_service_status("", ServingStatus::Serving).await;
        reporter.set_service_status("db", ServingStatus::NotServing).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let incoming = futures::stream::unfold(listener, |l| async move {
            let conn = l.accept().await.map(|(s, _)| s);
            Some((conn, l))
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming),
        );
        let probes = NetworkProbes::new();
        let t = target("127.0.0.1");
        let check = |service: &str| Action::Grpc {
            port,
            service: service.into(),
        };
        assert_eq!(
            probes.check(&t, &check(""), Duration::from_secs(2)).await,
            ProbeOutcome::Success
        );
        let sick = probes.check(&t, &check("db"), Duration::from_secs(2)).await;
        assert!(
            matches!(sick, ProbeOutcome::Failure(ref m) if m.contains("NotServing")),
            "{sick:?}"
        );
    }
}
