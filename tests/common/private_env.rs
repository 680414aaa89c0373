//! A private test environment for tests that stop and restart servers: its own etcd,
//! kube-apiserver, kube-controller-manager and LocalStack (`tests/env.sh up` with its own state
//! dir and ports), torn down when dropped. The shared environment serves other tests at the same
//! time and must never be disturbed.
//!
//! Also the real binary as a process pointed at such an environment, and the SQS audit the
//! fault tests share (leaks and duplicates by owner tag).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::Client as SqsClient;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};
use skyport::crd::Queue;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A server of the environment that a test may stop.
#[derive(Debug, Clone, Copy)]
pub enum Server {
    Etcd,
    KubeApiserver,
    LocalStack,
}

pub struct PrivateEnv {
    pub state: PathBuf,
    ports: [(&'static str, u16); 4],
    /// `tests/env.sh up`'s export lines: KUBECONFIG, AWS_ENDPOINT_URL, credentials, PATH.
    pub exports: BTreeMap<String, String>,
    down: bool,
}

/// A port free now, below the kernel's ephemeral range (32768–60999 by default), and not handed
/// to another private environment of this run. A port from that range, free when picked, can be
/// taken by any outgoing connection of the suite in the tens of seconds before LocalStack binds
/// it (it was, once: "Address already in use").
fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    (0..10_000)
        .map(|_| rand::random_range(21_000..26_000))
        .find(|port| !given.contains(port) && std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .inspect(|port| _ = given.insert(*port))
        .expect("a free port between 21000 and 26000")
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/env.sh")
}

impl PrivateEnv {
    /// Starts a fresh environment under `/tmp/skyport-<prefix>-<random>` on free ports
    /// (~20-60 s on a loaded machine).
    pub async fn up(prefix: &str) -> PrivateEnv {
        let state = PathBuf::from(format!("/tmp/skyport-{prefix}-{:08x}", rand::random::<u32>()));
        let ports = [
            ("SKYPORT_ETCD_PORT", free_port()),
            ("SKYPORT_ETCD_PEER_PORT", free_port()),
            ("SKYPORT_APISERVER_PORT", free_port()),
            ("SKYPORT_LOCALSTACK_PORT", free_port()),
        ];
        let mut env = PrivateEnv { state, ports, exports: BTreeMap::new(), down: false };
        let out = env.run_script("up").await;
        for line in out.lines() {
            let Some((k, v)) = line.strip_prefix("export ").and_then(|l| l.split_once('=')) else { continue };
            env.exports.insert(k.to_string(), v.trim_matches('\'').to_string());
        }
        assert!(env.exports.contains_key("KUBECONFIG"), "tests/env.sh up printed no KUBECONFIG: {out}");
        env
    }

    fn command(&self, arg: &str) -> std::process::Command {
        let mut cmd = std::process::Command::new(script());
        cmd.arg(arg).env("SKYPORT_STATE", &self.state).envs(self.ports.iter().map(|(k, v)| (k, v.to_string())));
        // No private environment's test needs the node (one per machine, the shared one's).
        cmd.env("SKYPORT_NODE", "0");
        cmd
    }

    async fn run_script(&self, arg: &str) -> String {
        let mut cmd = self.command(arg);
        let out = tokio::task::spawn_blocking(move || cmd.stderr(Stdio::piped()).output().expect("run tests/env.sh"))
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "tests/env.sh {arg} failed: {stderr}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A kube client for this environment's API server, with skyport's CRDs installed.
    pub async fn client(&self) -> Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kubeconfig = Kubeconfig::read_from(&self.exports["KUBECONFIG"]).expect("read kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.unwrap();
        let client = Client::try_from(config).expect("kube client");
        super::install_crds(client.clone()).await;
        client
    }

    /// An SQS client for this environment's LocalStack.
    pub async fn sqs(&self) -> SqsClient {
        let shared = super::sqs().await;
        SqsClient::from_conf(shared.config().to_builder().endpoint_url(&self.exports["AWS_ENDPOINT_URL"]).build())
    }

    /// Environment variables pointing a `skyport` process at this environment.
    pub fn process_env(&self) -> Vec<(String, String)> {
        ["KUBECONFIG", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
            .iter()
            .map(|k| (k.to_string(), self.exports[*k].clone()))
            .collect()
    }

    fn pid_file(&self, server: Server) -> PathBuf {
        match server {
            Server::Etcd => self.state.join("run/etcd.pid"),
            Server::KubeApiserver => self.state.join("run/kube-apiserver.pid"),
            Server::LocalStack => self.state.join("localstack/localstack.pid"),
        }
    }

    /// Stops `server` (SIGTERM, SIGKILL after 15 s like tests/env.sh; at once with `kill`) and
    /// waits until it is gone. LocalStack keeps its state in memory only: stopping it wipes every
    /// queue.
    pub async fn stop(&self, server: Server, kill: bool) {
        let pid = std::fs::read_to_string(self.pid_file(server)).expect("pid file").trim().to_string();
        // A zombie (exited, not yet reaped by whoever inherited it) is gone too.
        let gone = || std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "));
        let signal = |s: &'static str| Command::new("kill").args([s, &pid]).status();
        let _ = signal(if kill { "-KILL" } else { "-TERM" }).await;
        let deadline = Instant::now() + Duration::from_secs(15);
        while !gone() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !gone() {
            let _ = signal("-KILL").await;
        }
        super::eventually(&format!("{server:?} (pid {pid}) stopped"), Duration::from_secs(30), || async {
            gone().then_some(())
        })
        .await;
    }

    /// Starts whatever is not running (etcd keeps its data; LocalStack starts empty) and waits
    /// until everything is ready.
    pub async fn start(&self) {
        self.run_script("up").await;
    }

    /// Stops every server and deletes the state dir.
    pub async fn down(mut self) {
        self.run_script("down").await;
        self.down = true;
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

impl Drop for PrivateEnv {
    /// A failed test still stops its servers (the state dir stays for inspection).
    fn drop(&mut self) {
        if !self.down {
            let _ = self.command("down").stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
    }
}

/// One `skyport run` process with its JSON log lines.
pub struct Skyport {
    pub child: Child,
    pub logs: Arc<Mutex<Vec<Value>>>,
}

impl Skyport {
    /// Starts the binary with `args` after `run --log-format json`, pointed at `env`.
    pub fn start(env: &PrivateEnv, args: &[String]) -> Skyport {
        Skyport::spawn(env.process_env(), args)
    }

    /// Like [`Skyport::start`], with `vars` on top of the test's environment.
    pub fn spawn(vars: Vec<(String, String)>, args: &[String]) -> Skyport {
        let mut child = Command::new(env!("CARGO_BIN_EXE_skyport"))
            .args(["run", "--log-format", "json", "--listen-address", "127.0.0.1:0"])
            .args(args)
            .envs(vars)
            // As the cluster admin, whom no admission policy covers (tests/rbac/startup.rs covers that).
            .env("SKYPORT_ALLOW_WITHOUT_ADMISSION_POLICIES", "true")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start target/debug/skyport");
        let logs: Arc<Mutex<Vec<Value>>> = Arc::default();
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let sink = logs.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let value = serde_json::from_str(&line).unwrap_or_else(|_| json!({ "message": line }));
                    sink.lock().unwrap().push(value);
                }
            });
        }
        Skyport { child, logs }
    }

    /// Log lines whose message starts with `message`.
    pub fn lines(&self, message: &str) -> Vec<Value> {
        let logs = self.logs.lock().unwrap();
        logs.iter().filter(|l| l["message"].as_str().is_some_and(|m| m.starts_with(message))).cloned().collect()
    }

    pub fn panics(&self) -> usize {
        let logs = self.logs.lock().unwrap();
        logs.iter().filter(|l| l.to_string().contains("panicked")).count()
    }

    pub async fn stop(mut self) -> Vec<Value> {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        self.logs.lock().unwrap().clone()
    }
}

/// SQS queues of namespace `ns` counted per owner UID.
pub async fn queues_by_owner(sqs: &SqsClient, ns: &str) -> BTreeMap<String, Vec<String>> {
    let urls = sqs
        .list_queues()
        .queue_name_prefix(format!("{ns}_"))
        .max_results(1000)
        .send()
        .await
        .expect("ListQueues")
        .queue_urls
        .unwrap_or_default();
    let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for url in urls {
        let tags = sqs.list_queue_tags().queue_url(&url).send().await.map(|t| t.tags.unwrap_or_default());
        // A queue deleted between the list and this call is no leak.
        let Ok(tags) = tags else { continue };
        owners.entry(tags.get("skyport.dev/owner-uid").cloned().unwrap_or_default()).or_default().push(url);
    }
    owners
}

/// The end-of-test audit: (leaks: queues whose owner is not a live Queue, duplicates: extra
/// queues of a live Queue, stuck finalizers: Queues still terminating).
pub async fn audit(sqs: &SqsClient, queues: &Api<Queue>, ns: &str) -> (usize, usize, usize) {
    let list = queues.list(&ListParams::default()).await.expect("list Queues").items;
    let live: BTreeSet<String> = list
        .iter()
        .filter(|q| q.metadata.deletion_timestamp.is_none())
        .filter_map(|q| q.metadata.uid.clone())
        .collect();
    let stuck = list.iter().filter(|q| q.metadata.deletion_timestamp.is_some()).count();
    let owners = queues_by_owner(sqs, ns).await;
    let leaks = owners.iter().filter(|(uid, _)| !live.contains(*uid)).map(|(_, urls)| urls.len()).sum();
    let duplicates = owners.iter().filter(|(uid, _)| live.contains(*uid)).map(|(_, urls)| urls.len() - 1).sum();
    (leaks, duplicates, stuck)
}

/// A setting from the environment (CI size by default, the full run sets it).
pub fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
