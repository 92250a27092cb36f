//! The node informer: a list+watch of this node's own Node object (`fieldSelector=metadata.name=<node>`, as the
//! kubelet's node informer), published as a compact [`NodeSnapshot`] on the agent's `node` channel.
//!
//! This task is the one writer of that channel. Readers: pod admission (labels, taints, addresses) and the node
//! status task, which learns `spec.podCIDR(s)` from it the moment the controller-manager assigns one and hands
//! it to the runtime (`UpdateRuntimeConfig`). Nothing polls the Node for it.
//!
//! The [`LeanWatch`] resumes from the last resourceVersion on reconnect and relists on 410 Gone; errors back
//! off. A deleted Node leaves the last snapshot in place (the status task
//! re-registers when its write finds the Node gone, and the watch then sees the new object).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use super::NodeSnapshot;
use crate::density::lean_watch::{Change, LeanWatch};
use crate::density::watch;

/// The watch of one node's Node object. A clone publishes to the same channel (the agent keeps one to start
/// again after a crash).
#[derive(Clone)]
pub struct NodeInformer {
    client: crate::client::ApiClient,
    publisher: Publisher,
}

/// What the informer keeps beside its watch: where it publishes.
#[derive(Clone)]
struct Publisher {
    node_name: String,
    tx: watch::Sender<Option<Arc<NodeSnapshot>>>,
}

impl NodeInformer {
    /// An informer for `node_name` over `client`, publishing to `tx`.
    pub fn new(
        client: impl Into<crate::client::ApiClient>,
        node_name: String,
        tx: watch::Sender<Option<Arc<NodeSnapshot>>>,
    ) -> Self {
        Self {
            client: client.into(),
            publisher: Publisher { node_name, tx },
        }
    }

    /// Follows the Node until dropped (the agent drops it where it waits when its token fires, see
    /// `agent::supervise`).
    pub fn run(self) -> impl Future<Output = ()> + Send + 'static {
        async move {
            // the client moves into the watch (a clone would be held twice for the node's life)
            let NodeInformer {
                client,
                publisher: this,
            } = self;
            let selector = format!("metadata.name={}", this.node_name);
            let mut watch: LeanWatch<Node> = LeanWatch::new(client, selector);
            loop {
                match watch.next().await {
                    Err(error) => {
                        tracing::warn!(node = %this.node_name, %error, "node watch failed, retrying");
                    }
                    Ok(Change::Listed(nodes)) => nodes.iter().for_each(|n| this.publish(n)),
                    Ok(Change::Applied(node)) => this.publish(&node),
                    Ok(Change::Deleted(_)) => {}
                }
            }
        }
    }
}

impl Publisher {
    fn publish(&self, node: &Node) {
        if node.metadata.name.as_deref() != Some(self.node_name.as_str()) {
            return;
        }
        let snapshot = NodeSnapshot::of(node);
        self.tx.send_if_modified(|cur| {
            if cur.as_deref() == Some(&snapshot) {
                false
            } else {
                *cur = Some(Arc::new(snapshot));
                true
            }
        });
    }
}
