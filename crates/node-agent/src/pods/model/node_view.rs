//! The pod side's view of its node ([`NodeViews`]): allocatable, labels, `NoExecute` taints, host IPs and
//! pressure, as admission, the downward API and the mirror pods read them.
//!
//! Two sources: a channel of views someone else keeps current (tests, a caller of its own), or an agent's own
//! channels — the Node as its informer last saw it, the allocatable it computed and the eviction manager's
//! pressure — with the view composed at each read. The second keeps no copy of the view and no task to copy it
//! (a channel, a task and the view for every node with pods of a hollow fleet); a read composes a small
//! value (the labels are shared), which admission and a pod's volumes and environment do a few times per pod.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use k8s_openapi::api::core::v1::Node;

use crate::density::watch;
use crate::node::{NodeSnapshot, Pressure, ResourceList};
use crate::quantity::Quantity;

/// What admission and status need to know about the node. Built by the node half (or a test) and handed to
/// the pod lifecycle through a `watch` channel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// The Node's UID (mirror pods name their Node as owner by it); empty when unknown.
    pub uid: String,
    /// Allocatable cpu, millicores.
    pub cpu_milli: i64,
    /// Allocatable memory, bytes.
    pub memory: i64,
    /// Allocatable ephemeral storage, bytes (0 = not reported, not checked).
    pub ephemeral: i64,
    /// Allocatable pods.
    pub pods: i64,
    /// Allocatable extended resources (`example.com/gpu`), by name; a resource missing here is not checked.
    /// Huge pages (`hugepages-2Mi`) are here too, by the name the node's capacity gives them ([`scalar_name`]); a
    /// size missing here has none allocatable.
    pub extended: std::collections::BTreeMap<String, i64>,
    /// Node labels (shared with the node informer's snapshot).
    pub labels: std::sync::Arc<crate::node::NodeLabels>,
    /// `NoExecute` taints as `(key, value)`.
    pub no_execute_taints: Vec<(String, String)>,
    /// Host IPs for `status.hostIP(s)`: InternalIP addresses first.
    pub host_ips: Vec<String>,
    /// The node's pressure conditions as the eviction manager reports them.
    pub pressure: crate::node::Pressure,
    /// Whether the Node reports support for `supplementalGroupsPolicy: Strict` (`status.features`).
    pub supplemental_groups_policy: bool,
}

impl NodeView {
    /// Reads the view from a Node object (`status.allocatable`, labels, taints, addresses).
    pub fn from_node(node: &Node) -> Self {
        let status = node.status.as_ref();
        let alloc = status.and_then(|s| s.allocatable.as_ref());
        let get = |key: &str, milli: bool| -> i64 {
            alloc
                .and_then(|a| a.get(key))
                .and_then(|q| Quantity::from_api(q).ok())
                .and_then(|q| i64::try_from(if milli { q.milli() } else { q.value() }).ok())
                .unwrap_or(0)
        };
        let host_ips = ordered_host_ips(
            status
                .and_then(|s| s.addresses.as_deref())
                .unwrap_or_default()
                .iter()
                .map(|a| (a.type_.as_str(), a.address.as_str())),
        );
        Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            uid: node.metadata.uid.clone().unwrap_or_default(),
            cpu_milli: get("cpu", true),
            memory: get("memory", false),
            ephemeral: get("ephemeral-storage", false),
            pods: get("pods", false),
            extended: alloc
                .into_iter()
                .flatten()
                .filter_map(|(k, q)| {
                    Some((
                        scalar_name(k)?,
                        i64::try_from(Quantity::from_api(q).ok()?.value()).ok()?,
                    ))
                })
                .collect(),
            labels: std::sync::Arc::new(crate::node::NodeLabels::of(&node.metadata)),
            no_execute_taints: node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_deref())
                .unwrap_or_default()
                .iter()
                .filter(|t| t.effect == "NoExecute")
                .map(|t| (t.key.clone(), t.value.clone().unwrap_or_default()))
                .collect(),
            host_ips,
            pressure: {
                let on = |kind: &str| {
                    status
                        .and_then(|s| s.conditions.as_deref())
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == kind && c.status == "True")
                };
                crate::node::Pressure {
                    memory: on("MemoryPressure"),
                    disk: on("DiskPressure"),
                    pid: on("PIDPressure"),
                }
            },
            supplemental_groups_policy: crate::node::supplemental_groups_policy(node),
        }
    }
}

/// Where the pod side reads its node's view (cheap to clone: a clone waits for changes on its own).
#[derive(Clone)]
pub struct NodeViews(Source);

#[derive(Clone)]
enum Source {
    Channel(watch::Receiver<Option<NodeView>>),
    Agent(Box<AgentInputs>),
}

