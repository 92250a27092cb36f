//! What the node-side managers are built from, kept for the agent's life.
//!
//! A manager's `run` consumes it, so a manager that crashed cannot be run again: it is built again. [`NodeSide`]
//! holds the inputs of all seven (the agent's context, the status task's channels, the event queue, the
//! runtime monitor and node informer as first built, the pod manager's control channel) and builds each
//! manager from them — at the first start and at every restart (see `supervise`) alike. What a manager kept of
//! its own (the status task's last report, the lease it last wrote, the events it wrote recently) starts over.

use std::future::Future;

use tokio::time::Instant;

use super::AgentContext;
use crate::density::chan::UnboundedSender;
use crate::events::{EventQueue, EventSink};
use crate::node::status::StatusChannels;
use crate::node::{LeaseManager, NodeInformer, NodeStatusManager};
use crate::pods::ManagerControl;
use crate::runtime_health::RuntimeHealthMonitor;

/// The node-side managers' inputs (see the module).
pub(crate) struct NodeSide {
    /// The agent's context (the one [`RunningAgent::context`](super::RunningAgent::context) answers).
    pub(crate) ctx: AgentContext,
    /// The status task's signals, health checks and registration channel.
    pub(crate) channels: StatusChannels,
    /// When the agent started (the status task's start-up metrics).
    pub(crate) started: Instant,
    /// The agent's event queue, which every event writer of the agent reads in turn.
    pub(crate) events: EventQueue,
    /// The runtime monitor as built (each run polls into the same channel).
    pub(crate) monitor: RuntimeHealthMonitor,
    /// The node informer as built (each run publishes to the same channel).
    pub(crate) informer: NodeInformer,
    /// The pod manager's control channel (the eviction manager stops pods through it).
    pub(crate) control: UnboundedSender<ManagerControl>,
}

impl NodeSide {
    /// The event writer.
    pub(crate) fn event_sink(&self) -> EventSink {
        let (ctx, k) = (&self.ctx, &self.ctx.config.kubelet);
        // events have their own limit (eventRecordQPS / eventBurst), as the kubelet's event client does
        EventSink::resume(
            self.events.clone(),
            ctx.client.clone(),
            ctx.api.without_own_limit(),
            ctx.config.node_name.clone(),
            k.event_record_qps,
            k.event_burst,
            ctx.token.clone(),
        )
    }

    /// The runtime health monitor.
    pub(crate) fn health_monitor(&self) -> RuntimeHealthMonitor {
        self.monitor.clone()
    }

    /// The node status task (it registers the Node first: again after a restart, finding it in place).
    pub(crate) fn status(&self) -> NodeStatusManager {
        let ctx = &self.ctx;
        NodeStatusManager::new(
            ctx.config.clone(),
            ctx.client.clone(),
            ctx.api.clone(),
            ctx.runtime.clone(),
            ctx.events.clone(),
            self.channels.clone(),
            ctx.metrics.clone(),
            self.started,
            ctx.token.clone(),
        )
        .with_heartbeats(ctx.heartbeats.clone())
    }

    /// The lease task (it pokes the status task when renewals work again after failing).
    pub(crate) fn lease(&self) -> LeaseManager {
        let ctx = &self.ctx;
        LeaseManager::new(
            ctx.client.clone(),
            ctx.api.clone(),
            ctx.config.node_name.clone(),
            ctx.config.kubelet.node_lease_duration_seconds,
            ctx.config.kubelet.lease_renew_interval(),
            ctx.registered.clone(),
            self.channels.signals.resync.clone(),
        )
        .with_heartbeats(ctx.heartbeats.clone())
        .with_timer(ctx.timer.clone())
    }

    /// The node informer.
    pub(crate) fn informer(&self) -> NodeInformer {
        self.informer.clone()
    }

    /// The container and image garbage collectors' loop.
    pub(crate) fn gc(&self) -> impl Future<Output = ()> + Send + use<> {
        self.ctx.gc_loop()
    }

    /// The eviction manager's loop.
    pub(crate) fn eviction(&self) -> impl Future<Output = ()> + Send + use<> {
        self.ctx.eviction_loop(self.control.clone())
    }
}
