//! The node lease heartbeat: `kube-node-lease/<node>`, renewed every quarter of its duration.
//!
//! This module owns [`LeaseManager`]: once the Node exists it gets or creates the Lease (holder = node name,
//! `leaseDurationSeconds`, owner reference to the Node), then renews `spec.renewTime` with an optimistic-
//! concurrency PUT every `nodeLeaseDurationSeconds / 4` (10 s by default) with 4 % jitter, as the kubelet does
//! (the deadline on the process-wide [`grid`](crate::density::grid), within the jitter).
//! A failed renewal is logged and retried with backoff (200 ms doubling to 7 s); a conflict re-reads the Lease.
//! When renewals succeed again after failing, the status loop is asked to re-check the Node (the
//! controller-manager may have marked it Unknown meanwhile).
//!
//! The schedule (wait for the Node, renew, back off, signal recovery) lives in [`LeaseManager::run`], generic
//! over [`LeaseRenewer`] so it is unit-tested on paused time without an API server; [`ApiLease`] is the
//! renewal against the API server. Per-agent state is the last Lease minus its managed fields.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::time::Instant;

use super::kept_lease::{KeptLease, LEASE_NAMESPACE};
use super::{NodeError, RegisteredNode};
use crate::api::{ApiCalls, is_conflict, is_not_found};
use crate::backoff::{Backoff, BackoffPolicy};
use crate::density::periodic::next_tick;
use crate::density::poke::Poke;
use crate::density::watch;

/// Jitter of the renew interval (the kubelet's).
pub const RENEW_JITTER: f64 = 0.04;

/// One renewal: make sure the lease exists, names `owner` and was renewed now.
pub trait LeaseRenewer: Send {
    /// Renews the lease of the Node `owner` (creating it if needed).
    fn renew(&mut self, owner: &RegisteredNode) -> impl Future<Output = Result<(), NodeError>> + Send;
}

/// The task keeping one node's lease fresh.
pub struct LeaseManager<R = ApiLease> {
    renewer: R,
    renew_interval: Duration,
    registered: watch::Receiver<Option<RegisteredNode>>,
    recovered: Arc<Poke>,
    /// The retry sequence, made at the first failure and dropped at the next success (boxed: the idle task
    /// holds this for the node's life, and renewals mostly succeed).
    backoff: Option<Box<Backoff>>,
    heartbeats: super::Heartbeats,
    timer: crate::density::timer::Timer,
}

impl LeaseManager {
    /// A lease manager for `node_name`; it starts renewing once `registered` names the Node, and pokes
    /// `recovered` when renewals work again after failures.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: impl Into<crate::client::ApiClient>,
        calls: ApiCalls,
        node_name: String,
        duration_seconds: u32,
        renew_interval: Duration,
        registered: watch::Receiver<Option<RegisteredNode>>,
        recovered: Arc<Poke>,
    ) -> Self {
        let renewer = ApiLease {
            client: client.into(),
            calls,
            node_name: node_name.clone(),
            duration_seconds: i32::try_from(duration_seconds).unwrap_or(i32::MAX),
            lease: None,
        };
        Self::with_renewer(renewer, renew_interval, registered, recovered)
    }
}

