//! What the local provider's tests share: a provider over a throw-away state directory, the
//! skyport binary, tunnel clients, backends that say who they are, and waiting.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use providers::exit::userdata::{Protocol, TunnelClient, TunnelService, render_client_toml};
use providers::local::{LocalProvider, LocalSettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

/// The skyport binary (another package's binary, so Cargo does not hand its path to this test).
pub fn skyport() -> PathBuf {
    let path = std::env::var_os("SKYPORT_EXE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/skyport"));
    assert!(path.exists(), "{} is missing: run `cargo build --bin skyport` (tests/run.sh does)", path.display());
    path
}

/// What the exit servers and clients of a test that floods the tunnel with connections run: the
/// shipped static build (`SKYPORT_STATIC_EXE`, which tests/run.sh builds), optimised as what exit
/// servers run is, else the debug build. On two loaded cores the debug build's tunnel sets up
/// fewer new connections a second than such a test opens, so its backlog grows until nothing is
/// answered in time: the machine's limit, not the behaviour under test.
pub fn data_plane_exe() -> PathBuf {
    match std::env::var_os("SKYPORT_STATIC_EXE").map(PathBuf::from).filter(|p| p.exists()) {
        Some(path) => path,
        None => {
            eprintln!(
                "SKYPORT_STATIC_EXE unset: the tunnel runs the debug build, which a loaded machine may not keep up with"
            );
            skyport()
        }
    }
}

/// A TCP service on `port`, named `tcp-<port>`, with the token `tok`.
pub fn tcp_service(port: u16) -> TunnelService {
    TunnelService {
        name: format!("tcp-{port}"),
        protocol: Protocol::Tcp,
        port,
        token: "tok".into(),
        source_ranges: Vec::new(),
        proxy_protocol: None,
        bind: None,
    }
}

/// A provider over a fresh state directory; dropping the guard (also when the test panics) kills
/// the servers left in it and removes it, so a failed run leaves no process holding an address.
pub fn provider(test: &str) -> (LocalProvider, StateDir) {
    provider_with(test, skyport(), |_| {})
}

pub fn provider_with(test: &str, exe: PathBuf, tune: impl FnOnce(&mut LocalSettings)) -> (LocalProvider, StateDir) {
    let dir = std::env::temp_dir().join(format!("skyport-local-provider-{test}-{:08x}", rand::random::<u32>()));
    let mut settings = LocalSettings::new(&dir, exe);
    tune(&mut settings);
    (LocalProvider::new(settings).unwrap(), StateDir(dir))
}

pub struct StateDir(pub PathBuf);

impl Drop for StateDir {
    fn drop(&mut self) {
        for entry in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            let Some(pid) = std::fs::read_to_string(entry.path().join("pid")).ok().and_then(|p| p.trim().parse().ok())
            else {
                continue;
            };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&*entry.path().to_string_lossy()) {
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A TCP echo server that first says which backend it is.
pub async fn tcp_backend(tag: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = conn.write_all(format!("{tag}\n").as_bytes()).await;
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

pub async fn udp_backend() -> String {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            let _ = socket.send_to(&buf[..n], from).await;
        }
    });
    addr
}

/// Sends 1 MiB and returns (the backend's tag, whether every byte came back unchanged).
pub async fn tcp_roundtrip(addr: String) -> Option<(String, bool)> {
    let work = async {
        let mut conn = TcpStream::connect(addr).await.ok()?;
        let mut tag = Vec::new();
        let mut b = [0u8; 1];
        while conn.read_exact(&mut b).await.is_ok() && b[0] != b'\n' {
            tag.push(b[0]);
        }
        if tag.is_empty() {
            return None;
        }
        let payload: Vec<u8> = (0..1 << 20).map(|i| (i % 253) as u8).collect();
        let (mut r, mut w) = conn.into_split();
        let sent = payload.clone();
        tokio::spawn(async move { w.write_all(&sent).await });
        let mut back = vec![0u8; payload.len()];
        r.read_exact(&mut back).await.ok()?;
        Some((String::from_utf8(tag).ok()?, back == payload))
    };
    tokio::time::timeout(Duration::from_secs(10), work).await.ok()?
}

/// `skyport tunnel client` with `client`'s config, killed when the handle drops.
pub fn start_client(name: &str, client: &TunnelClient) -> (tokio::process::Child, PathBuf) {
    start_client_with(skyport(), name, client)
}

/// [`start_client`] running `exe`.
pub fn start_client_with(exe: PathBuf, name: &str, client: &TunnelClient) -> (tokio::process::Child, PathBuf) {
    let config = std::env::temp_dir().join(format!("skyport-local-client-{name}-{:08x}.toml", rand::random::<u32>()));
    std::fs::write(&config, render_client_toml(client).unwrap()).unwrap();
    let child = tokio::process::Command::new(exe)
        .args(["tunnel", "client", "--config"])
        .arg(&config)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    (child, config)
}

pub async fn until<T, F: std::future::Future<Output = Option<T>>>(what: &str, mut f: impl FnMut() -> F) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
