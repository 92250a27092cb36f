//! The load generator: creates the run's objects at a pace (uniform R per second, or bursts of B every T),
//! for a count or a duration, round-robin over namespaces, through its own client-side rate limit; then an
//! optional churn phase (delete the oldest object, create a new one, at the same pace); then cleanup.
//!
//! Everything that can be refused is checked before the first pod is created: the pace, the count, the API
//! server's reachability, the namespaces (created when missing), and the first object (a server-side dry
//! run).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod, PodTemplateSpec};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams, PropagationPolicy};
use node_agent::api::RateLimiter;
use tokio::time::Instant;

use super::template::{self, Kind, Object, RUN_LABEL};

/// How objects are paced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// `rate` objects per second, evenly spaced.
    Uniform {
        /// Objects per second.
        rate: f64,
    },
    /// `size` objects at once every `every`.
    Bursts {
        /// Objects per burst.
        size: u32,
        /// Time between bursts.
        every: Duration,
    },
}

impl Pace {
    /// When object `index` is due, from the start.
    pub fn due(&self, index: u64) -> Duration {
        match *self {
            Pace::Uniform { rate } => Duration::from_secs_f64(index as f64 / rate),
            Pace::Bursts { size, every } => {
                every * u32::try_from(index / u64::from(size)).unwrap_or(u32::MAX)
            }
        }
    }

    /// The asked rate, objects per second.
    pub fn rate(&self) -> f64 {
        match *self {
            Pace::Uniform { rate } => rate,
            Pace::Bursts { size, every } => f64::from(size) / every.as_secs_f64(),
        }
    }
}

/// What to create.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Pods, Deployments or Jobs.
    pub kind: Kind,
    /// Pods per Deployment or Job.
    pub replicas: u32,
    /// The pace.
    pub pace: Pace,
    /// Stop after this many objects (with or before `duration`).
    pub count: Option<u64>,
    /// Stop after this long (with or before `count`).
    pub duration: Option<Duration>,
    /// Namespaces, used round-robin.
    pub namespaces: Vec<String>,
    /// The pod template.
    pub template: PodTemplateSpec,
    /// The run's id (label value, object name part).
    pub run_id: String,
    /// Length of the churn phase after creation (none: no churn).
    pub churn: Option<Duration>,
    /// Client-side limit on the generator's API requests per second.
    pub client_qps: u32,
    /// Burst of that limit.
    pub client_burst: u32,
}

impl LoadSpec {
    /// Refuses a spec that cannot run (before anything touches the cluster).
    pub fn validate(&self) -> anyhow::Result<()> {
        match self.pace {
            Pace::Uniform { rate } if !(rate.is_finite() && rate > 0.0) => {
                anyhow::bail!("--rate must be a positive number of objects per second, not {rate}")
            }
            Pace::Bursts { size: 0, .. } => anyhow::bail!("--burst-size must be at least 1"),
            Pace::Bursts { every, .. } if every.is_zero() => {
                anyhow::bail!("--burst-every must be above zero")
            }
            _ => {}
        }
        if self.count.is_none() && self.duration.is_none() {
            anyhow::bail!("say how much load: --count N, --duration D, or both (whichever ends first)");
        }
        if self.count == Some(0) {
            anyhow::bail!("--count must be at least 1");
        }
        if self.duration.is_some_and(|d| d.is_zero()) {
            anyhow::bail!("--duration must be above zero");
        }
        if self.replicas == 0 {
            anyhow::bail!("--replicas must be at least 1");
        }
        if self.namespaces.is_empty() {
            anyhow::bail!("at least one namespace is needed");
        }
        if self.client_qps == 0 {
            anyhow::bail!("--client-qps must be at least 1");
        }
        Ok(())
    }

    /// Pods each object makes.
    pub fn pods_per_object(&self) -> u64 {
        match self.kind {
            Kind::Pod => 1,
            Kind::Deployment | Kind::Job => u64::from(self.replicas),
        }
    }
}

/// The generator's running counts, shared with the progress reporter.
#[derive(Debug, Default)]
pub struct LoadCounters {
    /// Objects created.
    pub created: AtomicU64,
    /// Objects whose creation failed.
    pub failed: AtomicU64,
    /// Objects deleted by churn.
    pub churned: AtomicU64,
}

