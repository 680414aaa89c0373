//! A highly available Tunnel on a cloud's terms, through whole reconciles: each server checked
//! at its own address whatever the API reports as its public one, and a server deleted with the
//! address (which the cloud then unassigns) a failover like any other.

use std::sync::Arc;

use kube::runtime::watcher;
use providers::hosts::{TAG_CLUSTER, TAG_TUNNEL_SLOT, TAG_TUNNEL_UID};

use super::pair_tests::{deleted_with_service, fail_checks, ha, pair, pass};
use super::tests::Harness;

#[tokio::test]
async fn where_the_address_moves_onto_secondary_addresses_each_server_is_checked_at_its_own() {
    // As LocalStack reports EC2: the Elastic IP as the public IPv4 of every instance it was ever
    // associated with, the instance's own gone from the API. On AWS it goes onto a secondary
    // private address and each instance keeps its own, where its client dials; the check goes
    // there, and nothing is decided from an answer at the Elastic IP.
    let (h, t) = pair();
    h.provider.move_to_secondary_addresses();
    h.reconcile(t).await.unwrap();
    let reserved = h.provider.addresses()[0].ip.clone();
    let report_reserved = |h: &Harness, id: &str| {
        let mut host = h.provider.hosts().into_iter().find(|host| host.id == id).unwrap();
        host.public_ipv4 = Some(reserved.clone());
        h.provider.insert(host);
    };
    report_reserved(&h, "h-1");
    h.probe.refuse(&reserved, true);
    for _ in 0..3 {
        pass(&h).await;
    }
    assert_eq!(ha(&h).active.as_deref(), Some("h-1"), "its own address passes: no failover");
    let message = crate::controllers::status::ready_condition(&h.current()).unwrap().message.clone();
    assert!(message.contains("health check at its own address 203.0.113.1 (not through"), "{message}");

    // Its own address fails: the address moves to h-2, which LocalStack then reports there too.
    fail_checks(&h, "203.0.113.1", 3).await;
    assert_eq!(ha(&h).active.as_deref(), Some("h-2"));
    report_reserved(&h, "h-2");
    h.probe.refuse(&reserved, true);
    pass(&h).await;
    pass(&h).await;
    let status = ha(&h);
    assert_eq!((status.active.as_deref(), status.failovers), (Some("h-2"), Some(1)));
    assert!(status.servers.iter().all(|s| s.healthy), "{status:?}");
    let checked = h.probe.checked();
    assert!(!checked.iter().any(|c| c.starts_with(&format!("{reserved}:"))), "{checked:?}");
}

#[tokio::test]
async fn a_deleted_holder_is_a_failover_and_its_slot_is_filled_after_the_address_moved() {
    // Deleted outside skyport, as EC2 terminates an instance: the cloud unassigns its address
    // (the fake's delete does). That loss is a failover, recorded and announced like any other;
    // creating its replacement (which takes seconds, and here fails) waits until the move.
    let (h, t) = pair();
    h.reconcile(t).await.unwrap();
    providers::HostProvider::delete(h.provider.as_ref(), "h-1").await.unwrap();
    assert_eq!(h.provider.addresses()[0].host_id, None);
    h.provider.fail_next("create", providers::HostError::Unavailable { provider: "fake", message: "slow".into() });
    assert!(h.reconcile(Arc::new(h.current())).await.is_err(), "the create failed");
    assert_eq!(h.provider.addresses()[0].host_id.as_deref(), Some("h-2"), "moved before the create");
    let status = ha(&h);
    assert_eq!((status.active.as_deref(), status.failovers), (Some("h-2"), Some(1)));
    let last = status.last_failover.unwrap();
    assert_eq!((last.from.as_str(), last.to.as_str()), ("h-1", "h-2"));
    assert!(last.reason.contains("not running"), "{last:?}");
    assert_eq!(h.api.event_reasons().iter().filter(|r| *r == "Failover").count(), 2);

    pass(&h).await;
    let slots: Vec<_> = h.provider.hosts().iter().map(|h| (h.id.clone(), h.tags[TAG_TUNNEL_SLOT].clone())).collect();
    assert_eq!(slots, [("h-2".to_string(), "b".to_string()), ("h-3".to_string(), "a".to_string())]);
    assert_eq!((ha(&h).active.as_deref(), ha(&h).failovers), (Some("h-2"), Some(1)));
}

/// The provider calls that only read.
fn reads(h: &Harness) -> usize {
    const READS: [&str; 4] = ["get", "get_address", "list_addresses_by_tag", "list_by_tag"];
    h.provider.calls().iter().filter(|c| READS.contains(c)).count()
}

#[tokio::test]
async fn a_quiet_pair_reads_the_cloud_only_at_its_resync_or_after_a_failed_check() {
    let (h, t) = pair();
    h.provider.charge_reads();
    h.reconcile(t).await.unwrap();
    pass(&h).await;
    assert_eq!(ha(&h).servers.iter().filter(|s| s.healthy).count(), 2);
    let quiet = reads(&h);
    for _ in 0..5 {
        pass(&h).await;
    }
    assert_eq!(reads(&h), quiet, "both servers pass and nothing changes: no cloud reads");

    // The standby fails a check: that pass decides from what it has, the next one reads again.
    h.probe.refuse("203.0.113.2", true);
    pass(&h).await;
    assert_eq!(reads(&h), quiet);
    pass(&h).await;
    assert!(reads(&h) > quiet, "read again after a failed check");
    h.probe.refuse("203.0.113.2", false);
    pass(&h).await;
    let settled = reads(&h);
    pass(&h).await;
    assert_eq!(reads(&h), settled, "quiet again");

    // A holder deleted behind skyport's back fails its check (here at the address the fake
    // cloud gave it, the reserved one); the pass after reads the cloud, finds it gone and moves
    // the address at once.
    let reserved = h.provider.addresses()[0].ip.clone();
    providers::HostProvider::delete(h.provider.as_ref(), "h-1").await.unwrap();
    h.probe.refuse(&reserved, true);
    pass(&h).await;
    pass(&h).await;
    assert_eq!(ha(&h).active.as_deref(), Some("h-2"));
    assert_eq!(ha(&h).failovers, Some(1));
}

