//! The kubelet API's authorization matrix on a hollow node (the same authenticator, authorizer and routes as
//! node-agent's, without a runtime to start): every path the kubelet serves × every kind of caller, each answer
//! checked against what the kubelet answers. The kubelet maps a path to the `nodes` subresources it checks
//! (`/stats/` stats, `/metrics` metrics, `/logs/` log, `/checkpoint/` checkpoint, `/statusz` statusz, `/flagz`
//! configz, else proxy; `/pods`, `/runningpods/`, `/healthz`, `/configz` first their own fine-grained one), the
//! HTTP method to the verb (GET get, POST create), and asks the API server one SubjectAccessReview per
//! subresource; an unauthenticated caller is refused before any of that — and so is a caller whose client
//! certificate does not verify (another CA's, an expired one), unless its bearer token authenticates: the
//! kubelet's TLS takes any client certificate, its x509 authenticator then fails the request, and the token
//! authenticator is the one left to succeed. Paths the kubelet serves and node-agent
//! does not (`/runningpods/`, `/logs/`, `/metrics/cadvisor`, `/checkpoint/`, `/statusz`, `/flagz`,
//! `/debug/pprof/`) are checked the same way and then answered 404.

use std::sync::Arc;
use std::time::Duration;

use e2e::wait_for;
use hollow::client_pool::{ClientPool, PoolLimits, PoolSize};
use hollow::fleet::{Fleet, FleetSpec, KubeletApi};
use hollow::profiles;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::PostParams;
use node_agent::pods::PodMetrics;
use node_agent::{KubeletConfig, Metrics};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{HttpsClient, free_port_range, https, service_account_token};

const NS: &str = "default";
const NODE: &str = "authz-0";
const POD: &str = "authz-pod";

/// A path of the kubelet API, how it is called, and whether a caller allowed through answers 200 here.
struct Path {
    method: &'static str,
    path: &'static str,
    /// The `nodes` subresources the kubelet checks for it, in order.
    subresources: &'static [&'static str],
    /// What an allowed caller gets: 200, or for a stream without its upgrade 400, or 404 where node-agent does
    /// not serve the path.
    allowed: u16,
}

const PATHS: &[Path] = &[
    Path {
        method: "GET",
        path: "/healthz",
        subresources: &["healthz", "proxy"],
        allowed: 200,
    },
    Path {
        method: "GET",
        path: "/pods",
        subresources: &["pods", "proxy"],
        allowed: 200,
    },
    Path {
        method: "GET",
        path: "/configz",
        subresources: &["configz", "proxy"],
        allowed: 200,
    },
    Path {
        method: "GET",
        path: "/metrics",
        subresources: &["metrics"],
        allowed: 200,
    },
    Path {
        method: "GET",
        path: "/metrics/resource",
        subresources: &["metrics"],
        allowed: 200,
    },
    Path {
        method: "GET",
        path: "/metrics/probes",
        subresources: &["metrics"],
        allowed: 200,
    },
    Path {
        method: "GET",
        path: "/stats/summary",
        subresources: &["stats"],
        allowed: 200,
    },
    Path {
        method: "GET",
        path: "/containerLogs/default/authz-pod/app",
        subresources: &["proxy"],
        allowed: 200,
    },
    Path {
        method: "POST",
        path: "/exec/default/authz-pod/app?command=true&output=1",
        subresources: &["proxy"],
        allowed: 400,
    },
    Path {
        method: "POST",
        path: "/attach/default/authz-pod/app?output=1",
        subresources: &["proxy"],
        // the hollow node's runtime has no attach
        allowed: 501,
    },
    Path {
        method: "POST",
        path: "/portForward/default/authz-pod",
        subresources: &["proxy"],
        // nor port forwarding
        allowed: 501,
    },
    Path {
        method: "POST",
        path: "/run/default/authz-pod/app?cmd=true",
        subresources: &["proxy"],
        allowed: 200,
    },
    Path {
        method: "GET",
        path: "/runningpods/",
        subresources: &["pods", "proxy"],
        allowed: 404,
    },
    Path {
        method: "GET",
        path: "/logs/",
        subresources: &["log"],
        allowed: 404,
    },
    Path {
        method: "GET",
        path: "/metrics/cadvisor",
        subresources: &["metrics"],
        allowed: 404,
    },
    Path {
        method: "POST",
        path: "/checkpoint/default/authz-pod/app",
        subresources: &["checkpoint"],
        allowed: 404,
    },
    Path {
        method: "GET",
        path: "/statusz",
        subresources: &["statusz"],
        allowed: 404,
    },
    Path {
        method: "GET",
        path: "/flagz",
        subresources: &["configz"],
        allowed: 404,
    },
    Path {
        method: "GET",
        path: "/debug/pprof/",
        subresources: &["proxy"],
        allowed: 404,
    },
];

