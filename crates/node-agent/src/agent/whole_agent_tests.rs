//! Whole agents on paused time, against the API server double and the test runtime: a stuck PLEG turns the node
//! not ready.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::agent::{Agent, RunningAgent};
use crate::config::{AgentConfig, GcSettings, KubeletConfig};
use crate::machine::MachineInfo;
use crate::testing::api::ApiDouble;
use crate::testing::{TestRuntime, pass};

const NODE: &str = "n1";

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

async fn stop(agent: RunningAgent) {
    agent
        .stop(Duration::from_secs(10))
        .await
        .expect("the agent stops within its grace");
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
