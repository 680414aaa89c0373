//! The size and region allow-lists against the real test environment with the local provider:
//! whoever can create a LoadBalancer Service must not order any exit server they like.

use crate::common;
use crate::common::tunnels;

use std::time::Duration;

use common::{TestNs, eventually};
use k8s_openapi::api::core::v1::{Event, Service};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use providers::HostProvider;
use providers::hosts::{MANAGED_BY_VALUE, TAG_MANAGED_BY};
use skyport::crd::{ConditionStatus, Tunnel, TunnelPhase};
use tunnels::{TunnelOperator, fast_tunnel_settings, finish_tunnels};

fn service(name: &str, annotations: serde_json::Value) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": "skyport.dev/tunnel",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "selector": {"app": name},
        },
    }))
    .unwrap()
}

async fn events(client: &Client, ns: &str, involved: &str) -> Vec<(String, String, String)> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let list = api.list(&Default::default()).await.unwrap();
    list.items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(involved))
        .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

fn phase(t: &Tunnel) -> Option<TunnelPhase> {
    t.status.as_ref()?.phase
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_size_or_region_off_the_allow_lists_fails_without_an_exit_server_and_a_listed_one_works() {
    let ns = TestNs::new("tun-allow").await;
    let mut settings = fast_tunnel_settings();
    settings.allowed_sizes = vec!["small".into()];
    let op = TunnelOperator::start(&ns, settings).await;
    // Active needs each Tunnel's client running (as a kubelet would run its Deployment).
    let _kubelet = common::kubelet::AllClients::start(ns.client.clone(), &ns.name);
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();

    // An unlisted size, and a region while no region list is set (only the default region).
    services
        .create(&PostParams::default(), &service("big", serde_json::json!({"skyport.dev/size": "huge"})))
        .await
        .unwrap();
    services
        .create(&PostParams::default(), &service("far", serde_json::json!({"skyport.dev/region": "elsewhere"})))
        .await
        .unwrap();
    for (name, flag, asked) in
        [("big", "--tunnel-allowed-sizes", "\"huge\""), ("far", "--tunnel-allowed-regions", "\"elsewhere\"")]
    {
        let tunnel_name = format!("{name}-tunnel");
        let failed = eventually(&format!("Tunnel {tunnel_name} Failed"), Duration::from_secs(30), || async {
            let t = tunnels.get(&tunnel_name).await.ok()?;
            (phase(&t) == Some(TunnelPhase::Failed)).then_some(t)
        })
        .await;
        let status = failed.status.clone().unwrap();
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready").expect("Ready condition");
        assert_eq!((ready.status, ready.reason.as_str()), (ConditionStatus::False, "NotAllowed"));
        assert!(ready.message.contains(flag) && ready.message.contains(asked), "{}", ready.message);
        assert!(status.host_id.is_none(), "no exit server recorded: {status:?}");
        for involved in [tunnel_name.as_str(), name] {
            let found = eventually(&format!("NotAllowed Event on {involved}"), Duration::from_secs(20), || async {
                let found: Vec<_> =
                    events(&ns.client, &ns.name, involved).await.into_iter().filter(|e| e.1 == "NotAllowed").collect();
                (!found.is_empty()).then_some(found)
            })
            .await;
            assert_eq!(found.len(), 1, "one Event on {involved}: {found:?}");
            assert_eq!(found[0].0, "Warning");
            assert!(found[0].2.contains(flag), "{found:?}");
        }
    }
    assert!(op.local.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap().is_empty(), "no exit server made");

    // Not retried: past several resync periods (2 s) the refused Tunnel is left untouched.
    let before = tunnels.get("big-tunnel").await.unwrap().resource_version();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(tunnels.get("big-tunnel").await.unwrap().resource_version(), before, "a refused Tunnel is not retried");

    // A listed size, and no size at all (the provider's default), are served.
    services
        .create(&PostParams::default(), &service("ok", serde_json::json!({"skyport.dev/size": "small"})))
        .await
        .unwrap();
    services.create(&PostParams::default(), &service("plain", serde_json::json!({}))).await.unwrap();
    for name in ["ok-tunnel", "plain-tunnel"] {
        let active = eventually(&format!("Tunnel {name} Active"), Duration::from_secs(60), || async {
            let t = tunnels.get(name).await.ok()?;
            (phase(&t) == Some(TunnelPhase::Active)).then_some(t)
        })
        .await;
        assert!(active.status.unwrap().host_id.is_some(), "{name} has an exit server");
    }
    assert_eq!(op.local.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap().len(), 2, "only the allowed");
    assert!(events(&ns.client, &ns.name, "ok-tunnel").await.iter().all(|e| e.1 != "NotAllowed"));
    finish_tunnels(op, ns).await;
}