/// What the generator did.
#[derive(Debug, Clone)]
pub struct LoadOutcome {
    /// Objects created (both phases).
    pub created: u64,
    /// Objects whose creation the API refused (first error kept).
    pub failed: u64,
    /// The first creation error.
    pub first_error: Option<String>,
    /// Objects deleted by churn.
    pub churned: u64,
    /// The asked rate (objects/s).
    pub asked_rate: f64,
    /// The achieved rate of the creation phase (objects/s): created objects over the time from the first to
    /// the last creation, comparable with the asked rate.
    pub achieved_rate: f64,
    /// Length of the creation phase.
    pub creation_phase: Duration,
    /// Namespaces this run created (deleted at cleanup).
    pub created_namespaces: Vec<String>,
}

/// The generator's API handles and limiter.
pub struct Generator {
    client: kube::Client,
    spec: LoadSpec,
    limiter: Arc<RateLimiter>,
    counters: Arc<LoadCounters>,
    created_namespaces: Vec<String>,
}

fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    }
}

impl Generator {
    /// Checks everything a run needs before its first pod: the spec, the API server, the namespaces (creating
    /// missing ones) and a server-side dry run of the first object.
    pub async fn prepare(client: kube::Client, spec: LoadSpec) -> anyhow::Result<Generator> {
        spec.validate()?;
        let limiter = Arc::new(
            RateLimiter::new(spec.client_qps, spec.client_burst.max(1))
                .context("--client-qps must be at least 1")?,
        );
        client
            .apiserver_version()
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach the API server: {}", api_error(&e)))?;
        let mut generator = Generator {
            client,
            spec,
            limiter,
            counters: Arc::new(LoadCounters::default()),
            created_namespaces: Vec::new(),
        };
        let checked = generator.namespaces_and_dry_run().await;
        if checked.is_err() {
            // leave nothing behind: remove the namespaces made for this run
            let namespaces: Api<Namespace> = Api::all(generator.client.clone());
            for ns in &generator.created_namespaces {
                if let Err(e) = namespaces.delete(ns, &DeleteParams::default()).await {
                    tracing::warn!(namespace = %ns, error = %api_error(&e), "deleting a namespace made for the run");
                }
            }
        }
        checked.map(|()| generator)
    }

