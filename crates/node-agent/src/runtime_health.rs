//! Container runtime health, polled from CRI `Status` (and `Version`) every 5 seconds.
//!
//! This module owns [`RuntimeHealthMonitor`], the task that asks the runtime how it is, and [`RuntimeHealth`],
//! the snapshot it publishes on a `watch` channel for the node status loop (and later the pod workers):
//! whether and when the runtime last answered ready, the runtime and network errors in the kubelet's wording,
//! and the runtime's name and version. Receivers are only woken when something other than the last-sync time
//! changes, so an idle healthy runtime costs one CRI call per period and no wake-ups.

use std::sync::Arc;
use std::time::Duration;

use runtime_api::{Runtime, cri};
use tokio::time::Instant;

use crate::density::periodic::JitteredInterval;
use crate::density::poke::Poke;
use crate::density::watch;

/// How often the runtime is asked for its status (the kubelet's value).
pub const POLL_PERIOD: Duration = Duration::from_secs(5);
/// How long after the last good status the runtime counts as down (the kubelet's value).
pub const DOWN_AFTER: Duration = Duration::from_secs(30);
/// The CRI API version this agent speaks.
pub const CRI_API_VERSION: &str = "v1";

/// The runtime's name and version, from CRI `Version`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RuntimeVersion {
    /// e.g. `containerd`.
    pub name: String,
    /// e.g. `1.6.20`.
    pub version: String,
}

impl RuntimeVersion {
    /// `nodeInfo.containerRuntimeVersion`: `<name>://<version>`.
    pub fn node_info_string(&self) -> String {
        format!("{}://{}", self.name, self.version)
    }
}

/// What is known about the runtime's health.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeHealth {
    /// When the runtime last answered `Status` with RuntimeReady=true.
    pub last_sync: Option<Instant>,
    /// Why the runtime is not ready (RuntimeReady false or missing), in the kubelet's words.
    pub runtime_error: Option<String>,
    /// Why the pod network is not ready; `Some("network state unknown")` until the first answer.
    pub network_error: Option<String>,
    /// The runtime's name and version once known.
    pub version: Option<RuntimeVersion>,
    /// Runtime handlers and their features, as `Status` reported them.
    pub handlers: Vec<cri::RuntimeHandler>,
    /// Whether the runtime supports `supplementalGroupsPolicy` (`Status` features), if it said.
    pub supplemental_groups_policy: Option<bool>,
}

impl RuntimeHealth {
    /// The state before the runtime has ever answered.
    pub fn initial() -> Self {
        Self {
            network_error: Some("network state unknown".into()),
            ..Default::default()
        }
    }

    /// The runtime problems at `now`, in the kubelet's words (empty when the runtime is healthy).
    pub fn runtime_errors(&self, now: Instant) -> Vec<String> {
        let mut errs = Vec::new();
        match self.last_sync {
            None => errs.push("container runtime status check may not have completed yet".to_owned()),
            Some(t) if now.saturating_duration_since(t) >= DOWN_AFTER => {
                errs.push("container runtime is down".to_owned())
            }
            Some(_) => {}
        }
        if let Some(e) = &self.runtime_error {
            errs.push(e.clone());
        }
        errs
    }

    /// The network problems, in the kubelet's words.
    pub fn network_errors(&self) -> Vec<String> {
        self.network_error.iter().cloned().collect()
    }

    /// Whether the runtime is up and its network ready at `now`.
    pub fn is_healthy(&self, now: Instant) -> bool {
        self.runtime_errors(now).is_empty() && self.network_error.is_none()
    }

    /// Equality ignoring `last_sync` (which moves on every good poll).
    fn same_state(&self, other: &Self) -> bool {
        self.runtime_error == other.runtime_error
            && self.network_error == other.network_error
            && self.version == other.version
            && self.handlers == other.handlers
            && self.supplemental_groups_policy == other.supplemental_groups_policy
            && self.last_sync.is_some() == other.last_sync.is_some()
    }
}

/// Formats a CRI runtime condition the way the kubelet prints one in the Ready message.
fn describe(cond: Option<&cri::RuntimeCondition>) -> String {
    match cond {
        None => "<nil>".into(),
        Some(c) => format!(
            "{}={} reason:{} message:{}",
            c.r#type, c.status, c.reason, c.message
        ),
    }
}

