//! Ready means the tunnel is through, not only that the exit server runs: no address on the
//! Service until a client is connected, withdrawn when it goes, and a host whose client never
//! runs kept (a new one cannot help) with the fault named. On the test node: the client Pod is
//! kept from running by the namespace's Pod quota, as a platform team's quota would.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use providers::HostProvider;
use skyport::crd::{ConditionStatus, TunnelPhase};

use crate::common::eventually;
use crate::common::tunnels::{
    active, carries, events, fast_tunnel_settings, finish_tunnels, host_id, host_ip, ingress_ip, ready, web,
};
use crate::node::tunnels::{ACTIVE, AFTER_QUOTA, BACKEND_PORTS, NodeTunnel, running_client, set_pod_quota};

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn without_a_running_client_a_tunnel_is_never_ready_and_no_new_exit_server_is_bought() {
    let mut settings = fast_tunnel_settings();
    settings.boot_timeout = Duration::from_secs(4);
    settings.replace_after = Duration::from_secs(12);
    let Some(NodeTunnel { ns, op, services, tunnels, turn: _turn, .. }) =
        NodeTunnel::start_with("tun-noclient", settings, BACKEND_PORTS, Some(1), web("web")).await
    else {
        return;
    };
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

    // Past the boot timeout: the exit server answers but the client Deployment has no available
    // replica (the quota refuses its Pod): ClientNotAvailable, one Warning Event on the Tunnel and the
    // Service.
    // Within the boot timeout of a pass at most, but passes slow down under the whole suite's load.
    eventually("Ready=False ClientNotAvailable", Duration::from_secs(90), || async {
        (ready(&tunnels.get("web-tunnel").await.ok()?)?.1 == "ClientNotAvailable").then_some(())
    })
    .await;
    no_ingress().await;
    for involved in ["web-tunnel", "web"] {
        let warned =
            eventually(&format!("ClientNotAvailable Event on {involved}"), Duration::from_secs(10), || async {
                let events = events(&ns.client, &ns.name, involved).await;
                let n = events.iter().filter(|(r, _)| r == "ClientNotAvailable").count();
                (n > 0).then_some(n)
            })
            .await;
        assert!(warned <= 2, "one Event per state change, not one per probe: {warned}");
    }

    // Well past the replace time: a new exit server cannot help a client that does not run, so
    // the one host is kept and no other was bought.
    let old = host_id(&waiting);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let kept = tunnels.get("web-tunnel").await.unwrap();
    assert_eq!(host_id(&kept), old, "the exit server was replaced");
    assert_eq!(ready(&kept).unwrap().1, "ClientNotAvailable");
    let created = op.local.limiter().counters.snapshot().get("CreateHost").copied();
    assert_eq!(created, Some(1), "exit servers created");
    no_ingress().await;

    // Once the client runs, the probe passes: Active, and only now the address on the Service.
    set_pod_quota(&ns, None).await;
    let live = active(&tunnels, "web-tunnel", AFTER_QUOTA).await;
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
    let Some(NodeTunnel { ns, op, services, tunnels, turn: _turn, .. }) =
        NodeTunnel::start("tun-clientdown", fast_tunnel_settings(), BACKEND_PORTS).await
    else {
        return;
    };
    let live = active(&tunnels, "web-tunnel", ACTIVE).await;
    eventually("Service shows the address", Duration::from_secs(20), || async {
        (ingress_ip(&services.get("web").await.ok()?)? == host_ip(&live)).then_some(())
    })
    .await;

    // The client Pod is deleted and its replacement refused by the quota: at the next probe Ready
    // goes False and the address leaves the Service.
    set_pod_quota(&ns, Some(1)).await;
    let client = running_client(&ns).await;
    let pods: Api<Pod> = ns.api();
    pods.delete(&client.name_any(), &DeleteParams::default().grace_period(0)).await.expect("delete the client Pod");
    // Not a timing bound (the benchmarks measure that): on two cores busy with the whole suite
    // the kubelet may take a while to stop the container, and the checks pass until it has.
    eventually("Ready=False WaitingForTunnel", ACTIVE, || async {
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
    set_pod_quota(&ns, None).await;
    let again = active(&tunnels, "web-tunnel", AFTER_QUOTA).await;
    assert_eq!(host_id(&again), host_id(&live));
    eventually("Service shows the address again", Duration::from_secs(20), || async {
        (ingress_ip(&services.get("web").await.ok()?)? == host_ip(&live)).then_some(())
    })
    .await;
    finish_tunnels(op, ns).await;
}
