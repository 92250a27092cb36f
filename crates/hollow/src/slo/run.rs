//! One SLO run end to end: pre-flight checks, the measuring watch, the fleet's "before" snapshot, the load,
//! waiting for the pods to run, the scheduler's and kubelets' events, the fleet's "after" snapshot, and the
//! result every report is made from.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WatchEvent};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::apiserver::{self, Scrape};
use super::load::{Generator, LoadOutcome, LoadSpec};
use super::measure::{ClusterSide, Counts, Definition, PodRecord, Recorder};
use super::node_side::{self, FleetSnapshot};
use super::progress;
use super::template::RUN_LABEL;
use super::threshold::{Threshold, Verdict, verdicts};

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct SloOptions {
    /// The load.
    pub load: LoadSpec,
    /// Fleet endpoints (`http://host:port`), one per fleet process.
    pub fleet: Vec<String>,
    /// How the cluster side's phases are taken.
    pub definition: Definition,
    /// SLO thresholds.
    pub thresholds: Vec<Threshold>,
    /// How long to wait, after the load, for every pod to run.
    pub wait: Duration,
    /// Keep the objects (and namespaces) afterwards.
    pub keep: bool,
    /// How often the API server's /metrics is scraped.
    pub scrape_every: Duration,
    /// Progress output: a bar when stderr is a terminal, else a log line this often.
    pub progress_every: Duration,
}

/// Everything a run found.
#[derive(Debug, Clone)]
pub struct SloResult {
    /// The run's id.
    pub run_id: String,
    /// When the run began.
    pub started: Timestamp,
    /// Per-pod records.
    pub records: Vec<PodRecord>,
    /// Cluster-side summary.
    pub cluster: ClusterSide,
    /// Verdicts, one per threshold.
    pub verdicts: Vec<Verdict>,
    /// The fleet's merged node side of this run (none without `--fleet`).
    pub fleet: Option<FleetSnapshot>,
    /// Each fleet process's own share of this run.
    pub fleet_parts: Vec<FleetSnapshot>,
    /// What the load generator did.
    pub load: LoadOutcome,
    /// Pods expected.
    pub expected_pods: u64,
    /// Pods still not Running when the wait ended.
    pub not_running: usize,
    /// API server request latency scrapes, or why there are none.
    pub api: Result<Vec<Scrape>, String>,
    /// Whole-run wall time.
    pub elapsed: Duration,
}

impl SloResult {
    /// Every threshold met, and every pod ran (a pod that never started has no latency to be within any
    /// threshold, so a run with such pods does not meet the SLO).
    pub fn pass(&self) -> bool {
        self.not_running == 0 && self.verdicts.iter().all(|v| v.pass)
    }
}

/// A short id for the run (object names and the label value).
pub fn run_id() -> String {
    let n: u32 = rand::random();
    format!("{:06x}", n & 0xff_ffff)
}

async fn watch(
    pods: Api<Pod>,
    selector: String,
    recorder: Arc<Mutex<Recorder>>,
    ready: tokio::sync::oneshot::Sender<()>,
    token: CancellationToken,
) {
    let config = watcher::Config::default().labels(&selector);
    let mut stream = watcher::watcher(pods, config).default_backoff().boxed();
    let mut ready = Some(ready);
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            () = token.cancelled() => return,
        };
        let now = Timestamp::now();
        let mut rec = recorder.lock().unwrap_or_else(|p| p.into_inner());
        match event {
            Some(Ok(WatchEvent::Apply(p) | WatchEvent::InitApply(p))) => rec.observe(&p, now),
            Some(Ok(WatchEvent::Delete(p))) => rec.deleted(&p),
            Some(Ok(WatchEvent::InitDone)) => {
                if let Some(r) = ready.take() {
                    let _ = r.send(());
                }
            }
            Some(Ok(WatchEvent::Init)) => {}
            Some(Err(e)) => tracing::warn!(error = %e, "measurement watch"),
            None => return,
        }
    }
}

/// Reads the scheduler's `Scheduled` and the kubelets' `Pulling` events of the run's namespaces into the
/// records (by pod UID).
async fn read_events(
    client: &kube::Client,
    namespaces: &[String],
    recorder: &Mutex<Recorder>,
) -> anyhow::Result<()> {
    for ns in namespaces {
        let events: Api<Event> = Api::namespaced(client.clone(), ns);
        for reason in ["Scheduled", "Pulling"] {
            let mut lp = ListParams::default()
                .fields(&format!("involvedObject.kind=Pod,reason={reason}"))
                .limit(500);
            loop {
                let page = events
                    .list(&lp)
                    .await
                    .with_context(|| format!("listing {reason} events in {ns}"))?;
                let mut rec = recorder.lock().unwrap_or_else(|p| p.into_inner());
                for e in &page.items {
                    let Some(uid) = e.involved_object.uid.as_deref() else {
                        continue;
                    };
                    if reason == "Pulling" {
                        rec.pulled(uid);
                        continue;
                    }
                    let at = e
                        .event_time
                        .as_ref()
                        .map(|t| t.0)
                        .or_else(|| e.first_timestamp.as_ref().map(|t| t.0));
                    if let Some(at) = at {
                        rec.scheduled_event(uid, at);
                    }
                }
                drop(rec);
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(c) => lp = lp.continue_token(&c),
                    None => break,
                }
            }
        }
    }
    Ok(())
}

