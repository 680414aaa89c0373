//! How a highly available Tunnel's clients roll through whole reconciles: one at a time, the
//! holder's last after a handover, and never the holder's while the other's new client has not
//! proven itself.

use std::time::Duration;

use serde_json::json;

use super::pair_tests::{ha, pair, pass, roll_out};
use super::tests::{Harness, SERVICE, ready};
use super::*;
use crate::crd::condition::ConditionStatus;

fn checksum(h: &Harness, slot: &str) -> serde_json::Value {
    let d = h.api.get(&format!("/apis/apps/v1/namespaces/ns/deployments/web-tunnel-client-{slot}")).unwrap();
    d["spec"]["template"]["metadata"]["annotations"][desired::CHECKSUM_ANNOTATION].clone()
}

/// A port added to the Service: both clients need a new config.
fn add_port(h: &mut Harness) {
    let mut svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(h.api.get(SERVICE).unwrap()).unwrap();
    let port = serde_json::from_value(json!({"name": "https", "port": 443, "protocol": "TCP"})).unwrap();
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap().push(port);
    let svc = serde_json::from_value(h.api.put(SERVICE, serde_json::to_value(svc).unwrap())).unwrap();
    h.services.apply_watcher_event(&kube::runtime::watcher::Event::Apply(svc));
}

#[tokio::test]
async fn a_config_change_rolls_the_standbys_client_first_then_hands_the_address_over() {
    let (mut h, t) = pair();
    h.reconcile(t).await.unwrap();
    let before = (checksum(&h, "a"), checksum(&h, "b"));
    add_port(&mut h);

    // The standby's client first; the holder keeps its client and the address.
    pass(&h).await;
    assert_ne!(checksum(&h, "b"), before.1, "the standby's client rolled");
    assert_eq!(checksum(&h, "a"), before.0, "the holder's client waits");
    assert_eq!(ha(&h).active.as_deref(), Some("h-1"));
    // Its check passes, but its roll is not done: the old Pod may still be the one answering.
    pass(&h).await;
    assert_eq!(ha(&h).active.as_deref(), Some("h-1"), "no handover before the standby's roll is done");
    // Rolled out and passing with its new client: the address goes there; the old holder's
    // client rolls a pass later, once connections made through it just before the move are done.
    roll_out(&h, "b");
    pass(&h).await;
    assert_eq!(ha(&h).active.as_deref(), Some("h-2"));
    assert_eq!(checksum(&h, "a"), before.0, "not in the pass that moved the address");
    assert!(h.api.event_reasons().contains(&"Handover".to_string()));
    pass(&h).await;
    assert_ne!(checksum(&h, "a"), before.0);
    assert_eq!(ha(&h).failovers, None, "a planned handover is no failover");
    assert_eq!(h.ctx.failovers.total(), 0.0);
    pass(&h).await;
    assert_eq!(ha(&h).active.as_deref(), Some("h-2"), "and it stays");
}

#[tokio::test]
async fn a_new_client_that_never_rolls_out_halts_the_roll_and_buys_no_server() {
    let (mut h, t) = pair();
    h.reconcile(t).await.unwrap();
    let before = checksum(&h, "a");
    add_port(&mut h);
    pass(&h).await;
    assert_ne!(checksum(&h, "b"), json!(null));
    // b's new client never becomes available (an image that cannot be pulled), so its tunnel
    // fails, for longer than any patience and past the time a failing standby is replaced.
    h.probe.refuse("203.0.113.2", true);
    pass(&h).await;
    h.ctx.health.backdate("h-2", Duration::from_secs(3600));
    for _ in 0..3 {
        pass(&h).await;
    }
    assert_eq!(checksum(&h, "a"), before, "the holder keeps its client: rolling it would take both down");
    assert_eq!(ha(&h).active.as_deref(), Some("h-1"));
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));
    let message = h.current().status.unwrap().conditions[0].message.clone();
    assert!(
        message.contains("client roll: the client of exit server h-1 keeps its previous configuration"),
        "{message}"
    );
    assert!(message.contains("new client of exit server h-2 to roll out"), "{message}");
    assert_eq!(h.provider.hosts().len(), 2, "a new exit server cannot start a client Pod");
    let b = ha(&h).servers[1].clone();
    assert!(
        b.kept_because.as_deref().is_some_and(|k| k.contains("web-tunnel-client-b has no available replica")),
        "{b:?}"
    );
    assert!(h.api.event_reasons().contains(&"ClientNotAvailable".to_string()));

    // A fixed image: b rolls out and passes, the address goes there, then a rolls.
    h.probe.refuse("203.0.113.2", false);
    roll_out(&h, "b");
    pass(&h).await;
    assert_eq!(ha(&h).active.as_deref(), Some("h-2"));
    pass(&h).await;
    assert_ne!(checksum(&h, "a"), before);
    assert_eq!(ha(&h).servers[1].kept_because, None);
    assert_eq!(h.ctx.failovers.total(), 0.0);
}

#[tokio::test]
async fn a_push_that_fails_once_holds_up_neither_the_failover_nor_the_ports() {
    let (mut h, t) = pair();
    h.reconcile(t).await.unwrap();
    let reserved = h.provider.addresses()[0].ip.clone();
    h.probe.refuse(&reserved, true);
    pass(&h).await;
    pass(&h).await;
    // The Service's ports change, and pushing them to the first server fails once (a 503): the
    // pass goes on to the third failed check and moves the address.
    add_port(&mut h);
    let unavailable = providers::HostError::Unavailable { provider: "fake", message: "503".into() };
    h.provider.fail_next("reconfigure", unavailable);
    pass(&h).await;
    assert_eq!(ha(&h).active.as_deref(), Some("h-2"), "the failover was not held up by the push");
    assert_eq!(h.current().status.unwrap().ports.len(), 1, "not recorded before every server took them");
    // The next pass pushes again, and both servers take the new ports.
    h.probe.refuse(&reserved, false);
    pass(&h).await;
    assert_eq!(h.current().status.unwrap().ports.len(), 2);
}

#[tokio::test]
async fn a_roll_halted_past_its_deadline_is_a_warning_once() {
    let (mut h, t) = pair();
    h.reconcile(t).await.unwrap();
    add_port(&mut h);
    // b's new client never rolls out: a's waits, the roll is halted.
    for _ in 0..3 {
        pass(&h).await;
    }
    let halted = |h: &super::tests::Harness| h.api.event_reasons().iter().filter(|r| *r == "ClientRollHalted").count();
    assert_eq!(halted(&h), 0, "not before the deadline");
    let uid = h.current().metadata.uid.unwrap();
    h.ctx.halted_rolls.backdate(&uid, Duration::from_secs(600));
    pass(&h).await;
    assert_eq!(halted(&h), 1, "{:?}", h.api.event_reasons());
    pass(&h).await;
    assert_eq!(halted(&h), 1, "once per halt, not once a pass");
}
