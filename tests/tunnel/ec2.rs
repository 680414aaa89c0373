//! A Tunnel on EC2 (LocalStack): its instance, tags and security group, and what deleting the
//! Service removes.

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, PostParams};
use providers::HostProvider;
use skyport::crd::{Tunnel, TunnelPhase};

use crate::common::tunnels::{
    self, TunnelOperator, fast_tunnel_settings, finish_tunnels, host_id, ingress_ip, ready, service,
};
use crate::common::{TestNs, eventually};

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_tunnel_on_ec2_gets_an_instance_with_its_own_security_group_and_the_service_its_address() {
    let ns = TestNs::new("tun-ec2").await;
    let ec2 = std::sync::Arc::new(
        providers::Ec2Provider::from_env(providers::Ec2Settings::new("ami-0123456789abcdef0")).await.unwrap(),
    );
    let settings = skyport::config::TunnelArgs { allowed_sizes: vec!["t3.micro".into()], ..fast_tunnel_settings() };
    let op = TunnelOperator::start_with(&ns, settings, vec![ec2.clone()]).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    let svc = service(
        "web",
        Some("skyport.dev/tunnel"),
        serde_json::json!({"skyport.dev/provider": "ec2", "skyport.dev/size": "t3.micro"}),
        serde_json::json!([{"name": "http", "port": 8080}, {"name": "dns", "port": 5353, "protocol": "UDP"}]),
    );
    services.create(&PostParams::default(), &svc).await.unwrap();

    // LocalStack's instances are running at once, with a public-looking address, but run no
    // exit server: the tunnel never passes its health check, so the address is never published.
    let tunnel = eventually("Tunnel waiting for its tunnel on a running instance", Duration::from_secs(60), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        (t.status.as_ref()?.host_ip.is_some() && ready(&t)?.1 == "WaitingForTunnel").then_some(t)
    })
    .await;
    let status = tunnel.status.clone().unwrap();
    assert_eq!(status.provider.as_deref(), Some("ec2"));
    assert_eq!(status.phase, Some(TunnelPhase::Provisioning));
    let id = host_id(&tunnel);
    assert!(id.starts_with("i-"), "{id}");
    assert_eq!(ingress_ip(&services.get("web").await.unwrap()), None, "no address before the tunnel is through");

    // The instance: owner and cluster tags, the requested size, a security group with exactly
    // the control, health and push ports and the Service's ports.
    let client = ec2.client();
    let out = client.describe_instances().instance_ids(&id).send().await.unwrap();
    let instance = out.reservations()[0].instances()[0].clone();
    assert_eq!(instance.instance_type().map(|t| t.as_str()), Some("t3.micro"));
    let tag = |k: &str| instance.tags().iter().find(|t| t.key() == Some(k)).and_then(|t| t.value()).map(str::to_string);
    assert_eq!(tag("skyport.dev/tunnel-uid"), tunnel.metadata.uid.clone());
    assert_eq!(tag("skyport.dev/cluster"), Some(op.ctx.cluster_id.clone()));
    let group = instance.security_groups()[0].group_id().unwrap().to_string();
    let groups = client.describe_security_groups().group_ids(&group).send().await.unwrap();
    let mut rules: Vec<(String, i32)> = groups.security_groups()[0]
        .ip_permissions()
        .iter()
        .map(|p| (p.ip_protocol().unwrap_or_default().to_string(), p.from_port().unwrap_or_default()))
        .collect();
    rules.sort();
    assert_eq!(
        rules,
        [
            ("tcp".to_string(), 2333),
            ("tcp".to_string(), 2334),
            ("tcp".to_string(), 2335),
            ("tcp".to_string(), 8080),
            ("udp".to_string(), 5353)
        ]
    );

    // Deleting the Service: instance terminated, group deleted, nothing of this UID left.
    services.delete("web", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&tunnels, "web-tunnel").await;
    assert_eq!(ec2.get(&id).await.unwrap(), None, "instance terminated");
    // Unknown group ids are an error (InvalidGroup.NotFound) or, on some emulators, an empty list.
    let left = client
        .describe_security_groups()
        .group_ids(&group)
        .send()
        .await
        .map(|o| o.security_groups().len())
        .unwrap_or(0);
    assert_eq!(left, 0, "the tunnel's security group is deleted");
    finish_tunnels(op, ns).await;
}