    /// Makes the missing namespaces, then dry-runs the first object.
    async fn namespaces_and_dry_run(&mut self) -> anyhow::Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        for ns in &self.spec.namespaces {
            self.limiter.acquire().await;
            match namespaces.get_opt(ns).await {
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => anyhow::bail!("namespace {ns}: cannot read it: {}", api_error(&e)),
            }
            let object: Namespace = serde_json::from_value(serde_json::json!({
                "metadata": {"name": ns, "labels": {RUN_LABEL: self.spec.run_id}},
            }))?;
            self.limiter.acquire().await;
            namespaces
                .create(&PostParams::default(), &object)
                .await
                .map_err(|e| anyhow::anyhow!("namespace {ns} cannot be created: {}", api_error(&e)))?;
            self.created_namespaces.push(ns.clone());
        }
        let first = self.object(0)?;
        self.create(&first, true)
            .await
            .map_err(|e| anyhow::anyhow!("the API server refuses the template (dry run): {e}"))
    }

    /// The shared counters.
    pub fn counters(&self) -> Arc<LoadCounters> {
        self.counters.clone()
    }

    /// The spec.
    pub fn spec(&self) -> &LoadSpec {
        &self.spec
    }

    fn namespace(&self, index: u64) -> &str {
        let n = self.spec.namespaces.len() as u64;
        &self.spec.namespaces[usize::try_from(index % n).unwrap_or(0)]
    }

    fn object(&self, index: u64) -> anyhow::Result<Object> {
        template::object(
            self.spec.kind,
            &self.spec.template,
            &self.spec.run_id,
            index,
            self.namespace(index),
            self.spec.replicas,
        )
    }

    async fn create(&self, object: &Object, dry_run: bool) -> Result<(), String> {
        let pp = PostParams {
            dry_run,
            ..Default::default()
        };
        self.limiter.acquire().await;
        let c = self.client.clone();
        let res = match object {
            Object::Pod(p) => Api::<Pod>::namespaced(c, p.metadata.namespace.as_deref().unwrap_or("default"))
                .create(&pp, p)
                .await
                .map(drop),
            Object::Deployment(d) => {
                Api::<Deployment>::namespaced(c, d.metadata.namespace.as_deref().unwrap_or("default"))
                    .create(&pp, d)
                    .await
                    .map(drop)
            }
            Object::Job(j) => Api::<Job>::namespaced(c, j.metadata.namespace.as_deref().unwrap_or("default"))
                .create(&pp, j)
                .await
                .map(drop),
        };
        res.map_err(|e| api_error(&e))
    }

    async fn delete(&self, index: u64) -> Result<(), String> {
        let name = format!("slo-{}-{index}", self.spec.run_id);
        let ns = self.namespace(index);
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        self.limiter.acquire().await;
        let c = self.client.clone();
        let res = match self.spec.kind {
            Kind::Pod => Api::<Pod>::namespaced(c, ns).delete(&name, &dp).await.map(drop),
            Kind::Deployment => Api::<Deployment>::namespaced(c, ns)
                .delete(&name, &dp)
                .await
                .map(drop),
            Kind::Job => Api::<Job>::namespaced(c, ns).delete(&name, &dp).await.map(drop),
        };
        res.map_err(|e| api_error(&e))
    }

    /// Runs the creation phase and, if asked, the churn phase; returns what it did.
    pub async fn run(&self) -> LoadOutcome {
        let first_error = std::sync::Mutex::new(None::<String>);
        let start = Instant::now();
        let end = self.spec.duration.map(|d| start + d);
        let mut index = 0u64;
        let mut tasks = futures::stream::FuturesUnordered::new();
        let mut first_done: Option<Instant> = None;
        let mut last_done: Option<Instant> = None;
        let record = |res: Result<(), String>,
                      at: Instant,
                      first: &mut Option<Instant>,
                      last: &mut Option<Instant>| {
            match res {
                Ok(()) => {
                    self.counters.created.fetch_add(1, Ordering::Relaxed);
                    first.get_or_insert(at);
                    *last = Some(at);
                }
                Err(e) => {
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    let mut slot = first_error.lock().unwrap_or_else(|p| p.into_inner());
                    slot.get_or_insert(e);
                }
            }
        };
        use futures::StreamExt;
        loop {
            if self.spec.count.is_some_and(|c| index >= c) {
                break;
            }
            let due = start + self.spec.pace.due(index);
            if end.is_some_and(|e| due >= e) {
                break;
            }
            // finish creations while waiting for the next one's turn
            loop {
                tokio::select! {
                    Some(at) = tasks.next(), if !tasks.is_empty() => {
                        let (res, at): (Result<(), String>, Instant) = at;
                        record(res, at, &mut first_done, &mut last_done);
                    }
                    () = tokio::time::sleep_until(due) => break,
                }
            }
            match self.object(index) {
                Ok(object) => tasks.push(async move {
                    let res = self.create(&object, false).await;
                    (res, Instant::now())
                }),
                Err(e) => record(
                    Err(e.to_string()),
                    Instant::now(),
                    &mut first_done,
                    &mut last_done,
                ),
            }
            index += 1;
        }
        while let Some((res, at)) = tasks.next().await {
            record(res, at, &mut first_done, &mut last_done);
        }
        let created_first_phase = self.counters.created.load(Ordering::Relaxed);
        let creation_phase = start.elapsed();
        let achieved_rate = match (first_done, last_done) {
            (Some(a), Some(b)) if created_first_phase > 1 && b > a => {
                (created_first_phase - 1) as f64 / (b - a).as_secs_f64()
            }
            _ => 0.0,
        };

        if let Some(churn) = self.spec.churn {
            let churn_start = Instant::now();
            let mut oldest = 0u64;
            let mut step = 0u64;
            loop {
                let due = churn_start + self.spec.pace.due(step);
                if due >= churn_start + churn {
                    break;
                }
                tokio::time::sleep_until(due).await;
                if let Err(e) = self.delete(oldest).await {
                    tracing::warn!(object = oldest, error = %e, "churn: delete failed");
                } else {
                    self.counters.churned.fetch_add(1, Ordering::Relaxed);
                }
                oldest += 1;
                let res = match self.object(index) {
                    Ok(object) => self.create(&object, false).await,
                    Err(e) => Err(e.to_string()),
                };
                record(res, Instant::now(), &mut first_done, &mut last_done);
                index += 1;
                step += 1;
            }
        }
        LoadOutcome {
            created: self.counters.created.load(Ordering::Relaxed),
            failed: self.counters.failed.load(Ordering::Relaxed),
            first_error: first_error.into_inner().unwrap_or_else(|p| p.into_inner()),
            churned: self.counters.churned.load(Ordering::Relaxed),
            asked_rate: self.spec.pace.rate(),
            achieved_rate,
            creation_phase,
            created_namespaces: self.created_namespaces.clone(),
        }
    }

    /// Deletes the run's objects (and the namespaces it created); waits for none of it to finish.
    pub async fn cleanup(&self) -> anyhow::Result<()> {
        let lp = ListParams::default().labels(&format!("{RUN_LABEL}={}", self.spec.run_id));
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        for ns in &self.spec.namespaces {
            if self.created_namespaces.contains(ns) {
                continue;
            }
            self.limiter.acquire().await;
            let c = self.client.clone();
            let res = match self.spec.kind {
                Kind::Pod => Api::<Pod>::namespaced(c, ns)
                    .delete_collection(&dp, &lp)
                    .await
                    .map(drop),
                Kind::Deployment => Api::<Deployment>::namespaced(c, ns)
                    .delete_collection(&dp, &lp)
                    .await
                    .map(drop),
                Kind::Job => Api::<Job>::namespaced(c, ns)
                    .delete_collection(&dp, &lp)
                    .await
                    .map(drop),
            };
            res.map_err(|e| anyhow::anyhow!("cleanup in {ns}: {}", api_error(&e)))?;
        }
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        for ns in &self.created_namespaces {
            self.limiter.acquire().await;
            namespaces
                .delete(ns, &DeleteParams::default())
                .await
                .map_err(|e| anyhow::anyhow!("cleanup: deleting namespace {ns}: {}", api_error(&e)))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> LoadSpec {
        LoadSpec {
            kind: Kind::Pod,
            replicas: 1,
            pace: Pace::Uniform { rate: 50.0 },
            count: Some(10),
            duration: None,
            namespaces: vec!["a".into()],
            template: template::builtin(),
            run_id: "r".into(),
            churn: None,
            client_qps: 100,
            client_burst: 100,
        }
    }

    #[test]
    fn paces_space_objects_as_asked() {
        let u = Pace::Uniform { rate: 50.0 };
        assert_eq!(u.due(0), Duration::ZERO);
        assert_eq!(u.due(50), Duration::from_secs(1));
        let b = Pace::Bursts {
            size: 10,
            every: Duration::from_secs(2),
        };
        assert_eq!(
            (b.due(9), b.due(10), b.due(25)),
            (Duration::ZERO, Duration::from_secs(2), Duration::from_secs(4))
        );
        assert_eq!(b.rate(), 5.0);
    }

    #[test]
    fn specs_that_cannot_run_are_refused() {
        assert!(spec().validate().is_ok());
        let bad = |f: fn(&mut LoadSpec), what: &str| {
            let mut s = spec();
            f(&mut s);
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        };
        bad(
            |s| s.pace = Pace::Uniform { rate: 0.0 },
            "--rate must be a positive",
        );
        bad(|s| s.pace = Pace::Uniform { rate: f64::NAN }, "--rate");
        bad(
            |s| {
                s.pace = Pace::Bursts {
                    size: 0,
                    every: Duration::from_secs(1),
                }
            },
            "--burst-size",
        );
        bad(
            |s| {
                s.pace = Pace::Bursts {
                    size: 3,
                    every: Duration::ZERO,
                }
            },
            "--burst-every",
        );
        bad(|s| s.count = None, "--count N, --duration D");
        bad(|s| s.count = Some(0), "--count must be at least 1");
        bad(|s| s.replicas = 0, "--replicas");
        bad(|s| s.namespaces.clear(), "namespace");
    }
}
