//! Guard rails for idle task memory: every long-lived task of an agent is a future held for the agent's whole
//! life, thousands of times over in a hollow fleet, so its size is per-node memory. These tests print each
//! size and fail when one grows past its ceiling — raise a ceiling only knowing what the bytes buy. Calls that
//! make requests are boxed inside these loops, so an idle task holds its state and not room for a request in
//! flight. `clippy::large_futures` (workspace lints, threshold in `clippy.toml`) catches a large future passed
//! by value or awaited anywhere else at compile time.
//!
//! Each ceiling keeps a task in the allocation it has today; the comments say what keeps each future that
//! small. The arithmetic behind the figures (tokio's task cells, the allocator's sizes) and each future's
//! history are in docs/density.md ("Future-size ceilings").

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use crate::agent::Agent;
use crate::config::{AgentConfig, KubeletConfig};
use crate::machine::MachineInfo;
use crate::testing::TestRuntime;

/// A client whose requests never get an answer (nothing here runs the futures).
fn client() -> kube::Client {
    let service = tower::service_fn(|_req: http::Request<kube::client::Body>| {
        std::future::pending::<Result<http::Response<kube::client::Body>, std::convert::Infallible>>()
    });
    kube::Client::new(service, "default")
}

fn agent() -> Agent {
    let config = AgentConfig::new(
        "sizes",
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        Arc::new(KubeletConfig::default()),
        MachineInfo::synthetic("sizes"),
    );
    Agent::builder(config, client(), Arc::new(TestRuntime::new()))
        .build()
        .expect("a valid agent")
}

/// Each long-lived task's future, its size in bytes, and its ceiling.
fn check(sizes: &[(&str, usize, usize)]) {
    let mut over = Vec::new();
    for (task, size, ceiling) in sizes {
        println!("{task:<28} {size:>6} bytes (ceiling {ceiling})");
        if size > ceiling {
            over.push(format!("{task}: {size} bytes > {ceiling}"));
        }
    }
    assert!(over.is_empty(), "idle task state grew: {over:?}");
}

#[tokio::test]
async fn the_agents_long_lived_futures_stay_small() {
    let (ctx, m) = agent().managers();
    let (_control, control) = m.control;
    let sizes = [
        // a task holds its future beside a header of tokio's, in a cell of fixed alignment: each ceiling is the
        // largest future whose task still fits the cell it has today
        // the event writer: its queue's wait and the shared client handle (`crate::client`); the shutdown
        // drain's timer is boxed
        ("event sink", size_of_val(&m.node.event_sink().run()), 320),
        (
            "runtime health monitor",
            size_of_val(&m.node.health_monitor().run()),
            // a poll and its timeout are boxed; it waits on the shared timer and a poke (`crate::density::timer`,
            // `crate::density::poke`), polled by hand, and the node side's join stops it (`agent::supervise`), so
            // it holds no wait on the agent's token
            144,
        ),
        // a function returning an `async` block (an `async fn` taking `self` keeps its arguments twice); the
        // start-up clock boxed until observed, transition times in seconds; the shared client; its triggers borrow
        // the status task's signals and are polled by hand over the shared timer and a poke; each condition's
        // texts are two words; the image list, the pod CIDR and the first wait for the runtime's answer are
        // boxed; the node side's join stops it
        // (with the receiver of the attachable CSI volumes in use, `status.volumesInUse`)
        ("node status", size_of_val(&m.node.status().run()), 560),
        // an `Api` built per request, a retry back-off only while renewals fail, the Node's name once, the
        // shared client; the Lease it last wrote is boxed; it sleeps on the shared timer, and a renewal's result
        // and the Node's copy are out of scope before the wait for the next one; the node side's join stops it
        ("lease", size_of_val(&m.node.lease().run()), 168),
        (
            "node informer",
            size_of_val(&m.node.informer().run()),
            // the lean watch in place (`crate::density::lean_watch`) and nothing on the heap while idle: one
            // shared client, the watch's back-off and queue boxed and made only when needed, its selector and
            // version boxed strings; the node side's join stops it
            280,
        ),
        (
            "eviction manager",
            size_of_val(&ctx.eviction_loop(crate::density::chan::unbounded_channel().0)),
            // its own context clone, thresholds and state, one wait on the shared timer or for a cleanup (a
            // pass is boxed, and its answer out of scope before the wait); the node side's join stops it; its
            // stats provider names the CSI drivers, for the summary's volume figures
            288,
        ),
        (
            "pod lifecycle",
            size_of_val(&super::pods::run_for_agent(ctx.clone(), m.pods, control)),
            // the pod manager's loop and what stops it: the lifecycle is boxed until its tasks start, the agent
            // context is not kept, the static pods' side is boxed (most nodes have none), the manager's future
            // is made apart from the parts moved into it, it stops when the PLEG's channel closes rather than
            // waiting on the agent's token, its waits are one pointer each, it keeps one timer for its workers'
            // wake times (`crate::density::wake_timer`), and it holds a pointer to what arrived before the pod
            // side was built (`pods::first_pod`)
            552,
        ),
        (
            "garbage collectors",
            size_of_val(&ctx.gc_loop()),
            // both collectors' timers wait on one wait of the shared timer, the passes are boxed, the node side's
            // join stops it, and the periods its timers are made from are not kept
            176,
        ),
    ];
    check(&sizes);
}

