//! EC2 behaviours that once broke, each against the LocalStack that tests/env.sh starts: security
//! groups that outlived their instance, `spec.region`, IMDSv2, and Elastic IPs.
//!
//! AWS refuses to delete a security group while its instance shuts down (`DependencyViolation`,
//! a minute or two). LocalStack deletes any group at once, whatever uses it, so these tests put
//! a small HTTP relay between the adapter and LocalStack (`ec2_support/relay.rs`): it forwards
//! every request, except that DeleteSecurityGroup of a group the test "holds" gets AWS's
//! DependencyViolation error document instead, as AWS answers during the shutdown. Everything
//! else, including the state the tests check, is LocalStack's.

mod contract;
#[path = "ec2_support/relay.rs"]
mod relay;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::types::{Filter, HttpTokensState};
use providers::ec2::{Ec2Provider, Ec2Settings};
use providers::hosts::{HostProvider, HostRequest, TAG_CLUSTER, TAG_TUNNEL_UID};
use providers::{ErrorClass, HostError};
use relay::Relay;

const AMI: &str = "ami-0123456789abcdef0";
/// A region other than the environment's default (us-east-1).
const OTHER_REGION: &str = "eu-west-1";

fn endpoint() -> String {
    std::env::var("AWS_ENDPOINT_URL")
        .expect("AWS_ENDPOINT_URL is not set: run `eval \"$(tests/env.sh up)\"` or tests/run.sh")
}

fn settings() -> Ec2Settings {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut settings = Ec2Settings::new(AMI);
    settings.endpoint_url = Some(endpoint());
    settings.region_images.insert(OTHER_REGION.into(), "ami-0fedcba9876543210".into());
    settings
}

async fn provider() -> Ec2Provider {
    Ec2Provider::from_env(settings()).await.expect("provider")
}

/// A plain SDK client for `region`, to look at what the adapter made there.
async fn client_in(region: &str) -> Client {
    let config = providers::aws::sdk_config(Some(region), Some(&endpoint()), std::time::Duration::from_secs(30)).await;
    Client::new(&config)
}

fn request(test: &str, uid: &str) -> HostRequest {
    let mut request = contract::request(&format!("skyport-{test}-{:06x}", rand::random::<u32>() >> 8), uid);
    request.tags.insert(TAG_CLUSTER.into(), format!("cluster-{uid}"));
    request
}

async fn group_of(client: &Client, instance: &str) -> String {
    let out = client.describe_instances().instance_ids(instance).send().await.unwrap();
    let instance = out.reservations()[0].instances()[0].clone();
    instance.security_groups()[0].group_id().unwrap().to_string()
}

async fn group_exists(client: &Client, group_id: &str) -> bool {
    let filter = Filter::builder().name("group-id").values(group_id).build();
    !client.describe_security_groups().filters(filter).send().await.unwrap().security_groups().is_empty()
}

/// A provider talking to LocalStack through `relay`.
async fn relayed(relay: &Relay) -> Ec2Provider {
    let mut settings = settings();
    settings.endpoint_url = Some(relay.url.clone());
    // Retry a held group on the very next call, not after the production interval.
    settings.retry_groups_every = std::time::Duration::ZERO;
    Ec2Provider::from_env(settings).await.expect("provider")
}

