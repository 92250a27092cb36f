//! Supervision of the node-side managers: one that panics or whose loop ends while the agent runs is logged,
//! counted (`node_agent_manager_restarts_total{manager}`) and built again from the agent's [`NodeSide`] after a
//! back-off, while the others keep going — garbage collection crashing at every pass does not take the lease or
//! the node status with it.
//!
//! The back-off is 1 s doubling to 1 min (10 % jitter), started over after 2 min without a crash: a manager that
//! crashed once is back within a second, and one that crashes at every start (its inputs make it panic) is
//! started once a minute, not in a loop that fills the log. The kubelet has no such restart (a panic in one of
//! its loops ends the process, and systemd starts it again); here the other managers keep the node's lease and
//! status current meanwhile.
//!
//! The seven managers are one task ([`node_side`]): a join that polls only the branches woken (the wakers of
//! [`crate::density::join`]). Supervision lives in that join: a branch is its manager's future (or nothing,
//! while it waits to start again); the task holds one pointer to the [`NodeSide`] the managers are rebuilt from,
//! and one to the branches' back-offs and restart waits, made at the first crash. A hollow node still costs one
//! task, and supervision two pointers of it.
//!
//! When the agent's token fires, every branch but the event writer's is dropped where it waits (none holds a
//! cancellation wait of its own) and the writer, which waits on the token itself and so wakes the join, drains
//! its queue; a restart wait ends early then, and the manager is not started again.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt;
use futures::future::CatchUnwind;

use super::node_side::NodeSide;
use crate::backoff::{Backoff, BackoffPolicy};
use crate::density::join::Wakers;

/// Which node-side manager a branch runs: its name in logs and in the restart counter, and its place in the
/// join (the event writer first: it is the branch that waits on the agent's token).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Manager {
    /// The event writer.
    EventSink,
    /// The runtime health monitor.
    RuntimeHealth,
    /// Registration and node status.
    NodeStatus,
    /// The node lease.
    Lease,
    /// The watch of the node's Node object.
    NodeInformer,
    /// Container and image garbage collection.
    Gc,
    /// Node-pressure eviction.
    Eviction,
}

/// How many managers the node side runs.
const MANAGERS: usize = 7;

impl Manager {
    /// The name logs and the restart counter use.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::EventSink => "event_sink",
            Self::RuntimeHealth => "runtime_health",
            Self::NodeStatus => "node_status",
            Self::Lease => "lease",
            Self::NodeInformer => "node_informer",
            Self::Gc => "gc",
            Self::Eviction => "eviction",
        }
    }
}

/// The restart schedule (see the module).
pub(crate) fn restart_policy() -> BackoffPolicy {
    const RESTART: BackoffPolicy =
        BackoffPolicy::const_new(Duration::from_secs(1), Duration::from_secs(60), 0.1);
    RESTART.with_reset_after(Duration::from_secs(120))
}

/// One manager's restart state.
#[derive(Default)]
pub(crate) struct Restart {
    /// Made at its first crash.
    backoff: Option<Backoff>,
    /// The wait before its next start, while one is due (it ends early when the agent stops).
    wait: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

/// Every manager's restart state, made at the first crash of any.
type Restarts = [Restart; MANAGERS];

/// A branch's manager, while it runs (`None` while it waits to start again, and after it ended).
type Running<Fut> = Option<CatchUnwind<AssertUnwindSafe<Fut>>>;

pin_project_lite::pin_project! {
    /// One supervised branch: its manager's future and how to build it again.
    pub(crate) struct Branch<M, Fut> {
        #[pin]
        running: Running<Fut>,
        make: M,
    }
}

/// Supervises the manager `make` builds from `side` (built now, and again at every restart).
pub(crate) fn branch<M, Fut>(side: &NodeSide, make: M) -> Branch<M, Fut>
where
    M: Fn(&NodeSide) -> Fut,
    Fut: Future<Output = ()>,
{
    Branch {
        running: Some(AssertUnwindSafe(make(side)).catch_unwind()),
        make,
    }
}

/// What the join needs of a branch, whatever its manager's type.
pub(crate) trait Supervised {
    /// Polls the branch (its manager, or its restart wait): whether it still runs.
    fn poll_supervised(
        self: Pin<&mut Self>,
        manager: Manager,
        side: &NodeSide,
        restarts: &mut Option<Box<Restarts>>,
        cx: &mut Context<'_>,
    ) -> bool;

    /// Drops the manager where it waits (the agent stops).
    fn stop(self: Pin<&mut Self>);

    /// Whether the manager runs now (and not only waits to start again).
    fn is_running(&self) -> bool;
}

/// The message of a caught panic.
fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a panic without a message)")
}

/// Waits `delay`, or until `token` fires.
fn restart_wait(
    delay: Duration,
    token: tokio_util::sync::CancellationToken,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = token.cancelled_owned() => {}
        }
    })
}

