use super::*;

#[test]
fn a_proxy_protocol_service_is_named_in_the_skyport_table_and_a_plain_one_is_not() {
    let mut proxied = service("tcp-80", Protocol::Tcp, 80, "t");
    proxied.proxy_protocol = Some(ProxyProtocol::V2);
    let server = ExitServer {
        control_port: 2333,
        noise_private_key: GENKEY_PRIVATE.into(),
        services: vec![service("tcp-443", Protocol::Tcp, 443, "t"), proxied],
    };
    let toml = render_server_toml(&server).unwrap();
    assert!(toml.ends_with("\n[skyport.services.\"tcp-80\"]\nproxy_protocol = \"v2\"\n"), "{toml}");
    assert_eq!(toml.matches("[skyport.").count(), 1, "only the service that asked: {toml}");
    assert_eq!(ProxyProtocol::parse("v1"), Some(ProxyProtocol::V1));
    assert_eq!(ProxyProtocol::parse("v3"), None);

    // No PROXY header on UDP: refused with the service's name, never rendered.
    let mut udp = service("udp-53", Protocol::Udp, 53, "t");
    udp.proxy_protocol = Some(ProxyProtocol::V1);
    let refused = ExitServer { services: vec![udp], ..server };
    let err = render_server_toml(&refused).unwrap_err().to_string();
    assert!(err.contains("\"udp-53\" is UDP"), "{err}");
}

#[test]
fn a_service_with_source_ranges_is_opened_to_them_only_and_the_others_stay_open() {
    let mut restricted = service("tcp-80", Protocol::Tcp, 80, "t");
    restricted.source_ranges = vec!["198.51.100.0/24".into(), "2001:db8::/32".into()];
    let mut dns = service("udp-53", Protocol::Udp, 53, "t");
    dns.source_ranges = vec!["10.0.0.0/8".into()];
    let server = ExitServer {
        control_port: 2333,
        noise_private_key: GENKEY_PRIVATE.into(),
        services: vec![restricted, dns, service("health", Protocol::Tcp, 2334, "t")],
    };
    let nft = render_nftables(&server);
    assert!(nft.contains("    tcp dport { 2333, 2334, 2335 } accept\n"), "control, push and health ports: {nft}");
    assert!(nft.contains("    ip saddr 198.51.100.0/24 tcp dport 80 accept\n"), "{nft}");
    assert!(nft.contains("    ip6 saddr 2001:db8::/32 tcp dport 80 accept\n"), "{nft}");
    assert!(nft.contains("    ip saddr 10.0.0.0/8 udp dport 53 accept\n"), "{nft}");
    assert!(!nft.contains("udp dport {"), "no UDP port is open to everyone: {nft}");
    assert_eq!(nft.matches("dport 80 ").count(), 2, "port 80 from its two ranges only: {nft}");
    assert!(nft.contains("policy drop"), "everything else is dropped");

    // The server config carries them in the [skyport] table, where the exit server reads them.
    let toml = render_server_toml(&server).unwrap();
    assert!(
        toml.contains("\n[skyport.services.\"tcp-80\"]\nsource_ranges = [\"198.51.100.0/24\", \"2001:db8::/32\"]\n"),
        "{toml}"
    );
    assert!(!toml.contains("[skyport.services.\"health\"]"), "{toml}");

    // A range skyport would not have written is refused, never rendered.
    let mut sloppy = server.clone();
    sloppy.services[0].source_ranges = vec!["198.51.100.7/24".into()];
    let err = render_server_toml(&sloppy).unwrap_err().to_string();
    assert!(err.contains("\"tcp-80\"") && err.contains("write 198.51.100.0/24"), "{err}");
    // Ranges that do not parse at all close the port rather than open it.
    sloppy.services[0].source_ranges = vec!["junk".into()];
    let nft = render_nftables(&sloppy);
    assert!(!nft.contains("dport 80") && !nft.contains(" 80,"), "{nft}");
}
