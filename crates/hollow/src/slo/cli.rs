//! The flags of `hollow slo` and the command itself: parse, check, run, report, and an exit status that
//! says whether the SLO was met.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Toleration;

use super::load::{LoadSpec, Pace};
use super::measure::Definition;
use super::run::{self, SloOptions};
use super::template::{self, Kind};
use super::threshold::Threshold;
use crate::duration::parse_duration;

/// `hollow slo` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SloArgs {
    /// kubeconfig for the API server (in-cluster config or $KUBECONFIG when absent).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// What to create.
    #[arg(long, value_enum, default_value_t = Kind::Pod)]
    pub kind: Kind,
    /// Pods per Deployment or Job.
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// Objects created per second, evenly spaced.
    #[arg(long, conflicts_with_all = ["burst_size", "burst_every"])]
    pub rate: Option<f64>,
    /// Bursts instead of an even rate: this many objects at once …
    #[arg(long, requires = "burst_every")]
    pub burst_size: Option<u32>,
    /// … every this long (e.g. 10s).
    #[arg(long, requires = "burst_size", value_parser = parse_duration)]
    pub burst_every: Option<Duration>,
    /// Create this many objects (with --duration: whichever ends first).
    #[arg(long)]
    pub count: Option<u64>,
    /// Create objects for this long (e.g. 60s, 5m).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Namespace to create objects in (repeat for several, used round-robin); created when missing and then
    /// deleted at cleanup.
    #[arg(long = "namespace", default_value = "slo")]
    pub namespaces: Vec<String>,
    /// Pod template YAML (a Pod, a PodTemplate, a workload with spec.template, or a bare template) instead of
    /// the built-in stateless one.
    #[arg(long)]
    pub template: Option<PathBuf>,
    /// Adds KEY=VALUE to the pods' nodeSelector (repeatable), e.g. to aim at one fleet's nodes.
    #[arg(long, value_parser = parse_pair)]
    pub node_selector: Vec<(String, String)>,
    /// Adds a toleration to the pods (repeatable): KEY=VALUE:EFFECT, KEY:EFFECT (any value) or KEY (any value
    /// and effect) — e.g. hollow.node-agent.io/node=true:NoSchedule for the taint the Helm chart's nodes carry.
    #[arg(long = "toleration", value_parser = parse_toleration)]
    pub tolerations: Vec<Toleration>,
    /// After creating, churn for this long: delete the oldest object and create a new one, at the same pace.
    #[arg(long, value_parser = parse_duration)]
    pub churn: Option<Duration>,
    /// Keep the objects (and created namespaces) afterwards.
    #[arg(long)]
    pub keep: bool,
    /// The generator's own API requests per second (a client-side token bucket).
    #[arg(long, default_value_t = 100)]
    pub client_qps: u32,
    /// Burst of that bucket.
    #[arg(long, default_value_t = 200)]
    pub client_burst: u32,
    /// A fleet process's endpoint (http://HOST:PORT, its --metrics-address); repeat for every process. Its
    /// /histograms and /metrics give the node-side stages, merged across processes.
    #[arg(long)]
    pub fleet: Vec<String>,
    /// How the cluster side's phases are taken: `current` (clusterloader2's today: every phase as the
    /// measuring watch first saw it, at full precision) or `legacy` (its earlier one: creationTimestamp, the
    /// Scheduled event and container startedAt, for comparing with runs published before the change).
    #[arg(long, value_enum, default_value_t = Definition::Current)]
    pub definition: Definition,
    /// SLO threshold [TRANSITION:]pNN=DURATION (repeatable; default pod_startup p99=5s).
    #[arg(long = "threshold")]
    pub thresholds: Vec<Threshold>,
    /// How long to wait, after the load, for every pod to run.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub wait: Duration,
    /// Report directory (default slo-report-<run id>).
    #[arg(long)]
    pub report: Option<PathBuf>,
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?}: expected KEY=VALUE"))
}