/// An agent's channels the view is composed from.
#[derive(Clone)]
struct AgentInputs {
    node: watch::Receiver<Option<Arc<NodeSnapshot>>>,
    allocatable: watch::Receiver<Arc<ResourceList>>,
    pressure: watch::Receiver<Pressure>,
}

impl From<watch::Receiver<Option<NodeView>>> for NodeViews {
    fn from(rx: watch::Receiver<Option<NodeView>>) -> Self {
        NodeViews(Source::Channel(rx))
    }
}

impl NodeViews {
    /// Views composed from an agent's registered Node (as its informer last saw it), its allocatable and its
    /// pressure; none until the Node is known.
    pub fn agent(
        node: watch::Receiver<Option<Arc<NodeSnapshot>>>,
        allocatable: watch::Receiver<Arc<ResourceList>>,
        pressure: watch::Receiver<Pressure>,
    ) -> Self {
        NodeViews(Source::Agent(Box::new(AgentInputs {
            node,
            allocatable,
            pressure,
        })))
    }

    /// The view now (`None`: the Node is not known yet).
    pub fn get(&self) -> Option<NodeView> {
        match &self.0 {
            Source::Channel(rx) => rx.borrow().clone(),
            Source::Agent(inputs) => {
                let node = inputs.node.borrow();
                let node = node.as_ref()?;
                Some(compose(
                    node,
                    &inputs.allocatable.borrow(),
                    *inputs.pressure.borrow(),
                ))
            }
        }
    }

    /// The node's host IPs (InternalIP addresses first), read without composing the whole view: a pod's status
    /// asks for them at every report.
    pub fn host_ips(&self) -> Vec<String> {
        match &self.0 {
            Source::Channel(rx) => rx
                .borrow()
                .as_ref()
                .map(|n| n.host_ips.clone())
                .unwrap_or_default(),
            Source::Agent(inputs) => inputs.node.borrow().as_deref().map(host_ips).unwrap_or_default(),
        }
    }

