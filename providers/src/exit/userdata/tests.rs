use super::rathole::toml_string;
use super::*;

const GENKEY_PRIVATE: &str = "wCR3TomqL60P4MLphr9nSLR+tS5cgq7pccADVo2zaaQ=";
const GENKEY_PUBLIC: &str = "E5GbisDny7Rpe9Z28U1FLgm4zrvBrRDs+BTKatK1mUY=";
use serde_json::Value;

const KEY: &str = "cGhhbnRvbS1rZXktZm9yLXRlc3RzLW9ubHktMzJieXRlcw==";

pub(super) fn service(name: &str, protocol: Protocol, port: u16, token: &str) -> TunnelService {
    TunnelService {
        name: name.into(),
        protocol,
        port,
        token: token.into(),
        source_ranges: Vec::new(),
        proxy_protocol: None,
        bind: None,
    }
}

pub(super) fn sample() -> ExitServer {
    ExitServer {
        control_port: DEFAULT_CONTROL_PORT,
        noise_private_key: KEY.into(),
        services: vec![
            service("default.web.80-tcp", Protocol::Tcp, 80, "tok-web-80-Zq8\"x\\y"),
            service("default.web.443-tcp", Protocol::Tcp, 443, "tok-web-443-Lm2"),
            service("default.dns.53-udp", Protocol::Udp, 53, "tok-dns-53-Pp7: #not-a-comment"),
        ],
    }
}

const SUM: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

pub(super) fn artifacts() -> Vec<Artifact> {
    vec![
        Artifact { arch: "x86_64".into(), url: "https://example.test/v1/skyport-x86_64".into(), sha256: SUM.into() },
        Artifact { arch: "aarch64".into(), url: "http://10.1.2.3/skyport-aarch64".into(), sha256: "ab".repeat(32) },
    ]
}

pub(super) fn parse(doc: &str) -> Value {
    serde_saphyr::from_str::<Value>(doc).expect("valid YAML")
}

fn file<'a>(doc: &'a Value, path: &str) -> &'a str {
    doc["write_files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
        .and_then(|f| f["content"].as_str())
        .unwrap_or_else(|| panic!("no {path}"))
}

/// Calls `f(path, string)` for every string in the document.
fn walk(v: &Value, path: &mut Vec<String>, f: &mut dyn FnMut(&[String], &str)) {
    match v {
        Value::String(s) => f(path, s),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(i.to_string());
                walk(item, path, f);
                path.pop();
            }
        }
        Value::Object(map) => {
            for (k, item) in map {
                path.push(k.clone());
                walk(item, path, f);
                path.pop();
            }
        }
        _ => {}
    }
}

#[test]
fn the_output_is_a_cloud_config_that_parses_as_yaml() {
    let out = render_cloud_config(&sample(), &artifacts()).unwrap();
    assert!(out.starts_with("#cloud-config\n"));
    let doc = parse(&out);
    assert_eq!(doc["packages"].as_array().unwrap().len(), 3);
    let toml_file = doc["write_files"].as_array().unwrap().iter().find(|f| f["path"] == SERVER_CONFIG_PATH).unwrap();
    assert_eq!(toml_file["permissions"], "0600", "the mode stays a string");
    assert_eq!(toml_file["owner"], "skyport:skyport");
    // The file contents survive YAML round-tripping byte for byte.
    assert_eq!(file(&doc, SERVER_CONFIG_PATH), render_server_toml(&sample()).unwrap());
    assert_eq!(file(&doc, NFTABLES_PATH), render_nftables(&sample()));
    assert_eq!(file(&doc, UNIT_PATH), render_unit());
    assert_eq!(file(&doc, FIREWALL_UNIT_PATH), render_firewall_unit());
    assert_eq!(file(&doc, FIREWALL_PATH_PATH), render_firewall_path());
    assert!(render_unit().contains(&format!("ReadWritePaths={CONFIG_DIR}\n")), "the server can replace its config");
    assert_eq!(doc["runcmd"][1][2].as_str().unwrap(), render_install(&artifacts(), 2333).unwrap());
}

#[test]
fn the_install_checks_the_digest_before_anything_runs_and_refuses_bad_artifacts() {
    let script = render_install(&artifacts(), 2333).unwrap();
    assert!(script.contains(&format!("  x86_64) url='https://example.test/v1/skyport-x86_64'; sum='{SUM}' ;;")));
    assert!(script.contains("  aarch64) url='http://10.1.2.3/skyport-aarch64'"));
    let check = script.find("sha256sum -c").unwrap();
    let install = script.find(&format!("mv -f {BINARY_PATH}.download {BINARY_PATH}")).unwrap();
    let enable = script.find(&format!("systemctl enable --now {UNIT_NAME}")).unwrap();
    assert!(script.starts_with("set -eu\n") && check < install && install < enable, "{script}");
    assert!(render_unit().contains(&format!("ExecStart={BINARY_PATH} tunnel server --config {SERVER_CONFIG_PATH}")));

    assert_eq!(render_install(&[], 2333), Err(UserDataError::NoArtifact));
    for bad in [
        Artifact { url: "https://x/'; reboot; '".into(), ..artifacts()[0].clone() },
        Artifact { url: "ftp://x/skyport".into(), ..artifacts()[0].clone() },
        Artifact { sha256: "00".into(), ..artifacts()[0].clone() },
        Artifact { arch: "x86_64) echo".into(), ..artifacts()[0].clone() },
    ] {
        assert!(matches!(render_install(&[bad], 2333), Err(UserDataError::InvalidArtifact(_))));
    }
}

