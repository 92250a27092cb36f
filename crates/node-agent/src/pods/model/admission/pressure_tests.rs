//! Admission under pressure, as the kubelet's eviction admit handler decides.

use super::*;
use crate::node::Pressure;

#[test]
fn admission_under_pressure() {
    let none = Pressure::default();
    let memory = Pressure {
        memory: true,
        ..Default::default()
    };
    let disk = Pressure {
        disk: true,
        ..Default::default()
    };
    let both = Pressure {
        memory: true,
        disk: true,
        pid: false,
    };
    // (pressure, critical, best effort, tolerates memory pressure, admitted)
    let cases = [
        (none, false, true, false, Ok(())),
        (memory, false, false, false, Ok(())),
        (
            memory,
            false,
            true,
            false,
            Err("The node had condition: [MemoryPressure]. ".to_owned()),
        ),
        (memory, false, true, true, Ok(())),
        (memory, true, true, false, Ok(())),
        (
            disk,
            false,
            false,
            true,
            Err("The node had condition: [DiskPressure]. ".to_owned()),
        ),
        (disk, true, false, false, Ok(())),
        (
            both,
            false,
            false,
            true,
            Err("The node had condition: [MemoryPressure DiskPressure]. ".to_owned()),
        ),
    ];
    for (pressure, critical, best_effort, tolerates, want) in cases {
        assert_eq!(
            admit_under_pressure(pressure, critical, best_effort, tolerates),
            want,
            "{pressure:?} critical={critical} best_effort={best_effort} tolerates={tolerates}"
        );
    }
}
