//! Agent faults: node-agent SIGKILLed five times at random points of a 30-pod burst (the points drawn from a
//! printed seed) and started again each time: after each restart no pod has a second ready sandbox or running
//! container; at the end every pod is Running, and after a round of the container GC has one sandbox and one
//! container (beside containers a kill left never started, whose replacement is the only restart allowed); and once
//! the pods are deleted nothing of them is left on the node — no sandbox or container, pod directory, mount,
//! pod cgroup or network namespace.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::{init_logging, wait_for};
use futures::future::try_join_all;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use super::harness::NODE;
use super::{
    Held, Rng, all_running, delete_all, held_by_uid, main_container, name, node, sleeper, uid, wait_clean,
};

const PODS: usize = 30;
const KILLS: usize = 5;
/// A round of the container GC (`--container-gc-period`, one minute) and a margin.
const GC_ROUND: Duration = Duration::from_secs(80);

#[tokio::test]
async fn agent_sigkilled_five_times_during_a_burst() -> anyhow::Result<()> {
    init_logging();
    let Some((node, _serial)) = node().await? else {
        return Ok(());
    };
    let pods = node.namespace("rf-agent").await?;
    let leases: Api<Lease> = Api::namespaced(node.cp.admin_client().await?, "kube-node-lease");
    let mut rng = Rng::seeded();
    let burst: Vec<_> = (0..PODS)
        .map(|i| sleeper(&format!("burst-{i:02}")))
        .collect::<Result<_, _>>()?;
    let t0 = Instant::now();
    try_join_all(burst.iter().map(|p| node.create_pod(&pods, p))).await?;
    let mut points = Vec::new();
    for round in 0..KILLS {
        let wait = Duration::from_millis(rng.between(500, 6000));
        tokio::time::sleep(wait).await;
        let running = super::fault_pods(&pods)
            .await?
            .iter()
            .filter(|p| main_container(p).0)
            .count();
        points.push(format!("{:.1}s ({running} Running)", t0.elapsed().as_secs_f64()));
        let killed_at = k8s_openapi::jiff::Timestamp::now();
        node.restart_agent(true).await?;
        wait_for(
            &format!("a lease renewal after kill {}", round + 1),
            Duration::from_secs(60),
            || async {
                let renewed = leases
                    .get(NODE)
                    .await?
                    .spec
                    .and_then(|s| s.renew_time)
                    .map(|t| t.0);
                Ok(renewed.filter(|t| *t > killed_at).map(|_| ()))
            },
        )
        .await
        .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
        for (pod_uid, h) in held_by_uid(node).await? {
            assert!(
                h.ready_sandboxes <= 1 && h.running <= 1,
                "after kill {}: pod {pod_uid} has {h:?}",
                round + 1
            );
        }
    }
    let all = all_running(node, &pods, PODS, Duration::from_secs(180)).await?;
    let done = t0.elapsed();
    // a kill between the runtime making a sandbox and the agent hearing of it leaves that sandbox behind, stopped,
    // once the agent has made the pod another: the container GC removes it on its next round (every minute), as
    // the kubelet's does; so wait a round for what is beside the running ones to go
    let extra_of = |held: &BTreeMap<String, Held>| -> usize {
        all.iter()
            .map(|p| {
                let h = held.get(&uid(p)).copied().unwrap_or_default();
                (h.sandboxes + h.containers).saturating_sub(2 + h.never_started)
            })
            .sum()
    };
    let gc_round = Instant::now();
    let mut held = held_by_uid(node).await?;
    while extra_of(&held) > 0 && gc_round.elapsed() < GC_ROUND {
        tokio::time::sleep(Duration::from_secs(5)).await;
        held = held_by_uid(node).await?;
    }
    let mut replaced = 0;
    for p in &all {
        let (_, _, restarts) = main_container(p);
        let h = held.get(&uid(p)).copied().unwrap_or_default();
        assert_eq!((h.ready_sandboxes, h.running), (1, 1), "{}: {h:?}", name(p));
        // a kill between a container's create and its start leaves it created for good, or fails the start the
        // dead agent asked for: as the kubelet, the agent starts the next attempt beside it, and that is the only
        // restart a pod may show — one a kill at most, each beside a container that never started (the
        // replaced ones kept, but for what container GC took of more than one)
        let restarts = usize::try_from(restarts)?;
        assert!(
            restarts == 0 || (h.never_started >= 1 && h.never_started <= restarts && restarts <= KILLS),
            "{} restarted {restarts} times beside {} containers that never started: {h:?}",
            name(p),
            h.never_started
        );
        replaced += restarts;
    }
    assert_eq!(
        extra_of(&held),
        0,
        "dead sandboxes or containers beside the running ones {GC_ROUND:?} after all were Running: {held:?}"
    );
    println!(
        "[real_node_faults] node-agent SIGKILLed {KILLS} times during a {PODS}-pod burst at {}: all Running \
         after {done:?}, one running container each and no other but those that never started ({replaced} \
         restarts, each replacing a container a kill left created or whose start it broke)",
        points.join(", ")
    );
    delete_all(node, &pods).await?;
    let clean = wait_clean(node).await?;
    println!("[real_node_faults] the node clean {clean:?} after the pods were gone from the API");
    Ok(())
}
