use super::*;

fn service(ports: serde_json::Value) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "team-a", "uid": "svc-uid"},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.0.0.7", "ports": ports},
    }))
    .unwrap()
}

#[test]
fn ports_are_sorted_deduplicated_and_default_to_tcp() {
    let svc = service(serde_json::json!([
        {"name": "dns", "port": 53, "protocol": "UDP"},
        {"name": "https", "port": 443},
        {"name": "http", "port": 80, "protocol": "TCP"},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
    ]));
    let ports = service_ports(&svc, 2333, 2334).unwrap();
    let got: Vec<_> = ports.iter().map(|p| (p.port, p.protocol.as_str())).collect();
    assert_eq!(got, [(53, "TCP"), (53, "UDP"), (80, "TCP"), (443, "TCP")]);
    assert_eq!(ports.iter().map(service_name).collect::<Vec<_>>(), ["tcp-53", "udp-53", "tcp-80", "tcp-443"]);
}

#[test]
fn sctp_the_control_port_and_no_ports_are_explained() {
    let sctp = service(serde_json::json!([{"name": "sig", "port": 3868, "protocol": "SCTP"}]));
    assert_eq!(
        service_ports(&sctp, 2333, 2334).unwrap_err().to_string(),
        "port 3868 (sig) uses SCTP; tunnels carry TCP and UDP only"
    );
    let clash = service(serde_json::json!([{"port": 2333}]));
    assert!(matches!(service_ports(&clash, 2333, 2334), Err(PortProblem::Reserved(2333))));
    let health = service(serde_json::json!([{"port": 2334}]));
    let problem = service_ports(&health, 2333, 2334).unwrap_err();
    assert_eq!(problem, PortProblem::HealthReserved(2334));
    assert!(problem.to_string().contains("--tunnel-health-port"), "{problem}");
    let udp_ok = service(serde_json::json!([{"port": 2333, "protocol": "UDP"}, {"port": 2334, "protocol": "UDP"}]));
    assert!(service_ports(&udp_ok, 2333, 2334).is_ok(), "only the TCP control and health ports are taken");
    let push = service(serde_json::json!([{"port": 2335}]));
    assert_eq!(service_ports(&push, 2333, 2334), Err(PortProblem::PushReserved(2335)));
    let push_udp = service(serde_json::json!([{"port": 2335, "protocol": "UDP"}]));
    assert!(service_ports(&push_udp, 2333, 2334).is_ok());
    assert_eq!(service_ports(&service(serde_json::json!([])), 2333, 2334), Err(PortProblem::NoPorts));
}

#[test]
fn the_proxy_protocol_reaches_each_tcp_service_of_the_exit_server_and_never_the_health_check() {
    let creds = Credentials::generate();
    let tcp = service(serde_json::json!([{"port": 80}, {"port": 443}]));
    let ports = proxied(service_ports(&tcp, 2333, 2334).unwrap(), Some(ProxyProtocol::V2)).unwrap();
    assert!(ports.iter().all(|p| p.proxy_protocol == Some(ProxyProtocol::V2)));
    let server = exit_server(&ports, &creds, 2333, 2334);
    for s in &server.services {
        let want = (s.name != crate::tunnel::HEALTH_SERVICE).then_some(providers::ProxyProtocol::V2);
        assert_eq!(s.proxy_protocol, want, "{}", s.name);
    }
    let plain = proxied(service_ports(&tcp, 2333, 2334).unwrap(), None).unwrap();
    assert!(exit_server(&plain, &creds, 2333, 2334).services.iter().all(|s| s.proxy_protocol.is_none()));

    // A UDP port cannot carry it: refused with the port and what to change.
    let mixed = service(serde_json::json!([{"port": 80}, {"port": 53, "protocol": "UDP"}]));
    let refused = proxied(service_ports(&mixed, 2333, 2334).unwrap(), Some(ProxyProtocol::V1)).unwrap_err();
    assert_eq!(refused, PortProblem::ProxyOverUdp(53));
    assert!(refused.to_string().contains("skyport.dev/proxy-protocol"), "{refused}");
}

#[test]
fn server_and_client_agree_on_names_tokens_and_keys() {
    let creds = Credentials::generate();
    let ports = vec![
        TunnelPort { port: 80, protocol: "TCP".into(), proxy_protocol: None },
        TunnelPort { port: 53, protocol: "UDP".into(), proxy_protocol: None },
    ];
    let server = exit_server(&ports, &creds, 2333, 2334);
    let client = client(&ports, &creds, "203.0.113.9", (2333, 2334), "10.0.0.7");
    assert_eq!(client.remote_addr, "203.0.113.9:2333");
    assert_eq!(client.server_public_key, creds.keypair.public_key);
    assert_eq!(server.noise_private_key, creds.keypair.private_key);
    for (s, c) in server.services.iter().zip(&client.services) {
        assert_eq!((&s.name, s.protocol, &s.token), (&c.name, c.protocol, &c.token));
        if s.name == crate::tunnel::HEALTH_SERVICE {
            // The health check ends at the client's own responder, never at the Service.
            assert_eq!((s.port, c.local_addr.as_str()), (2334, "127.0.0.1:2334"));
        } else {
            assert_eq!(c.local_addr, format!("10.0.0.7:{}", s.port));
        }
    }
    assert_eq!(server.services.len(), ports.len() + 1, "the Service's ports and the health port");
    assert_eq!(client.services.len(), server.services.len());
    let v6 = super::client(&ports, &creds, "203.0.113.9", (2333, 2334), "fd00::7");
    assert_eq!(v6.services[0].local_addr, "[fd00::7]:80");
    assert!(!format!("{creds:?}").contains(&creds.token));
}

