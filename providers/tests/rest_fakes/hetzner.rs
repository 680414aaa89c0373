//! The Hetzner Cloud adapter against its fake: the host and reserved-address contracts (primary
//! IPs), token hygiene, error mapping, 429s without Retry-After, pagination, unique server names.

use std::time::{Duration, Instant};

use providers::hosts::{HostProvider, MANAGED_BY_VALUE, TAG_MANAGED_BY, TAG_TUNNEL_UID};
use providers::{ErrorClass, HostError};
use serde_json::{Value, json};

use crate::contract::{self, UID, request, user_data};
use crate::fake_server::{Fake, Kind};
use crate::{POLLS_UNTIL_RUNNING, TOKEN, assert_no_token, hz_provider, unix_now};

#[tokio::test]
async fn hetzner_keeps_the_host_provider_contract() {
    let (fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 50);
    contract::run(&provider, contract::Expect::booting_cloud(POLLS_UNTIL_RUNNING + 2)).await;
    let counts = provider.limiter().counters.snapshot();
    assert_eq!(counts["CreateServer"], 1);
    assert_eq!(counts["DeleteServer"], 2);

    let body = fake.state().create_bodies[0].clone();
    assert_eq!(body["user_data"], user_data());
    assert_eq!(body["server_type"], "cx23");
    assert_eq!(body["image"], "ubuntu-24.04");
    assert_eq!(body["start_after_create"], true);
    assert_eq!(body["labels"][TAG_TUNNEL_UID], UID);
    assert_eq!(body["labels"][TAG_MANAGED_BY], MANAGED_BY_VALUE);
    let lists: Vec<String> = fake
        .state()
        .requests
        .iter()
        .filter(|(m, p, _)| m == "GET" && p == "/v1/servers")
        .map(|r| r.2.clone())
        .collect();
    assert!(lists[0].contains(&format!("\"label_selector\": \"{TAG_TUNNEL_UID}=={UID}\"")), "{lists:?}");
}

#[tokio::test]
async fn hetzner_a_wrong_token_is_unauthorized_and_never_echoed() {
    let (_fake, base) = Fake::start(Kind::Hetzner).await;
    let wrong = format!("{TOKEN}x");
    let provider = hz_provider(&base, &wrong, 50);
    assert!(!format!("{provider:?}").contains(TOKEN));
    let e = provider.list_by_tag(TAG_TUNNEL_UID, UID).await.unwrap_err();
    assert!(matches!(e, HostError::Unauthorized { .. }), "{e:?}");
    assert_eq!(e.class(), ErrorClass::Permanent);
    assert!(!e.to_string().contains(&wrong) && !format!("{e:?}").contains(&wrong), "{e}");
}

#[tokio::test]
async fn hetzner_invalid_requests_and_name_clashes_carry_the_providers_message() {
    let (_fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 50);
    let mut bad = request("skyport-bad", UID);
    bad.size = Some("cx999".into());
    let invalid = provider.create(&bad).await.unwrap_err();
    assert!(
        matches!(&invalid, HostError::Invalid { message, .. } if message == "invalid input in field 'server_type': unknown server type"),
        "{invalid:?}"
    );
    assert_eq!(invalid.class(), ErrorClass::Permanent);

    provider.create(&request("skyport-dup", UID)).await.unwrap();
    let clash = provider.create(&request("skyport-dup", UID)).await.unwrap_err();
    assert!(matches!(&clash, HostError::AlreadyExists { message, .. } if message == "server name is already used"));
    assert_eq!(clash.class(), ErrorClass::Transient);
    assert_no_token(&[invalid, clash]);
}

#[tokio::test]
async fn hetzner_quota_and_server_errors_are_transient() {
    let (fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 50);
    fake.script(403, &[], json!({"error": {"code": "resource_limit_exceeded", "message": "server limit exceeded", "details": {"limits": [{"name": "server_limit"}]}}}));
    let quota = provider.create(&request("skyport-q", UID)).await.unwrap_err();
    assert!(matches!(&quota, HostError::Quota { message, .. } if message == "server limit exceeded"), "{quota:?}");
    fake.script(
        503,
        &[],
        json!({"error": {"code": "maintenance", "message": "maintenance in progress", "details": {}}}),
    );
    let down = provider.get("1").await.unwrap_err();
    assert!(matches!(down, HostError::Unavailable { .. }), "{down:?}");
    for e in [&quota, &down] {
        assert_eq!(e.class(), ErrorClass::Transient);
    }
}

#[tokio::test]
async fn hetzner_a_429_without_retry_after_waits_for_the_next_refill() {
    let (fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 50);
    // 3600/h refills one request per second; the reset is when the whole hour is back.
    let reset = unix_now() + 3600;
    fake.script(
        429,
        &[("RateLimit-Limit", "3600".into()), ("RateLimit-Remaining", "0".into()), ("RateLimit-Reset", reset.to_string())],
        json!({"error": {"code": "rate_limit_exceeded", "message": "limit of 3600 requests per hour reached", "details": {}}}),
    );
    let e = provider.get("1001").await.unwrap_err();
    assert!(matches!(e, HostError::RateLimited { retry_after: Some(d), .. } if d == Duration::from_secs(1)), "{e:?}");
    assert_eq!(e.class(), ErrorClass::Transient);

    // The next call sits out that second itself, then goes through.
    let start = Instant::now();
    assert_eq!(provider.get("1001").await.unwrap(), None);
    assert!(start.elapsed() >= Duration::from_millis(900), "waited {:?}", start.elapsed());
    assert_eq!(fake.request_count(), 2);

    // With Retry-After, that wins.
    fake.script(
        429,
        &[("Retry-After", "42".into())],
        json!({"error": {"code": "rate_limit_exceeded", "message": "slow down", "details": {}}}),
    );
    let e = provider.get("1001").await.unwrap_err();
    assert_eq!(e.retry_after(), Some(Duration::from_secs(42)));
}

