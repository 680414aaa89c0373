//! Fault suite, bad input: a table of bad manifests and edits, applied with `kubectl apply` to the
//! real API server while the Queue, Tunnel and Service controllers run in-process. Each one is
//! refused at admission with a message that says what to do, or (what only the controllers can
//! judge) reaches Ready=False with a reason and exactly one Warning Event; a few valid inputs at
//! the edges are served. No panic, no hot loop, and a good Queue and a good Tunnel are served
//! throughout. The figures are printed (`-- --nocapture` shows them).
//!
//! Run: `eval "$(tests/env.sh up)" && cargo test --test bad_input -- --include-ignored --nocapture`.

mod common;
#[path = "common/tunnels.rs"]
mod tunnels;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use skyport::crd::{ConditionStatus, Queue, Tunnel};

const TIMEOUT: Duration = Duration::from_secs(60);

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Counts every panic in this process (controller tasks included), then reports it as usual.
fn count_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        previous(info)
    }));
}

#[derive(Clone, Debug)]
enum Expect {
    /// `kubectl apply` fails and its message contains every one of these.
    Refused(&'static [&'static str]),
    /// Accepted, then Ready=False with this reason and exactly one Warning Event for it.
    Reported(&'static str),
    /// A valid input at an edge: Ready (a Queue) or Active (a Tunnel).
    Served,
}
use Expect::*;

struct Case {
    what: &'static str,
    /// Applied first, must be accepted (an edit's original object, a Tunnel's Service).
    before: Vec<Value>,
    /// The bad manifest or edit; for `Reported` and `Served` its kind and name are watched.
    apply: Value,
    expect: Expect,
}

fn case(what: &'static str, apply: Value, expect: Expect) -> Case {
    Case { what, before: vec![], apply, expect }
}

fn edit(what: &'static str, before: Value, apply: Value, expect: Expect) -> Case {
    Case { what, before: vec![before], apply, expect }
}

fn q(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "Queue", "metadata": {"name": name}, "spec": spec})
}

fn t(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel", "metadata": {"name": name}, "spec": spec})
}

fn svc(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec})
}

fn lb(name: &str, ports: Value) -> Value {
    svc(name, json!({"type": "LoadBalancer", "loadBalancerClass": "skyport.dev/tunnel", "ports": ports}))
}

/// `kubectl apply -f -` in `ns`: what a user types. Err carries kubectl's message.
fn kubectl_apply(ns: &str, object: &Value) -> Result<(), String> {
    let mut child = Command::new("kubectl")
        .args(["apply", "-n", ns, "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl (is the test environment's PATH set?)");
    child.stdin.take().expect("stdin").write_all(object.to_string().as_bytes()).expect("write stdin");
    let out = child.wait_with_output().expect("wait for kubectl");
    if out.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&out.stderr).trim().to_string()) }
}

async fn apply(ns: &str, object: &Value) -> Result<(), String> {
    let (ns, object) = (ns.to_string(), object.clone());
    tokio::task::spawn_blocking(move || kubectl_apply(&ns, &object)).await.expect("kubectl task")
}

fn long(n: usize) -> String {
    "a".repeat(n)
}

fn many_tags(n: usize) -> Value {
    Value::Object((0..n).map(|i| (format!("k{i}"), json!("v"))).collect())
}

fn arns(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("arn:aws:sqs:us-east-1:000000000000:src-{i}")).collect()
}

/// A valid access policy of about `bytes` bytes (one statement per queue ARN).
fn policy(bytes: usize) -> Value {
    let statement = |i: usize| {
        json!({"Sid": format!("s{i}"), "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::000000000000:root"},
               "Action": "sqs:SendMessage", "Resource": format!("arn:aws:sqs:us-east-1:000000000000:q{i}")})
    };
    let per = statement(0).to_string().len() + 1;
    json!({"Version": "2012-10-17", "Statement": (0..bytes / per + 1).map(statement).collect::<Vec<_>>()})
}

