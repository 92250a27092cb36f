//! The status manager against a scripted API server: writes only on change, the UID precondition, retries,
//! the final delete.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use k8s_openapi::api::core::v1::PodStatus;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::api::ApiCalls;
use crate::metrics::Metrics;
use crate::pods::metrics::PodMetrics;
use crate::pods::status::manager::StatusManager;
use crate::pods::status::{StatusHandle, StatusMsg};

type Log = Arc<Mutex<Vec<(String, String, Value)>>>;

/// Requests being answered right now, and the most seen at once.
#[derive(Default)]
struct Load {
    now: usize,
    peak: usize,
}

/// A client whose API server records every request, takes `delay` to answer, and answers 500 to the first
/// `fail` PATCHes.
fn scripted(fail: usize) -> (kube::Client, Log) {
    let (client, log, _) = scripted_slow(fail, Duration::ZERO);
    (client, log)
}

fn scripted_slow(fail: usize, delay: Duration) -> (kube::Client, Log, Arc<Mutex<Load>>) {
    let log: Log = Arc::default();
    let load: Arc<Mutex<Load>> = Arc::default();
    let (seen, busy) = (log.clone(), load.clone());
    let failures = Arc::new(Mutex::new(fail));
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (seen, failures, busy) = (seen.clone(), failures.clone(), busy.clone());
        async move {
            {
                let mut l = busy.lock().unwrap();
                l.now += 1;
                l.peak = l.peak.max(l.now);
            }
            tokio::time::sleep(delay).await;
            busy.lock().unwrap().now -= 1;
            let (parts, body) = req.into_parts();
            let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            seen.lock()
                .unwrap()
                .push((parts.method.to_string(), parts.uri.path().to_owned(), value));
            let mut left = failures.lock().unwrap();
            let (code, body) = if parts.method == http::Method::PATCH && *left > 0 {
                *left -= 1;
                (
                    500,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500, "message": "boom"}),
                )
            } else {
                (
                    200,
                    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}}),
                )
            };
            let resp = http::Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body.to_string())))
                .unwrap();
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    (kube::Client::new(service, "default"), log, load)
}

fn status(phase: &str) -> Box<PodStatus> {
    Box::new(
        serde_json::from_value(json!({"phase": phase, "podIP": "10.0.0.9", "podIPs": [{"ip": "10.0.0.9"}]}))
            .unwrap(),
    )
}

fn set(phase: &str) -> StatusMsg {
    StatusMsg::Set {
        uid: "u1".into(),
        namespace: "ns".into(),
        name: "p".into(),
        status: status(phase),
        timeline: None,
    }
}

fn start(fail: usize) -> (StatusHandle, Log, CancellationToken) {
    let (client, log) = scripted(fail);
    let (handle, cancel) = start_with(client);
    (handle, log, cancel)
}

fn start_with(client: kube::Client) -> (StatusHandle, CancellationToken) {
    let (handle, rx) = StatusHandle::channel();
    let api = ApiCalls::new(Arc::new(Metrics::unregistered()), 0, 0);
    let cancel = CancellationToken::new();
    tokio::spawn(
        StatusManager::new(client, api, rx, Arc::new(PodMetrics::new()), Default::default())
            .run(cancel.clone()),
    );
    (handle, cancel)
}

