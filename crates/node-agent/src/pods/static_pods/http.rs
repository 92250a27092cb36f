//! The URL source: `staticPodURL` fetched at start and every `httpCheckFrequency` with the
//! `staticPodURLHeader` headers. The body is one Pod or a PodList (YAML or JSON). A failed fetch or an
//! unusable body is reported (naming the URL and the field) and keeps the previous set running; pods of a
//! list are all or nothing, as with the kubelet. Only `http://` URLs are supported (the configuration refuses
//! others).

use std::collections::BTreeMap;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use k8s_openapi::api::core::v1::Pod;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::pods::static_pods::manifest::{self, Origin};
use crate::pods::static_pods::{Problems, StaticUpdate};

const MAX_BODY_BYTES: usize = 10 << 20;
const TIMEOUT: Duration = Duration::from_secs(10);

async fn get(url: &str, headers: &BTreeMap<String, Vec<String>>) -> Result<String, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("invalid URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err("only http:// URLs are supported".into());
    }
    let host = uri.host().ok_or("URL without a host")?;
    let port = uri.port_u16().unwrap_or(80);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let authority = uri.authority().map(|a| a.as_str().to_owned()).unwrap_or_default();
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    let mut req = hyper::Request::get(path).header(hyper::header::HOST, authority);
    for (name, values) in headers {
        for v in values {
            req = req.header(name.as_str(), v.as_str());
        }
    }
    let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
    let result = async {
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("{status}"));
        }
        String::from_utf8(body.to_vec()).map_err(|_| "body is not UTF-8".to_owned())
    }
    .await;
    driver.abort();
    result
}

/// The pods served at `url` now.
pub(crate) async fn fetch(
    url: &str,
    headers: &BTreeMap<String, Vec<String>>,
    node: &str,
) -> Result<Vec<Pod>, String> {
    let text = tokio::time::timeout(TIMEOUT, get(url, headers))
        .await
        .map_err(|_| format!("no answer within {TIMEOUT:?}"))??;
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let pods = manifest::decode(&text, true).map_err(|e| e.to_string())?;
    pods.into_iter()
        .map(|p| manifest::prepare(p, Origin::Http(url), node).map_err(|e| e.to_string()))
        .collect()
}

/// Fetches `url` now and every `period`, sending each set to `tx`, until `cancel` fires.
pub(crate) async fn run(
    url: String,
    headers: BTreeMap<String, Vec<String>>,
    node: String,
    period: Duration,
    tx: mpsc::Sender<StaticUpdate>,
    problems: Problems,
    cancel: CancellationToken,
) {
    let source = format!("http:{url}");
    let mut last_error: Option<String> = None;
    loop {
        let pods = match fetch(&url, &headers, &node).await {
            Ok(pods) => {
                last_error = None;
                Some(pods)
            }
            Err(error) => {
                if last_error.as_ref() != Some(&error) {
                    problems.report(&url, &error);
                }
                last_error = Some(error);
                None
            }
        };
        let update = StaticUpdate {
            source: source.clone(),
            pods,
        };
        if tx.send(update).await.is_err() {
            return;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            () = tokio::time::sleep(crate::backoff::jittered(period, 0.1)) => {}
        }
    }
}
