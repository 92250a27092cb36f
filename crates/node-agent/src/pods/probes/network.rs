//! The real-mode probe transport: TCP connect, HTTP(S) GET (HTTP/1.1; status 200–399 passes; redirects
//! followed on the probe's host, one elsewhere a success with a warning, as the kubelet's; a server's
//! certificate not verified, as the kubelet's) and the gRPC health check, all against the pod IP unless the
//! action names a host.

use std::sync::Arc;
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

/// The most redirects a probe follows on its host, as the kubelet's probe client.
const MAX_REDIRECTS: usize = 10;
/// The most of a response body a probe reads (it shows in a warning).
const MAX_BODY: usize = 10 << 10;

/// Where one request of a probe goes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Url {
    https: bool,
    host: String,
    port: u16,
    /// Path and query.
    path: String,
}

impl Url {
    fn scheme(&self) -> &'static str {
        if self.https { "https" } else { "http" }
    }

    fn authority(&self) -> String {
        authority(&self.host, self.port)
    }

    fn display(&self) -> String {
        format!("{}://{}{}", self.scheme(), self.authority(), self.path)
    }

    /// The target of a `Location` header seen in answer to a request for `self`.
    fn join(&self, location: &str) -> Option<Url> {
        let uri: hyper::Uri = location.parse().ok()?;
        let path = uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
        if let (Some(scheme), Some(auth)) = (uri.scheme_str(), uri.authority()) {
            let https = scheme.eq_ignore_ascii_case("https");
            if !https && !scheme.eq_ignore_ascii_case("http") {
                return None;
            }
            let host = auth
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let port = auth.port_u16().unwrap_or(if https { 443 } else { 80 });
            return Some(Url {
                https,
                host,
                port,
                path,
            });
        }
        let path = if location.starts_with('/') {
            path
        } else {
            // relative to the current path's directory
            let dir = self.path.split('?').next().unwrap_or("/");
            let dir = &dir[..dir.rfind('/').map_or(0, |i| i + 1)];
            format!("{}{location}", if dir.is_empty() { "/" } else { dir })
        };
        Some(Url { path, ..self.clone() })
    }
}

/// Accepts any server certificate: the kubelet's HTTPS probes do not verify the container's certificate.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The TLS client of HTTPS probes (one per process: it holds no state of a probe).
fn tls() -> Result<tokio_rustls::TlsConnector, String> {
    static CONFIG: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>> =
        std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth();
            Ok(Arc::new(config))
        })
        .clone()
        .map(tokio_rustls::TlsConnector::from)
}

/// One GET of `url` (no redirect followed): the status, the `Location` header and the start of the body.
async fn get_once(
    url: &Url,
    get: &HttpGet,
    timeout: Duration,
) -> Result<(u16, Option<String>, String), String> {
    let stream = connect(&url.host, url.port, timeout).await?;
    let req = {
        let mut req = hyper::Request::get(url.path.as_str())
            .header(hyper::header::HOST, url.authority())
            .header(hyper::header::USER_AGENT, "kube-probe/1.36")
            .header(hyper::header::ACCEPT, "*/*")
            .header(hyper::header::CONNECTION, "close");
        for (k, v) in &get.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?
    };
    let resp = if url.https {
        let name = rustls::pki_types::ServerName::try_from(url.host.clone()).map_err(|e| e.to_string())?;
        let stream = tls()?.connect(name, stream).await.map_err(|e| e.to_string())?;
        send(stream, req).await?
    } else {
        send(stream, req).await?
    };
    let code = resp.status().as_u16();
    let location = resp
        .headers()
        .get(hyper::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut body = resp.into_body();
    let mut read = Vec::new();
    while read.len() < MAX_BODY {
        match http_body_util::BodyExt::frame(&mut body).await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    read.extend_from_slice(&data);
                }
            }
            // a body cut short still tells the status
            Some(Err(_)) | None => break,
        }
    }
    read.truncate(MAX_BODY);
    Ok((code, location, String::from_utf8_lossy(&read).into_owned()))
}

async fn send<S>(
    stream: S,
    req: hyper::Request<Empty<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    // the connection is driven while the body is read, and ends with the probe
    tokio::spawn(conn);
    sender.send_request(req).await.map_err(|e| e.to_string())
}

