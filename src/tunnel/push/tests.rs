use providers::exit::push::{self, PushError};
use providers::exit::userdata::render_server_toml_on;
use providers::{ExitServer, Protocol, TunnelService};

use super::*;

const KEY: &str = "wCR3TomqL60P4MLphr9nSLR+tS5cgq7pccADVo2zaaQ=";
const OTHER: &str = "ljQqivQjyn4K6qv2SSldOpHeLToaIIzXNB+C6GYVXvY=";

fn server(control_port: u16, key: &str, ports: &[u16]) -> ExitServer {
    ExitServer {
        control_port,
        noise_private_key: key.into(),
        services: ports
            .iter()
            .map(|p| TunnelService {
                name: format!("tcp-{p}"),
                protocol: Protocol::Tcp,
                port: *p,
                token: "t0k".into(),
                source_ranges: Vec::new(),
                proxy_protocol: None,
                bind: None,
            })
            .collect(),
    }
}

fn toml(s: &ExitServer) -> String {
    render_server_toml_on(s, "127.0.0.1").unwrap()
}

/// A config folder with `server.toml` for ports `[8080]`, and its receiver.
async fn setup(name: &str) -> (PathBuf, Receiver) {
    let dir = std::env::temp_dir().join(format!("skyport-push-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("server.toml");
    std::fs::write(&path, toml(&server(2333, KEY, &[8080]))).unwrap();
    let parsed = rathole::Config::from_file(&path).await.unwrap();
    let receiver = Receiver::new(&path, &parsed).unwrap().unwrap();
    (dir, receiver)
}

fn key(k: &str) -> PushKey {
    PushKey::derive(k).unwrap()
}

#[tokio::test]
async fn a_push_over_tcp_replaces_the_config_and_raises_the_generation() {
    let (dir, receiver) = setup("tcp").await;
    let started = receiver.generation().unwrap();
    assert!(started >= push::now_generation() - 60_000, "a new server starts at its start time");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(Arc::new(receiver).serve(listener));
    let wanted = toml(&server(2333, KEY, &[8080, 9090]));
    let generation = push::push(address, &key(KEY), &wanted, push::DEFAULT_TIMEOUT).await.unwrap();
    assert!(generation > started);
    assert_eq!(std::fs::read_to_string(dir.join("server.toml")).unwrap(), wanted);
    let second = toml(&server(2333, KEY, &[9090]));
    let next = push::push(address, &key(KEY), &second, push::DEFAULT_TIMEOUT).await.unwrap();
    assert!(next > generation);
    assert_eq!(std::fs::read_to_string(dir.join("server.toml")).unwrap(), second);
    assert_eq!(std::fs::read_to_string(dir.join("server.toml.generation")).unwrap(), next.to_string());
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.join("server.toml")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    // The in-cluster client knows only the public key; anything else fails to open, and the
    // refusal carries no proof under a key the server does not hold.
    let refused = push::push(address, &key(OTHER), &wanted, push::DEFAULT_TIMEOUT).await.unwrap_err();
    assert!(matches!(refused, PushError::Unproven(_, Answer::Unauthenticated)), "{refused}");
    assert_eq!(std::fs::read_to_string(dir.join("server.toml")).unwrap(), second);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn replays_and_older_generations_are_refused_even_after_a_restart() {
    let (dir, receiver) = setup("replay").await;
    let base = receiver.generation().unwrap();
    let first = Frame::seal(&key(KEY), base + 5, toml(&server(2333, KEY, &[81])).as_bytes()).unwrap();
    assert_eq!(receiver.apply(&first).await, Answer::Applied);
    assert_eq!(receiver.apply(&first).await, Answer::Stale, "the same frame again");
    let older = Frame::seal(&key(KEY), base + 4, toml(&server(2333, KEY, &[82])).as_bytes()).unwrap();
    assert_eq!(receiver.apply(&older).await, Answer::Stale);

    // A restarted server reads the persisted generation.
    let path = dir.join("server.toml");
    let restarted = Receiver::new(&path, &rathole::Config::from_file(&path).await.unwrap()).unwrap().unwrap();
    assert_eq!(restarted.apply(&first).await, Answer::Stale);
    assert!(std::fs::read_to_string(&path).unwrap().contains(":81\""));
    let newer = Frame::seal(&key(KEY), base + 6, toml(&server(2333, KEY, &[83])).as_bytes()).unwrap();
    assert_eq!(restarted.apply(&newer).await, Answer::Applied);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_push_captured_for_an_earlier_host_is_refused_by_its_replacement() {
    // The Tunnel's first host takes a push; a replacement with the same keys starts later.
    let (first_dir, first) = setup("earlier").await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(Arc::new(first).serve(listener));
    let config = toml(&server(2333, KEY, &[81]));
    let generation = push::push(address, &key(KEY), &config, push::DEFAULT_TIMEOUT).await.unwrap();
    let captured = Frame::seal(&key(KEY), generation, config.as_bytes()).unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let (dir, replacement) = setup("replacement").await;
    assert_eq!(replacement.apply(&captured).await, Answer::Stale);
    // The operator's next push is above both.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(Arc::new(replacement).serve(listener));
    assert!(push::push(address, &key(KEY), &config, push::DEFAULT_TIMEOUT).await.unwrap() > generation);
    std::fs::remove_dir_all(&first_dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_push_cannot_move_the_control_port_change_the_key_or_break_the_file() {
    let (dir, receiver) = setup("refuse").await;
    let path = dir.join("server.toml");
    let before = std::fs::read_to_string(&path).unwrap();
    let base = receiver.generation().unwrap();
    let sealed = |n: u64, text: &str| Frame::seal(&key(KEY), base + n, text.as_bytes()).unwrap();

    let moved = toml(&server(2444, KEY, &[8080]));
    assert_eq!(receiver.apply(&sealed(1, &moved)).await, Answer::Identity);
    let rekeyed = toml(&server(2333, OTHER, &[8080]));
    assert_eq!(receiver.apply(&sealed(2, &rekeyed)).await, Answer::Identity);
    assert_eq!(receiver.apply(&sealed(3, "[server\nbind_addr = 1")).await, Answer::Refused);
    let client = "[client]\nremote_addr = \"127.0.0.1:2333\"\n[client.services.a]\ntoken = \"t\"\nlocal_addr = \"127.0.0.1:1\"\n";
    assert_eq!(receiver.apply(&sealed(4, client)).await, Answer::Refused);

    // A new port something else holds: the push would promise a service nobody can reach.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let unservable = toml(&server(2333, KEY, &[8080, taken_port]));
    assert_eq!(receiver.apply(&sealed(5, &unservable)).await, Answer::Refused);

    let mut tampered = sealed(5, &toml(&server(2333, KEY, &[9999])));
    let last = tampered.sealed.len() - 1;
    tampered.sealed[last] ^= 0x80;
    assert_eq!(receiver.apply(&tampered).await, Answer::Unauthenticated);

    assert_eq!(std::fs::read_to_string(&path).unwrap(), before, "nothing refused was applied");
    assert!(!dir.join("server.toml.push").exists(), "no staged file is left behind");
    // Refusals do not consume generations: the next good push still works.
    assert_eq!(receiver.apply(&sealed(1, &toml(&server(2333, KEY, &[8081])))).await, Answer::Applied);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_client_that_stalls_or_sends_garbage_gets_no_config_in() {
    let (dir, receiver) = setup("garbage").await;
    let started = receiver.generation().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(Arc::new(receiver).serve(listener));
    let mut conn = TcpStream::connect(address).await.unwrap();
    let mut hello = [0u8; push::GREETING_LEN];
    tokio::io::AsyncReadExt::read_exact(&mut conn, &mut hello).await.unwrap();
    assert_eq!(hello, greeting(started));
    conn.write_all(&[push::VERSION, 0, 0, 0, 0, 0, 0, 0, 1]).await.unwrap();
    conn.write_all(&[0u8; 24]).await.unwrap();
    conn.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    let mut answer = [0u8; push::ANSWER_LEN];
    tokio::io::AsyncReadExt::read_exact(&mut conn, &mut answer).await.unwrap();
    assert_eq!(Answer::from_byte(answer[0]), Some(Answer::Malformed));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_push_with_a_proxy_protocol_service_is_applied_whole_and_a_udp_one_is_refused() {
    let (dir, receiver) = setup("proxy").await;
    let mut wanted = server(2333, KEY, &[8080, 9091]);
    wanted.services[1].proxy_protocol = Some(providers::ProxyProtocol::V1);
    let text = toml(&wanted);
    assert!(text.contains("[skyport.services.\"tcp-9091\"]"), "{text}");
    let frame = Frame::seal(&key(KEY), receiver.generation().unwrap() + 1, text.as_bytes()).unwrap();
    assert_eq!(receiver.apply(&frame).await, Answer::Applied);
    assert_eq!(std::fs::read_to_string(dir.join("server.toml")).unwrap(), text, "one document, table included");

    let udp = format!(
        "{text}\n[server.services.\"udp-53\"]\ntype = \"udp\"\ntoken = \"t\"\nbind_addr = \"127.0.0.1:5300\"\n\n[skyport.services.\"udp-53\"]\nproxy_protocol = \"v2\"\n"
    );
    let frame = Frame::seal(&key(KEY), receiver.generation().unwrap() + 1, udp.as_bytes()).unwrap();
    assert_eq!(receiver.apply(&frame).await, Answer::Refused);
    assert_eq!(std::fs::read_to_string(dir.join("server.toml")).unwrap(), text);
    std::fs::remove_dir_all(&dir).unwrap();
}
