//! Ready means traffic can flow, against the fakes: the health check decides Active,
//! the boot timeout and the replacement, and the Service never advertises an address that is about
//! to be released.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use providers::HostError;
use serde_json::json;

use super::tests::{Harness, SERVICE, harness, ready};
use super::*;
use crate::config::TunnelArgs;
use crate::controllers::testing::provider::NAME;
use crate::controllers::testing::requeue_secs;
use crate::crd::condition::ConditionStatus;

/// A health-poll requeue: 0.5 s at first (less up to 10 % jitter), growing to 5 s; never a hot
/// loop.
fn assert_health_poll(action: &Action) {
    let secs = requeue_secs(action);
    assert!((0.45..=5.0).contains(&secs), "requeue after {secs}s, expected the 0.5-5 s health poll");
}

fn ingress(h: &Harness) -> serde_json::Value {
    h.api.get(SERVICE).unwrap()["status"]["loadBalancer"]["ingress"].clone()
}

impl Harness {
    /// The client Deployment reports an available replica, as the cluster would once its pod
    /// runs (the fake API has no Deployment controller).
    fn client_available(&self) {
        let path = "/apis/apps/v1/namespaces/ns/deployments/web-tunnel-client";
        let mut deployment = self.api.get(path).expect("the client Deployment");
        deployment["status"] = json!({"replicas": 1, "availableReplicas": 1});
        self.api.put(path, deployment);
    }

    fn warnings(&self) -> Vec<(String, String)> {
        self.api
            .writes()
            .into_iter()
            .filter(|c| c.path.contains("/events") && c.body["type"] == json!("Warning"))
            .map(|c| {
                let kind = c.body["regarding"]["kind"].as_str().unwrap_or_default().to_string();
                (kind, c.body["reason"].as_str().unwrap_or_default().to_string())
            })
            .collect()
    }
}

#[tokio::test]
async fn a_tunnel_is_not_active_and_not_published_before_the_probe_answers() {
    let mut h = harness();
    h.add_service();
    h.probe.answer(false);
    let action = h.reconcile(h.new_tunnel()).await.unwrap();
    assert_health_poll(&action);
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::False, "WaitingForTunnel".into()));
    let status = t.status.clone().unwrap();
    assert_eq!(status.phase, Some(TunnelPhase::Provisioning));
    assert_eq!(status.host_ip.as_deref(), Some("203.0.113.1"), "the host is recorded, not published");
    assert!(crate::controllers::status::ready_condition(&t).unwrap().message.contains("Connection refused"));
    assert_eq!(ingress(&h), serde_json::Value::Null, "no address before the tunnel is through");
    assert_eq!(h.probe.checked(), ["203.0.113.1:2334"], "the exit server's health port");
    assert!(h.api.get("/apis/apps/v1/namespaces/ns/deployments/web-tunnel-client").is_some(), "the client runs");

    h.probe.answer(true);
    h.reconcile(Arc::new(t)).await.unwrap();
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));
    assert_eq!(ingress(&h)[0]["ip"], json!("203.0.113.1"));

    // One failed probe is a blip: the address stays (DNS does not flap); failing for the whole
    // withdraw window takes it off.
    h.sync_service();
    h.probe.answer(false);
    assert_health_poll(&h.reconcile(Arc::new(h.current())).await.unwrap());
    assert_eq!(ready(&h.current()), (ConditionStatus::False, "WaitingForTunnel".into()));
    assert_eq!(ingress(&h)[0]["ip"], json!("203.0.113.1"), "kept through one failed probe");
    h.ctx.health.backdate("h-1", h.ctx.settings.withdraw_after);
    assert_health_poll(&h.reconcile(Arc::new(h.current())).await.unwrap());
    assert_eq!(ingress(&h), json!([]));
    assert!(h.warnings().is_empty(), "within the boot timeout nothing is a warning: {:?}", h.warnings());
}

