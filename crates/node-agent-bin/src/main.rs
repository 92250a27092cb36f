//! `node-agent`: one Kubernetes node agent (kubelet) for this machine (the binary of the `node-agent` library).
//!
//! Builds everything the library core is handed — the configuration (KubeletConfiguration file + flags), the
//! API client (from `--kubeconfig`), the container runtime (`--container-runtime-endpoint`, or the in-memory
//! fake with `--runtime fake`) and the machine facts — then runs the agent until SIGTERM or SIGINT, and stops it
//! gracefully. With `shutdownGracePeriod` set, the machine's shutdown as systemd-logind announces it shuts the
//! pods down first ([`logind`]; or SIGTERM itself with `--shutdown-trigger=sigterm`). Configuration errors are reported naming the field, with exit code 1, before anything else
//! happens.

mod credentials;
mod logind;

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use cri_fake::{FakeConfig, FakeRuntime};
use node_agent::config::{RuntimeKind, ShutdownTrigger};
use node_agent::pods::runtime::cgroups::QosCgroups;
use node_agent::pods::{NetTarget, PodOptions, ScriptedProbes};
use node_agent::server::{FileLogs, LogSource, NodeEndpoint, ScriptedLogs, serve_agent};
use node_agent::{Agent, Flags, MachineInfo, Metrics};
use prometheus_client::registry::Registry;
use runtime_api::Runtime;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn,tower=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let flags = Flags::parse();
    if flags.version {
        println!("{}", node_agent::config::version_line());
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("node-agent: error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("node-agent: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn machine_hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

/// `--runtime fake`: the in-memory runtime, and pod options whose HTTP, TCP and gRPC probes (and HTTP hooks)
/// are answered by that runtime's script (`cri-fake.node-agent.io/probe`). Fake pods get addresses from the
/// node's pod CIDR that belong to no container on this machine: nothing may be sent to them, so no real-network
/// transport is built in this mode.
fn fake_mode(config: FakeConfig) -> (FakeRuntime, PodOptions) {
    let fake = FakeRuntime::new(config);
    let script = fake.clone();
    let probes = ScriptedProbes::new(move |container_id, target| {
        let target = match target {
            NetTarget::Http { port, path } => cri_fake::ProbeTarget::Http { port, path },
            NetTarget::Tcp { port } => cri_fake::ProbeTarget::Tcp { port },
            NetTarget::Grpc { port, service } => cri_fake::ProbeTarget::Grpc { port, service },
        };
        script
            .probe_result(container_id, target)
            .map_err(|e| e.to_string())
    });
    (fake, PodOptions::with_probes(Arc::new(probes)))
}

async fn run(flags: Flags) -> anyhow::Result<()> {
    // Configuration first: a bad file or flag fails before any connection is attempted.
    let (kubelet, unacted) = flags.kubelet_config().with_context(|| match &flags.config {
        Some(path) => format!("configuration {}", path.display()),
        None => "configuration".to_owned(),
    })?;
    // no silent settings: every field given that does not (fully) act is named (docs/configuration.md)
    unacted.warn("node-agent");
    let kubelet = Arc::new(kubelet);
    let hostname = machine_hostname();
    let node_name = flags
        .hostname_override
        .clone()
        .unwrap_or_else(|| hostname.clone())
        .to_ascii_lowercase();
    let machine = match flags.runtime {
        RuntimeKind::Fake => MachineInfo::synthetic(&node_name),
        RuntimeKind::Remote => MachineInfo::from_host(&flags.root_dir).context("reading machine facts")?,
    };
    let config = flags.agent_config(kubelet.clone(), machine, &hostname)?;

    let cert_dir = flags
        .cert_dir
        .clone()
        .unwrap_or_else(|| flags.root_dir.join("pki"));
    let mut node_client = credentials::connect(
        flags.kubeconfig.clone(),
        flags.bootstrap_kubeconfig.clone(),
        cert_dir,
        &kubelet,
        &node_name,
    )
    .await?;
    let client = node_client.client.clone();

    let (runtime, pods, logs): (Arc<dyn Runtime>, PodOptions, Arc<dyn LogSource>) = match flags.runtime {
        RuntimeKind::Fake => {
            tracing::info!(
                "using the in-memory fake container runtime (network probes and logs answered by its script)"
            );
            // no pod network until the Node's podCIDR arrives, like a runtime whose CNI config comes from it
            let (fake, pods) = fake_mode(FakeConfig {
                pod_cidr: None,
                ..FakeConfig::default()
            });
            let script = fake.clone();
            let logs = ScriptedLogs::new(move |id| script.container_logs(id).map_err(|e| e.to_string()));
            (Arc::new(fake), pods, Arc::new(logs))
        }
        RuntimeKind::Remote => {
            let endpoint = &kubelet.container_runtime_endpoint;
            let remote = cri_real::RemoteConfig {
                request_timeout: kubelet.runtime_request_timeout,
                ..Default::default()
            };
            let rt = cri_real::RemoteRuntime::connect_with(endpoint, remote)
                .await
                .with_context(|| format!("connecting to the container runtime at {endpoint}"))?;
            tracing::info!(%endpoint, "connected to the container runtime");
            node_agent::pods::make_root_shared(&flags.root_dir)
                .context("making the root directory a shared mount (for mountPropagation)")?;
            node_agent::node_cgroups::apply_own_oom_score(kubelet.oom_score_adj);
            // the attached volumes published before a restart are in use from the first status on
            let drivers = node_agent::csi::CsiDrivers::default();
            drivers.in_use().seed_from_disk(&flags.root_dir.join("pods"));
            // the device manager restores what its checkpoint says running pods' containers hold
            let devices = node_agent::devices::DeviceManager::with_checkpoint(&node_agent::devices::dir(
                &flags.root_dir,
            ));
            let claims = node_agent::dra::claims::ClaimCache::load(&flags.root_dir)
                .context("reading the checkpoint of prepared resource claims")?;
            let dra =
                node_agent::dra::DraManager::new(client.clone(), node_agent::dra::Drivers::default(), claims);
            let mut pods = PodOptions::default()
                .with_root_dir(&flags.root_dir)
                .with_csi_drivers(drivers)
                .with_devices(devices)
                .with_dra(Arc::new(dra));
            if kubelet.cgroups_per_qos {
                let cgroups = if kubelet.cgroup_driver == "systemd" {
                    QosCgroups::start_systemd(&kubelet.cgroup_root, kubelet.pod_pids_limit).await
                } else {
                    QosCgroups::start(&kubelet.cgroup_root, kubelet.pod_pids_limit)
                }
                .context("creating the QoS cgroups (cgroupsPerQOS)")?;
                let version = if cgroups.is_v2() { "cgroup v2" } else { "cgroup v1" };
                let driver = &kubelet.cgroup_driver;
                tracing::info!(kubepods = %cgroups.kubepods(), "pods run in QoS cgroups ({version}, {driver})");
                node_agent::node_cgroups::enforce(&cgroups, &config)
                    .await
                    .context("enforcing node allocatable (enforceNodeAllocatable)")?;
                pods = pods.with_cgroups(cgroups);
            } else if kubelet.pod_pids_limit > 0 {
                tracing::warn!("podPidsLimit has no effect with cgroupsPerQOS: false (no pod cgroups)");
            }
            (Arc::new(rt), pods, Arc::new(FileLogs))
        }
    };

    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    let token = CancellationToken::new();
    let node = config.node_name.clone();
    let (serving_host, serving_ip) = (config.hostname.clone(), config.node_ip);
    let csi_drivers = pods.csi_drivers.clone().unwrap_or_default();
    let host = node_agent::stats::host::RealHost::new(&flags.root_dir).with_pod_cgroups(pods.cgroups.clone());
    let devices = pods.devices.clone();
    let dra = pods.dra.clone();
    let dra_drivers = pods.dra.as_ref().map(|d| d.drivers().clone()).unwrap_or_default();
    let mut builder = Agent::builder(config, client, runtime)
        .token(token.clone())
        .metrics(metrics)
        .pods(pods);
    if flags.runtime == RuntimeKind::Remote {
        builder = builder.host_stats(Arc::new(host));
    }
    let agent = builder.build()?.start();
    tracing::info!(%node, "node agent started");
    // the certificates' renewals, the pod-resources API and the kubelet API run with the agent's tasks: its stop
    // waits for them
    if let Some(rotation) = node_client.rotation(&node, token.clone()) {
        agent.spawn(rotation);
    }
    let serving = match node_client.serving(&kubelet, &node, &serving_host, serving_ip, token.clone()) {
        Some((serving, renewal)) => {
            agent.spawn(renewal);
            Some(serving as Arc<dyn rustls::server::ResolvesServerCert>)
        }
        None => None,
    };
    if flags.runtime == RuntimeKind::Remote {
        // the kubelet's pod-resources API, always served by a real node (a unix socket under the root directory)
        let path = node_agent::pod_resources::socket_path(&flags.root_dir);
        let mut service = node_agent::pod_resources::PodResourcesService::new(agent.pods_query());
        if let Some(devices) = &devices {
            service = service.with_devices(devices.clone());
        }
        if let Some(dra) = dra {
            service = service.with_dra(dra);
        }
        let server = node_agent::pod_resources::PodResourcesServer::bind_with(&path, service)?;
        let stop = token.clone();
        agent.spawn(async move {
            if let Err(error) = server.run(stop).await {
                tracing::error!(%error, "the pod-resources API stopped");
            }
        });
        if let Some(devices) = devices {
            // device plugins register on <root-dir>/device-plugins/kubelet.sock
            let dir = node_agent::devices::dir(&flags.root_dir);
            let server = node_agent::devices::registration::RegistrationServer::bind(&dir, devices)
                .context("serving device plugin registration")?;
            let stop = token.clone();
            agent.spawn(async move {
                if let Err(error) = server.run(stop).await {
                    tracing::error!(%error, "device plugin registration stopped");
                }
            });
        }
        plugin_registration(&agent, &flags.root_dir, &node, (csi_drivers, dra_drivers), &token);
    }
    let endpoint = NodeEndpoint::new(agent.context().clone()).with_logs(logs);
    if let Some((_, server)) =
        serve_agent(endpoint, Some(Arc::new(registry)), serving).context("starting the kubelet API")?
    {
        agent.spawn(server.stopped());
    }

    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    // the machine's shutdown, as logind announces it, shuts the pods down while the agent runs on; SIGTERM then
    // only stops the agent
    let machine_shutdown = async {
        match (flags.shutdown_trigger, agent.shutdown_period()) {
            (ShutdownTrigger::Logind, Some(period)) if flags.runtime == RuntimeKind::Remote => {
                logind::watch(&agent, period).await
            }
            _ => std::future::pending().await,
        }
    };
    let graceful = tokio::select! {
        _ = term.recv() => {
            tracing::info!("SIGTERM received, stopping");
            flags.shutdown_trigger == ShutdownTrigger::Sigterm
        }
        _ = int.recv() => {
            tracing::info!("SIGINT received, stopping");
            false
        }
        () = token.cancelled() => false,
        () = machine_shutdown => false,
    };
    if graceful {
        // --shutdown-trigger=sigterm: the kubelet's graceful node shutdown (pods stopped, reported Failed)
        agent.shutdown(flags.shutdown_timeout).await?;
    } else {
        // pods keep running: the next start takes them over
        agent.stop(flags.shutdown_timeout).await?;
    }
    tracing::info!(%node, "node agent stopped");
    Ok(())
}

/// Kubelet plugin registration on a real node: the watcher of `<root-dir>/plugins_registry` with the CSI
/// handler (registering into `drivers.0`, which the pods' CSI volumes are published through) and the DRA handler
/// (into `drivers.1`, which pods' resource claims are prepared through), and the node's `CSINode` object created
/// once the Node is registered (as the kubelet creates it at start). Both run with the agent's tasks.
fn plugin_registration(
    agent: &node_agent::RunningAgent,
    root_dir: &std::path::Path,
    node: &str,
    drivers: (node_agent::csi::CsiDrivers, node_agent::dra::Drivers),
    token: &CancellationToken,
) {
    use node_agent::csi::node_info::NodeInfo;
    use node_agent::csi::registration::CsiPluginHandler;
    use node_agent::dra::registration::DraPluginHandler;
    use node_agent::plugins::{CSI_PLUGIN, DRA_PLUGIN, PluginWatcher, registry_dir};

    let ctx = agent.context();
    let node_info = NodeInfo::new(ctx.client.clone(), ctx.api.clone(), node);
    let csi = CsiPluginHandler::new(drivers.0, node_info.clone());
    let dra = DraPluginHandler::new(drivers.1);
    let watcher = PluginWatcher::new(registry_dir(root_dir))
        .handler(CSI_PLUGIN, Arc::new(csi))
        .handler(DRA_PLUGIN, Arc::new(dra));
    agent.spawn(watcher.run(token.clone()));
    let mut registered = ctx.registered.clone();
    let token = token.clone();
    agent.spawn(async move {
        let ensure = async {
            while registered.borrow_and_update().is_none() {
                if registered.changed().await.is_err() {
                    return;
                }
            }
            let mut delay = std::time::Duration::from_secs(1);
            loop {
                match node_info.ensure_csi_node().await {
                    Ok(()) => return,
                    Err(error) => tracing::warn!(%error, "creating the node's CSINode object; trying again"),
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(60));
            }
        };
        tokio::select! {
            () = ensure => {}
            () = token.cancelled() => {}
        }
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use node_agent::pods::model::spec::{Action, HttpGet};
    use node_agent::pods::{ProbeOutcome, ProbeTarget};
    use runtime_api::cri;

    use super::*;

    /// A running fake container whose script fails HTTP `/ready` on `port`; its id and its pod IP.
    async fn scripted_container(fake: &FakeRuntime, port: u16) -> anyhow::Result<(String, String)> {
        let sandbox = fake
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(cri::PodSandboxConfig {
                    metadata: Some(cri::PodSandboxMetadata {
                        name: "web".into(),
                        uid: "uid-web".into(),
                        namespace: "default".into(),
                        attempt: 0,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await?
            .pod_sandbox_id;
        let pod_ip = fake
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: sandbox.clone(),
                verbose: false,
            })
            .await?
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default();
        let rules = format!("http:{port}/ready=fail");
        let id = fake
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox,
                config: Some(cri::ContainerConfig {
                    metadata: Some(cri::ContainerMetadata {
                        name: "app".into(),
                        attempt: 0,
                    }),
                    image: Some(cri::ImageSpec {
                        image: "registry.k8s.io/pause:3.10".into(),
                        ..Default::default()
                    }),
                    annotations: [(format!("{}probe", cri_fake::ANNOTATION_PREFIX), rules)].into(),
                    ..Default::default()
                }),
                sandbox_config: None,
            })
            .await?
            .container_id;
        fake.start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await?;
        Ok((id, pod_ip))
    }

    /// The pod options `--runtime fake` runs with answer network probes from the fake runtime's script: a
    /// scripted failure fails, an unscripted probe passes, and neither touches the network.
    #[tokio::test]
    async fn fake_mode_answers_network_probes_from_the_runtime_script() -> anyhow::Result<()> {
        let (fake, pods) = fake_mode(FakeConfig {
            pod_cidr: Some("10.128.1.0/24".into()),
            images: vec!["registry.k8s.io/pause:3.10".into()],
            ..FakeConfig::default()
        });
        // a loopback port nobody listens on: were these probes sent over the network, they would be refused
        // here rather than leave the machine for the pod's private address
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let (id, pod_ip) = scripted_container(&fake, port).await?;
        assert!(pod_ip.starts_with("10.128.1."), "fake pod IP {pod_ip}");
        let target = ProbeTarget {
            namespace: "default",
            pod: "web",
            container: "app",
            container_id: &id,
            pod_ip: "127.0.0.1",
        };
        let http = |path: &str| {
            Action::Http(HttpGet {
                https: false,
                host: None,
                port,
                path: path.into(),
                headers: vec![],
            })
        };
        let timeout = Duration::from_secs(1);
        assert_eq!(
            pods.probes.check(&target, &http("/ready"), timeout).await,
            ProbeOutcome::Failure("scripted probe failure".into()),
            "the script fails /ready"
        );
        assert_eq!(
            pods.probes.check(&target, &http("/healthz"), timeout).await,
            ProbeOutcome::Success,
            "no rule: passes, though nothing listens"
        );
        let tcp = Action::Tcp { host: None, port };
        assert_eq!(
            pods.probes.check(&target, &tcp, timeout).await,
            ProbeOutcome::Success
        );
        Ok(())
    }
}
