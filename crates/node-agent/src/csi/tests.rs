//! Versions and capabilities as the kubelet reads them, and a driver's `CSINode` entry.

use std::collections::BTreeMap;

use super::node_info::{DriverNodeInfo, driver_entry};
use super::*;

#[test]
fn the_highest_version_of_major_one_or_below_is_taken() {
    let v =
        |list: &[&str]| Version::highest_supported(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(v(&["1.0.0"]), Ok(Version(1, 0, 0)));
    assert_eq!(v(&["0.3.0", "v1.2", "1.10.1"]), Ok(Version(1, 10, 1)));
    assert_eq!(v(&["2.0.0", "1.1.0"]), Ok(Version(1, 1, 0)));
    assert_eq!(
        v(&["2.0.0", "banana"]),
        Err(r#"none of the versions specified ["2.0.0", "banana"] are supported"#.into())
    );
    assert_eq!(
        v(&[]),
        Err("the plugin returned an empty list for supported versions".into())
    );
}

#[test]
fn capabilities_are_read_from_the_rpc_types() {
    use v1::node_service_capability::rpc::Type;
    let cap = |t: Type| v1::NodeServiceCapability {
        r#type: Some(v1::node_service_capability::Type::Rpc(
            v1::node_service_capability::Rpc { r#type: t as i32 },
        )),
    };
    let caps = NodeCapabilities::of(&v1::NodeGetCapabilitiesResponse {
        capabilities: vec![cap(Type::StageUnstageVolume), cap(Type::GetVolumeStats)],
    });
    assert_eq!(
        caps,
        NodeCapabilities {
            stage_unstage: true,
            volume_stats: true,
            ..Default::default()
        }
    );
}

#[test]
fn the_csi_node_entry_has_sorted_topology_keys_and_a_capped_count() {
    let info = DriverNodeInfo {
        driver: "csi.example.com".into(),
        node_id: "node-7".into(),
        max_volumes: 1 << 40,
        topology: BTreeMap::from([
            ("zone".to_owned(), "b".to_owned()),
            ("rack".to_owned(), "4".to_owned()),
        ]),
    };
    let entry = driver_entry(&info);
    assert_eq!(entry.topology_keys, Some(vec!["rack".into(), "zone".into()]));
    assert_eq!(entry.allocatable.and_then(|a| a.count), Some(i32::MAX));
    let plain = driver_entry(&DriverNodeInfo {
        max_volumes: 0,
        topology: BTreeMap::new(),
        ..info
    });
    assert_eq!((plain.topology_keys, plain.allocatable), (None, None));
}
