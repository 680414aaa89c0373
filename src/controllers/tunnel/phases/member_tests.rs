use super::{own_address, route};
use crate::crd::tunnel::MemberAddress;
use crate::crd::tunnel::{
    HighAvailability, HighAvailabilityMode, HighAvailabilityStatus, ServerStatus, Tunnel, TunnelStatus,
};

fn carrier(mode: Option<HighAvailabilityMode>, status: TunnelStatus) -> Tunnel {
    let mut t: Tunnel = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pool-shared", "namespace": "skyport-system"},
        "spec": {"pool": {"name": "shared"}},
    }))
    .unwrap();
    t.spec.high_availability = mode.map(|mode| HighAvailability { mode });
    t.status = Some(status);
    t
}

fn pair(active: Option<&str>) -> TunnelStatus {
    let server = |slot: &str, ip: &str| ServerStatus {
        slot: slot.into(),
        host_id: Some(format!("h-{slot}")),
        host_ip: Some(ip.into()),
        ..Default::default()
    };
    TunnelStatus {
        address_ip: active.map(Into::into),
        high_availability: Some(HighAvailabilityStatus {
            servers: vec![server("a", "192.0.2.1"), server("b", "192.0.2.2")],
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn a_single_server_is_dialed_at_its_own_address_and_published_at_the_shared_one() {
    let plain = TunnelStatus { host_ip: Some("192.0.2.1".into()), ..Default::default() };
    let single = route(&carrier(None, plain), None).unwrap();
    assert_eq!((single.dials, single.published), (vec![(None, "192.0.2.1".into())], vec!["192.0.2.1".into()]));

    let reserved = TunnelStatus {
        host_ip: Some("192.0.2.1".into()),
        address_ip: Some("198.51.100.7".into()),
        ..Default::default()
    };
    let kept = route(&carrier(None, reserved), None).unwrap();
    assert_eq!((kept.dials, kept.published), (vec![(None, "192.0.2.1".into())], vec!["198.51.100.7".into()]));
    assert!(route(&carrier(None, TunnelStatus::default()), None).is_none(), "no server yet");
}

#[test]
fn a_pair_gets_a_client_per_server_and_publishes_as_its_mode_says() {
    let standby = route(&carrier(Some(HighAvailabilityMode::ActiveStandby), pair(Some("198.51.100.7"))), None).unwrap();
    let dials = vec![(Some("a"), "192.0.2.1".to_string()), (Some("b"), "192.0.2.2".to_string())];
    assert_eq!((standby.dials.clone(), standby.published), (dials.clone(), vec!["198.51.100.7".to_string()]));
    let both = route(&carrier(Some(HighAvailabilityMode::BothAddresses), pair(None)), None).unwrap();
    assert_eq!((both.dials, both.published), (dials, vec!["192.0.2.1".to_string(), "192.0.2.2".to_string()]));
    // Before the reserved address is on a server, an ActiveStandby pair publishes nothing.
    assert!(route(&carrier(Some(HighAvailabilityMode::ActiveStandby), pair(None)), None).is_none());
}

/// With an address each, a member dials the shared server's own address and is published at its
/// own address alone: never the server's, nor another member's.
#[test]
fn a_per_service_member_is_published_at_its_own_address_only() {
    let own = |uid: &str, ip: &str| MemberAddress { uid: uid.into(), id: ip.into(), ip: ip.into() };
    let status = TunnelStatus {
        host_ip: Some("192.0.2.1".into()),
        member_addresses: vec![own("u1", "198.51.100.1"), own("u2", "198.51.100.2")],
        ..Default::default()
    };
    let carrier = carrier(None, status);
    assert_eq!(own_address(&carrier, "u2").as_deref(), Some("198.51.100.2"));
    assert_eq!(own_address(&carrier, "u3"), None, "none reserved for it yet");
    let r = route(&carrier, own_address(&carrier, "u2")).unwrap();
    assert_eq!((r.dials, r.published), (vec![(None, "192.0.2.1".into())], vec!["198.51.100.2".into()]));
}

/// On an ActiveStandby pair, a member with an address of its own has a client on each server and
/// is published at its own address, which follows the pool's reserved one to the active server;
/// until that is on a server, it is published nowhere.
#[test]
fn a_per_service_member_of_a_pair_dials_both_servers_and_is_published_at_its_own_address() {
    let mode = Some(HighAvailabilityMode::ActiveStandby);
    let mut status = pair(Some("198.51.100.7"));
    status.member_addresses = vec![MemberAddress { uid: "u1".into(), id: "a-1".into(), ip: "198.51.100.1".into() }];
    let carrier_of = |status: TunnelStatus| carrier(mode, status);
    let r = route(&carrier_of(status.clone()), own_address(&carrier_of(status.clone()), "u1")).unwrap();
    let dials = vec![(Some("a"), "192.0.2.1".to_string()), (Some("b"), "192.0.2.2".to_string())];
    assert_eq!((r.dials, r.published), (dials, vec!["198.51.100.1".to_string()]));
    status.address_ip = None;
    assert!(route(&carrier_of(status.clone()), own_address(&carrier_of(status), "u1")).is_none());
}
