//! A highly available Tunnel's Elastic IP on EC2, against the LocalStack that tests/env.sh
//! starts: the pair's two instances each get a secondary private IPv4 at creation, and the
//! Elastic IP moves between them and back (providers/src/ec2/secondary.rs).
//!
//! What LocalStack's EC2 (moto) checks here, and what it does not (it boots no VM):
//! - AssignPrivateIpAddresses with `SecondaryPrivateIpAddressCount` adds a private IPv4 of the
//!   subnet to the interface, and DescribeInstances lists it as not primary: checked.
//! - AssociateAddress needs an existing allocation and instance, records the instance and its
//!   interface (DescribeAddresses `InstanceId`, `NetworkInterfaceId`) and moves an associated
//!   address with `AllowReassociation`: checked.
//! - AssociateAddress's `PrivateIpAddress` is accepted and ignored (even one the interface does
//!   not have): LocalStack associates with the primary private IPv4 and, keeping one public IPv4
//!   per interface, shows the Elastic IP as the instance's public IPv4 instead of its own, and
//!   still there after the address moved on. So that each server keeps its own public IPv4 is
//!   not observable here; the request naming the secondary address is a unit test
//!   (`ec2::secondary`), and the controller's handling of it a controller test
//!   (`pair_tests.rs`) and the operator's failover here (`tests/tunnel_ec2_ha.rs`, each server
//!   checked at its own address as recorded in status).

mod contract;
mod ec2_support;

use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
use ec2_support::{AMI, provider};
use providers::ec2::Ec2Provider;
use providers::hosts::{
    AddressRequest, HostProvider, HostRequest, MOVED_ADDRESS_SECONDARY, TAG_CLUSTER, TAG_MOVED_ADDRESS,
    TAG_TUNNEL_SLOT, TAG_TUNNEL_UID, owner_tags,
};

fn slot_request(uid: &str, slot: &str) -> HostRequest {
    let mut request = contract::request(&format!("skyport-ha-{slot}-{:06x}", rand::random::<u32>() >> 8), uid);
    request.tags.insert(TAG_TUNNEL_SLOT.into(), slot.into());
    request.tags.insert(TAG_MOVED_ADDRESS.into(), MOVED_ADDRESS_SECONDARY.into());
    request
}

/// (interface id, primary private IPv4, secondary private IPv4s) of instance `id`'s interface.
async fn private_ips(p: &Ec2Provider, id: &str) -> (String, String, Vec<String>) {
    let out = p.client().describe_instances().instance_ids(id).send().await.unwrap();
    let instance = out.reservations()[0].instances()[0].clone();
    let [eth0] = instance.network_interfaces() else { panic!("one interface: {instance:?}") };
    let (primary, secondary): (Vec<_>, Vec<_>) =
        eth0.private_ip_addresses().iter().partition(|a| a.primary() == Some(true));
    let ip = |a: &&aws_sdk_ec2::types::InstancePrivateIpAddress| a.private_ip_address().unwrap().to_string();
    (eth0.network_interface_id().unwrap().to_string(), ip(&primary[0]), secondary.iter().map(ip).collect())
}

