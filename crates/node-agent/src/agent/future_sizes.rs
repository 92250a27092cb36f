//! Guard rails for idle task memory: every long-lived task of an agent is a future held for the agent's whole
//! life, thousands of times over in a hollow fleet, so its size is per-node memory. These tests print each
//! size and fail when one grows past its ceiling — raise a ceiling only knowing what the bytes buy. Calls that
//! make requests are boxed inside these loops, so an idle task holds its state and not room for a request in
//! flight (the node status task was 19.5 KiB before, the lease task 7.6 KiB, the event writer 8.6 KiB).
//! `clippy::large_futures` (workspace lints, threshold in `clippy.toml`) catches a large future passed by value
//! or awaited anywhere else at compile time.

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
        // a task takes its future and ~112 bytes of its own, rounded up to 128 (tokio aligns task cells to
        // 128 bytes on x86-64): a ceiling of 128·n − 112 keeps the task within its 128·n
        // 424 bytes (a 640-byte task) while the shutdown drain's timer was held in place
        // 392 while it kept a `kube::Client` of its own (96 bytes; now a shared handle, see `crate::client`)
        ("event sink", size_of_val(&m.node.event_sink().run()), 320),
        (
            "runtime health monitor",
            size_of_val(&m.node.health_monitor().run()),
            // 632 bytes (a 768-byte task) while a poll and its timeout were held in place; 400 while it waited
            // on the agent's token itself (the node side's join stops it now, see `agent::supervise`); 312 while
            // its wait held a tokio `Sleep` and a `Notified` (see `crate::density::timer`, `crate::density::poke`); 184 while the
            // timer's wait and the poke were raced in `tokio::select!`
            144,
        ),
        // 2,328 and 1,320 bytes while written as `async fn`s taking `self` (kept twice); then 1,472 (a
        // 1,664-byte task) while the start-up clock and full transition timestamps were kept; 1,368 while it kept
        // its own `kube::Client` and waited on three channels through `Notified` futures (~80 bytes each); 1,040
        // while its idle wait included the agent's token; 960 while its trigger wait kept a second receiver of
        // each signal and its image list and pod CIDR were held in place
        // 888 while its wait held a tokio `Sleep` and a `Notified`; 768 while its four conditions kept two `Cow`s
        // each; 640 while its triggers were raced in `tokio::select!` (144 bytes; now polled by hand) and the
        // first wait for the runtime's answer, with its timeout, was held in place
        ("node status", size_of_val(&m.node.status().run()), 528),
        // 784 bytes (an 896-byte task) while it kept an `Api` (272 bytes; now built per request), a retry
        // back-off every renewal resets, and the Node's name twice; 640 with a `kube::Client` of its own; 552
        // while it waited on the agent's token; 448 while the Lease it last wrote was held in place
        // 376 while it slept on a tokio `Sleep` of its own; 312 while a renewal's result and the Node's copy
        // stayed in scope across the wait for the next one
        ("lease", size_of_val(&m.node.lease().run()), 168),
        (
            "node informer",
            size_of_val(&m.node.informer().run()),
            // the lean watch in place (760 bytes in a debug build) and nothing on the heap while idle; a
            // kube-runtime watcher was 416 bytes here plus its boxed state and an 8 KiB line buffer; 760 (an
            // 896-byte task) while it held its client twice and the watch its back-off in place; 600 while the
            // informer and its watch each held a `kube::Client`; 424 while it waited on the agent's token; 320
            // while the watch kept an empty queue and its selector and version as `String`s
            280,
        ),
        (
            "eviction manager",
            size_of_val(&ctx.eviction_loop(crate::density::chan::unbounded_channel().0)),
            // its own context clone, thresholds and state, one sleep or cleanup wait (a pass is boxed); 680
            // bytes while each wait was raced against the agent's token in a second future; 352 while it slept on a
            // tokio `Sleep` of its own; 280 while a pass's answer stayed in scope across the wait
            264,
        ),
        (
            "pod lifecycle",
            size_of_val(&super::pods::run_for_agent(ctx.clone(), m.pods, control)),
            // the pod manager's loop and what stops it; the lifecycle is boxed until its tasks start and the
            // agent context is not kept: 1,432 bytes (2,328 while it held the lifecycle and the context, and
            // the lifecycle's future twice in a wrapping `async` block; 3,680 while its `async fn`s kept their
            // arguments twice); 1,432 while the static pods' side (272 bytes, most nodes have none) was in place;
            // 1,160 while its wait for a Node change held a `Notified`; 1,080 before the manager kept the one
            // timer its pod workers are woken by (an 8-byte handle and its wait; the timer is boxed while a worker
            // waits for a time), still within the same 1,280-byte task; 1,168 (a 1,280-byte task) while the parts
            // moved into the manager's future stayed in scope beside it (kept twice), the manager waited on the
            // agent's token (it stops when the PLEG's channel closes now) and its channel and tick waits were
            // `async fn`s; under 528 the task is 640 bytes (at 528 since the manager takes a pointer to what
            // arrived before the pod side was built, see `pods::first_pod`)
            528,
        ),
        (
            "garbage collectors",
            size_of_val(&ctx.gc_loop()),
            // 568 bytes (a 768-byte task) while its two timers each kept a sleep; 520 while it raced its sleep
            // and its passes against the agent's token; 288 while that sleep was a tokio `Sleep`; 208 while it kept
            // the periods its timers are made from
            176,
        ),
    ];
    check(&sizes);
}

