//! The CSI volumes published for the node's pods, and their statistics from the drivers.
//!
//! The pod side records each volume it publishes ([`PublishedVolumes::add`]: the pod volume's name, its claim,
//! the driver, the handle and the paths) and forgets a pod's once they are torn down. For `/stats/summary` and
//! the `kubelet_volume_stats_*` metrics, [`PublishedVolumes::stats`] asks each volume's driver
//! (`NodeGetVolumeStats`, only of a driver with `GET_VOLUME_STATS`) and keeps the answers for
//! `volumeStatsAggPeriod`, as the kubelet's volume stat calculator keeps its figures between runs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::v1 as csi;
use super::v1::node_client::NodeClient;
use super::{CsiDrivers, connect};

/// A CSI volume published for a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedVolume {
    /// The pod volume's name.
    pub name: String,
    /// The claim it comes from (namespace, name); `None` for an inline volume.
    pub claim: Option<(String, String)>,
    /// The driver.
    pub driver: String,
    /// The volume's ID for the driver.
    pub handle: String,
    /// Where it is published.
    pub target: PathBuf,
    /// Where it is staged, when it is.
    pub staging: Option<PathBuf>,
}

/// One volume's figures (the Summary API's `VolumeStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeUsage {
    /// The pod volume's name.
    pub name: String,
    /// The claim it comes from (namespace, name).
    pub claim: Option<(String, String)>,
    /// When the driver answered, Unix nanoseconds.
    pub time_ns: i64,
    /// Capacity, bytes.
    pub capacity_bytes: u64,
    /// Used, bytes.
    pub used_bytes: u64,
    /// Available, bytes.
    pub available_bytes: u64,
    /// Inodes: total, free, used (when the driver reports them).
    pub inodes: Option<(u64, u64, u64)>,
}

#[derive(Debug, Default)]
struct PodEntry {
    volumes: Vec<PublishedVolume>,
    cached: Option<(Instant, Arc<[VolumeUsage]>)>,
}

/// The published volumes, by pod UID. Clones share them.
#[derive(Debug, Clone, Default)]
pub struct PublishedVolumes(Arc<Mutex<BTreeMap<String, PodEntry>>>);

impl PublishedVolumes {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, PodEntry>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pod `uid` has `volume` published (again: the entry is replaced).
    pub fn add(&self, uid: &str, volume: PublishedVolume) {
        let mut pods = self.lock();
        let entry = pods.entry(uid.to_owned()).or_default();
        entry.volumes.retain(|v| v.name != volume.name);
        entry.volumes.push(volume);
        entry.cached = None;
    }

    /// Pod `uid`'s volumes are torn down.
    pub fn release_pod(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// The pods with published volumes.
    pub fn pods(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// The figures of pod `uid`'s volumes whose drivers report them, at most `max_age` old.
    pub async fn stats(&self, drivers: &CsiDrivers, uid: &str, max_age: Duration) -> Arc<[VolumeUsage]> {
        let volumes = {
            let pods = self.lock();
            let Some(entry) = pods.get(uid) else {
                return Arc::new([]);
            };
            if let Some((at, figures)) = &entry.cached
                && at.elapsed() < max_age
            {
                return figures.clone();
            }
            entry.volumes.clone()
        };
        let mut figures = Vec::new();
        for v in volumes {
            match volume_usage(drivers, &v).await {
                Ok(Some(usage)) => figures.push(usage),
                Ok(None) => {}
                Err(error) => tracing::debug!(%uid, volume = %v.name, %error, "NodeGetVolumeStats failed"),
            }
        }
        let figures: Arc<[VolumeUsage]> = figures.into();
        if let Some(entry) = self.lock().get_mut(uid) {
            entry.cached = Some((Instant::now(), figures.clone()));
        }
        figures
    }
}

/// The driver's figures for `v`; `None` when the driver does not report volume stats.
async fn volume_usage(drivers: &CsiDrivers, v: &PublishedVolume) -> Result<Option<VolumeUsage>, String> {
    let Some(driver) = drivers.get(&v.driver).filter(|d| d.capabilities.volume_stats) else {
        return Ok(None);
    };
    let channel = connect(&driver.endpoint).await.map_err(|e| e.to_string())?;
    let answer = NodeClient::new(channel)
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: v.handle.clone(),
            volume_path: v.target.display().to_string(),
            staging_target_path: v
                .staging
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        })
        .await
        .map_err(|s| format!("rpc error: code = {:?} desc = {}", s.code(), s.message()))?
        .into_inner();
    let mut usage = VolumeUsage {
        name: v.name.clone(),
        claim: v.claim.clone(),
        time_ns: i64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos()).unwrap_or(0),
        ..Default::default()
    };
    let n = |x: i64| u64::try_from(x).unwrap_or(0);
    for u in &answer.usage {
        match csi::volume_usage::Unit::try_from(u.unit) {
            Ok(csi::volume_usage::Unit::Bytes) => {
                usage.capacity_bytes = n(u.total);
                usage.used_bytes = n(u.used);
                usage.available_bytes = n(u.available);
            }
            Ok(csi::volume_usage::Unit::Inodes) => {
                usage.inodes = Some((n(u.total), n(u.available), n(u.used)))
            }
            _ => {}
        }
    }
    Ok(Some(usage))
}

