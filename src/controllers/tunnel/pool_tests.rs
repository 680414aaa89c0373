//! A pool's shared exit server against the same fakes as the other reconcile tests: a server
//! replaced during its life takes its address off the members' Services before it goes, as a
//! Tunnel's own server does for its Service (a released address may be someone else's next).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::watcher;
use providers::HostState;
use serde_json::json;

use super::tests::{Harness, SERVICE, TUNNEL, harness_settings, service};
use crate::config::TunnelArgs;
use crate::controllers::service::desired::ANNOTATION_POOL;
use crate::crd::pool::{ExitServerPool, ExitServerPoolSpec, PoolAddressing};
use crate::crd::tunnel::{AddressMode, HighAvailability, MemberAddress, PoolRef, Tunnel, TunnelAddress, TunnelSpec};

pub(super) const POOL: &str = "/apis/skyport.dev/v1alpha1/exitserverpools/shared";
pub(super) const CARRIER: &str = "/apis/skyport.dev/v1alpha1/namespaces/ns/tunnels/pool-shared";

/// A pool allowing `ns`, whose shared server lives in `ns` too, with one member: the Service
/// `web` and its Tunnel. Returns the harness and the shared server's Tunnel.
fn pool_with_a_member() -> (Harness, Arc<Tunnel>) {
    pool_with_a_member_by(PoolAddressing::Shared)
}

pub(super) fn pool_with_a_member_by(addressing: PoolAddressing) -> (Harness, Arc<Tunnel>) {
    let spec = ExitServerPoolSpec { allowed_namespaces: vec!["ns".into()], addressing, ..Default::default() };
    pool_with_a_member_of(spec, TunnelArgs::default())
}

pub(super) fn pool_with_a_member_of(spec: ExitServerPoolSpec, settings: TunnelArgs) -> (Harness, Arc<Tunnel>) {
    let mut h = harness_settings(TunnelArgs { pool_namespace: Some("ns".into()), ..settings });
    let mut pool = ExitServerPool::new("shared", spec);
    pool.metadata.uid = Some("pool-uid".into());
    h.api.put(POOL, serde_json::to_value(&pool).unwrap());
    h.pools.apply_watcher_event(&watcher::Event::Apply(pool.clone()));

    let mut svc = service();
    svc.metadata.annotations = Some([(ANNOTATION_POOL.to_string(), "shared".to_string())].into());
    let svc: Service = serde_json::from_value(h.api.put(SERVICE, serde_json::to_value(&svc).unwrap())).unwrap();
    h.services.apply_watcher_event(&watcher::Event::Apply(svc.clone()));
    let mut member = crate::controllers::service::tunnel_for(&svc).unwrap();
    member.metadata.namespace = Some("ns".into());
    member.metadata.uid = Some("tunnel-uid".into());
    let member: Tunnel = serde_json::from_value(h.api.put(TUNNEL, serde_json::to_value(&member).unwrap())).unwrap();
    h.tunnels.apply_watcher_event(&watcher::Event::Apply(member));

    let mut metadata = crate::controllers::owned::meta(&pool, "pool-shared", []).unwrap();
    metadata.namespace = Some("ns".into());
    metadata.uid = Some("carrier-uid".into());
    metadata.generation = Some(1);
    let spec = TunnelSpec {
        service_ref: None,
        pool: Some(PoolRef { name: "shared".into() }),
        address: pool.spec.address.clone(),
        high_availability: pool.spec.high_availability.clone(),
        ..TunnelSpec::default()
    };
    let carrier = Tunnel { metadata, spec, status: None };
    let carrier: Tunnel = serde_json::from_value(h.api.put(CARRIER, serde_json::to_value(&carrier).unwrap())).unwrap();
    h.tunnels.apply_watcher_event(&watcher::Event::Apply(carrier.clone()));
    (h, Arc::new(carrier))
}

pub(super) fn carrier_now(h: &Harness) -> Arc<Tunnel> {
    Arc::new(serde_json::from_value(h.api.get(CARRIER).expect("the shared server's Tunnel")).unwrap())
}