impl<R: LeaseRenewer + 'static> LeaseManager<R> {
    /// A lease manager renewing through `renewer`.
    pub fn with_renewer(
        renewer: R,
        renew_interval: Duration,
        registered: watch::Receiver<Option<RegisteredNode>>,
        recovered: Arc<Poke>,
    ) -> Self {
        Self {
            renewer,
            renew_interval,
            registered,
            recovered,
            backoff: None,
            heartbeats: super::Heartbeats::default(),
            timer: crate::density::timer::Timer::new(),
        }
    }

    /// Wait for the next renewal on `timer` (the agent's, shared by a fleet's agents) instead of one of its own.
    pub fn with_timer(mut self, timer: crate::density::timer::Timer) -> Self {
        self.timer = timer;
        self
    }

    /// Renewals stop while `heartbeats` is paused.
    pub fn with_heartbeats(mut self, heartbeats: super::Heartbeats) -> Self {
        self.heartbeats = heartbeats;
        self
    }

    /// Renews until dropped (the agent drops it where it waits when its token fires, see
    /// `agent::supervise`): at once when the Node is known, then every renew interval (jittered 4 %);
    /// after a failure 200 ms doubling to 7 s (jittered 10 %).
    pub fn run(mut self) -> impl Future<Output = ()> + Send + 'static {
        async move {
            // Wait for the Node: the lease carries an owner reference to it.
            while self.registered.borrow_and_update().is_none() {
                if self.registered.changed().await.is_err() {
                    return;
                }
            }
            loop {
                self.heartbeats.wait_running().await;
                // the Node as registered now (a re-registration gives it a new UID); the copy lives only in
                // the boxed renewal, not in the idle task
                let Some(owner) = self.registered.borrow_and_update().clone() else {
                    // not reached: registration only ever publishes a Node
                    return;
                };
                // the renewal and what it decides, in a box: its result and the Node's copy are gone before the
                // wait for the next one, so the idle task does not keep room for them
                let (renewer, backoff, recovered) = (&mut self.renewer, &mut self.backoff, &self.recovered);
                // `None`: the next renewal is periodic
                let retry = Box::pin(async move {
                    match renewer.renew(&owner).await {
                        Ok(()) => {
                            if let Some(backoff) = backoff.take() {
                                tracing::info!(node = %owner.name, failures = backoff.attempts(), "node lease renewed again");
                                recovered.notify_one();
                            }
                            None
                        }
                        Err(e) => {
                            let d = Backoff::in_slot(backoff, BackoffPolicy::lease_retry()).next_delay();
                            tracing::warn!(node = %owner.name, error = %e, retry_in = ?d, "failed to renew node lease");
                            Some(d)
                        }
                    }
                })
                .await;
                match retry {
                    None => {
                        let next = next_tick(Instant::now(), self.renew_interval, RENEW_JITTER);
                        self.timer.sleep_until(next).await;
                    }
                    // a retry keeps its exact delay (boxed: the idle task holds the shared timer's wait)
                    Some(d) => Box::pin(tokio::time::sleep(d)).await,
                }
            }
        }
    }
}

/// An API error of `verb` on leases, as a node error.
fn api_err(verb: &'static str) -> impl Fn(kube::Error) -> NodeError {
    move |source| NodeError::Api {
        verb,
        resource: "leases",
        source,
    }
}

/// Renewal against the API server: get or create the Lease once, then optimistic-concurrency PUTs; a conflict or
/// a vanished Lease makes the next renewal read it again.
pub struct ApiLease {
    /// The client (an `Api` is built per request: it is larger than the client, and idle between renewals).
    client: crate::client::ApiClient,
    calls: ApiCalls,
    node_name: String,
    duration_seconds: i32,
    /// The Lease as last written or read, reduced to what a renewal does not set again (boxed, and written
    /// over in place at each renewal: the idle node side holds this for the node's life).
    lease: Option<Box<KeptLease>>,
}

impl LeaseRenewer for ApiLease {
    async fn renew(&mut self, owner: &RegisteredNode) -> Result<(), NodeError> {
        self.renew_once(owner).await
    }
}