fn table(sqs_taken: &str) -> Vec<Case> {
    let fifo = |name: &str, spec: Value| {
        let mut s = json!({"fifo": true});
        s.as_object_mut().unwrap().extend(spec.as_object().unwrap().clone());
        q(name, s)
    };
    vec![
        // Queue: every schema bound.
        case(
            "visibilityTimeoutSeconds above 43200",
            q("b1", json!({"visibilityTimeoutSeconds": 43201})),
            Refused(&["less than or equal to 43200"]),
        ),
        case(
            "visibilityTimeoutSeconds negative",
            q("b2", json!({"visibilityTimeoutSeconds": -1})),
            Refused(&["greater than or equal to 0"]),
        ),
        case(
            "messageRetentionSeconds below 60",
            q("b3", json!({"messageRetentionSeconds": 59})),
            Refused(&["greater than or equal to 60"]),
        ),
        case(
            "messageRetentionSeconds above 14 days",
            q("b4", json!({"messageRetentionSeconds": 1209601})),
            Refused(&["less than or equal to 1209600"]),
        ),
        case("delaySeconds above 900", q("b5", json!({"delaySeconds": 901})), Refused(&["less than or equal to 900"])),
        case(
            "maximumMessageSizeBytes below 1024",
            q("b6", json!({"maximumMessageSizeBytes": 1023})),
            Refused(&["greater than or equal to 1024"]),
        ),
        case(
            "maximumMessageSizeBytes above 1 MiB",
            q("b7", json!({"maximumMessageSizeBytes": 1048577})),
            Refused(&["less than or equal to 1048576"]),
        ),
        case(
            "receiveWaitTimeSeconds above 20",
            q("b8", json!({"receiveWaitTimeSeconds": 21})),
            Refused(&["less than or equal to 20"]),
        ),
        case(
            "kmsDataKeyReusePeriodSeconds below 60",
            q("b9", json!({"kmsKeyId": "alias/aws/sqs", "kmsDataKeyReusePeriodSeconds": 59})),
            Refused(&["greater than or equal to 60"]),
        ),
        case(
            "kmsDataKeyReusePeriodSeconds above a day",
            q("b10", json!({"kmsKeyId": "alias/aws/sqs", "kmsDataKeyReusePeriodSeconds": 86401})),
            Refused(&["less than or equal to 86400"]),
        ),
        case("kmsKeyId empty", q("b11", json!({"kmsKeyId": ""})), Refused(&["spec.kmsKeyId", "at least 1"])),
        case("queueName empty", q("b12", json!({"queueName": ""})), Refused(&["spec.queueName", "at least 1"])),
        case(
            "queueName of 81 characters",
            q("b13", json!({"queueName": long(81)})),
            Refused(&["spec.queueName", "80"]),
        ),
        case(
            "queueName with unicode",
            q("b14", json!({"queueName": "bestellungen-größe"})),
            Refused(&["spec.queueName", "should match"]),
        ),
        case(
            "deadLetter maxReceiveCount 0",
            q("b15", json!({"deadLetter": {"queueRef": {"name": "x"}, "maxReceiveCount": 0}})),
            Refused(&["greater than or equal to 1"]),
        ),
        case(
            "deadLetter maxReceiveCount 1001",
            q("b16", json!({"deadLetter": {"queueRef": {"name": "x"}, "maxReceiveCount": 1001}})),
            Refused(&["less than or equal to 1000"]),
        ),
        case(
            "deadLetter without maxReceiveCount",
            q("b17", json!({"deadLetter": {"queueRef": {"name": "x"}}})),
            Refused(&["maxReceiveCount", "Required value"]),
        ),
        case(
            "deadLetter targetArn not an SQS ARN",
            q("b18", json!({"deadLetter": {"targetArn": "orders-dlq", "maxReceiveCount": 3}})),
            Refused(&["targetArn", "should match"]),
        ),
        case(
            "deadLetter queueRef name empty",
            q("b19", json!({"deadLetter": {"queueRef": {"name": ""}, "maxReceiveCount": 3}})),
            Refused(&["queueRef.name", "at least 1"]),
        ),
        case(
            "redriveAllowPolicy with 11 source ARNs",
            q("b20", json!({"redriveAllowPolicy": {"redrivePermission": "byQueue", "sourceQueueArns": arns(11)}})),
            Refused(&["sourceQueueArns", "at most 10"]),
        ),
        case("46 tags", q("b21", json!({"tags": many_tags(46)})), Refused(&["spec.tags", "at most 45"])),
        // Queue: every enum.
        case(
            "deduplicationScope not an SQS value",
            fifo("b22", json!({"deduplicationScope": "global"})),
            Refused(&["Unsupported value", "\"messageGroup\""]),
        ),
        case(
            "fifoThroughputLimit not an SQS value",
            fifo("b23", json!({"fifoThroughputLimit": "unlimited"})),
            Refused(&["Unsupported value", "\"perQueue\""]),
        ),
        case(
            "redrivePermission not an SQS value",
            q("b24", json!({"redriveAllowPolicy": {"redrivePermission": "everyone"}})),
            Refused(&["Unsupported value", "\"allowAll\""]),
        ),
        case(
            "deletionPolicy misspelt",
            q("b25", json!({"deletionPolicy": "Destroy"})),
            Refused(&["Unsupported value", "\"Retain\""]),
        ),
        // Queue: every CEL rule.
        case(
            "FIFO queue named without .fifo",
            fifo("b26", json!({"queueName": "jobs"})),
            Refused(&["must end in '.fifo' exactly when fifo is true"]),
        ),
        case(
            "standard queue named .fifo",
            q("b27", json!({"queueName": "jobs.fifo"})),
            Refused(&["must end in '.fifo' exactly when fifo is true"]),
        ),
        case(
            "FIFO settings on a standard queue",
            q("b28", json!({"contentBasedDeduplication": true})),
            Refused(&["apply only to FIFO queues (set fifo: true)"]),
        ),
        case(
            "perMessageGroupId without messageGroup scope",
            fifo("b29", json!({"fifoThroughputLimit": "perMessageGroupId", "deduplicationScope": "queue"})),
            Refused(&["requires deduplicationScope messageGroup"]),
        ),
        case(
            "SSE-SQS and SSE-KMS together",
            q("b30", json!({"sqsManagedEncryption": true, "kmsKeyId": "alias/aws/sqs"})),
            Refused(&["choose one kind of encryption"]),
        ),
        case(
            "kmsDataKeyReusePeriodSeconds without kmsKeyId",
            q("b31", json!({"kmsDataKeyReusePeriodSeconds": 300})),
            Refused(&["only applies with kmsKeyId"]),
        ),
        case(
            "deadLetter with queueRef and targetArn",
            q(
                "b32",
                json!({"deadLetter": {"queueRef": {"name": "x"}, "targetArn": "arn:aws:sqs:us-east-1:000000000000:x", "maxReceiveCount": 3}}),
            ),
            Refused(&["exactly one of queueRef and targetArn"]),
        ),
        case(
            "deadLetter with neither queueRef nor targetArn",
            q("b33", json!({"deadLetter": {"maxReceiveCount": 3}})),
            Refused(&["exactly one of queueRef and targetArn"]),
        ),
        case(
            "byQueue without sourceQueueArns",
            q("b34", json!({"redriveAllowPolicy": {"redrivePermission": "byQueue"}})),
            Refused(&["sourceQueueArns is required with redrivePermission byQueue"]),
        ),
        case(
            "allowAll with sourceQueueArns",
            q("b35", json!({"redriveAllowPolicy": {"redrivePermission": "allowAll", "sourceQueueArns": arns(1)}})),
            Refused(&["not allowed otherwise"]),
        ),
        case(
            "tag key reserved for skyport",
            q("b36", json!({"tags": {"skyport.dev/owner-uid": "x"}})),
            Refused(&["reserved for skyport"]),
        ),
        case(
            "tag key reserved for AWS",
            q("b37", json!({"tags": {"aws:createdBy": "x"}})),
            Refused(&["'aws:' for AWS"]),
        ),
        case(
            "tag key of 129 characters",
            q("b38", json!({"tags": {long(129): "x"}})),
            Refused(&["tag keys are at most 128 characters"]),
        ),
        case(
            "tag value of 257 characters",
            q("b39", json!({"tags": {"team": long(257)}})),
            Refused(&["values at most 256"]),
        ),
        case(
            "dead-letter queue is the Queue itself",
            q("b40", json!({"deadLetter": {"queueRef": {"name": "b40"}, "maxReceiveCount": 3}})),
            Refused(&["names this Queue itself"]),
        ),
        case(
            "Queue name of 250 characters (its ConfigMap would exceed 253)",
            q(&long(250), json!({})),
            Refused(&["at most 249 characters"]),
        ),
        // Queue: types, unknown fields, names.
        case(
            "unknown field (typo)",
            q("b42", json!({"visibilityTimeout": 30})),
            Refused(&["unknown field \"spec.visibilityTimeout\""]),
        ),
        case(
            "unknown top-level field",
            json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "Queue", "metadata": {"name": "b43"}, "specs": {}}),
            Refused(&["unknown field \"specs\""]),
        ),
        case(
            "number given as a string",
            q("b44", json!({"visibilityTimeoutSeconds": "30"})),
            Refused(&["must be of type integer"]),
        ),
        case(
            "policy as a JSON string, not an object",
            q("b45", json!({"policy": "{\"Version\":\"2012-10-17\"}"})),
            Refused(&["spec.policy", "must be of type object"]),
        ),
        case(
            "tags as a list",
            q("b46", json!({"tags": ["team=shop"]})),
            Refused(&["spec.tags", "must be of type object"]),
        ),
        case("Queue name with unicode", q("bestellung-ü", json!({})), Refused(&["RFC 1123"])),
        case(
            "Queue name of 254 characters",
            q(&long(254), json!({})),
            Refused(&["must be no more than 253 characters"]),
        ),
        // Queue: edits.
        edit(
            "queueName changed",
            q("e1", json!({"queueName": "e1-first"})),
            q("e1", json!({"queueName": "e1-second"})),
            Refused(&["queueName is immutable"]),
        ),
        edit(
            "queueName removed",
            q("e2", json!({"queueName": "e2-first"})),
            q("e2", json!({})),
            Refused(&["queueName is immutable"]),
        ),
        edit("fifo flipped", q("e3", json!({})), q("e3", json!({"fifo": true})), Refused(&["fifo is immutable"])),
        edit(
            "edit to a reserved tag",
            q("e4", json!({"tags": {"team": "a"}})),
            q("e4", json!({"tags": {"skyport.dev/owner-name": "b"}})),
            Refused(&["reserved for skyport"]),
        ),
        edit(
            "edit out of bounds",
            q("e5", json!({"delaySeconds": 1})),
            q("e5", json!({"delaySeconds": 9000})),
            Refused(&["less than or equal to 900"]),
        ),
        // Tunnel: schema, CEL, edits.
        case("Tunnel without serviceRef", t("bt1", json!({})), Refused(&["serviceRef", "Required value"])),
        case(
            "serviceRef not a Service name",
            t("bt2", json!({"serviceRef": {"name": "Web_1"}})),
            Refused(&["serviceRef.name", "should match"]),
        ),
        case(
            "unknown provider",
            t("bt3", json!({"serviceRef": {"name": "web"}, "provider": "aws"})),
            Refused(&["spec.provider", "local|ec2|digitalocean|hetzner"]),
        ),
        case(
            "region with capitals",
            t("bt4", json!({"serviceRef": {"name": "web"}, "region": "EU_WEST"})),
            Refused(&["spec.region", "should match"]),
        ),
        case(
            "size of 64 characters",
            t("bt5", json!({"serviceRef": {"name": "web"}, "size": long(64)})),
            Refused(&["spec.size", "63"]),
        ),
        case(
            "unknown Tunnel field",
            t("bt6", json!({"serviceRef": {"name": "web"}, "ports": [80]})),
            Refused(&["unknown field \"spec.ports\""]),
        ),
        case(
            "Tunnel name of 236 characters",
            t(&long(236), json!({"serviceRef": {"name": "web"}})),
            Refused(&["at most 235 characters"]),
        ),
        edit(
            "serviceRef changed",
            t("et1", json!({"serviceRef": {"name": "gone"}})),
            t("et1", json!({"serviceRef": {"name": "other"}})),
            Refused(&["serviceRef is immutable"]),
        ),
        edit(
            "provider set later",
            t("et2", json!({"serviceRef": {"name": "gone"}})),
            t("et2", json!({"serviceRef": {"name": "gone"}, "provider": "local"})),
            Refused(&["provider is immutable"]),
        ),
        edit(
            "region changed",
            t("et3", json!({"serviceRef": {"name": "gone"}, "region": "a"})),
            t("et3", json!({"serviceRef": {"name": "gone"}, "region": "b"})),
            Refused(&["region is immutable"]),
        ),
        edit(
            "size changed",
            t("et4", json!({"serviceRef": {"name": "gone"}, "size": "a"})),
            t("et4", json!({"serviceRef": {"name": "gone"}, "size": "b"})),
            Refused(&["size is immutable"]),
        ),
        edit(
            "address mode changed",
            t("et5", json!({"serviceRef": {"name": "gone"}, "address": {"mode": "Reserved"}})),
            t("et5", json!({"serviceRef": {"name": "gone"}, "address": {"mode": "Ephemeral"}})),
            Refused(&["address is immutable"]),
        ),
        edit(
            "address deletion policy changed",
            t("et6", json!({"serviceRef": {"name": "gone"}, "address": {"mode": "Reserved"}})),
            t(
                "et6",
                json!({"serviceRef": {"name": "gone"}, "address": {"mode": "Reserved", "deletionPolicy": "Retain"}}),
            ),
            Refused(&["address is immutable"]),
        ),
        edit(
            "address set later",
            t("et7", json!({"serviceRef": {"name": "gone"}})),
            t("et7", json!({"serviceRef": {"name": "gone"}, "address": {"mode": "Reserved"}})),
            Refused(&["address is immutable"]),
        ),
        case(
            "unknown address mode",
            t("bt7", json!({"serviceRef": {"name": "web"}, "address": {"mode": "Static"}})),
            Refused(&["spec.address.mode", "Unsupported value"]),
        ),
        // Services the API server itself refuses.
        case("LoadBalancer Service with 0 ports", lb("s0", json!([])), Refused(&["spec.ports", "Required value"])),
        // What only the controllers can judge: Ready=False, a reason, one Warning Event.
        Case {
            what: "dead-letter cycle A -> B -> A",
            before: vec![q("cyc-b", json!({"deadLetter": {"queueRef": {"name": "cyc-a"}, "maxReceiveCount": 3}}))],
            apply: q("cyc-a", json!({"deadLetter": {"queueRef": {"name": "cyc-b"}, "maxReceiveCount": 3}})),
            expect: Reported("DeadLetterCycle"),
        },
        Case {
            what: "FIFO queue with a standard dead-letter queue",
            before: vec![q("std-dlq", json!({}))],
            apply: fifo("fifo-src", json!({"deadLetter": {"queueRef": {"name": "std-dlq"}, "maxReceiveCount": 3}})),
            expect: Reported("InvalidDeadLetterQueue"),
        },
        case(
            "dead-letter Queue that does not exist",
            q("dl-missing", json!({"deadLetter": {"queueRef": {"name": "nobody"}, "maxReceiveCount": 3}})),
            Reported("DeadLetterQueueNotReady"),
        ),
        case(
            "an existing SQS queue skyport did not create",
            q("taken", json!({"queueName": sqs_taken})),
            Reported("AlreadyExists"),
        ),
        case(
            "policy above SQS's 8192 bytes",
            q("huge-policy", json!({"policy": policy(9000)})),
            Reported("InvalidSpec"),
        ),
        case(
            "Tunnel for a missing Service",
            t("tun-missing", json!({"serviceRef": {"name": "nowhere"}})),
            Reported("ServiceNotFound"),
        ),
        Case {
            // A hand-written Tunnel obeys the rules Services do: a headless ClusterIP Service is
            // not one skyport serves.
            what: "Tunnel for a headless Service with 0 ports",
            before: vec![svc("headless0", json!({"clusterIP": "None"}))],
            apply: t("tun-headless0", json!({"serviceRef": {"name": "headless0"}})),
            expect: Reported("ServiceNotServed"),
        },
        case(
            "Service with an SCTP port",
            lb("sctp", json!([{"port": 9000, "protocol": "SCTP"}])),
            Reported("InvalidService"),
        ),
        case("Service on the tunnel's control port", lb("ctl", json!([{"port": 2333}])), Reported("InvalidService")),
        case("Service on the tunnel's health port", lb("hlth", json!([{"port": 2334}])), Reported("InvalidService")),
        Case {
            what: "Tunnel naming a provider skyport is not configured for",
            before: vec![lb("far", json!([{"port": 80}]))],
            apply: t("tun-far", json!({"serviceRef": {"name": "far"}, "provider": "hetzner"})),
            expect: Reported("ProviderNotConfigured"),
        },
        // Valid input at the edges.
        case("Queue name of 249 characters", q(&long(249), json!({})), Served),
        case(
            "45 tags of the longest keys and values, unicode",
            q(
                "tags-max",
                json!({"tags": (0..45).map(|i| (format!("{i:02}-{}", "é".repeat(125)), json!("données".repeat(36)))).collect::<serde_json::Map<_, _>>()}),
            ),
            Served,
        ),
        case(
            "Service with 100 ports",
            lb("wide", Value::Array((0..100).map(|i| json!({"name": format!("p{i}"), "port": 20000 + i})).collect())),
            Served,
        ),
        case(
            "UDP and TCP on one port",
            lb(
                "dual",
                json!([{"name": "dns-tcp", "port": 8053, "protocol": "TCP"}, {"name": "dns-udp", "port": 8053, "protocol": "UDP"}]),
            ),
            Served,
        ),
        Case {
            what: "Tunnel name of 235 characters",
            before: vec![lb("plain", json!([{"port": 80}]))],
            apply: t(&long(235), json!({"serviceRef": {"name": "plain"}})),
            expect: Served,
        },
    ]
}

