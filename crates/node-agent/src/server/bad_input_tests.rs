//! Generated bad input for the kubelet API: random paths (the API's own words, in random order and number,
//! percent-encoded, with dot segments) and random queries on every path of the secure port, and random query
//! values for `containerLogs` and the streaming paths. Nothing panics, every request is answered within 5 s,
//! every refusal or failure says why in its body, and a refusal of a query names the parameter at fault.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::Request;
use proptest::prelude::*;
use tower::ServiceExt;

use super::logs::LogOptions;
use super::stream_options::{StreamOptions, form_pairs};
use super::{KubeletConfig, Shared, routes};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A path segment: one of the API's words, a name, or something odd.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "containerLogs",
            "exec",
            "attach",
            "portForward",
            "run",
            "pods",
            "runningpods",
            "stats",
            "summary",
            "metrics",
            "resource",
            "cadvisor",
            "probes",
            "healthz",
            "configz",
            "logs",
            "debug",
            "checkpoint",
            "spec",
            "default",
            "kube-system",
            "web",
            "app",
            "..",
            ".",
            "",
        ])
        .prop_map(str::to_owned),
        "[a-z0-9-]{1,12}",
        "(%[0-9A-Fa-f]{2}|%|%G|[a-z]){1,6}",
    ]
}

fn query() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "follow",
        "timestamps",
        "previous",
        "tailLines",
        "limitBytes",
        "sinceSeconds",
        "sinceTime",
        "command",
        "stdin",
        "stdout",
        "stderr",
        "tty",
        "input",
        "output",
        "error",
        "only_cpu_and_memory",
        "x",
    ]);
    let value = prop_oneof![
        "-?[0-9]{1,20}",
        "(true|false|1|0|yes|T)",
        "2026-12-06T21:[0-9]{2}:00Z",
        "[a-zA-Z0-9%+=&]{0,10}",
    ];
    prop::collection::vec((key, value), 0..5).prop_map(|kv| {
        kv.into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&")
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_path_and_query_is_answered(
        segments in prop::collection::vec(segment(), 1..7),
        q in query(),
        post in any::<bool>(),
    ) {
        let uri = format!("/{}{}", segments.join("/"), if q.is_empty() { String::new() } else { format!("?{q}") });
        let method = if post { "POST" } else { "GET" };
        let Ok(req) = Request::builder().method(method).uri(&uri).body(Body::empty()) else {
            // not a URI at all: hyper refuses it before any handler sees it
            return Ok(());
        };
        let rt = runtime();
        let answered = rt.block_on(async {
            let node = super::tests::endpoint();
            let shared = Arc::new(Shared { kubelet: Arc::new(KubeletConfig::default()), registry: None });
            let mut req = req;
            req.extensions_mut().insert(node);
            tokio::time::timeout(Duration::from_secs(5), async {
                let resp = routes::full(shared).oneshot(req).await.unwrap_or_else(|never| match never {});
                let status = resp.status();
                let body = http_body_util::BodyExt::collect(resp.into_body()).await.map(|b| b.to_bytes());
                (status, body)
            })
            .await
        });
        let (status, body) = answered.map_err(|_| TestCaseError::fail(format!("{method} {uri}: no answer in 5 s")))?;
        // a refusal or a failure says why (the router's own 404 and 405 excepted: the path or method is the why)
        let said = body.map(|b| !b.is_empty()).unwrap_or(false);
        prop_assert!(
            status.is_success() || status == http::StatusCode::NOT_FOUND || status == http::StatusCode::METHOD_NOT_ALLOWED || said,
            "{method} {uri}: {status} with no word of why"
        );
    }

    #[test]
    fn log_queries_are_taken_or_refused_by_name(
        pairs in prop::collection::vec((
            prop::sample::select(vec!["follow", "timestamps", "previous", "tailLines", "limitBytes", "sinceSeconds", "sinceTime"]),
            prop_oneof!["-?[0-9]{1,22}", "(true|false|1|0|yes)", "2026-12-06T21:[0-9]{2}:00(Z|\\+01:00)?", "\\PC{0,8}"],
        ), 1..4),
    ) {
        let q: HashMap<String, String> = pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        let now = time::OffsetDateTime::now_utc();
        if let Err((status, message)) = LogOptions::from_query(&q, now) {
            prop_assert!(status.is_client_error(), "{status}");
            prop_assert!(q.keys().any(|k| message.contains(k.as_str())), "{q:?}: {message}");
        }
    }

    #[test]
    fn stream_queries_never_panic(q in "\\PC{0,60}") {
        let _ = form_pairs(&q);
        if let Err(message) = StreamOptions::from_query(Some(&q)) {
            prop_assert!(message.contains("stdin, stdout, stderr"), "{message}");
        }
    }
}