impl<M, Fut> Supervised for Branch<M, Fut>
where
    M: Fn(&NodeSide) -> Fut,
    Fut: Future<Output = ()>,
{
    fn poll_supervised(
        self: Pin<&mut Self>,
        manager: Manager,
        side: &NodeSide,
        restarts: &mut Option<Box<Restarts>>,
        cx: &mut Context<'_>,
    ) -> bool {
        let mut this = self.project();
        let (name, i) = (manager.name(), manager as usize);
        let node = &side.ctx.config.node_name;
        loop {
            if let Some(running) = this.running.as_mut().as_pin_mut() {
                let Poll::Ready(outcome) = running.poll(cx) else {
                    return true;
                };
                this.running.set(None);
                if side.ctx.token.is_cancelled() {
                    // the agent stops: the event writer ends after its drain (the others are dropped by the join)
                    if let Err(panic) = outcome {
                        let panic = panic_message(&*panic);
                        tracing::error!(manager = name, %node, %panic, "node-side manager panicked while the agent stops");
                    }
                    return false;
                }
                let restart = &mut restarts.get_or_insert_with(Box::default)[i];
                let delay = restart
                    .backoff
                    .get_or_insert_with(|| Backoff::new(restart_policy()))
                    .next_delay();
                match outcome {
                    Err(panic) => {
                        let panic = panic_message(&*panic);
                        tracing::error!(manager = name, %node, %panic, restart_in = ?delay, "node-side manager panicked; starting it again");
                    }
                    Ok(()) => {
                        tracing::error!(manager = name, %node, error = "its loop ended", restart_in = ?delay, "node-side manager ended unexpectedly; starting it again");
                    }
                }
                restart.wait = Some(restart_wait(delay, side.ctx.token.clone()));
            }
            let Some(restart) = restarts.as_mut().map(|r| &mut r[i]) else {
                return false;
            };
            let Some(wait) = restart.wait.as_mut() else {
                return false;
            };
            if wait.as_mut().poll(cx).is_pending() {
                return true;
            }
            restart.wait = None;
            if side.ctx.token.is_cancelled() {
                return false;
            }
            side.ctx.metrics.manager_restarted(name);
            tracing::info!(manager = name, %node, "starting node-side manager again");
            this.running
                .set(Some(AssertUnwindSafe((this.make)(side)).catch_unwind()));
        }
    }

    fn stop(self: Pin<&mut Self>) {
        self.project().running.set(None);
    }

    fn is_running(&self) -> bool {
        self.running.is_some()
    }
}

pin_project_lite::pin_project! {
    /// The node side of one agent as one task (see the module).
    #[must_use = "futures do nothing unless polled"]
    pub(crate) struct NodeSideTask<A, B, C, D, E, F, G> {
        #[pin]
        event_sink: A,
        #[pin]
        runtime_health: B,
        #[pin]
        node_status: C,
        #[pin]
        lease: D,
        #[pin]
        node_informer: E,
        #[pin]
        gc: F,
        #[pin]
        eviction: G,
        wakers: Wakers<MANAGERS>,
        side: Arc<NodeSide>,
        restarts: Option<Box<Restarts>>,
    }
}

/// Polls branch `manager` if it was woken (with its own waker): whether it still runs (or waits to start
/// again).
fn poll_one<S: Supervised + ?Sized>(
    branch: Pin<&mut S>,
    manager: Manager,
    woken: u32,
    wakers: &Wakers<MANAGERS>,
    side: &NodeSide,
    restarts: &mut Option<Box<Restarts>>,
) -> bool {
    let i = manager as usize;
    if woken & (1 << i) == 0 {
        return branch.is_running() || restarts.as_ref().is_some_and(|r| r[i].wait.is_some());
    }
    let mut cx = Context::from_waker(wakers.waker(i));
    branch.poll_supervised(manager, side, restarts, &mut cx)
}

impl<A, B, C, D, E, F, G> Future for NodeSideTask<A, B, C, D, E, F, G>
where
    A: Supervised,
    B: Supervised,
    C: Supervised,
    D: Supervised,
    E: Supervised,
    F: Supervised,
    G: Supervised,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        let woken = this.wakers.take_woken(cx);
        let side: &NodeSide = this.side;
        let restarts = this.restarts;
        if side.ctx.token.is_cancelled() {
            // every branch but the event writer's is dropped where it waits, and waits no more to start again
            this.runtime_health.as_mut().stop();
            this.node_status.as_mut().stop();
            this.lease.as_mut().stop();
            this.node_informer.as_mut().stop();
            this.gc.as_mut().stop();
            this.eviction.as_mut().stop();
            if let Some(r) = restarts.as_mut() {
                r.iter_mut().skip(1).for_each(|r| r.wait = None);
            }
        }
        let wakers: &Wakers<MANAGERS> = this.wakers;
        let mut running = false;
        running |= poll_one(this.event_sink, Manager::EventSink, woken, wakers, side, restarts);
        running |= poll_one(
            this.runtime_health,
            Manager::RuntimeHealth,
            woken,
            wakers,
            side,
            restarts,
        );
        running |= poll_one(
            this.node_status,
            Manager::NodeStatus,
            woken,
            wakers,
            side,
            restarts,
        );
        running |= poll_one(this.lease, Manager::Lease, woken, wakers, side, restarts);
        running |= poll_one(
            this.node_informer,
            Manager::NodeInformer,
            woken,
            wakers,
            side,
            restarts,
        );
        running |= poll_one(this.gc, Manager::Gc, woken, wakers, side, restarts);
        running |= poll_one(this.eviction, Manager::Eviction, woken, wakers, side, restarts);
        if running { Poll::Pending } else { Poll::Ready(()) }
    }
}

