//! A list+watch of one kind of object, as lean as a long-lived per-node watch must be.
//!
//! Every agent keeps two watches for its whole life (its pods, its own Node), ten thousand agents to a hollow
//! process, so what an idle watch holds is per-node memory. kube-runtime's `watcher` reads the stream through a
//! line codec whose buffer is allocated up front and stays allocated while the watch idles, inside a boxed
//! state machine. [`LeanWatch`] keeps the response body and only the bytes of a line not yet complete (nothing
//! between events), and decodes each line as it completes.
//!
//! Semantics as the kubelet's reflector and kube-runtime's watcher: a list first (`resourceVersion=0`, served
//! from the API server's watch cache), then a watch from the list's resourceVersion with bookmarks, resumed from
//! the last resourceVersion seen when the server ends it (`timeoutSeconds` picked anew for every watch in
//! [5, 10) minutes, as the reflector picks it; [30, 60) for a watch of one object, see [`OneObject`]) or the
//! connection breaks; a `410 Gone` (the version is too old) lists again. Errors are returned to the caller, who logs them; the next
//! call waits out a back-off (800 ms doubling to 30 s) before trying again.

use std::collections::VecDeque;

use http_body_util::BodyExt;
use kube::api::{ListParams, WatchParams};
use kube::core::{ObjectList, Request, Status, WatchEvent};
use serde::de::DeserializeOwned;

use crate::backoff::{Backoff, BackoffPolicy};

/// The server ends a watch after a time picked in this range (seconds) for every watch, as the kubelet's reflector
/// picks it: watches a fleet opened together then end, and are opened again, spread over minutes, not together.
const WATCH_TIMEOUT_SECS: std::ops::Range<u32> = 300..600;

/// What changed.
#[derive(Debug)]
pub enum Change<K> {
    /// Every object matching now (after a list or relist); objects not in it are gone.
    Listed(Vec<K>),
    /// An object was added or changed.
    Applied(K),
    /// An object was deleted.
    Deleted(K),
}

/// Why a step of the watch failed (the next call retries after a back-off).
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The request could not be built or sent, or the body broke off.
    #[error("watch request: {0}")]
    Request(#[source] kube::Error),
    /// The API server answered with an error status.
    #[error("API server answered {code}: {message}")]
    Api {
        /// HTTP status code.
        code: u16,
        /// The server's message.
        message: String,
    },
    /// A list or an event that does not decode.
    #[error("decoding: {0}")]
    Decode(#[source] serde_json::Error),
}

/// Where a watch looks: every namespace (`()`, which costs the long-lived per-node watches no bytes) or one
/// named object of a namespace ([`OneObject`]).
pub trait Scope {
    /// The namespace, or `None` for every namespace (or a cluster-scoped kind).
    fn namespace(&self) -> Option<&str>;

    /// The range (seconds) the server's timeout of each watch is picked in.
    fn watch_timeout_secs(&self) -> std::ops::Range<u32> {
        WATCH_TIMEOUT_SECS
    }
}

impl Scope for () {
    fn namespace(&self) -> Option<&str> {
        None
    }
}

/// One object of the namespace it holds, followed by a watch of its own, as the kubelet's ConfigMap and Secret
/// managers follow each object a pod names. Those watches ask for 30 to 60 minutes, as the managers' reflectors
/// do: a node holds one per object, and re-opening each every few minutes would be most of what it asks.
pub struct OneObject(Box<str>);

impl Scope for OneObject {
    fn namespace(&self) -> Option<&str> {
        Some(&self.0)
    }

    fn watch_timeout_secs(&self) -> std::ops::Range<u32> {
        1800..3600
    }
}

/// A list+watch of the objects of kind `K` matching a field selector, in scope `S`.
pub struct LeanWatch<K, S = ()> {
    client: crate::client::ApiClient,
    scope: S,
    selector: Box<str>,
    /// Where to resume; `None`: list (first, or after 410 Gone).
    resource_version: Option<Box<str>>,
    body: Option<kube::client::Body>,
    /// Bytes of the line being received.
    partial: Vec<u8>,
    /// Decoded changes not yet returned (a chunk may hold several lines); boxed, made while a chunk's changes
    /// are handed out (an idle watch lives inside a node's long-lived task and should hold no empty queue).
    #[allow(
        clippy::box_collection,
        reason = "8 bytes in the idle watch, which holds no queue"
    )]
    ready: Option<Box<VecDeque<Change<K>>>>,
    /// The retry sequence while steps fail; `Some`: the last step failed, wait before the next (boxed and
    /// dropped on success: an idle watch holds this for the node's life, and watches mostly work).
    backoff: Option<Box<Backoff>>,
}

