//! The status manager task: one per agent, writing pod statuses and final deletions in order, one request
//! at a time, coalescing updates of a pod that arrive while a write is pending.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{StatusMsg, canonical};
use crate::api::ApiCalls;
use crate::backoff::{Backoff, BackoffPolicy};
use crate::pods::metrics::{PodMetrics, Timeline};

struct Entry {
    namespace: String,
    name: String,
    acked: Option<u64>,
    pending: Option<Box<PodStatus>>,
    timeline: Option<Box<Timeline>>,
    delete: bool,
    retry_at: Option<Instant>,
    backoff: Option<Backoff>,
}

/// What happened to one write.
enum Outcome {
    Done,
    Gone,
    Retry,
}

pub(crate) struct StatusManager {
    client: kube::Client,
    api: ApiCalls,
    rx: mpsc::UnboundedReceiver<StatusMsg>,
    metrics: Arc<PodMetrics>,
    entries: HashMap<String, Entry>,
    dirty: VecDeque<String>,
}

fn gone(err: &kube::Error) -> bool {
    // 404: the object is gone; 409 on a UID precondition: a new pod took the name
    matches!(err, kube::Error::Api(s) if s.code == 404 || s.code == 409)
}

impl StatusManager {
    pub(crate) fn new(
        client: kube::Client,
        api: ApiCalls,
        rx: mpsc::UnboundedReceiver<StatusMsg>,
        metrics: Arc<PodMetrics>,
    ) -> Self {
        Self {
            client,
            api,
            rx,
            metrics,
            entries: HashMap::new(),
            dirty: VecDeque::new(),
        }
    }

    fn mark(&mut self, uid: &str) {
        if !self.dirty.iter().any(|u| u == uid) {
            self.dirty.push_back(uid.to_owned());
        }
    }

    fn entry(&mut self, uid: &str, namespace: &str, name: &str) -> &mut Entry {
        self.entries.entry(uid.to_owned()).or_insert_with(|| Entry {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            acked: None,
            pending: None,
            timeline: None,
            delete: false,
            retry_at: None,
            backoff: None,
        })
    }

    fn apply(&mut self, msg: StatusMsg) {
        match msg {
            StatusMsg::Seed { uid, status } => {
                let e = self.entry(&uid, "", "");
                if e.acked.is_none() {
                    e.acked = Some(canonical::fingerprint(&status));
                }
            }
            StatusMsg::Set {
                uid,
                namespace,
                name,
                status,
                timeline,
            } => {
                let e = self.entry(&uid, &namespace, &name);
                e.namespace = namespace;
                e.name = name;
                e.pending = Some(status);
                if timeline.is_some() {
                    e.timeline = timeline;
                }
                if e.retry_at.is_none() {
                    self.mark(&uid);
                }
            }
            StatusMsg::Delete { uid, namespace, name } => {
                let e = self.entry(&uid, &namespace, &name);
                e.namespace = namespace;
                e.name = name;
                e.delete = true;
                if e.retry_at.is_none() {
                    self.mark(&uid);
                }
            }
            StatusMsg::Forget { uid } => {
                self.entries.remove(&uid);
                self.dirty.retain(|u| *u != uid);
            }
        }
    }

    fn next_retry(&self) -> Option<Instant> {
        self.entries.values().filter_map(|e| e.retry_at).min()
    }

    fn requeue_due(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .entries
            .iter_mut()
            .filter(|(_, e)| e.retry_at.is_some_and(|at| at <= now))
            .map(|(uid, e)| {
                e.retry_at = None;
                uid.clone()
            })
            .collect();
        for uid in due {
            self.mark(&uid);
        }
    }

    /// Writes until `cancel` fires or every handle is dropped.
    pub(crate) async fn run(mut self, cancel: CancellationToken) {
        loop {
            while let Ok(msg) = self.rx.try_recv() {
                self.apply(msg);
            }
            if let Some(uid) = self.dirty.pop_front() {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    () = self.process(&uid) => {}
                }
                continue;
            }
            let retry = self.next_retry();
            tokio::select! {
                _ = cancel.cancelled() => return,
                msg = self.rx.recv() => match msg {
                    Some(msg) => self.apply(msg),
                    None => return,
                },
                _ = async { match retry { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {
                    self.requeue_due();
                }
            }
        }
    }

    async fn process(&mut self, uid: &str) {
        let Some(e) = self.entries.get_mut(uid) else {
            return;
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &e.namespace);
        let mut outcome = Outcome::Done;
        if let Some(status) = e.pending.take() {
            let fingerprint = canonical::fingerprint(&status);
            if e.acked != Some(fingerprint) {
                let body = json!({"metadata": {"uid": uid}, "status": canonical::owned(&status)});
                let (patch, params) = (Patch::Strategic(body), PatchParams::default());
                let request = api.patch_status(&e.name, &params, &patch);
                match self.api.run("patch", "pods/status", request).await {
                    Ok(_) => e.acked = Some(fingerprint),
                    Err(err) if gone(&err) => outcome = Outcome::Gone,
                    Err(err) => {
                        tracing::warn!(pod = %e.name, namespace = %e.namespace, error = %err, "status update failed, will retry");
                        e.pending = Some(status.clone());
                        outcome = Outcome::Retry;
                    }
                }
            }
            if matches!(outcome, Outcome::Done)
                && status.phase.as_deref() == Some("Running")
                && let Some(t) = e.timeline.take()
            {
                self.metrics.record_start(*t);
            }
        }
        if matches!(outcome, Outcome::Done) && e.delete && e.pending.is_none() {
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.to_owned()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match self.api.run("delete", "pods", api.delete(&e.name, &params)).await {
                Ok(_) => outcome = Outcome::Gone,
                Err(err) if gone(&err) => outcome = Outcome::Gone,
                Err(err) => {
                    tracing::warn!(pod = %e.name, namespace = %e.namespace, error = %err, "pod delete failed, will retry");
                    outcome = Outcome::Retry;
                }
            }
        }
        match outcome {
            Outcome::Done => e.backoff = None,
            Outcome::Gone => {
                self.entries.remove(uid);
            }
            Outcome::Retry => {
                let delay = e
                    .backoff
                    .get_or_insert_with(|| Backoff::new(BackoffPolicy::api_retry()))
                    .next_delay();
                e.retry_at = Some(Instant::now() + delay);
            }
        }
    }
}