#[tokio::test]
async fn hetzner_lists_every_page() {
    let (_fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 2);
    for i in 0..5 {
        provider.create(&request(&format!("skyport-{i}"), UID)).await.unwrap();
    }
    provider.create(&request("skyport-other", "99999999-0000-0000-0000-000000000000")).await.unwrap();
    let hosts = provider.list_by_tag(TAG_TUNNEL_UID, UID).await.unwrap();
    assert_eq!(hosts.len(), 5);
    assert!(hosts.iter().all(|h| h.tags[TAG_TUNNEL_UID] == UID));
    assert_eq!(provider.limiter().counters.snapshot()["ListServers"], 3, "pages of 2, 2 and 1");
    assert_eq!(provider.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap().len(), 6);
}

#[tokio::test]
async fn hetzner_keeps_the_reserved_address_contract() {
    let (fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 50);
    let expect = contract::Expect::booting_cloud(POLLS_UNTIL_RUNNING + 2);
    contract::run_addresses(&provider, &request("skyport-addr", UID), Some("nbg1"), &expect).await;
    // Both servers were created with the primary IP, in its location.
    let bodies = fake.state().create_bodies.clone();
    let servers: Vec<&Value> = bodies.iter().filter(|b| b.get("server_type").is_some()).collect();
    assert_eq!(servers.len(), 2);
    for body in servers {
        assert!(body["public_net"]["ipv4"].is_u64(), "{body}");
        assert_eq!(body["location"], "nbg1");
    }
}

#[tokio::test]
async fn hetzner_reserves_a_primary_ip_with_the_default_settings() {
    // "If not assigned to a resource the location key needs to be provided" (API reference,
    // "Create a Primary IP"): a Tunnel naming no region still gets one, in the default location.
    let (fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 50);
    let expect = contract::Expect::booting_cloud(POLLS_UNTIL_RUNNING + 2);
    contract::run_addresses(&provider, &request("skyport-addr", UID), None, &expect).await;
    let bodies = fake.state().create_bodies.clone();
    let location = providers::hetzner::DEFAULT_LOCATION;
    assert!(bodies.iter().filter(|b| b.get("server_type").is_some()).all(|b| b["location"] == location), "{bodies:?}");
}

#[tokio::test]
async fn hetzner_refuses_to_move_a_primary_ip_onto_a_running_server() {
    let (_fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 50);
    let host = provider.create(&request("skyport-running", UID)).await.unwrap();
    let address = provider
        .reserve_address(&providers::AddressRequest {
            name: "ip".into(),
            region: Some("fsn1".into()),
            tags: contract::request("x", UID).tags,
            host_id: None,
            movable: false,
        })
        .await
        .unwrap();
    let e = provider.assign_address(&address.id, &host.id).await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
    assert!(e.to_string().contains("powered off"), "{e}");
    // Which is why a highly available Tunnel's movable address is a floating IP instead
    // (`hetzner_floating.rs`).
}

#[tokio::test]
async fn hetzner_primary_ip_names_are_unique_per_tunnel() {
    // Two clusters sharing a project, each with a Tunnel team-a/web-tunnel asking for a reserved
    // address: the same base name, which Hetzner allows once per project.
    let (_fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 50);
    let reserve = |uid: &str| providers::AddressRequest {
        name: "skyport-team-a-web-tunnel".into(),
        region: Some("fsn1".into()),
        tags: contract::request("x", uid).tags,
        host_id: None,
        movable: false,
    };
    let a = provider.reserve_address(&reserve(UID)).await.expect("first cluster");
    let b = provider
        .reserve_address(&reserve("99999999-0000-0000-0000-000000000000"))
        .await
        .expect("a second cluster's Tunnel of the same name is not a clash");
    assert_ne!(a.id, b.id);
}

#[tokio::test]
async fn hetzner_server_names_are_unique_per_tunnel() {
    // Two clusters sharing a project, each with a Tunnel team-a/web-tunnel: same base name.
    let (fake, base) = Fake::start(Kind::Hetzner).await;
    let provider = hz_provider(&base, TOKEN, 50);
    let a = provider.create(&request("skyport-team-a-web-tunnel", UID)).await.expect("first cluster");
    let b = provider
        .create(&request("skyport-team-a-web-tunnel", "99999999-0000-0000-0000-000000000000"))
        .await
        .expect("a second cluster's Tunnel of the same name is not a clash");
    assert_ne!(a.name, b.name);
    for name in [&a.name, &b.name] {
        assert!(name.starts_with("skyport-team-a-web-tunnel-") && name.len() <= 63, "{name}");
    }
    let long = format!("skyport-{}", "n".repeat(70));
    let c = provider.create(&request(&long, UID)).await.unwrap();
    assert!(c.name.len() <= 63 && c.name.ends_with(|ch: char| ch.is_ascii_alphanumeric()), "{}", c.name);
    assert_eq!(fake.state().create_bodies.len(), 3);
}
