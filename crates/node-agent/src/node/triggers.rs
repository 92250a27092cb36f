//! What wakes the node status loop, and when.
//!
//! This module owns the status loop's timing, apart from any API call so it is unit-tested on paused time:
//! * [`wait_for_first_health`] holds registration back until the runtime's first answer, at most
//!   [`FIRST_HEALTH_WAIT`], so the Node is usually created already Ready.
//! * [`StatusTriggers`] yields what the loop does next: a status computation every `nodeStatusUpdateFrequency`
//!   (jittered 4 %, the first one a period after registration); one at once when the runtime health or the
//!   pressure signals changed (a node that registered NotReady is reported Ready as soon as the runtime answers,
//!   not a period later); a re-read when the lease task asks; and a look at the Node whenever the node informer
//!   saw it change (a pod CIDR assigned after registration is handed to the runtime at once).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use super::{NodeSnapshot, Pressure};
use crate::density::periodic::JitteredInterval;
use crate::density::poke::Poke;
use crate::density::watch;
use crate::runtime_health::RuntimeHealth;

/// Jitter of the status loop (the kubelet's).
pub const STATUS_JITTER: f64 = 0.04;
/// How long registration waits for the runtime's first answer before registering anyway.
pub const FIRST_HEALTH_WAIT: Duration = Duration::from_secs(2);

/// Waits until the runtime monitor published its first answer (at most [`FIRST_HEALTH_WAIT`]).
pub async fn wait_for_first_health(health: &watch::Receiver<RuntimeHealth>) {
    {
        let h = health.borrow();
        if h.last_sync.is_some() || h.runtime_error.is_some() {
            return;
        }
    }
    let mut health = health.clone();
    let _ = tokio::time::timeout(FIRST_HEALTH_WAIT, health.changed()).await;
}

/// What the status loop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The periodic computation is due.
    Tick,
    /// Runtime health or pressure changed: compute now.
    InputsChanged,
    /// The lease task recovered from failures: re-read the Node and write.
    Resync,
    /// The node informer saw the Node change (learn its pod CIDR; no status computation).
    NodeChanged,
}

/// What the status loop waits on besides its timer. The status task holds them (and reads their values when it
/// computes the status, marking them seen); each wait for a trigger borrows them, so the idle task keeps one
/// receiver of each, not a second copy for the waiting.
#[derive(Debug, Clone)]
pub struct Signals {
    /// Runtime health from the runtime monitor.
    pub health: watch::Receiver<RuntimeHealth>,
    /// Pressure from the eviction manager.
    pub pressure: watch::Receiver<Pressure>,
    /// Poked by the lease task when renewals recover: re-read the Node and report.
    pub resync: Arc<Poke>,
    /// The Node as the node informer last saw it.
    pub node: watch::Receiver<Option<Arc<NodeSnapshot>>>,
    /// The timer the periodic computation waits on (the agent's, shared by a fleet's agents).
    pub timer: crate::density::timer::Timer,
    /// The attachable volumes in use (a node with CSI volumes): reported at once when they change.
    pub volumes_in_use: Option<watch::Receiver<crate::csi::in_use::InUse>>,
}

/// The timer of one status loop, and which of its signals are still open.
#[derive(Debug)]
pub struct StatusTriggers {
    interval: JitteredInterval,
    health_open: bool,
    pressure_open: bool,
    node_open: bool,
    volumes_open: bool,
}

impl StatusTriggers {
    /// Triggers for a loop starting now (right after registration), computing every `update_frequency`.
    pub fn new(update_frequency: Duration) -> Self {
        Self {
            interval: JitteredInterval::after_period(update_frequency, STATUS_JITTER),
            health_open: true,
            pressure_open: true,
            node_open: true,
            volumes_open: true,
        }
    }

    /// Waits for the next thing to do: the timer, or a change of `signals` not yet seen.
    ///
    /// Polled by hand rather than through `tokio::select!`, whose branch futures and bookkeeping would sit in
    /// the idle status task: the timer's wait is the one thing kept between polls (the channels' and the
    /// poke's waits hold nothing of their own); when several are ready at once they are taken in this order.
    pub fn next<'a>(&'a mut self, signals: &'a mut Signals) -> impl Future<Output = Trigger> + Send + 'a {
        // the wait holds a handle of its own on the timer, so that the closure takes `signals` whole (one
        // reference rather than one per field)
        let mut tick = signals.timer.sleep_until_owned(self.interval.deadline());
        std::future::poll_fn(move |cx| {
            if Pin::new(&mut tick).poll(cx).is_ready() {
                self.interval.advance(Instant::now());
                return Poll::Ready(Trigger::Tick);
            }
            let signals = &mut *signals;
            if poll_changed(&mut signals.health, &mut self.health_open, cx)
                || poll_changed(&mut signals.pressure, &mut self.pressure_open, cx)
                || signals
                    .volumes_in_use
                    .as_mut()
                    .is_some_and(|rx| poll_changed(rx, &mut self.volumes_open, cx))
            {
                return Poll::Ready(Trigger::InputsChanged);
            }
            if poll_changed(&mut signals.node, &mut self.node_open, cx) {
                return Poll::Ready(Trigger::NodeChanged);
            }
            if std::pin::pin!(signals.resync.notified()).poll(cx).is_ready() {
                return Poll::Ready(Trigger::Resync);
            }
            Poll::Pending
        })
    }
}

