//! EC2 defaults on a real API (LocalStack): the Service's `loadBalancerSourceRanges` become the
//! Tunnel's `spec.sourceRanges` and its security group's sources, and follow every change; a
//! region without a default VPC fails the Tunnel with what to configure, buying nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::types::Filter;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams, PostParams};
use providers::HostProvider;
use providers::hosts::TAG_TUNNEL_UID;
use skyport::crd::{Tunnel, TunnelPhase};

use crate::common::tunnels::{TunnelOperator, events, fast_tunnel_settings, finish_tunnels, host_id, ready, service};
use crate::common::{TestNs, eventually};

const AMI: &str = "ami-0123456789abcdef0";
/// A region no other test uses: its default VPC is deleted here.
const NO_DEFAULT_VPC_REGION: &str = "ap-northeast-3";

fn ec2_service(ranges: &[&str]) -> Service {
    let mut svc = service(
        "web",
        Some("skyport.dev/tunnel"),
        serde_json::json!({"skyport.dev/provider": "ec2"}),
        serde_json::json!([{"name": "http", "port": 8080}]),
    );
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(ranges.iter().map(|r| r.to_string()).collect());
    svc
}

/// The sources of port 8080/TCP in the instance's security group.
async fn sources(ec2: &providers::Ec2Provider, instance: &str) -> BTreeSet<String> {
    let out = ec2.client().describe_instances().instance_ids(instance).send().await.unwrap();
    let group = out.reservations()[0].instances()[0].security_groups()[0].group_id().unwrap().to_string();
    let out = ec2.client().describe_security_groups().group_ids(group).send().await.unwrap();
    let port = out.security_groups()[0].ip_permissions().iter().filter(|p| p.from_port() == Some(8080));
    port.flat_map(|p| p.ip_ranges().iter().filter_map(|r| r.cidr_ip().map(str::to_string))).collect()
}

/// Waits until the Tunnel's host firewall has `want` applied (`status.sourceRanges`).
async fn applied(tunnels: &Api<Tunnel>, want: &[&str]) -> Tunnel {
    let want: Vec<String> = want.iter().map(|r| r.to_string()).collect();
    eventually(&format!("source ranges {want:?} applied"), Duration::from_secs(60), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        (t.status.as_ref()?.source_ranges.as_ref() == Some(&want)).then_some(t)
    })
    .await
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn the_services_source_ranges_reach_the_security_group_and_follow_its_changes() {
    let ns = TestNs::new("tun-ranges").await;
    let ec2 = Arc::new(providers::Ec2Provider::from_env(providers::Ec2Settings::new(AMI)).await.unwrap());
    let op = TunnelOperator::start_with(&ns, fast_tunnel_settings(), vec![ec2.clone()]).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    services.create(&PostParams::default(), &ec2_service(&["198.51.100.0/24"])).await.unwrap();

    let tunnel = applied(&tunnels, &["198.51.100.0/24"]).await;
    assert_eq!(tunnel.spec.source_ranges, ["198.51.100.0/24"], "the Service's ranges are the Tunnel's");
    let instance = host_id(&tunnel);
    assert_eq!(sources(&ec2, &instance).await, BTreeSet::from(["198.51.100.0/24".to_string()]));

    // The Service's ranges change: the same instance's group follows.
    let patch = serde_json::json!({"spec": {"loadBalancerSourceRanges": ["203.0.113.0/24", "192.0.2.0/24"]}});
    services.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let tunnel = applied(&tunnels, &["192.0.2.0/24", "203.0.113.0/24"]).await;
    assert_eq!(host_id(&tunnel), instance, "a range change costs no VM");
    assert_eq!(tunnel.spec.source_ranges, ["203.0.113.0/24", "192.0.2.0/24"]);
    let want = BTreeSet::from(["192.0.2.0/24".to_string(), "203.0.113.0/24".to_string()]);
    assert_eq!(sources(&ec2, &instance).await, want, "198.51.100.0/24 revoked, the new ones authorized");
    let on_service = events(&ns.client, &ns.name, "web").await;
    assert!(on_service.iter().any(|(r, _)| r == "SourceRangesChanged"), "{on_service:?}");

    // No ranges: anywhere.
    let patch = serde_json::json!({"spec": {"loadBalancerSourceRanges": null}});
    services.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    applied(&tunnels, &[]).await;
    assert_eq!(sources(&ec2, &instance).await, BTreeSet::from(["0.0.0.0/0".to_string()]));

    // A hand-written Tunnel with something that is not a CIDR is refused at admission.
    let bad: Tunnel = serde_json::from_value(serde_json::json!({
        "apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel", "metadata": {"name": "by-hand"},
        "spec": {"serviceRef": {"name": "web"}, "sourceRanges": ["10.0.0.0/33"]},
    }))
    .unwrap();
    let refused = tunnels.create(&PostParams::default(), &bad).await.expect_err("not a CIDR");
    assert!(refused.to_string().contains("sourceRanges must be CIDRs"), "{refused}");
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_region_without_a_default_vpc_fails_the_tunnel_with_what_to_set_and_buys_nothing() {
    let ns = TestNs::new("tun-novpc").await;
    let mut settings = providers::Ec2Settings::new(AMI);
    settings.region = Some(NO_DEFAULT_VPC_REGION.into());
    let ec2 = Arc::new(providers::Ec2Provider::from_env(settings).await.unwrap());
    let client = ec2.client().clone();
    let defaults = Filter::builder().name("isDefault").values("true").build();
    for vpc in client.describe_vpcs().filters(defaults).send().await.unwrap().vpcs() {
        let vpc = vpc.vpc_id().unwrap();
        let in_vpc = Filter::builder().name("vpc-id").values(vpc).build();
        for subnet in client.describe_subnets().filters(in_vpc).send().await.unwrap().subnets() {
            client.delete_subnet().subnet_id(subnet.subnet_id().unwrap()).send().await.unwrap();
        }
        client.delete_vpc().vpc_id(vpc).send().await.unwrap();
    }
    let op = TunnelOperator::start_with(&ns, fast_tunnel_settings(), vec![ec2.clone()]).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    services.create(&PostParams::default(), &ec2_service(&[])).await.unwrap();

    let (tunnel, message) = eventually("ProviderNoDefaultVpc", Duration::from_secs(30), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        let (_, reason, message) = ready(&t)?;
        (reason == "ProviderNoDefaultVpc").then_some((t, message))
    })
    .await;
    assert_eq!(tunnel.status.as_ref().unwrap().phase, Some(TunnelPhase::Failed));
    assert!(message.contains("has no default VPC") && message.contains("--ec2-subnet-ids"), "{message}");
    for involved in ["web-tunnel", "web"] {
        let seen = events(&ns.client, &ns.name, involved).await;
        assert!(seen.iter().any(|(r, _)| r == "ProviderNoDefaultVpc"), "{involved}: {seen:?}");
    }
    let uid = tunnel.metadata.uid.clone().unwrap();
    assert!(ec2.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().is_empty(), "no instance");
    let mine = Filter::builder().name(format!("tag:{TAG_TUNNEL_UID}")).values(&uid).build();
    let groups = client.describe_security_groups().filters(mine).send().await.unwrap();
    assert!(groups.security_groups().is_empty(), "no security group: {groups:?}");
    finish_tunnels(op, ns).await;
}
