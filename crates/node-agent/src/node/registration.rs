//! Registering the Node: create it, or reconcile the one a previous run left, retrying with backoff.
//!
//! Creating sends the full object (labels, annotations, taints, status). When the Node already exists, the
//! kubelet-owned labels (hostname, os, arch and their beta aliases) and the attach/detach annotation are brought
//! up to date, a cordon this agent applied at its last shutdown is undone, and a changed boot ID is reported
//! as a `Rebooted` warning event. Labels from `--node-labels` and taints are only applied at creation, like
//! upstream. Failures are retried forever (100 ms doubling to 7 s) until the token fires; nothing panics.

use std::collections::BTreeMap;
use std::future::Future;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::NodeError;
use super::object::{
    ANNOTATION_CONTROLLER_MANAGED_ATTACH_DETACH, ANNOTATION_CORDONED_ON_SHUTDOWN, default_labels,
};
use crate::api::{ApiCalls, is_already_exists, is_not_found};
use crate::backoff::{Backoff, BackoffPolicy};
use crate::config::AgentConfig;
use crate::events::{EventRecorder, node_reference};

/// The outcome of registration.
#[derive(Debug, Clone)]
pub struct Registered {
    /// The Node as the API server returned it.
    pub node: Node,
    /// Whether this run created it (false: it existed already).
    pub created: bool,
}

/// Runs `attempt` until it succeeds: at once, then after each failure 100 ms doubling to 7 s (10 % jitter), the
/// kubelet's registration schedule. `None` when `token` fires first.
pub async fn retry_registration<T, F, Fut>(node: &str, token: &CancellationToken, mut attempt: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, NodeError>>,
{
    let mut backoff = Backoff::new(BackoffPolicy::registration());
    loop {
        match attempt().await {
            Ok(r) => return Some(r),
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::warn!(%node, error = %e, retry_in = ?delay, "unable to register node");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = token.cancelled() => return None,
                }
            }
        }
    }
}

/// What registration needs.
pub struct Registrar<'a> {
    /// The agent's config.
    pub config: &'a AgentConfig,
    /// The node's client.
    pub client: crate::client::ApiClient,
    /// The API gate.
    pub calls: &'a ApiCalls,
    /// Where the Rebooted event goes.
    pub events: &'a EventRecorder,
}

