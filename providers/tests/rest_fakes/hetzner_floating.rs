//! The Hetzner Cloud adapter's floating IPs against the fake: the movable address of a highly
//! available Tunnel, moved between two running servers that keep their own addresses; the
//! refusals the API documents (a missing server, a locked IP, a failed action); releases and
//! the listing the orphan sweep reads; a floating IP per pool member on one shared server.

use std::time::Duration;

use providers::hosts::{
    HostProvider, Spread, TAG_CLUSTER, TAG_POOL_MEMBER, TAG_TUNNEL_SLOT, TAG_TUNNEL_UID, TagSyntax,
};
use providers::{AddressRequest, ErrorClass, HostError, HostRequest};
use serde_json::Value;

use crate::contract::{self, UID, request};
use crate::fake_server::{Fake, Kind};
use crate::{POLLS_UNTIL_RUNNING, TOKEN, hz_provider};

/// A server of slot `slot` of the pair, as the controller asks for it.
fn slot(slot: &str) -> HostRequest {
    let mut r = request(&format!("skyport-pair-{slot}"), UID);
    r.tags.insert(TAG_TUNNEL_SLOT.into(), slot.into());
    r
}

fn movable() -> AddressRequest {
    let mut tags = request("x", UID).tags;
    tags.insert(TAG_CLUSTER.into(), "cluster-1".into());
    AddressRequest { name: "skyport-team-a-web-tunnel".into(), region: None, tags, host_id: None, movable: true }
}

fn posts(fake: &Fake, path: &str) -> usize {
    fake.state().requests.iter().filter(|(m, p, _)| m == "POST" && p == path).count()
}

#[tokio::test]
async fn hetzner_moves_a_floating_ip_between_running_servers_each_keeping_its_own_address() {
    let (fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 50);
    assert_eq!(
        provider.capabilities().may_move_addresses(provider.name()),
        Ok(()),
        "a highly available Tunnel may run here"
    );
    assert!(provider.capabilities().binds_moved_address(), "and its servers must carry the address themselves");

    let address = provider.reserve_address(&movable()).await.unwrap();
    assert!(address.id.starts_with("floating-"), "{address:?}");
    assert_eq!((address.host_id.as_deref(), address.tags[TAG_TUNNEL_UID].as_str()), (None, UID));
    assert_eq!(posts(&fake, "/v1/primary_ips"), 0, "a movable address is no primary IP");
    let body = fake.state().create_bodies.last().cloned().unwrap();
    assert_eq!(body["type"], "ipv4");
    assert_eq!(body["home_location"], providers::hetzner::DEFAULT_LOCATION);
    assert!(body.get("server").is_none(), "home_location and server are mutually exclusive");
    assert_eq!(body["labels"][TAG_TUNNEL_UID], UID);
    assert!(body["name"].as_str().unwrap().starts_with("skyport-team-a-web-tunnel-"), "unique per Tunnel: {body}");

    let expect = contract::Expect::booting_cloud(POLLS_UNTIL_RUNNING + 2);
    let a = contract::running(&provider, &slot("a"), &expect).await;
    let b = contract::running(&provider, &slot("b"), &expect).await;
    // A pair's servers never take a primary IP of the Tunnel's at creation.
    for body in fake.state().create_bodies.iter().filter(|b| b.get("server_type").is_some()) {
        assert!(body.get("public_net").is_none(), "{body}");
    }
    // Moved while both run, back and forth as failovers do, each move done when assign returns
    // (the fake applies an assign only when its action finishes, and refuses another meanwhile).
    for to in [&a, &b, &a, &b] {
        provider.assign_address(&address.id, &to.id).await.unwrap();
        let got = provider.get_address(&address.id).await.unwrap().expect("still reserved");
        assert_eq!(got.host_id.as_deref(), Some(to.id.as_str()));
        assert_eq!(got.ip, address.ip);
    }
    assert_eq!(posts(&fake, &format!("/v1/floating_ips/{}/actions/assign", &address.id["floating-".len()..])), 4);
    provider.assign_address(&address.id, &b.id).await.expect("already there is success");
    assert_eq!(provider.limiter().counters.snapshot()["AssignFloatingIp"], 4, "no fifth assign was sent");
    // Each server keeps its own primary IP, which its client dials.
    for host in [&a, &b] {
        let now = provider.get(&host.id).await.unwrap().unwrap();
        assert_eq!(now.public_ipv4, host.public_ipv4);
        assert_ne!(now.public_ipv4.as_deref(), Some(address.ip.as_str()));
    }
}