#[tokio::test]
async fn past_the_boot_timeout_the_tunnel_is_not_established_with_one_warning_on_tunnel_and_service() {
    let mut h = harness();
    h.add_service();
    h.probe.answer(false);
    h.reconcile(h.new_tunnel()).await.unwrap();
    h.client_available();
    h.ctx.health.backdate("h-1", h.ctx.settings.boot_timeout);
    let action = h.reconcile(Arc::new(h.current())).await.unwrap();
    assert_health_poll(&action);
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::False, "TunnelNotEstablished".into()));
    let message = crate::controllers::status::ready_condition(&t).unwrap().message.clone();
    assert!(message.contains("boot timeout 10m") && message.contains("replaced after 15m"), "{message}");
    assert_eq!(t.status.as_ref().unwrap().phase, Some(TunnelPhase::Provisioning));
    let expected =
        [("Tunnel".to_string(), "TunnelNotEstablished".to_string()), ("Service".into(), "TunnelNotEstablished".into())];
    assert_eq!(h.warnings(), expected);
    // Probed again, still failing: no new Events, the host is kept, no address.
    assert_health_poll(&h.reconcile(Arc::new(t)).await.unwrap());
    assert_eq!(h.warnings(), expected, "the warning is published once");
    assert_eq!(h.provider.hosts().len(), 1);
    assert!(!h.provider.calls().contains(&"delete"));
    assert_eq!(ingress(&h), serde_json::Value::Null);
}

#[tokio::test]
async fn past_replace_after_the_host_is_replaced_once_and_the_new_one_gets_a_fresh_clock() {
    let mut h = harness();
    h.add_service();
    h.probe.answer(false);
    h.reconcile(h.new_tunnel()).await.unwrap();
    h.client_available();
    h.ctx.health.backdate("h-1", h.ctx.settings.replace_after);
    let action = h.reconcile(Arc::new(h.current())).await.unwrap();
    assert_eq!(action, Action::requeue(BOOT_POLL));
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::False, "Replacing".into()));
    assert_eq!(t.status.as_ref().unwrap().host_id, None);
    assert!(h.provider.hosts().is_empty(), "the unhealthy host is deleted");
    let warned: Vec<_> = h.warnings().into_iter().map(|(kind, _)| kind).collect();
    assert_eq!(warned, ["Tunnel", "Service"]);

    // The next reconcile makes a new host whose tunnel gets the whole boot timeout again.
    let action = h.reconcile(Arc::new(t)).await.unwrap();
    assert_health_poll(&action);
    let ids: Vec<_> = h.provider.hosts().into_iter().map(|host| host.id).collect();
    assert_eq!(ids, ["h-2"]);
    assert_eq!(ready(&h.current()), (ConditionStatus::False, "WaitingForTunnel".into()));
    assert_health_poll(&h.reconcile(Arc::new(h.current())).await.unwrap());
    let calls = h.provider.calls();
    assert_eq!(calls.iter().filter(|c| **c == "create").count(), 2, "{calls:?}");
    assert_eq!(calls.iter().filter(|c| **c == "delete").count(), 1, "{calls:?}");
    assert_eq!(h.probe.checked().last().map(String::as_str), Some("203.0.113.2:2334"));
}

/// The cache has not seen skyport's own publish yet (the usual case right after it): the address
/// must still be off the Service before the host is deleted. The delete fails here, so what the
/// Service shows is what it showed while the delete was under way.
#[tokio::test]
async fn the_ingress_is_cleared_before_an_unhealthy_host_is_deleted_even_with_a_stale_cache() {
    let mut h = harness();
    h.add_service();
    h.reconcile(h.new_tunnel()).await.unwrap();
    assert_eq!(ingress(&h)[0]["ip"], json!("203.0.113.1"));
    h.client_available();
    h.probe.answer(false);
    h.ctx.health.backdate("h-1", h.ctx.settings.replace_after);
    h.provider.fail_next("delete", HostError::Unavailable { provider: NAME, message: "503".into() });
    let err = h.reconcile(Arc::new(h.current())).await.unwrap_err();
    assert_eq!(err.reason(), "ProviderUnavailable");
    assert_eq!(ingress(&h), json!([]), "the address is off the Service before the delete is tried");
    assert_eq!(h.provider.hosts().len(), 1);
}

#[tokio::test]
async fn the_ingress_is_cleared_before_a_deleted_tunnels_host_goes_even_with_a_stale_cache() {
    let mut h = harness();
    h.add_service();
    h.reconcile(h.new_tunnel()).await.unwrap();
    let mut t = h.current();
    t.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    let t = h.put_tunnel(&t);
    h.provider.fail_next("delete", HostError::Unavailable { provider: NAME, message: "503".into() });
    assert!(h.reconcile(t).await.is_err());
    assert_eq!(ingress(&h), json!([]));
    assert_eq!(h.provider.hosts().len(), 1);
}

