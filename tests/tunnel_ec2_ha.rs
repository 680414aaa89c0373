//! A highly available Tunnel on EC2 (LocalStack) through the operator: two instances, each with
//! a secondary private IPv4 (their user data is pair_tests.rs and providers/tests/guest.rs), one
//! Elastic IP, and nothing left once the Service goes. LocalStack's instances run no exit server, so neither passes its
//! check and the Elastic IP stays unassigned; its moves are providers/tests/ec2_ha.rs.

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, PostParams};
use providers::HostProvider;
use providers::hosts::{MOVED_ADDRESS_SECONDARY, TAG_MOVED_ADDRESS, TAG_TUNNEL_SLOT, TAG_TUNNEL_UID};
use skyport::crd::Tunnel;

use crate::common::tunnels::{self, TunnelOperator, fast_tunnel_settings, finish_tunnels, ready, service};
use crate::common::{TestNs, eventually};

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_highly_available_tunnel_on_ec2_gets_two_instances_with_secondary_addresses_and_one_elastic_ip() {
    let ns = TestNs::new("tun-ec2-ha").await;
    let ec2 = std::sync::Arc::new(
        providers::Ec2Provider::from_env(providers::Ec2Settings::new("ami-0123456789abcdef0")).await.unwrap(),
    );
    let op = TunnelOperator::start_with(&ns, fast_tunnel_settings(), vec![ec2.clone()]).await;
    let (services, tunnels): (Api<Service>, Api<Tunnel>) = (ns.api(), ns.api());
    let annotations = serde_json::json!({
        "skyport.dev/provider": "ec2",
        "skyport.dev/address": "reserved",
        "skyport.dev/high-availability": "true",
    });
    let ports = serde_json::json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    services
        .create(&PostParams::default(), &service("web", Some("skyport.dev/tunnel"), annotations, ports))
        .await
        .unwrap();

    let tunnel = eventually("both servers of the pair, waiting for a tunnel", Duration::from_secs(60), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        let ha = t.status.as_ref()?.high_availability.as_ref()?;
        let both = ha.servers.len() == 2 && ha.servers.iter().all(|s| s.host_id.is_some() && s.host_ip.is_some());
        (both && ready(&t)?.1 == "WaitingForTunnel").then_some(t)
    })
    .await;
    let status = tunnel.status.clone().unwrap();
    let ha = status.high_availability.clone().unwrap();
    assert_eq!(ha.limitation, None, "EC2 moves the address");
    assert_eq!(ha.active, None, "no server passed its check, so none holds the address");
    let uid = tunnel.metadata.uid.clone().unwrap();

    let client = ec2.client();
    for server in &ha.servers {
        let id = server.host_id.clone().unwrap();
        let out = client.describe_instances().instance_ids(&id).send().await.unwrap();
        let instance = out.reservations()[0].instances()[0].clone();
        let tag = |k: &str| instance.tags().iter().find(|t| t.key() == Some(k)).and_then(|t| t.value());
        assert_eq!((tag(TAG_TUNNEL_SLOT), tag(TAG_TUNNEL_UID)), (Some(server.slot.as_str()), Some(uid.as_str())));
        assert_eq!(tag(TAG_MOVED_ADDRESS), Some(MOVED_ADDRESS_SECONDARY));
        let [eth0] = instance.network_interfaces() else { panic!("one interface: {instance:?}") };
        let secondary = eth0.private_ip_addresses().iter().filter(|a| a.primary() == Some(false)).count();
        assert_eq!(secondary, 1, "{id}: one secondary private IPv4");
        assert_eq!(instance.public_ip_address(), server.host_ip.as_deref(), "its own public IPv4, for its client");
    }
    let addresses = ec2.list_addresses_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap();
    let [address] = addresses.as_slice() else { panic!("one Elastic IP: {addresses:?}") };
    assert_eq!(status.address_id.as_deref(), Some(address.id.as_str()));
    assert_eq!(address.host_id, None);

    services.delete("web", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&tunnels, "web-tunnel").await;
    for server in &ha.servers {
        assert_eq!(ec2.get(server.host_id.as_deref().unwrap()).await.unwrap(), None, "the instance is terminated");
    }
    assert_eq!(ec2.get_address(&address.id).await.unwrap(), None, "the Elastic IP is released");
    finish_tunnels(op, ns).await;
}