/// (instance, interface) the Elastic IP `allocation` is associated with, as EC2 describes it.
async fn associated(p: &Ec2Provider, allocation: &str) -> (Option<String>, Option<String>) {
    let out = p.client().describe_addresses().allocation_ids(allocation).send().await.unwrap();
    let a = &out.addresses()[0];
    (a.instance_id().map(str::to_string), a.network_interface_id().map(str::to_string))
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn the_pairs_elastic_ip_moves_between_secondary_addresses_and_back() {
    let p = provider().await;
    let uid = format!("ha-{:08x}", rand::random::<u32>());
    let a = contract::create(&p, &slot_request(&uid, "a")).await;
    let b = contract::create(&p, &slot_request(&uid, "b")).await;
    let (a_eni, a_primary, a_secondary) = private_ips(&p, &a.id).await;
    let (b_eni, _, b_secondary) = private_ips(&p, &b.id).await;
    assert_eq!((a_secondary.len(), b_secondary.len()), (1, 1), "one secondary private IPv4 each, made at creation");
    assert_ne!(a_secondary[0], a_primary);

    let mut tags = owner_tags(&uid, "team-a", "web");
    tags.insert(TAG_CLUSTER.into(), "test-cluster".into());
    let request = AddressRequest { name: "skyport-ha".into(), region: None, tags, host_id: None, movable: true };
    let address = p.reserve_address(&request).await.unwrap();

    p.assign_address(&address.id, &a.id).await.unwrap();
    assert_eq!(p.get_address(&address.id).await.unwrap().unwrap().host_id.as_deref(), Some(a.id.as_str()));
    assert_eq!(associated(&p, &address.id).await, (Some(a.id.clone()), Some(a_eni.clone())));
    // Already there: success, as the controller's retries need.
    p.assign_address(&address.id, &a.id).await.unwrap();

    p.assign_address(&address.id, &b.id).await.unwrap();
    assert_eq!(p.get_address(&address.id).await.unwrap().unwrap().host_id.as_deref(), Some(b.id.as_str()));
    assert_eq!(associated(&p, &address.id).await, (Some(b.id.clone()), Some(b_eni)));

    p.assign_address(&address.id, &a.id).await.unwrap();
    assert_eq!(associated(&p, &address.id).await, (Some(a.id.clone()), Some(a_eni)));
    // Moving never added addresses to the interfaces.
    assert_eq!(private_ips(&p, &a.id).await.2, a_secondary);
    assert_eq!(private_ips(&p, &b.id).await.2, b_secondary);

    p.release_address(&address.id).await.unwrap();
    assert_eq!(p.get_address(&address.id).await.unwrap(), None);
    p.release_address(&address.id).await.unwrap();
    for host in [&a, &b] {
        p.delete(&host.id).await.unwrap();
    }
    assert!(p.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().is_empty());
}

/// A pair's instance without a secondary address (its assignment at creation failed and it could
/// not be deleted) gets one when the Elastic IP first moves onto it; an instance of no pair takes
/// the address on its primary private IPv4 and gets nothing added.
#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_pairs_instance_without_a_secondary_address_gets_one_at_the_first_move() {
    let p = provider().await;
    let uid = format!("ha-{:08x}", rand::random::<u32>());
    let launch = |slot: Option<&str>| {
        let mut tags = vec![Tag::builder().key(TAG_TUNNEL_UID).value(&uid).build()];
        tags.extend(slot.map(|s| Tag::builder().key(TAG_TUNNEL_SLOT).value(s).build()));
        tags.extend(slot.map(|_| Tag::builder().key(TAG_MOVED_ADDRESS).value(MOVED_ADDRESS_SECONDARY).build()));
        let spec = TagSpecification::builder().resource_type(ResourceType::Instance).set_tags(Some(tags)).build();
        p.client().run_instances().image_id(AMI).min_count(1).max_count(1).tag_specifications(spec).send()
    };
    let bare = launch(Some("a")).await.unwrap().instances()[0].instance_id().unwrap().to_string();
    let single = launch(None).await.unwrap().instances()[0].instance_id().unwrap().to_string();
    assert!(private_ips(&p, &bare).await.2.is_empty());

    let tags = owner_tags(&uid, "team-a", "web");
    let request = AddressRequest { name: "skyport-ha".into(), region: None, tags, host_id: None, movable: true };
    let address = p.reserve_address(&request).await.unwrap();
    p.assign_address(&address.id, &bare).await.unwrap();
    assert_eq!(private_ips(&p, &bare).await.2.len(), 1);
    assert_eq!(associated(&p, &address.id).await.0.as_deref(), Some(bare.as_str()));
    p.assign_address(&address.id, &bare).await.unwrap();
    assert_eq!(private_ips(&p, &bare).await.2.len(), 1, "never a second one");

    p.assign_address(&address.id, &single).await.unwrap();
    assert!(private_ips(&p, &single).await.2.is_empty());
    assert_eq!(associated(&p, &address.id).await.0.as_deref(), Some(single.as_str()));

    p.release_address(&address.id).await.unwrap();
    for id in [&bare, &single] {
        p.delete(id).await.unwrap();
    }
}
