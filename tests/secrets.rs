//! Fault suite, secrets: the real binary (`skyport run`, debug logging) takes Queues and Tunnels
//! through their lifecycles with credentials of its own (AWS keys, DigitalOcean and Hetzner
//! tokens, and the tunnel keys and tokens it generates into each Tunnel's Secret). Every log
//! line, Event, object status and `/metrics` scrape it produced is then searched for every one of
//! those values (as written and base64-encoded): none may appear. The count is printed.
//!
//! Run: `eval "$(tests/env.sh up)" && cargo test --test integration secrets:: -- --include-ignored --nocapture`.

use crate::common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue, Tunnel, TunnelPhase};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TIMEOUT: Duration = Duration::from_secs(60);

fn random(prefix: &str, n: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let tail: String = (0..n).map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char).collect();
    format!("{prefix}{tail}")
}

/// `value` base64-encoded, as a Secret's data holds it (k8s-openapi's encoding).
fn base64(value: &str) -> String {
    let json = serde_json::to_value(k8s_openapi::ByteString(value.as_bytes().to_vec())).unwrap();
    json.as_str().unwrap().to_string()
}

/// Every line the process writes, stdout and stderr.
async fn http_get(address: &str, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

/// The private key and token of a Tunnel's Secret, as the operator generated them.
async fn tunnel_credentials(ns: &TestNs, tunnel: &str) -> Vec<String> {
    let secret = eventually("the Tunnel's Secret", TIMEOUT, || async {
        ns.api::<Secret>().get(&format!("{tunnel}-credentials")).await.ok()
    })
    .await;
    let data = secret.data.unwrap_or_default();
    let mut values = Vec::new();
    for (key, value) in data {
        let text = String::from_utf8_lossy(&value.0).into_owned();
        // The public key is public; the client config is made of the values below.
        if key.contains("private") || key.contains("token") {
            values.push(text);
        }
    }
    assert_eq!(values.len(), 2, "a private key and a token in {tunnel}-credentials");
    values
}

async fn active(tunnels: &Api<Tunnel>, name: &str, not_uid: Option<&str>) -> Tunnel {
    eventually(&format!("Tunnel {name} Active"), TIMEOUT, || async {
        let t = tunnels.get(name).await.ok()?;
        (t.metadata.uid.as_deref() != not_uid && t.status.as_ref()?.phase == Some(TunnelPhase::Active)).then_some(t)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn no_credential_appears_in_logs_events_statuses_or_metrics() {
    let ns = TestNs::new("secrets").await;
    let aws_key_id = random("SKYPORTTEST", 9);
    let aws_secret = random("", 40);
    let do_token = random("dop_v1_", 64);
    let hcloud_token = random("", 64);
    let state = std::env::temp_dir().join(format!("skyport-secrets-{}", ns.name));
    let cluster = format!("secrets-{}", ns.name);
    let state_arg = state.to_string_lossy().into_owned();
    let args = ["--namespace", &ns.name, "--log-format", "json", "--listen-address", "127.0.0.1:0"];
    let tunnels = ["--provider", "local", "--cluster-id", &cluster, "--local-state-dir", &state_arg];
    let fast = ["--queue-resync", "2s", "--tunnel-resync", "2s", "--error-backoff-min", "200ms"];
    let more = ["--error-backoff-max", "2s", "--orphan-sweep-interval", "5s"];
    let all: Vec<&str> = args.into_iter().chain(tunnels).chain(fast).chain(more).collect();
    // The most a user would turn on to debug; SKYPORT_SECRETS_RUST_LOG=trace searches everything.
    let rust_log =
        std::env::var("SKYPORT_SECRETS_RUST_LOG").unwrap_or_else(|_| "debug,skyport=trace,providers=trace".into());
    let env = [
        ("RUST_LOG", rust_log.as_str()),
        ("AWS_ACCESS_KEY_ID", &aws_key_id),
        ("AWS_SECRET_ACCESS_KEY", &aws_secret),
        ("DIGITALOCEAN_TOKEN", &do_token),
        ("HCLOUD_TOKEN", &hcloud_token),
    ];
    let logs = common::process::Lines::default();
    let mut child = common::process::spawn_operator(&all, &env, &logs);
    let address = eventually("the operator serves /metrics", TIMEOUT, || async {
        logs.lock().unwrap().iter().find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            v["message"].as_str()?.starts_with("serving /healthz").then(|| v["address"].as_str().unwrap().to_string())
        })
    })
    .await;
    let mut scrapes = Vec::new();

    // Queues: create with a dead-letter queue, tags and a policy, edit, delete.
    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("dlq", json!({}))).await.unwrap();
    let spec = json!({"deadLetter": {"queueRef": {"name": "dlq"}, "maxReceiveCount": 3}, "tags": {"team": "shop"},
                      "policy": {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "sqs:SendMessage", "Resource": "*"}]}});
    queues.create(&PostParams::default(), &queue("orders", spec)).await.unwrap();
    wait_ready(&queues, "orders", ConditionStatus::True, "Available", TIMEOUT).await;
    let edit = json!({"spec": {"visibilityTimeoutSeconds": 90, "tags": {"team": "ops"}}});
    queues.patch("orders", &PatchParams::default(), &Patch::Merge(&edit)).await.unwrap();
    eventually("the edit converged", TIMEOUT, || async {
        let q = queues.get("orders").await.ok()?;
        (q.status?.observed_generation == q.metadata.generation).then_some(())
    })
    .await;
    // A refused one too: errors carry messages from AWS.
    queues
        .create(
            &PostParams::default(),
            &queue("bad-dlq", json!({"fifo": true, "deadLetter": {"queueRef": {"name": "dlq"}, "maxReceiveCount": 3}})),
        )
        .await
        .unwrap();
    wait_ready(&queues, "bad-dlq", ConditionStatus::False, "InvalidDeadLetterQueue", TIMEOUT).await;
    scrapes.push(http_get(&address, "/metrics").await);

    // Tunnels: a LoadBalancer Service, a port change, the Tunnel deleted (a new one with new
    // credentials), the Service deleted.
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "skyport.dev/tunnel", "ports": [{"name": "http", "port": 8080}]},
    }))
    .unwrap();
    // Active needs the Tunnel's client running (as a kubelet would run its Deployment).
    let _kubelet = common::kubelet::AllClients::start(ns.client.clone(), &ns.name);
    services.create(&PostParams::default(), &svc).await.unwrap();
    let first = active(&tunnels, "web-tunnel", None).await;
    let mut credentials = tunnel_credentials(&ns, "web-tunnel").await;
    let ports =
        json!({"spec": {"ports": [{"name": "http", "port": 8080}, {"name": "dns", "port": 5353, "protocol": "UDP"}]}});
    services.patch("web", &PatchParams::default(), &Patch::Merge(&ports)).await.unwrap();
    eventually("the exit server exposes both ports", TIMEOUT, || async {
        (tunnels.get("web-tunnel").await.ok()?.status?.ports.len() == 2).then_some(())
    })
    .await;
    tunnels.delete("web-tunnel", &DeleteParams::default()).await.unwrap();
    active(&tunnels, "web-tunnel", first.metadata.uid.as_deref()).await;
    credentials.extend(tunnel_credentials(&ns, "web-tunnel").await);
    scrapes.push(http_get(&address, "/metrics").await);

    // The statuses and Events as they stand, then everything deleted while the operator runs.
    let mut objects = Vec::new();
    for q in queues.list(&ListParams::default()).await.unwrap() {
        objects.push(serde_json::to_string(&q).unwrap());
    }
    for t in tunnels.list(&ListParams::default()).await.unwrap() {
        objects.push(serde_json::to_string(&t).unwrap());
    }
    for s in services.list(&ListParams::default()).await.unwrap() {
        objects.push(serde_json::to_string(&s).unwrap());
    }
    services.delete("web", &DeleteParams::default()).await.unwrap();
    let _ = queues.delete_collection(&DeleteParams::default(), &ListParams::default()).await;
    eventually("everything deleted", TIMEOUT, || async {
        (queues.list(&ListParams::default()).await.ok()?.items.is_empty()
            && tunnels.list(&ListParams::default()).await.ok()?.items.is_empty())
        .then_some(())
    })
    .await;
    scrapes.push(http_get(&address, "/metrics").await);
    let events: Vec<String> = ns
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
    let _ = child.start_kill();
    let _ = child.wait().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lines = logs.lock().unwrap().clone();

    // The search.
    let mut values = vec![aws_key_id, aws_secret, do_token, hcloud_token];
    values.extend(credentials);
    let needles: Vec<(usize, String)> =
        values.iter().enumerate().flat_map(|(i, v)| [(i, v.clone()), (i, base64(v))]).collect();
    let mut hits = Vec::new();
    for (source, texts) in [("log", &lines), ("event", &events), ("object", &objects), ("metrics", &scrapes)] {
        for text in texts {
            for (i, needle) in &needles {
                if let Some(at) = text.find(needle.as_str()) {
                    let target = serde_json::from_str::<serde_json::Value>(text).ok().map(|v| v["target"].to_string());
                    let context = &text[text.floor_char_boundary(at.saturating_sub(120))..at];
                    hits.push(format!("credential #{i} in a {source} (target {target:?}): ...{context}<credential>"));
                }
            }
        }
    }
    println!(
        "secrets: {} credential values (and their base64) searched in {} log lines, {} Events, {} objects, {} /metrics scrapes: {} hits",
        values.len(),
        lines.len(),
        events.len(),
        objects.len(),
        scrapes.len(),
        hits.len()
    );
    assert!(lines.len() > 50 && events.len() > 5, "too little output to search: the run did not happen");
    assert!(hits.is_empty(), "credentials leaked:\n{}", hits.join("\n"));
    let _ = std::fs::remove_dir_all(&state);
    ns.cleanup().await;
}
