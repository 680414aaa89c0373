use super::*;

const UID: &str = "0b6e3c57-4d0e-4b52-9a43-3f4f7e7d2a10";

#[test]
fn digitalocean_tags_use_only_the_allowed_characters_and_decode_back() {
    for (key, value) in owner_tags(UID, "team-a", "web.frontend-tunnel") {
        let (tag, empty) = TagSyntax::DigitalOcean.encode(&key, &value);
        assert!(empty.is_empty());
        assert!(tag.len() <= DO_TAG_MAX);
        assert!(tag.chars().all(|c| c.is_ascii_alphanumeric() || "_:-".contains(c)), "{tag}");
        assert_eq!(TagSyntax::DigitalOcean.decode(&tag, ""), (key, value));
    }
    assert_eq!(
        TagSyntax::DigitalOcean.encode(TAG_TUNNEL_UID, UID).0,
        "skyport_dev:tunnel-uid:0b6e3c57-4d0e-4b52-9a43-3f4f7e7d2a10"
    );
    // Foreign tags come back as they are.
    assert_eq!(TagSyntax::DigitalOcean.decode("env:prod", ""), ("env:prod".into(), String::new()));
}

#[test]
fn a_host_request_never_prints_its_user_data() {
    let request = HostRequest {
        name: "skyport-web".into(),
        region: None,
        size: None,
        user_data: "token = \"s3cret\"".into(),
        server: ExitServer { control_port: 2333, noise_private_key: "c2VjcmV0".into(), services: vec![] },
        tags: owner_tags(UID, "ns", "web"),
        address: None,
        failure_domain: None,
    };
    let printed = format!("{request:?}");
    assert!(!printed.contains("s3cret") && printed.contains("<16 bytes>"), "{printed}");
}

#[test]
fn hetzner_labels_keep_keys_and_short_values_unchanged() {
    for (key, value) in owner_tags(UID, "team-a", "web-tunnel") {
        let (k, v) = TagSyntax::Hetzner.encode(&key, &value);
        assert_eq!((k.as_str(), v.as_str()), (key.as_str(), value.as_str()));
    }
}

#[test]
fn long_values_are_shortened_deterministically_and_stay_valid() {
    let long = format!("{}-tunnel", "a".repeat(60));
    let (_, v) = TagSyntax::Hetzner.encode(TAG_TUNNEL_NAME, &long);
    assert_eq!(v.len(), HETZNER_VALUE_MAX);
    assert_eq!(v, TagSyntax::Hetzner.encode(TAG_TUNNEL_NAME, &long).1, "same input, same label");
    assert_ne!(v, TagSyntax::Hetzner.encode(TAG_TUNNEL_NAME, &format!("{long}2")).1);
    assert!(v.starts_with(|c: char| c.is_ascii_alphanumeric()));
    assert!(v.ends_with(|c: char| c.is_ascii_alphanumeric()));
    // A cut that lands on a separator is trimmed so the value stays a valid label.
    let dotted = format!("{}.{}", "b".repeat(53), "c".repeat(20));
    let v = fit_value(&dotted, HETZNER_VALUE_MAX);
    assert!(!v.contains(".-"), "{v}");

    let (tag, _) = TagSyntax::DigitalOcean.encode(TAG_TUNNEL_NAME, &"x".repeat(300));
    assert_eq!(tag.len(), DO_TAG_MAX);
}

/// A pool asking for an address per Service is told why its provider cannot, and what to use.
#[test]
fn a_provider_with_one_address_per_server_says_why_a_pool_cannot_have_one_per_service() {
    assert_eq!(PoolAddresses::Bound.per_service("local", false), Ok(()));
    assert_eq!(PoolAddresses::Assigned.per_service("hetzner", false), Ok(()));
    assert_eq!(PoolAddresses::Assigned.per_service("hetzner", true), Ok(()), "assigned to the active server");
    let why = PoolAddresses::Bound.per_service("local", true).unwrap_err();
    assert!(why.contains("local") && why.contains("cannot both listen") && why.contains("highAvailability"), "{why}");
    assert!(PoolAddresses::Assigned.assigned() && !PoolAddresses::Bound.assigned());
    let translated = PoolAddresses::Translated;
    assert_eq!(translated.per_service("ec2", false), Ok(()));
    assert!(translated.assigned() && translated.translated() && !PoolAddresses::Assigned.translated());
    let why = translated.per_service("ec2", true).unwrap_err();
    assert!(why.contains("ec2") && why.contains("private IPv4") && why.contains("highAvailability"), "{why}");
    let one = PoolAddresses::One("a Droplet takes one reserved IP at a time");
    let why = one.per_service("digitalocean", false).unwrap_err();
    assert!(why.contains("digitalocean") && why.contains("one reserved IP") && why.contains("addressing: Shared"));
    assert!(!Capabilities::default().pool_addresses.several(), "none unless a provider says so");
}