/// The node-side managers run joined in one task: the join costs a few bytes per manager over the sum of their
/// futures, where a task each would cost a task header and the rounding of each future to the cell's alignment.
/// The joined future is a node's largest task cell, held for its whole life; its ceiling keeps the cell in the
/// allocation it has today (the figures and how the task came down to them: docs/density.md, "Future-size
/// ceilings").
///
/// Each manager is supervised within the join (`supervise`): the join holds once what the managers are rebuilt
/// from and their restart state, where a supervising wrapper around each branch would hold them seven times.
#[tokio::test]
async fn the_node_side_is_one_task_near_the_sum_of_its_managers() {
    let (_ctx, m) = agent().managers();
    let side = &m.node;
    let sum = [
        size_of_val(&side.event_sink().run()),
        size_of_val(&side.health_monitor().run()),
        size_of_val(&side.status().run()),
        size_of_val(&side.lease().run()),
        size_of_val(&side.informer().run()),
        size_of_val(&side.gc()),
        size_of_val(&side.eviction()),
    ]
    .iter()
    .sum::<usize>();
    let gc = super::supervise::branch(side, super::node_side::NodeSide::gc);
    let supervised = size_of_val(&gc) - size_of_val(&side.gc());
    let joined = super::supervise::node_side(Arc::new(m.node));
    check(&[
        // a branch is its manager's future or nothing (waiting to start again, or ended)
        ("a branch over its manager", supervised, 8),
        // the join's own state: per manager whether it runs, the wakers' shared part and their boxed array, what
        // the managers are rebuilt from and their restart state (boxed, made at the first crash)
        (
            "node side over its parts",
            size_of_val(&joined) - sum,
            7 * 8 + 8 + 8 + 8 + 8,
        ),
        // the seven managers' idle futures together: waits on the shared timer (`crate::density::timer`) and
        // pokes (`crate::density::poke`), not tokio `Sleep`s and `Notified`s
        ("node side (joined)", size_of_val(&joined), 1_968),
    ]);
}

#[tokio::test]
async fn the_pod_sides_long_lived_futures_stay_small() {
    let (tx, _rx) = crate::density::chan::channel(1);
    let sizes = [(
        "pod watch",
        size_of_val(&crate::pods::source::watch_node_pods(
            client(),
            "sizes",
            tx,
            std::future::pending(),
        )),
        // no decoded pod kept across the delivery's await, the watch's back-off boxed, one shared client, no
        // copy of its selector; the pod side's join drops it where it waits (`join::join3_stop`)
        448,
    )];
    check(&sizes);
}

#[test]
fn per_node_and_per_pod_structures_stay_small() {
    let mut sizes = vec![
        ("AgentContext", size_of::<crate::AgentContext>(), 320),
        // one per node in an `Arc`: what the node-side managers are built again from after a crash, the agent's
        // context among them (the one a running agent answers)
        ("NodeSide", size_of::<super::node_side::NodeSide>(), 504),
        // one per node in a shared `Arc`: the machine facts, the kubelet version and the collection settings the
        // fleet shares are one copy, a node's own identifiers exact-size strings
        ("AgentConfig", size_of::<AgentConfig>(), 304),
        ("MachineInfo", size_of::<MachineInfo>(), 192),
        ("NodeSnapshot", size_of::<crate::node::NodeSnapshot>(), 256),
    ];
    sizes.extend(crate::pods::per_pod_sizes().into_iter().map(|(name, size)| {
        // the API objects are printed for comparison, not held per pod
        let ceiling = if name.starts_with("k8s") {
            usize::MAX
        } else if name == "ContainerSpec" {
            // one per container, so held several times per pod
            512
        } else if name == "ContainerRecord" {
            // in a list allocated per pod: the runtime's reason and message boxed apart (a running container has
            // neither), the image name and digest one shared pair, the ID a boxed string
            160
        } else if name == "DesiredPod" {
            // shared by its worker and the manager in one `Arc`: a deletion's time and grace period boxed (a pod
            // carries them only while it terminates), its requests computed from the shared container lists, a
            // hostname few pods set kept with the rarely set fields, the service account's name interned
            240
        } else if name == "PodWorker" {
            // back-offs made on first need (most pods never need one), a rejection and stop orders boxed, probe
            // and waiting maps made when needed, no prober link or senders of its own, its start time in seconds
            256
        } else {
            1_024
        };
        (name, size, ceiling)
    }));
    check(&sizes);
}

#[test]
fn queued_messages_stay_small() {
    // a pod event waits in the pod source's channel, one linked-queue node each (`crate::density::chan`)
    check(&[("PodEvent", size_of::<crate::pods::PodEvent>(), 32)]);
}