/// The node-side managers run joined in one task: the join costs a few bytes per manager over the sum of their
/// futures, where a task each cost ~112 bytes and the rounding to 128 (5,376 bytes of task cells per node; now
/// one cell). 8,592 bytes while joined in an `async fn` (each manager's future held twice); 4,432 (a 4,608-byte
/// cell, which jemalloc serves from its 5,120-byte class) before the managers shared one API client and waited
/// on channels without `Notified` futures; 3,752 (a 3,968-byte cell in the 4,096 class) while six of the managers
/// each waited on the agent's token (~72 bytes each) where the join now stops them; 3,168 (a 3,328-byte cell in
/// the 3,584 class) while the join's branch wakers, the status task's second receivers and the lease task's
/// kept Lease were held in place. Under 2,944 bytes the cell (the future and ~112 bytes of tokio's, in
/// multiples of 128) fits jemalloc's 3,072-byte class; under 2,432 (since the managers wait on a shared
/// timer) its 2,560-byte class; under 1,936 its 2,048-byte class (2,384 bytes while the status task's conditions
/// kept two `Cow`s each, its triggers and the runtime monitor's waits were raced in `tokio::select!`, and the
/// lease, eviction and collection loops kept what they no longer needed across their waits).
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
        // 2,848 bytes (a cell in jemalloc's 3,072-byte class) while five managers each held a tokio `Sleep` (112
        // bytes; now a shared timer's 24-byte wait, see `crate::density::timer`) and two a `Notified` (64; now a `Poke`'s
        // 8); 2,384 (the 2,560-byte class) before the changes listed above; under 1,936 the cell fits the
        // 2,048-byte class
        ("node side (joined)", size_of_val(&joined), 1_936),
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
        // 960 bytes in a debug build; 3,408 while a decoded pod was kept across the delivery's await
        // 968 (a 1,152-byte task) while the watch held its back-off in place; 800 while it and its watch each
        // held a `kube::Client`; 536 while it waited on the agent's token (the pod side's join drops it now, see
        // `join::join3_stop`), kept a copy of its selector and the watch an empty queue
        448,
    )];
    check(&sizes);
}

#[test]
fn per_node_and_per_pod_structures_stay_small() {
    let mut sizes = vec![
        ("AgentContext", size_of::<crate::AgentContext>(), 320),
        // one per node in an `Arc` (16 bytes more): what the node-side managers are built again from, the agent's
        // context among them (the one a running agent answers); under 496 bytes jemalloc's 512-byte class
        ("NodeSide", size_of::<super::node_side::NodeSide>(), 496),
        // one per node in a shared `Arc` (16 bytes more): 416 bytes (jemalloc's 448-byte class) while the machine
        // facts and the kubelet version kept a `String` each, the fleet-wide ones allocated per node too; 352 (the
        // 384 class) while each node kept its own copy of the collection settings; under 304 the 320 class
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
            // in a list allocated per pod (jemalloc's 160-byte class for one container): 232 bytes while the
            // runtime's reason and message were two strings in place, empty for a running container; 192 while
            // the image name and digest were two shared strings (now one shared pair) and the ID a `String`
            160
        } else if name == "DesiredPod" {
            // shared by its worker and the manager in one `Arc` (the counts and this): 328 bytes, jemalloc's
            // 384-byte class, while a deletion's time and grace period were held in place (a pod carries them only
            // while it terminates); 296, the 320 class, while it kept its requests (computed from the shared
            // container lists now), a hostname few pods set and its own copy of the service account's name; at
            // 240 bytes or less, with the `Arc`'s counts, the 256 class
            240
        } else if name == "PodWorker" {
            // 864 bytes while its image-pull, restart and sync-error back-offs were held in place (most pods
            // never need one), 528 while a rejection, stop orders and empty hash maps were; 328 while it kept
            // empty probe and waiting maps, its prober link, its start time to the nanosecond and two senders
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
    // a pod event waits in the pod source's channel, one linked-queue node each (`crate::density::chan`: the channel
    // costs ~160 bytes idle, where tokio's bounded channel allocated a 512-byte core and 32 slots up front)
    check(&[("PodEvent", size_of::<crate::pods::PodEvent>(), 32)]);
}
