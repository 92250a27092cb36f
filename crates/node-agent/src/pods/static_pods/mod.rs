//! Static pods: pods defined on the node itself rather than in the API server.
//!
//! | module | owns |
//! |---|---|
//! | [`manifest`] | decoding a manifest (errors name the field) and the kubelet's defaults: name, UID, annotations |
//! | `file` | `staticPodPath`: re-read every `fileCheckFrequency` and on inotify events |
//! | `http` | `staticPodURL`: re-fetched every `httpCheckFrequency` with `staticPodURLHeader` |
//! | `mirror` | one mirror pod in the API server per static pod: created, recreated when deleted, removed |
//!
//! Each source sends the full set of its pods ([`StaticUpdate`]) to the pod manager, which runs them like any
//! pod — without waiting for the API server: static pods run while it is unreachable. Statuses of static
//! pods are written to their mirror pods ([`Mirrors`] maps a static pod's UID to its mirror's).

mod file;
mod http;
pub mod manifest;
pub(crate) mod mirror;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::pods::events::{EventType, PodEventSink};
pub(crate) use crate::pods::status::mirrors::Mirrors;
use manifest::Origin;

/// Where an agent's static pods come from. `Default`: nowhere.
#[derive(Debug, Clone)]
pub struct StaticPodConfig {
    /// `staticPodPath`: a directory of manifests or one manifest file.
    pub path: Option<PathBuf>,
    /// `fileCheckFrequency` (default 20 s).
    pub file_check_frequency: Duration,
    /// `staticPodURL` (`http://` only).
    pub url: Option<String>,
    /// `staticPodURLHeader`: headers sent with every fetch of the URL.
    pub url_headers: BTreeMap<String, Vec<String>>,
    /// `httpCheckFrequency` (default 20 s).
    pub http_check_frequency: Duration,
    /// Manifests handed over in memory (a hollow fleet's profile), each with the name that stands for its
    /// file (in its UID and in logs); they behave as file pods.
    pub manifests: Vec<(String, Arc<Pod>)>,
}

impl Default for StaticPodConfig {
    fn default() -> Self {
        Self {
            path: None,
            file_check_frequency: Duration::from_secs(20),
            url: None,
            url_headers: BTreeMap::new(),
            http_check_frequency: Duration::from_secs(20),
            manifests: Vec::new(),
        }
    }
}

impl StaticPodConfig {
    /// The number of sources configured (the pod manager waits for each one's first set before removing
    /// runtime leftovers of pods it does not know).
    pub(crate) fn sources(&self) -> usize {
        usize::from(self.path.is_some())
            + usize::from(self.url.is_some())
            + usize::from(!self.manifests.is_empty())
    }
}

/// One source's pods now.
#[derive(Debug)]
pub(crate) struct StaticUpdate {
    /// `file:<path>`, `http:<url>` or `memory`.
    pub source: String,
    /// The full set; `None` when the source could not be read (the previous set stays).
    pub pods: Option<Vec<Pod>>,
}

/// Reports unusable manifests: a warning in the log and a Warning event on the Node.
#[derive(Clone)]
pub(crate) struct Problems {
    node: String,
    sink: Arc<dyn PodEventSink>,
}

impl Problems {
    pub(crate) fn new(node: String, sink: Arc<dyn PodEventSink>) -> Self {
        Self { node, sink }
    }

    /// `what` (a file or the URL) could not be used because of `error`.
    pub(crate) fn report(&self, what: &str, error: &str) {
        tracing::warn!(node = %self.node, source = %what, %error, "static pod manifest not used");
        self.sink.node_event(
            &self.node,
            EventType::Warning,
            "FailedStaticPod",
            format!("static pod manifest {what} not used: {error}"),
        );
    }
}

/// Starts every configured source on `tracker`; their sets arrive on the returned channel.
pub(crate) fn spawn_sources(
    config: &StaticPodConfig,
    node: &str,
    problems: &Problems,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) -> Option<mpsc::Receiver<StaticUpdate>> {
    if config.sources() == 0 {
        // no channel at all: a node without static pods (most of a hollow fleet) keeps none
        return None;
    }
    let (tx, rx) = mpsc::channel(8);
    if let Some(path) = &config.path {
        tracker.spawn(file::run(
            path.clone(),
            node.to_owned(),
            config.file_check_frequency,
            tx.clone(),
            problems.clone(),
            cancel.clone(),
        ));
    }
    if let Some(url) = &config.url {
        tracker.spawn(http::run(
            url.clone(),
            config.url_headers.clone(),
            node.to_owned(),
            config.http_check_frequency,
            tx.clone(),
            problems.clone(),
            cancel.clone(),
        ));
    }
    if !config.manifests.is_empty() {
        let mut pods = Vec::new();
        for (name, pod) in &config.manifests {
            match manifest::prepare(Pod::clone(pod), Origin::File(name), node) {
                Ok(pod) => pods.push(pod),
                Err(error) => problems.report(name, &error.to_string()),
            }
        }
        // the channel is new: this first send cannot wait
        let _ = tx.try_send(StaticUpdate {
            source: "memory".into(),
            pods: Some(pods),
        });
    }
    Some(rx)
}
