use providers::exit::userdata::render_server_toml;
use providers::{ExitServer, Protocol, TunnelService};

use super::*;

const KEY: &str = "wCR3TomqL60P4MLphr9nSLR+tS5cgq7pccADVo2zaaQ=";

fn service(name: &str, protocol: Protocol, port: u16, proxy: Option<ProxyProtocol>) -> TunnelService {
    TunnelService {
        name: name.into(),
        protocol,
        port,
        token: "t".into(),
        source_ranges: Vec::new(),
        proxy_protocol: proxy,
        bind: None,
    }
}

/// `tcp-80` with a v2 header, `tcp-443` and `udp-53` without.
fn document() -> String {
    render_server_toml(&ExitServer {
        control_port: 2333,
        noise_private_key: KEY.into(),
        services: vec![
            service("tcp-80", Protocol::Tcp, 80, Some(ProxyProtocol::V2)),
            service("tcp-443", Protocol::Tcp, 443, None),
            service("udp-53", Protocol::Udp, 53, None),
        ],
    })
    .unwrap()
}

fn bind_addr(text: &str, name: &str) -> String {
    let table: Table = toml::from_str(text).unwrap();
    table["server"]["services"][name]["bind_addr"].as_str().unwrap().to_string()
}

#[test]
fn the_skyport_table_is_split_off_and_names_the_proxied_services() {
    let document = split(&document()).unwrap();
    assert!(!document.rathole.contains_key("skyport"), "rathole never sees the table");
    assert_eq!(document.proxied, BTreeMap::from([("tcp-80".to_string(), ProxyProtocol::V2)]));
    let text = document.rathole_text().unwrap();
    assert!(!text.contains("skyport") && !text.contains("proxy_protocol"), "{text}");
    let parsed = document.parsed().unwrap();
    assert_eq!(parsed.server.unwrap().services.len(), 3);
}

#[test]
fn a_table_naming_an_unknown_service_a_udp_one_a_bad_version_or_key_is_refused() {
    let base = document();
    let refused = |extra: &str| format!("{:#}", split(&format!("{base}{extra}")).unwrap_err());
    let e = refused("\n[skyport.services.\"tcp-81\"]\nproxy_protocol = \"v1\"\n");
    assert!(e.contains("tcp-81") && e.contains("no such service"), "{e}");
    let e = refused("\n[skyport.services.\"udp-53\"]\nproxy_protocol = \"v1\"\n");
    assert!(e.contains("TCP connections only"), "{e}");
    let e = refused("\n[skyport.services.\"tcp-443\"]\nproxy_protocol = \"v3\"\n");
    assert!(e.contains("\"v3\" is not \"v1\" or \"v2\""), "{e}");
    let e = refused("\n[skyport.services.\"tcp-443\"]\nproxy = \"v1\"\n");
    assert!(e.contains("unknown field"), "{e}");
}

#[test]
fn a_proxied_service_moves_to_a_loopback_port_kept_across_derivations_and_the_rest_stays() {
    let document = split(&document()).unwrap();
    let mut internal = BTreeMap::new();
    let (text, fronts) = document.derive(&mut internal).unwrap();
    let at: SocketAddr = bind_addr(&text, "tcp-80").parse().unwrap();
    assert!(at.ip().is_loopback() && at.port() != 80, "{at}");
    assert_eq!(fronts, [Front { public: "0.0.0.0:80".parse().unwrap(), internal: at, proxy: ProxyProtocol::V2 }]);
    assert_eq!(bind_addr(&text, "tcp-443"), "0.0.0.0:443", "a service without a header is unchanged");
    assert_eq!(bind_addr(&text, "udp-53"), "0.0.0.0:53");
    assert!(!text.contains("skyport"), "{text}");
    // The same address the next time, so rathole keeps the service running through a reload.
    let (again, _) = document.derive(&mut internal).unwrap();
    assert_eq!(again, text);
    // A service that no longer asks for the header gets its public address back.
    let plain = Document { proxied: BTreeMap::new(), ..document };
    let (text, fronts) = plain.derive(&mut internal).unwrap();
    assert!(fronts.is_empty() && internal.is_empty());
    assert_eq!(bind_addr(&text, "tcp-80"), "0.0.0.0:80");
}

