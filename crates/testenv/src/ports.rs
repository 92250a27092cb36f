//! Free loopback ports for a control plane's components, picked so that test binaries starting control planes
//! side by side do not take each other's, and how a component's start that lost its port anyway is recognised.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// A port that is free now, picked below the kernel's ephemeral range: a port the kernel hands out (bind to 0)
/// is also what it hands to outgoing connections, so a component could lose it before it binds. Each pick is
/// a random port of that range, not the next one up: test binaries start control planes side by side, and
/// processes walking the range upwards from nearby offsets would keep picking the same ports as each other.
/// One process never hands out a port twice.
pub(crate) fn free_port() -> anyhow::Result<u16> {
    static PICKS: AtomicU32 = AtomicU32::new(0);
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next().and_then(|l| l.parse::<u32>().ok()))
        .unwrap_or(32768);
    const FIRST: u32 = 10_000;
    if low <= FIRST + 1000 {
        return Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port());
    }
    let span = low - FIRST;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut state = nanos
        ^ std::process::id().wrapping_mul(0x9E37_79B9)
        ^ PICKS.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x85EB_CA6B)
        | 1;
    for _ in 0..256 {
        // xorshift: spread over the range, different in every process and every pick
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let port = u16::try_from(FIRST + state % span)?;
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
        if !handed_out.contains(&port) && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            handed_out.insert(port);
            return Ok(port);
        }
    }
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

/// Whether a start failed because a port was taken between picking and binding.
pub(crate) fn port_conflict(e: &anyhow::Error) -> bool {
    let text = format!("{e:#}");
    text.contains("address already in use") || text.contains("bind: address")
}

#[cfg(test)]
#[path = "ports_tests.rs"]
mod tests;
