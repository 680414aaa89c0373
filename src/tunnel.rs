//! `skyport tunnel server|client`: the exit server and the in-cluster tunnel client are this very
//! binary, running rathole 0.5.0 (Apache-2.0) as a library. So the operator, the client image and
//! the binary an exit server downloads are one artifact, version-matched by construction, and the
//! operator can derive the digest the VM checks from its own executable ([`exit_server_artifacts`]).
//!
//! The client also answers the operator's end-to-end health check: if its config has a service
//! named [`HEALTH_SERVICE`], it listens on that service's `local_addr` and answers a nonce with
//! `HMAC-SHA256(token, context || nonce)`. The exit server publishes that service on a port of its
//! own like any other, so an answer that verifies proves the whole path: the exit server is up,
//! serving this tunnel, and this client's control channel is authenticated to it ([`probe`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context as _;
use providers::exit::userdata::Artifact;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::info;

pub mod addresses;
pub mod firewall;
pub mod forward;
pub mod front;
pub mod options;
pub mod ports;
pub mod proxy;
pub mod push;
pub mod reread;
pub mod verify;

pub use addresses::addresses;
pub use firewall::firewall;

/// Name of the rathole service that carries the health check.
pub const HEALTH_SERVICE: &str = "skyport-health";

/// Whether a rathole service carries a health check: [`HEALTH_SERVICE`], or a pool member's,
/// `<member>.skyport-health`, one per member on a shared exit server.
pub fn is_health_service(name: &str) -> bool {
    name.strip_suffix(HEALTH_SERVICE).is_some_and(|member| member.is_empty() || member.ends_with('.'))
}
/// Bytes of the operator's nonce.
pub const NONCE_LEN: usize = 32;
/// Domain separation: the answer is useless as anything but a health answer.
const HEALTH_CONTEXT: &[u8] = b"skyport-tunnel-health-v1";

/// Which side of the tunnel to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Server,
    Client,
}

/// Runs the tunnel server or client from a rathole config file until SIGTERM or Ctrl-C. A server
/// also takes config pushes on `push_port` (0: not) on its control address ([`push`]), and
/// forwards the address `forward_file` names ([`forward`]).
pub async fn run(role: Role, config: PathBuf, push_port: u16, forward_file: Option<PathBuf>) -> anyhow::Result<()> {
    // rathole panics inside its tasks on some runtime errors (a port it cannot bind, a client
    // retry that gives up); the process must end then, so systemd or the kubelet restarts it,
    // instead of living on without serving.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::exit(101);
    }));
    // rathole's own error for a bad file is vague; check it here to name the file. A server's
    // file carries skyport's table too ([`options`]).
    let parsed = match role {
        Role::Server => options::load(&config).await.map(|(parsed, _)| parsed),
        Role::Client => rathole::Config::from_file(&config).await,
    }
    .with_context(|| format!("reading the tunnel configuration {}", config.display()))?;
    if role == Role::Client
        && let Some(service) = parsed
            .client
            .as_ref()
            .and_then(|c| c.services.iter().find(|(name, _)| is_health_service(name)).map(|s| s.1))
    {
        let token = service.token.as_deref().map(str::to_string).unwrap_or_default();
        let listener = TcpListener::bind(&service.local_addr)
            .await
            .with_context(|| format!("health responder cannot listen on {}", service.local_addr))?;
        info!(address = %service.local_addr, "answering the operator's tunnel health check");
        tokio::spawn(respond(listener, token));
    }
    // A port the server cannot listen on would leave its service dead behind a passing health
    // check; the server refuses to start instead, and says which ([`ports`]).
    if role == Role::Server {
        let problems = ports::unbindable(&parsed, &ports::Ports::new());
        anyhow::ensure!(problems.is_empty(), "cannot listen on the tunnel's service ports: {}", problems.join("; "));
    }
    // Listening before rathole starts: once the control port answers, pushes are taken too.
    if role == Role::Server && push_port != 0 {
        push::listen(&config, &parsed, push_port).await?;
    }
    // rathole runs the server's file as [`front`] derives it, behind skyport's PROXY listeners.
    let mut rathole_config = config.clone();
    if role == Role::Server {
        let (derived, layout) = front::start(&config).await?;
        rathole_config = derived;
        if let Some(file) = forward_file {
            forward::spawn(file, layout);
        }
    }
    // A client ends when its file changes under it ([`reread`]); a server takes pushes instead.
    let loaded = tokio::fs::read(&config).await.unwrap_or_default();
    let watched = (role == Role::Client).then(|| config.clone());
    let changed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (shutdown, shutdown_rx) = tokio::sync::broadcast::channel(1);
    let flag = changed.clone();
    tokio::spawn(async move {
        let rewritten = async {
            match watched {
                Some(path) => reread::changed(path, loaded, reread::EVERY).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop_requested() => {}
            _ = rewritten => flag.store(true, std::sync::atomic::Ordering::SeqCst),
        }
        let _ = shutdown.send(true);
    });
    let cli = rathole::Cli {
        config_path: Some(rathole_config),
        server: role == Role::Server,
        client: role == Role::Client,
        genkey: None,
    };
    rathole::run(cli, shutdown_rx).await?;
    // Ending non-zero on a changed file: the kubelet starts the client again, with the new file.
    anyhow::ensure!(
        !changed.load(std::sync::atomic::Ordering::SeqCst),
        "the tunnel configuration {} changed: ending, to start again with it",
        config.display()
    );
    Ok(())
}

