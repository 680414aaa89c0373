//! SIGTERM on the real binary (`skyport run`): it exits at once when a controller's cache never
//! synced (its list refused: here by RBAC, a ServiceAccount without bindings; in the field also a
//! CRD not installed), and still lets a reconcile in flight finish when the caches synced.
//!
//! Every test runs its own process for its own namespace and identity, so nothing here disturbs
//! the other tests on the shared API server.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::process::{Lines, spawn_operator};
use common::*;
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use skyport::crd::{ConditionStatus, Queue};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// Generous: a liveness bound, not a benchmark (the fixed binary exits in milliseconds).
const EXIT: Duration = Duration::from_secs(10);
const TIMEOUT: Duration = Duration::from_secs(30);
/// What the binary logs for a controller it stops without waiting for its reconciles.
const STOPPED_UNSYNCED: &str = "stopped at once: a cache its reconciles wait for never synced";

/// A kubeconfig for the test API server authenticating as the new ServiceAccount `ns/name`, with a
/// bound token from the TokenRequest API. It may do what bindings grant it: without any, every
/// watch gets 403.
async fn kubeconfig_as(admin: &Client, ns: &str, name: &str) -> PathBuf {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    accounts.create(&PostParams::default(), &account).await.expect("create ServiceAccount");
    let token = service_account_token(admin, ns, name).await;
    let admin_config = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    let text = std::fs::read_to_string(&admin_config).expect("read KUBECONFIG");
    let mut config: Value = serde_saphyr::from_str(&text).expect("KUBECONFIG is YAML");
    for user in config["users"].as_array_mut().expect("users") {
        user["user"] = json!({ "token": token });
    }
    let path = std::env::temp_dir().join(format!("skyport-{ns}.kubeconfig"));
    // JSON is YAML: any kubeconfig reader takes it.
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).expect("write kubeconfig");
    path
}

/// Grants the ServiceAccount `name` of the test namespace `rules` there (a Role and its binding).
async fn grant(ns: &TestNs, name: &str, rules: Value) {
    let role: Role = serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules})).unwrap();
    ns.api::<Role>().create(&PostParams::default(), &role).await.expect("create Role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns.name}],
    }))
    .unwrap();
    ns.api::<RoleBinding>().create(&PostParams::default(), &binding).await.expect("create RoleBinding");
}

/// Files and directories a test made outside its namespace, removed however it ends (a
/// kubeconfig holds a token).
struct Scratch(Vec<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path).or_else(|_| std::fs::remove_dir_all(path));
        }
    }
}

/// `skyport run` for `ns` with JSON logs, as the identity of `kubeconfig` (else the environment's).
fn start(ns: &str, extra: &[&str], kubeconfig: Option<&PathBuf>, env: &[(&str, &str)], lines: &Lines) -> Child {
    let mut args = vec!["--namespace", ns, "--listen-address", "127.0.0.1:0", "--log-format", "json"];
    // The restricted identities these tests use cannot read kube-system's UID.
    if !extra.contains(&"--cluster-id") {
        args.extend_from_slice(&["--cluster-id", "shutdown-tests"]);
    }
    args.extend_from_slice(extra);
    let kubeconfig = kubeconfig.map(|p| p.to_string_lossy().into_owned());
    let mut env = env.to_vec();
    if let Some(path) = &kubeconfig {
        env.push(("KUBECONFIG", path));
    }
    spawn_operator(&args, &env, lines)
}

/// `skyport run` with `--provider local` (so the Tunnel and Service controllers run too), as the
/// identity of `kubeconfig`; the returned [`Scratch`] removes the kubeconfig and the hosts' state.
fn start_local(ns: &str, kubeconfig: &Path, env: &[(&str, &str)], lines: &Lines) -> (Child, Scratch) {
    let state = std::env::temp_dir().join(format!("skyport-hosts-{ns}"));
    let (cluster, dir) = (format!("shutdown-{ns}"), state.to_string_lossy().into_owned());
    let args = ["--provider", "local", "--cluster-id", &cluster, "--local-state-dir", &dir];
    let child = start(ns, &args, Some(&kubeconfig.to_path_buf()), env, lines);
    (child, Scratch(vec![kubeconfig.to_path_buf(), state]))
}

