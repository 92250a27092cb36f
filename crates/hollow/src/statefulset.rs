//! What a fleet process needs when it runs as one pod of a StatefulSet (the Helm chart in `charts/hollow`):
//!
//! * [`client_config`] — the API client configuration from a kubeconfig, or the pod's service account, with an
//!   explicit API server URL when the cluster's Service address is not reachable from the pod (a loopback-only
//!   machine, a fleet pod on the host network);
//! * [`ProcessPorts`] — the ports of process number N when several processes share one network namespace
//!   (`hostNetwork`): each gets its own metrics port and its own block of kubelet ports;
//! * [`healthz`] — the readiness check run inside the container (`hollow healthz`), for when the probe's port
//!   differs per pod and an HTTP probe cannot name it;
//! * [`stop_statefulset`] — scale the fleet to zero and wait for its pods to be gone (`hollow stop-fleet`, the
//!   chart's pre-delete hook), so the processes delete their nodes while their credentials still exist.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum StatefulSetError {
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No kubeconfig was given and the pod's service account could not be read.
    #[error("in-cluster configuration (the pod's service account): {0}")]
    InCluster(#[source] kube::config::InClusterError),
    /// Neither `KUBECONFIG` nor an in-cluster configuration could be loaded.
    #[error("no kubeconfig given: {0}")]
    Infer(#[source] kube::config::InferConfigError),
    /// `--server` is not a URL.
    #[error("--server {url:?}: {message}")]
    Server {
        /// What was given.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// A port past 65535.
    #[error("process {index}: {what} port {base} + {offset} is past 65535")]
    Port {
        /// The process index.
        index: u32,
        /// Which port.
        what: &'static str,
        /// The configured base.
        base: u16,
        /// The offset this process adds.
        offset: u64,
    },
    /// The health endpoint could not be reached or did not answer 200.
    #[error("GET http://{address}/healthz: {message}")]
    Health {
        /// Where.
        address: SocketAddr,
        /// What happened.
        message: String,
    },
    /// An API request failed.
    #[error("{what}: {source}")]
    Api {
        /// The request.
        what: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The StatefulSet's pods were still there when the time was up.
    #[error("statefulset {namespace}/{name}: {pods} pods still there after {waited:?}")]
    Timeout {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Pods left.
        pods: usize,
        /// How long we waited.
        waited: Duration,
    },
}

/// The API client configuration: `kubeconfig` when given, else the pod's service account (token and CA under
/// `/var/run/secrets/kubernetes.io/serviceaccount`, server from `KUBERNETES_SERVICE_HOST`/`_PORT`, or
/// `KUBECONFIG` when set). `server`, when given, replaces the configuration's API server URL — the identity
/// and CA stay — for pods that reach the API server at another address than the cluster's Service.
pub async fn client_config(
    kubeconfig: Option<&Path>,
    server: Option<&str>,
) -> Result<kube::Config, StatefulSetError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let err = |source| StatefulSetError::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(err)?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(err)?
        }
        // with an explicit server the Service environment is not needed: only the token and CA are
        None if server.is_some() => kube::Config::incluster_dns().map_err(StatefulSetError::InCluster)?,
        None => kube::Config::infer().await.map_err(StatefulSetError::Infer)?,
    };
    if let Some(url) = server {
        let bad = |message: &str| StatefulSetError::Server {
            url: url.to_owned(),
            message: message.to_owned(),
        };
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
        if uri.scheme_str() != Some("https") && uri.scheme_str() != Some("http") {
            return Err(bad("expected https://HOST[:PORT]"));
        }
        if uri.host().is_none() {
            return Err(bad("no host"));
        }
        config.cluster_url = uri;
    }
    Ok(config)
}

/// The ports of one fleet process among several sharing a network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessPorts {
    /// Where `/healthz` and `/metrics` are served.
    pub metrics: SocketAddr,
    /// The first kubelet port of this process's nodes (node `i` publishes `kubelet + i`).
    pub kubelet: u16,
}

impl ProcessPorts {
    /// Process `index` of a fleet whose processes each run `nodes` nodes: metrics port `metrics + index`, kubelet
    /// ports from `kubelet + index × nodes`, so no two processes on one address bind or publish the same port.
    /// Index 0 keeps the ports as given.
    pub fn of(index: u32, metrics: SocketAddr, kubelet: u16, nodes: usize) -> Result<Self, StatefulSetError> {
        let add = |what, base: u16, offset: u64| {
            u16::try_from(u64::from(base) + offset).map_err(|_| StatefulSetError::Port {
                index,
                what,
                base,
                offset,
            })
        };
        let metrics_port = add("metrics", metrics.port(), u64::from(index))?;
        let kubelet = add("kubelet", kubelet, u64::from(index) * nodes as u64)?;
        Ok(Self {
            metrics: SocketAddr::new(metrics.ip(), metrics_port),
            kubelet,
        })
    }
}

