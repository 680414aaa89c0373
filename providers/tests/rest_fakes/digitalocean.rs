//! The DigitalOcean adapter against its fake: the host and reserved-address contracts, token
//! hygiene, error mapping (the droplet limit a quota), 429s and Retry-After, pagination.

use std::time::{Duration, Instant};

use providers::hosts::{HostProvider, MANAGED_BY_VALUE, TAG_MANAGED_BY, TAG_TUNNEL_UID};
use providers::{ErrorClass, HostError};
use serde_json::json;

use crate::contract::{self, UID, request, user_data};
use crate::fake_server::{Fake, Kind};
use crate::{POLLS_UNTIL_RUNNING, TOKEN, assert_no_token, do_provider, unix_now};

#[tokio::test]
async fn digitalocean_keeps_the_host_provider_contract() {
    let (fake, base) = Fake::start(Kind::DigitalOcean).await;
    let provider = do_provider(&base, TOKEN, 200);
    contract::run(&provider, contract::Expect::booting_cloud(POLLS_UNTIL_RUNNING + 2)).await;
    let counts = provider.limiter().counters.snapshot();
    assert_eq!(counts["CreateDroplet"], 1);
    assert_eq!(counts["DeleteDroplet"], 2);

    // What went over the wire is what the API documents.
    let body = fake.state().create_bodies[0].clone();
    assert_eq!(body["user_data"], user_data());
    assert_eq!(body["size"], "s-1vcpu-1gb");
    assert_eq!(body["image"], "ubuntu-24-04-x64");
    assert!(body.get("region").is_none(), "no region: DigitalOcean picks one");
    let tags: Vec<&str> = body["tags"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert!(tags.contains(&"skyport_dev:tunnel-uid:0b6e3c57-4d0e-4b52-9a43-3f4f7e7d2a10"), "{tags:?}");
    assert!(tags.iter().all(|t| t.len() <= 255 && t.chars().all(|c| c.is_ascii_alphanumeric() || "_:-".contains(c))));
    let lists: Vec<String> = fake
        .state()
        .requests
        .iter()
        .filter(|(m, p, _)| m == "GET" && p == "/v2/droplets")
        .map(|r| r.2.clone())
        .collect();
    assert!(lists[0].contains("\"tag_name\": \"skyport_dev:tunnel-uid:0b6e3c57"), "{lists:?}");
}

#[tokio::test]
async fn digitalocean_a_wrong_token_is_unauthorized_and_never_echoed() {
    let (fake, base) = Fake::start(Kind::DigitalOcean).await;
    // The fake echoes the Authorization header it got; use the real token's shape with a typo.
    let wrong = format!("{TOKEN}x");
    let provider = do_provider(&base, &wrong, 200);
    assert!(!format!("{provider:?}").contains(TOKEN));
    let e = provider.get("1001").await.unwrap_err();
    assert!(
        matches!(&e, HostError::Unauthorized { message, .. } if message.contains("Unable to authenticate you")),
        "{e:?}"
    );
    assert_eq!(e.class(), ErrorClass::Permanent);
    assert!(!e.to_string().contains(&wrong) && !format!("{e:?}").contains(&wrong), "{e}");
    assert!(e.to_string().contains("<redacted>"), "{e}");
    assert_eq!(fake.request_count(), 1);
}

#[tokio::test]
async fn digitalocean_invalid_requests_carry_the_providers_message() {
    let (fake, base) = Fake::start(Kind::DigitalOcean).await;
    let provider = do_provider(&base, TOKEN, 200);
    let mut bad = request("skyport-bad", UID);
    bad.size = Some("s-64vcpu-huge".into());
    let e = provider.create(&bad).await.unwrap_err();
    assert!(
        matches!(&e, HostError::Invalid { message, .. } if message == "You specified an invalid size for Droplet creation."),
        "{e:?}"
    );
    assert_eq!(e.class(), ErrorClass::Permanent);
    // Oversized user data is refused before spending a request.
    let before = fake.request_count();
    let mut huge = request("skyport-huge", UID);
    huge.user_data = "#".repeat(providers::digitalocean::MAX_USER_DATA + 1);
    assert!(matches!(provider.create(&huge).await, Err(HostError::Invalid { .. })));
    assert_eq!(fake.request_count(), before);
    // A malformed id never reaches the API.
    assert!(matches!(provider.get("../account").await, Err(HostError::Invalid { .. })));
    assert_eq!(fake.request_count(), before);
    assert_no_token(&[e]);
}

#[tokio::test]
async fn digitalocean_a_short_retry_after_is_honoured_once_inside_the_call() {
    let (fake, base) = Fake::start(Kind::DigitalOcean).await;
    let provider = do_provider(&base, TOKEN, 200);
    // The burst-limit 429 as documented: remaining 0, reset, retry-after in seconds.
    let reset = (unix_now() + 50).to_string();
    fake.script(
        429,
        &[
            ("ratelimit-limit", "5000".into()),
            ("ratelimit-remaining", "0".into()),
            ("ratelimit-reset", reset),
            ("retry-after", "1".into()),
        ],
        json!({"id": "too_many_requests", "message": "API Rate limit exceeded."}),
    );
    let start = Instant::now();
    assert_eq!(provider.list_by_tag(TAG_TUNNEL_UID, UID).await.unwrap(), vec![]);
    assert!(start.elapsed() >= Duration::from_millis(950), "waited {:?}", start.elapsed());
    assert_eq!(fake.request_count(), 2, "one 429, one retry");
    assert_eq!(provider.limiter().counters.waits().0, 1);
}

#[tokio::test]
async fn digitalocean_a_long_retry_after_is_returned_to_the_caller() {
    let (fake, base) = Fake::start(Kind::DigitalOcean).await;
    let provider = do_provider(&base, TOKEN, 200);
    fake.script(
        429,
        &[("retry-after", "29".into())],
        json!({"id": "too_many_requests", "message": "API Rate limit exceeded."}),
    );
    let e = provider.get("1001").await.unwrap_err();
    assert!(matches!(e, HostError::RateLimited { retry_after: Some(d), .. } if d == Duration::from_secs(29)), "{e:?}");
    assert_eq!(e.class(), ErrorClass::Transient);
    assert_eq!(fake.request_count(), 1, "no retry inside the adapter");
    // Calls made before that time fail fast, without a request.
    let e = provider.list_by_tag(TAG_TUNNEL_UID, UID).await.unwrap_err();
    assert!(matches!(e, HostError::RateLimited { retry_after: Some(d), .. } if d > Duration::from_secs(25)), "{e:?}");
    assert_eq!(fake.request_count(), 1);

    // Two 429s with short Retry-After: the adapter retries once, then gives up.
    let provider = do_provider(&base, TOKEN, 200);
    for _ in 0..2 {
        fake.script(
            429,
            &[("retry-after", "1".into())],
            json!({"id": "too_many_requests", "message": "API Rate limit exceeded."}),
        );
    }
    let e = provider.get("1001").await.unwrap_err();
    assert!(matches!(e, HostError::RateLimited { retry_after: Some(d), .. } if d == Duration::from_secs(1)), "{e:?}");
    assert_eq!(fake.request_count(), 3);
    assert_no_token(&[e]);
}

#[tokio::test]
async fn digitalocean_a_429_with_only_rate_limit_headers_waits_until_the_reset() {
    let (fake, base) = Fake::start(Kind::DigitalOcean).await;
    let provider = do_provider(&base, TOKEN, 200);
    let reset = unix_now() + 120;
    fake.script(
        429,
        &[
            ("ratelimit-limit", "5000".into()),
            ("ratelimit-remaining", "0".into()),
            ("ratelimit-reset", reset.to_string()),
        ],
        json!({"id": "too_many_requests", "message": "API Rate limit exceeded."}),
    );
    let e = provider.get("1001").await.unwrap_err();
    let Some(wait) = e.retry_after() else { panic!("{e:?}") };
    assert!((Duration::from_secs(118)..=Duration::from_secs(120)).contains(&wait), "{wait:?}");

    // Until then, calls fail fast without spending a request on another 429.
    let e = provider.list_by_tag(TAG_TUNNEL_UID, UID).await.unwrap_err();
    assert!(matches!(e, HostError::RateLimited { retry_after: Some(d), .. } if d > Duration::from_secs(100)), "{e:?}");
    assert_eq!(fake.request_count(), 1);
}

#[tokio::test]
async fn digitalocean_slows_down_when_remaining_reaches_zero() {
    let (fake, base) = Fake::start(Kind::DigitalOcean).await;
    let provider = do_provider(&base, TOKEN, 200);
    // A success that used the last request; the oldest one expires in about two seconds.
    fake.state().rate = Some((5000, 0, unix_now() + 2));
    assert_eq!(provider.get("1001").await.unwrap(), None);
    fake.state().rate = Some((5000, 4000, unix_now() + 3600));
    let start = Instant::now();
    assert_eq!(provider.get("1001").await.unwrap(), None);
    assert!(start.elapsed() >= Duration::from_millis(900), "held for {:?}", start.elapsed());
    assert_eq!(fake.request_count(), 2, "no request was spent on a 429");
    assert_eq!(provider.rest().last_rate_limit().remaining, Some(4000));
}

#[tokio::test]
async fn digitalocean_lists_every_page() {
    let (fake, base) = Fake::start(Kind::DigitalOcean).await;
    let provider = do_provider(&base, TOKEN, 2);
    for i in 0..5 {
        provider.create(&request(&format!("skyport-{i}"), UID)).await.unwrap();
    }
    provider.create(&request("skyport-other", "99999999-0000-0000-0000-000000000000")).await.unwrap();
    let hosts = provider.list_by_tag(TAG_TUNNEL_UID, UID).await.unwrap();
    let mut names: Vec<String> = hosts.into_iter().map(|h| h.name).collect();
    names.sort();
    assert_eq!(names, ["skyport-0", "skyport-1", "skyport-2", "skyport-3", "skyport-4"]);
    assert_eq!(provider.limiter().counters.snapshot()["ListDroplets"], 3, "pages of 2, 2 and 1");
    assert_eq!(provider.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap().len(), 6);
    assert!(fake.request_count() >= 10);
}

#[tokio::test]
async fn digitalocean_keeps_the_reserved_address_contract() {
    let (fake, base) = Fake::start(Kind::DigitalOcean).await;
    let provider = do_provider(&base, TOKEN, 200);
    let expect = contract::Expect::booting_cloud(POLLS_UNTIL_RUNNING + 2);
    contract::run_addresses(&provider, &request("skyport-addr", UID), None, &expect).await;
    let requests = fake.state().requests.clone();
    let creates: Vec<_> = requests.iter().filter(|(m, p, _)| m == "POST" && p == "/v2/reserved_ips").collect();
    assert_eq!(creates.len(), 1, "{requests:?}");
    assert!(requests.iter().any(|(m, p, _)| m == "POST" && p.ends_with("/actions")), "assigned to the replacement");
}

#[tokio::test]
async fn digitalocean_the_droplet_limit_is_a_quota_not_a_permanent_error() {
    let (fake, base) = Fake::start(Kind::DigitalOcean).await;
    let provider = do_provider(&base, TOKEN, 200);
    // What DigitalOcean answers when the account's droplet limit is reached.
    fake.script(
        422,
        &[],
        json!({"id": "unprocessable_entity", "message": "creating this/these droplet(s) will exceed your droplet limit", "request_id": "r"}),
    );
    let e = provider.create(&request("skyport-limit", UID)).await.unwrap_err();
    assert!(matches!(&e, HostError::Quota { message, .. } if message.contains("droplet limit")), "{e:?}");
    assert_eq!(e.class(), ErrorClass::Transient, "retried once the limit is raised");
    // Other 422s stay permanent.
    let mut bad = request("skyport-bad", UID);
    bad.size = Some("s-64vcpu-huge".into());
    assert_eq!(provider.create(&bad).await.unwrap_err().class(), ErrorClass::Permanent);
}

#[tokio::test]
async fn digitalocean_moves_a_reserved_ip_between_running_droplets_each_keeping_its_own_address() {
    let (_fake, base) = Fake::start(Kind::DigitalOcean).await;
    let provider = do_provider(&base, TOKEN, 200);
    assert_eq!(
        provider.capabilities().may_move_addresses(provider.name()),
        Ok(()),
        "a highly available Tunnel may run here"
    );
    let expect = contract::Expect::booting_cloud(POLLS_UNTIL_RUNNING + 2);
    let first = contract::running(&provider, &request("skyport-pair-a", UID), &expect).await;
    let address = provider
        .reserve_address(&providers::AddressRequest {
            name: "skyport-pair".into(),
            region: None,
            tags: request("x", UID).tags,
            host_id: Some(first.id.clone()),
            movable: true,
        })
        .await
        .unwrap();
    // The second droplet where the reserved IP can go (DigitalOcean picks a region otherwise),
    // as the controller creates it.
    let mut standby = request("skyport-pair-b", UID);
    standby.region = provider.address_region(&address.id).await.unwrap();
    assert!(standby.region.is_some());
    let second = contract::running(&provider, &standby, &expect).await;
    // Moved while both run, as a failover does; then back.
    for to in [&second, &first] {
        provider.assign_address(&address.id, &to.id).await.unwrap();
        let got = provider.get_address(&address.id).await.unwrap().expect("still reserved");
        assert_eq!(got.host_id.as_deref(), Some(to.id.as_str()));
    }
    // Each droplet keeps its own public address, which its tunnel client dials.
    for host in [&first, &second] {
        let now = provider.get(&host.id).await.unwrap().unwrap();
        assert_eq!(now.public_ipv4, host.public_ipv4);
        assert_ne!(now.public_ipv4.as_deref(), Some(address.ip.as_str()));
    }
}

#[tokio::test]
async fn digitalocean_lists_every_reserved_ip_for_a_reservation_whose_answer_was_lost() {
    let (_fake, base) = Fake::start(Kind::DigitalOcean).await;
    let provider = do_provider(&base, TOKEN, 1);
    let expect = contract::Expect::booting_cloud(POLLS_UNTIL_RUNNING + 2);
    let droplet = contract::running(&provider, &request("skyport-lost", UID), &expect).await;
    let before = provider.list_untagged_addresses().await.unwrap().expect("reserved IPs carry no tags here");
    let request = providers::AddressRequest {
        name: "skyport-lost".into(),
        region: None,
        tags: request("x", UID).tags,
        host_id: Some(droplet.id.clone()),
        movable: false,
    };
    let made = provider.reserve_address(&request).await.unwrap();
    // Its droplet goes before the operator heard back: the reserved IP is unassigned and has no
    // tags left to be found by.
    provider.delete(&droplet.id).await.unwrap();
    assert!(provider.list_addresses_by_tag(TAG_TUNNEL_UID, UID).await.unwrap().is_empty());
    let after = provider.list_untagged_addresses().await.unwrap().unwrap();
    let new: Vec<_> = after.iter().filter(|a| !before.iter().any(|b| b.id == a.id)).collect();
    assert_eq!(new.len(), 1, "{after:?}");
    assert_eq!((new[0].id.as_str(), new[0].host_id.as_deref()), (made.id.as_str(), None));
    provider.release_address(&made.id).await.unwrap();
}