#[tokio::test]
async fn hetzner_refuses_what_the_api_refuses_on_a_floating_ip() {
    let (fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 50);
    let address = provider.reserve_address(&movable()).await.unwrap();
    let expect = contract::Expect::booting_cloud(POLLS_UNTIL_RUNNING + 2);
    let a = contract::running(&provider, &slot("a"), &expect).await;

    let gone = provider.assign_address(&address.id, "999999").await.unwrap_err();
    assert!(matches!(gone, HostError::NotFound { .. }), "a server that does not exist: {gone:?}");
    let missing = provider.assign_address("floating-999999", &a.id).await.unwrap_err();
    assert!(matches!(missing, HostError::NotFound { .. }), "{missing:?}");
    for bad in ["floating-x", "floating-0", "floating-1/actions/unassign"] {
        let e = provider.assign_address(bad, &a.id).await.unwrap_err();
        assert!(matches!(e, HostError::Invalid { .. }), "{bad}: {e:?}");
    }
    assert_eq!(provider.get_address("floating-999999").await.unwrap(), None);

    // Another client's action on the IP: it is locked until that finishes, which is transient.
    let number: u64 = address.id["floating-".len()..].parse().unwrap();
    Fake::start_floating_action(&mut fake.state(), number, "unassign_floating_ip", None);
    let locked = provider.assign_address(&address.id, &a.id).await.unwrap_err();
    assert!(matches!(locked, HostError::Unavailable { .. }), "{locked:?}");
    assert_eq!(locked.class(), ErrorClass::Transient);
    assert!(locked.to_string().contains("locked"), "{locked}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    provider.assign_address(&address.id, &a.id).await.expect("once the other action finished");

    // An action that ends in error is reported, and the IP stays where it was.
    let b = contract::running(&provider, &slot("b"), &expect).await;
    fake.state().fail_next_action = true;
    let failed = provider.assign_address(&address.id, &b.id).await.unwrap_err();
    assert!(failed.to_string().contains("could not be routed"), "{failed}");
    assert_eq!(failed.class(), ErrorClass::Transient);
    assert_eq!(provider.get_address(&address.id).await.unwrap().unwrap().host_id.as_deref(), Some(a.id.as_str()));

    // Labels the API would refuse are refused by the fake too, not stored.
    let mut bad = movable();
    bad.name = "other".into();
    bad.tags.insert("skyport.dev/tunnel-name".into(), String::new());
    bad.tags.insert("bad key".into(), "v".into());
    let e = provider.reserve_address(&bad).await.unwrap_err();
    assert!(matches!(e, HostError::Invalid { .. }), "{e:?}");
}

#[tokio::test]
async fn hetzner_releases_floating_ips_assigned_or_not_and_lists_them_with_primary_ips() {
    let (fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 1);
    let single = AddressRequest { movable: false, ..movable() };
    let primary = provider.reserve_address(&single).await.unwrap();
    assert!(primary.id.parse::<u64>().is_ok(), "a single server's address stays a primary IP: {primary:?}");
    let floating = provider.reserve_address(&movable()).await.unwrap();
    let mut other = movable();
    other.name = "another".into();
    other.tags.insert(TAG_TUNNEL_UID.into(), "99999999-0000-0000-0000-000000000000".into());
    let theirs = provider.reserve_address(&other).await.unwrap();

    // What the Tunnel's lookups and the orphan sweep read: both kinds, every page, by label.
    let mut ids: Vec<String> =
        provider.list_addresses_by_tag(TAG_TUNNEL_UID, UID).await.unwrap().into_iter().map(|a| a.id).collect();
    ids.sort();
    assert_eq!(ids, [primary.id.clone(), floating.id.clone()]);
    assert_eq!(provider.list_addresses_by_tag(TAG_CLUSTER, "cluster-1").await.unwrap().len(), 3);
    let lists: Vec<String> = fake
        .state()
        .requests
        .iter()
        .filter(|(m, p, _)| m == "GET" && p == "/v1/floating_ips")
        .map(|r| r.2.clone())
        .collect();
    assert!(lists[0].contains(&format!("\"label_selector\": \"{TAG_TUNNEL_UID}=={UID}\"")), "{lists:?}");

    // Deleting an assigned floating IP unassigns it (API reference): one call, no unassign.
    let expect = contract::Expect::booting_cloud(POLLS_UNTIL_RUNNING + 2);
    let a = contract::running(&provider, &slot("a"), &expect).await;
    provider.assign_address(&floating.id, &a.id).await.unwrap();
    provider.release_address(&floating.id).await.unwrap();
    assert_eq!(provider.get_address(&floating.id).await.unwrap(), None);
    provider.release_address(&floating.id).await.expect("released twice is released");
    assert_eq!(provider.limiter().counters.snapshot().get("UnassignPrimaryIp"), None);
    assert!(fake.state().requests.iter().all(|(_, p, _)| !p.ends_with("/actions/unassign")));

    // A floating IP whose action runs is locked: a release then fails (and is retried).
    let number: u64 = theirs.id["floating-".len()..].parse().unwrap();
    Fake::start_floating_action(&mut fake.state(), number, "assign_floating_ip", Some(a.id.parse().unwrap()));
    let e = provider.release_address(&theirs.id).await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::Transient, "{e:?}");
    provider.release_address(&primary.id).await.unwrap();
    assert!(provider.list_addresses_by_tag(TAG_TUNNEL_UID, UID).await.unwrap().is_empty());
}

