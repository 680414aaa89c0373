//! Highly available Tunnels (`skyport.dev/high-availability: "true"`) on the test node, with the
//! local provider: two real exit servers with a client Pod each, the active one killed (or its
//! client Pod kept from running by the namespace's Pod quota) while a client sends a request
//! every 100 ms to the Service's address, or hung (SIGSTOP). benches/tunnel.rs `--failover`
//! measures the same. And mode `BothAddresses`: both servers' own addresses on the Service, a dead one dropped.

use crate::common;
use crate::common::tunnels;

use std::time::Duration;

use common::eventually;
use common::requests::Requests;
use providers::HostProvider;
use providers::hosts::TAG_TUNNEL_UID;
use skyport::crd::Tunnel;

use crate::node::pair::{Measured, PORT, Pair, ha};
use crate::node::tunnels::{ACTIVE, AFTER_QUOTA, NodeTunnel, set_pod_quota};
use tunnels::{carries, finish_tunnels, ingress_ip};

/// Runs `fault` while requests go to the reserved address; waits for the address to move off
/// the active server and requests to be answered again, and checks what a user sees: the same
/// address, one failover with its reason and Event. Returns the Tunnel then and how long the
/// move took.
async fn failover(pair: &Pair, what: &str, fault: impl AsyncFnOnce(&Pair)) -> (Tunnel, Duration) {
    let Measured { moved, moved_after, gap, answered, sent, .. } = pair.measure(fault, false).await;
    // A benchmark figure (benches/tunnel.rs --failover), not an assertion of speed.
    println!(
        "failover after {what}: address moved {:.1} s after it; longest gap without an answer {:.1} s \
         ({answered} of {sent} requests answered)",
        moved_after.as_secs_f64(),
        gap.as_secs_f64()
    );
    let status = ha(&moved);
    let last = status.last_failover.clone().expect("lastFailover");
    assert_eq!(last.from, pair.active);
    assert_eq!(status.failovers, Some(1));
    let service = pair.services.get("web").await.unwrap();
    assert_eq!(ingress_ip(&service).as_deref(), Some(pair.ip.as_str()), "the same address");
    let events = tunnels::events_with(&pair.ns.client, &pair.ns.name, "web-tunnel", "Failover").await;
    assert!(events.iter().any(|(reason, note)| reason == "Failover" && note.contains(&pair.active)), "{events:?}");
    carries(&pair.ip, PORT, None).await;
    (moved, moved_after)
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_killed_active_exit_server_hands_the_address_to_the_standby() {
    let Some(pair) = Pair::start("tun-ha").await else { return };
    let first = pair.active.clone();
    let (moved, _) =
        failover(&pair, "the active exit server was killed", async |p| tunnels::kill_exit_server(&p.op, &p.active))
            .await;
    let last = ha(&moved).last_failover.unwrap();
    assert!(last.reason.contains("not running"), "{last:?}");

    // The killed server's slot gets a new exit server, which becomes the passing standby.
    eventually("a new standby passing its check", Duration::from_secs(60), || async {
        let t = pair.tunnels.get("web-tunnel").await.ok()?;
        let servers = ha(&t).servers;
        let fresh = servers.iter().all(|s| s.healthy && s.host_id.as_deref() != Some(first.as_str()));
        (servers.len() == 2 && fresh).then_some(())
    })
    .await;
    let uid = moved.metadata.uid.clone().unwrap();
    assert_eq!(pair.op.local.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().len(), 2, "no leftover exit server");
    assert_eq!(pair.op.local.list_addresses_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().len(), 1);
    finish_tunnels(pair.op, pair.ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_client_that_stays_down_hands_the_address_to_the_standby_after_the_hysteresis() {
    let Some(pair) = Pair::start("tun-ha-client").await else { return };
    let slot = pair.active_slot().await;
    // Its node is gone: the client Pod is deleted and nothing starts it again.
    let (moved, moved_after) =
        failover(&pair, "the active server's client stopped", async |p| p.stop_client(slot).await).await;
    let last = ha(&moved).last_failover.unwrap();
    assert!(last.reason.contains("health checks in a row"), "{last:?}");
    assert!(moved_after >= Duration::from_secs(2), "no move before the hysteresis: {moved_after:?}");

    // The client comes back: the address stays where it is, both servers pass.
    set_pod_quota(&pair.ns, None).await;
    pair.both_healthy(AFTER_QUOTA).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t = pair.tunnels.get("web-tunnel").await.unwrap();
    assert_eq!(ha(&t).active, ha(&moved).active, "no move back to a recovered server");
    assert_eq!(ha(&t).failovers, Some(1));
    finish_tunnels(pair.op, pair.ns).await;
}

/// Lets exit server `.1` go on (SIGCONT) when dropped, even when the test fails: a stopped
/// process would hold its listeners until the end of the test run.
struct Hung<'a>(&'a tunnels::TunnelOperator, String);

impl Drop for Hung<'_> {
    fn drop(&mut self) {
        tunnels::signal_exit_server(self.0, &self.1, "CONT");
    }
}

/// How many of `n` requests in a row through `ip` were answered (each a fresh connection).
async fn answered_in_a_row(ip: &str, n: usize) -> usize {
    let mut answered = 0;
    for _ in 0..n {
        let answer = tokio::time::timeout(Duration::from_secs(5), crate::common::kubelet::tcp_echo(ip, PORT, b"ping"));
        answered += usize::from(matches!(answer.await, Ok(Some((_, echoed))) if echoed == b"ping"));
    }
    answered
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_hung_active_exit_server_hands_the_address_to_the_standby_after_the_hysteresis() {
    let Some(pair) = Pair::start("tun-ha-hung").await else { return };
    let hung = Hung(&pair.op, pair.active.clone());
    let (moved, _) = failover(&pair, "the active exit server hung (SIGSTOP)", async |p| {
        tunnels::signal_exit_server(&p.op, &p.active, "STOP")
    })
    .await;
    let last = ha(&moved).last_failover.unwrap();
    // Its process runs (the provider says so): only the checks, timing out, find it.
    assert!(last.reason.contains("health checks in a row") && last.reason.contains("did not answer"), "{last:?}");
    // Still hung: every new connection to the address reaches the new holder, none the hung one.
    assert_eq!(answered_in_a_row(&pair.ip, 20).await, 20, "requests to the address while the old holder hangs");
    drop(hung);
    finish_tunnels(pair.op, pair.ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_config_change_rolls_the_clients_one_at_a_time_through_a_handover() {
    let Some(pair) = Pair::start("tun-ha-roll").await else { return };
    let roll = pair.measure(async |p| p.add_port().await, true).await;
    let handed = roll.moved;
    carries(&pair.ip, PORT + 1, None).await;
    println!(
        "client roll through a handover: done {:.1} s after the port change; longest gap without an answer {:.1} s \
         ({} of {} requests answered)",
        roll.settled_after.as_secs_f64(),
        roll.gap.as_secs_f64(),
        roll.answered,
        roll.sent
    );
    assert_eq!(ha(&handed).failovers, None, "a planned handover is no failover");
    let events = tunnels::events_with(&pair.ns.client, &pair.ns.name, "web-tunnel", "Handover").await;
    assert!(events.iter().any(|(reason, _)| reason == "Handover"), "{events:?}");
    finish_tunnels(pair.op, pair.ns).await;
}

/// The Service's ingress addresses.
async fn ingress_ips(services: &kube::Api<k8s_openapi::api::core::v1::Service>) -> Option<Vec<String>> {
    let s = services.get("web").await.ok()?;
    let ingress = s.status?.load_balancer?.ingress?;
    Some(ingress.into_iter().filter_map(|i| i.ip).collect())
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn with_both_addresses_a_killed_server_leaves_the_service_and_the_other_carries_on() {
    let ports = serde_json::json!([{"name": "http", "port": PORT, "protocol": "TCP"}]);
    let annotations = serde_json::json!({"skyport.dev/high-availability": "both-addresses"});
    let web = tunnels::service("web", Some("skyport.dev/tunnel"), annotations, ports);
    let backend = format!("{PORT}/tcp");
    let settings = tunnels::fast_tunnel_settings();
    let Some(NodeTunnel { ns, op, services, tunnels: api, turn: _turn, .. }) =
        NodeTunnel::start_with("tun-both", settings, &[&backend], None, web).await
    else {
        return;
    };
    tunnels::active(&api, "web-tunnel", ACTIVE).await;
    let ips = eventually("both servers' addresses on the Service", ACTIVE, || async {
        ingress_ips(&services).await.filter(|ips| ips.len() == 2)
    })
    .await;
    for ip in &ips {
        carries(ip, PORT, None).await;
    }
    let t = api.get("web-tunnel").await.unwrap();
    assert!(t.status.as_ref().unwrap().address_id.is_none(), "nothing reserved");
    let (doomed, survivor) = (&ips[0], &ips[1]);
    let host = ha(&t).servers.iter().find(|s| s.host_ip.as_ref() == Some(doomed)).and_then(|s| s.host_id.clone());

    // Whether each is answered at all: 5 s each, since under the whole suite's load a request
    // through the node can take longer than a second.
    let kept = ha(&t).servers.iter().find(|s| s.host_ip.as_ref() == Some(survivor)).cloned().expect("its server");
    let survivor_pods = client_pods(&ns, &kept.slot).await;
    let requests = Requests::with_patience(survivor.clone(), PORT, Duration::from_secs(5));
    tokio::time::sleep(Duration::from_secs(1)).await;
    tunnels::kill_exit_server(&op, &host.expect("the server of the first address"));
    eventually("only the other address on the Service", Duration::from_secs(30), || async {
        (ingress_ips(&services).await? == [survivor.clone()]).then_some(())
    })
    .await;
    let events = tunnels::events_with(&ns.client, &ns.name, "web-tunnel", "AddressWithdrawn").await;
    assert!(events.iter().any(|(reason, note)| reason == "AddressWithdrawn" && note.contains(doomed)), "{events:?}");
    // The killed server's slot is filled again, on a new address, which joins the Service.
    let fresh = eventually("the replacement's address on the Service", ACTIVE, || async {
        let ips = ingress_ips(&services).await?;
        (ips.len() == 2 && !ips.contains(doomed)).then_some(ips)
    })
    .await;
    for ip in &fresh {
        carries(ip, PORT, None).await;
    }
    // The other server and its client ran on untouched. The requests are figures: under the whole
    // suite's load on two cores a request through the node can go unanswered for the machine's
    // reasons; an address withdrawn or a server replaced would leave most unanswered.
    let after = api.get("web-tunnel").await.unwrap();
    let still = ha(&after).servers.iter().find(|s| s.slot == kept.slot).and_then(|s| s.host_id.clone());
    assert_eq!(still, kept.host_id, "the other server is kept");
    assert_eq!(client_pods(&ns, &kept.slot).await, survivor_pods, "its client Pod ran on, never restarted");
    // A request counts once its 5 s of patience are over; on a quiet machine the failover and the
    // replacement take less than that, and none sent since the kill would count yet.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (answered, sent) = requests.tally();
    println!("one of both addresses lost: {answered} of {sent} requests to the other answered meanwhile");
    assert!(answered * 2 > sent, "the other server's address kept answering: {answered} of {sent}");
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_client_image_that_cannot_be_pulled_halts_the_roll_while_the_address_keeps_answering() {
    use k8s_openapi::api::apps::v1::Deployment;
    let Some(pair) = Pair::start("tun-ha-badimg").await else { return };
    let deployments: kube::Api<Deployment> = pair.ns.api();
    let slot = pair.active_slot().await;
    let (holder, standby) = (["a", "b"][slot], ["a", "b"][1 - slot]);
    let image_of = async |slot: &str| {
        let d = deployments.get(&format!("web-tunnel-client-{slot}")).await.unwrap();
        d.spec.unwrap().template.spec.unwrap().containers[0].image.clone().unwrap()
    };
    let good = image_of(holder).await;
    // The holder's client Pod, by UID and restarts: what a roll onto the bad image would replace.
    let before = client_pods(&pair.ns, holder).await;
    let requests = Requests::with_patience(pair.ip.clone(), PORT, Duration::from_secs(5));

    // A new operator version whose client image does not exist: the standby's client rolls
    // first and never comes up.
    let Pair { ns, op, tunnels, ip, active, _turn, .. } = pair;
    let mut settings = op.ctx.settings.clone();
    op.stop().await;
    settings.client_image = "registry.invalid/skyport/missing:0".into();
    let op = tunnels::TunnelOperator::start(&ns, settings.clone()).await;
    eventually("the standby's client rolled onto the new image", Duration::from_secs(60), || async {
        (image_of(standby).await != good).then_some(())
    })
    .await;
    // Longer than a minute: the holder's client is never rolled for the standby's sake.
    tokio::time::sleep(Duration::from_secs(65)).await;
    let t = tunnels.get("web-tunnel").await.unwrap();
    assert_eq!(ha(&t).active.as_deref(), Some(active.as_str()), "the address stays on the holder");
    assert_eq!(image_of(holder).await, good, "the holder's client is not rolled onto an image that cannot run");
    // Ready follows the holder's last check: under the whole suite's load on two cores one check
    // can fail now and then, and the next passes. What must hold is that the pair is Active with
    // the halted roll named, which a few passes show.
    let message = eventually("Ready, with the halted roll named", Duration::from_secs(30), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        let (_, reason, message) = tunnels::ready(&t)?;
        (reason == "Active").then_some(message)
    })
    .await;
    assert!(message.contains("client roll:") && message.contains("to roll out"), "{message}");
    assert_eq!(client_pods(&ns, holder).await, before, "the holder's client Pod ran on, never replaced or restarted");
    // Figures, not the verdict: under the whole suite's load on two cores a request through the
    // node can go unanswered for reasons of the machine's (the holder's Pod ran on, as checked).
    // An address moved off the holder, or withdrawn, would leave most unanswered.
    let (answered, sent) = requests.tally();
    println!("bad client image: {answered} of {sent} requests answered while the roll was halted");
    assert!(answered * 2 > sent, "the reserved address kept answering: {answered} of {sent}");

    // The image fixed: the roll completes.
    op.stop().await;
    settings.client_image = good.clone();
    let op = tunnels::TunnelOperator::start(&ns, settings).await;
    eventually("the roll done: both clients on the image, both servers passing", ACTIVE, || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        let message = tunnels::ready(&t)?.2;
        let healthy = ha(&t).servers.iter().filter(|s| s.healthy).count() == 2;
        (healthy && !message.contains("client roll:")).then_some(())
    })
    .await;
    assert_eq!((image_of("a").await, image_of("b").await), (good.clone(), good));
    carries(&ip, PORT, None).await;
    finish_tunnels(op, ns).await;
}

/// Slot `slot`'s client Pods by UID, with their restarts: one, once its client rolled out.
async fn client_pods(ns: &common::TestNs, slot: &str) -> Vec<(Option<String>, i32)> {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = ns.api();
    let selector = format!("app.kubernetes.io/instance=web-tunnel-client-{slot}");
    let listed = pods.list(&kube::api::ListParams::default().labels(&selector)).await.unwrap().items;
    let found: Vec<_> = listed.iter().map(|p| (p.metadata.uid.clone(), crate::node::tunnels::restarts(p))).collect();
    assert_eq!(found.len(), 1, "one client Pod for slot {slot}: {found:?}");
    found
}
