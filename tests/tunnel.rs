//! Tunnels against the real test environment with the local provider: a real kube-apiserver
//! (+ the garbage collector), real rathole exit servers on their own 127.77.x.y addresses, and
//! the real rathole client run from the client Deployment by `common::kubelet`.

mod common;
#[path = "common/tunnels.rs"]
mod tunnels;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::kubelet::{Backends, ClientRunner, udp_echo};
use common::{TestNs, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use providers::HostProvider;
use providers::hosts::{MANAGED_BY_VALUE, TAG_CLUSTER, TAG_MANAGED_BY};
use skyport::crd::{ConditionStatus, Tunnel, TunnelPhase};
use tunnels::{
    TunnelOperator, active, carries, events, fast_tunnel_settings, finish_tunnels, host_id, host_ip, ingress_ip, ready,
    service, web,
};

const NEEDS_ENV: &str = "needs the test environment: tests/env.sh up";

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_load_balancer_service_gets_an_exit_server_and_real_bytes_flow_through_it() {
    let _ = NEEDS_ENV;
    let ns = TestNs::new("tun-bytes").await;
    let op = TunnelOperator::start(&ns, fast_tunnel_settings()).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    services.create(&PostParams::default(), &web("web")).await.unwrap();
    // The tunnel client runs (as a kubelet would run its Deployment): Active needs it.
    let kubelet = ClientRunner::start(ns.client.clone(), &ns.name, "web-tunnel-client", Backends::default());

    let tunnel = active(&tunnels, "web-tunnel", Duration::from_secs(60)).await;
    let ip = host_ip(&tunnel);
    let status = tunnel.status.clone().unwrap();
    assert_eq!(status.provider.as_deref(), Some("local"));
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status, ready.reason.as_str()), (ConditionStatus::True, "Active"));
    assert_eq!(status.observed_generation, tunnel.metadata.generation);
    let owner = &tunnel.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.controller), ("Service", Some(true)));

    // The Service shows the exit server's address, ipMode Proxy, with its ports.
    let svc = eventually("Service ingress set", Duration::from_secs(20), || async {
        let s = services.get("web").await.ok()?;
        (ingress_ip(&s)? == ip).then_some(s)
    })
    .await;
    let ingress = &svc.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0];
    assert_eq!(ingress.ip_mode.as_deref(), Some("Proxy"));
    let ports: Vec<_> = ingress.ports.clone().unwrap().into_iter().map(|p| (p.port, p.protocol)).collect();
    assert_eq!(ports, [(5353, "UDP".to_string()), (8080, "TCP".to_string())]);
    assert!(svc.spec.unwrap().external_ips.is_none(), "spec.externalIPs is never touched");

    // The client Deployment is hardened, single, recreated on change; secrets stay in the Secret.
    let deployment: Deployment = ns.api().get("web-tunnel-client").await.unwrap();
    let spec = deployment.spec.clone().unwrap();
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.strategy.unwrap().type_.as_deref(), Some("Recreate"));
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
    let container = &pod.containers[0];
    assert!(container.resources.as_ref().unwrap().limits.is_some());
    let secret: Secret = ns.api().get("web-tunnel-credentials").await.unwrap();
    let token = String::from_utf8(secret.data.unwrap()["token"].0.clone()).unwrap();
    let visible =
        serde_json::to_string(&(&tunnel, &deployment, events(&ns.client, &ns.name, "web-tunnel").await)).unwrap();
    assert!(!visible.contains(&token), "the tunnel token leaked into status, the Deployment or Events");

    // Real bytes: the real rathole client (run from the Deployment) and server carry TCP and UDP.
    carries(&ip, 8080, Some(5353)).await;
    // Steady state: another resync changes nothing.
    let writes = op.ctx.api_writes.get();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(op.ctx.api_writes.get(), writes, "an Active Tunnel costs no API writes");

    // The client's pod dies and is started again: bytes flow again through the same exit server.
    let host = host_id(&tunnel);
    let pid = kubelet.pid.load(Ordering::Relaxed);
    assert!(std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    eventually("the client started again", Duration::from_secs(20), || async {
        (kubelet.starts.load(Ordering::Relaxed) == 2).then_some(())
    })
    .await;
    carries(&ip, 8080, Some(5353)).await;
    let after = active(&tunnels, "web-tunnel", Duration::from_secs(30)).await;
    assert_eq!((host_id(&after), host_ip(&after)), (host, ip), "a client restart keeps the exit server");
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn service_port_changes_follow_on_the_same_exit_server() {
    let ns = TestNs::new("tun-ports").await;
    let op = TunnelOperator::start(&ns, fast_tunnel_settings()).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    services.create(&PostParams::default(), &web("web")).await.unwrap();
    // The tunnel client runs (as a kubelet would run its Deployment): Active needs it.
    let _kubelet = ClientRunner::start(ns.client.clone(), &ns.name, "web-tunnel-client", Backends::default());
    let before = active(&tunnels, "web-tunnel", Duration::from_secs(60)).await;
    carries(&host_ip(&before), 8080, None).await;

    // Add a TCP port and drop the UDP one.
    let patch = serde_json::json!({"spec": {"ports": [
        {"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "admin", "port": 9090, "protocol": "TCP"}]}});
    services.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let after = eventually("Tunnel exposes 8080 and 9090", Duration::from_secs(30), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        let ports: Vec<i32> = t.status.as_ref()?.ports.iter().map(|p| p.port).collect();
        (ports == [8080, 9090] && t.status.as_ref()?.phase == Some(TunnelPhase::Active)).then_some(t)
    })
    .await;
    assert_eq!(host_id(&after), host_id(&before), "no new exit server for a port change");
    assert_eq!(host_ip(&after), host_ip(&before), "the address stays");
    // Through a config push to the running server, as on a cloud VM: it persisted the push's
    // generation beside its config.
    let generation = std::fs::read_to_string(op.local.host_dir(&host_id(&after)).join("server.toml.generation"));
    assert!(generation.is_ok_and(|g| g.trim().parse::<u64>().is_ok_and(|g| g >= 1)), "no push reached the server");
    carries(&host_ip(&after), 9090, None).await;
    carries(&host_ip(&after), 8080, None).await;
    eventually("UDP 5353 closed", Duration::from_secs(20), || async {
        udp_echo(&host_ip(&after), 5353, b"x").await.is_none().then_some(())
    })
    .await;
    eventually("Service ingress lists 8080 and 9090", Duration::from_secs(20), || async {
        let s = services.get("web").await.ok()?;
        let ports: Vec<i32> =
            s.status?.load_balancer?.ingress?.first()?.ports.clone()?.iter().map(|p| p.port).collect();
        (ports == [8080, 9090]).then_some(())
    })
    .await;
    let reasons: Vec<String> = events(&ns.client, &ns.name, "web-tunnel").await.into_iter().map(|e| e.0).collect();
    assert!(reasons.contains(&"PortsChanged".to_string()), "{reasons:?}");
    finish_tunnels(op, ns).await;
}

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
async fn deleting_the_tunnel_gives_a_fresh_exit_server_with_a_new_address() {
    let ns = TestNs::new("tun-fresh").await;
    let op = TunnelOperator::start(&ns, fast_tunnel_settings()).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    services.create(&PostParams::default(), &web("web")).await.unwrap();
    // The tunnel client runs (as a kubelet would run its Deployment): Active needs it.
    let _kubelet = ClientRunner::start(ns.client.clone(), &ns.name, "web-tunnel-client", Backends::default());
    let old = active(&tunnels, "web-tunnel", Duration::from_secs(60)).await;
    tunnels.delete("web-tunnel", &DeleteParams::default()).await.unwrap();

    let new = eventually("a new Tunnel, Active", Duration::from_secs(60), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        (t.uid() != old.uid() && t.status.as_ref()?.phase == Some(TunnelPhase::Active)).then_some(t)
    })
    .await;
    assert_eq!(op.local.get(&host_id(&old)).await.unwrap(), None, "the old exit server is gone");
    assert_ne!(host_id(&new), host_id(&old));
    assert_ne!(host_ip(&new), host_ip(&old), "a new address");
    eventually("Service shows the new address", Duration::from_secs(20), || async {
        (ingress_ip(&services.get("web").await.ok()?)? == host_ip(&new)).then_some(())
    })
    .await;
    carries(&host_ip(&new), 8080, None).await;
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn an_exit_server_killed_out_of_band_is_replaced_at_the_next_resync() {
    let ns = TestNs::new("tun-kill").await;
    let op = TunnelOperator::start(&ns, fast_tunnel_settings()).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    services.create(&PostParams::default(), &web("web")).await.unwrap();
    // The tunnel client runs (as a kubelet would run its Deployment): Active needs it.
    let _kubelet = ClientRunner::start(ns.client.clone(), &ns.name, "web-tunnel-client", Backends::default());
    let old = active(&tunnels, "web-tunnel", Duration::from_secs(60)).await;

    tunnels::kill_exit_server(&op, &host_id(&old));
    // Resync is 2 s: replaced well within a few periods, the Service following.
    let new = tunnels::active_elsewhere(&tunnels, "web-tunnel", &host_id(&old)).await;
    assert_eq!(op.local.get(&host_id(&old)).await.unwrap(), None, "the dead host is deleted, not left");
    eventually("Service shows the replacement's address", Duration::from_secs(20), || async {
        (ingress_ip(&services.get("web").await.ok()?)? == host_ip(&new)).then_some(())
    })
    .await;
    let reasons: Vec<String> = events(&ns.client, &ns.name, "web-tunnel").await.into_iter().map(|e| e.0).collect();
    assert!(reasons.contains(&"ExitServerLost".to_string()), "{reasons:?}");
    carries(&host_ip(&new), 8080, None).await;
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn deleting_the_service_deletes_the_tunnel_and_its_exit_server() {
    let ns = TestNs::new("tun-svcdel").await;
    let op = TunnelOperator::start(&ns, fast_tunnel_settings()).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    services.create(&PostParams::default(), &web("web")).await.unwrap();
    // The tunnel client runs (as a kubelet would run its Deployment): Active needs it.
    let _kubelet = ClientRunner::start(ns.client.clone(), &ns.name, "web-tunnel-client", Backends::default());
    let tunnel = active(&tunnels, "web-tunnel", Duration::from_secs(60)).await;
    services.delete("web", &DeleteParams::default()).await.unwrap();

    // The garbage collector deletes the owned Tunnel; its finalizer deletes the host.
    tunnels::gone(&tunnels, "web-tunnel").await;
    assert_eq!(op.local.get(&host_id(&tunnel)).await.unwrap(), None);
    let left = op.local.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap();
    assert!(left.is_empty(), "nothing leaked: {left:?}");
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn the_orphan_sweep_deletes_tagged_hosts_without_a_tunnel_and_keeps_the_rest() {
    use std::sync::atomic::Ordering::Relaxed;
    let ns = TestNs::new("tun-sweep").await;

    // Hosts as a crashed or finalizer-less skyport could leave them, made before the operator
    // starts (a host made while a sweep runs may be swept halfway through its own creation):
    // one of this cluster and namespace with no Tunnel, one of another cluster, one of another
    // namespace.
    let make = |cluster: &str, namespace: &str| {
        let mut tags = providers::owner_tags(&tunnels::uuid(), namespace, "gone-tunnel");
        tags.insert(TAG_CLUSTER.to_string(), cluster.to_string());
        providers::HostRequest {
            name: "skyport-orphan".into(),
            region: None,
            size: None,
            user_data: String::new(),
            server: providers::ExitServer {
                control_port: 2333,
                noise_private_key: providers::userdata::NoiseKeypair::generate().private_key,
                services: vec![providers::TunnelService {
                    name: "tcp-8080".into(),
                    protocol: providers::Protocol::Tcp,
                    port: 8080,
                    token: "t".into(),
                }],
            },
            tags,
        }
    };
    let leftovers = tunnels::local_provider(&ns);
    let cluster = tunnels::test_cluster_id(&ns);
    let orphan = leftovers.create(&make(&cluster, &ns.name)).await.unwrap();
    let foreign = leftovers.create(&make("another-cluster", &ns.name)).await.unwrap();
    let elsewhere = leftovers.create(&make(&cluster, "another-namespace")).await.unwrap();

    let op = TunnelOperator::start(&ns, tunnels::sweeping_settings()).await;
    assert_eq!(op.ctx.cluster_id, cluster);
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    services.create(&PostParams::default(), &web("web")).await.unwrap();
    // The tunnel client runs (as a kubelet would run its Deployment): Active needs it.
    let _kubelet = ClientRunner::start(ns.client.clone(), &ns.name, "web-tunnel-client", Backends::default());
    let live = active(&tunnels, "web-tunnel", Duration::from_secs(60)).await;

    eventually("orphan deleted by the sweep", Duration::from_secs(20), || async {
        op.local.get(&orphan.id).await.unwrap().is_none().then_some(())
    })
    .await;
    tunnels::two_more_sweeps(&op).await;
    assert_eq!(op.ctx.orphans_deleted.load(Relaxed), 1, "only the orphan is deleted");
    assert!(op.local.get(&foreign.id).await.unwrap().is_some(), "another cluster's host is kept");
    assert!(op.local.get(&elsewhere.id).await.unwrap().is_some(), "a host outside the namespace is kept");
    assert!(op.local.get(&host_id(&live)).await.unwrap().is_some(), "a live Tunnel's host is kept");
    op.local.delete(&foreign.id).await.unwrap();
    op.local.delete(&elsewhere.id).await.unwrap();
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
    let op = TunnelOperator::start(&ns, settings).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    services.create(&PostParams::default(), &web("web")).await.unwrap();
    // The tunnel client runs (as a kubelet would run its Deployment): Active needs it.
    let _kubelet = ClientRunner::start(ns.client.clone(), &ns.name, "web-tunnel-client", Backends::default());

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

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn without_a_connected_client_a_tunnel_is_never_ready_and_its_host_is_replaced_in_time() {
    let ns = TestNs::new("tun-noclient").await;
    let mut settings = fast_tunnel_settings();
    settings.boot_timeout = Duration::from_secs(4);
    settings.replace_after = Duration::from_secs(12);
    let op = TunnelOperator::start(&ns, settings).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    services.create(&PostParams::default(), &web("web")).await.unwrap();
    let no_ingress =
        || async { assert_eq!(ingress_ip(&services.get("web").await.unwrap()), None, "address published") };

    // The exit server runs, but no client is connected: Provisioning, WaitingForTunnel, with the
    // probe's reason; nothing on the Service.
    let waiting = eventually("Ready=False WaitingForTunnel", Duration::from_secs(60), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        (ready(&t)?.1 == "WaitingForTunnel" && t.status.as_ref()?.host_id.is_some()).then_some(t)
    })
    .await;
    let (status, _, message) = ready(&waiting).unwrap();
    assert_eq!(status, ConditionStatus::False);
    assert_eq!(waiting.status.as_ref().unwrap().phase, Some(TunnelPhase::Provisioning));
    assert!(message.contains(&format!("{}:2334", host_ip(&waiting))), "{message}");
    no_ingress().await;
    let secret: Secret = ns.api().get("web-tunnel-credentials").await.unwrap();
    let token = String::from_utf8(secret.data.unwrap()["token"].0.clone()).unwrap();
    assert!(!message.contains(&token));

    // Past the boot timeout: TunnelNotEstablished, one Warning Event on the Tunnel and the Service.
    eventually("Ready=False TunnelNotEstablished", Duration::from_secs(30), || async {
        (ready(&tunnels.get("web-tunnel").await.ok()?)?.1 == "TunnelNotEstablished").then_some(())
    })
    .await;
    no_ingress().await;
    for involved in ["web-tunnel", "web"] {
        let warned =
            eventually(&format!("TunnelNotEstablished Event on {involved}"), Duration::from_secs(10), || async {
                let events = events(&ns.client, &ns.name, involved).await;
                let n = events.iter().filter(|(r, _)| r == "TunnelNotEstablished").count();
                (n > 0).then_some(n)
            })
            .await;
        assert!(warned <= 2, "one Event per state change, not one per probe: {warned}");
    }

    // Past the replace time: the host is replaced, the clock restarts with the new one.
    let old = host_id(&waiting);
    let replaced = eventually("a new exit server", Duration::from_secs(60), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        (t.status.as_ref()?.host_id.as_deref().is_some_and(|id| id != old)).then_some(t)
    })
    .await;
    assert_eq!(op.local.get(&old).await.unwrap(), None, "the old exit server is deleted");
    no_ingress().await;
    assert_ne!(ready(&replaced).map(|r| r.0), Some(ConditionStatus::True));

    // Once the client runs, the probe passes: Active, and only now the address on the Service.
    let _kubelet = ClientRunner::start(ns.client.clone(), &ns.name, "web-tunnel-client", Backends::default());
    let live = active(&tunnels, "web-tunnel", Duration::from_secs(60)).await;
    assert_eq!(ready(&live).unwrap().0, ConditionStatus::True);
    eventually("Service shows the address", Duration::from_secs(20), || async {
        (ingress_ip(&services.get("web").await.ok()?)? == host_ip(&live)).then_some(())
    })
    .await;
    carries(&host_ip(&live), 8080, None).await;
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_tunnel_whose_client_stops_is_no_longer_ready_and_its_address_is_withdrawn() {
    let ns = TestNs::new("tun-clientdown").await;
    let op = TunnelOperator::start(&ns, fast_tunnel_settings()).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    services.create(&PostParams::default(), &web("web")).await.unwrap();
    let kubelet = ClientRunner::start(ns.client.clone(), &ns.name, "web-tunnel-client", Backends::default());
    let live = active(&tunnels, "web-tunnel", Duration::from_secs(60)).await;
    eventually("Service shows the address", Duration::from_secs(20), || async {
        (ingress_ip(&services.get("web").await.ok()?)? == host_ip(&live)).then_some(())
    })
    .await;

    // The client process is killed (the pod is gone): at the next probe Ready goes False and
    // the address leaves the Service.
    drop(kubelet);
    eventually("Ready=False WaitingForTunnel", Duration::from_secs(30), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        let (status, reason, _) = ready(&t)?;
        (status == ConditionStatus::False && reason == "WaitingForTunnel").then_some(())
    })
    .await;
    eventually("ingress withdrawn", Duration::from_secs(20), || async {
        ingress_ip(&services.get("web").await.ok()?).is_none().then_some(())
    })
    .await;

    // The client back: Ready again, on the same exit server.
    let _kubelet = ClientRunner::start(ns.client.clone(), &ns.name, "web-tunnel-client", Backends::default());
    let again = active(&tunnels, "web-tunnel", Duration::from_secs(60)).await;
    assert_eq!(host_id(&again), host_id(&live));
    eventually("Service shows the address again", Duration::from_secs(20), || async {
        (ingress_ip(&services.get("web").await.ok()?)? == host_ip(&live)).then_some(())
    })
    .await;
    finish_tunnels(op, ns).await;
}