impl<K> LeanWatch<K> {
    /// A watch of every `K` (cluster-wide) matching `field_selector` (e.g. `spec.nodeName=n1`).
    pub fn new(client: impl Into<crate::client::ApiClient>, field_selector: impl Into<String>) -> Self {
        LeanWatch::scoped(client, (), field_selector)
    }
}

impl<K> LeanWatch<K, OneObject> {
    /// A watch of the `K` named `name` in `namespace` (`fieldSelector=metadata.name=<name>`).
    pub fn one_object(client: impl Into<crate::client::ApiClient>, namespace: &str, name: &str) -> Self {
        LeanWatch::scoped(
            client,
            OneObject(namespace.into()),
            format!("metadata.name={name}"),
        )
    }
}

impl<K, S: Scope> LeanWatch<K, S> {
    fn scoped(
        client: impl Into<crate::client::ApiClient>,
        scope: S,
        field_selector: impl Into<String>,
    ) -> Self {
        Self {
            client: client.into(),
            scope,
            selector: field_selector.into().into_boxed_str(),
            resource_version: None,
            body: None,
            partial: Vec::new(),
            ready: None,
            backoff: None,
        }
    }
}

impl<K, S: Scope> LeanWatch<K, S>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned,
{
    fn path(&self) -> String {
        K::url_path(&(), self.scope.namespace())
    }

    /// The field selector it follows.
    pub fn selector(&self) -> &str {
        &self.selector
    }

    /// The next change. An error leaves the watch usable: the next call retries after a back-off, waited once
    /// before its first step (the steps after it — the watch opened, bookmarks, chunks — go on at once; the
    /// sequence grows while calls keep failing and starts over with the first change).
    pub async fn next(&mut self) -> Result<Change<K>, WatchError> {
        let mut waited = false;
        loop {
            if let Some(ready) = self.ready.as_mut()
                && let Some(change) = ready.pop_front()
            {
                if ready.is_empty() {
                    self.ready = None;
                }
                // a change read: the watch works again, and the next step goes on at once
                self.backoff = None;
                return Ok(change);
            }
            if !waited && let Some(backoff) = self.backoff.as_mut() {
                // boxed: the idle watch keeps no room for the retry's timer
                Box::pin(backoff.wait()).await;
            }
            waited = true;
            match self.step().await {
                Ok(Some(change)) => {
                    self.backoff = None;
                    return Ok(change);
                }
                Ok(None) => {}
                Err(error) => {
                    Backoff::in_slot(&mut self.backoff, BackoffPolicy::watch_retry());
                    self.body = None;
                    self.partial = Vec::new();
                    return Err(error);
                }
            }
        }
    }

