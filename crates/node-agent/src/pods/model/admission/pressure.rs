//! Admission under node pressure, as the kubelet's eviction admit handler decides it (`Evicted`).

/// The status reason of a pod refused under node pressure, and of an evicted pod.
pub const EVICTED: &str = "Evicted";

/// Pod admission under pressure, as the kubelet's eviction admit handler: with no pressure, or for a
/// critical pod, `Ok`; with memory pressure alone, every pod but a BestEffort one that does not tolerate the
/// `node.kubernetes.io/memory-pressure` taint; with any other pressure, none. `Err` carries the message
/// (reason [`EVICTED`]).
pub fn admit_under_pressure(
    pressure: crate::node::Pressure,
    critical: bool,
    best_effort: bool,
    tolerates_memory_pressure: bool,
) -> Result<(), String> {
    let mut conditions = Vec::new();
    if pressure.memory {
        conditions.push("MemoryPressure");
    }
    if pressure.disk {
        conditions.push("DiskPressure");
    }
    if pressure.pid {
        conditions.push("PIDPressure");
    }
    if conditions.is_empty() || critical {
        return Ok(());
    }
    if conditions == ["MemoryPressure"] && (!best_effort || tolerates_memory_pressure) {
        return Ok(());
    }
    Err(format!("The node had condition: [{}]. ", conditions.join(" ")))
}
