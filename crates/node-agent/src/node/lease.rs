//! The node lease heartbeat: `kube-node-lease/<node>`, renewed every quarter of its duration.
//!
//! This module owns [`LeaseManager`]: once the Node exists it gets or creates the Lease (holder = node name,
//! `leaseDurationSeconds`, owner reference to the Node), then renews `spec.renewTime` with an optimistic-
//! concurrency PUT every `nodeLeaseDurationSeconds / 4` (10 s by default) with 4 % jitter, as the kubelet does.
//! A failed renewal is logged and retried with backoff (200 ms doubling to 7 s); a conflict re-reads the Lease.
//! When renewals succeed again after failing, the status loop is asked to re-check the Node (the
//! controller-manager may have marked it Unknown meanwhile).
//!
//! Per-agent state is the last Lease minus its managed fields.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::{NodeError, RegisteredNode};
use crate::api::{ApiCalls, is_already_exists, is_conflict, is_not_found};
use crate::backoff::{Backoff, BackoffPolicy, jittered};

/// The namespace of node leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Jitter of the renew interval (the kubelet's).
pub const RENEW_JITTER: f64 = 0.04;

/// The task keeping one node's lease fresh.
pub struct LeaseManager {
    api: Api<Lease>,
    calls: ApiCalls,
    node_name: String,
    duration_seconds: i32,
    renew_interval: Duration,
    registered: watch::Receiver<Option<RegisteredNode>>,
    recovered: Arc<Notify>,
    token: CancellationToken,
    lease: Option<Lease>,
    backoff: Backoff,
}

impl LeaseManager {
    /// A lease manager for `node_name`; it starts renewing once `registered` names the Node, and pokes
    /// `recovered` when renewals work again after failures.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: kube::Client,
        calls: ApiCalls,
        node_name: String,
        duration_seconds: u32,
        renew_interval: Duration,
        registered: watch::Receiver<Option<RegisteredNode>>,
        recovered: Arc<Notify>,
        token: CancellationToken,
    ) -> Self {
        Self {
            api: Api::namespaced(client, LEASE_NAMESPACE),
            calls,
            node_name,
            duration_seconds: i32::try_from(duration_seconds).unwrap_or(i32::MAX),
            renew_interval,
            registered,
            recovered,
            token,
            lease: None,
            backoff: Backoff::new(BackoffPolicy::lease_retry()),
        }
    }

    /// Renews until the token fires.
    pub async fn run(mut self) {
        // Wait for the Node: the lease carries an owner reference to it.
        let mut owner = loop {
            if let Some(n) = self.registered.borrow_and_update().clone() {
                break n;
            }
            tokio::select! {
                changed = self.registered.changed() => if changed.is_err() { return },
                () = self.token.cancelled() => return,
            }
        };
        loop {
            if self.registered.has_changed().unwrap_or(false)
                && let Some(n) = self.registered.borrow_and_update().clone()
            {
                owner = n;
            }
            let delay = match self.renew(&owner).await {
                Ok(()) => {
                    if self.backoff.attempts() > 0 {
                        tracing::info!(node = %self.node_name, failures = self.backoff.attempts(), "node lease renewed again");
                        self.recovered.notify_one();
                    }
                    self.backoff.reset();
                    jittered(self.renew_interval, RENEW_JITTER)
                }
                Err(e) => {
                    let d = self.backoff.next_delay();
                    tracing::warn!(node = %self.node_name, error = %e, retry_in = ?d, "failed to renew node lease");
                    d
                }
            };
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = self.token.cancelled() => return,
            }
        }
    }

    fn owner_reference(owner: &RegisteredNode) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: owner.name.clone(),
            uid: owner.uid.clone(),
            ..Default::default()
        }
    }

    fn new_lease(&self, owner: &RegisteredNode, now: Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.node_name.clone()),
                namespace: Some(LEASE_NAMESPACE.into()),
                owner_references: Some(vec![Self::owner_reference(owner)]),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.node_name.clone()),
                lease_duration_seconds: Some(self.duration_seconds),
                renew_time: Some(MicroTime(now)),
                ..Default::default()
            }),
        }
    }

    fn keep(&mut self, mut lease: Lease) {
        lease.metadata.managed_fields = None;
        self.lease = Some(lease);
    }

    /// Makes sure the lease exists and is renewed now.
    async fn renew(&mut self, owner: &RegisteredNode) -> Result<(), NodeError> {
        let api_err = |verb: &'static str| {
            move |source| NodeError::Api {
                verb,
                resource: "leases",
                source,
            }
        };
        if self.lease.is_none() {
            let got = self
                .calls
                .run("get", "leases", self.api.get_opt(&self.node_name))
                .await
                .map_err(api_err("get"))?;
            match got {
                Some(l) => self.keep(l),
                None => {
                    let lease = self.new_lease(owner, Timestamp::now());
                    match self
                        .calls
                        .run(
                            "create",
                            "leases",
                            self.api.create(&PostParams::default(), &lease),
                        )
                        .await
                    {
                        Ok(created) => {
                            self.keep(created);
                            return Ok(());
                        }
                        Err(e) if is_already_exists(&e) => return Err(api_err("create")(e)),
                        Err(e) => return Err(api_err("create")(e)),
                    }
                }
            }
        }
        let Some(mut lease) = self.lease.clone() else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(self.node_name.clone());
        spec.lease_duration_seconds = Some(self.duration_seconds);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        let refs = lease.metadata.owner_references.get_or_insert_with(Vec::new);
        if !refs.iter().any(|r| r.kind == "Node" && r.uid == owner.uid) {
            refs.retain(|r| r.kind != "Node");
            refs.push(Self::owner_reference(owner));
        }
        match self
            .calls
            .run(
                "update",
                "leases",
                self.api.replace(&self.node_name, &PostParams::default(), &lease),
            )
            .await
        {
            Ok(updated) => {
                self.keep(updated);
                Ok(())
            }
            Err(e) => {
                if is_conflict(&e) || is_not_found(&e) {
                    // Stale or gone: read it again next time.
                    self.lease = None;
                }
                Err(api_err("update")(e))
            }
        }
    }
}