/// Whether `rx` has a version not yet seen, marking it seen (a pending poll lists the task for the next one);
/// once every sender is gone the channel is marked closed in `open` and counts no more.
fn poll_changed<T>(rx: &mut watch::Receiver<T>, open: &mut bool, cx: &mut Context<'_>) -> bool {
    if !*open {
        return false;
    }
    match Pin::new(&mut rx.changed()).poll(cx) {
        Poll::Ready(Ok(())) => true,
        Poll::Ready(Err(_)) => {
            *open = false;
            false
        }
        Poll::Pending => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KubeletConfig;
    use tokio::time::Instant;

    struct Harness {
        triggers: StatusTriggers,
        signals: Signals,
        health: watch::Sender<RuntimeHealth>,
        pressure: watch::Sender<Pressure>,
        resync: Arc<Poke>,
        node: watch::Sender<Option<Arc<NodeSnapshot>>>,
    }

    fn start() -> Harness {
        let (health, health_rx) = watch::channel(RuntimeHealth::initial());
        let (pressure, pressure_rx) = watch::channel(Pressure::default());
        let resync = Arc::new(Poke::new());
        let frequency = KubeletConfig::default().node_status_update_frequency;
        assert_eq!(frequency, Duration::from_secs(10));
        let (node, node_rx) = watch::channel(None);
        let triggers = StatusTriggers::new(frequency);
        let signals = Signals {
            health: health_rx,
            pressure: pressure_rx,
            resync: resync.clone(),
            node: node_rx,
            timer: crate::density::timer::Timer::new(),
            volumes_in_use: None,
        };
        Harness {
            triggers,
            signals,
            health,
            pressure,
            resync,
            node,
        }
    }

    fn within(gap: Duration, base: Duration, jitter: f64) -> bool {
        gap >= base && gap <= base + base.mul_f64(jitter) + Duration::from_millis(1)
    }

    fn answered() -> RuntimeHealth {
        RuntimeHealth {
            last_sync: Some(Instant::now()),
            network_error: None,
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn status_is_computed_every_update_frequency_starting_one_period_after_registration() {
        let mut h = start();
        let t0 = Instant::now();
        let mut at = vec![t0];
        for _ in 0..6 {
            assert_eq!(h.triggers.next(&mut h.signals).await, Trigger::Tick);
            at.push(Instant::now());
        }
        let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
        for g in &gaps {
            assert!(within(*g, Duration::from_secs(10), STATUS_JITTER), "{gaps:?}");
        }
        assert!(gaps.iter().any(|g| *g != gaps[0]), "jittered: {gaps:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn input_changes_and_resync_requests_are_acted_on_at_once() {
        let h = start();
        let t0 = Instant::now();
        let Harness {
            mut triggers,
            mut signals,
            health,
            pressure,
            resync,
            node,
        } = h;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            health.send_replace(answered());
            tokio::time::sleep(Duration::from_secs(2)).await;
            pressure.send_replace(Pressure {
                memory: true,
                ..Default::default()
            });
            tokio::time::sleep(Duration::from_secs(2)).await;
            resync.notify_one();
            tokio::time::sleep(Duration::from_secs(1)).await;
            node.send_replace(Some(Arc::new(NodeSnapshot {
                pod_cidrs: vec!["10.128.3.0/24".into()],
                ..Default::default()
            })));
            // the senders are dropped here: the agent is going away
        });
        let mut seen = Vec::new();
        for _ in 0..5 {
            let t = triggers.next(&mut signals).await;
            seen.push((t, Instant::now() - t0));
        }
        assert_eq!(seen[0], (Trigger::InputsChanged, Duration::from_millis(300)));
        assert_eq!(seen[1], (Trigger::InputsChanged, Duration::from_millis(2300)));
        assert_eq!(seen[2], (Trigger::Resync, Duration::from_millis(4300)));
        assert_eq!(seen[3], (Trigger::NodeChanged, Duration::from_millis(5300)));
        assert_eq!(seen[4].0, Trigger::Tick);
        assert!(
            within(seen[4].1, Duration::from_secs(10), STATUS_JITTER),
            "the periodic computation keeps its schedule: {seen:?}"
        );
        let before = Instant::now();
        assert_eq!(
            triggers.next(&mut signals).await,
            Trigger::Tick,
            "closed input channels are not changes"
        );
        assert!(Instant::now() - before >= Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn registration_waits_for_the_first_runtime_answer_at_most_two_seconds() {
        let (tx, rx) = watch::channel(RuntimeHealth::initial());

        let t0 = Instant::now();
        wait_for_first_health(&rx).await;
        assert_eq!(
            Instant::now() - t0,
            FIRST_HEALTH_WAIT,
            "no answer: register anyway"
        );

        let t0 = Instant::now();
        let sender = tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            sender.send_replace(answered());
        });
        wait_for_first_health(&rx).await;
        assert_eq!(
            Instant::now() - t0,
            Duration::from_millis(300),
            "registers on the answer"
        );

        let t0 = Instant::now();
        wait_for_first_health(&rx).await;
        assert_eq!(Instant::now(), t0, "already answered: no wait");
    }
}
