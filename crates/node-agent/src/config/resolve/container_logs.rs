//! Container log rotation: the largest log file, how many files are kept, how many workers rotate them and how
//! often they look.

use std::time::Duration;

use crate::config::check::Check;
use crate::config::file::FileConfig;
use crate::quantity::Quantity;

/// The container log rotation settings, resolved.
pub(super) struct ContainerLogs {
    pub(super) max_size: Quantity,
    pub(super) max_files: u32,
    pub(super) max_workers: u32,
    pub(super) monitor_interval: Duration,
}

/// `containerLogMaxSize`, `containerLogMaxFiles`, `containerLogMaxWorkers`, `containerLogMonitorInterval`, checked
/// as the kubelet checks them: the size a whole number of bytes (negative turns rotation off), at least 2 files,
/// at least 1 worker, an interval of at least 3 s.
pub(super) fn container_log_rotation(c: &mut Check, f: &FileConfig) -> ContainerLogs {
    let max_size = match f
        .container_log_max_size
        .as_deref()
        .unwrap_or("10Mi")
        .parse::<Quantity>()
    {
        Ok(q) if q.milli() % 1000 == 0 && i64::try_from(q.value()).is_ok() => q,
        Ok(q) => {
            c.err(
                "containerLogMaxSize",
                format!("{q} is not a whole number of bytes"),
            );
            Quantity::zero()
        }
        Err(e) => {
            c.err("containerLogMaxSize", e.to_string());
            Quantity::zero()
        }
    };
    let max_files = c.non_negative("containerLogMaxFiles", f.container_log_max_files, 5);
    if max_files < 2 {
        c.err(
            "containerLogMaxFiles",
            format!("{max_files} must be greater than 1"),
        );
    }
    let max_workers = c.non_negative("containerLogMaxWorkers", f.container_log_max_workers, 1);
    if max_workers < 1 {
        c.err("containerLogMaxWorkers", "must be greater than or equal to 1");
    }
    let monitor_interval = f
        .container_log_monitor_interval
        .unwrap_or(Duration::from_secs(10));
    if monitor_interval < Duration::from_secs(3) {
        c.err(
            "containerLogMonitorInterval",
            format!("{monitor_interval:?} must be at least 3s"),
        );
    }
    ContainerLogs {
        max_size,
        max_files,
        max_workers,
        monitor_interval,
    }
}
