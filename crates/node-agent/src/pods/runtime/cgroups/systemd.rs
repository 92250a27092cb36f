//! The systemd cgroup driver's side of systemd: slice units started, changed and stopped over D-Bus
//! (`org.freedesktop.systemd1.Manager` on the system bus), as the kubelet's systemd cgroup manager asks for
//! them, and the naming that maps the kubelet's cgroup names onto slices.
//!
//! A cgroup name `/kubepods/burstable/pod<uid>` becomes the slice `kubepods-burstable-pod<uid>.slice`, each
//! component's `-` escaped to `_` (so the name maps back), and lives at the path systemd gives it,
//! `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice` ([`expand`]). A slice is started
//! as a transient unit whose parent is named by `Wants=`, with default dependencies off and CPU, memory, IO and
//! tasks accounting on (which makes systemd enable those controllers down to it), and its limits as unit
//! properties ([`limit_properties`]).

use std::path::Path;
use std::time::Duration;

use zbus::zvariant::Value;

const DESTINATION: &str = "org.freedesktop.systemd1";
const PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";

/// Whether this machine runs systemd as its init, as systemd itself tells (`sd_booted`: the directory
/// `/run/systemd/system` exists).
pub fn booted() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// The cgroup path systemd gives the slice of cgroup name `name` (`/`-separated components): each level a slice
/// named by the components down to it joined with `-`, each component's own `-` written `_`. `/` stays `/`.
pub fn expand(name: &str) -> String {
    let parts: Vec<String> = name
        .split('/')
        .filter(|p| !p.is_empty())
        .map(|p| p.replace('-', "_"))
        .collect();
    if parts.is_empty() {
        return "/".to_owned();
    }
    let mut out = String::new();
    for i in 1..=parts.len() {
        out.push('/');
        out.push_str(&parts[..i].join("-"));
        out.push_str(".slice");
    }
    out
}

/// The cgroup name of the slice at `path` (`/system.slice`, `/a.slice/a-b.slice`), as the kubelet reads a slice
/// path: from its last component, split at `-`, each part's `_` back to `-`. [`expand`] maps it back.
pub fn cgroup_name(path: &str) -> String {
    let base = path.rsplit('/').find(|p| !p.is_empty()).unwrap_or("");
    let stem = base.strip_suffix(".slice").unwrap_or(base);
    if stem.is_empty() || stem == "-" {
        return "/".to_owned();
    }
    stem.split('-')
        .map(|p| format!("/{}", p.replace('_', "-")))
        .collect()
}

/// The slice unit of an expanded path (its last component), and its parent slice (`-.slice` for a top-level
/// one).
pub fn unit_and_parent(expanded: &str) -> (String, String) {
    let mut parts = expanded.rsplit('/').filter(|p| !p.is_empty());
    let unit = parts.next().unwrap_or("-.slice").to_owned();
    let parent = parts.next().unwrap_or("-.slice").to_owned();
    (unit, parent)
}

/// The pod UID in a pod slice's name (`kubepods-burstable-pod<uid>.slice`, the UID's `-` written `_`).
pub fn pod_uid(slice: &str) -> Option<String> {
    let stem = slice.strip_suffix(".slice")?;
    let last = stem.rsplit('-').next()?;
    Some(last.strip_prefix("pod")?.replace('_', "-"))
}

/// The properties standing for the cgroup settings `(file, value)` (the v1 file names, as
/// [`super::pod_settings`] gives them), on the unified hierarchy when `v2`: `CPUWeight` (`CPUShares` on v1),
/// `CPUQuotaPerSecUSec` with `CPUQuotaPeriodUSec`, `MemoryMax` (`MemoryLimit` on v1), `TasksMax`.
pub fn limit_properties(settings: &[(&str, String)], v2: bool) -> Vec<(&'static str, u64)> {
    let mut out = Vec::new();
    let period = settings
        .iter()
        .find(|(f, _)| *f == "cpu.cfs_period_us")
        .and_then(|(_, v)| v.parse::<u64>().ok())
        .unwrap_or(100_000);
    for (file, value) in settings {
        let Ok(n) = value.parse::<i64>() else {
            continue;
        };
        let n = u64::try_from(n).unwrap_or(0);
        match *file {
            "cpu.shares" if v2 => out.push(("CPUWeight", super::weight(n as i64) as u64)),
            "cpu.shares" => out.push(("CPUShares", n)),
            "cpu.cfs_quota_us" => {
                // systemd keeps the quota per second in steps of 10 ms: rounded up, as runc does
                let mut per_sec = n * 1_000_000 / period.max(1);
                if per_sec % 10_000 != 0 {
                    per_sec = (per_sec / 10_000 + 1) * 10_000;
                }
                out.push(("CPUQuotaPerSecUSec", per_sec));
                out.push(("CPUQuotaPeriodUSec", period));
            }
            "memory.limit_in_bytes" if v2 => out.push(("MemoryMax", n)),
            "memory.limit_in_bytes" => out.push(("MemoryLimit", n)),
            "pids.max" => out.push(("TasksMax", n)),
            _ => {}
        }
    }
    out
}

/// Why systemd did not do what was asked.
#[derive(Debug, thiserror::Error)]
#[error("systemd: {what}: {source}")]
pub struct SystemdError {
    what: String,
    #[source]
    source: Box<zbus::Error>,
}

/// A connection to systemd's manager on the system bus.
#[derive(Debug, Clone)]
pub struct Systemd {
    conn: zbus::Connection,
}