#[test]
fn host_names_are_valid_labels_and_unique_when_shortened() {
    assert_eq!(host_name("team-a", "web-tunnel"), "skyport-team-a-web-tunnel");
    assert_eq!(host_name("ns", "a.b"), "skyport-ns-a-b");
    let long = host_name(&"n".repeat(63), "web-tunnel");
    assert_eq!(long.len(), 63);
    assert_ne!(long, host_name(&"n".repeat(63), "api-tunnel"));
    assert!(long.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
}

#[test]
fn only_the_controlling_tunnel_writes_the_service_status() {
    let svc = service(serde_json::json!([{"port": 80}]));
    let owned: Tunnel = serde_json::from_value(serde_json::json!({
        "apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel",
        "metadata": {"name": "web-tunnel", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "svc-uid", "controller": true}]},
        "spec": {"serviceRef": {"name": "web"}},
    }))
    .unwrap();
    assert!(controls_service_status(&owned, &svc));
    let mut by_hand = owned.clone();
    by_hand.metadata.owner_references = None;
    assert!(!controls_service_status(&by_hand, &svc));
}

#[test]
fn ingress_is_compared_as_the_api_returns_it() {
    let ports = vec![TunnelPort { port: 80, protocol: "TCP".into(), proxy_protocol: None }];
    let want = ingress("203.0.113.9", &ports);
    let mut svc = service(serde_json::json!([{"port": 80}]));
    assert!(!ingress_matches(&svc, &want));
    svc.status = Some(serde_json::from_value(serde_json::json!({"loadBalancer": {"ingress": want.clone()}})).unwrap());
    assert!(ingress_matches(&svc, &want));
    assert!(!ingress_matches(&svc, &ingress("203.0.113.10", &ports)));
}

#[test]
fn ingress_without_ip_mode_from_a_server_without_the_gate_needs_no_write() {
    let ports = [TunnelPort { port: 80, protocol: "TCP".into(), proxy_protocol: None }];
    let want = ingress("203.0.113.9", &ports);
    // What a server without LoadBalancerIPMode stores and returns for `want`.
    let mut stored = want.clone();
    stored[0].as_object_mut().unwrap().remove("ipMode");
    let mut svc = service(serde_json::json!([{"port": 80, "protocol": "TCP"}]));
    svc.status = Some(serde_json::from_value(serde_json::json!({"loadBalancer": {"ingress": stored}})).unwrap());
    assert!(ingress_matches(&svc, &want), "the dropped field alone is no reason to write again");
    assert!(!ingress_matches(&svc, &ingress("203.0.113.10", &ports)), "a changed address still is");
    // A server that keeps ipMode but shows another one is corrected.
    let mut vip = want.clone();
    vip[0]["ipMode"] = serde_json::json!("VIP");
    svc.status = Some(serde_json::from_value(serde_json::json!({"loadBalancer": {"ingress": vip}})).unwrap());
    assert!(!ingress_matches(&svc, &want));
}

#[test]
fn the_clients_of_a_pair_prefer_other_nodes_and_zones_and_a_single_client_has_no_affinity() {
    let tunnel: Tunnel = serde_json::from_value(serde_json::json!({
        "apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel",
        "metadata": {"name": "web-tunnel", "namespace": "team-a", "uid": "t-uid"},
        "spec": {"serviceRef": {"name": "web"}},
    }))
    .unwrap();
    let at = Placement::of(&tunnel, Some("skyport-tunnels")).unwrap();
    let single = deployment(&tunnel, &at, "img", "c").unwrap();
    assert!(single.spec.unwrap().template.spec.unwrap().affinity.is_none());
    let pods: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|slot| deployment(&tunnel, &at.for_slot(slot), "img", "c").unwrap().spec.unwrap())
        .collect();
    for spec in &pods {
        let labels = spec.template.metadata.as_ref().unwrap().labels.clone().unwrap();
        assert_eq!(labels.get(LABEL_TUNNEL_UID).map(String::as_str), Some("t-uid"), "both Pods carry the Tunnel");
        assert!(
            !spec.selector.match_labels.as_ref().unwrap().contains_key(LABEL_TUNNEL_UID),
            "the selector, which cannot change, is left as it was"
        );
        let anti = spec.template.spec.as_ref().unwrap().affinity.clone().unwrap().pod_anti_affinity.unwrap();
        assert!(anti.required_during_scheduling_ignored_during_execution.is_none(), "one node still runs both");
        let terms = anti.preferred_during_scheduling_ignored_during_execution.unwrap();
        let keys: Vec<_> = terms.iter().map(|t| t.pod_affinity_term.topology_key.as_str()).collect();
        assert_eq!(keys, ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]);
        for t in &terms {
            let selector = t.pod_affinity_term.label_selector.clone().unwrap().match_labels.unwrap();
            assert_eq!(selector.get(LABEL_TUNNEL_UID).map(String::as_str), Some("t-uid"), "the other slot's Pod");
        }
    }
}
