//! The Elastic IPs of an ExitServerPool's members on EC2 (`addressing: PerService`,
//! providers/src/ec2/members.rs), against the LocalStack that tests/env.sh starts, through the
//! relay that reports each Elastic IP at the private IPv4 its association named, as AWS does and
//! LocalStack does not (`ec2_support/relay.rs`). What LocalStack itself checks here: that
//! AssignPrivateIpAddresses adds a secondary private IPv4 to the instance's interface, that
//! AssociateAddress takes an existing allocation and instance, and the instance types' limits.

mod contract;
// Holding security groups is for ec2_defects.rs.
#[allow(dead_code)]
#[path = "ec2_support/relay.rs"]
mod relay;

use providers::ec2::{Ec2Provider, Ec2Settings};
use providers::hosts::{AddressRequest, HostProvider, TAG_CLUSTER, TAG_POOL_MEMBER, TAG_TUNNEL_UID, owner_tags};
use providers::{ErrorClass, HostError};
use relay::Relay;

/// The adapter, talking to LocalStack through `relay`.
async fn relayed(relay: &Relay) -> Ec2Provider {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut settings = Ec2Settings::new("ami-0123456789abcdef0");
    settings.endpoint_url = Some(relay.url.clone());
    Ec2Provider::from_env(settings).await.expect("provider")
}

fn endpoint() -> String {
    std::env::var("AWS_ENDPOINT_URL")
        .expect("AWS_ENDPOINT_URL is not set: run `eval \"$(tests/env.sh up)\"` or tests/run.sh")
}

/// The secondary private IPv4s of instance `id`'s interface, as EC2 lists them.
async fn secondaries(p: &Ec2Provider, id: &str) -> Vec<String> {
    let out = p.client().describe_instances().instance_ids(id).send().await.unwrap();
    let instance = out.reservations()[0].instances()[0].clone();
    let [eth0] = instance.network_interfaces() else { panic!("one interface: {instance:?}") };
    let listed = eth0.private_ip_addresses().iter().filter(|a| a.primary() != Some(true));
    listed.filter_map(|a| a.private_ip_address()).map(str::to_string).collect()
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn each_members_elastic_ip_takes_a_private_ip_of_its_own_and_a_departed_ones_is_reused() {
    let relay = Relay::start(endpoint()).await;
    let p = relayed(&relay).await;
    let uid = format!("pool-{:08x}", rand::random::<u32>());
    let mut request = contract::request(&format!("skyport-pool-{:06x}", rand::random::<u32>() >> 8), &uid);
    request.size = Some("c5.large".into());
    let host = contract::create(&p, &request).await;
    assert!(secondaries(&p, &host.id).await.is_empty(), "a pool's server starts with its primary address only");
    let member = |name: &str| {
        let mut tags = owner_tags(&uid, "skyport", "pool-shared");
        tags.insert(TAG_CLUSTER.into(), "test-cluster".into());
        tags.insert(TAG_POOL_MEMBER.into(), name.into());
        AddressRequest { name: format!("skyport-{name}"), region: None, tags, host_id: None, movable: true }
    };
    let a = p.reserve_address(&member("a")).await.unwrap();
    let b = p.reserve_address(&member("b")).await.unwrap();
    p.assign_address(&a.id, &host.id).await.unwrap();
    p.assign_address(&b.id, &host.id).await.unwrap();
    let made = secondaries(&p, &host.id).await;
    assert_eq!(made.len(), 2, "one private IPv4 per member: {made:?}");
    let (a_host, a_ip) = at(&p, &a.id).await;
    let (b_host, b_ip) = at(&p, &b.id).await;
    assert_eq!((a_host.as_deref(), b_host.as_deref()), (Some(host.id.as_str()), Some(host.id.as_str())));
    let (a_ip, b_ip) = (a_ip.expect("a's private IPv4"), b_ip.expect("b's private IPv4"));
    assert!(made.contains(&a_ip) && made.contains(&b_ip) && a_ip != b_ip, "{a_ip} {b_ip} {made:?}");
    // Already there: nothing moves and nothing is added, as the controller's retries need.
    p.assign_address(&a.id, &host.id).await.unwrap();
    assert_eq!((secondaries(&p, &host.id).await, at(&p, &a.id).await.1), (made.clone(), Some(a_ip.clone())));

    // A departed member's private IPv4 is the next member's: the interface does not grow.
    p.release_address(&a.id).await.unwrap();
    let c = p.reserve_address(&member("c")).await.unwrap();
    p.assign_address(&c.id, &host.id).await.unwrap();
    assert_eq!(at(&p, &c.id).await.1, Some(a_ip), "the freed private IPv4");
    assert_eq!(secondaries(&p, &host.id).await, made);

    for address in [&b, &c] {
        p.release_address(&address.id).await.unwrap();
    }
    p.delete(&host.id).await.unwrap();
    assert!(p.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().is_empty());
}

/// How many members one server holds: its type's IPv4 addresses per interface, less the primary;
/// a type EC2 does not know is a permanent error naming it.
#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_servers_member_limit_is_its_types_addresses_per_interface_less_its_own() {
    let relay = Relay::start(endpoint()).await;
    let p = relayed(&relay).await;
    assert_eq!(p.member_addresses_limit(None, None).await.unwrap(), Some(1), "t3.nano, the default: two");
    assert_eq!(p.member_addresses_limit(None, Some("c5.large")).await.unwrap(), Some(9));
    let e: HostError = p.member_addresses_limit(None, Some("t3.bogus")).await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
    assert!(e.to_string().contains("t3.bogus"), "{e}");
}

/// Where an address is attached, and to which private IPv4.
async fn at(p: &Ec2Provider, id: &str) -> (Option<String>, Option<String>) {
    let address = p.get_address(id).await.unwrap().expect("the address");
    (address.host_id, address.private_ip)
}
