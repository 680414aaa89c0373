//! A very small stand-in for the kubelet and kube-proxy, for the one Deployment kind skyport
//! makes: the tunnel client, for the Tunnel tests on the shared control plane that need a client
//! only to reach Active (those of the path of bytes run real Pods on the test node:
//! tests/node/tunnels.rs). The shared control plane runs no nodes, so this runs the client
//! Deployment's container as a local process — the Deployment's own command and args, with the
//! image's `/skyport` being the skyport binary this test build made, and the client.toml from the
//! Secret the Deployment mounts — and, in place of kube-proxy, points the Service's cluster IP at
//! local test backends.
//!
//! Like a kubelet it restarts the process when the pod template changes (the config checksum
//! annotation) or when it exited (`restartPolicy: Always`), and stops it when the Deployment is
//! gone.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

/// The skyport binary of this build: the operator image's `/skyport`, the exit server's
/// `/usr/local/bin/skyport`. `SKYPORT_BENCH_EXE` replaces it, for the benchmarks to run the
/// image's static musl build (`tests/env/build-musl.sh`) instead.
pub fn skyport_exe() -> PathBuf {
    std::env::var_os("SKYPORT_BENCH_EXE").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_skyport")), PathBuf::from)
}

/// Where the operator image keeps its binary (the Dockerfile's `COPY ... /skyport`).
const IMAGE_BINARY: &str = "/skyport";
/// How often a running client's Secret files are brought up to date (the kubelet syncs about once a
/// minute; shorter here, so a test waits seconds rather than a minute for the same behaviour).
const VOLUME_SYNC: Duration = Duration::from_secs(3);

/// Echo backends standing in for a Service's endpoints, one per (port, protocol), started on
/// demand. Each answers with its own port first, so a test can tell which port it reached:
/// TCP sends `<port>\n` on accept and then echoes; UDP answers `<port>:<datagram>`.
#[derive(Clone, Default)]
pub struct Backends(Arc<Mutex<BTreeMap<(u16, String), SocketAddr>>>);

impl Backends {
    /// Routes `port`/`protocol` to `addr` (an existing server) instead of a tagged echo.
    pub async fn set(&self, port: u16, protocol: &str, addr: SocketAddr) {
        self.0.lock().unwrap().insert((port, protocol.to_string()), addr);
    }

    pub async fn addr(&self, port: u16, protocol: &str) -> SocketAddr {
        if let Some(a) = self.0.lock().unwrap().get(&(port, protocol.to_string())) {
            return *a;
        }
        let addr = match protocol {
            "udp" => {
                let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
                let addr = socket.local_addr().unwrap();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                        let mut reply = format!("{port}:").into_bytes();
                        reply.extend_from_slice(&buf[..n]);
                        let _ = socket.send_to(&reply, from).await;
                    }
                });
                addr
            }
            _ => {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                tokio::spawn(async move {
                    while let Ok((mut conn, _)) = listener.accept().await {
                        tokio::spawn(async move {
                            if conn.write_all(format!("{port}\n").as_bytes()).await.is_err() {
                                return;
                            }
                            let (mut r, mut w) = conn.split();
                            let _ = tokio::io::copy(&mut r, &mut w).await;
                        });
                    }
                });
                addr
            }
        };
        *self.0.lock().unwrap().entry((port, protocol.to_string())).or_insert(addr)
    }
}

/// Rewrites every `local_addr = "<ip>:<port>"` of a rathole client.toml (the Service's cluster
/// IP) to the local backend for that port, as kube-proxy would route it. The health responder's
/// address is the pod's own loopback; pods here share one, so it gets a free port of its own.
async fn route(client_toml: &str, backends: &Backends) -> String {
    let mut lines: Vec<String> = client_toml.lines().map(String::from).collect();
    // Each section's `type` (rathole's default is tcp), keyed by the section's first line.
    let mut section_type = BTreeMap::new();
    let mut section = 0;
    for (i, line) in lines.iter().enumerate() {
        if line.trim().starts_with('[') {
            section = i;
        }
        if let Some(v) = line.trim().strip_prefix("type = ") {
            section_type.insert(section, v.trim_matches('"').to_string());
        }
    }
    let mut section = 0;
    for (i, line) in lines.iter_mut().enumerate() {
        if line.trim().starts_with('[') {
            section = i;
        }
        let Some(value) = line.trim().strip_prefix("local_addr = ") else { continue };
        if lines_header(client_toml, section).contains(skyport::tunnel::HEALTH_SERVICE) {
            let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
            *line = format!("local_addr = \"{free}\"");
            continue;
        }
        let port: u16 = value.trim_matches('"').rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port");
        let protocol = section_type.get(&section).map(String::as_str).unwrap_or("tcp");
        *line = format!("local_addr = \"{}\"", backends.addr(port, protocol).await);
    }
    lines.into_iter().map(|l| l + "\n").collect()
}