/// The member's Service as its own reconcile leaves it: published at `ip`.
fn member_published_at(h: &mut Harness, ip: &str) {
    let mut svc = h.api.get(SERVICE).unwrap();
    svc["status"] = json!({"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "Proxy"}]}});
    h.api.put(SERVICE, svc);
    h.sync_service();
}

pub(super) fn member_ingress(h: &Harness) -> serde_json::Value {
    h.api.get(SERVICE).unwrap()["status"]["loadBalancer"]["ingress"].clone()
}

#[tokio::test]
async fn a_shared_server_replaced_during_its_life_takes_its_address_off_the_members_first() {
    let (mut h, carrier) = pool_with_a_member();
    h.reconcile(carrier).await.unwrap();
    let status = carrier_now(&h).status.clone().unwrap();
    assert_eq!(status.pool_members.len(), 1, "{status:?}");
    let ip = status.host_ip.clone().expect("the shared server's address");
    let pool = h.api.get(POOL).unwrap();
    assert_eq!((&pool["status"]["address"], &pool["status"]["addresses"]), (&json!(ip), &json!([ip])));
    member_published_at(&mut h, &ip);

    let mut stopped = h.provider.hosts().pop().unwrap();
    stopped.state = HostState::Stopped;
    h.provider.insert(stopped.clone());
    h.reconcile(carrier_now(&h)).await.unwrap();
    assert!(h.provider.hosts().iter().all(|host| host.id != stopped.id), "the stopped server went");
    assert_eq!(member_ingress(&h), json!([]), "the member's Service no longer shows the address");
}

/// The member's Tunnel as the API has it, with its Service's latest copy in the cache (as the
/// watch brings it between reconciles).
pub(super) async fn reconcile_member(h: &mut Harness) {
    h.sync_service();
    h.reconcile(Arc::new(h.current())).await.unwrap();
}

pub(super) fn ready_message(t: &Tunnel) -> String {
    crate::controllers::status::ready_condition(t).map(|c| c.message.to_string()).unwrap_or_default()
}

/// Every client Deployment in the fake API gets an available replica, as a running Pod gives it.
fn clients_available(h: &Harness) {
    for call in h.api.calls().iter().filter(|c| c.path.contains("/deployments/")) {
        let path = call.path.split('?').next().unwrap_or_default().trim_end_matches("/status").to_string();
        if let Some(mut deployment) = h.api.get(&path) {
            deployment["status"] = json!({"availableReplicas": 1});
            h.api.put(&path, deployment);
        }
    }
}

#[tokio::test]
async fn a_member_whose_check_fails_twice_loses_the_address_and_is_told_which_side_fails() {
    let (mut h, carrier) = pool_with_a_member();
    h.reconcile(carrier).await.unwrap();
    h.tunnels.apply_watcher_event(&watcher::Event::Apply((*carrier_now(&h)).clone()));
    reconcile_member(&mut h).await;
    let ip = carrier_now(&h).status.clone().unwrap().host_ip.unwrap();
    assert_eq!(member_ingress(&h)[0]["ip"], json!(ip), "{}", ready_message(&h.current()));

    h.probe.answer(false);
    reconcile_member(&mut h).await;
    assert_eq!(super::tests::ready(&h.current()).1, "WaitingForTunnel");
    assert_eq!(member_ingress(&h)[0]["ip"], json!(ip), "one failed check keeps the address");

    // The client Deployment has no available replica: the side at fault is the client.
    reconcile_member(&mut h).await;
    assert_eq!(member_ingress(&h), json!([]), "a second failed check takes it off");
    let message = ready_message(&h.current());
    assert!(message.contains("has no available replica"), "{message}");

    // The client runs, and the shared server does not answer on its control port.
    clients_available(&h);
    h.probe.reach(false);
    reconcile_member(&mut h).await;
    let message = ready_message(&h.current());
    assert!(message.contains("does not accept connections on its control port"), "{message}");
}

/// With an address per Service, the shared server reserves the member's own, tagged for it (a
/// lost answer is found again by its tags, never reserved twice); the member's services bind it,
/// the member is published there, and the pool's status names no address. Deleting the shared
/// server releases it.
#[tokio::test]
async fn a_per_service_member_gets_an_address_of_its_own_released_with_the_shared_server() {
    let (mut h, carrier) = pool_with_a_member_by(PoolAddressing::PerService);
    h.provider.lose_next_reserve_answer();
    assert!(h.reconcile(carrier).await.is_err(), "the answer was lost");
    h.reconcile(carrier_now(&h)).await.unwrap();
    let [address] = h.provider.addresses().try_into().expect("one address, found again by its tags");
    assert_eq!(address.tags.get(providers::hosts::TAG_POOL_MEMBER).map(String::as_str), Some("tunnel-uid"));
    assert_eq!(address.tags.get(providers::hosts::TAG_TUNNEL_UID).map(String::as_str), Some("carrier-uid"));
    let status = carrier_now(&h).status.clone().unwrap();
    let own = MemberAddress { uid: "tunnel-uid".into(), id: address.id.clone(), ip: address.ip.clone() };
    assert_eq!(status.member_addresses, [own]);
    let host = h.provider.hosts().pop().unwrap();
    let config = h.provider.user_data_of(&host.id).unwrap();
    assert!(config.contains(&format!("{}:80", address.ip)), "the member's port on its own address: {config}");
    assert_eq!(h.api.get(POOL).unwrap()["status"]["addresses"], json!([]), "the pool names no member's address");

    h.tunnels.apply_watcher_event(&watcher::Event::Apply((*carrier_now(&h)).clone()));
    reconcile_member(&mut h).await;
    assert_eq!(member_ingress(&h)[0]["ip"], json!(address.ip), "{}", ready_message(&h.current()));

    let mut going = (*carrier_now(&h)).clone();
    going.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    let going: Tunnel = serde_json::from_value(h.api.put(CARRIER, serde_json::to_value(&going).unwrap())).unwrap();
    h.reconcile(Arc::new(going)).await.unwrap();
    assert!(h.provider.hosts().is_empty() && h.provider.addresses().is_empty(), "{:?}", h.provider.addresses());
}

/// A member's address goes once the server runs without the member, and only an address whose
/// tags prove it that member's: an entry naming another address (a forged status) is dropped and
/// the address left alone.
#[tokio::test]
async fn a_departed_members_address_is_released_only_when_its_tags_say_so() {
    let (h, carrier) = pool_with_a_member_by(PoolAddressing::PerService);
    h.reconcile(carrier).await.unwrap();
    let [own] = h.provider.addresses().try_into().expect("the member's address");
    let tagged = |uid: &str, member: &str, ip: &str| {
        let mut tags = own.tags.clone();
        tags.insert(providers::hosts::TAG_TUNNEL_UID.into(), uid.into());
        tags.insert(providers::hosts::TAG_POOL_MEMBER.into(), member.into());
        providers::Address { private_ip: None, id: format!("id-{ip}"), ip: ip.into(), host_id: None, tags }
    };
    let departed = tagged("carrier-uid", "gone-uid", "192.0.2.50");
    let foreign = tagged("someone-else", "forged-uid", "192.0.2.51");
    h.provider.insert_address(departed.clone());
    h.provider.insert_address(foreign.clone());
    let mut carrier = (*carrier_now(&h)).clone();
    let entry =
        |a: &providers::Address, uid: &str| MemberAddress { uid: uid.into(), id: a.id.clone(), ip: a.ip.clone() };
    let status = carrier.status.as_mut().unwrap();
    status.member_addresses.extend([entry(&departed, "gone-uid"), entry(&foreign, "forged-uid")]);
    h.api.put(CARRIER, serde_json::to_value(&carrier).unwrap());
    // Read as an operator that did not write it reads it (one restarted, say).
    h.ctx.written.forget(&crate::controllers::object_key(&carrier));

    h.reconcile(carrier_now(&h)).await.unwrap();
    let left: Vec<String> = h.provider.addresses().into_iter().map(|a| a.id).collect();
    assert!(
        left.contains(&own.id) && left.contains(&foreign.id) && !left.contains(&departed.id),
        "{left:?} {:?}",
        carrier_now(&h).status
    );
    let recorded = carrier_now(&h).status.clone().unwrap().member_addresses;
    assert_eq!(recorded, [entry(&own, "tunnel-uid")]);
}

/// Where member addresses are assigned to the server (Hetzner's floating IPs), each is reserved
/// movable and assigned to the shared server, and to its replacement; one released behind the
/// operator's back is dropped from status and reserved anew, the new one assigned too.
#[tokio::test]
async fn an_assigned_member_address_follows_the_shared_server_and_comes_back_when_released() {
    let (h, carrier) = pool_with_a_member_by(PoolAddressing::PerService);
    h.provider.float_moved_addresses();
    h.reconcile(carrier).await.unwrap();
    let [address] = h.provider.addresses().try_into().expect("the member's address");
    let host = h.provider.hosts().pop().unwrap();
    assert!(h.provider.is_movable(&address.id), "a floating IP, not the server's primary one");
    assert_eq!(address.host_id.as_deref(), Some(host.id.as_str()), "assigned to the shared server");
    assert_ne!(host.public_ipv4.as_deref(), Some(address.ip.as_str()), "the server keeps its own address");

    let mut stopped = host.clone();
    stopped.state = HostState::Stopped;
    h.provider.insert(stopped);
    for _ in 0..3 {
        h.reconcile(carrier_now(&h)).await.unwrap();
    }
    let replacement = h.provider.hosts().pop().unwrap();
    assert_ne!(replacement.id, host.id, "the stopped server was replaced");
    let [moved] = h.provider.addresses().try_into().expect("the same address");
    assert_eq!((moved.id.as_str(), moved.host_id.as_deref()), (address.id.as_str(), Some(replacement.id.as_str())));

    h.provider.remove_address(&address.id);
    h.reconcile(carrier_now(&h)).await.unwrap();
    let [again] = h.provider.addresses().try_into().expect("a new address for the member");
    assert_ne!(again.id, address.id);
    assert_eq!(again.host_id.as_deref(), Some(replacement.id.as_str()), "assigned at once");
    let recorded = carrier_now(&h).status.clone().unwrap().member_addresses;
    let own = MemberAddress { uid: "tunnel-uid".into(), id: again.id.clone(), ip: again.ip.clone() };
    assert_eq!(recorded, [own], "the released one's entry is gone");
}

/// A status entry naming another address for a carried member (a forged status: whoever may
/// write Tunnel status could write it) is not bound: the tags do not prove it, so it is dropped
/// and the member's own, found by its tags, recorded again; the other address is left alone.
#[tokio::test]
async fn a_forged_entry_for_a_carried_member_binds_nothing() {
    let (h, carrier) = pool_with_a_member_by(PoolAddressing::PerService);
    h.reconcile(carrier).await.unwrap();
    let [own] = h.provider.addresses().try_into().expect("the member's address");
    let mut tags = own.tags.clone();
    tags.insert(providers::hosts::TAG_TUNNEL_UID.into(), "someone-else".into());
    let foreign =
        providers::Address { private_ip: None, id: "id-foreign".into(), ip: "192.0.2.60".into(), host_id: None, tags };
    h.provider.insert_address(foreign.clone());
    let mut forged = (*carrier_now(&h)).clone();
    let entry = |a: &providers::Address| MemberAddress { uid: "tunnel-uid".into(), id: a.id.clone(), ip: a.ip.clone() };
    forged.status.as_mut().unwrap().member_addresses = vec![entry(&foreign)];
    h.api.put(CARRIER, serde_json::to_value(&forged).unwrap());
    h.ctx.written.forget(&crate::controllers::object_key(&forged));

    h.reconcile(carrier_now(&h)).await.unwrap();
    assert_eq!(carrier_now(&h).status.clone().unwrap().member_addresses, [entry(&own)]);
    assert_eq!(h.provider.addresses().len(), 2, "nothing released, nothing reserved: {:?}", h.provider.addresses());
}

/// A member address is assigned only to a host carrying the shared server's owner tag: the host
/// id comes from status, which whoever may write Tunnel status could point at another server.
#[tokio::test]
async fn a_member_address_is_never_assigned_to_a_host_of_someone_else() {
    let (h, carrier) = pool_with_a_member_by(PoolAddressing::PerService);
    h.provider.float_moved_addresses();
    h.reconcile(carrier).await.unwrap();
    let [address] = h.provider.addresses().try_into().expect("the member's address");
    let mut foreign = h.provider.hosts().pop().unwrap();
    (foreign.id, foreign.tags) =
        ("h-foreign".into(), [(providers::hosts::TAG_TUNNEL_UID.into(), "other".into())].into());
    h.provider.insert(foreign);
    let assign = super::act::member_address::assign_to(&address, ("h-foreign", "carrier-uid"), &*h.provider);
    assign.await.unwrap();
    let [kept] = h.provider.addresses().try_into().unwrap();
    assert_eq!(kept.host_id, address.host_id, "left where it was");
}

/// An ActiveStandby pool for `ns` with an address per Service and a reserved pool address.
pub(super) fn ha_per_service() -> ExitServerPoolSpec {
    ExitServerPoolSpec {
        allowed_namespaces: vec!["ns".into()],
        addressing: PoolAddressing::PerService,
        address: Some(TunnelAddress { mode: AddressMode::Reserved, ..Default::default() }),
        high_availability: Some(HighAvailability::default()),
        ..Default::default()
    }
}

/// An ActiveStandby pool with an address per Service: the members' addresses go onto the server
/// holding the pool's reserved address, and move with it when that server fails its checks; a
/// provider that binds members' addresses on the machine itself is refused before any server.
#[tokio::test]
async fn a_pairs_member_addresses_follow_the_reserved_address_to_the_server_that_works() {
    let spec = ha_per_service();
    let settings = TunnelArgs { failover_failures: 3, failover_after: Duration::ZERO, ..TunnelArgs::default() };
    let (h, carrier) = pool_with_a_member_of(spec.clone(), settings.clone());
    h.provider.float_moved_addresses();
    h.reconcile(carrier).await.unwrap();
    let ha = |h: &Harness| carrier_now(h).status.clone().unwrap().high_availability.unwrap();
    let member = |h: &Harness| {
        let [entry] = carrier_now(h).status.clone().unwrap().member_addresses.try_into().expect("one member");
        h.provider.addresses().into_iter().find(|a| a.id == entry.id).expect("the member's address")
    };
    assert_eq!(h.provider.hosts().len(), 2, "a pair");
    assert_eq!(h.provider.addresses().len(), 2, "the pool's reserved address and the member's own");
    let active = ha(&h).active.expect("an active server");
    assert_eq!(member(&h).host_id.as_deref(), Some(active.as_str()), "on the active server");
    let standby = ha(&h).servers.into_iter().find(|s| s.host_id.as_deref() != Some(&active)).unwrap();
    let active_ip = ha(&h).servers.into_iter().find(|s| s.host_id.as_deref() == Some(&active)).unwrap().host_ip;
    for host in h.provider.hosts() {
        let user_data = h.provider.user_data_of(&host.id).unwrap();
        assert!(user_data.contains(&format!("{}:", member(&h).ip)), "{} binds the member's address", host.id);
    }

    h.probe.refuse(&active_ip.clone().unwrap(), true);
    for _ in 0..3 {
        h.reconcile(carrier_now(&h)).await.unwrap();
    }
    let moved_to = ha(&h).active.expect("an active server");
    assert_eq!(Some(moved_to.as_str()), standby.host_id.as_deref(), "the standby took over");
    assert_eq!(member(&h).host_id.as_deref(), Some(moved_to.as_str()), "the member's address went with it");

    // Unfloated, the fake binds members' addresses on its machine, as the local provider does.
    let (local, carrier) = pool_with_a_member_of(spec, settings);
    let _ = local.reconcile(carrier).await;
    let ready =
        carrier_now(&local).status.clone().unwrap().conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.reason, "PoolAddressingUnavailable", "{}", ready.message);
    assert!(ready.message.contains("cannot both listen"), "{}", ready.message);
    assert!(local.provider.hosts().is_empty() && local.provider.addresses().is_empty(), "nothing bought");
}
