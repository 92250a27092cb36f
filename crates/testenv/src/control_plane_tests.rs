use super::*;

#[test]
fn picked_ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
    let low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next().and_then(|l| l.parse().ok()))
        .unwrap_or(32768);
    let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
    let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
    assert_eq!(distinct.len(), ports.len(), "{ports:?}");
    for p in &ports {
        assert!(
            u32::from(*p) < low,
            "port {p} is in the ephemeral range from {low}"
        );
        TcpListener::bind((Ipv4Addr::LOCALHOST, *p)).unwrap();
    }
}

#[test]
fn bind_failures_are_recognised_as_port_conflicts() {
    let e = anyhow::anyhow!(
        "etcd exited (exit status: 1); log tail:\nlisten tcp 127.0.0.1:40809: bind: address already in use"
    );
    assert!(port_conflict(&e.context("starting")));
    assert!(!port_conflict(&anyhow::anyhow!(
        "kube-apiserver did not listen in time"
    )));
}