#[test]
fn exactly_the_given_ports_are_bound_and_opened() {
    let doc = parse(&render_cloud_config(&sample(), &artifacts()).unwrap());
    let toml = file(&doc, SERVER_CONFIG_PATH);
    let mut bound: Vec<&str> = toml.lines().filter_map(|l| l.strip_prefix("bind_addr = \"0.0.0.0:")).collect();
    bound.sort();
    assert_eq!(bound, ["2333\"", "443\"", "53\"", "80\""]);
    assert!(toml.contains("type = \"udp\"\ntoken = \"tok-dns-53"));

    let nft = file(&doc, NFTABLES_PATH);
    let rule = |proto: &str| {
        nft.lines().find_map(|l| l.trim().strip_prefix(&format!("{proto} dport {{ "))?.strip_suffix(" } accept"))
    };
    assert_eq!(rule("tcp"), Some("80, 443, 2333, 2335"), "the Service's, control and push ports");
    assert_eq!(rule("udp"), Some("53"));
    assert!(nft.contains("policy drop"));
    assert_eq!(nft.matches("dport").count(), 2, "no other port is opened");

    let tcp_only = ExitServer { services: vec![service("a", Protocol::Tcp, 8080, "t")], ..sample() };
    let nft = render_nftables(&tcp_only);
    assert!(nft.contains("tcp dport { 2333, 2335, 8080 } accept") && !nft.contains("udp dport"));
}

#[test]
fn secrets_appear_only_in_the_server_config() {
    let server = sample();
    let out = render_cloud_config(&server, &artifacts()).unwrap();
    let doc = parse(&out);
    let config_index =
        doc["write_files"].as_array().unwrap().iter().position(|f| f["path"] == SERVER_CONFIG_PATH).unwrap();
    let allowed = ["write_files".to_string(), config_index.to_string(), "content".to_string()];
    // As they appear in the TOML (quotes and backslashes escaped).
    let secrets: Vec<String> = server
        .services
        .iter()
        .map(|s| s.token.as_str())
        .chain([server.noise_private_key.as_str()])
        .map(|s| toml_string(s).trim_matches('"').to_string())
        .collect();
    let mut seen = 0;
    walk(&doc, &mut Vec::new(), &mut |path, s| {
        for secret in &secrets {
            if s.contains(secret.as_str()) {
                assert_eq!(path, allowed, "secret found outside server.toml");
                seen += 1;
            }
        }
    });
    assert_eq!(seen, secrets.len());
    // In the raw text, too: each secret exactly once.
    for secret in &secrets {
        assert_eq!(out.matches(secret.as_str()).count(), 1, "{secret}");
    }
    assert!(!format!("{server:?}").contains("tok-") && !format!("{server:?}").contains(KEY));
}

#[test]
fn rendering_is_deterministic_and_independent_of_service_order() {
    let a = render_cloud_config(&sample(), &artifacts()).unwrap();
    assert_eq!(a, render_cloud_config(&sample(), &artifacts()).unwrap());
    let mut reversed = sample();
    reversed.services.reverse();
    assert_eq!(a, render_cloud_config(&reversed, &artifacts()).unwrap());
}

#[test]
fn bad_input_is_refused_without_revealing_secrets() {
    let mut s = sample();
    s.services.push(service("dup", Protocol::Tcp, 80, "tok-dup-secret"));
    let e = render_cloud_config(&s, &artifacts()).unwrap_err();
    assert!(matches!(e, UserDataError::DuplicatePort { port: 80, .. }), "{e}");
    assert!(!e.to_string().contains("tok-"));

    let mut s = sample();
    s.services.push(service("ctl", Protocol::Tcp, DEFAULT_CONTROL_PORT, "t"));
    assert!(matches!(render_cloud_config(&s, &artifacts()), Err(UserDataError::DuplicatePort { .. })));
    // The same number over UDP is a different port.
    let mut s = sample();
    s.services.push(service("ctl-udp", Protocol::Udp, DEFAULT_CONTROL_PORT, "t"));
    assert!(render_cloud_config(&s, &artifacts()).is_ok());

    let mut s = sample();
    s.services[0].name = "bad name]".into();
    assert!(matches!(render_cloud_config(&s, &artifacts()), Err(UserDataError::InvalidName(_))));
    let mut s = sample();
    s.services[1].name = s.services[0].name.clone();
    assert!(matches!(render_cloud_config(&s, &artifacts()), Err(UserDataError::DuplicateName(_))));
    let mut s = sample();
    s.services[0].token.clear();
    assert!(matches!(render_cloud_config(&s, &artifacts()), Err(UserDataError::EmptyToken(_))));
    let s = ExitServer { noise_private_key: "not base64!".into(), ..sample() };
    assert_eq!(render_cloud_config(&s, &artifacts()), Err(UserDataError::InvalidKey));
}

