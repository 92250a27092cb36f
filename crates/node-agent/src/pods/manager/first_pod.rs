//! A pod side built at the node's first pod.
//!
//! Until a node has a pod, the pod lifecycle runs only its pod source (the per-node watch or a feed
//! subscription) and reads its control channel: the status writer, the PLEG, the pod manager and their
//! channels, which most nodes of a hollow fleet would hold unused, are made when the first pod arrives or a
//! graceful shutdown is requested, and kept from then on. Meanwhile the questions other managers ask are
//! answered as the pod manager would answer them with no pods: no pods run, none hold the node's resources, an
//! eviction finds nothing, and the garbage collector's "which pods do you have?" is `None` until the API
//! server's first list has arrived, then "none".
//!
//! Waiting is only for a hollow node ([`NodeKind::Hollow`](crate::pods::NodeKind)) with nothing to find: no
//! static pod sources and a runtime that holds no pod sandbox (a restarted agent's runtime may hold what it ran
//! before). A real node, which has a pods directory and pod cgroups to sweep, and any other node build their pod
//! side at once.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use runtime_api::{Runtime, cri};
use tokio_util::sync::CancellationToken;

use crate::density::chan;
use crate::pods::manager::control::{KnownPods, ManagerControl};
use crate::pods::source::PodEvent;

/// What arrived before the pod side was built, for the pod manager to take first (in this order).
#[derive(Debug, Default)]
pub(crate) struct Taken {
    /// Pod events: the last empty list, then the event that woke the node.
    pub(crate) events: Vec<PodEvent>,
    /// A graceful shutdown request that woke the node.
    pub(crate) control: Option<ManagerControl>,
}

/// Whether the runtime holds no pod sandbox. An error counts as holding some: the pod side is built at once and
/// its own clean-up meets the runtime's answer.
pub(crate) async fn runtime_is_empty(runtime: &dyn Runtime) -> bool {
    runtime
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await
        .is_ok_and(|r| r.items.is_empty())
}

/// Waits until the node has a pod, its pod source ends, or a graceful shutdown is requested, answering the
/// other questions on `control` meanwhile and running `watch` (the pod source's own watch, when it has one).
/// `None`: `cancel` fired first.
pub(crate) async fn wait<W>(
    cancel: &CancellationToken,
    source: &mut chan::Receiver<PodEvent>,
    control: &mut chan::UnboundedReceiver<ManagerControl>,
    watch: &mut Option<Pin<Box<W>>>,
) -> Option<Taken>
where
    W: Future<Output = ()> + Send,
{
    let mut taken = Taken::default();
    let mut control_open = true;
    let mut cancelled = std::pin::pin!(cancel.cancelled());
    // polled by hand, not through `tokio::select!` (whose branch futures and bookkeeping the wait would hold for
    // as long as the node has no pod); the channels' waits hold nothing
    std::future::poll_fn(|cx| {
        loop {
            // in this order: a question is answered after the pod events that came before it
            if cancelled.as_mut().poll(cx).is_ready() {
                return Poll::Ready(None);
            }
            // the watch ends only when its channel is gone; the source's end is read below
            if let Some(w) = watch.as_mut()
                && w.as_mut().poll(cx).is_ready()
            {
                *watch = None;
            }
            match source.poll_recv(cx) {
                Poll::Ready(Some(PodEvent::Snapshot(pods))) if pods.is_empty() => {
                    taken.events = vec![PodEvent::Snapshot(pods)];
                    continue;
                }
                Poll::Ready(Some(event)) => {
                    taken.events.push(event);
                    return Poll::Ready(Some(std::mem::take(&mut taken)));
                }
                Poll::Ready(None) => return Poll::Ready(Some(std::mem::take(&mut taken))),
                Poll::Pending => {}
            }
            if control_open {
                match control.poll_recv(cx) {
                    Poll::Ready(Some(request)) => {
                        if let Some(shutdown) = answer(request, !taken.events.is_empty()) {
                            taken.control = Some(shutdown);
                            return Poll::Ready(Some(std::mem::take(&mut taken)));
                        }
                        continue;
                    }
                    Poll::Ready(None) => {
                        control_open = false;
                        continue;
                    }
                    Poll::Pending => {}
                }
            }
            return Poll::Pending;
        }
    })
    .await
}

