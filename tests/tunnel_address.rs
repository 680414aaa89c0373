//! Reserved addresses (`spec.address.mode: Reserved`) against the real test environment: the
//! local provider's reserved addresses with real exit servers and real bytes (on the test node,
//! through a client Pod), and EC2 Elastic IPs on LocalStack.

use crate::common;
use crate::common::tunnels;

use std::time::Duration;

use crate::node::tunnels::{ACTIVE, NodeTunnel};
use common::kubelet::{Backends, ClientRunner};
use common::{TestNs, eventually};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, PostParams};
use providers::HostProvider;
use providers::hosts::{TAG_CLUSTER, TAG_DELETION_POLICY, TAG_TUNNEL_UID};
use skyport::crd::Tunnel;
use tunnels::{
    TunnelOperator, active, carries, fast_tunnel_settings, finish_tunnels, host_id, host_ip, ingress_ip, ready, service,
};

fn reserved_web(annotations: serde_json::Value) -> Service {
    service(
        "web",
        Some("skyport.dev/tunnel"),
        annotations,
        serde_json::json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
    )
}

/// The Tunnel operator with the EC2 provider on LocalStack beside the local one.
async fn on_ec2(ns: &TestNs) -> (TunnelOperator, std::sync::Arc<providers::Ec2Provider>) {
    let ec2 = std::sync::Arc::new(
        providers::Ec2Provider::from_env(providers::Ec2Settings::new("ami-0123456789abcdef0")).await.unwrap(),
    );
    (TunnelOperator::start_with(ns, fast_tunnel_settings(), vec![ec2.clone()]).await, ec2)
}