impl Registrar<'_> {
    /// Registers `initial` (or reconciles the existing Node), retrying until it works or `token` fires
    /// (`None`).
    pub async fn register(&self, initial: &Node, token: &CancellationToken) -> Option<Registered> {
        retry_registration(&self.config.node_name, token, || {
            Box::pin(self.try_register(initial))
        })
        .await
    }

    async fn try_register(&self, initial: &Node) -> Result<Registered, NodeError> {
        let api: Api<Node> = Api::all(self.client.kube());
        let name = &self.config.node_name;
        if !self.config.kubelet.register_node {
            let node = self
                .calls
                .run("get", "nodes", api.get_opt(name))
                .await
                .map_err(|source| NodeError::Api {
                    verb: "get",
                    resource: "nodes",
                    source,
                })?
                .ok_or_else(|| NodeError::NotRegistered(name.clone()))?;
            return Ok(Registered { node, created: false });
        }
        match self
            .calls
            .run("create", "nodes", api.create(&PostParams::default(), initial))
            .await
        {
            Ok(node) => {
                tracing::info!(node = %name, "registered node");
                Ok(Registered { node, created: true })
            }
            Err(e) if is_already_exists(&e) => {
                let existing = self
                    .calls
                    .run("get", "nodes", api.get(name))
                    .await
                    .map_err(|source| NodeError::Api {
                        verb: "get",
                        resource: "nodes",
                        source,
                    })?;
                let node = self.reconcile(&api, existing).await?;
                tracing::info!(node = %name, "node already registered; reconciled it");
                Ok(Registered { node, created: false })
            }
            Err(source) => Err(NodeError::Api {
                verb: "create",
                resource: "nodes",
                source,
            }),
        }
    }

    /// The metadata/spec patch that brings `existing` in line, if anything needs changing.
    pub fn reconcile_patch(config: &AgentConfig, existing: &Node) -> Option<Value> {
        let empty = BTreeMap::new();
        let labels = existing.metadata.labels.as_ref().unwrap_or(&empty);
        let annotations = existing.metadata.annotations.as_ref().unwrap_or(&empty);

        let mut label_patch = Map::new();
        for (k, v) in default_labels(config) {
            // An explicit --node-labels value for a default label wins, as at registration.
            let want = config.node_labels.get(k).cloned().unwrap_or(v);
            if labels.get(k) != Some(&want) {
                label_patch.insert(k.to_owned(), Value::String(want));
            }
        }
        let mut annotation_patch = Map::new();
        let cmad = annotations
            .get(ANNOTATION_CONTROLLER_MANAGED_ATTACH_DETACH)
            .map(String::as_str);
        if config.kubelet.enable_controller_attach_detach && cmad != Some("true") {
            annotation_patch.insert(ANNOTATION_CONTROLLER_MANAGED_ATTACH_DETACH.into(), json!("true"));
        } else if !config.kubelet.enable_controller_attach_detach && cmad.is_some() {
            annotation_patch.insert(ANNOTATION_CONTROLLER_MANAGED_ATTACH_DETACH.into(), Value::Null);
        }
        let mut spec_patch = Map::new();
        if annotations.contains_key(ANNOTATION_CORDONED_ON_SHUTDOWN) {
            annotation_patch.insert(ANNOTATION_CORDONED_ON_SHUTDOWN.into(), Value::Null);
            if existing.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
                spec_patch.insert("unschedulable".into(), json!(false));
            }
        }

        let mut metadata = Map::new();
        if !label_patch.is_empty() {
            metadata.insert("labels".into(), Value::Object(label_patch));
        }
        if !annotation_patch.is_empty() {
            metadata.insert("annotations".into(), Value::Object(annotation_patch));
        }
        let mut patch = Map::new();
        if !metadata.is_empty() {
            patch.insert("metadata".into(), Value::Object(metadata));
        }
        if !spec_patch.is_empty() {
            patch.insert("spec".into(), Value::Object(spec_patch));
        }
        if patch.is_empty() {
            None
        } else {
            Some(Value::Object(patch))
        }
    }

    async fn reconcile(&self, api: &Api<Node>, existing: Node) -> Result<Node, NodeError> {
        let name = &self.config.node_name;
        let old_boot = existing
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.as_str());
        let boot = &self.config.machine.boot_id;
        if let Some(old) = old_boot
            && !old.is_empty()
            && old != &**boot
        {
            self.events.warning(
                &node_reference(name),
                "Rebooted",
                format!("Node {name} has been rebooted, boot id: {boot}"),
            );
        }
        let Some(patch) = Self::reconcile_patch(self.config, &existing) else {
            return Ok(existing);
        };
        match self
            .calls
            .run(
                "patch",
                "nodes",
                api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch)),
            )
            .await
        {
            Ok(node) => Ok(node),
            Err(e) if is_not_found(&e) => Err(NodeError::Api {
                verb: "patch",
                resource: "nodes",
                source: e,
            }),
            Err(source) => Err(NodeError::Api {
                verb: "patch",
                resource: "nodes",
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use tokio::time::Instant;

    use super::*;
    use crate::config::KubeletConfig;
    use crate::machine::MachineInfo;

    fn config() -> AgentConfig {
        AgentConfig::new(
            "n1",
            "127.0.0.1".parse().unwrap(),
            Arc::new(KubeletConfig::default()),
            MachineInfo::synthetic("n1"),
        )
    }

    fn node(labels: &[(&str, &str)], annotations: &[(&str, &str)], unschedulable: Option<bool>) -> Node {
        let map =
            |kv: &[(&str, &str)]| Some(kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                labels: map(labels),
                annotations: map(annotations),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                unschedulable,
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn up_to_date_node_needs_no_patch() {
        let c = config();
        let labels: Vec<(&str, String)> = default_labels(&c).to_vec();
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let n = node(
            &labels,
            &[
                (ANNOTATION_CONTROLLER_MANAGED_ATTACH_DETACH, "true"),
                ("other", "x"),
            ],
            None,
        );
        assert_eq!(Registrar::reconcile_patch(&c, &n), None);
    }

    #[test]
    fn stale_labels_and_our_cordon_are_fixed() {
        let c = config();
        let n = node(
            &[("kubernetes.io/hostname", "old"), ("custom", "kept")],
            &[(ANNOTATION_CORDONED_ON_SHUTDOWN, "true")],
            Some(true),
        );
        let p = Registrar::reconcile_patch(&c, &n).unwrap();
        assert_eq!(p["metadata"]["labels"]["kubernetes.io/hostname"], "n1");
        assert_eq!(p["metadata"]["labels"]["kubernetes.io/os"], "linux");
        assert!(
            p["metadata"]["labels"].get("custom").is_none(),
            "other labels untouched"
        );
        assert_eq!(
            p["metadata"]["annotations"][ANNOTATION_CONTROLLER_MANAGED_ATTACH_DETACH],
            "true"
        );
        assert!(p["metadata"]["annotations"][ANNOTATION_CORDONED_ON_SHUTDOWN].is_null());
        assert_eq!(p["spec"]["unschedulable"], false);
    }

    #[test]
    fn a_cordon_by_someone_else_is_left_alone() {
        let c = config();
        let labels: Vec<(&str, String)> = default_labels(&c).to_vec();
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let n = node(
            &labels,
            &[(ANNOTATION_CONTROLLER_MANAGED_ATTACH_DETACH, "true")],
            Some(true),
        );
        assert_eq!(Registrar::reconcile_patch(&c, &n), None);
    }

    /// Runs [`retry_registration`] with an attempt that fails `failures` times (recording when it was called).
    async fn attempts_until_success(
        failures: usize,
        token: &CancellationToken,
    ) -> (Option<usize>, Vec<Instant>) {
        let calls = std::cell::RefCell::new(Vec::new());
        let out = retry_registration("n1", token, || {
            calls.borrow_mut().push(Instant::now());
            let n = calls.borrow().len();
            async move {
                if n <= failures {
                    Err(NodeError::NotRegistered("n1".into()))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        (out, calls.into_inner())
    }

    #[tokio::test(start_paused = true)]
    async fn registration_retries_100ms_doubling_to_7s() {
        let t0 = Instant::now();
        let (out, calls) = attempts_until_success(9, &CancellationToken::new()).await;
        assert_eq!(out, Some(10), "the tenth attempt succeeded and ended the loop");
        assert_eq!(calls[0], t0, "first attempt at once");
        let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1] - w[0]).collect();
        for (g, ms) in gaps
            .iter()
            .zip([100u64, 200, 400, 800, 1600, 3200, 6400, 7000, 7000])
        {
            let base = Duration::from_millis(ms);
            assert!(
                *g >= base && *g <= base + base / 10 + Duration::from_millis(1),
                "{g:?} after a failure, expected {ms} ms + <10 %: {gaps:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn registration_gives_up_when_cancelled_while_waiting() {
        let token = CancellationToken::new();
        let t0 = Instant::now();
        let cancel = token.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(2000)).await;
            cancel.cancel();
        });
        let (out, calls) = attempts_until_success(usize::MAX, &token).await;
        assert_eq!(out, None);
        assert_eq!(
            Instant::now() - t0,
            Duration::from_millis(2000),
            "returns when cancelled, not after the pending delay"
        );
        // 0, 0.1, 0.3, 0.7, 1.5 s (+ jitter); the next would be at >= 3.1 s
        assert_eq!(calls.len(), 5, "{calls:?}");
    }
}