    /// One list, one watch request, or one chunk of the watch body.
    async fn step(&mut self) -> Result<Option<Change<K>>, WatchError> {
        if self.resource_version.is_none() {
            // boxed, as the watch request: an idle watch keeps no room for a request in flight
            return Box::pin(self.list()).await.map(Some);
        }
        let Some(body) = self.body.as_mut() else {
            let version = self.resource_version.as_deref().unwrap_or_default().to_owned();
            self.body = Some(
                Box::pin(open_watch(
                    &self.client,
                    &self.path(),
                    &self.selector,
                    version,
                    self.scope.watch_timeout_secs(),
                ))
                .await?,
            );
            return Ok(None);
        };
        match body.frame().await {
            // the server ended the watch (timeout): resume from the last version
            None => {
                self.body = None;
                self.partial = Vec::new();
                Ok(None)
            }
            Some(Err(error)) => Err(WatchError::Request(error)),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    self.take_lines(&data)?;
                }
                Ok(None)
            }
        }
    }

    async fn list(&mut self) -> Result<Change<K>, WatchError> {
        let params = ListParams::default().fields(&self.selector).match_any();
        let request = Request::new(self.path())
            .list(&params)
            .map_err(|e| WatchError::Request(kube::Error::BuildRequest(e)))?;
        let body = send(&self.client, request).await?;
        let bytes = body.collect().await.map_err(WatchError::Request)?.to_bytes();
        let list: ObjectList<K> = serde_json::from_slice(&bytes).map_err(WatchError::Decode)?;
        self.resource_version = list.metadata.resource_version.clone().map(String::into_boxed_str);
        Ok(Change::Listed(list.items))
    }

    /// Decodes every complete line of `data` (after what an earlier chunk left), keeping an incomplete tail.
    fn take_lines(&mut self, mut data: &[u8]) -> Result<(), WatchError> {
        while let Some(end) = data.iter().position(|b| *b == b'\n') {
            let line = &data[..end];
            data = &data[end + 1..];
            if self.partial.is_empty() {
                self.event(line)?;
            } else {
                self.partial.extend_from_slice(line);
                let whole = std::mem::take(&mut self.partial);
                self.event(&whole)?;
            }
            if self.resource_version.is_none() {
                // 410 Gone: this stream is over, the rest of it is not read
                return Ok(());
            }
        }
        self.partial.extend_from_slice(data);
        Ok(())
    }

    fn event(&mut self, line: &[u8]) -> Result<(), WatchError> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        let event: WatchEvent<K> = serde_json::from_slice(line).map_err(WatchError::Decode)?;
        let (change, version) = match event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                let v = o.meta().resource_version.clone();
                (Some(Change::Applied(o)), v)
            }
            WatchEvent::Deleted(o) => {
                let v = o.meta().resource_version.clone();
                (Some(Change::Deleted(o)), v)
            }
            WatchEvent::Bookmark(b) => (None, Some(b.metadata.resource_version)),
            WatchEvent::Error(status) if status.code == 410 => {
                // too old a version: list again
                self.resource_version = None;
                self.body = None;
                self.partial = Vec::new();
                return Ok(());
            }
            WatchEvent::Error(status) => {
                return Err(WatchError::Api {
                    code: status.code,
                    message: status.message,
                });
            }
        };
        if let Some(version) = version {
            self.resource_version = Some(version.into_boxed_str());
        }
        if let Some(change) = change {
            self.ready.get_or_insert_default().push_back(change);
        }
        Ok(())
    }
}

/// A watch of `url_path` from `version`, matching `selector`, which the server ends after a time picked in
/// `timeout_secs`.
async fn open_watch(
    client: &kube::Client,
    url_path: &str,
    selector: &str,
    version: String,
    timeout_secs: std::ops::Range<u32>,
) -> Result<kube::client::Body, WatchError> {
    let params = WatchParams::default()
        .fields(selector)
        .timeout(rand::random_range(timeout_secs));
    let request = Request::new(url_path)
        .watch(&params, &version)
        .map_err(|e| WatchError::Request(kube::Error::BuildRequest(e)))?;
    send(client, request).await
}

/// Sends `request`, answering the body of a success or the error status.
async fn send(
    client: &kube::Client,
    request: http::Request<Vec<u8>>,
) -> Result<kube::client::Body, WatchError> {
    let mut request = request.map(kube::client::Body::from);
    // one JSON line per event; a compressed stream would not be read line by line
    request.headers_mut().insert(
        http::header::ACCEPT_ENCODING,
        http::HeaderValue::from_static("identity"),
    );
    let response = client.send(request).await.map_err(WatchError::Request)?;
    let code = response.status();
    if code.is_success() {
        return Ok(response.into_body());
    }
    let text = response
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    let message = serde_json::from_str::<Status>(&text)
        .map(|s| s.message)
        .unwrap_or(text);
    Err(WatchError::Api {
        code: code.as_u16(),
        message,
    })
}

#[cfg(test)]
mod tests;
