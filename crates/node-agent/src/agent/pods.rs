//! The agent's side of running the pod lifecycle as one of its managers: the pod configuration from the agent's
//! KubeletConfiguration, events through the agent's recorder, API calls through its rate limit, and the
//! node's view composed from the Node the node half registered, the agent's allocatable and its pressure.
//! The PLEG's health is one of the node's readiness checks (`PLEG is not healthy: ...`, see
//! [`PlegHealth`]). The dependency runs one way: the agent knows the pod lifecycle, the pod lifecycle knows
//! nothing of the agent.

use std::sync::Arc;

use futures::FutureExt;

use super::AgentContext;
use crate::pods::actions::objects::ChangeDetection;
use crate::pods::runtime::dns::NodeDns;
use crate::pods::{
    NodeViewFeed, NodeViews, PlegHealth, PodConfig, PodLifecycle, PodOptions, StaticPodConfig,
    actions::pull_gate::PullSettings,
};

/// The node's DNS settings: `clusterDNS`, `clusterDomain` and the `resolvConf` file, read once per process
/// (every agent of a fleet has the same).
fn node_dns(k: &crate::config::KubeletConfig) -> Arc<NodeDns> {
    static CACHE: std::sync::Mutex<Option<(String, Arc<NodeDns>)>> = std::sync::Mutex::new(None);
    let servers: Vec<String> = k.cluster_dns.iter().map(ToString::to_string).collect();
    let domain = k.cluster_domain.clone().unwrap_or_default();
    let key = format!("{servers:?}|{domain}|{}", k.resolv_conf);
    let mut cache = match CACHE.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    };
    if let Some((cached, dns)) = cache.as_ref()
        && *cached == key
    {
        return dns.clone();
    }
    let text = if k.resolv_conf.is_empty() {
        String::new()
    } else {
        std::fs::read_to_string(&k.resolv_conf).unwrap_or_else(|error| {
            tracing::warn!(file = %k.resolv_conf, %error, "cannot read resolvConf; pods get no node resolver settings");
            String::new()
        })
    };
    let dns = Arc::new(NodeDns::new(servers, domain, &text));
    *cache = Some((key, dns.clone()));
    dns
}

/// The pod lifecycle of the agent behind `ctx`.
pub fn lifecycle(ctx: &AgentContext, options: PodOptions) -> PodLifecycle {
    let k = &ctx.config.kubelet;
    let mut config = PodConfig::new(ctx.config.node_name.clone());
    config.sync_frequency = k.sync_frequency;
    config.max_pods = k.max_pods;
    if !k.allowed_unsafe_sysctls.is_empty() {
        // checked when the configuration was read
        config.sysctls = crate::sysctl::Allowlist::new(k.allowed_unsafe_sysctls.iter().map(String::as_str))
            .ok()
            .map(Arc::new);
    }
    config.layout.pod_logs_dir = k.pod_logs_dir.display().to_string();
    config.kind = options.kind;
    config.apparmor_enabled = options.kind == crate::pods::NodeKind::Real && crate::pods::apparmor_enabled();
    config.layout.pods_dir = options.root_dir.as_ref().map(|r| r.join("pods"));
    config.layout.cgroups = options.cgroups.clone();
    config.layout.memory_capacity = ctx.config.machine.memory_bytes;
    config.csi_drivers = options.csi_drivers.clone();
    config.devices = options.devices.clone();
    config.dra = options.dra.clone();
    config.layout.dns = node_dns(k);
    config.pulls = PullSettings {
        serialize: k.serialize_image_pulls,
        max_parallel: k.max_parallel_image_pulls,
        qps: k.registry_pull_qps,
        burst: k.registry_burst,
    };
    // the Ready condition fails while the PLEG is stuck, as the kubelet's runtime state check does
    let pleg = PlegHealth::new();
    config.pleg_health = Some(pleg.clone());
    ctx.health_checks.add("PLEG", move || pleg.check());
    config.change_detection = match k.config_map_and_secret_change_detection_strategy.as_str() {
        "Get" => ChangeDetection::Get,
        "Cache" => ChangeDetection::Cache,
        _ => ChangeDetection::Watch,
    };
    let statics = StaticPodConfig {
        path: k.static_pod_path.clone(),
        file_check_frequency: k.file_check_frequency,
        url: k.static_pod_url.clone(),
        url_headers: k.static_pod_url_header.clone(),
        http_check_frequency: k.http_check_frequency,
        manifests: options.static_manifests.clone(),
    };
    config.static_pods = (statics.sources() > 0).then(|| Box::new(statics));
    let (node, allocatable, pressure) = (
        ctx.node.clone(),
        ctx.allocatable.clone(),
        ctx.pressure.subscribe(),
    );
    // the view is composed from the agent's channels at each read, from when the pod side is built
    let view = NodeViewFeed::Make(Box::new(move || NodeViews::agent(node, allocatable, pressure)));
    PodLifecycle::new(
        config,
        ctx.client.clone(),
        ctx.runtime.clone(),
        options.probes,
        view,
    )
    .with_metrics(options.metrics)
    .with_probe_metrics(ctx.probe_metrics.clone())
    .with_events(Arc::new(ctx.events.clone()))
    .with_api(ctx.api.clone())
    .with_source(options.source)
    .with_informers(options.informers)
}

/// Runs the pod lifecycle of the agent behind `ctx` until the agent's token fires (errors are logged).
/// Graceful node shutdown requests, questions about the node's pods and evictions arrive on `control`.
///
/// The lifecycle is built before the future: the task keeps neither the agent context nor the options.
pub fn run_for_agent(
    ctx: AgentContext,
    options: PodOptions,
    control: crate::density::chan::UnboundedReceiver<crate::pods::ManagerControl>,
) -> impl Future<Output = ()> + Send + 'static {
    let token = ctx.token.clone();
    let config = ctx.config.clone();
    let run = lifecycle(&ctx, options).with_control(control).run(token);
    drop(ctx);
    // `map`, not an `async` block around it: a block would hold the future twice (captured, and awaited)
    run.map(move |result| {
        if let Err(error) = result {
            tracing::error!(node = %config.node_name, %error, "pod lifecycle stopped");
        }
    })
}
