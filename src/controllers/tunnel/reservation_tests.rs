//! A reserved address that carries no tags (DigitalOcean) made by a reservation whose answer was
//! lost: found again by the next pass or by the finalizer, and never one that is not provably
//! this Tunnel's.

use std::sync::Arc;

use providers::{Address, AddressBinding, HostProvider};

use super::tests::{Harness, harness, ready};
use super::*;
use crate::crd::condition::ConditionStatus;
use crate::crd::tunnel::{AddressDeletionPolicy, AddressMode, TunnelAddress};

/// A Tunnel with a reserved address at a provider whose addresses carry only their host's tags,
/// beside an unassigned address of the account's that skyport did not make.
fn reserving() -> (Harness, Arc<Tunnel>, Address) {
    let mut h = harness();
    h.provider.bind_addresses(AddressBinding::WithHost);
    let theirs = Address {
        private_ip: None,
        id: "a-theirs".into(),
        ip: "192.0.2.50".into(),
        host_id: None,
        tags: Default::default(),
    };
    h.provider.insert_address(theirs.clone());
    h.add_service();
    let mut t = (*h.new_tunnel()).clone();
    let policy = AddressDeletionPolicy::Delete;
    t.spec.address = Some(TunnelAddress { mode: AddressMode::Reserved, deletion_policy: policy });
    let t = h.put_tunnel(&t);
    (h, t, theirs)
}

/// The first pass reserves an address whose answer is lost; its droplet is then deleted out of
/// band, so it is unassigned and untagged. Returns the address that reservation made.
async fn lost_while_reserving(h: &Harness, t: Arc<Tunnel>) -> Address {
    h.provider.lose_next_reserve_answer();
    h.reconcile(t).await.expect_err("the reservation got no answer");
    let status = h.current().status.unwrap();
    assert_eq!(status.address_id, None, "nothing recorded: the answer was lost");
    assert!(status.address_reservation.is_some(), "the intent was recorded before the call");
    let host = h.provider.hosts().pop().unwrap();
    h.provider.delete(&host.id).await.unwrap();
    let made = h.provider.addresses().into_iter().find(|a| a.id != "a-theirs").expect("the lost address exists");
    assert_eq!(made.host_id, None);
    made
}

#[tokio::test]
async fn an_address_whose_reservation_got_no_answer_is_adopted_by_the_next_pass() {
    let (h, t, theirs) = reserving();
    let made = lost_while_reserving(&h, t).await;
    h.reconcile(Arc::new(h.current())).await.unwrap();
    h.reconcile(Arc::new(h.current())).await.unwrap();
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::True, "Active".into()));
    let status = t.status.unwrap();
    assert_eq!(status.address_id.as_deref(), Some(made.id.as_str()), "the lost address is the Tunnel's");
    assert_eq!(status.address_reservation, None);
    assert_eq!(h.provider.addresses().len(), 2, "no third address reserved: {:?}", h.provider.addresses());
    let host = h.provider.hosts().pop().unwrap();
    let now: Vec<_> = h.provider.addresses().into_iter().map(|a| (a.id, a.host_id)).collect();
    assert!(now.contains(&(made.id.clone(), Some(host.id))), "{now:?}");
    assert!(now.contains(&(theirs.id, None)), "the account's own address untouched: {now:?}");
    assert!(h.api.event_reasons().contains(&"AddressAdopted".to_string()));
}

#[tokio::test]
async fn a_tunnel_deleted_after_a_reservation_got_no_answer_releases_the_address_it_made() {
    let (h, t, theirs) = reserving();
    lost_while_reserving(&h, t).await;
    let mut t = h.current();
    t.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    let t = h.put_tunnel(&t);
    h.reconcile(t).await.unwrap();
    let left: Vec<_> = h.provider.addresses().into_iter().map(|a| a.id).collect();
    assert_eq!(left, [theirs.id], "the lost address was released, the account's own kept");
}

#[tokio::test]
async fn addresses_that_cannot_be_proven_ours_are_left_alone_and_named_only_in_the_log() {
    let (h, t, theirs) = reserving();
    let made = lost_while_reserving(&h, t).await;
    // Someone else reserved one meanwhile: neither can be told apart.
    let also = Address {
        private_ip: None,
        id: "a-also".into(),
        ip: "192.0.2.51".into(),
        host_id: None,
        tags: Default::default(),
    };
    h.provider.insert_address(also.clone());
    h.reconcile(Arc::new(h.current())).await.unwrap();
    assert!(h.api.event_reasons().contains(&"AddressUnproven".to_string()));
    assert_eq!(h.current().status.unwrap().address_reservation, None, "reported once");
    // Another tenant's address may be among them: the Event (read in this namespace) names none.
    let events: Vec<String> =
        h.api.calls().into_iter().filter(|c| c.path.contains("/events")).map(|c| c.body.to_string()).collect();
    for other in [&made.ip, &also.ip, &made.id, &also.id] {
        assert!(events.iter().all(|e| !e.contains(other.as_str())), "{other} named in an Event: {events:?}");
    }
    let ids: Vec<_> = h.provider.addresses().into_iter().map(|a| a.id).collect();
    for kept in [&theirs.id, &made.id, &also.id] {
        assert!(ids.contains(kept), "{kept} was touched: {ids:?}");
    }
    assert!(!h.provider.calls().contains(&"release_address"));
}