#[test]
fn noise_keys_match_what_rathole_genkey_prints() {
    // A pair printed by `rathole --genkey` (0.5.0).
    let pair = NoiseKeypair::from_private(GENKEY_PRIVATE).unwrap();
    assert_eq!(pair.public_key, GENKEY_PUBLIC);
    assert_eq!(pair.private_key, GENKEY_PRIVATE);
    // A second pair from a later run, so the fixture is not a lucky match.
    let second = NoiseKeypair::from_private("ljQqivQjyn4K6qv2SSldOpHeLToaIIzXNB+C6GYVXvY=").unwrap();
    assert_eq!(second.public_key, "zhugQPoNYvapZkTPN1CRqHtU4pUve+MFTEKPwgmS91I=");
    let fresh = NoiseKeypair::generate();
    assert_ne!(fresh.private_key, NoiseKeypair::generate().private_key);
    assert_eq!(NoiseKeypair::from_private(&fresh.private_key).unwrap(), fresh);
    assert!(!format!("{fresh:?}").contains(&fresh.private_key));
    assert_eq!(NoiseKeypair::from_private("c2hvcnQ="), Err(UserDataError::InvalidKey));
}

#[test]
fn the_client_config_is_sorted_escaped_and_validated() {
    let service = |name: &str, protocol| ClientService {
        name: name.into(),
        protocol,
        token: "t\"ok".into(),
        local_addr: "10.0.0.7:80".into(),
    };
    let client = TunnelClient {
        remote_addr: "203.0.113.9:2333".into(),
        server_public_key: GENKEY_PUBLIC.into(),
        services: vec![service("udp-53", Protocol::Udp), service("tcp-80", Protocol::Tcp)],
    };
    let toml = render_client_toml(&client).unwrap();
    assert!(toml.find("[client.services.\"tcp-80\"]").unwrap() < toml.find("[client.services.\"udp-53\"]").unwrap());
    assert!(toml.contains("remote_addr = \"203.0.113.9:2333\""));
    assert!(toml.contains(&format!("remote_public_key = \"{GENKEY_PUBLIC}\"")));
    assert!(toml.contains("token = \"t\\\"ok\""), "{toml}");
    assert!(toml.contains("type = \"udp\""));
    assert_eq!(toml, render_client_toml(&client).unwrap());
    let mut twice = client.clone();
    twice.services.push(service("tcp-80", Protocol::Tcp));
    assert_eq!(render_client_toml(&twice), Err(UserDataError::DuplicateName("tcp-80".into())));
    let mut no_key = client.clone();
    no_key.server_public_key = String::new();
    assert_eq!(render_client_toml(&no_key), Err(UserDataError::InvalidKey));
    assert!(!format!("{:?}", client.services[0]).contains("t\"ok"));
}

#[test]
fn the_local_server_config_binds_one_address() {
    let server = ExitServer {
        control_port: 2333,
        noise_private_key: GENKEY_PRIVATE.into(),
        services: vec![TunnelService {
            name: "tcp-80".into(),
            protocol: Protocol::Tcp,
            port: 80,
            token: "t".into(),
            source_ranges: Vec::new(),
            proxy_protocol: None,
            bind: None,
        }],
    };
    let toml = render_server_toml_on(&server, "127.77.0.3").unwrap();
    assert!(toml.contains("bind_addr = \"127.77.0.3:2333\"") && toml.contains("bind_addr = \"127.77.0.3:80\""));
    assert!(render_server_toml(&server).unwrap().contains("bind_addr = \"0.0.0.0:80\""));
}

#[test]
fn many_services_still_fit_the_smallest_user_data_limit() {
    // 100 ports with 64-character tokens: about 19 KiB, under Hetzner's 32 KiB, even for a
    // server of a highly available pair, which carries its floating IP too.
    let services =
        (0..100).map(|i| service(&format!("ns.svc.{i}-tcp"), Protocol::Tcp, 10000 + i, &"t".repeat(64))).collect();
    let moved = [std::net::Ipv4Addr::new(203, 0, 113, 7)];
    let out = render_cloud_config_with(&ExitServer { services, ..sample() }, &artifacts(), &moved).unwrap();
    assert!(out.len() < crate::hetzner::MAX_USER_DATA, "{} bytes", out.len());
}

/// The install script run as the VM runs it: what it refuses, and how it reports why.
mod install;
/// skyport's own table in the server config: PROXY protocol and source ranges.
mod skyport_table;
