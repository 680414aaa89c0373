//! The EC2 adapter against the LocalStack that tests/env.sh starts (`eval "$(tests/env.sh up)"`
//! exports AWS_ENDPOINT_URL, AWS_REGION and test keys): the shared contract, the security group
//! it opens, user data, an instance terminated out of band, and listing by owner.
//!
//! What LocalStack's EC2 (moto) does, and so what these tests can and cannot show:
//! - RunInstances answers `pending`, and the very next DescribeInstances says `running`, with a
//!   public address from 54.214.0.0/16 (public-looking, like AWS's), so the contract runs with one
//!   poll and checks that the address is not a private one.
//! - TerminateInstances goes straight to `terminated`, and a security group can be deleted even
//!   while its instance runs: AWS's `DependencyViolation` during shutdown cannot happen here
//!   (the transient error `delete` returns for it is covered by the mapping's unit tests).
//! - Any AMI id and any instance type are accepted, so "bad AMI" and "invalid instance type" are
//!   unit tests of the error mapping (`providers/src/ec2/tests.rs`), not tests here. Subnets are
//!   checked, which is how a refused launch is tested (ec2_network.rs).

mod contract;
mod ec2_support;

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_ec2::types::{Filter, SecurityGroup};
use base64::Engine as _;
use ec2_support::provider;
use providers::ec2::{Ec2Provider, Ec2Settings, TAG_CREATED_AT, TAG_INSTANCE_ID};
use providers::exit::userdata::{Protocol, TunnelService};
use providers::hosts::{HostProvider, HostRequest, HostState, MANAGED_BY_VALUE, TAG_MANAGED_BY, TAG_TUNNEL_UID};
use providers::{ErrorClass, HostError, owner_tags};

/// A request with a name and owner of its own, so parallel tests and earlier runs never meet.
fn request(test: &str, uid: &str) -> HostRequest {
    let mut request = contract::request(&format!("skyport-{test}-{:06x}", rand::random::<u32>() >> 8), uid);
    request.server.services.push(TunnelService {
        name: "team-a.dns.53-udp".into(),
        protocol: Protocol::Udp,
        port: 53,
        token: "tok2".into(),
        source_ranges: Vec::new(),
        proxy_protocol: None,
        bind: None,
    });
    request
}

/// The security groups attached to instance `id`, as EC2 describes them.
async fn groups_of(p: &Ec2Provider, id: &str) -> Vec<SecurityGroup> {
    let out = p.client().describe_instances().instance_ids(id).send().await.unwrap();
    let ids: Vec<String> = out
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .flat_map(|i| i.security_groups())
        .filter_map(|g| g.group_id().map(str::to_string))
        .collect();
    assert!(!ids.is_empty(), "instance {id} has no security group");
    let out = p.client().describe_security_groups().set_group_ids(Some(ids)).send().await.unwrap();
    out.security_groups().to_vec()
}

/// Whether the group still exists (EC2 answers `InvalidGroup.NotFound` for a deleted one).
async fn group_exists(p: &Ec2Provider, group_id: &str) -> bool {
    let filter = Filter::builder().name("group-id").values(group_id).build();
    let out = p.client().describe_security_groups().filters(filter).send().await.unwrap();
    !out.security_groups().is_empty()
}