#[tokio::test(start_paused = true)]
async fn writes_only_changes_with_the_uid_precondition_then_deletes() {
    let (handle, log, cancel) = start(0);
    // what the API server already holds is not written again
    handle.send(StatusMsg::Seed {
        uid: "u1".into(),
        status: status("Pending"),
    });
    handle.send(set("Pending"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(log.lock().unwrap().is_empty());

    handle.send(set("Running"));
    handle.send(set("Running"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    handle.send(set("Running"));
    handle.send(StatusMsg::Delete {
        uid: "u1".into(),
        namespace: "ns".into(),
        name: "p".into(),
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 2, "{log:#?}");
    let (method, path, body) = &log[0];
    assert_eq!(
        (method.as_str(), path.as_str()),
        ("PATCH", "/api/v1/namespaces/ns/pods/p/status")
    );
    assert_eq!(body["metadata"]["uid"], "u1");
    assert_eq!(body["status"]["phase"], "Running");
    assert_eq!(body["status"]["podIPs"][0]["$patch"], "replace");
    let (method, path, body) = &log[1];
    assert_eq!(
        (method.as_str(), path.as_str()),
        ("DELETE", "/api/v1/namespaces/ns/pods/p")
    );
    assert_eq!(body["gracePeriodSeconds"], 0);
    assert_eq!(body["preconditions"]["uid"], "u1");
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn failed_writes_are_retried_with_back_off() {
    let (handle, log, cancel) = start(2);
    handle.send(set("Running"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(log.lock().unwrap().len(), 1);
    // 100 ms, then 200 ms (jittered by up to 10 %)
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(log.lock().unwrap().len(), 3, "two retries, the last one succeeds");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(log.lock().unwrap().len(), 3, "nothing more once written");
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn writes_several_pods_at_once_but_one_pod_at_a_time() {
    let (client, log, load) = scripted_slow(0, Duration::from_millis(100));
    let (handle, cancel) = start_with(client);
    for i in 0..8 {
        let uid = format!("u{i}");
        handle.send(StatusMsg::Set {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("p{i}"),
            status: status("Pending"),
            timeline: None,
        });
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    // while p0's first write is in flight, two more updates of p0 arrive: they become one more write
    handle.send(StatusMsg::Set {
        uid: "u0".into(),
        namespace: "ns".into(),
        name: "p0".into(),
        status: status("Running"),
        timeline: None,
    });
    handle.send(StatusMsg::Set {
        uid: "u0".into(),
        namespace: "ns".into(),
        name: "p0".into(),
        status: status("Failed"),
        timeline: None,
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(load.lock().unwrap().peak, crate::pods::status::manager::IN_FLIGHT);
    let log = log.lock().unwrap().clone();
    let p0: Vec<&Value> = log
        .iter()
        .filter(|(_, path, _)| path.ends_with("/p0/status"))
        .map(|(_, _, b)| b)
        .collect();
    assert_eq!(p0.len(), 2, "first write, then the latest update only");
    assert_eq!(p0[1]["status"]["phase"], "Failed");
    assert_eq!(log.len(), 9);
    cancel.cancel();
}

/// The status manager's task lives as long as the node, idle most of the time: its writes in flight and
/// its retry timer are boxed, so the task holds little beyond its own state.
#[tokio::test]
async fn the_idle_status_managers_future_stays_small() {
    let (_handle, rx) = StatusHandle::channel();
    let api = ApiCalls::new(Arc::new(Metrics::unregistered()), 0, 0);
    let manager = StatusManager::new(
        scripted(0).0,
        api,
        rx,
        Arc::new(PodMetrics::new()),
        Default::default(),
    );
    let size = std::mem::size_of_val(&manager.run(CancellationToken::new()));
    println!("status manager run future {size} bytes");
    // joined into the pod side's task for the node's life: its retry timer is allocated only while a retry is
    // due (the figure and its history: docs/density.md, "Future-size ceilings")
    assert!(size <= 528, "the status manager's run future is {size} bytes");
}

/// The writer holds an entry per pod for the pod's life: its size is per running pod of every node.
#[test]
fn a_pods_entry_stays_small() {
    let size = std::mem::size_of::<crate::pods::status::manager::Entry>();
    println!("status entry {size} bytes");
    // one allocation for the namespace and name, and the retry time boxed with its back-off (the figure and
    // its history: docs/density.md)
    assert!(size <= 72, "a status entry is {size} bytes");
    let e = crate::pods::status::manager::Entry::new("kube-system", "coredns-5d78c9869d-x2x7k");
    assert_eq!(
        (e.namespace(), e.name()),
        ("kube-system", "coredns-5d78c9869d-x2x7k")
    );
    let seeded = crate::pods::status::manager::Entry::new("", "");
    assert_eq!((seeded.namespace(), seeded.name()), ("", ""));
}