/// Deletes the host while its group is in use; checks the answer is a transient error.
async fn delete_while_in_use(p: &Ec2Provider, relay: &Relay, client: &Client, id: &str) -> String {
    let group = group_of(client, id).await;
    relay.hold(&group);
    let e = p.delete(id).await.expect_err("the group is still in use");
    assert_eq!(e.class(), ErrorClass::Transient, "{e}");
    assert!(group_exists(client, &group).await);
    group
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_group_still_in_use_when_its_host_was_replaced_is_deleted_by_a_later_call() {
    let relay = Relay::start(endpoint()).await;
    let p = relayed(&relay).await;
    let client = client_in("us-east-1").await;
    let uid = contract::fresh_uid();
    let old = contract::create(&p, &request("replaced", &uid)).await;
    let group = delete_while_in_use(&p, &relay, &client, &old.id).await;
    // The instance finishes terminating; the controller sees the host gone and creates another.
    relay.let_go(&group);
    assert_eq!(p.get(&old.id).await.unwrap(), None);
    let new = contract::create(&p, &request("replacement", &uid)).await;
    assert!(!group_exists(&client, &group).await, "the replaced host's group {group} leaked");
    p.delete(&new.id).await.unwrap();
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn after_a_restart_the_sweep_finds_a_left_over_group_by_tag_and_deletes_it() {
    let relay = Relay::start(endpoint()).await;
    let p = relayed(&relay).await;
    let client = client_in("us-east-1").await;
    let uid = contract::fresh_uid();
    let host = contract::create(&p, &request("orphan", &uid)).await;
    let group = delete_while_in_use(&p, &relay, &client, &host.id).await;
    relay.let_go(&group);
    // A new operator process remembers nothing; the orphan sweep lists by the cluster tag and
    // the instance no longer shows, so only the tag leads to the group.
    drop(p);
    let fresh = provider().await;
    assert!(fresh.list_by_tag(TAG_CLUSTER, &format!("cluster-{uid}")).await.unwrap().is_empty());
    assert!(!group_exists(&client, &group).await, "the swept host's group {group} leaked");
}

/// Groups tagged with `uid` (whoever made them).
async fn groups_tagged(client: &Client, uid: &str) -> Vec<String> {
    let filter = Filter::builder().name(format!("tag:{TAG_TUNNEL_UID}")).values(uid).build();
    let out = client.describe_security_groups().filters(filter).send().await.unwrap();
    out.security_groups().iter().filter_map(|g| g.group_id().map(str::to_string)).collect()
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_group_made_just_before_the_operator_died_is_deleted_once_its_launch_is_overdue() {
    let relay = Relay::start(endpoint()).await;
    let p = relayed(&relay).await;
    let client = client_in("us-east-1").await;
    let uid = contract::fresh_uid();
    relay.stall_launches.store(true, std::sync::atomic::Ordering::SeqCst);
    let launch = tokio::time::timeout(std::time::Duration::from_secs(5), p.create(&request("died", &uid))).await;
    assert!(launch.is_err(), "RunInstances answered: {launch:?}");
    drop(p);
    let left = groups_tagged(&client, &uid).await;
    assert_eq!(left.len(), 1, "the group made before the launch: {left:?}");
    let cluster = format!("cluster-{uid}");
    // A new operator process: a group this young may belong to a launch under way.
    provider().await.list_by_tag(TAG_CLUSTER, &cluster).await.unwrap();
    assert!(group_exists(&client, &left[0]).await, "a group whose launch may be under way was deleted");
    let mut overdue = settings();
    overdue.launch_grace = std::time::Duration::ZERO;
    let later = Ec2Provider::from_env(overdue).await.unwrap();
    assert!(later.list_by_tag(TAG_CLUSTER, &cluster).await.unwrap().is_empty());
    assert!(!group_exists(&client, &left[0]).await, "the group {} of a launch that never happened leaked", left[0]);
    // A launch that happened, whose group lost the instance tag (CreateTags failed): kept.
    let host = later.create(&request("launched", &uid)).await.unwrap();
    let group = group_of(&client, &host.id).await;
    let untag = aws_sdk_ec2::types::Tag::builder().key(providers::ec2::TAG_INSTANCE_ID).build();
    client.delete_tags().resources(&group).tags(untag).send().await.unwrap();
    assert_eq!(later.list_by_tag(TAG_CLUSTER, &cluster).await.unwrap().len(), 1);
    assert!(group_exists(&client, &group).await, "the group {group} of a running instance was deleted");
    later.delete(&host.id).await.unwrap();
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_second_host_removed_while_its_group_is_in_use_loses_its_group_later() {
    // find_host deletes extra hosts carrying a Tunnel's UID and later only lists by that UID.
    let relay = Relay::start(endpoint()).await;
    let p = relayed(&relay).await;
    let client = client_in("us-east-1").await;
    let uid = contract::fresh_uid();
    let keep = contract::create(&p, &request("keep", &uid)).await;
    let extra = contract::create(&p, &request("extra", &uid)).await;
    let group = delete_while_in_use(&p, &relay, &client, &extra.id).await;
    relay.let_go(&group);
    let listed = p.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap();
    assert_eq!(listed.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(), [keep.id.as_str()]);
    assert!(!group_exists(&client, &group).await, "the extra host's group {group} leaked");
    p.delete(&keep.id).await.unwrap();
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_tunnel_in_another_region_gets_its_host_there() {
    let p = provider().await;
    let here = client_in("us-east-1").await;
    let there = client_in(OTHER_REGION).await;
    let uid = contract::fresh_uid();
    let mut request = request("region", &uid);
    request.region = Some(OTHER_REGION.into());
    let created = contract::create(&p, &request).await;

    let tagged = || Filter::builder().name(format!("tag:{TAG_TUNNEL_UID}")).values(&uid).build();
    let found_there = there.describe_instances().filters(tagged()).send().await.unwrap();
    let found_here = here.describe_instances().filters(tagged()).send().await.unwrap();
    assert_eq!(found_there.reservations().len(), 1, "the instance runs in {OTHER_REGION}");
    assert!(found_here.reservations().is_empty(), "nothing in the default region");
    let instance = found_there.reservations()[0].instances()[0].clone();
    assert_eq!(instance.image_id(), Some("ami-0fedcba9876543210"), "that region's AMI");

    // get, list and delete find it again from the id alone.
    assert_eq!(p.get(&created.id).await.unwrap().map(|h| h.id), Some(created.id.clone()));
    let listed = provider().await.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap();
    assert_eq!(listed.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(), [created.id.as_str()]);
    let group = instance.security_groups()[0].group_id().unwrap().to_string();
    p.delete(&created.id).await.unwrap();
    assert_eq!(p.get(&created.id).await.unwrap(), None);
    assert!(!group_exists(&there, &group).await);
    // Each region has its own budget, and every call is still counted on the provider.
    assert!(p.limiter().counters.snapshot()["RunInstances"] >= 1);
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_region_without_an_ami_or_with_a_bad_name_is_refused_before_any_call() {
    let p = provider().await;
    let mut request = request("noami", &contract::fresh_uid());
    request.region = Some("ap-south-1".into());
    let e = p.create(&request).await.unwrap_err();
    assert!(matches!(&e, HostError::Invalid { message, .. } if message.contains("ap-south-1")), "{e}");
    request.region = Some("../../etc".into());
    assert!(matches!(p.create(&request).await, Err(HostError::Invalid { .. })));
    assert!(matches!(p.get("Not A Region/i-0123").await, Err(HostError::Invalid { .. })));
    assert_eq!(p.limiter().counters.total(), 0, "refused before spending a call");
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn instances_require_imdsv2_with_a_hop_limit_of_one() {
    let p = provider().await;
    let client = client_in("us-east-1").await;
    let created = contract::create(&p, &request("imds", &contract::fresh_uid())).await;
    let out = client.describe_instances().instance_ids(&created.id).send().await.unwrap();
    let instance = out.reservations()[0].instances()[0].clone();
    let options = instance.metadata_options().expect("metadata options");
    assert_eq!(options.http_tokens(), Some(&HttpTokensState::Required), "{options:?}");
    assert_eq!(options.http_put_response_hop_limit(), Some(1), "{options:?}");
    p.delete(&created.id).await.unwrap();
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn ec2_keeps_the_reserved_address_contract_with_elastic_ips() {
    let p = provider().await;
    let expect = contract::Expect {
        created_provisioning: false,
        polls_until_running: 3,
        interval: std::time::Duration::from_millis(200),
        public_address: true,
    };
    let base = request("eip", &contract::fresh_uid());
    contract::run_addresses(&p, &base, None, &expect).await;
    let outcomes = p.limiter().counters.outcomes();
    for call in ["AllocateAddress", "AssociateAddress", "ReleaseAddress"] {
        assert!(outcomes.get(&(call, "success")).is_some_and(|n| *n >= 1), "{call}: {outcomes:?}");
    }
}