#[tokio::test]
async fn hetzner_reserves_a_floating_ip_onto_a_running_server_and_waits_for_it() {
    let (fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 50);
    let expect = contract::Expect::booting_cloud(POLLS_UNTIL_RUNNING + 2);
    let a = contract::running(&provider, &slot("a"), &expect).await;
    let onto = AddressRequest { host_id: Some(a.id.clone()), ..movable() };
    let address = provider.reserve_address(&onto).await.unwrap();
    assert_eq!(address.host_id.as_deref(), Some(a.id.as_str()));
    let body: Value = fake.state().create_bodies.last().cloned().unwrap();
    assert!(body.get("home_location").is_none(), "{body}");
    assert_eq!(provider.get_address(&address.id).await.unwrap().unwrap().host_id, Some(a.id.clone()));
    assert!(provider.limiter().counters.snapshot()["GetFloatingIpAction"] >= 1, "the assign action was waited for");
}

/// An ExitServerPool with an address per Service: one floating IP per member, each tagged for
/// its member, all assigned to the one shared server, which keeps its own address; one member's
/// release leaves the others on the server.
#[tokio::test]
async fn hetzner_carries_a_floating_ip_per_pool_member_on_one_server() {
    let (_fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 50);
    assert_eq!(provider.capabilities().pool_addresses.per_service(provider.name(), true), Ok(()));
    assert!(provider.capabilities().pool_addresses.assigned(), "reserved movable, assigned to the server");
    let expect = contract::Expect::booting_cloud(POLLS_UNTIL_RUNNING + 2);
    let server = contract::running(&provider, &request("skyport-pool-shared", UID), &expect).await;
    let mut members = Vec::new();
    for member in ["member-1", "member-2", "member-3"] {
        let mut r = movable();
        r.name = format!("skyport-pool-shared-{member}");
        r.tags.insert(TAG_POOL_MEMBER.into(), member.into());
        let address = provider.reserve_address(&r).await.unwrap();
        provider.assign_address(&address.id, &server.id).await.unwrap();
        members.push(address);
    }
    let on_server = |listed: Vec<providers::Address>| {
        let mut held: Vec<(String, String)> = listed
            .into_iter()
            .filter(|a| a.host_id.as_deref() == Some(server.id.as_str()))
            .map(|a| (a.tags[TAG_POOL_MEMBER].clone(), a.ip))
            .collect();
        held.sort();
        held
    };
    let listed = provider.list_addresses_by_tag(TAG_TUNNEL_UID, UID).await.unwrap();
    assert_eq!(on_server(listed).len(), 3, "every member's own address on the one server");
    let host = provider.get(&server.id).await.unwrap().unwrap();
    assert_eq!(host.public_ipv4, server.public_ipv4, "the server keeps its own address");
    assert!(members.iter().all(|a| Some(&a.ip) != host.public_ipv4.as_ref()));

    provider.release_address(&members[1].id).await.unwrap();
    let left = on_server(provider.list_addresses_by_tag(TAG_TUNNEL_UID, UID).await.unwrap());
    let expected: Vec<(String, String)> =
        [&members[0], &members[2]].iter().map(|a| (a.tags[TAG_POOL_MEMBER].clone(), a.ip.clone())).collect();
    assert_eq!(left, expected);
}