/// The object a case's outcome shows on: a Service's is its Tunnel.
fn target(object: &Value) -> (&'static str, String) {
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
    match object["kind"].as_str() {
        Some("Queue") => ("Queue", name),
        Some("Service") => ("Tunnel", format!("{name}-tunnel")),
        _ => ("Tunnel", name),
    }
}

fn resource(kind: &str) -> ApiResource {
    let plural = if kind == "Queue" { "queues" } else { "tunnels" };
    ApiResource {
        group: "skyport.dev".into(),
        version: "v1alpha1".into(),
        api_version: "skyport.dev/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The Ready condition's (status, reason, message).
async fn ready_of(ns: &TestNs, kind: &str, name: &str) -> Option<(String, String, String)> {
    let api: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), &ns.name, &resource(kind));
    let obj = api.get(name).await.ok()?;
    let conditions = obj.data["status"]["conditions"].as_array()?.clone();
    let c = conditions.into_iter().find(|c| c["type"] == "Ready")?;
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((s("status"), s("reason"), s("message")))
}

/// Warning Events about `kind/name`: (reason, times emitted).
async fn warnings(ns: &TestNs, kind: &str, name: &str) -> Vec<(String, i32)> {
    let events: Api<Event> = ns.api();
    let list = events.list(&Default::default()).await.expect("list Events");
    list.items
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name))
        })
        .map(|e| (e.reason.unwrap_or_default(), e.series.map_or(1, |s| s.count)))
        .collect()
}