    /// Waits until the view may have changed since this handle last waited (composed: any of its inputs
    /// changed); an error once the Node's channel (or the view's) is closed with nothing new.
    pub fn changed(&mut self) -> impl Future<Output = Result<(), watch::RecvError>> + Send + '_ {
        std::future::poll_fn(move |cx| match &mut self.0 {
            Source::Channel(rx) => Pin::new(&mut rx.changed()).poll(cx),
            Source::Agent(inputs) => {
                // all three polled, so that each lists this task and marks what it has seen
                let node = poll(&mut inputs.node, cx);
                let others = [poll(&mut inputs.allocatable, cx), poll(&mut inputs.pressure, cx)];
                match node {
                    Poll::Ready(result) => Poll::Ready(result),
                    Poll::Pending if others.iter().any(|p| matches!(p, Poll::Ready(Ok(())))) => {
                        Poll::Ready(Ok(()))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        })
    }
}

fn poll<T>(rx: &mut watch::Receiver<T>, cx: &mut Context<'_>) -> Poll<Result<(), watch::RecvError>> {
    Pin::new(&mut rx.changed()).poll(cx)
}

/// The view of `node` with the agent's `allocatable` and `pressure`.
pub fn compose(node: &NodeSnapshot, allocatable: &ResourceList, pressure: Pressure) -> NodeView {
    let get = |key: &str, milli: bool| {
        allocatable
            .get(key)
            .and_then(|q| i64::try_from(if milli { q.milli() } else { q.value() }).ok())
            .unwrap_or(0)
    };
    NodeView {
        name: node.name.clone(),
        uid: node.uid.clone(),
        cpu_milli: get("cpu", true),
        memory: get("memory", false),
        ephemeral: get("ephemeral-storage", false),
        pods: get("pods", false),
        extended: allocatable
            .iter()
            .filter_map(|(k, q)| Some((scalar_name(k)?, i64::try_from(q.value()).ok()?)))
            .collect(),
        labels: node.labels.clone(),
        no_execute_taints: node
            .taints
            .iter()
            .filter(|t| t.effect == "NoExecute")
            .map(|t| (t.key.clone(), t.value.clone().unwrap_or_default()))
            .collect(),
        host_ips: host_ips(node),
        pressure,
        supplemental_groups_policy: node.supplemental_groups_policy,
    }
}

/// `node`'s InternalIP addresses, then its ExternalIP ones, each once.
fn host_ips(node: &NodeSnapshot) -> Vec<String> {
    ordered_host_ips(node.addresses.iter().map(|(t, a)| (t.as_str(), a.as_str())))
}

/// From a node's (type, address) pairs: the InternalIP addresses, then the ExternalIP ones, each once.
pub(crate) fn ordered_host_ips<'a>(
    addresses: impl Iterator<Item = (&'a str, &'a str)> + Clone,
) -> Vec<String> {
    let mut ips: Vec<String> = Vec::new();
    for kind in ["InternalIP", "ExternalIP"] {
        for (t, addr) in addresses.clone() {
            if t == kind && !ips.iter().any(|ip| ip == addr) {
                ips.push(addr.to_owned());
            }
        }
    }
    ips
}

/// The name admission counts resource `name` under when it is an extended resource (itself) or huge pages (the
/// node's spelling of its page size: `hugepages-2048Ki` is `hugepages-2Mi`); `None` for any other resource.
pub fn scalar_name(name: &str) -> Option<String> {
    if crate::pods::model::resources::is_extended(name) {
        return Some(name.to_owned());
    }
    crate::pods::model::resources::hugepage_size(name).map(crate::pods::model::resources::hugepage_resource)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::quantity::Quantity;

    fn snapshot() -> Arc<NodeSnapshot> {
        let node = Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                uid: Some("uid-1".into()),
                labels: Some([("zone".to_owned(), "a".to_owned())].into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![
                    Taint {
                        key: "gone".into(),
                        value: Some("yes".into()),
                        effect: "NoExecute".into(),
                        ..Default::default()
                    },
                    Taint {
                        key: "quiet".into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(vec![
                    NodeAddress {
                        type_: "Hostname".into(),
                        address: "n1".into(),
                    },
                    NodeAddress {
                        type_: "InternalIP".into(),
                        address: "127.0.0.1".into(),
                    },
                ]),
                ..Default::default()
            }),
        };
        Arc::new(NodeSnapshot::of(&node))
    }

    fn allocatable(cpu: &str) -> Arc<ResourceList> {
        Arc::new(
            [
                ("cpu".to_owned(), cpu.parse::<Quantity>().unwrap()),
                ("memory".to_owned(), "1Gi".parse::<Quantity>().unwrap()),
                ("pods".to_owned(), "110".parse::<Quantity>().unwrap()),
            ]
            .into(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn an_agents_views_are_composed_from_its_node_allocatable_and_pressure() {
        let (node_tx, node_rx) = watch::channel(None);
        let (alloc_tx, alloc_rx) = watch::channel(allocatable("2"));
        let (pressure_tx, pressure_rx) = watch::channel(Pressure::default());
        let mut views = NodeViews::agent(node_rx, alloc_rx, pressure_rx);
        assert!(views.get().is_none(), "no view before the Node is known");
        assert!(views.host_ips().is_empty());

        node_tx.send_replace(Some(snapshot()));
        tokio::time::timeout(Duration::from_secs(1), views.changed())
            .await
            .expect("the Node's arrival is a change")
            .unwrap();
        let view = views.get().unwrap();
        assert_eq!((view.name.as_str(), view.uid.as_str()), ("n1", "uid-1"));
        assert_eq!((view.cpu_milli, view.memory, view.pods), (2000, 1 << 30, 110));
        assert_eq!(view.no_execute_taints, [("gone".to_owned(), "yes".to_owned())]);
        assert_eq!(view.host_ips, ["127.0.0.1"]);
        assert_eq!(views.host_ips(), view.host_ips, "read alone as in the view");
        assert!(!view.pressure.memory);

        // nothing new: the wait waits
        assert!(
            tokio::time::timeout(Duration::from_secs(1), views.changed())
                .await
                .is_err()
        );
        // the allocatable and the pressure count as changes of the view too
        let mut other = views.clone();
        alloc_tx.send_replace(allocatable("500m"));
        tokio::time::timeout(Duration::from_secs(1), views.changed())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(views.get().unwrap().cpu_milli, 500);
        pressure_tx.send_replace(Pressure {
            memory: true,
            ..Default::default()
        });
        tokio::time::timeout(Duration::from_secs(1), views.changed())
            .await
            .unwrap()
            .unwrap();
        assert!(views.get().unwrap().pressure.memory);
        // a clone waits on its own: it has seen none of the two
        tokio::time::timeout(Duration::from_secs(1), other.changed())
            .await
            .unwrap()
            .unwrap();

        // the Node's channel closed: the wait ends with an error
        drop(node_tx);
        assert!(views.changed().await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_channel_of_views_is_read_as_it_is() {
        let (tx, rx) = watch::channel(None);
        let mut views = NodeViews::from(rx);
        assert!(views.get().is_none());
        let view = compose(&snapshot(), &allocatable("1"), Pressure::default());
        tx.send_replace(Some(view.clone()));
        views.changed().await.unwrap();
        assert_eq!(views.host_ips(), view.host_ips);
        assert_eq!(views.get(), Some(view));
        drop(tx);
        assert!(views.changed().await.is_err());
    }
}