/// The exit server's side of the health check: [`HEALTH_SERVICE`] published on `port` (which
/// the firewall then opens like any service port), with the tunnel's token.
pub fn health_server_service(port: u16, token: &str) -> providers::TunnelService {
    providers::TunnelService {
        name: HEALTH_SERVICE.into(),
        protocol: providers::Protocol::Tcp,
        port,
        token: token.into(),
        source_ranges: Vec::new(),
        proxy_protocol: None,
        bind: None,
    }
}

/// The client's side: the same service, forwarded to the responder on the pod's own loopback.
pub fn health_client_service(port: u16, token: &str) -> providers::ClientService {
    providers::ClientService {
        name: HEALTH_SERVICE.into(),
        protocol: providers::Protocol::Tcp,
        token: token.into(),
        local_addr: format!("127.0.0.1:{port}"),
    }
}

/// SIGTERM (systemd, the kubelet) or Ctrl-C.
async fn stop_requested() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    info!("stopping the tunnel");
}

/// Answers each connection's nonce with its MAC, then closes it.
async fn respond(listener: TcpListener, token: String) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else { continue };
        let token = token.clone();
        tokio::spawn(async move {
            let mut nonce = [0u8; NONCE_LEN];
            let read = tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut nonce)).await;
            if matches!(read, Ok(Ok(_))) {
                let _ = conn.write_all(&health_mac(&token, &nonce)).await;
                let _ = conn.shutdown().await;
            }
        });
    }
}

/// `HMAC-SHA256(token, HEALTH_CONTEXT || nonce)`.
pub fn health_mac(token: &str, nonce: &[u8]) -> [u8; 32] {
    let mut message = HEALTH_CONTEXT.to_vec();
    message.extend_from_slice(nonce);
    crate::mac::hmac_sha256(token.as_bytes(), &message)
}

/// Why a health check did not pass. Never contains the token.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot connect to {0}: {1} (the exit server is not up, or no tunnel client is connected to it)")]
    Connect(SocketAddr, std::io::Error),
    #[error("{0} did not answer within {1:?}")]
    Timeout(SocketAddr, Duration),
    #[error("{0} closed the connection without an answer (the tunnel client's health responder is not reachable)")]
    NoAnswer(SocketAddr),
    #[error("{0} answered, but not with this tunnel's key (another client or server is at that address)")]
    WrongAnswer(SocketAddr),
}

