//! Operating the real binary (`target/debug/skyport run`) against the test API server:
//! leader election between two processes, `/healthz`, `/readyz` and `/metrics` as documented in
//! docs/monitoring.md, graceful SIGTERM, and the uninstall path (Queues first; what a forgotten
//! finalizer does and how to release it).

use crate::common;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use skyport::crd::{ConditionStatus, Queue};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// Long enough that a slow API server under a parallel test run does not fail renewals
/// (request timeout: a sixth of it).
const LEASE_DURATION: Duration = Duration::from_secs(6);
const TIMEOUT: Duration = Duration::from_secs(30);

/// One `skyport run` process and the JSON log lines it printed.
struct Skyport {
    child: Child,
    logs: Arc<Mutex<Vec<Value>>>,
    address: String,
    identity: String,
}

impl Skyport {
    /// Starts the binary watching `ns`, with leader election on a Lease in `ns`.
    async fn start(ns: &str) -> Skyport {
        let mut child = Command::new(env!("CARGO_BIN_EXE_skyport"))
            .args(["run", "--namespace", ns, "--log-format", "json", "--listen-address", "127.0.0.1:0"])
            .args(["--leader-elect", "--lease-namespace", ns, "--lease-name", "skyport"])
            .arg(format!("--lease-duration={}s", LEASE_DURATION.as_secs()))
            .args(["--queue-resync", "2s", "--error-backoff-min", "200ms", "--error-backoff-max", "2s"])
            // As the cluster admin, whom no admission policy covers (tests/rbac/startup.rs covers that).
            .env("SKYPORT_ALLOW_WITHOUT_ADMISSION_POLICIES", "true")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start target/debug/skyport");
        let logs: Arc<Mutex<Vec<Value>>> = Arc::default();
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let sink = logs.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let value = serde_json::from_str(&line).unwrap_or_else(|_| json!({ "message": line }));
                sink.lock().unwrap().push(value);
            }
        });
        let mut proc = Skyport { child, logs, address: String::new(), identity: String::new() };
        proc.address = proc.wait_log("serving /healthz", "address").await;
        proc.identity = proc.wait_log("waiting for the leader lease", "identity").await;
        proc
    }

    /// Field `field` of the first log line whose message starts with `message`.
    async fn wait_log(&self, message: &str, field: &str) -> String {
        eventually(&format!("log line {message:?}"), TIMEOUT, || async {
            self.logs.lock().unwrap().iter().find_map(|l| {
                let m = l["message"].as_str()?;
                m.starts_with(message).then(|| l[field].as_str().unwrap_or_default().to_string())
            })
        })
        .await
    }

    /// The first log line whose message starts with `message`.
    fn log_line(&self, message: &str) -> Option<Value> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .find(|l| l["message"].as_str().is_some_and(|m| m.starts_with(message)))
            .cloned()
    }

    fn logged(&self, message: &str) -> bool {
        self.logs.lock().unwrap().iter().any(|l| l["message"].as_str().is_some_and(|m| m.starts_with(message)))
    }

    /// Whether the process logged `message` by the time its output is read to the end: the
    /// reader task may still hold the last lines of a process that just exited.
    async fn logged_at_exit(&self, message: &str) -> bool {
        for _ in 0..50 {
            if self.logged(message) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    async fn get(&self, path: &str) -> (u16, String, String) {
        http_get(&self.address, path).await
    }

    /// The metrics' samples: `name{labels}` → value.
    async fn metrics(&self) -> BTreeMap<String, f64> {
        let (status, content_type, body) = self.get("/metrics").await;
        assert_eq!(status, 200);
        assert!(content_type.starts_with("application/openmetrics-text"), "{content_type}");
        assert!(body.ends_with("# EOF\n"), "{body}");
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
            .collect()
    }

    async fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("running").to_string();
        let status = Command::new("kill").args([signal, &pid]).status().await.expect("kill");
        assert!(status.success());
    }
}