/// Answers a question as a pod manager without pods does (`listed`: the API server's list has arrived); a
/// shutdown request is handed back, for the pod side to be built and take it.
fn answer(request: ManagerControl, listed: bool) -> Option<ManagerControl> {
    match request {
        ManagerControl::KnownPods(answer) => {
            let _ = answer.send(listed.then(KnownPods::default));
        }
        ManagerControl::ActivePods(answer) => {
            let _ = answer.send(Vec::new());
        }
        ManagerControl::AdmittedPods(answer) => {
            let _ = answer.send(Vec::new());
        }
        ManagerControl::Evict(order) => {
            let _ = order.done.send(false);
        }
        ManagerControl::Shutdown(_) => return Some(request),
        // nothing has been stopped yet: no shutdown to call off
        ManagerControl::ShutdownCancelled => {}
    }
    None
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use tokio::sync::oneshot;

    use super::*;
    use crate::pods::manager::control::EvictOrder;
    use crate::pods::manager::shutdown::ShutdownRequest;

    type Watch = std::future::Pending<()>;

    fn pod(name: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.uid = Some(name.into());
        pod
    }

    async fn known(control: &chan::UnboundedSender<ManagerControl>) -> Option<KnownPods> {
        let (tx, rx) = oneshot::channel();
        control.send(ManagerControl::KnownPods(tx)).unwrap();
        rx.await.unwrap()
    }

    #[tokio::test]
    async fn a_node_without_pods_answers_as_a_manager_with_none_until_its_first_pod() {
        let (feed, mut source) = chan::channel(8);
        let (ask, mut control) = chan::unbounded_channel();
        let cancel = CancellationToken::new();
        let mut watch: Option<Pin<Box<Watch>>> = None;
        let waiting = wait(&cancel, &mut source, &mut control, &mut watch);
        let asking = async {
            // before the API server's list: the garbage collector must not take anything for unknown
            assert_eq!(known(&ask).await, None);
            feed.send(PodEvent::Snapshot(Vec::new())).await.unwrap();
            assert_eq!(known(&ask).await, Some(KnownPods::default()));
            let (tx, rx) = oneshot::channel();
            ask.send(ManagerControl::ActivePods(tx)).unwrap();
            assert!(rx.await.unwrap().is_empty(), "no pod runs");
            let (tx, rx) = oneshot::channel();
            ask.send(ManagerControl::AdmittedPods(tx)).unwrap();
            assert!(rx.await.unwrap().is_empty(), "no pod holds resources");
            let (done, evicted) = oneshot::channel();
            ask.send(ManagerControl::Evict(Box::new(EvictOrder {
                uid: "nobody".into(),
                grace_secs: 0,
                reason: "Evicted".into(),
                message: String::new(),
                done,
            })))
            .unwrap();
            assert!(!evicted.await.unwrap(), "nothing to evict");
            feed.send(PodEvent::Apply(Box::new(pod("first")))).await.unwrap();
        };
        let (taken, ()) = tokio::join!(waiting, asking);
        let taken = taken.expect("not cancelled");
        assert!(taken.control.is_none());
        assert!(
            matches!(&taken.events[..], [PodEvent::Snapshot(none), PodEvent::Apply(p)]
                if none.is_empty() && p.metadata.name.as_deref() == Some("first")),
            "the list, then the first pod, are handed on: {:?}",
            taken.events
        );
    }

    #[tokio::test]
    async fn a_list_with_pods_or_a_shutdown_request_ends_the_wait_and_cancelling_ends_it_empty() {
        let (feed, mut source) = chan::channel(8);
        let (ask, mut control) = chan::unbounded_channel();
        let cancel = CancellationToken::new();
        let mut watch: Option<Pin<Box<Watch>>> = None;

        feed.send(PodEvent::Snapshot(vec![pod("a")])).await.unwrap();
        let taken = wait(&cancel, &mut source, &mut control, &mut watch)
            .await
            .unwrap();
        assert!(matches!(&taken.events[..], [PodEvent::Snapshot(p)] if p.len() == 1));

        let (done, _stopped) = oneshot::channel();
        ask.send(ManagerControl::from(ShutdownRequest {
            groups: Vec::new(),
            done,
        }))
        .unwrap();
        let taken = wait(&cancel, &mut source, &mut control, &mut watch)
            .await
            .unwrap();
        assert!(taken.events.is_empty());
        assert!(matches!(taken.control, Some(ManagerControl::Shutdown(_))));

        cancel.cancel();
        assert!(
            wait(&cancel, &mut source, &mut control, &mut watch)
                .await
                .is_none()
        );
    }
}