/// Checks the tunnel end to end: a fresh nonce to the exit server's health port must come back
/// MACed with the tunnel's token, which only this tunnel's client can do, through this server.
pub async fn probe(address: SocketAddr, token: &str, timeout: Duration) -> Result<(), ProbeError> {
    let nonce: [u8; NONCE_LEN] = rand::random();
    let work = async {
        let mut conn = TcpStream::connect(address).await.map_err(|e| ProbeError::Connect(address, e))?;
        conn.write_all(&nonce).await.map_err(|_| ProbeError::NoAnswer(address))?;
        let mut answer = [0u8; 32];
        conn.read_exact(&mut answer).await.map_err(|_| ProbeError::NoAnswer(address))?;
        // Compared in full, without an early exit.
        let want = health_mac(token, &nonce);
        let diff = want.iter().zip(answer.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff == 0 { Ok(()) } else { Err(ProbeError::WrongAnswer(address)) }
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| ProbeError::Timeout(address, timeout))?
}

/// Where exit servers download this binary, and what they check it against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactSettings {
    /// URL template; `{version}` and `{arch}` (as `uname -m` prints it) are replaced.
    pub url_template: String,
    /// The executable whose digest exit servers of this machine's architecture check: the
    /// operator's own (`/proc/self/exe`), so the digest is derived, never typed in.
    pub self_exe: PathBuf,
    /// Digests for other architectures (`aarch64` → hex), for exit servers that differ from the
    /// operator's; never used for the operator's own architecture.
    pub other_arches: BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("cannot read the operator's own executable {0} to derive the exit server's digest: {1}")]
    SelfExe(PathBuf, std::io::Error),
    #[error("--exit-server-sha256 {0:?}: expected ARCH=<64 hex digits>")]
    BadDigest(String),
    #[error(
        "--exit-server-sha256 names {0}, this operator's own architecture: its digest is derived from the running binary"
    )]
    OwnArch(String),
    #[error("--exit-server-url {0:?} must be an http(s) URL without quotes, spaces or backslashes")]
    BadUrl(String),
}

/// Parses `ARCH=HEX` overrides.
pub fn parse_digests(values: &[String]) -> Result<BTreeMap<String, String>, ArtifactError> {
    let mut out = BTreeMap::new();
    for v in values {
        let Some((arch, hex)) = v.split_once('=') else { return Err(ArtifactError::BadDigest(v.clone())) };
        let arch_ok = !arch.is_empty() && arch.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        let hex_ok = hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit());
        if !arch_ok || !hex_ok {
            return Err(ArtifactError::BadDigest(v.clone()));
        }
        if arch == std::env::consts::ARCH {
            return Err(ArtifactError::OwnArch(arch.to_string()));
        }
        out.insert(arch.to_string(), hex.to_ascii_lowercase());
    }
    Ok(out)
}

/// SHA-256 of a file, hex; cached per path (the operator's binary does not change under it).
pub fn file_sha256(path: &Path) -> std::io::Result<String> {
    static CACHE: Mutex<BTreeMap<PathBuf, String>> = Mutex::new(BTreeMap::new());
    if let Some(hit) = CACHE.lock().unwrap_or_else(|e| e.into_inner()).get(path) {
        return Ok(hit.clone());
    }
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        match std::io::Read::read(&mut file, &mut chunk)? {
            0 => break,
            n => hasher.update(&chunk[..n]),
        }
    }
    let hex: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    CACHE.lock().unwrap_or_else(|e| e.into_inner()).insert(path.to_path_buf(), hex.clone());
    Ok(hex)
}

