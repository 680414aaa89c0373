//! Where EC2 exit servers go and who may reach them, against the LocalStack that tests/env.sh
//! starts: configured subnets (the VPC derived from them, a pair's instances in different zones),
//! a region without a default VPC, and security groups that admit the Service's ports only from
//! its source ranges.
//!
//! LocalStack (moto) lets a group of one VPC be attached to an instance in a subnet of another
//! (AWS refuses it), so the group's VPC is checked explicitly. It creates a security group in a
//! region without a default VPC (AWS refuses that with `VPCIdNotSpecified`) and fails only the
//! launch; the region's lookup must stop before either.

mod contract;

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::Client;
use aws_sdk_ec2::types::Filter;
use providers::ec2::{Ec2Provider, Ec2Settings};
use providers::exit::userdata::{Protocol, TunnelService};
use providers::hosts::{HostProvider, HostRequest, Spread};
use providers::{ErrorClass, HostError};

const AMI: &str = "ami-0123456789abcdef0";
/// A region no other test uses: its default VPC is deleted here.
const NO_DEFAULT_VPC_REGION: &str = "ap-southeast-4";

async fn provider_with(region: Option<&str>, subnets: Vec<String>) -> Ec2Provider {
    let endpoint = std::env::var("AWS_ENDPOINT_URL")
        .expect("AWS_ENDPOINT_URL is not set: run `eval \"$(tests/env.sh up)\"` or tests/run.sh");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut settings = Ec2Settings::new(AMI);
    settings.endpoint_url = Some(endpoint);
    settings.region = region.map(str::to_string);
    settings.subnet_ids = subnets;
    Ec2Provider::from_env(settings).await.expect("provider")
}

fn request(test: &str) -> HostRequest {
    contract::request(&format!("skyport-{test}-{:06x}", rand::random::<u32>() >> 8), &contract::fresh_uid())
}

/// (protocol, port, source) of every rule of `group`.
async fn rules(client: &Client, group: &str) -> BTreeSet<(String, i32, String)> {
    let out = client.describe_security_groups().group_ids(group).send().await.unwrap();
    let mut rules = BTreeSet::new();
    for p in out.security_groups()[0].ip_permissions() {
        let sources = p.ip_ranges().iter().filter_map(|r| r.cidr_ip());
        for cidr in sources.chain(p.ipv6_ranges().iter().filter_map(|r| r.cidr_ipv6())) {
            rules.insert((p.ip_protocol().unwrap().to_string(), p.from_port().unwrap(), cidr.to_string()));
        }
    }
    rules
}

fn rule(protocol: &str, port: i32, cidr: &str) -> (String, i32, String) {
    (protocol.to_string(), port, cidr.to_string())
}