#[tokio::test]
async fn the_ingress_is_cleared_before_a_lost_host_is_replaced_even_with_a_stale_cache() {
    let mut h = harness();
    h.add_service();
    h.reconcile(h.new_tunnel()).await.unwrap();
    let mut stopped = h.provider.hosts().pop().unwrap();
    stopped.state = providers::HostState::Stopped;
    h.provider.insert(stopped);
    h.provider.fail_next("delete", HostError::Unavailable { provider: NAME, message: "503".into() });
    assert!(h.reconcile(Arc::new(h.current())).await.is_err());
    assert_eq!(ingress(&h), json!([]));
}

#[tokio::test]
async fn the_health_port_is_refused_as_a_service_port_with_the_reason_on_tunnel_and_service() {
    let mut h = harness();
    let mut svc = h.add_service();
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 2334;
    let svc: Service = serde_json::from_value(h.api.put(SERVICE, serde_json::to_value(svc).unwrap())).unwrap();
    h.services.apply_watcher_event(&watcher::Event::Apply(svc));
    assert_eq!(h.reconcile(h.new_tunnel()).await.unwrap(), Action::await_change());
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::False, "InvalidService".into()));
    assert_eq!(t.status.as_ref().unwrap().phase, Some(TunnelPhase::Failed));
    let message = crate::controllers::status::ready_condition(&t).unwrap().message.clone();
    assert!(message.contains("2334/TCP is the tunnel's health-check port") && message.contains("--tunnel-health-port"));
    let expected = [("Tunnel".to_string(), "InvalidService".to_string()), ("Service".into(), "InvalidService".into())];
    assert_eq!(h.warnings(), expected);
    assert!(h.provider.calls().is_empty(), "no cloud call for a Service that cannot be served");
    assert!(h.probe.checked().is_empty());
}

/// A client that never runs must not buy a new exit server every `--tunnel-replace-after`: the
/// fault is named (on the Tunnel and the Service, once) and the one host is kept.
#[tokio::test]
async fn a_client_that_never_runs_costs_no_new_exit_server() {
    let mut h = harness();
    h.add_service();
    h.probe.answer(false);
    h.reconcile(h.new_tunnel()).await.unwrap();
    for _ in 0..3 {
        h.ctx.health.backdate("h-1", 10 * h.ctx.settings.replace_after);
        assert_health_poll(&h.reconcile(Arc::new(h.current())).await.unwrap());
    }
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::False, "ClientNotAvailable".into()));
    let message = crate::controllers::status::ready_condition(&t).unwrap().message.clone();
    assert!(message.contains("web-tunnel-client") && message.contains("cannot help"), "{message}");
    assert_eq!(t.status.as_ref().unwrap().replacements, None);
    let calls = h.provider.calls();
    assert_eq!(calls.iter().filter(|c| **c == "create").count(), 1, "{calls:?}");
    assert!(!calls.contains(&"delete"), "{calls:?}");
    let expected =
        [("Tunnel".to_string(), "ClientNotAvailable".to_string()), ("Service".into(), "ClientNotAvailable".into())];
    assert_eq!(h.warnings(), expected);
}

/// A Service whose Tunnel's checks fail, replaced after a minute (booting for half of one), at
/// most twice; and that minute.
fn failing() -> (Harness, std::time::Duration) {
    let minute = std::time::Duration::from_secs(60);
    let settings =
        TunnelArgs { boot_timeout: minute / 2, replace_after: minute, max_replacements: 2, ..Default::default() };
    let mut h = super::tests::harness_settings(settings);
    h.add_service();
    h.probe.answer(false);
    (h, minute)
}