/// The artifacts exit servers may run: this machine's architecture with the derived digest,
/// plus the overrides, each with its URL.
pub fn exit_server_artifacts(settings: &ArtifactSettings) -> Result<Vec<Artifact>, ArtifactError> {
    let t = &settings.url_template;
    let url_ok = (t.starts_with("https://") || t.starts_with("http://"))
        && !t.chars().any(|c| c.is_whitespace() || c.is_control() || "'\"\\`$".contains(c));
    if !url_ok {
        return Err(ArtifactError::BadUrl(t.clone()));
    }
    let own = file_sha256(&settings.self_exe).map_err(|e| ArtifactError::SelfExe(settings.self_exe.clone(), e))?;
    let mut digests = settings.other_arches.clone();
    if digests.contains_key(std::env::consts::ARCH) {
        return Err(ArtifactError::OwnArch(std::env::consts::ARCH.to_string()));
    }
    digests.insert(std::env::consts::ARCH.to_string(), own);
    Ok(digests
        .into_iter()
        .map(|(arch, sha256)| Artifact {
            url: t.replace("{version}", env!("CARGO_PKG_VERSION")).replace("{arch}", &arch),
            arch,
            sha256,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_derived_from_the_executable_and_overrides_are_for_other_arches() {
        let dir = std::env::temp_dir().join(format!("skyport-artifact-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("skyport");
        std::fs::write(&exe, b"abc").unwrap();
        let settings = ArtifactSettings {
            url_template: "http://10.0.0.1:8000/v{version}/skyport-{arch}".into(),
            self_exe: exe.clone(),
            other_arches: parse_digests(&[format!("riscv64={}", "AB".repeat(32))]).unwrap(),
        };
        let list = exit_server_artifacts(&settings).unwrap();
        let own = list.iter().find(|a| a.arch == std::env::consts::ARCH).unwrap();
        // SHA-256("abc").
        assert_eq!(own.sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(
            own.url,
            format!("http://10.0.0.1:8000/v{}/skyport-{}", env!("CARGO_PKG_VERSION"), std::env::consts::ARCH)
        );
        let other = list.iter().find(|a| a.arch == "riscv64").unwrap();
        assert_eq!(other.sha256, "ab".repeat(32));

        let own_arch = format!("{}={}", std::env::consts::ARCH, "0".repeat(64));
        assert!(matches!(parse_digests(&[own_arch]), Err(ArtifactError::OwnArch(_))));
        assert!(matches!(parse_digests(&["aarch64=123".into()]), Err(ArtifactError::BadDigest(_))));
        let quoted = ArtifactSettings { url_template: "https://x/'; rm -rf /".into(), ..settings.clone() };
        assert!(matches!(exit_server_artifacts(&quoted), Err(ArtifactError::BadUrl(_))));
        let missing = ArtifactSettings { self_exe: dir.join("missing"), ..settings };
        assert!(matches!(exit_server_artifacts(&missing), Err(ArtifactError::SelfExe(..))));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn the_probe_passes_only_against_the_right_token() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(respond(listener, "right-token".into()));
        probe(address, "right-token", Duration::from_secs(5)).await.unwrap();
        let wrong = probe(address, "other-token", Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(wrong, ProbeError::WrongAnswer(_)), "{wrong}");
        assert!(!wrong.to_string().contains("token"));

        // A listener that accepts and closes (rathole's server with no client behind it).
        let closing = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closing_addr = closing.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((conn, _)) = closing.accept().await {
                drop(conn);
            }
        });
        assert!(matches!(probe(closing_addr, "t", Duration::from_secs(5)).await, Err(ProbeError::NoAnswer(_))));
        // Nobody listening (the exit server publishes the port only while the client is there).
        let gone = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        assert!(matches!(probe(gone, "t", Duration::from_secs(5)).await, Err(ProbeError::Connect(..))));
    }

    /// Both ends must agree on the Noise pattern, and its cipher must be one snow hands to ring:
    /// with the portable cipher the tunnel moved 455 MB/s instead of 807 (BENCHMARKS.md).
    #[tokio::test]
    async fn both_ends_speak_the_pattern_ring_accelerates() {
        use snow::resolvers::{CryptoResolver, RingResolver};
        let dir = std::env::temp_dir().join(format!("skyport-pattern-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let keys = providers::exit::userdata::NoiseKeypair::generate();
        let server = providers::ExitServer {
            control_port: 2333,
            noise_private_key: keys.private_key.clone(),
            services: vec![health_server_service(9000, "t0k")],
        };
        let client = providers::exit::userdata::TunnelClient {
            remote_addr: "203.0.113.9:2333".into(),
            server_public_key: keys.public_key.clone(),
            services: vec![health_client_service(9000, "t0k")],
        };
        std::fs::write(dir.join("server.toml"), providers::exit::userdata::render_server_toml(&server).unwrap())
            .unwrap();
        std::fs::write(dir.join("client.toml"), providers::exit::userdata::render_client_toml(&client).unwrap())
            .unwrap();
        let server = rathole::Config::from_file(&dir.join("server.toml")).await.unwrap().server.unwrap();
        let client = rathole::Config::from_file(&dir.join("client.toml")).await.unwrap().client.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(server.transport.noise.unwrap().pattern, providers::exit::userdata::NOISE_PATTERN);
        assert_eq!(client.transport.noise.unwrap().pattern, providers::exit::userdata::NOISE_PATTERN);

        let params: snow::params::NoiseParams = providers::exit::userdata::NOISE_PATTERN.parse().unwrap();
        assert!(RingResolver.resolve_cipher(&params.cipher).is_some(), "ring does not implement {:?}", params.cipher);
    }
}