/// A plain HTTP/1.1 GET: (status, content type, body).
pub(crate) async fn http_get(address: &str, path: &str) -> (u16, String, String) {
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("HTTP response");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status code");
    let content_type = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type: ").map(str::to_string))
        .unwrap_or_default();
    (status, content_type, body.to_string())
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases.get("skyport").await.ok()?.spec?.holder_identity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn two_processes_elect_one_leader_which_a_standby_replaces_after_kill_9() {
    let ns = TestNs::new("leader").await;
    let leases: Api<Lease> = ns.api();
    let queues: Api<Queue> = ns.api();
    let a = Skyport::start(&ns.name).await;
    let b = Skyport::start(&ns.name).await;

    let first = eventually("a Lease holder", TIMEOUT, || async { holder(&leases).await }).await;
    let (mut leader, standby) = if first == a.identity { (a, b) } else { (b, a) };
    assert_eq!(first, leader.identity, "the holder is one of the two processes");

    // Both are alive and ready: the leader once its caches synced, the standby while it waits.
    for (proc, phase) in [(&leader, "running"), (&standby, "standby")] {
        assert_eq!(proc.get("/healthz").await.0, 200);
        eventually(&format!("/readyz says {phase}"), TIMEOUT, || async {
            let (status, _, body) = proc.get("/readyz").await;
            (status == 200 && body.trim() == phase).then_some(())
        })
        .await;
    }
    assert_eq!(leader.get("/nope").await.0, 404);

    // Only the leader reconciles.
    queues.create(&PostParams::default(), &queue("one", json!({}))).await.unwrap();
    let one = wait_ready(&queues, "one", ConditionStatus::True, "Available", TIMEOUT).await;
    let sqs_one = one.status.as_ref().and_then(|s| s.queue_name.clone()).unwrap().to_string();
    let m = eventually("leader metrics count the Queue", TIMEOUT, || async {
        let m = leader.metrics().await;
        // The reconcile is counted as it returns, just after its status write made the Queue Ready.
        let counted = m.get(r#"skyport_reconciles_total{controller="queue"}"#).is_some_and(|n| *n >= 1.0);
        (m.get(r#"skyport_objects{controller="queue",ready="True"}"#) == Some(&1.0) && counted).then_some(m)
    })
    .await;
    assert_eq!(m["skyport_leader"], 1.0);
    assert!(m[r#"skyport_reconciles_total{controller="queue"}"#] >= 1.0, "{m:?}");
    assert!(m[r#"skyport_reconcile_duration_seconds_count{controller="queue"}"#] >= 1.0, "{m:?}");
    assert_eq!(m[r#"skyport_cloud_api_calls_total{provider="sqs",operation="CreateQueue",outcome="success"}"#], 1.0);
    assert!(m.contains_key(r#"skyport_rate_limiter_waits_total{provider="sqs"}"#), "{m:?}");
    // The standby is warm: its caches listed; it made no write and no SQS call, and leaves the
    // count of cached objects to the leader (dashboards sum over replicas).
    let s = eventually("the standby's caches synced", TIMEOUT, || async {
        let s = standby.metrics().await;
        (s.get("skyport_caches_synced") == Some(&1.0)).then_some(s)
    })
    .await;
    let cached: f64 = s.iter().filter(|(k, _)| k.starts_with("skyport_objects{")).map(|(_, v)| v).sum();
    assert_eq!(cached, 0.0, "the standby counts objects the leader counts: {s:?}");
    assert_eq!(s["skyport_leader"], 0.0);
    assert_eq!(s[r#"skyport_reconciles_total{controller="queue"}"#], 0.0, "the standby reconciled: {s:?}");
    assert_eq!(s[r#"skyport_kube_api_writes_total{controller="queue"}"#], 0.0, "the standby wrote: {s:?}");
    let sqs_calls: f64 = s
        .iter()
        .filter(|(k, _)| {
            k.starts_with("skyport_cloud_api_calls_total") || k.starts_with("skyport_sqs_account_calls_total")
        })
        .map(|(_, v)| v)
        .sum();
    assert_eq!(sqs_calls, 0.0, "the standby called SQS: {s:?}");
    assert!(standby.logged("caches synced; standing by"), "the standby's caches synced before it led");
    assert_eq!(standby.get("/readyz").await.2.trim(), "standby");

    // JSON log lines written during a reconcile name the object.
    let line = leader.log_line("created SQS queue").expect("the leader logged the creation");
    assert_eq!((line["kind"].as_str(), line["name"].as_str()), (Some("Queue"), Some("one")), "{line}");
    assert_eq!(line["namespace"].as_str(), Some(ns.name.as_str()), "{line}");

    // kill -9 the leader: the standby takes over once the Lease expires.
    // Queue two is made at once: the standby acts on it as soon as it holds the Lease.
    leader.child.start_kill().unwrap();
    let _ = leader.child.wait().await;
    let killed = Instant::now();
    queues.create(&PostParams::default(), &queue("two", json!({}))).await.unwrap();
    eventually("the standby holds the Lease", TIMEOUT, || async {
        (holder(&leases).await.as_deref() == Some(standby.identity.as_str())).then_some(())
    })
    .await;
    // How soon is measured by benches/tunnel.rs --failover (the operator gone with the client);
    // bounded here only so a standby that never takes over fails, generously, as a loaded
    // machine runs renewals late.
    let takeover = killed.elapsed();
    assert!(takeover <= 4 * LEASE_DURATION, "takeover took {takeover:?}");
    eprintln!("takeover after kill -9: {takeover:?} (lease duration {LEASE_DURATION:?})");
    eventually("the new leader is ready", TIMEOUT, || async {
        let (status, _, body) = standby.get("/readyz").await;
        (status == 200 && body.trim() == "running").then_some(())
    })
    .await;

    // The new leader reconciles; the first queue was not created twice.
    wait_ready(&queues, "two", ConditionStatus::True, "Available", TIMEOUT).await;
    eprintln!("kill -9 of the leader to a Queue made after it Ready: {:?}", killed.elapsed());
    assert!(standby.logged("caches synced before the Lease was acquired"), "the takeover started warm");
    // The count is taken after the status write that made "two" Ready: wait for it.
    let reconciles = r#"skyport_reconciles_total{controller="queue"}"#;
    let m = eventually("the new leader's reconciles counted", TIMEOUT, || async {
        let m = standby.metrics().await;
        (m.get(reconciles).copied().unwrap_or(0.0) >= 2.0).then_some(m)
    })
    .await;
    assert_eq!(m["skyport_leader"], 1.0);
    assert_eq!(
        m.get(r#"skyport_cloud_api_calls_total{provider="sqs",operation="CreateQueue",outcome="success"}"#),
        Some(&1.0),
        "only Queue two was created by the new leader: {m:?}"
    );
    let sqs = sqs().await;
    let urls = sqs.list_queues().queue_name_prefix(&sqs_one).send().await.unwrap().queue_urls.unwrap_or_default();
    assert_eq!(urls.len(), 1, "{urls:?}");

    // Uninstall order: delete the Queues while the operator runs, then stop it.
    queues.delete("one", &DeleteParams::default()).await.unwrap();
    queues.delete("two", &DeleteParams::default()).await.unwrap();
    wait_gone(&queues, "one", TIMEOUT).await;
    wait_gone(&queues, "two", TIMEOUT).await;
    assert!(!queue_exists(&sqs, &sqs_one).await);

    // SIGTERM: finishes, releases the Lease, exits 0.
    let mut new_leader = standby;
    new_leader.signal("-TERM").await;
    let status = tokio::time::timeout(Duration::from_secs(20), new_leader.child.wait()).await.expect("exit").unwrap();
    assert!(status.success(), "{status}");
    assert!(new_leader.logged_at_exit("released the leader lease").await);
    assert_eq!(holder(&leases).await, None, "the Lease was released");
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn sigterm_on_a_standby_exits_at_once_and_a_lone_process_is_leader() {
    let ns = TestNs::new("standby").await;
    let leases: Api<Lease> = ns.api();
    let queues: Api<Queue> = ns.api();
    let mut a = Skyport::start(&ns.name).await;
    eventually("a holds the Lease", TIMEOUT, || async { (holder(&leases).await? == a.identity).then_some(()) }).await;
    queues.create(&PostParams::default(), &queue("held", json!({}))).await.unwrap();
    wait_ready(&queues, "held", ConditionStatus::True, "Available", TIMEOUT).await;
    // b's reconcile of Queue "held" waits at its gate: SIGTERM ends it without acting.
    let mut b = Skyport::start(&ns.name).await;
    assert_eq!(b.get("/readyz").await.2.trim(), "standby");
    b.wait_log("caches synced; standing by", "message").await;
    b.signal("-TERM").await;
    let status = tokio::time::timeout(Duration::from_secs(10), b.child.wait()).await.expect("exit").unwrap();
    assert!(status.success(), "{status}");
    assert!(b.logged_at_exit("stopped before becoming leader").await);
    assert_eq!(holder(&leases).await.as_deref(), Some(a.identity.as_str()), "a standby never touches the holder");
    queues.delete("held", &DeleteParams::default()).await.unwrap();
    wait_gone(&queues, "held", TIMEOUT).await;
    a.signal("-TERM").await;
    let status = tokio::time::timeout(Duration::from_secs(20), a.child.wait()).await.expect("exit").unwrap();
    assert!(status.success(), "{status}");
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_leader_that_loses_its_lease_exits_and_leaves_it_to_the_new_holder() {
    let ns = TestNs::new("lost").await;
    let leases: Api<Lease> = ns.api();
    let mut a = Skyport::start(&ns.name).await;
    // The Lease names a before a has read it back and counts itself the leader: taken in that
    // window, a is a standby that waits for the Lease to expire and takes it again.
    a.wait_log("acquired the leader lease", "identity").await;
    eventually("a holds the Lease", TIMEOUT, || async { (holder(&leases).await? == a.identity).then_some(()) }).await;
    // Someone else takes the Lease (as a standby would after a missed renewal).
    let patch = json!({"spec": {"holderIdentity": "intruder", "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now())}});
    leases.patch("skyport", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await.unwrap();
    let taken = Instant::now();
    // Bounded generously: on a loaded machine the renewal that notices runs late. How soon it
    // notices is the renewal period's business (unit tested in src/leader.rs), not this test's.
    let status = tokio::time::timeout(4 * LEASE_DURATION, a.child.wait()).await.expect("the old leader exits").unwrap();
    assert_eq!(status.code(), Some(1), "{status}");
    eprintln!("the old leader exited {:?} after the Lease was taken", taken.elapsed());
    assert!(a.logged_at_exit("lost the leader lease").await);
    assert_eq!(holder(&leases).await.as_deref(), Some("intruder"), "the new holder keeps the Lease");
    ns.cleanup().await;
}

fn kubectl(args: &[&str]) -> String {
    let out = std::process::Command::new("kubectl").args(args).output().expect("kubectl on PATH");
    assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// docs/uninstall.md: Queues first while the operator runs (Delete removes the SQS
/// queue, Retain keeps it); a Queue left behind when the operator is gone blocks its namespace
/// until its finalizer is removed by hand, which leaves the SQS queue in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn uninstall_deletes_queues_first_and_a_forgotten_finalizer_can_be_released() {
    let ns = TestNs::new("uninstall").await;
    let queues: Api<Queue> = ns.api();
    let op = Operator::start(&ns, fast_settings()).await;
    for (name, policy) in [("dropped", "Delete"), ("kept", "Retain"), ("forgotten", "Delete")] {
        queues.create(&PostParams::default(), &queue(name, json!({"deletionPolicy": policy}))).await.unwrap();
    }
    let mut sqs_names = BTreeMap::new();
    for name in ["dropped", "kept", "forgotten"] {
        let q = wait_ready(&queues, name, ConditionStatus::True, "Available", TIMEOUT).await;
        sqs_names.insert(name, q.status.unwrap().queue_name.unwrap().to_string());
    }
    let sqs = sqs().await;

    // Step 1 of the documented uninstall, while the operator runs.
    let ns_name = ns.name.clone();
    tokio::task::spawn_blocking(move || {
        kubectl(&["delete", "queue", "dropped", "kept", "-n", &ns_name, "--timeout=60s"]);
    })
    .await
    .unwrap();
    assert!(!queue_exists(&sqs, &sqs_names["dropped"]).await, "deletionPolicy Delete removes the SQS queue");
    assert!(queue_exists(&sqs, &sqs_names["kept"]).await, "deletionPolicy Retain keeps it");

    // The operator goes away with a Queue left: its namespace cannot finish deleting.
    op.stop().await;
    let namespaces: Api<Namespace> = Api::all(ns.client.clone());
    namespaces.delete(&ns.name, &DeleteParams::default()).await.unwrap();
    eventually("the namespace controller deletes the Queue", TIMEOUT, || async {
        queues.get("forgotten").await.ok()?.metadata.deletion_timestamp.map(|_| ())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(queues.get("forgotten").await.is_ok(), "the Queue waits for its finalizer");
    assert!(namespaces.get(&ns.name).await.is_ok(), "the namespace is stuck Terminating");

    // The documented way out: remove the finalizer by hand (the SQS queue is then left behind).
    let ns_name = ns.name.clone();
    tokio::task::spawn_blocking(move || {
        kubectl(&[
            "patch",
            "queue",
            "forgotten",
            "-n",
            &ns_name,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ]);
    })
    .await
    .unwrap();
    eventually("the namespace is gone", Duration::from_secs(90), || async {
        matches!(namespaces.get(&ns.name).await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
    })
    .await;
    assert!(queue_exists(&sqs, &sqs_names["forgotten"]).await, "a released finalizer leaves the SQS queue");

    for name in ["kept", "forgotten"] {
        let url = sqs.get_queue_url().queue_name(&sqs_names[name]).send().await.unwrap().queue_url.unwrap();
        sqs.delete_queue().queue_url(url).send().await.unwrap();
    }
}
