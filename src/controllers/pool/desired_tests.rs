use std::collections::BTreeMap;

use providers::exit::userdata::{ExitServer, render_client_toml, render_server_toml};

use super::*;
use crate::tunnel::is_health_service;

const U1: &str = "6f1c2a4e-0b7d-4c55-9a3e-2d8f7e1b9c01";
const U2: &str = "0a9b8c7d-6e5f-4a3b-8c2d-1e0f9a8b7c6d";

fn tcp(port: i32) -> TunnelPort {
    TunnelPort { port, protocol: "TCP".into(), proxy_protocol: None }
}

fn admissions() -> BTreeMap<String, Admission> {
    BTreeMap::from([
        (U1.to_string(), Admission::Carried { ports: vec![tcp(80), tcp(443)], health_port: 40000, refused: None }),
        (U2.to_string(), Admission::Refused(super::super::admit::Refusal::NamespaceNotAllowed)),
    ])
}

#[test]
fn member_tokens_are_the_members_own_and_none_is_the_carriers() {
    let carrier = Credentials::generate();
    let (t1, t2) = (member_token(&carrier, U1), member_token(&carrier, U2));
    assert_eq!(t1, member_token(&carrier, U1), "derived again the same");
    assert_ne!(t1, t2);
    assert_ne!(t1, carrier.token);
    assert!(t1.len() == 64 && t1.chars().all(|c| c.is_ascii_hexdigit()));
    assert_ne!(t1, member_token(&Credentials::generate(), U1), "new carrier keys, new member tokens");
}

#[test]
fn the_shared_server_carries_each_carried_member_under_its_uid_with_its_own_health_service() {
    let carrier = Credentials::generate();
    let ranges = BTreeMap::from([(U1.to_string(), vec!["203.0.113.0/24".to_string()])]);
    let services = member_services(&carrier, &admissions(), &ranges, Binds::Shared);
    let names: Vec<&str> = services.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, [format!("{U1}.tcp-80"), format!("{U1}.tcp-443"), format!("{U1}.skyport-health")]);
    assert!(services.iter().all(|s| s.token == member_token(&carrier, U1)));
    assert_eq!(services.iter().map(|s| s.port).collect::<Vec<_>>(), [80, 443, 40000]);
    assert!(is_health_service(&services[2].name) && !is_health_service(&services[0].name));
    // The member's own source ranges on its own ports; the health check stays open to the operator.
    assert!(services[..2].iter().all(|s| s.source_ranges == ["203.0.113.0/24"]));
    assert!(services[2].source_ranges.is_empty());
    // rathole takes the names (at most 63 characters) and the file renders.
    let server = ExitServer { control_port: 2333, noise_private_key: carrier.keypair.private_key.clone(), services };
    render_server_toml(&server).unwrap();
}

/// With an address each, every service of a member (its health check's too) listens on its own
/// address only; a member without one yet is not on the server at all.
#[test]
fn a_per_service_member_listens_on_its_own_address_only() {
    let carrier = Credentials::generate();
    let mut members = admissions();
    members.insert(U2.into(), Admission::Carried { ports: vec![tcp(80)], health_port: 40001, refused: None });
    let own = BTreeMap::from([(U1.to_string(), "10.204.0.9".parse().unwrap())]);
    let services = member_services(&carrier, &members, &BTreeMap::new(), Binds::PerService(&own));
    assert_eq!(services.len(), 3, "U2 has no address yet: {services:?}");
    assert!(services.iter().all(|s| s.name.starts_with(U1) && s.bind == Some("10.204.0.9".parse().unwrap())));
    let shared = member_services(&carrier, &members, &BTreeMap::new(), Binds::Shared);
    assert!(shared.iter().all(|s| s.bind.is_none()) && shared.len() == 5);
    // Getting its address changes what the server must run.
    let none = BTreeMap::new();
    let before = server_digest("abc", &members, &none, Binds::PerService(&own));
    let both = BTreeMap::from([(U1.to_string(), own[U1]), (U2.to_string(), "10.204.0.10".parse().unwrap())]);
    assert_ne!(server_digest("abc", &members, &none, Binds::PerService(&both)), before);
    assert_eq!(
        server_digest("abc", &members, &none, Binds::Shared),
        server_digest("abc", &members, &none, Binds::Shared),
    );
}

#[test]
fn a_members_client_carries_its_own_services_to_its_cluster_ip_and_answers_its_health_check() {
    let carrier = Credentials::generate();
    let token = member_token(&carrier, U1);
    let ports = [tcp(80)];
    let client = member_client(&MemberClient {
        uid: U1,
        ports: &ports,
        health_port: 40003,
        token: &token,
        server_public_key: &carrier.keypair.public_key,
        remote_addr: "203.0.113.9:2333".into(),
        cluster_ip: "fd00::12",
    });
    assert_eq!(client.remote_addr, "203.0.113.9:2333");
    assert_eq!(client.services[0].name, format!("{U1}.tcp-80"));
    assert_eq!(client.services[0].local_addr, "[fd00::12]:80");
    assert!(is_health_service(&client.services[1].name));
    assert!(client.services.iter().all(|s| s.token == token));
    render_client_toml(&client).unwrap();
}

#[test]
fn only_a_health_service_name_reads_as_one() {
    assert!(is_health_service("skyport-health"));
    assert!(is_health_service("u.skyport-health"));
    assert!(!is_health_service("u-skyport-health"));
    assert!(!is_health_service("tcp-80"));
    assert!(!is_health_service("skyport-health.tcp-80"));
}

#[test]
fn the_servers_digest_follows_its_members_and_their_ranges_and_is_the_credentials_without_any() {
    let none = BTreeMap::new();
    assert_eq!(server_digest("abc", &BTreeMap::new(), &none, Binds::Shared), "abc");
    let carried = admissions();
    let with = server_digest("abc", &carried, &none, Binds::Shared);
    assert_ne!(with, "abc");
    let ranges = BTreeMap::from([(U1.to_string(), vec!["203.0.113.0/24".to_string()])]);
    assert_ne!(server_digest("abc", &carried, &ranges, Binds::Shared), with, "new ranges are pushed");
    // A refused member is not on the server: it changes nothing.
    let only_refused: BTreeMap<String, Admission> = carried.into_iter().filter(|(u, _)| u == U2).collect();
    assert_eq!(server_digest("abc", &only_refused, &none, Binds::Shared), "abc");
}
