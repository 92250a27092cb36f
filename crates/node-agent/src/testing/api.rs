//! An API server double for whole-agent tests: objects kept in memory by path, every request recorded with the
//! (paused) time it came.
//!
//! Creates store the object (with a UID and a resourceVersion; `409 AlreadyExists` when it is there), reads answer
//! it (`404` when it is not), lists answer every object of the collection (field selectors are not applied),
//! updates replace it, patches merge into it (JSON merge patch, which is what the agent's strategic and merge
//! patches of plain fields amount to), deletes remove it. A watch never answers, as a server with nothing to say.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{Value, json};
use tokio::time::Instant;

/// One request the double answered.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    /// When it came.
    pub(crate) at: Instant,
    /// `GET`, `POST`, ...
    pub(crate) method: String,
    /// The URL's path.
    pub(crate) path: String,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Value>,
    seen: Vec<Seen>,
    version: u64,
}

/// The double (see the module). Clones share it.
#[derive(Clone, Default)]
pub(crate) struct ApiDouble {
    state: Arc<Mutex<State>>,
}

/// Where a request's path points: its collection, and the object and subresource when named.
struct Target {
    collection: String,
    name: Option<String>,
}

impl Target {
    fn of(path: &str) -> Option<Self> {
        let (prefix, rest) = if let Some(rest) = path.strip_prefix("/api/v1/") {
            ("/api/v1".to_owned(), rest)
        } else {
            let rest = path.strip_prefix("/apis/")?;
            let mut parts = rest.splitn(3, '/');
            let (group, version, rest) = (parts.next()?, parts.next()?, parts.next()?);
            (format!("/apis/{group}/{version}"), rest)
        };
        let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
        let (collection, name) = match segments.as_slice() {
            ["namespaces", ns, resource, rest @ ..] => {
                (format!("{prefix}/namespaces/{ns}/{resource}"), rest.first())
            }
            [resource, rest @ ..] => (format!("{prefix}/{resource}"), rest.first()),
            [] => return None,
        };
        Some(Self {
            collection,
            name: name.map(|n| (*n).to_owned()),
        })
    }

    fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.collection)
    }
}

/// RFC 7386: `patch` merged into `target`.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(into) = target {
        for (k, v) in fields {
            if v.is_null() {
                into.remove(k);
            } else {
                merge(into.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "reason": reason, "message": message, "code": code}),
    )
}

impl ApiDouble {
    /// A double holding nothing, and a client whose requests it answers.
    pub(crate) fn new() -> (Self, kube::Client) {
        let double = Self::default();
        let serving = double.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let double = serving.clone();
            async move {
                let (parts, body) = req.into_parts();
                let watch = parts
                    .uri
                    .query()
                    .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
                if watch {
                    // a server with nothing to say: the watch stays open
                    std::future::pending::<()>().await;
                }
                let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let (code, answer) = double.answer(parts.method.as_str(), parts.uri.path(), body);
                let resp = http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(answer.to_string())))
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(resp)
            }
        });
        (double, kube::Client::new(service, "default"))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn answer(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let mut state = self.lock();
        state.seen.push(Seen {
            at: Instant::now(),
            method: method.to_owned(),
            path: path.to_owned(),
        });
        let Some(target) = Target::of(path) else {
            return status(404, "NotFound", path);
        };
        state.version += 1;
        let version = state.version.to_string();
        match (method, &target.name) {
            ("GET", None) => {
                let prefix = format!("{}/", target.collection);
                let items: Vec<Value> = state
                    .objects
                    .iter()
                    .filter(|(k, _)| k.strip_prefix(&prefix).is_some_and(|n| !n.contains('/')))
                    .map(|(_, v)| v.clone())
                    .collect();
                (
                    200,
                    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": version}, "items": items}),
                )
            }
            ("GET", Some(name)) => match state.objects.get(&target.key(name)) {
                Some(object) => (200, object.clone()),
                None => status(404, "NotFound", name),
            },
            ("POST", None) => {
                let name = body["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                let key = target.key(&name);
                if state.objects.contains_key(&key) {
                    return status(409, "AlreadyExists", &name);
                }
                let mut object = body;
                object["metadata"]["uid"] = json!(format!("uid-{version}"));
                object["metadata"]["resourceVersion"] = json!(version);
                state.objects.insert(key, object.clone());
                (201, object)
            }
            ("PUT", Some(name)) => {
                let key = target.key(name);
                if !state.objects.contains_key(&key) {
                    return status(404, "NotFound", name);
                }
                let mut object = body;
                object["metadata"]["resourceVersion"] = json!(version);
                state.objects.insert(key, object.clone());
                (200, object)
            }
            ("PATCH", Some(name)) => {
                let Some(object) = state.objects.get_mut(&target.key(name)) else {
                    return status(404, "NotFound", name);
                };
                merge(object, &body);
                object["metadata"]["resourceVersion"] = json!(version);
                (200, object.clone())
            }
            ("DELETE", Some(name)) => match state.objects.remove(&target.key(name)) {
                Some(_) => (
                    200,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                ),
                None => status(404, "NotFound", name),
            },
            _ => status(405, "MethodNotAllowed", method),
        }
    }

    /// The requests of `method` whose path starts with `path`, in order.
    pub(crate) fn requests(&self, method: &str, path: &str) -> Vec<Seen> {
        self.lock()
            .seen
            .iter()
            .filter(|s| s.method == method && s.path.starts_with(path))
            .cloned()
            .collect()
    }

    /// The object at `path`, as stored now.
    pub(crate) fn object(&self, path: &str) -> Option<Value> {
        self.lock().objects.get(path).cloned()
    }
}