fn lines_header(toml: &str, index: usize) -> String {
    toml.lines().nth(index).unwrap_or_default().to_string()
}

/// Runs the client Deployment `name` of `namespace` until dropped.
pub struct ClientRunner {
    task: tokio::task::JoinHandle<()>,
    /// How many times the client process was (re)started.
    pub starts: Arc<std::sync::atomic::AtomicU32>,
    /// The running client's pid (0 while none runs).
    pub pid: Arc<std::sync::atomic::AtomicU32>,
}

impl Drop for ClientRunner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ClientRunner {
    /// The Pod gone for good, as when its node dies: the client process killed, never started
    /// again.
    pub fn stop(&self) {
        self.task.abort();
        let pid = self.pid.load(std::sync::atomic::Ordering::Relaxed);
        if pid != 0 {
            let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }

    pub fn start(client: Client, namespace: &str, name: &str, backends: Backends) -> Self {
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        let secrets: Api<Secret> = Api::namespaced(client, namespace);
        let name = name.to_string();
        // Object names reach 253 characters, file names only 255 bytes: long ones are hashed.
        let key = format!("{namespace}-{name}");
        let key = if key.len() > 100 {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            key.hash(&mut h);
            format!("{}-{:016x}", &key[..80], h.finish())
        } else {
            key
        };
        let dir = std::env::temp_dir().join(format!("skyport-kubelet-{key}"));
        std::fs::create_dir_all(&dir).unwrap();
        let starts = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let pid = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (counter, current) = (starts.clone(), pid.clone());
        let task = tokio::spawn(async move {
            let mut running: Option<(String, tokio::process::Child, String)> = None;
            let mut synced = tokio::time::Instant::now();
            loop {
                // An exited client is started again, as a kubelet does: the tunnel must come back
                // on its own (and the health responder's port, picked just before the start, may
                // have been taken meanwhile by another process's connection).
                if running.as_mut().is_some_and(|(_, child, _)| child.try_wait().ok().flatten().is_some()) {
                    running = None;
                    current.store(0, std::sync::atomic::Ordering::Relaxed);
                }
                let template = deployments.get_opt(&name).await.ok().flatten().and_then(|d| d.spec).map(|s| s.template);
                let want = template.as_ref().map(|t| serde_json::to_string(t).unwrap());
                if running.as_ref().map(|(k, _, _)| Some(k)) != Some(want.as_ref()) {
                    if let Some((_, mut child, _)) = running.take() {
                        let _ = child.kill().await;
                        current.store(0, std::sync::atomic::Ordering::Relaxed);
                    }
                    if let (Some(key), Some(template)) = (want, template)
                        && let Some((child, mounted)) = launch(&template, &secrets, &backends, &dir).await
                    {
                        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        current.store(child.id().unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
                        running = Some((key, child, mounted));
                    }
                } else if let (Some(template), Some((_, _, mounted))) = (template, running.as_mut())
                    && synced.elapsed() > VOLUME_SYNC
                {
                    // The kubelet's periodic volume sync: a running Pod's Secret files follow the Secret.
                    if let Some((_, now)) = mount(&template, &secrets, &backends, &dir, Some(mounted)).await {
                        *mounted = now;
                    }
                    synced = tokio::time::Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        ClientRunner { task, starts, pid }
    }
}

/// Starts the pod template's single container: args as given, the Secret volume's items
/// written under a local directory that stands in for the mount path.
async fn launch(
    template: &k8s_openapi::api::core::v1::PodTemplateSpec,
    secrets: &Api<Secret>,
    backends: &Backends,
    dir: &std::path::Path,
) -> Option<(tokio::process::Child, String)> {
    let (args, mounted) = mount(template, secrets, backends, dir, None).await?;
    // Appended across restarts, so a client that exited keeps its last words.
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("client.log")).ok()?;
    tokio::process::Command::new(skyport_exe())
        .args(&args[1..])
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().ok()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .ok()
        .map(|child| (child, mounted))
}

/// Writes the Secret volume's items as they are now under `dir`, unless they are what `mounted`
/// says was written last (the files are routed to this test's backends, so the Secret's own text
/// is what tells a change, as it does for the kubelet's volume sync), and returns the container's
/// args, the mount paths replaced by the local files, with the Secret's text as written.
async fn mount(
    template: &k8s_openapi::api::core::v1::PodTemplateSpec,
    secrets: &Api<Secret>,
    backends: &Backends,
    dir: &std::path::Path,
    mounted: Option<&str>,
) -> Option<(Vec<String>, String)> {
    let spec = template.spec.as_ref()?;
    let container = spec.containers.first()?;
    // The container runs its command (the image's entrypoint when unset) with its args.
    let command = container.command.clone().unwrap_or_else(|| vec![IMAGE_BINARY.to_string()]);
    let mut args: Vec<String> = command.into_iter().chain(container.args.clone().unwrap_or_default()).collect();
    if args.first().map(String::as_str) != Some(IMAGE_BINARY) {
        return None;
    }
    let mut files = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let volume = spec.volumes.iter().flatten().find(|v| v.name == mount.name)?;
        let source = volume.secret.as_ref()?;
        let secret = secrets.get_opt(source.secret_name.as_deref()?).await.ok().flatten()?;
        let data = secret.data.unwrap_or_default();
        for item in source.items.iter().flatten() {
            let text = String::from_utf8(data.get(&item.key)?.0.clone()).ok()?;
            files.push((dir.join(&item.path), text));
            let local = dir.join(&item.path);
            let in_pod = format!("{}/{}", mount.mount_path.trim_end_matches('/'), item.path);
            for a in &mut args {
                if *a == in_pod {
                    *a = local.to_string_lossy().into_owned();
                }
            }
        }
    }
    let texts: String = files.iter().map(|(_, text)| text.as_str()).collect::<Vec<_>>().join("\n\0");
    if mounted != Some(texts.as_str()) {
        for (local, text) in &files {
            std::fs::write(local, route(text, backends).await).ok()?;
        }
    }
    Some((args, texts))
}

/// Sends `payload` to `ip:port` over TCP and returns (the backend's port tag, the echo), or
/// `None` while the tunnel is not (yet) carrying that port.
pub async fn tcp_echo(ip: &str, port: u16, payload: &[u8]) -> Option<(u16, Vec<u8>)> {
    let work = async {
        let mut conn = TcpStream::connect((ip, port)).await.ok()?;
        let mut tag = Vec::new();
        let mut byte = [0u8; 1];
        while conn.read_exact(&mut byte).await.is_ok() && byte[0] != b'\n' {
            tag.push(byte[0]);
        }
        let tag: u16 = String::from_utf8(tag).ok()?.parse().ok()?;
        let (mut r, mut w) = conn.into_split();
        let data = payload.to_vec();
        let writer = tokio::spawn(async move {
            w.write_all(&data).await.ok()?;
            w.shutdown().await.ok()
        });
        let mut echoed = vec![0u8; payload.len()];
        r.read_exact(&mut echoed).await.ok()?;
        writer.await.ok()??;
        Some((tag, echoed))
    };
    tokio::time::timeout(Duration::from_secs(10), work).await.ok()?
}

/// Sends one datagram to `ip:port` and returns the reply, or `None` without one within 1 s.
pub async fn udp_echo(ip: &str, port: u16, payload: &[u8]) -> Option<Vec<u8>> {
    let socket = UdpSocket::bind("0.0.0.0:0").await.ok()?;
    socket.send_to(payload, (ip, port)).await.ok()?;
    let mut buf = vec![0u8; 65536];
    let (n, _) = tokio::time::timeout(Duration::from_secs(1), socket.recv_from(&mut buf)).await.ok()?.ok()?;
    Some(buf[..n].to_vec())
}

/// Runs every tunnel client Deployment of `namespace` (the Deployments skyport manages),
/// each with its own backends, as a kubelet would, until dropped: for tests with Tunnels made on
/// the fly, hand-written ones (`<tunnel>-client`) included.
pub struct AllClients {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AllClients {
    fn drop(&mut self) {
        // Dropping the task drops its runners, which kill their clients.
        self.task.abort();
    }
}

impl AllClients {
    pub fn start(client: Client, namespace: &str) -> Self {
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        let namespace = namespace.to_string();
        let task = tokio::spawn(async move {
            let mut runners: BTreeMap<String, ClientRunner> = BTreeMap::new();
            loop {
                let clients = kube::api::ListParams::default().labels(&skyport::controllers::managed_selector());
                if let Ok(list) = deployments.list(&clients).await {
                    for d in list.items {
                        let name = d.metadata.name.unwrap_or_default();
                        runners.entry(name.clone()).or_insert_with(|| {
                            ClientRunner::start(client.clone(), &namespace, &name, Backends::default())
                        });
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        AllClients { task }
    }
}