/// An HTTP(S) GET probe as the kubelet's: 200–399 passes; a redirect is followed while it stays on the probe's
/// host (at most 10), and a redirect elsewhere (or any other 3xx answer) passes with a warning.
async fn http(get: &HttpGet, target: &ProbeTarget<'_>, timeout: Duration) -> ProbeOutcome {
    let first = Url {
        https: get.https,
        host: host(get.host.as_deref(), target).to_owned(),
        port: get.port,
        path: get.path.clone(),
    };
    let work = async {
        let mut url = first.clone();
        let mut redirects = 0;
        loop {
            let (code, location, body) = get_once(&url, get, timeout).await?;
            let next = match code {
                301 | 302 | 303 | 307 | 308 => location.as_deref().and_then(|l| url.join(l)),
                _ => None,
            };
            match next {
                Some(next) if next.host == first.host => {
                    if redirects >= MAX_REDIRECTS {
                        return Err(format!("stopped after {MAX_REDIRECTS} redirects"));
                    }
                    redirects += 1;
                    url = next;
                }
                _ => return Ok((code, body)),
            }
        }
    };
    match tokio::time::timeout(timeout, work).await {
        Err(_) => ProbeOutcome::Failure(format!(
            "Get \"{}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
            first.display()
        )),
        Ok(Err(e)) => ProbeOutcome::Failure(format!("Get \"{}\": {e}", first.display())),
        Ok(Ok((code, body))) => match code {
            200..=299 => ProbeOutcome::Success,
            300..=399 => ProbeOutcome::Warning(format!("Probe terminated redirects, Response body: {body}")),
            _ => ProbeOutcome::Failure(format!("HTTP probe failed with statuscode: {code}")),
        },
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

    /// A listener answering every request with `response` (over TLS with a self-signed certificate when
    /// `tls`).
    async fn serve_raw(response: String, tls: bool) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let acceptor = tls.then(|| {
            let cert = rcgen::generate_simple_self_signed(vec!["probe.test".to_owned()]).unwrap();
            let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
            let config = rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap();
            tokio_rustls::TlsAcceptor::from(Arc::new(config))
        });
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let response = response.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    async fn answer<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
                        mut s: S,
                        response: &str,
                    ) {
                        let mut buf = [0u8; 1024];
                        let _ = s.read(&mut buf).await;
                        let _ = s.write_all(response.as_bytes()).await;
                        let _ = s.shutdown().await;
                    }
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
        port
    }

    fn get(https: bool, port: u16, path: &str) -> Action {
        Action::Http(HttpGet {
            https,
            host: None,
            port,
            path: path.into(),
            headers: vec![],
        })
    }

    #[tokio::test]
    async fn https_without_verifying_the_certificate() {
        let ok = serve_raw("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".into(), true).await;
        let probes = NetworkProbes::new();
        let t = target("127.0.0.1");
        assert_eq!(
            probes
                .check(&t, &get(true, ok, "/"), Duration::from_secs(5))
                .await,
            ProbeOutcome::Success
        );
        // plain HTTP against a TLS server fails, naming the URL
        let plain = probes
            .check(&t, &get(false, ok, "/"), Duration::from_secs(5))
            .await;
        assert!(
            matches!(plain, ProbeOutcome::Failure(ref m) if m.starts_with(&format!("Get \"http://127.0.0.1:{ok}/\""))),
            "{plain:?}"
        );
    }

    #[tokio::test]
    async fn redirects_on_the_host_are_followed_and_elsewhere_warned() {
        let ok = serve_raw("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".into(), false).await;
        let here = serve_raw(
            format!("HTTP/1.1 302 Found\r\nlocation: http://127.0.0.1:{ok}/ok\r\ncontent-length: 0\r\n\r\n"),
            false,
        )
        .await;
        let away = serve_raw(
            "HTTP/1.1 302 Found\r\nlocation: http://elsewhere.invalid/\r\ncontent-length: 5\r\n\r\nmoved"
                .into(),
            false,
        )
        .await;
        let looping = serve_raw(
            "HTTP/1.1 301 Moved Permanently\r\nlocation: /again\r\ncontent-length: 0\r\n\r\n".into(),
            false,
        )
        .await;
        async fn check(port: u16) -> ProbeOutcome {
            let t = target("127.0.0.1");
            NetworkProbes::new()
                .check(&t, &get(false, port, "/"), Duration::from_secs(5))
                .await
        }
        assert_eq!(check(here).await, ProbeOutcome::Success, "followed to a 200");
        assert_eq!(
            check(away).await,
            ProbeOutcome::Warning("Probe terminated redirects, Response body: moved".into())
        );
        let stopped = check(looping).await;
        assert!(
            matches!(stopped, ProbeOutcome::Failure(ref m) if m.ends_with("stopped after 10 redirects")),
            "{stopped:?}"
        );
    }

    #[test]
    fn locations_resolve_against_the_request() {
        let url = Url {
            https: false,
            host: "10.0.0.1".into(),
            port: 8080,
            path: "/a/b?x=1".into(),
        };
        assert_eq!(url.join("/c").unwrap().path, "/c");
        assert_eq!(url.join("c").unwrap().path, "/a/c");
        let abs = url.join("https://[fd00::1]:8443/d").unwrap();
        assert_eq!(
            (abs.https, abs.host.as_str(), abs.port, abs.path.as_str()),
            (true, "fd00::1", 8443, "/d")
        );
        assert_eq!(url.join("http://other/").unwrap().port, 80);
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