/// Runs the load and measures it. Errors before the first pod leave the cluster untouched (except
/// namespaces created for the run, which cleanup removes).
pub async fn run(client: kube::Client, opts: SloOptions) -> anyhow::Result<SloResult> {
    // boxed: the measurement's state is large, callers hold only a pointer to it (clippy::large_futures)
    Box::pin(measure_run(client, opts)).await
}

async fn measure_run(client: kube::Client, opts: SloOptions) -> anyhow::Result<SloResult> {
    let started = Timestamp::now();
    let start = Instant::now();
    let run_id = opts.load.run_id.clone();
    // the fleet first: an unreachable endpoint is an error before anything is created
    let before = node_side::fetch_all(&opts.fleet).await?;
    let generator = Generator::prepare(client.clone(), opts.load.clone()).await?;

    let token = CancellationToken::new();
    let recorder = Arc::new(Mutex::new(Recorder::default()));
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let watch_task = tokio::spawn(watch(
        Api::all(client.clone()),
        format!("{RUN_LABEL}={run_id}"),
        recorder.clone(),
        ready_tx,
        token.clone(),
    ));
    tokio::time::timeout(Duration::from_secs(30), ready_rx)
        .await
        .context("the measurement watch did not start within 30 s")?
        .context("the measurement watch ended")?;
    let scraper = tokio::spawn(apiserver::scrape(
        client.clone(),
        start,
        opts.scrape_every,
        token.clone(),
    ));
    let expected = |created: u64| created * generator.spec().pods_per_object();
    let progress_token = token.child_token();
    let progress = {
        let recorder = recorder.clone();
        let counters = generator.counters();
        let per_object = generator.spec().pods_per_object();
        tokio::spawn(progress::report(
            move || {
                let c = recorder.lock().map(|r| r.counts()).unwrap_or_default();
                let objects = counters.created.load(std::sync::atomic::Ordering::Relaxed);
                (objects * per_object, c)
            },
            opts.progress_every,
            progress_token.clone(),
        ))
    };

    let load = generator.run().await;
    let expected_pods = expected(load.created);
    let wait_end = Instant::now() + opts.wait;
    loop {
        let (counts, pending) = {
            let r = recorder.lock().unwrap_or_else(|p| p.into_inner());
            (r.counts(), r.pending())
        };
        if counts_done(counts, pending, expected_pods) || Instant::now() >= wait_end {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    progress_token.cancel();
    let _ = progress.await;
    token.cancel();
    let _ = watch_task.await;
    let api = match scraper.await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err((_, e))) => Err(e),
        Err(e) => Err(e.to_string()),
    };

    read_events(&client, &generator.spec().namespaces, &recorder).await?;
    let records = recorder.lock().unwrap_or_else(|p| p.into_inner()).records();
    let cluster = ClusterSide::from_records(&records, opts.definition);
    let verdicts = verdicts(&cluster, &opts.thresholds);
    let (fleet, fleet_parts) = if opts.fleet.is_empty() {
        (None, Vec::new())
    } else {
        // a node records status_reported when its PATCH's response arrives, which can be after the watch
        // saw the pod Running: give the fleet up to 10 s to account for every pod the watch saw running
        let running = records.iter().filter(|r| r.running_seen.is_some()).count();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let after = node_side::fetch_all(&opts.fleet).await?;
            let parts = after
                .iter()
                .zip(&before)
                .map(|(a, b)| a.since(b))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let merged = FleetSnapshot::merge(&parts)?;
            if merged.stage("status_reported").count >= running || Instant::now() >= deadline {
                break (Some(merged), parts);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let not_running = records
        .iter()
        .filter(|r| r.running_seen.is_none() && !r.deleted)
        .count();
    if !opts.keep
        && let Err(e) = generator.cleanup().await
    {
        tracing::warn!(error = %e, "cleanup");
    }
    Ok(SloResult {
        run_id,
        started,
        records,
        cluster,
        verdicts,
        fleet,
        fleet_parts,
        load,
        expected_pods,
        not_running,
        api,
        elapsed: start.elapsed(),
    })
}

fn counts_done(c: Counts, pending: usize, expected: u64) -> bool {
    c.seen as u64 >= expected && pending == 0
}