/// A caller: its client (certificate or none), its bearer token, and what RBAC grants it on `nodes/*`.
struct Caller {
    name: &'static str,
    client: HttpsClient,
    token: Option<String>,
    /// None: not authenticated (401 everywhere); else the (verb, subresource) pairs it is granted, `*` for all.
    grants: Option<Vec<(&'static str, &'static str)>>,
}

impl Caller {
    /// The status the kubelet answers this caller on `path`.
    fn expected(&self, path: &Path) -> u16 {
        let Some(grants) = &self.grants else { return 401 };
        let verb = if path.method == "POST" { "create" } else { "get" };
        let allowed = path.subresources.iter().any(|s| {
            grants
                .iter()
                .any(|(v, g)| (*g == "*" || g == s) && (*v == "*" || *v == verb))
        });
        if allowed { path.allowed } else { 403 }
    }
}

async fn call(caller: &Caller, port: u16, path: &Path) -> anyhow::Result<(u16, String)> {
    let mut req = http::Request::builder()
        .method(path.method)
        .uri(format!("https://127.0.0.1:{port}{}", path.path));
    if let Some(token) = &caller.token {
        req = req.header("Authorization", format!("Bearer {token}"));
    }
    let resp = caller.client.request(req.body(String::new())?).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A ClusterRole granting `rules` on `nodes/<subresource>` bound to service account `account`.
async fn grant(client: &kube::Client, account: &str, rules: &[(&str, &str)]) -> anyhow::Result<()> {
    let name = format!("kubelet-authz-{account}");
    let rules: Vec<serde_json::Value> = rules
        .iter()
        .map(|(verb, sub)| json!({"apiGroups": [""], "resources": [format!("nodes/{sub}")], "verbs": [verb]}))
        .collect();
    let role: ClusterRole = serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules}))?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NS}],
    }))?;
    for r in [
        Api::<ClusterRole>::all(client.clone())
            .create(&PostParams::default(), &role)
            .await
            .map(|_| ()),
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .map(|_| ()),
    ] {
        match r {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_path_and_caller_gets_the_kubelets_answer() -> anyhow::Result<()> {
    e2e::init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    let port = free_port_range(1)?;
    let (cert, key) = cp.kubelet_serving_certificate("hollow-authz")?;
    let defaults = KubeletConfig::default();
    // no decision cache: each request asks the API server, so a binding made just now is seen once it applies
    let kubelet = KubeletConfig {
        tls_cert_file: Some(cert),
        tls_private_key_file: Some(key),
        authentication: node_agent::config::Authentication {
            client_ca_file: Some(cp.client_ca_file()),
            ..defaults.authentication.clone()
        },
        authorization: node_agent::config::Authorization {
            cache_authorized_ttl: Duration::ZERO,
            cache_unauthorized_ttl: Duration::ZERO,
            ..defaults.authorization.clone()
        },
        ..defaults
    };
    assert!(
        !kubelet.authentication.anonymous_enabled && kubelet.read_only_port == 0,
        "the kubelet's defaults: no anonymous requests, no read-only port"
    );
    let spec = FleetSpec {
        kubelet_port: port,
        kubelet,
        kubelet_api: Some(KubeletApi {
            registry: Some(Arc::new(Registry::default())),
        }),
        ..FleetSpec::new(1, "authz-{index}", profiles::default_profiles())?
    };
    let pool = ClientPool::new(
        &cp.admin_config().await?,
        PoolSize::for_fleet(1, true, PoolLimits::default()),
    )?;
    let token = CancellationToken::new();
    let fleet = Fleet::start(
        &spec,
        &pool,
        Arc::new(Metrics::unregistered()),
        Arc::new(PodMetrics::new()),
        token.clone(),
    )
    .await?;

    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": POD, "annotations": {"cri-fake.node-agent.io/logs": "a line"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    wait_for(&format!("{POD} Running"), Duration::from_secs(60), || async {
        let pod = pods.get(POD).await?;
        Ok((pod.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
    })
    .await?;

    // the callers
    let other_ca = testenv::pki::Ca::generate("another-cluster")?;
    let foreign = other_ca.issue(&testenv::pki::CertSpec::client(
        "system:node:authz-0",
        &["system:nodes"],
    ))?;
    let pki = cp.dir().join("pki");
    let cluster_ca = testenv::pki::Ca::from_pem(testenv::pki::Pem {
        cert: std::fs::read_to_string(pki.join("ca.crt"))?,
        key: std::fs::read_to_string(pki.join("ca.key"))?,
    });
    let expired = cluster_ca.issue(&testenv::pki::CertSpec {
        expired: true,
        ..testenv::pki::CertSpec::client("system:node:authz-0", &["system:nodes"])
    })?;
    let apiserver = testenv::pki::Pem {
        cert: std::fs::read_to_string(pki.join("apiserver-kubelet-client.crt"))?,
        key: std::fs::read_to_string(pki.join("apiserver-kubelet-client.key"))?,
    };
    let granted: &[(&str, &[(&str, &str)])] = &[
        ("authz-proxy", &[("get", "proxy"), ("create", "proxy")]),
        ("authz-proxy-get", &[("get", "proxy")]),
        ("authz-stats", &[("get", "stats")]),
        ("authz-metrics", &[("get", "metrics")]),
        ("authz-log", &[("get", "log")]),
        (
            "authz-fine",
            &[("get", "pods"), ("get", "healthz"), ("get", "configz")],
        ),
    ];
    let mut callers = vec![
        Caller {
            name: "anonymous",
            client: https(cp, None)?,
            token: None,
            grants: None,
        },
        Caller {
            name: "a bad token",
            client: https(cp, None)?,
            token: Some("not-a-token".into()),
            grants: None,
        },
        Caller {
            name: "another node's certificate",
            client: https(
                cp,
                Some(&cp.client_certificate("system:node:authz-other", &["system:nodes"])?),
            )?,
            token: None,
            grants: Some(vec![]),
        },
        Caller {
            name: "a certificate of another CA",
            client: https(cp, Some(&foreign))?,
            token: None,
            grants: None,
        },
        Caller {
            name: "an expired certificate of the cluster CA",
            client: https(cp, Some(&expired))?,
            token: None,
            grants: None,
        },
        Caller {
            name: "a service account without rights",
            client: https(cp, None)?,
            token: Some(service_account_token(&admin, "authz-none").await?),
            grants: Some(vec![]),
        },
    ];
    for (account, rules) in granted {
        grant(&admin, account, rules).await?;
        callers.push(Caller {
            name: account,
            client: https(cp, None)?,
            token: Some(service_account_token(&admin, account).await?),
            grants: Some(rules.to_vec()),
        });
    }
    // a certificate that does not verify leaves the request to its token
    let (account, rules) = granted[0];
    callers.push(Caller {
        name: "another CA's certificate with authz-proxy's token",
        client: https(cp, Some(&foreign))?,
        token: Some(service_account_token(&admin, account).await?),
        grants: Some(rules.to_vec()),
    });
    callers.push(Caller {
        name: "the API server's client (kube-apiserver-kubelet-client)",
        client: https(cp, Some(&apiserver))?,
        token: None,
        grants: Some(vec![("*", "*")]),
    });

    // RBAC applies a little after the bindings are made: wait until each granted caller is let through once
    for caller in callers
        .iter()
        .filter(|c| c.grants.as_ref().is_some_and(|g| !g.is_empty()))
    {
        let probe = PATHS
            .iter()
            .find(|p| caller.expected(p) != 403)
            .expect("a path the caller may call");
        wait_for(
            &format!("RBAC for {}", caller.name),
            Duration::from_secs(30),
            || async {
                Ok(call(caller, port, probe)
                    .await
                    .ok()
                    .filter(|(s, _)| *s != 403)
                    .map(|_| ()))
            },
        )
        .await?;
    }

    let t0 = std::time::Instant::now();
    let mut wrong = Vec::new();
    let mut cells = 0;
    println!("[authz] answers (expected in brackets where different):");
    for caller in &callers {
        let mut row = Vec::new();
        for path in PATHS {
            let want = caller.expected(path).to_string();
            let got = match call(caller, port, path).await {
                Ok((status, body)) => {
                    if status == 403 && !body.contains("resource=nodes") {
                        wrong.push(format!(
                            "{} {} {}: 403 without the kubelet's reason: {body}",
                            caller.name, path.method, path.path
                        ));
                    }
                    status.to_string()
                }
                Err(e) => format!("error: {e}"),
            };
            cells += 1;
            if got != want {
                wrong.push(format!(
                    "{} {} {}: {got}, the kubelet answers {want}",
                    caller.name, path.method, path.path
                ));
                row.push(format!("{got}[{want}]"));
            } else {
                row.push(got);
            }
        }
        println!("[authz] {:<55} {}", caller.name, row.join(" "));
    }
    println!(
        "[authz] paths: {}",
        PATHS
            .iter()
            .map(|p| format!("{} {}", p.method, p.path))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("[authz] {cells} answers in {:.2} s", t0.elapsed().as_secs_f64());
    fleet.stop(Duration::from_secs(10)).await;
    token.cancel();
    assert!(
        wrong.is_empty(),
        "answers unlike the kubelet's:\n{}",
        wrong.join("\n")
    );
    Ok(())
}