fn parsed(lines: &Lines) -> Vec<Value> {
    lines.lock().unwrap().iter().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// Waits for a log line with `message` from `target` (a prefix), returning it.
async fn wait_log(lines: &Lines, target: &str, message: &str) -> Value {
    eventually(&format!("{target}: {message:?} in the log"), TIMEOUT, || async {
        parsed(lines).into_iter().find(|l| {
            l["target"].as_str().is_some_and(|t| t.starts_with(target))
                && l["message"].as_str().is_some_and(|m| m.contains(message))
        })
    })
    .await
}

/// Waits until `controller` reported the list of `resource` refused (403).
async fn wait_forbidden(lines: &Lines, controller: &str, resource: &str) {
    let (target, refused) =
        (format!("skyport::controllers::{controller}"), format!("cannot list resource \"{resource}\""));
    eventually(&format!("{controller}: {resource} refused, in the log"), TIMEOUT, || async {
        parsed(lines)
            .iter()
            .any(|l| {
                // The controller's own modules (the AwsAccount reconciler beside the Queue one) count.
                l["target"].as_str().is_some_and(|t| t.starts_with(target.as_str()))
                    && l["error"].as_str().is_some_and(|e| e.contains(&refused))
            })
            .then_some(())
    })
    .await;
}

async fn sigterm(child: &Child) {
    let pid = child.id().expect("running").to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().await.expect("kill");
    assert!(status.success());
}

/// The exit status, if the process exits within `bound`; otherwise fails with its last lines.
async fn exit_within(child: &mut Child, bound: Duration, lines: &Lines) -> ExitStatus {
    match tokio::time::timeout(bound, child.wait()).await {
        Ok(status) => status.expect("wait"),
        Err(_) => {
            let lines = lines.lock().unwrap();
            let tail = lines[lines.len().saturating_sub(5)..].join("\n");
            panic!("still running {bound:?} after SIGTERM; last lines:\n{tail}");
        }
    }
}

/// SIGTERM, then the process must exit 0 within [`EXIT`], having stopped exactly `controllers`
/// without waiting for their reconciles.
async fn stops_at_once(child: &mut Child, lines: &Lines, controllers: &[&str]) {
    sigterm(child).await;
    let status = exit_within(child, EXIT, lines).await;
    assert!(status.success(), "{status}");
    assert_eq!(stopped_unsynced(lines), set(controllers));
}

/// The controllers the binary stopped without waiting for their reconciles.
fn stopped_unsynced(lines: &Lines) -> BTreeSet<String> {
    parsed(lines)
        .iter()
        .filter(|l| l["message"] == STOPPED_UNSYNCED)
        .filter_map(|l| l["controller"].as_str().map(str::to_string))
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn sigterm_exits_at_once_when_the_queue_cache_never_synced() {
    let ns = TestNs::new("shutdown").await;
    let kubeconfig = kubeconfig_as(&ns.client, &ns.name, "nobody").await;
    let _scratch = Scratch(vec![kubeconfig.clone()]);
    let lines = Lines::default();
    let mut child = start(&ns.name, &[], Some(&kubeconfig), &[("RUST_LOG", "info")], &lines);
    wait_forbidden(&lines, "queue", "queues").await;

    stops_at_once(&mut child, &lines, &["queue"]).await;
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn sigterm_exits_at_once_when_no_controller_cache_synced() {
    let ns = TestNs::new("shutdown").await;
    let kubeconfig = kubeconfig_as(&ns.client, &ns.name, "nobody").await;
    let lines = Lines::default();
    let (mut child, _scratch) = start_local(&ns.name, &kubeconfig, &[("RUST_LOG", "info")], &lines);
    for (controller, resource) in [("queue", "queues"), ("tunnel", "tunnels"), ("service", "services")] {
        wait_forbidden(&lines, controller, resource).await;
    }

    stops_at_once(&mut child, &lines, &["queue", "service", "tunnel"]).await;
    ns.cleanup().await;
}

/// Services synced, Tunnels refused: the Service reconcile in flight, parked waiting for the
/// Tunnel cache, is dropped too (not let go on with an empty Tunnel cache).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn sigterm_exits_at_once_when_service_reconciles_wait_for_a_tunnel_cache_never_synced() {
    let ns = TestNs::new("shutdown").await;
    let kubeconfig = kubeconfig_as(&ns.client, &ns.name, "services-only").await;
    grant(
        &ns,
        "services-only",
        json!([{"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch"]}]),
    )
    .await;
    let service: Service =
        serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}})).unwrap();
    ns.api::<Service>().create(&PostParams::default(), &service).await.expect("create Service");

    let lines = Lines::default();
    // kube-runtime says (at debug) when a controller's cache is ready: here only the Service one.
    let env = [("RUST_LOG", "info,kube_runtime::controller=debug,skyport::controllers::caches=debug")];
    let (mut child, _scratch) = start_local(&ns.name, &kubeconfig, &env, &lines);
    wait_log(&lines, "kube_runtime::controller", "store is ready, starting runner").await;
    wait_forbidden(&lines, "tunnel", "tunnels").await;
    // Parked, not merely about to start: a Service controller with nothing in flight would end
    // with the shutdown, and which of the two it reports first is a coin toss.
    eventually("a reconcile parked on the Tunnel cache, in the log", TIMEOUT, || async {
        parsed(&lines).into_iter().find(|l| l["target"] == "skyport::controllers::caches" && l["cache"] == "Tunnel")
    })
    .await;

    stops_at_once(&mut child, &lines, &["queue", "service", "tunnel"]).await;
    ns.cleanup().await;
}