/// The good objects are still served: the Queue Ready, the Tunnel Active.
async fn good_still_served(ns: &TestNs, when: &str) {
    eventually(&format!("good Queue Ready {when}"), TIMEOUT, || async {
        (ready_of(ns, "Queue", "good").await?.0 == "True").then_some(())
    })
    .await;
    eventually(&format!("good Tunnel Active {when}"), TIMEOUT, || async {
        (ready_of(ns, "Tunnel", "good-web-tunnel").await?.1 == "Active").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn bad_input_is_refused_or_reported_and_good_objects_keep_being_served() {
    count_panics();
    let ns = TestNs::new("bad-input").await;
    let op = Operator::start(&ns, fast_settings()).await;
    let tun = tunnels::TunnelOperator::start(&ns, tunnels::fast_tunnel_settings()).await;
    // Active needs each Tunnel's client running (as a kubelet would run its Deployment).
    let _kubelet = common::kubelet::AllClients::start(ns.client.clone(), &ns.name);

    // An SQS queue someone else made, which a Queue must not take over.
    let taken = format!("{}-not-ours", ns.name);
    sqs().await.create_queue().queue_name(&taken).send().await.expect("create an unrelated SQS queue");

    apply(&ns.name, &q("good", json!({"visibilityTimeoutSeconds": 30}))).await.unwrap();
    apply(&ns.name, &lb("good-web", json!([{"port": 8080}]))).await.unwrap();
    good_still_served(&ns, "before the bad input").await;

    let cases = table(&taken);
    let tried = cases.len();
    let mut failures = Vec::new();
    let mut watched = Vec::new();
    let (mut refused, mut reported, mut served) = (0, 0, 0);
    let outcomes: Vec<_> = futures::stream::iter(cases)
        .map(|c| {
            let ns_ref = &ns;
            let ns = ns.name.clone();
            async move {
                for b in &c.before {
                    if let Err(e) = apply(&ns, b).await {
                        return (c, Err(format!("setup object refused: {e}")));
                    }
                    // The case's object must find this one in the controller's cache.
                    if b["kind"] == "Queue" {
                        let name = b["metadata"]["name"].as_str().unwrap_or_default();
                        eventually("setup Queue reconciled", TIMEOUT, || ready_of(ns_ref, "Queue", name)).await;
                    }
                }
                let result = apply(&ns, &c.apply).await;
                (c, result)
            }
        })
        .buffer_unordered(6)
        .collect()
        .await;
    for (c, result) in outcomes {
        match (&c.expect, result) {
            (Refused(needles), Err(message)) => {
                refused += 1;
                if let Some(n) = needles.iter().find(|n| !message.contains(**n)) {
                    failures.push(format!("{}: refused, but the message lacks {n:?}: {message}", c.what));
                }
            }
            (Refused(_), Ok(())) => failures.push(format!("{}: accepted, expected a refusal at admission", c.what)),
            (_, Err(message)) => failures.push(format!("{}: refused at admission: {message}", c.what)),
            (expect, Ok(())) => watched.push((c.what, target(&c.apply), expect.clone())),
        }
    }
    good_still_served(&ns, "after the refusals").await;

    // Outcomes in status: all cases together, each within TIMEOUT.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    for (what, (kind, name), expect) in &watched {
        let (ok, last) = loop {
            let last = ready_of(&ns, kind, name).await;
            let done = match (expect, &last) {
                (Reported(reason), Some((s, r, m))) => s == "False" && r == reason && !m.is_empty(),
                (Served, Some((s, _, _))) => s == "True",
                _ => false,
            };
            if done || tokio::time::Instant::now() > deadline {
                break (done, last);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        if !ok {
            failures.push(format!(
                "{what}: {kind} {}: expected {expect:?}, last Ready condition {last:?}",
                &name[..name.len().min(40)]
            ));
        }
    }
    // Give repeated reports time to show, then: exactly one Warning Event per reported case.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (what, (kind, name), expect) in &watched {
        let Reported(reason) = expect else {
            served += 1;
            continue;
        };
        reported += 1;
        let w = warnings(&ns, kind, name).await;
        if w != [(reason.to_string(), 1)] {
            failures.push(format!("{what}: expected exactly one Warning Event {reason}, found (reason, count) {w:?}"));
        }
    }
    // The Queue at the name limit has its ConfigMap.
    let cms: Api<ConfigMap> = ns.api();
    if cms.get(&format!("{}-sqs", long(249))).await.is_err() {
        failures.push("Queue name of 249 characters: no ConfigMap <name>-sqs".into());
    }

    // Nothing spins: with everything settled, reconciles stay near one per object per resync (2 s).
    let objects = watched.len() + 12;
    let before = op.ctx.metrics.reconciles() + tun.ctx.metrics.reconciles();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let per_second = (op.ctx.metrics.reconciles() + tun.ctx.metrics.reconciles() - before) as f64 / 6.0;
    if per_second > objects as f64 {
        failures.push(format!("{per_second:.1} reconciles/s for {objects} objects: something is retried hot"));
    }

    for f in &failures {
        eprintln!("handled badly: {f}");
    }

    // The good objects still follow edits.
    let queues: Api<Queue> = ns.api();
    queues
        .patch("good", &PatchParams::default(), &Patch::Merge(json!({"spec": {"visibilityTimeoutSeconds": 31}})))
        .await
        .unwrap();
    eventually("good Queue converges after an edit", TIMEOUT, || async {
        let g = queues.get("good").await.ok()?;
        (g.status.as_ref()?.observed_generation == g.metadata.generation
            && ready(&g) == Some((ConditionStatus::True, "Available".into())))
        .then_some(())
    })
    .await;
    let tunnels_api: Api<Tunnel> = ns.api();
    apply(&ns.name, &lb("good-web", json!([{"name": "a", "port": 8080}, {"name": "b", "port": 8081}]))).await.unwrap();
    eventually("good Tunnel exposes the new port", TIMEOUT, || async {
        let t = tunnels_api.get("good-web-tunnel").await.ok()?;
        (t.status?.ports.len() == 2).then_some(())
    })
    .await;
    good_still_served(&ns, "at the end").await;

    let panics = PANICS.load(Ordering::SeqCst);
    println!(
        "bad input: tried {tried}, refused at admission {refused}, reported in status {reported}, valid edge cases served {served}, panics {panics}, reconciles/s when settled {per_second:.1}"
    );
    assert!(failures.is_empty(), "{} of {tried} cases handled badly:\n{}", failures.len(), failures.join("\n"));
    assert_eq!(panics, 0, "the controllers panicked");

    let _ = sqs()
        .await
        .delete_queue()
        .queue_url(sqs().await.get_queue_url().queue_name(&taken).send().await.unwrap().queue_url.unwrap())
        .send()
        .await;
    tun_finish(op, tun, ns).await;
}

async fn tun_finish(op: Operator, tun: tunnels::TunnelOperator, ns: TestNs) {
    let queues: Api<Queue> = ns.api();
    let _ = queues.delete_collection(&Default::default(), &Default::default()).await;
    eventually("all Queues deleted", TIMEOUT, || async {
        queues.list(&Default::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    op.stop().await;
    tunnels::finish_tunnels(tun, ns).await;
}