/// `KEY[=VALUE][:EFFECT]` as a toleration: `Equal` with a value, `Exists` without.
fn parse_toleration(s: &str) -> Result<Toleration, String> {
    let (rest, effect) = match s.rsplit_once(':') {
        Some((rest, effect)) => {
            if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
                return Err(format!(
                    "{s:?}: effect {effect:?} is not NoSchedule, PreferNoSchedule or NoExecute"
                ));
            }
            (rest, Some(effect.to_owned()))
        }
        None => (s, None),
    };
    let (key, value) = match rest.split_once('=') {
        Some((key, value)) => (key, Some(value.to_owned())),
        None => (rest, None),
    };
    if key.is_empty() {
        return Err(format!("{s:?}: expected KEY[=VALUE][:EFFECT]"));
    }
    Ok(Toleration {
        key: Some(key.to_owned()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.to_owned()),
        value,
        effect,
        ..Toleration::default()
    })
}

impl SloArgs {
    /// The run's options (template read, pace and load checked), with a fresh run id.
    pub fn options(&self) -> anyhow::Result<SloOptions> {
        let pace = match (self.rate, self.burst_size, self.burst_every) {
            (Some(rate), _, _) => Pace::Uniform { rate },
            (None, Some(size), Some(every)) => Pace::Bursts { size, every },
            _ => anyhow::bail!("say the pace: --rate R, or --burst-size B with --burst-every T"),
        };
        let mut template = match &self.template {
            Some(path) => {
                let text =
                    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
                template::from_yaml(&text, &path.display().to_string())?
            }
            None => template::builtin(),
        };
        if !self.node_selector.is_empty() {
            let spec = template.spec.get_or_insert_with(Default::default);
            let sel = spec.node_selector.get_or_insert_with(Default::default);
            sel.extend(self.node_selector.iter().cloned());
        }
        if !self.tolerations.is_empty() {
            let spec = template.spec.get_or_insert_with(Default::default);
            spec.tolerations
                .get_or_insert_with(Default::default)
                .extend(self.tolerations.iter().cloned());
        }
        let load = LoadSpec {
            kind: self.kind,
            replicas: self.replicas,
            pace,
            count: self.count,
            duration: self.duration,
            namespaces: self.namespaces.clone(),
            template,
            run_id: run::run_id(),
            churn: self.churn,
            client_qps: self.client_qps,
            client_burst: self.client_burst,
        };
        load.validate()?;
        Ok(SloOptions {
            load,
            fleet: self.fleet.clone(),
            definition: self.definition,
            thresholds: if self.thresholds.is_empty() {
                vec![Threshold::default()]
            } else {
                self.thresholds.clone()
            },
            wait: self.wait,
            keep: self.keep,
            scrape_every: Duration::from_secs(5),
            progress_every: Duration::from_secs(5),
        })
    }
}

/// Runs `hollow slo`: the report goes to stdout and the report directory. `Ok(true)` when every threshold
/// is met.
pub async fn main(args: SloArgs) -> anyhow::Result<bool> {
    let opts = args.options()?;
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig (--kubeconfig or $KUBECONFIG)")?,
    };
    let url = config.cluster_url.clone();
    let client = kube::Client::try_from(config)?;
    let result = run::run(client, opts)
        .await
        .with_context(|| format!("API server {url}"))?;
    let dir = args
        .report
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("slo-report-{}", result.run_id)));
    let written = super::report::write_dir(&result, &dir)?;
    print!("{}", super::report::table(&result));
    println!("Report: {}/index.html", written.dir.display());
    Ok(result.pass())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerations_parse_as_kubectl_taints_are_written() {
        let t = parse_toleration("hollow.node-agent.io/node=true:NoSchedule").expect("full");
        assert_eq!(
            (
                t.key.as_deref(),
                t.operator.as_deref(),
                t.value.as_deref(),
                t.effect.as_deref()
            ),
            (
                Some("hollow.node-agent.io/node"),
                Some("Equal"),
                Some("true"),
                Some("NoSchedule")
            )
        );
        let t = parse_toleration("gpu:NoExecute").expect("no value");
        assert_eq!((t.operator.as_deref(), t.value), (Some("Exists"), None));
        let t = parse_toleration("gpu").expect("key only");
        assert_eq!((t.operator.as_deref(), t.effect), (Some("Exists"), None));
        let err = parse_toleration("gpu=1:Sometimes").expect_err("bad effect");
        assert!(err.contains("\"Sometimes\" is not NoSchedule"), "{err}");
    }
}