/// Queues synced, ConfigMaps refused: a Queue's reconcile, past its SQS work, parks waiting for the
/// ConfigMap cache it publishes through, and is dropped at SIGTERM instead of waited on forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn sigterm_exits_at_once_when_queue_reconciles_wait_for_a_configmap_cache_never_synced() {
    let ns = TestNs::new("shutdown").await;
    let kubeconfig = kubeconfig_as(&ns.client, &ns.name, "no-configmaps").await;
    grant(&ns, "no-configmaps", json!([
            {"apiGroups": ["skyport.dev"], "resources": ["queues", "awsaccounts"], "verbs": ["get", "list", "watch", "patch", "update"]},
            {"apiGroups": ["skyport.dev"], "resources": ["queues/status"], "verbs": ["get", "patch", "update"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        ])).await;
    let _scratch = Scratch(vec![kubeconfig.clone()]);
    let lines = Lines::default();
    let mut child = start(&ns.name, &[], Some(&kubeconfig), &[("RUST_LOG", "info")], &lines);
    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("parked", json!({}))).await.unwrap();
    wait_forbidden(&lines, "queue::configmaps", "configmaps").await;
    // The queue is made in SQS, then the reconcile parks before the ConfigMap and Ready.
    let url = eventually("the SQS queue", TIMEOUT, || async {
        sqs().await.get_queue_url().queue_name(format!("{}_parked", ns.name)).send().await.ok()?.queue_url
    })
    .await;

    stops_at_once(&mut child, &lines, &["queue"]).await;

    // No operator left to run the finalizer: delete the queue and release the Queue by hand.
    sqs().await.delete_queue().queue_url(url).send().await.expect("DeleteQueue");
    let release = json!({"metadata": {"finalizers": null}});
    queues.patch("parked", &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    ns.cleanup().await;
}

/// Queues and ConfigMaps synced, AwsAccounts refused: the reconcile of a Queue with an accountRef
/// parks waiting for the AwsAccount cache, before any SQS call, and is dropped at SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn sigterm_exits_at_once_when_queue_reconciles_wait_for_an_account_cache_never_synced() {
    let ns = TestNs::new("shutdown").await;
    let kubeconfig = kubeconfig_as(&ns.client, &ns.name, "no-accounts").await;
    grant(&ns, "no-accounts", json!([
            {"apiGroups": ["skyport.dev"], "resources": ["queues"], "verbs": ["get", "list", "watch", "patch", "update"]},
            {"apiGroups": ["skyport.dev"], "resources": ["queues/status"], "verbs": ["get", "patch", "update"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "patch"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        ])).await;
    let _scratch = Scratch(vec![kubeconfig.clone()]);
    let lines = Lines::default();
    let mut child = start(&ns.name, &[], Some(&kubeconfig), &[("RUST_LOG", "info")], &lines);
    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("parked", json!({"accountRef": {"name": "team"}}))).await.unwrap();
    wait_forbidden(&lines, "queue", "awsaccounts").await;
    // The finalizer is the reconcile's first write; then it parks on the AwsAccount cache.
    eventually("the finalizer", TIMEOUT, || async {
        queues.get("parked").await.ok().filter(|q| !q.metadata.finalizers.clone().unwrap_or_default().is_empty())
    })
    .await;

    stops_at_once(&mut child, &lines, &["queue"]).await;

    let release = json!({"metadata": {"finalizers": null}});
    queues.patch("parked", &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    ns.cleanup().await;
}

/// A TCP forwarder that holds every new connection until opened: an SQS call made while it is
/// closed stays in flight.
struct Gate {
    url: String,
    open: watch::Sender<bool>,
    held: Arc<AtomicUsize>,
}

impl Gate {
    async fn closed(upstream: String) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind gate");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (open, _) = watch::channel(false);
        let held = Arc::new(AtomicUsize::new(0));
        let (opened, counter) = (open.subscribe(), held.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let (mut opened, counter, upstream) = (opened.clone(), counter.clone(), upstream.clone());
                tokio::spawn(async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let _ = opened.wait_for(|open| *open).await;
                    counter.fetch_sub(1, Ordering::SeqCst);
                    if let Ok(mut outbound) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Gate { url, open, held }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn sigterm_lets_a_reconcile_in_flight_finish_when_the_caches_synced() {
    let ns = TestNs::new("shutdown").await;
    let localstack = std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL");
    let gate = Gate::closed(localstack.trim_start_matches("http://").trim_end_matches('/').to_string()).await;
    let lines = Lines::default();
    let env = [("RUST_LOG", "info"), ("AWS_ENDPOINT_URL", gate.url.as_str())];
    let mut child = start(&ns.name, &[], None, &env, &lines);
    wait_log(&lines, "skyport", "caches synced; ready").await;

    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("inflight", json!({}))).await.unwrap();
    eventually("an SQS call held at the gate", TIMEOUT, || async {
        (gate.held.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    sigterm(&child).await;
    wait_log(&lines, "skyport", "shutdown requested").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(child.try_wait().unwrap().is_none(), "exited with a reconcile in flight");
    gate.open.send_replace(true);
    let status = exit_within(&mut child, TIMEOUT, &lines).await;
    assert!(status.success(), "{status}");
    assert!(stopped_unsynced(&lines).is_empty(), "{:?}", stopped_unsynced(&lines));
    // The reconcile in flight at SIGTERM went on to the end: the queue exists and status says so.
    let q = queues.get("inflight").await.unwrap();
    assert_eq!(ready(&q), Some((ConditionStatus::True, "Available".to_string())), "{:#?}", q.status);

    // No operator left to run the finalizer: delete the queue and release the Queue by hand.
    let url = q.status.and_then(|s| s.queue_url).expect("status.queueUrl");
    sqs().await.delete_queue().queue_url(url).send().await.expect("DeleteQueue");
    let release = json!({"metadata": {"finalizers": null}});
    queues.patch("inflight", &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    ns.cleanup().await;
}
