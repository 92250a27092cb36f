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

#[test]
fn picked_ports_are_spread_over_the_range_not_walked_in_order() {
    // two processes walking upwards from nearby offsets picked the same ports again and again
    let ports: Vec<u16> = (0..40).map(|_| free_port().unwrap()).collect();
    let ascending_neighbours = ports
        .windows(2)
        .filter(|w| w[1] > w[0] && w[1] - w[0] < 16)
        .count();
    assert!(
        ascending_neighbours < 5,
        "picks walk the range in order: {ports:?}"
    );
    let (min, max) = (ports.iter().min().unwrap(), ports.iter().max().unwrap());
    assert!(max - min > 4000, "picks bunched in {min}..{max}: {ports:?}");
}
