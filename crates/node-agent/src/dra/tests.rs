use std::collections::BTreeMap;

use super::claims::{ClaimCache, ClaimInfo};
use super::grpc::Service;
use super::{ClaimRef, PreparedDevice};

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn the_newest_offered_service_is_chosen_and_unknown_ones_are_refused() {
    assert_eq!(
        Service::choose(&strings(&["v1beta1.DRAPlugin", "v1.DRAPlugin"])),
        Ok(Service::V1)
    );
    assert_eq!(
        Service::choose(&strings(&["v1beta1.DRAPlugin"])),
        Ok(Service::V1beta1)
    );
    let err = Service::choose(&strings(&["v1alpha4.Node"])).unwrap_err();
    assert!(
        err.starts_with("none of services supported by the plugin"),
        "{err}"
    );
    let err = Service::choose(&[]).unwrap_err();
    assert!(err.contains("empty list"), "{err}");
}

fn info() -> ClaimInfo {
    let device = |request: &[&str], cdi: &str| PreparedDevice {
        request_names: strings(request),
        pool: "node-1".into(),
        device: cdi.rsplit('=').next().unwrap_or_default().into(),
        cdi_ids: vec![cdi.to_owned()],
        share_id: None,
    };
    ClaimInfo {
        claim: ClaimRef {
            namespace: "ns".into(),
            name: "gpu".into(),
            uid: "u1".into(),
        },
        drivers: BTreeMap::from([(
            "example.com".to_owned(),
            vec![
                device(&["a"], "example.com/gpu=dev-0"),
                device(&["b"], "example.com/gpu=dev-1"),
                device(&[], "example.com/gpu=shared"),
            ],
        )]),
        prepared: true,
        pods: ["p1".to_owned()].into(),
    }
}

#[test]
fn a_request_gets_its_own_devices_and_those_of_every_request() {
    let info = info();
    let ids = |r| info.cdi_ids(r).collect::<Vec<_>>();
    assert_eq!(ids("a"), ["example.com/gpu=dev-0", "example.com/gpu=shared"]);
    assert_eq!(ids("b"), ["example.com/gpu=dev-1", "example.com/gpu=shared"]);
    assert_eq!(ids("").len(), 3);
}

#[test]
fn the_checkpoint_brings_back_prepared_claims() {
    let dir = tempfile::tempdir().unwrap();
    let mut cache = ClaimCache::load(dir.path()).unwrap();
    assert_eq!(cache.iter().count(), 0);
    cache.insert(info());
    cache.save().unwrap();
    let again = ClaimCache::load(dir.path()).unwrap();
    assert_eq!(again.get("ns", "gpu"), Some(&info()));
    assert!(again.used_by("p1"));
    assert!(!again.used_by("p2"));
}

#[test]
fn an_unreadable_checkpoint_is_an_error_not_an_empty_cache() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(super::claims::CHECKPOINT), b"{not json").unwrap();
    let err = ClaimCache::load(dir.path()).unwrap_err();
    assert!(err.to_string().contains("DRA checkpoint"), "{err}");
}