/// The task polling the runtime. A clone polls into the same channel (the agent keeps one to start again after a
/// crash).
#[derive(Clone)]
pub struct RuntimeHealthMonitor {
    runtime: Arc<dyn Runtime>,
    tx: watch::Sender<RuntimeHealth>,
    timeout: Duration,
    recheck: Arc<Poke>,
    timer: crate::density::timer::Timer,
}

impl RuntimeHealthMonitor {
    /// A monitor for `runtime` (calls time out after `timeout`) and the receiver of its snapshots.
    pub fn new(runtime: Arc<dyn Runtime>, timeout: Duration) -> (Self, watch::Receiver<RuntimeHealth>) {
        let (tx, rx) = watch::channel(RuntimeHealth::initial());
        (
            Self {
                runtime,
                tx,
                timeout,
                recheck: Arc::new(Poke::new()),
                timer: crate::density::timer::Timer::new(),
            },
            rx,
        )
    }

    /// Wait between polls on `timer` (the agent's, shared by a fleet's agents) instead of one of its own.
    pub fn with_timer(mut self, timer: crate::density::timer::Timer) -> Self {
        self.timer = timer;
        self
    }

    /// Poking this makes the monitor poll at once (e.g. after the runtime was given its pod CIDR).
    pub fn recheck_handle(&self) -> Arc<Poke> {
        self.recheck.clone()
    }

