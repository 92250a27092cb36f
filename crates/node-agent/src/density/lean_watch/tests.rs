//! Decoding the watch stream: lines split across chunks, several lines in one chunk, bookmarks moving the
//! resume point, 410 Gone turning the next step into a list, other error events surfacing; every watch asks
//! for a timeout of its own between 5 and 10 minutes; after a failure one back-off is waited, not one per step,
//! and none once a change came through.

use k8s_openapi::api::core::v1::Pod;

use super::{Change, LeanWatch, WatchError};

/// A client whose requests never get an answer (these tests feed the decoder directly).
fn client() -> kube::Client {
    let service = tower::service_fn(|_req: http::Request<kube::client::Body>| {
        std::future::pending::<Result<http::Response<kube::client::Body>, std::convert::Infallible>>()
    });
    kube::Client::new(service, "default")
}

fn watching() -> LeanWatch<Pod> {
    let mut w = LeanWatch::new(client(), "spec.nodeName=n1");
    w.resource_version = Some("100".into());
    w
}

fn event(kind: &str, name: &str, rv: &str) -> String {
    format!(
        r#"{{"type":"{kind}","object":{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"default","resourceVersion":"{rv}"}}}}}}"#
    ) + "\n"
}

fn names(w: &mut LeanWatch<Pod>) -> Vec<String> {
    w.ready
        .take()
        .into_iter()
        .flat_map(|r| *r)
        .map(|c| match c {
            Change::Applied(p) => format!("+{}", p.metadata.name.unwrap_or_default()),
            Change::Deleted(p) => format!("-{}", p.metadata.name.unwrap_or_default()),
            Change::Listed(l) => format!("list of {}", l.len()),
        })
        .collect()
}

#[tokio::test]
async fn lines_split_across_chunks_decode_whole() {
    let mut w = watching();
    let stream = event("ADDED", "a", "101") + &event("MODIFIED", "a", "102") + &event("DELETED", "b", "103");
    let bytes = stream.as_bytes();
    // three uneven chunks cutting lines in the middle
    for chunk in [&bytes[..50], &bytes[50..200], &bytes[200..]] {
        w.take_lines(chunk).expect("decodes");
    }
    assert_eq!(names(&mut w), ["+a", "+a", "-b"]);
    assert_eq!(w.resource_version.as_deref(), Some("103"));
    assert!(w.partial.is_empty(), "nothing kept between events");
}

#[tokio::test]
async fn a_bookmark_moves_the_resume_point_and_reports_nothing() {
    let mut w = watching();
    let line = r#"{"type":"BOOKMARK","object":{"apiVersion":"v1","kind":"Pod","metadata":{"resourceVersion":"250"}}}"#;
    w.take_lines(format!("{line}\n").as_bytes()).expect("decodes");
    assert!(names(&mut w).is_empty());
    assert_eq!(w.resource_version.as_deref(), Some("250"));
}

#[tokio::test]
async fn gone_lists_again_and_ignores_the_rest_of_the_stream() {
    let mut w = watching();
    let gone = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (50)","reason":"Expired","code":410}}"#;
    let stream = event("ADDED", "a", "101") + gone + "\n" + &event("ADDED", "late", "999");
    w.take_lines(stream.as_bytes()).expect("a 410 is not an error");
    assert_eq!(names(&mut w), ["+a"]);
    assert_eq!(w.resource_version, None, "the next step lists");
}

#[tokio::test]
async fn other_error_events_and_garbage_are_errors() {
    let mut w = watching();
    let forbidden = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"forbidden","reason":"Forbidden","code":403}}"#;
    let err = w.take_lines(format!("{forbidden}\n").as_bytes()).unwrap_err();
    assert!(matches!(err, WatchError::Api { code: 403, .. }), "{err}");
    let mut w = watching();
    let err = w.take_lines(b"not json\n").unwrap_err();
    assert!(matches!(err, WatchError::Decode(_)), "{err}");
}