fn tag_map(tags: &[aws_sdk_ec2::types::Tag]) -> BTreeMap<String, String> {
    tags.iter().filter_map(|t| Some((t.key()?.to_string(), t.value()?.to_string()))).collect()
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn ec2_keeps_the_host_provider_contract() {
    let p = provider().await;
    // The contract lists by its fixed UID: clear what an interrupted earlier run left under it.
    for host in p.list_by_tag(TAG_TUNNEL_UID, contract::UID).await.unwrap() {
        p.delete(&host.id).await.unwrap();
    }
    let request = contract::request(&format!("skyport-contract-{:06x}", rand::random::<u32>() >> 8), contract::UID);
    let expect = contract::Expect {
        // RunInstances says `pending`, but LocalStack's next read already says `running`, so the
        // contract's "first read is still provisioning" cannot hold; create's own Provisioning is
        // checked in `the_security_group_opens_exactly_the_tunnel_ports_and_goes_with_the_host`.
        created_provisioning: false,
        polls_until_running: 1,
        interval: Duration::ZERO,
        // LocalStack hands out 54.214.x.x, a public-looking address, as AWS would.
        public_address: true,
    };
    contract::run_with(&p, &request, expect).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn the_security_group_opens_exactly_the_tunnel_ports_and_goes_with_the_host() {
    let p = provider().await;
    let uid = contract::fresh_uid();
    let request = request("sg", &uid);
    let created = contract::create(&p, &request).await;
    assert_eq!(created.state, HostState::Provisioning, "RunInstances answers pending");

    let groups = groups_of(&p, &created.id).await;
    assert_eq!(groups.len(), 1, "one group per tunnel: {groups:?}");
    let group = &groups[0];
    assert!(group.group_name().unwrap().starts_with(&format!("{}-", request.name)), "{group:?}");
    let mut rules: Vec<(String, i32, i32, Vec<String>)> = group
        .ip_permissions()
        .iter()
        .map(|r| {
            let cidrs = r.ip_ranges().iter().filter_map(|c| c.cidr_ip().map(str::to_string)).collect();
            (r.ip_protocol().unwrap().to_string(), r.from_port().unwrap(), r.to_port().unwrap(), cidrs)
        })
        .collect();
    rules.sort();
    let anywhere = || vec!["0.0.0.0/0".to_string()];
    assert_eq!(
        rules,
        [
            ("tcp".to_string(), 80, 80, anywhere()),
            ("tcp".to_string(), 2333, 2333, anywhere()),
            ("tcp".to_string(), 2335, 2335, anywhere()),
            ("udp".to_string(), 53, 53, anywhere()),
        ],
        "the control and push ports over TCP and each Service port with its protocol, nothing else"
    );
    let mut expected_tags = owner_tags(&uid, "team-a", "web-tunnel");
    expected_tags.insert("Name".into(), request.name.clone());
    let mut group_tags = expected_tags.clone();
    group_tags.insert(TAG_INSTANCE_ID.into(), created.id.clone());
    // When it was made (EC2 records no time for a group): a group whose launch never came is
    // reaped once overdue.
    let mut found = tag_map(group.tags());
    let made = found.remove(TAG_CREATED_AT).expect("the group's creation time");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert!(made.parse::<u64>().is_ok_and(|t| t <= now && now - t < 600), "created-at {made}, now {now}");
    assert_eq!(found, group_tags, "owner tags, Name, and the instance it was made for");

    // The root volume carries the same tags, so a cost report finds it under its Tunnel.
    let volumes = p
        .client()
        .describe_volumes()
        .filters(Filter::builder().name("attachment.instance-id").values(&created.id).build())
        .send()
        .await
        .unwrap();
    assert!(!volumes.volumes().is_empty());
    for volume in volumes.volumes() {
        assert_eq!(tag_map(volume.tags()), expected_tags, "{volume:?}");
    }

    let group_id = group.group_id().unwrap().to_string();
    p.delete(&created.id).await.unwrap();
    assert!(!group_exists(&p, &group_id).await, "the group is deleted with its host");
    assert_eq!(p.get(&created.id).await.unwrap(), None);
}

/// (protocol, port) of every rule of the instance's group.
async fn rules_of(p: &Ec2Provider, id: &str) -> Vec<(String, i32)> {
    let groups = groups_of(p, id).await;
    let mut rules: Vec<(String, i32)> = groups[0]
        .ip_permissions()
        .iter()
        .map(|r| (r.ip_protocol().unwrap().to_string(), r.from_port().unwrap()))
        .collect();
    rules.sort();
    rules
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_port_change_makes_the_group_open_exactly_the_new_ports_before_the_push() {
    let p = provider().await;
    let mut request = request("ports", &contract::fresh_uid());
    request.server.noise_private_key = providers::NoiseKeypair::generate().private_key;
    let created = contract::create(&p, &request).await;
    let tcp = |port: &str| ("tcp".to_string(), port.parse::<i32>().unwrap());
    assert_eq!(rules_of(&p, &created.id).await, [tcp("80"), tcp("2333"), tcp("2335"), ("udp".into(), 53)]);

    // 53/UDP out, 8443/TCP in.
    request.server.services.retain(|s| s.protocol == Protocol::Tcp);
    request.server.services.push(TunnelService {
        name: "team-a.web.8443-tcp".into(),
        protocol: Protocol::Tcp,
        port: 8443,
        token: "tok3".into(),
        source_ranges: Vec::new(),
        proxy_protocol: None,
        bind: None,
    });
    // LocalStack's instance runs no exit server at its address: whatever the network does with
    // the connection (refused, silent, accepted without a greeting), the push fails in a way a
    // retry may fix, so the host is not given up (no replacement), but the group already opens
    // exactly the new ports.
    let transient = |r: Result<bool, HostError>| match r {
        Err(HostError::Unavailable { .. }) => {}
        other => panic!("a push nobody answers is a transient error, got {other:?}"),
    };
    let started = std::time::Instant::now();
    transient(p.reconfigure(&created.id, &request.server).await);
    assert!(started.elapsed() < Duration::from_secs(15), "the push gave up within its timeout");
    let want = [tcp("80"), tcp("2333"), tcp("2335"), tcp("8443")];
    assert_eq!(rules_of(&p, &created.id).await, want);
    // Again: nothing to change in the group.
    transient(p.reconfigure(&created.id, &request.server).await);
    assert_eq!(rules_of(&p, &created.id).await, want);
    let calls = p.limiter().counters.outcomes();
    assert_eq!(calls.get(&("RevokeSecurityGroupIngress", "success")).copied(), Some(1), "{calls:?}");

    p.delete(&created.id).await.unwrap();
    let err = p.reconfigure(&created.id, &request.server).await.unwrap_err();
    assert!(matches!(err, HostError::NotFound { .. }), "{err}");
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn user_data_reaches_the_instance_unchanged() {
    let p = provider().await;
    let request = request("userdata", &contract::fresh_uid());
    let created = contract::create(&p, &request).await;
    let attribute = p
        .client()
        .describe_instance_attribute()
        .instance_id(&created.id)
        .attribute(aws_sdk_ec2::types::InstanceAttributeName::UserData)
        .send()
        .await
        .unwrap();
    let encoded = attribute.user_data().and_then(|u| u.value()).expect("user data");
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded).unwrap();
    assert_eq!(String::from_utf8(decoded).unwrap(), request.user_data);
    // The console, decoded: LocalStack's is a canned boot log, with no install report in it.
    let console = p.console_output(&created.id).await.unwrap().expect("a console");
    assert!(console.contains("Linux version"), "{console}");
    assert_eq!(providers::exit::userdata::InstallReport::find(&console), None);
    p.delete(&created.id).await.unwrap();
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn an_instance_terminated_out_of_band_is_gone_and_its_group_still_cleaned_up() {
    let p = provider().await;
    let uid = contract::fresh_uid();
    let created = contract::create(&p, &request("oob", &uid)).await;
    let group_id = groups_of(&p, &created.id).await[0].group_id().unwrap().to_string();

    p.client().terminate_instances().instance_ids(&created.id).send().await.unwrap();
    assert_eq!(p.get(&created.id).await.unwrap(), None, "terminated reads as gone");
    assert!(p.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().is_empty());

    // The controller's delete of a host that is already gone still removes its group.
    p.delete(&created.id).await.unwrap();
    assert!(!group_exists(&p, &group_id).await);
    p.delete(&created.id).await.expect("deleting twice is success");
    // An id EC2 never issued reads as gone too (InvalidInstanceID.NotFound).
    assert_eq!(p.get("i-0000000000000dead").await.unwrap(), None);
    p.delete("i-0000000000000dead").await.unwrap();
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_group_left_by_an_instance_ec2_no_longer_shows_is_deleted_by_its_tag() {
    // AWS forgets terminated instances after about an hour; LocalStack never does, so stand in
    // for that with a group tagged for an instance id EC2 does not know.
    let p = provider().await;
    let gone = format!("i-{:017x}", rand::random::<u64>() >> 4);
    let tag = aws_sdk_ec2::types::Tag::builder().key(TAG_INSTANCE_ID).value(&gone).build();
    let spec = aws_sdk_ec2::types::TagSpecification::builder()
        .resource_type(aws_sdk_ec2::types::ResourceType::SecurityGroup)
        .tags(tag)
        .build();
    let name = format!("skyport-left-{:08x}", rand::random::<u32>());
    let out =
        p.client().create_security_group().group_name(name).description("d").tag_specifications(spec).send().await;
    let group_id = out.unwrap().group_id().unwrap().to_string();

    assert_eq!(p.get(&gone).await.unwrap(), None);
    p.delete(&gone).await.unwrap();
    assert!(!group_exists(&p, &group_id).await, "the group went with the instance it was made for");
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn listing_by_tag_isolates_tunnels_by_uid() {
    let p = provider().await;
    let (mine, theirs) = (contract::fresh_uid(), contract::fresh_uid());
    let a = contract::create(&p, &request("list-a", &mine)).await;
    let b = contract::create(&p, &request("list-b", &theirs)).await;

    let listed = |uid: String| {
        let p = &p;
        async move { p.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().into_iter().map(|h| h.id).collect::<Vec<_>>() }
    };
    assert_eq!(listed(mine.clone()).await, [a.id.as_str()]);
    assert_eq!(listed(theirs.clone()).await, [b.id.as_str()]);
    let managed = p.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap();
    assert!(managed.iter().any(|h| h.id == a.id) && managed.iter().any(|h| h.id == b.id));

    p.delete(&a.id).await.unwrap();
    assert!(listed(mine).await.is_empty());
    assert_eq!(listed(theirs).await, [b.id.as_str()], "deleting one tunnel's host leaves the other's");
    p.delete(&b.id).await.unwrap();
}

#[tokio::test]
async fn a_missing_ami_is_a_permanent_error_that_says_what_to_set() {
    let Err(e) = Ec2Provider::from_env(Ec2Settings::new(" ")).await else { panic!("accepted an empty AMI") };
    assert!(matches!(e, HostError::Invalid { .. }), "{e}");
    assert_eq!(e.class(), ErrorClass::Permanent);
    assert!(e.to_string().contains("--ec2-image-id"), "{e}");
}