impl ApiLease {
    fn api(&self) -> Api<Lease> {
        Api::namespaced(self.client.kube(), LEASE_NAMESPACE)
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

    fn keep(&mut self, lease: Lease) {
        let kept = KeptLease::of(lease, &self.node_name);
        self.keep_reduced(kept);
    }

    fn keep_reduced(&mut self, kept: KeptLease) {
        match &mut self.lease {
            Some(held) => **held = kept,
            None => self.lease = Some(Box::new(kept)),
        }
    }

    /// Reads the Lease (kept for the renewal that follows), or creates it when there is none: `true` when it was
    /// created (renewed by that).
    async fn read_or_create(&mut self, owner: &RegisteredNode) -> Result<bool, NodeError> {
        let got = self
            .calls
            .run("get", "leases", self.api().get_opt(&self.node_name))
            .await
            .map_err(api_err("get"))?;
        if let Some(l) = got {
            self.keep(l);
            return Ok(false);
        }
        let lease = self.new_lease(owner, Timestamp::now());
        let created = self
            .calls
            .run(
                "create",
                "leases",
                self.api().create(&PostParams::default(), &lease),
            )
            .await
            .map_err(api_err("create"))?;
        self.keep(created);
        Ok(true)
    }

    /// The body of the renewal: the kept Lease renewed now, held by this agent and owned by `owner` (`None`
    /// without a kept Lease).
    fn renewal_body(&self, owner: &RegisteredNode) -> Option<Result<Vec<u8>, serde_json::Error>> {
        let mut lease = self.lease.as_ref()?.to_lease(&self.node_name);
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(self.node_name.clone());
        spec.lease_duration_seconds = Some(self.duration_seconds);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        let refs = lease.metadata.owner_references.get_or_insert_with(Vec::new);
        if !refs.iter().any(|r| r.kind == "Node" && r.uid == owner.uid) {
            refs.retain(|r| r.kind != "Node");
            refs.push(Self::owner_reference(owner));
        }
        Some(serde_json::to_vec(&lease))
    }

    /// Makes sure the lease exists and is renewed now. A renewal in flight is this future (boxed by the lease
    /// task) for as long as the API server takes to answer — seconds, on a control plane saturated by thousands of
    /// nodes, with thousands of them in flight at once — so it holds only the update: the first read or create is
    /// boxed apart, and the Lease is serialized before the request is sent, not kept beside it.
    async fn renew_once(&mut self, owner: &RegisteredNode) -> Result<(), NodeError> {
        if self.lease.is_none() && Box::pin(self.read_or_create(owner)).await? {
            return Ok(());
        }
        let request = match self.renewal_body(owner) {
            None => return Ok(()),
            Some(Err(e)) => return Err(api_err("update")(kube::Error::SerdeError(e))),
            Some(Ok(body)) => crate::client::namespaced::<Lease>(LEASE_NAMESPACE).replace(
                &self.node_name,
                &PostParams::default(),
                body,
            ),
        };
        match self
            .calls
            .run("update", "leases", self.client.text(request))
            .await
            .and_then(|answer| {
                KeptLease::from_answer(&answer, &self.node_name).map_err(kube::Error::SerdeError)
            }) {
            Ok(kept) => {
                self.keep_reduced(kept);
                Ok(())
            }
            Err(e @ kube::Error::SerdeError(_)) => {
                // renewed, but what the server holds now is unknown: read it again next time
                self.lease = None;
                Err(api_err("update")(e))
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures::FutureExt;
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;

    use super::*;

    /// Records every renewal (when, for which owner UID); fails the next `fail` of them.
    #[derive(Clone, Default)]
    struct Recorder {
        calls: Arc<Mutex<Vec<(Instant, String)>>>,
        fail: Arc<Mutex<u32>>,
    }

    impl Recorder {
        fn calls(&self) -> Vec<(Instant, String)> {
            self.calls.lock().unwrap().clone()
        }
        fn gaps(&self) -> Vec<Duration> {
            self.calls().windows(2).map(|w| w[1].0 - w[0].0).collect()
        }
        fn fail_next(&self, n: u32) {
            *self.fail.lock().unwrap() = n;
        }
    }

    impl LeaseRenewer for Recorder {
        async fn renew(&mut self, owner: &RegisteredNode) -> Result<(), NodeError> {
            self.calls
                .lock()
                .unwrap()
                .push((Instant::now(), owner.uid.clone()));
            let mut fail = self.fail.lock().unwrap();
            if *fail > 0 {
                *fail -= 1;
                return Err(NodeError::NotRegistered("injected".into()));
            }
            Ok(())
        }
    }

    fn node(uid: &str) -> Option<RegisteredNode> {
        Some(RegisteredNode {
            name: "n1".into(),
            uid: uid.into(),
        })
    }

    struct Harness {
        rec: Recorder,
        registered: watch::Sender<Option<RegisteredNode>>,
        recovered: Arc<Poke>,
        token: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    /// A lease manager with the default renew interval (10 s), renewing through a recorder.
    fn start(owner: Option<RegisteredNode>) -> Harness {
        let rec = Recorder::default();
        let (registered, rx) = watch::channel(owner);
        let recovered = Arc::new(Poke::new());
        let token = CancellationToken::new();
        let token_for_task = token.clone();
        let interval = crate::config::KubeletConfig::default().lease_renew_interval();
        assert_eq!(interval, Duration::from_secs(10));
        let m = LeaseManager::with_renewer(rec.clone(), interval, rx, recovered.clone());
        // stopped as the agent stops it: dropped where it waits
        let task = tokio::spawn(async move {
            let _ = token_for_task.run_until_cancelled_owned(m.run()).await;
        });
        Harness {
            rec,
            registered,
            recovered,
            token,
            task,
        }
    }

    /// `gap` is `base` stretched by less than `jitter` (plus the paused clock's 1 ms rounding).
    fn within(gap: Duration, base: Duration, jitter: f64) -> bool {
        gap >= base && gap <= base + base.mul_f64(jitter) + Duration::from_millis(1)
    }

    #[tokio::test(start_paused = true)]
    async fn renews_once_the_node_exists_then_every_ten_seconds_with_jitter() {
        let h = start(None);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(h.rec.calls().is_empty(), "no lease before the Node exists");

        let registered_at = Instant::now();
        h.registered.send_replace(node("u1"));
        tokio::time::sleep(Duration::from_secs(63)).await;
        let calls = h.rec.calls();
        assert_eq!(
            calls[0].0, registered_at,
            "first renewal as soon as the Node exists"
        );
        let gaps = h.rec.gaps();
        assert!(gaps.len() >= 6, "{} renewals in 63 s", calls.len());
        for g in &gaps {
            assert!(within(*g, Duration::from_secs(10), RENEW_JITTER), "gap {g:?}");
        }
        assert!(
            gaps.iter().any(|g| *g != gaps[0]),
            "periods are jittered, not lock-step: {gaps:?}"
        );

        h.token.cancel();
        tokio::time::timeout(Duration::from_millis(1), h.task)
            .await
            .expect("stops at once when cancelled")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn failed_renewals_back_off_200ms_doubling_to_7s_then_signal_recovery() {
        let h = start(node("u1"));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(h.rec.calls().len(), 1);
        h.rec.fail_next(9);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(
            h.recovered.notified().now_or_never().is_none(),
            "no recovery signal while renewals merely work or are failing"
        );
        tokio::time::sleep(Duration::from_secs(50)).await;

        let gaps = h.rec.gaps();
        assert!(gaps.len() >= 11, "{gaps:?}");
        assert!(within(gaps[0], Duration::from_secs(10), RENEW_JITTER), "{gaps:?}");
        // calls 1..=9 fail: each is followed by the next backoff step (10 % jitter)
        for (i, ms) in [200, 400, 800, 1600, 3200, 6400, 7000, 7000, 7000]
            .into_iter()
            .enumerate()
        {
            let g = gaps[i + 1];
            assert!(
                within(g, Duration::from_millis(ms), 0.1),
                "retry {i}: {g:?}, expected {ms} ms + <10 %"
            );
        }
        // call 10 succeeds: back to the renew interval, backoff reset, the status loop poked once
        assert!(
            within(gaps[10], Duration::from_secs(10), RENEW_JITTER),
            "{gaps:?}"
        );
        assert!(
            h.recovered.notified().now_or_never().is_some(),
            "recovery signalled"
        );
        assert!(h.recovered.notified().now_or_never().is_none(), "signalled once");
        h.rec.fail_next(1);
        tokio::time::sleep(Duration::from_secs(11)).await;
        let gaps = h.rec.gaps();
        let after_second_failure = gaps[gaps.len() - 1];
        assert!(
            within(after_second_failure, Duration::from_millis(200), 0.1),
            "a later failure starts over at 200 ms: {after_second_failure:?}"
        );
        h.token.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_registered_again_becomes_the_owner_at_the_next_renewal() {
        let h = start(node("u1"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        h.registered.send_replace(node("u2"));
        tokio::time::sleep(Duration::from_secs(10)).await;
        let owners: Vec<String> = h.rec.calls().into_iter().map(|(_, uid)| uid).collect();
        assert_eq!(owners, vec!["u1".to_string(), "u2".to_string()]);
        h.token.cancel();
    }

    /// A renewal in flight is held for as long as the API server takes to answer (seconds each, thousands at once,
    /// on a control plane saturated by a fleet): it holds the update's request and not room for the first read
    /// or create beside it, nor the serialized Lease across the request (docs/density.md has the sizes).
    #[tokio::test]
    async fn a_renewal_in_flight_holds_only_the_update() {
        let service = tower::service_fn(|_req: http::Request<kube::client::Body>| {
            std::future::pending::<Result<http::Response<kube::client::Body>, std::convert::Infallible>>()
        });
        let mut lease = ApiLease {
            client: kube::Client::new(service, "default").into(),
            calls: ApiCalls::new(Arc::new(crate::metrics::Metrics::unregistered()), 0, 0),
            node_name: "sizes".into(),
            duration_seconds: 40,
            lease: None,
        };
        let owner = RegisteredNode {
            name: "sizes".into(),
            uid: "uid".into(),
        };
        let update = {
            let request = crate::client::namespaced::<Lease>(LEASE_NAMESPACE).replace(
                "sizes",
                &PostParams::default(),
                vec![],
            );
            size_of_val(&lease.calls.run("update", "leases", lease.client.text(request)))
        };
        let renewal = size_of_val(&lease.renew_once(&owner));
        println!("lease update request {update} bytes, renewal {renewal} bytes");
        assert!(
            renewal <= update + 64,
            "{renewal} bytes against the update's {update}"
        );
    }
}