#[tokio::test]
async fn every_watch_asks_for_its_own_timeout_between_five_and_ten_minutes() {
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
    let seen = asked.clone();
    // a server whose every watch ends at once, so the watch is opened again at the next step
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let timeout = req.uri().query().and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix("timeoutSeconds="))
                .and_then(|v| v.parse::<u32>().ok())
        });
        seen.lock().unwrap().extend(timeout);
        std::future::ready(Ok::<_, std::convert::Infallible>(http::Response::new(
            kube::client::Body::from(Vec::new()),
        )))
    });
    let mut w: LeanWatch<Pod> = LeanWatch::new(kube::Client::new(service, "default"), "spec.nodeName=n1");
    w.resource_version = Some("100".into());
    for _ in 0..40 {
        // opens a watch, then reads its end
        assert!(w.step().await.expect("a step").is_none());
    }
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 20, "one timeout per watch: {asked:?}");
    assert!(asked.iter().all(|t| (300..600).contains(t)), "{asked:?}");
    let distinct: std::collections::BTreeSet<_> = asked.iter().collect();
    assert!(distinct.len() > 1, "picked anew for each watch: {asked:?}");
}

#[tokio::test(start_paused = true)]
async fn after_a_failure_the_watch_waits_one_back_off_then_reads_at_once() {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    let bookmark = r#"{"type":"BOOKMARK","object":{"apiVersion":"v1","kind":"Pod","metadata":{"resourceVersion":"150"}}}"#;
    let bookmark = format!("{bookmark}\n");
    let added = event("ADDED", "after", "151");
    // the API server unreachable once; then a watch that sends a bookmark and ends (its timeout), then one
    // that sends the pod
    let service = tower::service_fn(move |_req: http::Request<kube::client::Body>| {
        let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let body = match n {
            0 => None,
            1 => Some(bookmark.clone()),
            _ => Some(added.clone()),
        };
        std::future::ready(
            body.map(|b| http::Response::new(kube::client::Body::from(b.into_bytes())))
                .ok_or_else(|| std::io::Error::other("connection refused")),
        )
    });
    let mut w: LeanWatch<Pod> = LeanWatch::new(kube::Client::new(service, "default"), "spec.nodeName=n1");
    w.resource_version = Some("100".into());
    assert!(w.next().await.is_err(), "the first watch request fails");
    let t0 = tokio::time::Instant::now();
    let change = w.next().await.expect("the watch resumes");
    let took = t0.elapsed();
    assert!(
        matches!(&change, Change::Applied(p) if p.metadata.name.as_deref() == Some("after")),
        "{change:?}"
    );
    assert_eq!(w.resource_version.as_deref(), Some("151"));
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    // one back-off of 800 ms (10 % jitter), not one before each of the five steps
    assert!(took <= std::time::Duration::from_millis(880), "{took:?}");
}

#[tokio::test(start_paused = true)]
async fn after_a_failure_every_later_change_comes_at_once() {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    // the API server unreachable once; then watches that each send one pod and end
    let service = tower::service_fn(move |_req: http::Request<kube::client::Body>| {
        let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let body = (n > 0).then(|| event("MODIFIED", &format!("p{n}"), &(200 + n).to_string()));
        std::future::ready(
            body.map(|b| http::Response::new(kube::client::Body::from(b.into_bytes())))
                .ok_or_else(|| std::io::Error::other("connection refused")),
        )
    });
    let mut w: LeanWatch<Pod> = LeanWatch::new(kube::Client::new(service, "default"), "spec.nodeName=n1");
    w.resource_version = Some("100".into());
    assert!(w.next().await.is_err(), "the first watch request fails");
    let t0 = tokio::time::Instant::now();
    let mut seen = Vec::new();
    for _ in 0..3 {
        match w.next().await.expect("the watch resumes") {
            Change::Applied(p) => seen.push(p.metadata.name.unwrap_or_default()),
            other => panic!("{other:?}"),
        }
    }
    let took = t0.elapsed();
    assert_eq!(seen, ["p1", "p2", "p3"]);
    // one back-off of 800 ms (10 % jitter) before the first; the changes after it wait for nothing
    assert!(took <= std::time::Duration::from_millis(880), "{took:?}");
}