/// The node side of one agent: the seven managers, each supervised, joined in one future (see the module).
pub(crate) fn node_side(side: Arc<NodeSide>) -> impl Future<Output = ()> + Send + 'static {
    NodeSideTask {
        event_sink: branch(&side, |s: &NodeSide| s.event_sink().run()),
        runtime_health: branch(&side, |s: &NodeSide| s.health_monitor().run()),
        node_status: branch(&side, |s: &NodeSide| s.status().run()),
        lease: branch(&side, |s: &NodeSide| s.lease().run()),
        node_informer: branch(&side, |s: &NodeSide| s.informer().run()),
        gc: branch(&side, NodeSide::gc),
        eviction: branch(&side, NodeSide::eviction),
        wakers: Wakers::new(),
        side,
        restarts: None,
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;
    use crate::agent::Agent;
    use crate::config::{AgentConfig, KubeletConfig};
    use crate::machine::MachineInfo;
    use crate::metrics::Metrics;
    use crate::testing::{TestRuntime, pass};

    /// The node side of an agent whose API requests never get an answer.
    fn side(metrics: Arc<Metrics>) -> Arc<NodeSide> {
        let service = tower::service_fn(|_req: http::Request<kube::client::Body>| {
            std::future::pending::<Result<http::Response<kube::client::Body>, std::convert::Infallible>>()
        });
        let config = AgentConfig::new(
            "n1",
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            Arc::new(KubeletConfig::default()),
            MachineInfo::synthetic("n1"),
        );
        let agent = Agent::builder(
            config,
            kube::Client::new(service, "default"),
            Arc::new(TestRuntime::new()),
        )
        .metrics(metrics)
        .build()
        .expect("a valid agent");
        Arc::new(agent.managers().1.node)
    }

    #[tokio::test(start_paused = true)]
    async fn a_manager_whose_loop_ends_is_started_again_after_a_doubling_back_off_until_the_agent_stops() {
        let metrics = Arc::new(Metrics::unregistered());
        let side = side(metrics.clone());
        let starts: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let gc = {
            let starts = starts.clone();
            // a collector whose loop ends 5 s after each start
            move |_: &NodeSide| {
                starts.lock().unwrap().push(Instant::now());
                tokio::time::sleep(Duration::from_secs(5))
            }
        };
        let task = tokio::spawn(NodeSideTask {
            event_sink: branch(&side, |s: &NodeSide| s.event_sink().run()),
            runtime_health: branch(&side, |s: &NodeSide| s.health_monitor().run()),
            node_status: branch(&side, |s: &NodeSide| s.status().run()),
            lease: branch(&side, |s: &NodeSide| s.lease().run()),
            node_informer: branch(&side, |s: &NodeSide| s.informer().run()),
            gc: branch(&side, gc),
            eviction: branch(&side, NodeSide::eviction),
            wakers: Wakers::new(),
            side: side.clone(),
            restarts: None,
        });
        pass(Duration::from_secs(30)).await;
        let at = starts.lock().unwrap().clone();
        assert_eq!(at.len(), 4, "started at {at:?}");
        assert_eq!(metrics.manager_restarts("gc"), 3);
        // each run lasts 5 s; the waits after them are 1, 2 and 4 s, jittered up to 10 % (seen in 100 ms steps)
        for (pair, wait) in at.windows(2).zip([1u64, 2, 4]) {
            let waited = pair[1] - pair[0] - Duration::from_secs(5);
            let wait = Duration::from_secs(wait);
            assert!(
                waited >= wait && waited <= wait + wait / 10 + Duration::from_millis(100),
                "waited {waited:?} for a back-off of {wait:?}"
            );
        }
        for other in [
            "event_sink",
            "runtime_health",
            "node_status",
            "lease",
            "node_informer",
            "eviction",
        ] {
            assert_eq!(metrics.manager_restarts(other), 0, "{other}");
        }

        // the agent stops while the collector waits to start again: the task ends, the collector stays stopped
        side.ctx.token.cancel();
        pass(Duration::from_millis(200)).await;
        assert!(task.is_finished(), "the node side ends with the agent");
        pass(Duration::from_secs(60)).await;
        assert_eq!(
            starts.lock().unwrap().len(),
            4,
            "not started again after the stop"
        );
        assert_eq!(metrics.manager_restarts("gc"), 3);
    }
}