#[tokio::test]
async fn load_has_rathole_check_its_part_of_a_document_rathole_alone_refuses() {
    let dir = std::env::temp_dir().join(format!("skyport-options-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("server.toml");
    std::fs::write(&path, document()).unwrap();
    assert!(rathole::Config::from_file(&path).await.is_err(), "rathole refuses the [skyport] table");
    let (parsed, document) = load(&path).await.unwrap();
    assert_eq!(parsed.server.unwrap().services.len(), 3);
    assert_eq!(document.proxied.len(), 1);
    // rathole's own checks still run: a service without a token is refused.
    std::fs::write(
        &path,
        "[server]\nbind_addr = \"127.0.0.1:2333\"\n[server.services.a]\nbind_addr = \"127.0.0.1:80\"\n",
    )
    .unwrap();
    assert!(load(&path).await.is_err());
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["server.toml"], "no check file is left behind");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn two_proxied_services_never_share_a_loopback_port() {
    let text = render_server_toml(&ExitServer {
        control_port: 2333,
        noise_private_key: KEY.into(),
        services: (1..=8).map(|i| service(&format!("tcp-{i}"), Protocol::Tcp, i, Some(ProxyProtocol::V1))).collect(),
    })
    .unwrap();
    let (_, fronts) = split(&text).unwrap().derive(&mut BTreeMap::new()).unwrap();
    let ports: std::collections::BTreeSet<u16> = fronts.iter().map(|f| f.internal.port()).collect();
    assert_eq!(ports.len(), 8, "{fronts:?}");
}

#[test]
fn source_ranges_are_read_per_service_and_anything_but_canonical_cidrs_is_refused() {
    let mut restricted = service("tcp-443", Protocol::Tcp, 443, None);
    restricted.source_ranges = vec!["198.51.100.0/24".into(), "2001:db8::/32".into()];
    let text = render_server_toml(&ExitServer {
        control_port: 2333,
        noise_private_key: KEY.into(),
        services: vec![restricted, service("tcp-80", Protocol::Tcp, 80, Some(ProxyProtocol::V1))],
    })
    .unwrap();
    let document = split(&text).unwrap();
    let ranges: Vec<String> = document.ranges["tcp-443"].iter().map(ToString::to_string).collect();
    assert_eq!(ranges, ["198.51.100.0/24", "2001:db8::/32"]);
    assert_eq!(document.ranges.len(), 1, "a service without ranges admits anyone");
    assert!(!document.rathole_text().unwrap().contains("source_ranges"), "rathole never sees them");

    let base = document_text_without_ranges();
    let refused = |ranges: &str| {
        let extra = format!("\n[skyport.services.\"tcp-443\"]\nsource_ranges = {ranges}\n");
        format!("{:#}", split(&format!("{base}{extra}")).unwrap_err())
    };
    let e = refused("[\"10.1.2.3/8\"]");
    assert!(e.contains("tcp-443") && e.contains("not in canonical form (write 10.0.0.0/8)"), "{e}");
    let e = refused("[\"10.0.0.0/33\"]");
    assert!(e.contains("\"10.0.0.0/33\" is not a CIDR"), "{e}");
    let e = refused("[\"10.0.0.0/8; accept\"]");
    assert!(e.contains("is not a CIDR"), "{e}");
    let e = refused("[]");
    assert!(e.contains("source_ranges is empty"), "{e}");
    let e = refused("\"10.0.0.0/8\"");
    assert!(e.contains("the [skyport] table"), "a string, not a list: {e}");
}

/// [`document`] without its `[skyport]` table.
fn document_text_without_ranges() -> String {
    let text = document();
    text[..text.find("\n[skyport.").unwrap()].to_string()
}
