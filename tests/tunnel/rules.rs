//! Which Services get a Tunnel (class, default load balancer, annotations; a hand-made Tunnel
//! obeys the same rules), and what is refused or reported instead: bad input and a failing
//! provider, never retried hot.

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use providers::HostProvider;
use providers::hosts::{MANAGED_BY_VALUE, TAG_MANAGED_BY};
use skyport::crd::{ConditionStatus, Tunnel, TunnelPhase};

use crate::common::kubelet::{Backends, ClientRunner};
use crate::common::tunnels::{
    TunnelOperator, WebTunnel, active, events, fast_tunnel_settings, finish_tunnels, host_id, ingress_ip, service,
};
use crate::common::{TestNs, eventually};

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn class_default_and_annotation_rules_decide_which_services_get_a_tunnel() {
    let ns = TestNs::new("tun-rules").await;
    let op = TunnelOperator::start(&ns, fast_tunnel_settings()).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    let port = serde_json::json!([{"port": 8080}]);
    let none = serde_json::json!({});
    for s in [
        service("classed", Some("skyport.dev/tunnel"), none.clone(), port.clone()),
        service("classless", None, none.clone(), port.clone()),
        service("other-class", Some("example.com/lb"), none.clone(), port.clone()),
        service(
            "opted-out",
            Some("skyport.dev/tunnel"),
            serde_json::json!({"skyport.dev/tunnel": "false"}),
            port.clone(),
        ),
    ] {
        services.create(&PostParams::default(), &s).await.unwrap();
    }
    let _clients: Vec<ClientRunner> = ["classed", "classless"]
        .iter()
        .map(|n| ClientRunner::start(ns.client.clone(), &ns.name, &format!("{n}-tunnel-client"), Backends::default()))
        .collect();
    active(&tunnels, "classed-tunnel", Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let names: Vec<String> =
        tunnels.list(&Default::default()).await.unwrap().items.iter().map(|t| t.name_any()).collect();
    assert_eq!(names, ["classed-tunnel"], "only the skyport-classed, not opted-out Service");

    // Opting out later removes the Tunnel, its exit server and the ingress.
    let host = host_id(&tunnels.get("classed-tunnel").await.unwrap());
    let optout = serde_json::json!({"metadata": {"annotations": {"skyport.dev/tunnel": "false"}}});
    services.patch("classed", &PatchParams::default(), &Patch::Merge(&optout)).await.unwrap();
    eventually("Tunnel of the opted-out Service gone", Duration::from_secs(30), || async {
        tunnels.get_opt("classed-tunnel").await.ok()?.is_none().then_some(())
    })
    .await;
    assert_eq!(op.local.get(&host).await.unwrap(), None, "its exit server is deleted");
    let svc = services.get("classed").await.unwrap();
    assert_eq!(ingress_ip(&svc), None, "ingress cleared");
    op.stop().await;

    // As the default load balancer, the class-less Service is served too; with --annotated-only
    // only annotated ones.
    let mut settings = fast_tunnel_settings();
    settings.default_load_balancer = true;
    let op = TunnelOperator::start(&ns, settings.clone()).await;
    active(&tunnels, "classless-tunnel", Duration::from_secs(60)).await;
    assert!(tunnels.get_opt("other-class-tunnel").await.unwrap().is_none());
    op.stop().await;

    settings.annotated_only = true;
    let op = TunnelOperator::start(&ns, settings).await;
    eventually("class-less, unannotated Service loses its Tunnel", Duration::from_secs(30), || async {
        tunnels.get_opt("classless-tunnel").await.ok()?.is_none().then_some(())
    })
    .await;
    let optin = serde_json::json!({"metadata": {"annotations": {"skyport.dev/tunnel": "true"}}});
    services.patch("classless", &PatchParams::default(), &Patch::Merge(&optin)).await.unwrap();
    active(&tunnels, "classless-tunnel", Duration::from_secs(60)).await;
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_hand_made_tunnel_obeys_the_rules_services_obey() {
    let ns = TestNs::new("tun-hand").await;
    let op = TunnelOperator::start(&ns, fast_tunnel_settings()).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    let hand_made = |name: &str, service: &str| -> Tunnel {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel",
            "metadata": {"name": name},
            "spec": {"serviceRef": {"name": service}, "provider": "local"},
        }))
        .unwrap()
    };
    let refused = |name: &'static str| {
        let tunnels = tunnels.clone();
        async move {
            eventually(&format!("{name} Failed ServiceNotServed"), Duration::from_secs(30), || async {
                let t = tunnels.get(name).await.ok()?;
                let s = t.status.clone()?;
                let c = s.conditions.iter().find(|c| c.type_ == "Ready")?;
                (s.phase == Some(TunnelPhase::Failed) && c.reason == "ServiceNotServed").then_some(c.message.clone())
            })
            .await
        }
    };
    // A ClusterIP Service: skyport does not serve it, so a Tunnel cannot publish it either.
    let internal: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "internal"},
        "spec": {"ports": [{"port": 8080}], "selector": {"app": "internal"}},
    }))
    .unwrap();
    services.create(&PostParams::default(), &internal).await.unwrap();
    tunnels.create(&PostParams::default(), &hand_made("by-hand", "internal")).await.unwrap();
    let message = refused("by-hand").await;
    assert!(message.contains("not of type LoadBalancer"), "{message}");
    assert!(events(&ns.client, &ns.name, "by-hand").await.iter().any(|e| e.0 == "ServiceNotServed"));
    // A LoadBalancer Service that opted out.
    let private = service(
        "private",
        Some("skyport.dev/tunnel"),
        serde_json::json!({"skyport.dev/tunnel": "false"}),
        serde_json::json!([{"port": 8080}]),
    );
    services.create(&PostParams::default(), &private).await.unwrap();
    tunnels.create(&PostParams::default(), &hand_made("sneaky", "private")).await.unwrap();
    let message = refused("sneaky").await;
    assert!(message.contains("\"false\""), "{message}");
    assert!(tunnels.get("by-hand").await.unwrap().status.unwrap().host_id.is_none(), "no exit server was made");
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn bad_input_is_refused_or_reported_never_retried_hot() {
    let ns = TestNs::new("tun-bad").await;
    let mut settings = fast_tunnel_settings();
    settings.control_port = 2333;
    let op = TunnelOperator::start(&ns, settings).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();

    // Refused at admission: unknown provider, immutable fields.
    let bad: Tunnel = serde_json::from_value(serde_json::json!({
        "apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel", "metadata": {"name": "bad"},
        "spec": {"serviceRef": {"name": "web"}, "provider": "aws"},
    }))
    .unwrap();
    let err = tunnels.create(&PostParams::default(), &bad).await.unwrap_err();
    assert!(matches!(&err, kube::Error::Api(e) if e.code == 422), "{err}");

    // A Service using the control port, and one with SCTP: Failed with the reason, an Event.
    let clash =
        service("clash", Some("skyport.dev/tunnel"), serde_json::json!({}), serde_json::json!([{"port": 2333}]));
    services.create(&PostParams::default(), &clash).await.unwrap();
    let failed = eventually("clash-tunnel Failed InvalidService", Duration::from_secs(30), || async {
        let t = tunnels.get("clash-tunnel").await.ok()?;
        let s = t.status.clone()?;
        let c = s.conditions.iter().find(|c| c.type_ == "Ready")?;
        (s.phase == Some(TunnelPhase::Failed) && c.reason == "InvalidService").then_some(c.message.clone())
    })
    .await;
    assert!(failed.contains("2333") && failed.contains("control port"), "{failed}");
    assert!(events(&ns.client, &ns.name, "clash-tunnel").await.iter().any(|e| e.0 == "InvalidService"));
    let immutable = serde_json::json!({"spec": {"provider": "hetzner"}});
    let err = tunnels.patch("clash-tunnel", &PatchParams::default(), &Patch::Merge(&immutable)).await.unwrap_err();
    assert!(matches!(&err, kube::Error::Api(e) if e.code == 422 && e.message.contains("immutable")), "{err}");

    // Not retried hot: no further reconciles while nothing changes.
    let before = op.ctx.metrics.reconciles();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(op.ctx.metrics.reconciles() <= before + 1, "a Failed Tunnel waits for a change");

    // Fixing the Service heals it.
    let fix = serde_json::json!({"spec": {"ports": [{"port": 8080}]}});
    services.patch("clash", &PatchParams::default(), &Patch::Merge(&fix)).await.unwrap();
    let _client = ClientRunner::start(ns.client.clone(), &ns.name, "clash-tunnel-client", Backends::default());
    active(&tunnels, "clash-tunnel", Duration::from_secs(60)).await;

    // A provider skyport is not configured for.
    let mut elsewhere = service(
        "far",
        Some("skyport.dev/tunnel"),
        serde_json::json!({"skyport.dev/provider": "hetzner"}),
        serde_json::json!([{"port": 8080}]),
    );
    elsewhere.metadata.name = Some("far".into());
    services.create(&PostParams::default(), &elsewhere).await.unwrap();
    let message = eventually("far-tunnel ProviderNotConfigured", Duration::from_secs(30), || async {
        let t = tunnels.get("far-tunnel").await.ok()?;
        let c = t.status?.conditions.into_iter().find(|c| c.type_ == "Ready")?;
        (c.reason == "ProviderNotConfigured").then_some(c.message)
    })
    .await;
    assert!(message.contains("hetzner") && message.contains("local"), "{message}");
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn provider_failures_are_reported_on_the_tunnel_and_the_service_and_backed_off() {
    let ns = TestNs::new("tun-fail").await;
    let mut settings = fast_tunnel_settings();
    // The local provider cannot start its exit server: every create fails (Unavailable).
    settings.self_exe = "/nonexistent/skyport".into();
    let WebTunnel { ns, op, tunnels, kubelet: _kubelet, .. } = WebTunnel::start(ns, settings).await;

    let message = eventually("Ready=False ProviderUnavailable", Duration::from_secs(60), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        let c = t.status?.conditions.into_iter().find(|c| c.type_ == "Ready")?;
        (c.status == ConditionStatus::False && c.reason == "ProviderUnavailable").then_some(c.message)
    })
    .await;
    assert!(message.contains("/nonexistent/skyport") && message.contains("retrying"), "{message}");
    eventually("Warning Events on the Tunnel and on the Service", Duration::from_secs(10), || async {
        let on_tunnel = events(&ns.client, &ns.name, "web-tunnel").await;
        let on_service = events(&ns.client, &ns.name, "web").await;
        (on_tunnel.iter().any(|e| e.0 == "ProviderUnavailable")
            && on_service.iter().any(|e| e.0 == "ProviderUnavailable"))
        .then_some(())
    })
    .await;

    // Backed off per object (200 ms doubling to 2 s here), not retried in a hot loop.
    let before = op.ctx.metrics.reconciles();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let retries = op.ctx.metrics.reconciles() - before;
    assert!((1..=8).contains(&retries), "{retries} reconciles in 6 s");
    assert!(op.ctx.metrics.errors().get("ProviderUnavailable").copied().unwrap_or(0) >= 3);
    let calls = op.local.limiter().counters.outcomes();
    assert!(calls.get(&("CreateHost", "unavailable")).copied().unwrap_or(0) >= 3, "{calls:?}");
    assert!(op.local.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap().is_empty(), "nothing half-made");
    finish_tunnels(op, ns).await;
}