impl Systemd {
    /// Connects to the system bus.
    pub async fn connect() -> Result<Self, SystemdError> {
        let conn = zbus::Connection::system().await.map_err(|source| SystemdError {
            what: "connecting to the system bus".to_owned(),
            source: Box::new(source),
        })?;
        Ok(Self { conn })
    }

    async fn call<B>(&self, method: &str, what: String, body: &B) -> Result<(), SystemdError>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        self.conn
            .call_method(Some(DESTINATION), PATH, Some(MANAGER), method, body)
            .await
            .map(drop)
            .map_err(|source| SystemdError {
                what,
                source: Box::new(source),
            })
    }

    /// Starts the transient slice `unit` under `parent` with `limits` (or, when it exists already, sets its
    /// limits), and waits a little for its cgroup directory `dir`.
    pub async fn start_slice(
        &self,
        unit: &str,
        parent: &str,
        limits: &[(&'static str, u64)],
        dir: &Path,
    ) -> Result<(), SystemdError> {
        let description = format!("libcontainer container {unit}");
        let mut props: Vec<(&str, Value<'_>)> = vec![
            ("Description", Value::from(description.as_str())),
            ("Wants", Value::from(vec![parent])),
            ("MemoryAccounting", Value::from(true)),
            ("CPUAccounting", Value::from(true)),
            ("IOAccounting", Value::from(true)),
            ("TasksAccounting", Value::from(true)),
            ("DefaultDependencies", Value::from(false)),
        ];
        props.extend(limits.iter().map(|(k, v)| (*k, Value::from(*v))));
        let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
        let started = self
            .call(
                "StartTransientUnit",
                format!("starting {unit}"),
                &(unit, "replace", props, aux),
            )
            .await;
        match started {
            Ok(()) => {}
            Err(e) if is(&e.source, "org.freedesktop.systemd1.UnitExists") => {
                return self.set_limits(unit, limits).await;
            }
            Err(e) => return Err(e),
        }
        // the job runs after the call returns: the slice's cgroup appears once it is active (the caller makes
        // the directory itself when it is not there by then, as runc does)
        for _ in 0..40 {
            if dir.is_dir() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Sets `limits` on the running unit `unit` (for as long as it runs).
    pub async fn set_limits(&self, unit: &str, limits: &[(&'static str, u64)]) -> Result<(), SystemdError> {
        if limits.is_empty() {
            return Ok(());
        }
        let props: Vec<(&str, Value<'_>)> = limits.iter().map(|(k, v)| (*k, Value::from(*v))).collect();
        self.call(
            "SetUnitProperties",
            format!("setting {unit}'s limits"),
            &(unit, true, props),
        )
        .await
    }

    /// Stops `unit` (its cgroup goes with it once empty); a unit systemd does not know is already gone.
    pub async fn stop(&self, unit: &str) -> Result<(), SystemdError> {
        match self
            .call("StopUnit", format!("stopping {unit}"), &(unit, "replace"))
            .await
        {
            Err(e) if is(&e.source, "org.freedesktop.systemd1.NoSuchUnit") => Ok(()),
            other => {
                // a failed unit would keep its name taken
                let _ = self.call("ResetFailedUnit", String::new(), &(unit,)).await;
                other
            }
        }
    }
}

fn is(error: &zbus::Error, name: &str) -> bool {
    matches!(error, zbus::Error::MethodError(n, _, _) if n.as_str() == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_names_become_the_kubelets_slices() {
        let uid = "5d1c-4e2f";
        let path = expand(&format!("/kubepods/burstable/pod{uid}"));
        assert_eq!(
            path,
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5d1c_4e2f.slice"
        );
        assert_eq!(
            unit_and_parent(&path),
            (
                "kubepods-burstable-pod5d1c_4e2f.slice".to_owned(),
                "kubepods-burstable.slice".to_owned()
            )
        );
        assert_eq!(
            unit_and_parent(&expand("/kubepods")),
            ("kubepods.slice".to_owned(), "-.slice".to_owned())
        );
        assert_eq!(expand("/"), "/");
        assert_eq!(
            pod_uid("kubepods-burstable-pod5d1c_4e2f.slice").as_deref(),
            Some(uid)
        );
        assert_eq!(pod_uid("kubepods-pod5d1c_4e2f.slice").as_deref(), Some(uid));
        assert_eq!(pod_uid("kubepods-besteffort.slice"), None);
        assert_eq!(cgroup_name("/system.slice"), "/system");
        assert_eq!(
            cgroup_name("/kube.slice/kube-node_agent.slice"),
            "/kube/node-agent"
        );
        assert_eq!(
            expand(&cgroup_name("/kube.slice/kube-node_agent.slice")),
            "/kube.slice/kube-node_agent.slice"
        );
    }

    #[test]
    fn settings_become_unit_properties() {
        let settings = [
            ("cpu.shares", "512".to_owned()),
            ("cpu.cfs_period_us", "100000".to_owned()),
            ("cpu.cfs_quota_us", "25500".to_owned()),
            ("memory.limit_in_bytes", "67108864".to_owned()),
            ("pids.max", "1024".to_owned()),
        ];
        assert_eq!(
            limit_properties(&settings, true),
            [
                ("CPUWeight", 20),
                // 255 ms a second, rounded up to systemd's 10 ms steps
                ("CPUQuotaPerSecUSec", 260_000),
                ("CPUQuotaPeriodUSec", 100_000),
                ("MemoryMax", 67_108_864),
                ("TasksMax", 1024),
            ]
        );
        assert_eq!(limit_properties(&settings[..1], false), [("CPUShares", 512)]);
    }
}