/// A gauge family: its name's suffix, its help and its value for a volume (`None`: not reported).
type Family = (&'static str, &'static str, fn(&VolumeUsage) -> Option<u64>);

/// The `kubelet_volume_stats_*` gauges (Prometheus text) of the claims' volumes in `usages`.
pub fn metrics_text(usages: &[VolumeUsage]) -> String {
    use std::fmt::Write as _;
    let claims: Vec<(&VolumeUsage, &(String, String))> = usages
        .iter()
        .filter_map(|u| Some((u, u.claim.as_ref()?)))
        .collect();
    let mut out = String::new();
    let families: [Family; 6] = [
        ("capacity_bytes", "Capacity in bytes of the volume", |u| {
            Some(u.capacity_bytes)
        }),
        (
            "available_bytes",
            "Number of available bytes in the volume",
            |u| Some(u.available_bytes),
        ),
        ("used_bytes", "Number of used bytes in the volume", |u| {
            Some(u.used_bytes)
        }),
        ("inodes", "Maximum number of inodes in the volume", |u| {
            u.inodes.map(|i| i.0)
        }),
        ("inodes_free", "Number of free inodes in the volume", |u| {
            u.inodes.map(|i| i.1)
        }),
        ("inodes_used", "Number of used inodes in the volume", |u| {
            u.inodes.map(|i| i.2)
        }),
    ];
    if claims.is_empty() {
        return out;
    }
    for (suffix, help, value) in families {
        let name = format!("kubelet_volume_stats_{suffix}");
        let _ = writeln!(out, "# HELP {name} [ALPHA] {help}\n# TYPE {name} gauge");
        for (u, (namespace, claim)) in &claims {
            if let Some(v) = value(u) {
                let _ = writeln!(
                    out,
                    "{name}{{namespace=\"{namespace}\",persistentvolumeclaim=\"{claim}\"}} {v}"
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_name_the_claims_volumes_only() {
        let usages = [
            VolumeUsage {
                name: "data".into(),
                claim: Some(("ns".into(), "claim-1".into())),
                capacity_bytes: 100,
                used_bytes: 10,
                available_bytes: 90,
                ..Default::default()
            },
            VolumeUsage {
                name: "inline".into(),
                capacity_bytes: 5,
                ..Default::default()
            },
        ];
        let text = metrics_text(&usages);
        assert!(text.contains(
            "# HELP kubelet_volume_stats_capacity_bytes [ALPHA] Capacity in bytes of the volume\n\
             # TYPE kubelet_volume_stats_capacity_bytes gauge\n\
             kubelet_volume_stats_capacity_bytes{namespace=\"ns\",persistentvolumeclaim=\"claim-1\"} 100\n"
        ));
        assert!(text.contains(
            "kubelet_volume_stats_available_bytes{namespace=\"ns\",persistentvolumeclaim=\"claim-1\"} 90\n"
        ));
        assert!(
            !text.contains("kubelet_volume_stats_inodes{"),
            "no inode figures reported: {text}"
        );
        assert_eq!(
            text.matches("} 5\n").count(),
            0,
            "the inline volume has no claim: {text}"
        );
        assert_eq!(metrics_text(&usages[1..]), "");
    }
}