/// An exit server that cannot be reached is replaced, each replacement waiting twice as long
/// as the one before, and at most `--tunnel-max-replacements` times; the count is in status and
/// starts over once the tunnel works.
#[tokio::test]
async fn an_unreachable_exit_server_is_replaced_with_backoff_and_at_most_the_maximum() {
    let (h, minute) = failing();
    h.probe.reach(false);
    h.reconcile(h.new_tunnel()).await.unwrap();
    let creates = |h: &Harness| h.provider.calls().iter().filter(|c| **c == "create").count();

    h.ctx.health.backdate("h-1", minute);
    assert_eq!(h.reconcile(Arc::new(h.current())).await.unwrap(), Action::requeue(BOOT_POLL));
    let status = h.current().status.unwrap();
    assert_eq!((status.replacements, status.host_id), (Some(1), None));
    assert!(status.next_replacement_after.is_some());
    assert_eq!(h.warnings()[0], ("Tunnel".to_string(), "ExitServerUnreachable".to_string()));
    h.reconcile(Arc::new(h.current())).await.unwrap();
    assert_eq!(creates(&h), 2);

    // The second host must fail twice as long.
    h.ctx.health.backdate("h-2", minute);
    assert_health_poll(&h.reconcile(Arc::new(h.current())).await.unwrap());
    assert_eq!(ready(&h.current()), (ConditionStatus::False, "ExitServerUnreachable".into()));
    assert_eq!(creates(&h), 2, "replaced again after replace_after");
    h.ctx.health.backdate("h-2", minute);
    assert_eq!(h.reconcile(Arc::new(h.current())).await.unwrap(), Action::requeue(BOOT_POLL));
    h.reconcile(Arc::new(h.current())).await.unwrap();
    assert_eq!(creates(&h), 3);

    // At the maximum the host is kept, with the cause and what to do.
    for _ in 0..3 {
        h.ctx.health.backdate("h-3", 100 * minute);
        assert_health_poll(&h.reconcile(Arc::new(h.current())).await.unwrap());
    }
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::False, "ExitServerUnreachable".into()));
    let message = crate::controllers::status::ready_condition(&t).unwrap().message.clone();
    assert!(message.contains("stopped replacing") && message.contains("--tunnel-max-replacements 2"), "{message}");
    assert_eq!(creates(&h), 3, "{:?}", h.provider.calls());
    assert_eq!(t.status.as_ref().unwrap().replacements, Some(2));

    // Working again: Active, and the count starts over.
    h.probe.answer(true);
    h.reconcile(Arc::new(t)).await.unwrap();
    let status = h.current().status.unwrap();
    assert_eq!((status.replacements, status.next_replacement_after), (None, None));
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));
}

#[tokio::test]
async fn a_proxy_protocol_tunnel_for_a_service_with_a_udp_port_fails_with_the_reason_and_buys_nothing() {
    let mut h = harness();
    let mut svc = h.add_service();
    let udp = serde_json::from_value(json!({"port": 53, "protocol": "UDP"})).unwrap();
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap().push(udp);
    let svc: Service = serde_json::from_value(h.api.put(SERVICE, serde_json::to_value(svc).unwrap())).unwrap();
    h.services.apply_watcher_event(&watcher::Event::Apply(svc));
    let mut tunnel = (*h.new_tunnel()).clone();
    tunnel.spec.proxy_protocol = Some(crate::crd::tunnel::ProxyProtocol::V2);
    let tunnel = h.put_tunnel(&tunnel);
    assert_eq!(h.reconcile(tunnel).await.unwrap(), Action::await_change());
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::False, "InvalidService".into()));
    assert_eq!(t.status.as_ref().unwrap().phase, Some(TunnelPhase::Failed));
    let message = crate::controllers::status::ready_condition(&t).unwrap().message.clone();
    assert!(message.contains("53/UDP cannot carry the PROXY protocol header"), "{message}");
    let expected = [("Tunnel".to_string(), "InvalidService".to_string()), ("Service".into(), "InvalidService".into())];
    assert_eq!(h.warnings(), expected);
    assert!(h.provider.calls().is_empty(), "no cloud call for a Tunnel that cannot be served");
}

/// Where the provider keeps no console (DigitalOcean, Hetzner), a VM that refused the binary
/// serves its install report on the control port: the Tunnel names the refusal and never
/// replaces the VM (a new one would refuse the same file).
#[tokio::test]
async fn a_refusal_served_on_the_control_port_is_named_and_never_replaced() {
    let (h, minute) = failing();
    h.probe.report(Some("skyport-exit-server-install: refused digest-mismatch\n"));
    h.reconcile(h.new_tunnel()).await.unwrap();
    for _ in 0..4 {
        h.ctx.health.backdate("h-1", 100 * minute);
        let _ = h.reconcile(Arc::new(h.current())).await;
    }
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::False, "ExitServerArtifactRefused".into()));
    let message = crate::controllers::status::ready_condition(&t).unwrap().message.clone();
    assert!(message.contains("digest-mismatch"), "{message}");
    assert_eq!(h.provider.calls().iter().filter(|c| **c == "create").count(), 1, "never replaced");
}