#[tokio::test]
async fn a_pairs_servers_share_one_spread_placement_group_that_goes_after_them() {
    let (fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 50);
    assert_eq!(provider.capabilities().spread, Spread::Group);
    let in_domain = |name: &str, domain: usize| HostRequest { failure_domain: Some(domain), ..slot(name) };
    let a = provider.create(&in_domain("a", 0)).await.unwrap();
    let b = provider.create(&in_domain("b", 1)).await.unwrap();
    let groups: Vec<u64> = fake.state().groups.keys().copied().collect();
    let [group] = groups[..] else { panic!("one group for the pair: {groups:?}") };
    let placed = Some(format!("placement group {group}"));
    for host in [&a, &b] {
        assert_eq!(host.placement, placed, "as created");
        assert_eq!(provider.get(&host.id).await.unwrap().unwrap().placement, placed, "as read back");
    }
    let (key, value) = TagSyntax::Hetzner.encode(TAG_TUNNEL_UID, UID);
    let labels = fake.state().groups[&group].labels.clone();
    assert_eq!(labels.get(&key), Some(&value), "found by the Tunnel's label: {labels:?}");
    assert!(!labels.contains_key(&TagSyntax::Hetzner.encode(TAG_TUNNEL_SLOT, "a").0), "the Tunnel's, not a slot's");
    // A single server goes into none.
    let single = provider.create(&request("skyport-single", "another-uid")).await.unwrap();
    assert_eq!((single.placement, fake.state().groups.len()), (None, 1));

    // Not while a server is in it; a replacement joins the same one.
    let e = provider.delete_placement(UID).await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::Transient, "{e}");
    provider.delete(&a.id).await.unwrap();
    let again = provider.create(&in_domain("a", 0)).await.unwrap();
    assert_eq!((again.placement, fake.state().groups.len()), (placed, 1));
    for id in [&again.id, &b.id] {
        provider.delete(id).await.unwrap();
    }
    provider.delete_placement(UID).await.unwrap();
    assert!(fake.state().groups.is_empty());
    provider.delete_placement(UID).await.unwrap();
}

/// A server asked for in a failure domain is one of a pair, whatever its tags say: it keeps its
/// own address, as it joins the placement group, even when the request names a primary IP.
#[tokio::test]
async fn a_server_asked_for_in_a_failure_domain_takes_no_primary_ip() {
    let (fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 50);
    let primary = provider.reserve_address(&AddressRequest { movable: false, ..movable() }).await.unwrap();
    let asked = HostRequest { failure_domain: Some(0), address: Some(primary.id.clone()), ..request("skyport-p", UID) };
    let host = provider.create(&asked).await.unwrap();
    let body = fake.state().create_bodies.iter().rfind(|b| b.get("server_type").is_some()).cloned().unwrap();
    assert!(body.get("public_net").is_none(), "{body}");
    assert!(body.get("placement_group").is_some(), "{body}");
    assert_eq!(provider.get_address(&primary.id).await.unwrap().unwrap().host_id, None);
    provider.delete(&host.id).await.unwrap();
}