#[tokio::test]
async fn without_a_read_budget_a_pair_reads_at_every_pass() {
    let (h, t) = pair();
    h.reconcile(t).await.unwrap();
    pass(&h).await;
    let before = reads(&h);
    pass(&h).await;
    assert!(reads(&h) > before, "a provider on this machine is read at every pass");
}

#[tokio::test]
async fn a_pairs_servers_go_to_different_failure_domains_and_status_shows_the_zones_reported() {
    // Where the provider places hosts apart (EC2 given subnets in two zones), each slot asks for
    // its own failure domain, also for a replacement; status shows the zones the provider
    // reports, not what was asked.
    let (h, t) = pair();
    h.provider.spread_over_zones();
    h.reconcile(t).await.unwrap();
    let status = ha(&h);
    let zones: Vec<_> = status.servers.iter().map(|s| (s.slot.as_str(), s.placement.as_deref())).collect();
    assert_eq!(zones, [("a", Some("zone-0")), ("b", Some("zone-1"))]);
    assert_eq!(status.spread.as_deref(), Some("in different zones: zone-0 and zone-1"));

    // Slot a's server goes: its replacement is asked for slot a's domain again.
    fail_checks(&h, "203.0.113.1", 3).await;
    providers::HostProvider::delete(h.provider.as_ref(), "h-1").await.unwrap();
    pass(&h).await;
    pass(&h).await;
    let by_slot: Vec<_> =
        h.provider.hosts().iter().map(|h| (h.tags[TAG_TUNNEL_SLOT].clone(), h.placement.clone().unwrap())).collect();
    assert_eq!(by_slot, [("b".into(), "zone-1".into()), ("a".into(), "zone-0".into())]);
    assert_eq!(ha(&h).spread.as_deref(), Some("in different zones: zone-0 and zone-1"));

    // Where it does not, status says why.
    let (h, t) = pair();
    h.reconcile(t).await.unwrap();
    let status = ha(&h);
    assert!(status.servers.iter().all(|s| s.placement.is_none()), "{status:?}");
    assert_eq!(status.spread.as_deref(), Some("all fake hosts share one machine"));
}

#[tokio::test]
async fn what_kept_the_pair_apart_goes_after_both_servers_and_keeps_the_finalizer_until_it_has() {
    let (mut h, t) = pair();
    h.provider.spread_over_zones();
    h.reconcile(t).await.unwrap();
    let t = deleted_with_service(&mut h);
    // A server still being deleted keeps it (Hetzner's placement group): retried, Tunnel kept.
    let busy = providers::HostError::Unavailable { provider: "fake", message: "still holds a server".into() };
    h.provider.fail_next("delete_placement", busy);
    assert!(h.reconcile(t).await.is_err());
    assert_eq!(h.current().metadata.finalizers, Some(vec![super::FINALIZER.to_string()]));
    assert!(h.provider.hosts().is_empty(), "the servers went first");
    h.reconcile(Arc::new(h.current())).await.unwrap();
    assert_eq!(h.current().metadata.finalizers, Some(vec![]));
    let calls = h.provider.calls();
    let deletes: Vec<usize> = calls.iter().enumerate().filter(|(_, c)| **c == "delete").map(|(i, _)| i).collect();
    let placements: Vec<usize> =
        calls.iter().enumerate().filter(|(_, c)| **c == "delete_placement").map(|(i, _)| i).collect();
    assert_eq!((deletes.len(), placements.len()), (2, 2), "{calls:?}");
    assert!(deletes[1] < placements[0], "after both servers: {calls:?}");
}

/// The placement of a pair whose Tunnel went without its finalizer (nothing deleted it, and its
/// servers may be gone already) is found by this cluster's tag and deleted by the sweep; a live
/// Tunnel's and another cluster's stay.
#[tokio::test]
async fn the_sweep_deletes_the_placement_of_a_pair_gone_without_its_finalizer() {
    let (mut h, t) = pair();
    h.reconcile(t).await.unwrap();
    let [live] = <[_; 1]>::try_from(h.provider.placements()).expect("one placement for the pair");
    h.tunnels.apply_watcher_event(&watcher::Event::Apply(h.current()));
    let tagged = |uid: &str, cluster: &str| {
        let mut tags = live.clone();
        tags.insert(TAG_TUNNEL_UID.into(), uid.into());
        tags.insert(TAG_CLUSTER.into(), cluster.into());
        tags
    };
    let cluster = live[TAG_CLUSTER].clone();
    h.provider.insert_placement("gone-uid", tagged("gone-uid", &cluster));
    h.provider.insert_placement("foreign-uid", tagged("foreign-uid", "another-cluster"));
    super::sweep::sweep_once(&h.ctx).await;
    let mut left: Vec<String> = h.provider.placements().iter().map(|tags| tags[TAG_TUNNEL_UID].clone()).collect();
    left.sort();
    let mut expected = vec!["foreign-uid".to_string(), live[TAG_TUNNEL_UID].clone()];
    expected.sort();
    assert_eq!(left, expected);
}