fn address_id(t: &Tunnel) -> String {
    t.status.as_ref().and_then(|s| s.address_id.clone()).expect("addressId")
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_reserved_address_survives_a_killed_exit_server_and_is_released_with_the_tunnel() {
    let service = reserved_web(serde_json::json!({"skyport.dev/address": "reserved"}));
    let Some(NodeTunnel { ns, op, services, tunnels, turn: _turn, .. }) =
        NodeTunnel::start_with("tun-addr", fast_tunnel_settings(), &["8080/tcp"], None, service).await
    else {
        return;
    };
    let old = active(&tunnels, "web-tunnel", ACTIVE).await;
    let uid = old.metadata.uid.clone().unwrap();
    let ip = host_ip(&old);
    let status = old.status.clone().unwrap();
    assert_eq!(status.address_ip.as_deref(), Some(ip.as_str()), "the exit server serves on the reserved address");
    let [address] = op.local.list_addresses_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().try_into().unwrap();
    assert_eq!((address.id.clone(), address.host_id.clone()), (address_id(&old), Some(host_id(&old))));
    assert_eq!(address.tags.get(TAG_CLUSTER), Some(&op.ctx.cluster_id));
    assert_eq!(address.tags.get(TAG_DELETION_POLICY).map(String::as_str), Some("Delete"));
    eventually("Service shows the reserved address", Duration::from_secs(20), || async {
        (ingress_ip(&services.get("web").await.ok()?)? == ip).then_some(())
    })
    .await;
    carries(&ip, 8080, None).await;
    // Steady state: the address costs no writes either.
    let writes = op.ctx.api_writes.get();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(op.ctx.api_writes.get(), writes, "an Active Tunnel with a reserved address costs no API writes");

    // Killed behind skyport's back, as a cloud VM would die.
    tunnels::kill_exit_server(&op, &host_id(&old));
    let new = tunnels::active_elsewhere_within(&tunnels, "web-tunnel", &host_id(&old), ACTIVE).await;
    assert_eq!(host_ip(&new), ip, "the replacement serves on the same address");
    assert_eq!(address_id(&new), address.id);
    eventually("Service shows the same address", Duration::from_secs(20), || async {
        (ingress_ip(&services.get("web").await.ok()?)? == ip).then_some(())
    })
    .await;
    // The client, configured for the same address, reconnects by itself: no new client config.
    carries(&ip, 8080, None).await;
    let reserved = op.local.list_addresses_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap();
    assert_eq!(reserved.len(), 1, "no second address: {reserved:?}");
    assert_eq!(reserved[0].host_id, Some(host_id(&new)));

    // Deleting the Service deletes the Tunnel, which releases the address.
    services.delete("web", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&tunnels, "web-tunnel").await;
    assert_eq!(op.local.get_address(&address.id).await.unwrap(), None, "released");
    assert!(op.local.list_addresses_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().is_empty());
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn the_sweep_releases_orphaned_addresses_but_never_retained_ones() {
    use std::sync::atomic::Ordering::Relaxed;
    let ns = TestNs::new("tun-addr-sweep").await;
    let cluster = tunnels::test_cluster_id(&ns);
    // Left by a Tunnel whose finalizer was removed by hand, and kept on purpose by another.
    let leftovers = tunnels::local_provider(&ns);
    let reserve = |policy: &str| {
        let mut tags = providers::owner_tags(&tunnels::uuid(), &ns.name, "gone-tunnel");
        tags.insert(TAG_CLUSTER.to_string(), cluster.clone());
        tags.insert(TAG_DELETION_POLICY.to_string(), policy.to_string());
        providers::AddressRequest { name: "skyport-orphan".into(), region: None, tags, host_id: None, movable: false }
    };
    let orphan = leftovers.reserve_address(&reserve("Delete")).await.unwrap();
    let kept = leftovers.reserve_address(&reserve("Retain")).await.unwrap();

    let op = TunnelOperator::start(&ns, tunnels::sweeping_settings()).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    let annotations =
        serde_json::json!({"skyport.dev/address": "reserved", "skyport.dev/address-deletion-policy": "retain"});
    services.create(&PostParams::default(), &reserved_web(annotations)).await.unwrap();
    let _kubelet = ClientRunner::start(ns.client.clone(), &ns.name, "web-tunnel-client", Backends::default());
    let live = active(&tunnels, "web-tunnel", Duration::from_secs(60)).await;

    eventually("orphaned address released by the sweep", Duration::from_secs(20), || async {
        op.local.get_address(&orphan.id).await.unwrap().is_none().then_some(())
    })
    .await;
    tunnels::two_more_sweeps(&op).await;
    assert_eq!(op.ctx.orphan_addresses_released.load(Relaxed), 1, "only the orphan is released");
    assert!(op.local.get_address(&kept.id).await.unwrap().is_some(), "a retained address is kept");
    assert!(op.local.get_address(&address_id(&live)).await.unwrap().is_some(), "a live Tunnel's address is kept");

    // Deleting the Retain Tunnel keeps its address, and the sweep leaves it alone.
    tunnels.delete("web-tunnel", &DeleteParams::default()).await.unwrap();
    services.delete("web", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&tunnels, "web-tunnel").await;
    tunnels::two_more_sweeps(&op).await;
    let retained = op.local.get_address(&address_id(&live)).await.unwrap().expect("the Retain address is kept");
    assert_eq!(retained.host_id, None, "its exit server is gone");
    assert_eq!(retained.tags.get(TAG_DELETION_POLICY).map(String::as_str), Some("Retain"));
    for id in [kept.id, retained.id] {
        op.local.release_address(&id).await.unwrap();
    }
    finish_tunnels(op, ns).await;
}

/// A local reserved address retained by a deleted Service's Tunnel, named by another Service
/// (`skyport.dev/reserved-address`): that Service's Tunnel comes up on it with a real exit server
/// and client, and bytes flow through the same address.
#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_retained_address_handed_to_another_service_carries_its_bytes() {
    let ns = TestNs::new("tun-addr-hand").await;
    let op = TunnelOperator::start(&ns, fast_tunnel_settings()).await;
    let (services, tunnels): (Api<Service>, Api<Tunnel>) = (ns.api(), ns.api());
    let retain =
        serde_json::json!({"skyport.dev/address": "reserved", "skyport.dev/address-deletion-policy": "retain"});
    services.create(&PostParams::default(), &reserved_web(retain)).await.unwrap();
    let web_client = ClientRunner::start(ns.client.clone(), &ns.name, "web-tunnel-client", Backends::default());
    let first = active(&tunnels, "web-tunnel", Duration::from_secs(60)).await;
    let (id, ip) = (address_id(&first), host_ip(&first));
    carries(&ip, 8080, None).await;
    services.delete("web", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&tunnels, "web-tunnel").await;
    drop(web_client);

    let mut api = reserved_web(serde_json::json!({"skyport.dev/reserved-address": ip}));
    api.metadata.name = Some("api".into());
    services.create(&PostParams::default(), &api).await.unwrap();
    let _api_client = ClientRunner::start(ns.client.clone(), &ns.name, "api-tunnel-client", Backends::default());
    let second = active(&tunnels, "api-tunnel", Duration::from_secs(60)).await;
    assert_eq!((address_id(&second), host_ip(&second)), (id.clone(), ip.clone()), "the retained address");
    eventually("the api Service shows the handed-over address", Duration::from_secs(20), || async {
        (ingress_ip(&services.get("api").await.ok()?)? == ip).then_some(())
    })
    .await;
    carries(&ip, 8080, None).await;

    services.delete("api", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&tunnels, "api-tunnel").await;
    let kept = op.local.get_address(&id).await.unwrap().expect("a handed-over address is kept");
    assert_eq!(kept.tags.get(TAG_DELETION_POLICY).map(String::as_str), Some("Retain"));
    op.local.release_address(&id).await.unwrap();
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_tunnel_on_ec2_keeps_its_elastic_ip_across_instances_and_releases_it() {
    let ns = TestNs::new("tun-ec2-eip").await;
    let (op, ec2) = on_ec2(&ns).await;
    let (services, tunnels): (Api<Service>, Api<Tunnel>) = (ns.api(), ns.api());
    let annotations = serde_json::json!({"skyport.dev/provider": "ec2", "skyport.dev/address": "reserved"});
    services.create(&PostParams::default(), &reserved_web(annotations)).await.unwrap();

    // LocalStack's instances run no exit server: the tunnel waits, the address is never published.
    let on = |id: Option<String>| {
        let tunnels = tunnels.clone();
        async move {
            eventually("Tunnel waiting on an instance holding its Elastic IP", Duration::from_secs(60), || async {
                let t = tunnels.get("web-tunnel").await.ok()?;
                let s = t.status.as_ref()?;
                let moved = id.as_deref().is_none_or(|old| s.host_id.as_deref() != Some(old));
                (moved && s.host_ip.is_some() && s.host_ip == s.address_ip && ready(&t)?.1 == "WaitingForTunnel")
                    .then_some(t)
            })
            .await
        }
    };
    let first = on(None).await;
    let allocation = address_id(&first);
    let client = ec2.client();
    let describe = || async {
        let (_, id) = allocation.rsplit_once('/').unwrap_or(("", &allocation));
        client.describe_addresses().allocation_ids(id).send().await.map(|o| o.addresses().to_vec()).unwrap_or_default()
    };
    let [eip] = describe().await.try_into().expect("one Elastic IP");
    assert_eq!(eip.instance_id(), Some(host_id(&first).rsplit('/').next().unwrap()), "associated with the instance");
    assert_eq!(eip.public_ip(), first.status.as_ref().unwrap().address_ip.as_deref());
    let tag = |k: &str| eip.tags().iter().find(|t| t.key() == Some(k)).and_then(|t| t.value()).map(str::to_string);
    assert_eq!(tag(TAG_TUNNEL_UID), first.metadata.uid.clone());
    assert_eq!(tag(TAG_DELETION_POLICY).as_deref(), Some("Delete"));
    assert_eq!(ingress_ip(&services.get("web").await.unwrap()), None, "not published before the tunnel is through");

    // The instance is terminated out of band: the replacement gets the same Elastic IP.
    ec2.delete(&host_id(&first)).await.unwrap();
    let second = on(Some(host_id(&first))).await;
    assert_eq!(address_id(&second), allocation);
    assert_eq!(host_ip(&second), host_ip(&first), "the same address");
    let [eip] = describe().await.try_into().expect("still one Elastic IP");
    assert_eq!(eip.instance_id(), Some(host_id(&second).rsplit('/').next().unwrap()), "moved to the replacement");
    // Resyncs (2 s) see it there: neither assigned again nor a second one reserved.
    let calls = |op: &str| ec2.limiter().counters.snapshot().get(op).copied().unwrap_or_default();
    // Allocations that succeeded: an attempt that timed out on a loaded machine is retried.
    let made = |op: &str| ec2.limiter().counters.succeeded().get(op).copied().unwrap_or_default();
    let associations = calls("AssociateAddress");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(calls("AssociateAddress"), associations, "the steady state assigns nothing");
    assert_eq!(made("AllocateAddress"), 1, "one Elastic IP for the Tunnel's life");

    services.delete("web", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&tunnels, "web-tunnel").await;
    assert!(describe().await.is_empty(), "the Elastic IP is released");
    assert_eq!(ec2.get_address(&allocation).await.unwrap(), None);
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_retained_elastic_ip_outlives_its_tunnel() {
    let ns = TestNs::new("tun-ec2-keep").await;
    let (op, ec2) = on_ec2(&ns).await;
    let (services, tunnels): (Api<Service>, Api<Tunnel>) = (ns.api(), ns.api());
    let annotations = serde_json::json!({
        "skyport.dev/provider": "ec2",
        "skyport.dev/address": "Reserved",
        "skyport.dev/address-deletion-policy": "Retain",
    });
    services.create(&PostParams::default(), &reserved_web(annotations)).await.unwrap();
    let tunnel = eventually("Elastic IP on the instance", Duration::from_secs(60), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        let s = t.status.as_ref()?;
        (s.address_ip.is_some() && s.host_ip == s.address_ip).then_some(t)
    })
    .await;
    let id = address_id(&tunnel);
    services.delete("web", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&tunnels, "web-tunnel").await;
    assert_eq!(ec2.get(&host_id(&tunnel)).await.unwrap(), None, "the instance is terminated");
    let kept = ec2.get_address(&id).await.unwrap().expect("the Elastic IP is kept");
    // (AWS disassociates an Elastic IP when its instance terminates; LocalStack keeps the record.)
    assert_eq!(kept.tags.get(TAG_DELETION_POLICY).map(String::as_str), Some("Retain"));
    assert_eq!(kept.tags.get(TAG_TUNNEL_UID), tunnel.metadata.uid.as_ref());
    ec2.release_address(&id).await.unwrap();
    finish_tunnels(op, ns).await;
}

/// A Tunnel deleted while its Service still asks for one (by hand, or with a stolen token of
/// skyport's) keeps its reserved address, and the Service's next Tunnel takes it over: the
/// Service's published address never goes back to the cloud's pool, where anyone could reserve
/// it while DNS still names it. The orphan sweep leaves it alone meanwhile.
#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_tunnel_deleted_while_its_service_asks_for_one_hands_its_elastic_ip_to_the_next() {
    let ns = TestNs::new("tun-ec2-next").await;
    let (op, ec2) = on_ec2(&ns).await;
    let (services, tunnels): (Api<Service>, Api<Tunnel>) = (ns.api(), ns.api());
    let annotations = serde_json::json!({"skyport.dev/provider": "ec2", "skyport.dev/address": "reserved"});
    services.create(&PostParams::default(), &reserved_web(annotations)).await.unwrap();
    let holding = |uid: Option<String>| {
        let tunnels = tunnels.clone();
        async move {
            eventually("a Tunnel on an instance holding its Elastic IP", Duration::from_secs(90), || async {
                let t = tunnels.get("web-tunnel").await.ok()?;
                let s = t.status.as_ref()?;
                (t.metadata.uid != uid && s.address_ip.is_some() && s.host_ip == s.address_ip).then_some(t)
            })
            .await
        }
    };
    let first = holding(None).await;
    let id = address_id(&first);
    tunnels.delete("web-tunnel", &DeleteParams::default()).await.unwrap();
    let second = holding(first.metadata.uid.clone()).await;
    assert_eq!(address_id(&second), id, "the next Tunnel holds the same Elastic IP");
    assert_eq!(host_ip(&second), host_ip(&first), "the same address");
    assert_eq!(ec2.get(&host_id(&first)).await.unwrap(), None, "the first instance is terminated");
    let calls = |op: &str| ec2.limiter().counters.snapshot().get(op).copied().unwrap_or_default();
    // Allocations that succeeded: an attempt that timed out on a loaded machine is retried.
    let made = |op: &str| ec2.limiter().counters.succeeded().get(op).copied().unwrap_or_default();
    assert_eq!((made("AllocateAddress"), calls("ReleaseAddress")), (1, 0), "one Elastic IP, never released");
    skyport::controllers::tunnel::sweep::sweep_once(&op.ctx).await;
    assert!(ec2.get_address(&id).await.unwrap().is_some(), "the sweep leaves the taken-over address");

    // Once the Service goes, its Tunnel releases the address.
    services.delete("web", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&tunnels, "web-tunnel").await;
    assert_eq!(ec2.get_address(&id).await.unwrap(), None, "released with the Service");
    finish_tunnels(op, ns).await;
}

/// A retained Elastic IP handed to another Service's Tunnel by the annotation
/// `skyport.dev/reserved-address` (here its IP): the Tunnel holds the same allocation, nothing new
/// is allocated, and deleting that Service too leaves it reserved (its tags say Retain). A Service
/// naming an address nobody here retained gets `AddressNotHandedOver` and no instance.
#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_retained_elastic_ip_is_handed_to_another_services_tunnel_by_its_annotation() {
    let ns = TestNs::new("tun-ec2-hand").await;
    let (op, ec2) = on_ec2(&ns).await;
    let (services, tunnels): (Api<Service>, Api<Tunnel>) = (ns.api(), ns.api());
    let retained = serde_json::json!({"skyport.dev/provider": "ec2", "skyport.dev/address-deletion-policy": "Retain",
        "skyport.dev/address": "reserved"});
    services.create(&PostParams::default(), &reserved_web(retained)).await.unwrap();
    let on_instance = |name: &'static str| {
        let tunnels = tunnels.clone();
        async move {
            eventually("a Tunnel on an instance holding its Elastic IP", Duration::from_secs(90), || async {
                let t = tunnels.get(name).await.ok()?;
                let s = t.status.as_ref()?;
                (s.address_ip.is_some() && s.host_ip == s.address_ip).then_some(t)
            })
            .await
        }
    };
    let first = on_instance("web-tunnel").await;
    let (id, ip) = (address_id(&first), host_ip(&first));
    services.delete("web", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&tunnels, "web-tunnel").await;

    let mut api = reserved_web(serde_json::json!({"skyport.dev/provider": "ec2", "skyport.dev/reserved-address": ip}));
    api.metadata.name = Some("api".into());
    services.create(&PostParams::default(), &api).await.unwrap();
    let second = on_instance("api-tunnel").await;
    assert_eq!((address_id(&second), host_ip(&second)), (id.clone(), ip.clone()), "the retained Elastic IP");
    let calls = |op: &str| ec2.limiter().counters.snapshot().get(op).copied().unwrap_or_default();
    // Allocations that succeeded: an attempt that timed out on a loaded machine is retried.
    let made = |op: &str| ec2.limiter().counters.succeeded().get(op).copied().unwrap_or_default();
    assert_eq!((made("AllocateAddress"), calls("ReleaseAddress")), (1, 0), "one Elastic IP, never released");

    // An address nobody in this namespace retained: refused, nothing bought.
    let mut stray = reserved_web(serde_json::json!({"skyport.dev/provider": "ec2",
        "skyport.dev/reserved-address": "eipalloc-0000000000000000f"}));
    stray.metadata.name = Some("stray".into());
    services.create(&PostParams::default(), &stray).await.unwrap();
    let refused = eventually("the stray Tunnel refused", Duration::from_secs(60), || async {
        let t = tunnels.get("stray-tunnel").await.ok()?;
        let (_, reason, message) = ready(&t)?;
        (reason == "AddressNotHandedOver").then_some((t, message))
    })
    .await;
    assert!(refused.1.contains("no reserved address"), "{}", refused.1);
    assert_eq!(refused.0.status.and_then(|s| s.host_id), None, "no instance for a refused address");
    assert_eq!(made("AllocateAddress"), 1);

    services.delete("api", &DeleteParams::default()).await.unwrap();
    services.delete("stray", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&tunnels, "api-tunnel").await;
    let kept = ec2.get_address(&id).await.unwrap().expect("a handed-over Elastic IP is kept");
    assert_eq!(kept.tags.get(TAG_DELETION_POLICY).map(String::as_str), Some("Retain"));
    ec2.release_address(&id).await.unwrap();
    finish_tunnels(op, ns).await;
}