    /// Polls immediately, then every [`POLL_PERIOD`] (jittered) and whenever asked to recheck, until dropped
    /// (the agent drops it where it waits when its token fires, see `agent::supervise`).
    pub fn run(self) -> impl Future<Output = ()> + Send + 'static {
        async move {
            let mut interval = JitteredInterval::immediate(POLL_PERIOD, 0.1);
            loop {
                // the timer's wait and the poke polled by hand: `tokio::select!`'s branch futures and
                // bookkeeping would sit in the idle task
                let mut tick = self.timer.sleep_until(interval.deadline());
                let recheck = &self.recheck;
                let due = std::future::poll_fn(|cx| {
                    if std::pin::Pin::new(&mut tick).poll(cx).is_ready() {
                        return std::task::Poll::Ready(true);
                    }
                    std::pin::pin!(recheck.notified()).poll(cx).map(|()| false)
                })
                .await;
                drop(tick);
                if due {
                    interval.advance(Instant::now());
                }
                // boxed: the idle task keeps its waits, not room for a poll and its timeout
                Box::pin(self.poll()).await;
            }
        }
    }

    /// One poll: `Status`, and `Version` when not yet known or after the runtime came back.
    pub async fn poll(&self) {
        let status = tokio::time::timeout(
            self.timeout,
            self.runtime.status(cri::StatusRequest { verbose: false }),
        )
        .await;
        let status = match status {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                // Leave the state alone: after DOWN_AFTER without a good answer the runtime counts as down.
                tracing::warn!(error = %e, "container runtime status check failed");
                return;
            }
            Err(_) => {
                tracing::warn!(timeout = ?self.timeout, "container runtime status check timed out");
                return;
            }
        };
        let handlers = status.runtime_handlers;
        let supplemental_groups_policy = status.features.map(|f| f.supplemental_groups_policy);
        let conditions = status.status.map(|s| s.conditions).unwrap_or_default();
        let find = |t: &str| conditions.iter().find(|c| c.r#type == t);
        let network = find("NetworkReady");
        let network_error = match network {
            Some(c) if c.status => None,
            other => Some(format!(
                "container runtime network not ready: {}",
                describe(other)
            )),
        };
        let runtime = find("RuntimeReady");
        let runtime_ok = runtime.is_some_and(|c| c.status);
        let runtime_error = if runtime_ok {
            None
        } else {
            Some(format!("container runtime not ready: {}", describe(runtime)))
        };

        let was_down = self
            .tx
            .borrow()
            .last_sync
            .is_none_or(|t| Instant::now().saturating_duration_since(t) >= DOWN_AFTER);
        let mut version = self.tx.borrow().version.clone();
        if runtime_ok && (version.is_none() || was_down) {
            match tokio::time::timeout(
                self.timeout,
                self.runtime.version(cri::VersionRequest {
                    version: CRI_API_VERSION.into(),
                }),
            )
            .await
            {
                Ok(Ok(v)) => {
                    version = Some(RuntimeVersion {
                        name: v.runtime_name,
                        version: v.runtime_version,
                    });
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "container runtime version check failed"),
                Err(_) => tracing::warn!("container runtime version check timed out"),
            }
        }

        let next = RuntimeHealth {
            last_sync: if runtime_ok {
                Some(Instant::now())
            } else {
                self.tx.borrow().last_sync
            },
            runtime_error,
            network_error,
            version,
            handlers,
            supplemental_groups_policy,
        };
        self.tx.send_if_modified(|cur| {
            let notify = !cur.same_state(&next);
            if notify {
                tracing::info!(
                    runtime_error = ?next.runtime_error,
                    network_error = ?next.network_error,
                    "container runtime state changed"
                );
            }
            *cur = next;
            notify
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestRuntime;
    use tokio_util::sync::CancellationToken;

    #[tokio::test(start_paused = true)]
    async fn reports_ready_then_not_ready_with_the_kubelets_wording() {
        let rt = Arc::new(TestRuntime::new());
        let (m, rx) = RuntimeHealthMonitor::new(rt.clone(), Duration::from_secs(2));
        let now = Instant::now();
        assert_eq!(
            rx.borrow().runtime_errors(now),
            vec!["container runtime status check may not have completed yet".to_string()]
        );
        assert_eq!(
            rx.borrow().network_errors(),
            vec!["network state unknown".to_string()]
        );

        m.poll().await;
        let h = rx.borrow().clone();
        assert!(h.is_healthy(Instant::now()), "{h:?}");
        assert_eq!(
            h.version
                .as_ref()
                .map(RuntimeVersion::node_info_string)
                .as_deref(),
            Some("fake-runtime://0.1.0")
        );

        rt.set_runtime_ready(false);
        m.poll().await;
        let errs = rx.borrow().runtime_errors(Instant::now());
        assert_eq!(
            errs,
            vec![
                "container runtime not ready: RuntimeReady=false reason:RuntimeDown message:test says so"
                    .to_string()
            ]
        );

        rt.set_runtime_ready(true);
        rt.set_network_ready(false);
        m.poll().await;
        assert_eq!(
            rx.borrow().network_errors(),
            vec!["container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:test says so".to_string()]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn runtime_counts_as_down_thirty_seconds_after_the_last_good_answer() {
        let rt = Arc::new(TestRuntime::new());
        let (m, mut rx) = RuntimeHealthMonitor::new(rt.clone(), Duration::from_secs(2));
        m.poll().await;
        rx.mark_unchanged();
        rt.set_unreachable(true);
        for _ in 0..5 {
            tokio::time::advance(POLL_PERIOD).await;
            m.poll().await;
        }
        assert!(!rx.has_changed().unwrap(), "failed polls do not wake receivers");
        assert!(
            rx.borrow().runtime_errors(Instant::now()).is_empty(),
            "25 s: not yet down"
        );
        tokio::time::advance(POLL_PERIOD).await;
        assert_eq!(
            rx.borrow().runtime_errors(Instant::now()),
            vec!["container runtime is down".to_string()]
        );
        rt.set_unreachable(false);
        m.poll().await;
        assert!(rx.borrow().is_healthy(Instant::now()));
        assert_eq!(
            rt.version_calls(),
            2,
            "version asked again after the runtime came back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn run_polls_every_five_seconds_until_dropped() {
        let rt = Arc::new(TestRuntime::new());
        let token = CancellationToken::new();
        let (m, _rx) = RuntimeHealthMonitor::new(rt.clone(), Duration::from_secs(2));
        let task = tokio::spawn(token.clone().run_until_cancelled_owned(m.run()));
        tokio::time::sleep(Duration::from_secs(61)).await;
        let calls = rt.status_calls();
        // 1 immediate + one per 5-5.5 s
        assert!((11..=13).contains(&calls), "{calls} status calls in 61 s");
        token.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_recheck_polls_at_once() {
        let rt = Arc::new(TestRuntime::new());
        let token = CancellationToken::new();
        let (m, rx) = RuntimeHealthMonitor::new(rt.clone(), Duration::from_secs(2));
        let recheck = m.recheck_handle();
        let task = tokio::spawn(token.clone().run_until_cancelled_owned(m.run()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(rx.borrow().is_healthy(Instant::now()));
        rt.set_network_ready(false);
        recheck.notify_one();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(rt.status_calls(), 2, "polled on the recheck, not 5 s later");
        assert!(!rx.borrow().network_errors().is_empty());
        token.cancel();
        task.await.unwrap();
    }
}
