//! A highly available Tunnel on EC2 (LocalStack) through the operator: two instances, each with
//! a secondary private IPv4 (their user data is pair_tests.rs and providers/tests/guest.rs), one
//! Elastic IP, and nothing left once the Service goes. With the real check nothing answers
//! (LocalStack runs no exit server), so the Elastic IP stays unassigned; the failover tests check
//! with a stand-in for the exit servers ([`pair::StandIn`]), everything else real.
//!
//! What LocalStack shows and what it does not: DescribeAddresses names the instance the Elastic
//! IP is on, but LocalStack ignores AssociateAddress's `PrivateIpAddress` and records the primary
//! private IPv4 (the request naming the secondary one is the unit test in `ec2::secondary`); it
//! reports the Elastic IP as the public IPv4 of every instance it was on, which is why each
//! server is checked at the own address recorded in status, the one its client dials.

mod pair;

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, PostParams};
use providers::HostProvider;
use providers::hosts::{MOVED_ADDRESS_SECONDARY, TAG_MOVED_ADDRESS, TAG_TUNNEL_SLOT, TAG_TUNNEL_UID};
use skyport::crd::Tunnel;

use crate::common::tunnels::{self, TunnelOperator, fast_tunnel_settings, finish_tunnels, ready};
use crate::common::{TestNs, eventually};
use pair::Ec2Pair;

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_highly_available_tunnel_on_ec2_gets_two_instances_with_secondary_addresses_and_one_elastic_ip() {
    let ns = TestNs::new("tun-ec2-ha").await;
    // Given subnets in two zones, as a platform team spreading its pairs.
    let mut settings = providers::Ec2Settings::new("ami-0123456789abcdef0");
    settings.subnet_ids = two_zones().await;
    let ec2 = std::sync::Arc::new(providers::Ec2Provider::from_env(settings).await.unwrap());
    let op = TunnelOperator::start_with(&ns, fast_tunnel_settings(), vec![ec2.clone()]).await;
    let (services, tunnels): (Api<Service>, Api<Tunnel>) = (ns.api(), ns.api());
    services.create(&PostParams::default(), &pair::web()).await.unwrap();

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
    let zones: Vec<Option<&str>> = ha.servers.iter().map(|s| s.placement.as_deref()).collect();
    assert!(zones.iter().all(Option::is_some) && zones[0] != zones[1], "{zones:?}");
    assert!(ha.spread.as_deref().is_some_and(|s| s.starts_with("in different zones")), "{:?}", ha.spread);
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
        let zone = instance.placement().and_then(|p| p.availability_zone());
        assert_eq!(zone, server.placement.as_deref(), "{id}: the zone EC2 reports");
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

/// Two of the default VPC's subnets, in different zones.
async fn two_zones() -> Vec<String> {
    let any = providers::Ec2Provider::from_env(providers::Ec2Settings::new("ami-0123456789abcdef0")).await.unwrap();
    let defaults = aws_sdk_ec2::types::Filter::builder().name("default-for-az").values("true").build();
    let out = any.client().describe_subnets().filters(defaults).send().await.unwrap();
    let by_zone: std::collections::BTreeMap<&str, &str> =
        out.subnets().iter().filter_map(|s| Some((s.availability_zone()?, s.subnet_id()?))).collect();
    by_zone.values().take(2).map(|s| s.to_string()).collect()
}

/// Warning Events `reason` on the Tunnel.
async fn warnings(p: &Ec2Pair, reason: &str) -> Vec<String> {
    let api: Api<k8s_openapi::api::core::v1::Event> = p.ns.api();
    let events = api.list(&Default::default()).await.unwrap().items.into_iter();
    let on_tunnel = events.filter(|e| e.involved_object.name.as_deref() == Some("web-tunnel"));
    let warning = on_tunnel.filter(|e| e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some(reason));
    warning.map(|e| e.message.unwrap_or_default()).collect()
}

/// The Tunnel once its status records a failover off `from`.
async fn failed_over(p: &Ec2Pair, from: &str, n: u32) -> Tunnel {
    eventually(&format!("failover {n} recorded in status"), Duration::from_secs(30), || async {
        let t = p.tunnels.get("web-tunnel").await.ok()?;
        let ha = pair::ha(&t);
        (ha.failovers == Some(n) && ha.last_failover.as_ref()?.from == from).then_some(t)
    })
    .await
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn on_ec2_the_elastic_ip_moves_at_once_off_a_terminated_instance_whose_slot_is_filled_again() {
    let p = Ec2Pair::start("tun-ec2-fo").await;
    let (active, standby) = (p.active.clone(), p.standby.clone());
    let (instance, private_ip) = p.associated().await;
    assert_eq!(instance.as_deref(), Some(active.as_str()), "DescribeAddresses: on the active instance");
    let out = p.ec2.client().describe_instances().instance_ids(&active).send().await.unwrap();
    let eth0 = &out.reservations()[0].instances()[0].network_interfaces()[0];
    let ips: Vec<_> = eth0.private_ip_addresses().iter().filter_map(|a| a.private_ip_address()).collect();
    assert!(private_ip.as_deref().is_some_and(|ip| ips.contains(&ip)), "{private_ip:?} of {ips:?}");
    for id in [&active, &standby] {
        assert_eq!(p.secondary_ips(id).await.len(), 1, "{id}: one secondary private IPv4");
    }
    // Onto the active instance's secondary address, as the operator asked (LocalStack records
    // the primary one in DescribeAddresses, above).
    let onto_secondary = (active.clone(), p.secondary_ips(&active).await[0].clone());
    assert_eq!(p.associations(), [onto_secondary]);
    let t = p.tunnel().await;
    assert_eq!(pair::ha(&t).active.as_deref(), Some(active.as_str()));
    let own = p.own_addresses(&[]).await;
    let web = p.services.get("web").await.unwrap();
    assert_eq!(tunnels::ingress_ip(&web).as_deref(), Some(p.ip.as_str()), "the Service shows the Elastic IP");
    let message = ready(&t).unwrap().2;
    assert!(message.contains(&format!("at its own address {} (not through", own[&active])), "{message}");

    // Terminated behind the operator's back: the Elastic IP goes to the standby at once.
    let started = std::time::Instant::now();
    p.terminate(&active).await;
    let (after, to) = p.moved_off(&active, started).await;
    println!("Elastic IP on the standby {:.2} s after the active instance was terminated", after.as_secs_f64());
    assert_eq!(to, standby);
    let moved = p.associations().last().cloned().unwrap();
    assert_eq!(moved, (standby.clone(), p.secondary_ips(&standby).await[0].clone()), "onto its secondary address");
    let t = failed_over(&p, &active, 1).await;
    let last = pair::ha(&t).last_failover.unwrap();
    assert_eq!(last.to, standby);
    assert!(last.reason.contains("not running"), "{last:?}");
    let failovers = warnings(&p, "Failover").await;
    assert!(failovers.iter().any(|m| m.contains(&active) && m.contains(&standby)), "{failovers:?}");
    assert_eq!(tunnels::ingress_ip(&p.services.get("web").await.unwrap()).as_deref(), Some(p.ip.as_str()));

    // The terminated slot gets a new instance, with its secondary address; once its server
    // answers it is the passing standby, and the Elastic IP stays where it is.
    let now = p.own_addresses(&[&active]).await;
    assert!(now.contains_key(&standby), "{now:?}");
    let fresh = now.keys().find(|id| **id != standby).unwrap().clone();
    assert_eq!(p.secondary_ips(&fresh).await.len(), 1, "the new instance's secondary private IPv4");
    p.stand_in.answer(&now[&fresh], true);
    eventually("both servers passing", Duration::from_secs(30), || async {
        let t = p.tunnels.get("web-tunnel").await.ok()?;
        pair::ha(&t).servers.iter().all(|s| s.healthy).then_some(())
    })
    .await;
    assert_eq!(p.associated().await.0.as_deref(), Some(standby.as_str()));
    let checked = p.stand_in.checked();
    assert!(!checked.contains(&p.ip), "never checked at the Elastic IP: {checked:?}");
    p.finish(&[active, standby, fresh]).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn on_ec2_a_failing_check_moves_the_elastic_ip_after_the_hysteresis_never_onto_a_failing_server() {
    let p = Ec2Pair::start("tun-ec2-hy").await;
    let (a, b) = (p.active.clone(), p.standby.clone());
    let own = p.own_addresses(&[]).await;
    let settings = skyport::config::TunnelArgs::default();

    // a's server stops answering: the address moves to b, but only after the hysteresis.
    let started = std::time::Instant::now();
    p.stand_in.answer(&own[&a], false);
    let (after, to) = p.moved_off(&a, started).await;
    assert_eq!(to, b);
    assert!(after >= settings.failover_after, "not before the hysteresis: {after:?}");
    let last = pair::ha(&failed_over(&p, &a, 1).await).last_failover.unwrap();
    assert!(last.reason.contains("health checks in a row") && last.reason.contains(&own[&a]), "{last:?}");

    // Now b fails too while a still fails: once b is past the hysteresis (passes come slower
    // under load than once a second), the Tunnel says the address stays on b, and it does.
    p.stand_in.answer(&own[&b], false);
    let t = eventually("b past the hysteresis, the address kept", Duration::from_secs(60), || async {
        let t = p.tunnel().await;
        ready(&t).filter(|(_, reason, message)| reason == "WaitingForTunnel" && message.contains("address stays"))?;
        Some(t)
    })
    .await;
    tokio::time::sleep(settings.failover_after * 2).await;
    assert_eq!(p.associated().await.0.as_deref(), Some(b.as_str()), "not onto a server whose check fails");
    assert_eq!(pair::ha(&t).failovers, Some(1));
    assert_eq!(pair::ha(&p.tunnel().await).failovers, Some(1));

    // a answers again: the address goes back to it, the one server that passes.
    p.stand_in.answer(&own[&a], true);
    let (_, to) = p.moved_off(&b, std::time::Instant::now()).await;
    assert_eq!(to, a);
    failed_over(&p, &b, 2).await;
    assert_eq!(warnings(&p, "Failover").await.len(), 2);
    p.finish(&[a, b]).await;
}