/// The instance's subnet, VPC and (only) security group.
async fn placement(client: &Client, id: &str) -> (String, String, String) {
    let out = client.describe_instances().instance_ids(id).send().await.unwrap();
    let i = &out.reservations()[0].instances()[0];
    let group = i.security_groups()[0].group_id().unwrap().to_string();
    (i.subnet_id().unwrap_or_default().to_string(), i.vpc_id().unwrap_or_default().to_string(), group)
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_configured_subnet_takes_the_instance_and_its_security_group_into_the_subnets_vpc() {
    let raw = provider_with(None, Vec::new()).await;
    let client = raw.client().clone();
    let octet = 100 + rand::random::<u8>() % 100;
    let vpc = client.create_vpc().cidr_block(format!("10.{octet}.0.0/16")).send().await.unwrap();
    let vpc = vpc.vpc().unwrap().vpc_id().unwrap().to_string();
    let subnet = client.create_subnet().vpc_id(&vpc).cidr_block(format!("10.{octet}.1.0/24")).send().await.unwrap();
    let subnet = subnet.subnet().unwrap().subnet_id().unwrap().to_string();

    // Only the subnet is configured: the group's VPC comes from it.
    let p = provider_with(None, vec![subnet.clone()]).await;
    let host = contract::create(&p, &request("subnet")).await;
    let (in_subnet, in_vpc, group) = placement(&client, &host.id).await;
    assert_eq!((in_subnet.as_str(), in_vpc.as_str()), (subnet.as_str(), vpc.as_str()));
    let out = client.describe_security_groups().group_ids(&group).send().await.unwrap();
    assert_eq!(out.security_groups()[0].vpc_id(), Some(vpc.as_str()), "the group is in the subnet's VPC");
    let outcomes = p.limiter().counters.outcomes();
    assert_eq!(outcomes.get(&("DescribeSubnets", "success")), Some(&1), "{outcomes:?}");

    // A second launch uses the subnet looked up once.
    let second = contract::create(&p, &request("subnet2")).await;
    assert_eq!(placement(&client, &second.id).await.0, subnet);
    assert_eq!(p.limiter().counters.outcomes().get(&("DescribeSubnets", "success")), Some(&1));

    // A launch EC2 refuses after the group was made (the subnet went away meanwhile) leaves no
    // group behind and is permanent.
    p.delete(&host.id).await.unwrap();
    p.delete(&second.id).await.unwrap();
    client.delete_subnet().subnet_id(&subnet).send().await.unwrap();
    let refused = request("gone-subnet");
    let e = p.create(&refused).await.expect_err("the subnet is gone");
    assert!(matches!(e, HostError::Invalid { .. }) && e.to_string().contains("InvalidSubnetID.NotFound"), "{e}");
    assert_eq!(e.class(), ErrorClass::Permanent);
    let named = Filter::builder().name("tag:Name").values(&refused.name).build();
    let left = client.describe_security_groups().filters(named).send().await.unwrap();
    assert!(left.security_groups().is_empty(), "the group made for the launch is deleted again: {left:?}");
    client.delete_vpc().vpc_id(&vpc).send().await.unwrap();

    // A subnet that does not exist is named before anything is made.
    let p = provider_with(None, vec!["subnet-0000000000000dead".into()]).await;
    let e = p.create(&request("no-subnet")).await.expect_err("no such subnet");
    assert!(e.to_string().contains("subnet-0000000000000dead (--ec2-subnet-ids)"), "{e}");
    assert!(!p.limiter().counters.outcomes().contains_key(&("CreateSecurityGroup", "success")));
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_pairs_instances_go_to_subnets_in_different_zones_and_say_which() {
    let raw = provider_with(None, Vec::new()).await;
    let client = raw.client().clone();
    assert!(matches!(raw.capabilities().spread, Spread::No(why) if why.contains("--ec2-subnet-ids")));
    // The default VPC's subnets, one per zone: the first two zones.
    let defaults = Filter::builder().name("default-for-az").values("true").build();
    let out = client.describe_subnets().filters(defaults).send().await.unwrap();
    let by_zone: BTreeMap<&str, &str> =
        out.subnets().iter().filter_map(|s| Some((s.availability_zone()?, s.subnet_id()?))).collect();
    let [(zone_a, a), (zone_b, b)] =
        [0, 1].map(|i| by_zone.iter().nth(i).map(|(z, s)| (z.to_string(), s.to_string())).unwrap());

    let p = provider_with(None, vec![a.clone(), b.clone()]).await;
    assert_eq!(p.capabilities().spread, Spread::Zones);
    // The subnets are the default region's: a Tunnel elsewhere is not spread, and says so.
    assert_eq!(p.spread_in(None), Spread::Zones);
    let elsewhere = if p.default_region() == Some("eu-central-1") { "eu-west-1" } else { "eu-central-1" };
    assert!(matches!(p.spread_in(Some(elsewhere)), Spread::No(why) if why.contains("default region")));
    let mut made = Vec::new();
    for (domain, subnet, zone) in [(Some(0), &a, &zone_a), (Some(1), &b, &zone_b), (None, &a, &zone_a)] {
        let mut slot = request("zone");
        slot.failure_domain = domain;
        let host = contract::create(&p, &slot).await;
        assert_eq!(&placement(&client, &host.id).await.0, subnet, "failure domain {domain:?}");
        assert_eq!(host.placement.as_deref(), Some(zone.as_str()), "as created");
        assert_eq!(p.get(&host.id).await.unwrap().unwrap().placement.as_deref(), Some(zone.as_str()), "as read back");
        made.push(host.id);
    }
    for id in made {
        p.delete(&id).await.unwrap();
    }

    // Two subnets of one zone would look spread and not be; two VPCs cannot share a group.
    let octet = 100 + rand::random::<u8>() % 100;
    let vpc = client.create_vpc().cidr_block(format!("10.{octet}.0.0/16")).send().await.unwrap();
    let vpc = vpc.vpc().unwrap().vpc_id().unwrap().to_string();
    let mut own = Vec::new();
    for third in [1, 2] {
        let made = client
            .create_subnet()
            .vpc_id(&vpc)
            .availability_zone(&zone_a)
            .cidr_block(format!("10.{octet}.{third}.0/24"));
        own.push(made.send().await.unwrap().subnet().unwrap().subnet_id().unwrap().to_string());
    }
    for (subnets, expected) in
        [(own.clone(), "both in availability zone"), (vec![a.clone(), own[0].clone()], "different VPCs")]
    {
        let p = provider_with(None, subnets.clone()).await;
        let e = p.create(&request("refused-subnets")).await.expect_err("refused");
        assert!(matches!(e, HostError::Invalid { .. }) && e.to_string().contains(expected), "{subnets:?}: {e}");
        assert!(!p.limiter().counters.outcomes().contains_key(&("CreateSecurityGroup", "success")), "nothing made");
    }
    for subnet in own {
        client.delete_subnet().subnet_id(subnet).send().await.unwrap();
    }
    client.delete_vpc().vpc_id(&vpc).send().await.unwrap();
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_region_without_a_default_vpc_says_to_set_a_subnet_and_makes_nothing() {
    let p = provider_with(Some(NO_DEFAULT_VPC_REGION), Vec::new()).await;
    let client = p.client().clone();
    let defaults = Filter::builder().name("isDefault").values("true").build();
    for vpc in client.describe_vpcs().filters(defaults).send().await.unwrap().vpcs() {
        let vpc = vpc.vpc_id().unwrap();
        let in_vpc = Filter::builder().name("vpc-id").values(vpc).build();
        for subnet in client.describe_subnets().filters(in_vpc).send().await.unwrap().subnets() {
            client.delete_subnet().subnet_id(subnet.subnet_id().unwrap()).send().await.unwrap();
        }
        client.delete_vpc().vpc_id(vpc).send().await.unwrap();
    }

    let request = request("no-default-vpc");
    let e = p.create(&request).await.expect_err("no default VPC, no subnet");
    assert!(matches!(e, HostError::NoDefaultVpc { .. }), "{e:?}");
    assert_eq!(e.class(), ErrorClass::Permanent, "a setting to change, not a blip to retry");
    let text = e.to_string();
    assert!(text.contains(&format!("region {NO_DEFAULT_VPC_REGION} has no default VPC")), "{text}");
    assert!(text.contains("--ec2-subnet-ids") && text.contains("tunnel.ec2SubnetIds"), "{text}");
    let named = Filter::builder().name("tag:Name").values(&request.name).build();
    let groups = client.describe_security_groups().filters(named).send().await.unwrap();
    assert!(groups.security_groups().is_empty(), "no security group made: {groups:?}");
    let outcomes = p.limiter().counters.outcomes();
    assert!(!outcomes.keys().any(|(op, _)| *op == "RunInstances" || *op == "CreateSecurityGroup"), "{outcomes:?}");
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn the_security_group_admits_service_ports_only_from_their_source_ranges_and_follows_changes() {
    let p = provider_with(None, Vec::new()).await;
    let mut request = request("ranges");
    let ranges = |list: &[&str]| list.iter().map(|r| r.to_string()).collect::<Vec<_>>();
    request.server.services[0].source_ranges = ranges(&["198.51.100.0/24", "203.0.113.7/32"]);
    request.server.services.push(TunnelService {
        name: "skyport-health".into(),
        protocol: Protocol::Tcp,
        port: 2334,
        token: "tok".into(),
        source_ranges: Vec::new(),
        proxy_protocol: None,
        bind: None,
    });
    let host = contract::create(&p, &request).await;
    let (_, _, group) = placement(p.client(), &host.id).await;
    let open = [rule("tcp", 2333, "0.0.0.0/0"), rule("tcp", 2334, "0.0.0.0/0"), rule("tcp", 2335, "0.0.0.0/0")];
    let with = |service: &[(String, i32, String)]| open.iter().chain(service).cloned().collect::<BTreeSet<_>>();
    assert_eq!(
        rules(p.client(), &group).await,
        with(&[rule("tcp", 80, "198.51.100.0/24"), rule("tcp", 80, "203.0.113.7/32")]),
        "the Service's port from its ranges only; control, health and push ports from anywhere"
    );

    // Ranges changed: the removed one revoked, the added one authorized (host bits cleared).
    let mut server = request.server.clone();
    server.services[0].source_ranges = ranges(&["203.0.113.7/32", "192.0.2.9/24"]);
    assert!(p.sync_source_ranges(&host.id, &server).await.unwrap(), "EC2 enforces the ranges");
    assert_eq!(
        rules(p.client(), &group).await,
        with(&[rule("tcp", 80, "192.0.2.0/24"), rule("tcp", 80, "203.0.113.7/32")])
    );
    // No ranges: anywhere again.
    server.services[0].source_ranges.clear();
    p.sync_source_ranges(&host.id, &server).await.unwrap();
    assert_eq!(rules(p.client(), &group).await, with(&[rule("tcp", 80, "0.0.0.0/0")]));
    p.delete(&host.id).await.unwrap();
    assert!(matches!(p.sync_source_ranges(&host.id, &server).await, Err(HostError::NotFound { .. })));
}