/// `GET /healthz` on `address` (plain HTTP/1.0, one connection, `timeout` for each step); Ok when it answers 200.
pub fn healthz(address: SocketAddr, timeout: Duration) -> Result<(), StatefulSetError> {
    let fail = |message: String| StatefulSetError::Health { address, message };
    let mut stream = TcpStream::connect_timeout(&address, timeout).map_err(|e| fail(e.to_string()))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| fail(e.to_string()))?;
    stream
        .write_all(format!("GET /healthz HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
        .map_err(|e| fail(e.to_string()))?;
    let mut answer = Vec::new();
    stream
        .take(4096)
        .read_to_end(&mut answer)
        .map_err(|e| fail(e.to_string()))?;
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) == Some("200") {
        Ok(())
    } else {
        Err(fail(format!("answered {status:?}")))
    }
}

/// Scales the StatefulSet `namespace/name` to zero replicas and waits up to `timeout` until none of its pods is
/// left (each fleet process stops on SIGTERM, deleting its Node objects when told to). A StatefulSet that does
/// not exist is nothing to stop.
pub async fn stop_statefulset(
    client: kube::Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<(), StatefulSetError> {
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
    let api_err = |what: String| move |source| StatefulSetError::Api { what, source };
    let Some(set) = sets
        .get_opt(name)
        .await
        .map_err(api_err(format!("get statefulset {namespace}/{name}")))?
    else {
        tracing::info!(namespace, name, "no such statefulset: nothing to stop");
        return Ok(());
    };
    let selector = set
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
        .map(|labels| {
            labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    sets.patch_scale(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
    )
    .await
    .map_err(api_err(format!("scale statefulset {namespace}/{name} to 0")))?;
    tracing::info!(
        namespace,
        name,
        "scaled to 0; waiting for the fleet's pods to stop"
    );
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    let params = ListParams::default().labels(&selector);
    let started = tokio::time::Instant::now();
    loop {
        let left = pods
            .list_metadata(&params)
            .await
            .map_err(api_err(format!("list pods {selector} in {namespace}")))?
            .items
            .len();
        if left == 0 {
            tracing::info!(namespace, name, took = ?started.elapsed(), "the fleet's pods are gone");
            return Ok(());
        }
        if started.elapsed() >= timeout {
            return Err(StatefulSetError::Timeout {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                pods: left,
                waited: timeout,
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_ports_step_by_index_and_fleet_size() {
        let metrics: SocketAddr = "127.0.0.1:9090".parse().expect("address");
        let p0 = ProcessPorts::of(0, metrics, 10250, 50).expect("index 0");
        assert_eq!((p0.metrics.port(), p0.kubelet), (9090, 10250));
        let p2 = ProcessPorts::of(2, metrics, 10250, 50).expect("index 2");
        assert_eq!((p2.metrics.port(), p2.kubelet), (9092, 10350));
        assert_eq!(p2.metrics.ip(), metrics.ip());
        let err = ProcessPorts::of(2000, metrics, 10250, 50).expect_err("past 65535");
        assert!(err.to_string().contains("kubelet port 10250 + 100000"), "{err}");
    }

    #[tokio::test]
    async fn server_replaces_the_kubeconfig_url_and_keeps_the_identity() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kc = dir.path().join("kubeconfig");
        std::fs::write(
            &kc,
            "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://10.96.0.1:443'}}]\n\
             users: [{name: u, user: {token: abc}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n\
             current-context: x\n",
        )
        .expect("write");
        let config = client_config(Some(&kc), Some("https://127.0.0.1:6443"))
            .await
            .expect("config");
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert!(config.auth_info.token.is_some());
        let err = client_config(Some(&kc), Some("127.0.0.1:6443"))
            .await
            .expect_err("no scheme");
        assert!(err.to_string().contains("--server \"127.0.0.1:6443\""), "{err}");
    }

    #[test]
    fn healthz_reads_the_status_line() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("addr");
        let server = std::thread::spawn(move || {
            for answer in [
                "HTTP/1.1 200 OK\r\n\r\nok",
                "HTTP/1.1 503 Service Unavailable\r\n\r\n",
            ] {
                let (mut s, _) = listener.accept().expect("accept");
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf);
                s.write_all(answer.as_bytes()).expect("write");
            }
        });
        healthz(address, Duration::from_secs(5)).expect("200 is healthy");
        let err = healthz(address, Duration::from_secs(5)).expect_err("503 is not");
        assert!(err.to_string().contains("503"), "{err}");
        server.join().expect("server");
    }
}
