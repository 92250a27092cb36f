//! Whole agents on paused time, against the API server double and the test runtime: a crashing manager is
//! started again while the lease renews on, and a stuck PLEG turns the node not ready.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::agent::{Agent, RunningAgent};
use crate::config::{AgentConfig, GcSettings, KubeletConfig};
use crate::gc::{FsStats, ImageFsSource};
use crate::machine::MachineInfo;
use crate::metrics::Metrics;
use crate::testing::api::ApiDouble;
use crate::testing::{TestRuntime, pass};

const NODE: &str = "n1";
const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1";

fn config(gc: GcSettings) -> AgentConfig {
    let mut config = AgentConfig::new(
        NODE,
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        Arc::new(KubeletConfig::default()),
        MachineInfo::synthetic(NODE),
    );
    config.gc = Arc::new(gc);
    config
}

/// The node's Ready condition as the API server holds it: (status, reason, message).
fn ready(api: &ApiDouble) -> Option<(String, String, String)> {
    let node = api.object(&format!("/api/v1/nodes/{NODE}"))?;
    let conditions = node["status"]["conditions"].as_array()?;
    let ready = conditions.iter().find(|c| c["type"] == "Ready")?;
    let field = |f: &str| ready[f].as_str().unwrap_or_default().to_owned();
    Some((field("status"), field("reason"), field("message")))
}

/// An image filesystem that panics when asked, while told to.
#[derive(Default)]
struct CrashingImageFs {
    crashing: AtomicBool,
}

#[async_trait]
impl ImageFsSource for CrashingImageFs {
    async fn image_fs(&self) -> Result<FsStats, String> {
        assert!(
            !self.crashing.load(Ordering::SeqCst),
            "the image filesystem exploded"
        );
        Ok(FsStats {
            capacity_bytes: 100 << 30,
            available_bytes: 90 << 30,
            inodes: None,
            inodes_free: None,
        })
    }
}

async fn stop(agent: RunningAgent) {
    agent
        .stop(Duration::from_secs(10))
        .await
        .expect("the agent stops within its grace");
}

#[tokio::test(start_paused = true)]
async fn the_lease_renews_on_while_garbage_collection_crashes_and_is_started_again() {
    let (api, client) = ApiDouble::new();
    let runtime = Arc::new(TestRuntime::new());
    runtime.answer_lists();
    let image_fs = Arc::new(CrashingImageFs::default());
    image_fs.crashing.store(true, Ordering::SeqCst);
    let metrics = Arc::new(Metrics::unregistered());
    // an image pass every 10 s: each start of the collector crashes within its first period
    let gc = GcSettings {
        image_gc_period: Duration::from_secs(10),
        ..GcSettings::default()
    };
    let agent = Agent::builder(config(gc), client, runtime)
        .metrics(metrics.clone())
        .image_fs(image_fs.clone())
        .build()
        .expect("a valid agent")
        .start();
    pass(Duration::from_secs(20)).await;
    assert!(api.object(LEASE).is_some(), "the lease was created");
    let window = Instant::now();
    pass(Duration::from_secs(180)).await;

    let restarts = metrics.manager_restarts("gc");
    // back-offs of 1, 2, 4, 8, 16, 32 s and a first pass within 10 s of each start: at least 5 in 200 s
    assert!(restarts >= 5, "the collector was started again {restarts} times");
    let renewals: Vec<Instant> = api
        .requests("PUT", LEASE)
        .into_iter()
        .map(|s| s.at)
        .filter(|at| *at >= window)
        .collect();
    assert!(
        renewals.len() >= 17,
        "{} renewals in 180 s while the collector crashed",
        renewals.len()
    );
    // every 10 s (4 % jitter, on the 50 ms grid, seen in 100 ms steps): never a gap
    for pair in renewals.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap <= Duration::from_millis(10_600),
            "a lease renewal gap of {gap:?}"
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
        assert_eq!(metrics.manager_restarts(other), 0, "{other} was not restarted");
    }

    // the cause gone, the collector runs on after its last wait (at most a minute and its jitter)
    image_fs.crashing.store(false, Ordering::SeqCst);
    pass(Duration::from_secs(70)).await;
    let settled = metrics.manager_restarts("gc");
    assert!(settled >= restarts);
    pass(Duration::from_secs(120)).await;
    assert_eq!(
        metrics.manager_restarts("gc"),
        settled,
        "no more restarts once passes succeed"
    );
    assert!(
        api.requests("PUT", LEASE).len() > renewals.len(),
        "the lease renews on"
    );
    stop(agent).await;
}

#[tokio::test(start_paused = true)]
async fn a_stalled_pleg_turns_the_node_not_ready_after_three_minutes_and_ready_once_it_answers() {
    let (api, client) = ApiDouble::new();
    let runtime = Arc::new(TestRuntime::new());
    // a sandbox that is not the agent's: the pod side (and its PLEG, relisting every second) starts at once
    runtime.answer_lists();
    let agent = Agent::builder(config(GcSettings::default()), client, runtime.clone())
        .build()
        .expect("a valid agent")
        .start();
    pass(Duration::from_secs(30)).await;
    let (status, _, message) = ready(&api).expect("the node reports Ready");
    assert_eq!(status, "True", "{message}");

    runtime.stall_lists(true);
    let stalled = Instant::now();
    pass(Duration::from_secs(170)).await;
    let (status, _, message) = ready(&api).expect("the node reports Ready");
    assert_eq!(status, "True", "still within the threshold: {message}");

    // past 3 min, and the next status computation (every 10 s, 4 % jitter)
    pass(Duration::from_secs(25)).await;
    let (status, reason, message) = ready(&api).expect("the node reports Ready");
    assert_eq!(status, "False");
    assert_eq!(reason, "KubeletNotReady");
    assert!(
        message.starts_with("PLEG is not healthy: pleg was last seen active 3m")
            && message.ends_with(" ago; threshold is 3m0s"),
        "{message}"
    );
    let written = api.requests("PATCH", &format!("/api/v1/nodes/{NODE}/status"));
    assert!(
        written.iter().any(|w| w.at >= stalled + Duration::from_secs(180)),
        "the status was written past the threshold"
    );

    runtime.stall_lists(false);
    pass(Duration::from_secs(15)).await;
    let (status, _, message) = ready(&api).expect("the node reports Ready");
    assert_eq!(status, "True", "ready again once the runtime answers: {message}");
    stop(agent).await;
}
