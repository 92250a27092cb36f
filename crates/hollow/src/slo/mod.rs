//! `hollow slo`: does this control plane meet the pod start-up SLO at this scale, and which stage eats the
//! time — in one command.
//!
//! * [`template`] — the pod template (built in or a user's YAML) and the objects made from it;
//! * [`load`] — the load generator (pace, count or duration, namespaces, churn, cleanup, client QPS);
//! * [`measure`] — the cluster-side measurement, as clusterloader2's PodStartupLatency (today's definition or
//!   the legacy one);
//! * [`threshold`] — SLO thresholds and their verdicts;
//! * [`node_side`] — the fleet's per-stage HDR histograms and pod_start_sli, merged across processes;
//! * [`apiserver`] — API request latency from the API server's /metrics during the run;
//! * [`run`] — one run end to end;
//! * [`progress`] — created / scheduled / running while it goes;
//! * [`report`] — table, PerfData JSON, CSV, the report directory and its index.html;
//! * [`plots`] — the report's SVG and PNG plots;
//! * [`cli`] — the command's flags.

pub mod apiserver;
pub mod cli;
pub mod load;
pub mod measure;
pub mod node_side;
pub mod plots;
pub mod progress;
pub mod report;
pub mod run;
pub mod template;
pub mod threshold;
