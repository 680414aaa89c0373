//! `spec.exports` against a real kube-apiserver and real LocalStack: ConfigMaps and Secrets with
//! the names and keys the user chooses, owned like the default ConfigMap, converged on edits,
//! deleted when dropped, never taking over (or letting the garbage collector take) an object
//! someone else made, and never logging a Secret's content.
//!
//! Run with `tests/run.sh`, or `eval "$(tests/env.sh up)" && cargo test --test integration queue_exports:: -- --include-ignored`.

use crate::common;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Mutex, Once};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::controllers::status::ObjectStatus;
use skyport::crd::export::{ExportKind, ExportRef};
use skyport::crd::{ConditionStatus, Queue};

const TIMEOUT: Duration = Duration::from_secs(30);

/// Every log line of the test process (every test's controllers), at debug level but for the
/// HTTP and TLS layers' own chatter.
static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogSink;
impl Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("debug,hyper=info,hyper_util=info,h2=info,rustls=info,tower=info")
            .with_writer(|| LogSink)
            .with_ansi(false)
            .try_init();
    });
}

fn secret_data(s: &Secret) -> BTreeMap<String, String> {
    s.data.clone().unwrap_or_default().into_iter().map(|(k, v)| (k, String::from_utf8(v.0).unwrap())).collect()
}

fn controlled_by(obj: &impl kube::Resource, q: &Queue) -> bool {
    obj.meta().owner_references.iter().flatten().any(|r| r.controller == Some(true) && Some(&r.uid) == q.uid().as_ref())
}

/// `status.exports` without the UIDs recorded for Secrets (tests/queue_secret_exports.rs checks
/// those).
fn exports_status(q: &Queue) -> Vec<ExportRef> {
    let recorded = q.status.as_ref().map(|s| s.exports.clone()).unwrap_or_default();
    recorded.into_iter().map(|r| ExportRef { uid: None, ..r }).collect()
}

fn export_ref(kind: ExportKind, name: &str) -> ExportRef {
    ExportRef { kind, name: name.into(), uid: None }
}

async fn patch_exports(api: &Api<Queue>, name: &str, exports: serde_json::Value) {
    let patch = json!({"spec": {"exports": exports}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch exports");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn exports_get_the_chosen_keys_follow_edits_and_go_when_dropped() {
    capture_logs();
    let ns = TestNs::new("exp-keys").await;
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    let exports = json!([
        {"kind": "Secret", "name": "orders-env", "keys": {"url": "ORDERS_QUEUE_URL", "arn": "ORDERS_QUEUE_ARN"}},
        {"kind": "ConfigMap", "name": "legacy", "keys": {"name": "SQS_NAME"}},
    ]);
    queues.create(&PostParams::default(), &queue("orders", json!({"exports": exports}))).await.unwrap();
    let q = wait_ready(&queues, "orders", ConditionStatus::True, "Available", TIMEOUT).await;
    let status = q.status.clone().unwrap();
    let (url, arn, name) =
        (status.queue_url.unwrap(), status.queue_arn.unwrap(), status.queue_name.unwrap().to_string());

    let secrets: Api<Secret> = ns.api();
    let s = secrets.get("orders-env").await.expect("Secret export");
    let want =
        BTreeMap::from([("ORDERS_QUEUE_URL".to_string(), url.clone()), ("ORDERS_QUEUE_ARN".into(), arn.clone())]);
    assert_eq!(secret_data(&s), want, "exactly the chosen keys");
    assert!(controlled_by(&s, &q), "owned by the Queue");
    assert_eq!(s.labels().get("app.kubernetes.io/managed-by").map(String::as_str), Some("skyport"));
    let cms: Api<ConfigMap> = ns.api();
    let cm = cms.get("legacy").await.expect("ConfigMap export");
    assert_eq!(cm.data.clone().unwrap(), BTreeMap::from([("SQS_NAME".to_string(), name.clone())]));
    assert!(controlled_by(&cm, &q));
    assert!(cms.get("orders-sqs").await.is_ok(), "the default ConfigMap is still written");
    let mut recorded = exports_status(&q);
    recorded.sort();
    assert_eq!(recorded, [export_ref(ExportKind::ConfigMap, "legacy"), export_ref(ExportKind::Secret, "orders-env")]);

    // Converged: resyncs write nothing (neither the ConfigMaps nor the Secret).
    let writes = op.ctx.api_writes.get();
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(op.ctx.api_writes.get(), writes, "resyncs of a converged Queue wrote to the API");

    // Renaming a key: the Secret follows, the old key is gone.
    let edited = json!([
        {"kind": "Secret", "name": "orders-env", "keys": {"url": "QUEUE_URL", "arn": "ORDERS_QUEUE_ARN"}},
        {"kind": "ConfigMap", "name": "legacy", "keys": {"name": "SQS_NAME", "url": "SQS_URL"}},
    ]);
    patch_exports(&queues, "orders", edited).await;
    let want = BTreeMap::from([("QUEUE_URL".to_string(), url.clone()), ("ORDERS_QUEUE_ARN".into(), arn.clone())]);
    eventually("Secret with the renamed key", TIMEOUT, || async {
        (secret_data(&secrets.get("orders-env").await.ok()?) == want).then_some(())
    })
    .await;
    let want_cm = BTreeMap::from([("SQS_NAME".to_string(), name.clone()), ("SQS_URL".into(), url.clone())]);
    eventually("ConfigMap with the added key", TIMEOUT, || async {
        (cms.get("legacy").await.ok()?.data? == want_cm).then_some(())
    })
    .await;

    // Dropping the ConfigMap export deletes it; the Secret stays.
    patch_exports(&queues, "orders", json!([{"kind": "Secret", "name": "orders-env", "keys": {"url": "QUEUE_URL"}}]))
        .await;
    eventually("dropped ConfigMap export deleted", TIMEOUT, || async {
        matches!(cms.get("legacy").await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
    })
    .await;
    let q = eventually("status.exports without the dropped one", TIMEOUT, || async {
        let q = queues.get("orders").await.ok()?;
        (exports_status(&q) == [export_ref(ExportKind::Secret, "orders-env")]).then_some(q)
    })
    .await;
    assert_eq!(secret_data(&secrets.get("orders-env").await.unwrap()), BTreeMap::from([("QUEUE_URL".into(), url)]));
    assert_eq!(q.status.as_ref().and_then(|s| s.ready()).map(|c| c.reason.clone()).as_deref(), Some("Available"));

    // Dropping the Secret export deletes the Secret.
    patch_exports(&queues, "orders", json!([])).await;
    eventually("dropped Secret export deleted", TIMEOUT, || async {
        matches!(secrets.get("orders-env").await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
    })
    .await;
    events_with_reason(&ns.client, &ns.name, "ExportDeleted").await;
    assert_no_failures(&op.ctx.metrics, "reconciles failed");
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_queue_that_skips_its_configmap_has_none_and_gets_it_back_on_write() {
    let ns = TestNs::new("exp-skip").await;
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    let cms: Api<ConfigMap> = ns.api();
    let absent = |name: &'static str| {
        let cms = cms.clone();
        async move { matches!(cms.get(name).await, Err(kube::Error::Api(e)) if e.code == 404).then_some(()) }
    };
    queues.create(&PostParams::default(), &queue("quiet", json!({"configMap": "Skip"}))).await.unwrap();
    let q = wait_ready(&queues, "quiet", ConditionStatus::True, "Available", TIMEOUT).await;
    assert!(q.status.as_ref().and_then(|s| s.queue_url.as_ref()).is_some(), "status carries the URL");
    assert!(absent("quiet-sqs").await.is_some(), "no ConfigMap written for a Queue that skips it");

    // Write: the ConfigMap appears; Skip again: this Queue's ConfigMap is deleted, with an Event.
    let set = |policy: &'static str| json!({"spec": {"configMap": policy}});
    queues.patch("quiet", &PatchParams::default(), &Patch::Merge(&set("Write"))).await.unwrap();
    eventually("the ConfigMap written", TIMEOUT, || async { cms.get("quiet-sqs").await.ok() }).await;
    queues.patch("quiet", &PatchParams::default(), &Patch::Merge(&set("Skip"))).await.unwrap();
    eventually("the ConfigMap deleted", TIMEOUT, || absent("quiet-sqs")).await;
    events_with_reason(&ns.client, &ns.name, "ConfigMapDeleted").await;

    // A ConfigMap of that name someone else made is never deleted by a Queue that skips.
    let theirs = ConfigMap {
        metadata: kube::api::ObjectMeta { name: Some("quiet-sqs".into()), ..Default::default() },
        ..Default::default()
    };
    cms.create(&PostParams::default(), &theirs).await.unwrap();
    queues
        .patch("quiet", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"tags": {"touch": "1"}}})))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(cms.get("quiet-sqs").await.is_ok(), "someone else's ConfigMap is left alone");
    assert_no_failures(&op.ctx.metrics, "reconciles failed");
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn objects_someone_else_made_are_never_taken_over() {
    capture_logs();
    let ns = TestNs::new("exp-foreign").await;
    let secrets: Api<Secret> = ns.api();
    let cms: Api<ConfigMap> = ns.api();
    let theirs: Secret =
        serde_json::from_value(json!({"metadata": {"name": "creds"}, "stringData": {"PASSWORD": "hunter2"}})).unwrap();
    secrets.create(&PostParams::default(), &theirs).await.unwrap();
    let their_cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "settings"}, "data": {"MODE": "fast"}})).unwrap();
    cms.create(&PostParams::default(), &their_cm).await.unwrap();

    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    let exports = json!([
        {"kind": "Secret", "name": "creds", "keys": {"url": "QUEUE_URL"}},
        {"kind": "ConfigMap", "name": "settings", "keys": {"url": "QUEUE_URL"}},
        {"kind": "Secret", "name": "mine", "keys": {"arn": "QUEUE_ARN"}},
    ]);
    queues.create(&PostParams::default(), &queue("app", json!({"exports": exports}))).await.unwrap();
    let q = wait_ready(&queues, "app", ConditionStatus::False, "ExportConflict", TIMEOUT).await;
    let message = q.status.as_ref().and_then(|s| s.ready()).map(|c| c.message.clone()).unwrap_or_default();
    assert!(message.contains("Secret creds") && message.contains("ConfigMap settings"), "{message}");
    // What could be written was, and is recorded; the others are not.
    assert!(secrets.get("mine").await.is_ok(), "the free name is exported");
    eventually("status.exports records only the owned export", TIMEOUT, || async {
        let q = queues.get("app").await.ok()?;
        (exports_status(&q) == [export_ref(ExportKind::Secret, "mine")]).then_some(())
    })
    .await;

    // Several resyncs later: untouched, no owner reference, and one Warning.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let s = secrets.get("creds").await.unwrap();
    assert_eq!(secret_data(&s), BTreeMap::from([("PASSWORD".into(), "hunter2".into())]), "user Secret untouched");
    assert!(s.metadata.owner_references.unwrap_or_default().is_empty(), "never garbage-collected with the Queue");
    let cm = cms.get("settings").await.unwrap();
    assert_eq!(cm.data.clone().unwrap(), BTreeMap::from([("MODE".into(), "fast".into())]));
    assert!(cm.metadata.owner_references.unwrap_or_default().is_empty());
    let events: Api<Event> = ns.api();
    let warnings: Vec<_> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ExportConflict"))
        .collect();
    assert_eq!(warnings.len(), 1, "one Warning Event: {warnings:?}");
    assert_eq!(warnings[0].type_.as_deref(), Some("Warning"));
    assert!(warnings[0].series.is_none(), "not repeated: {:?}", warnings[0].series);

    // Dropping an export of a foreign object never deletes it.
    let patch = json!({"spec": {"exports": [{"kind": "Secret", "name": "mine", "keys": {"arn": "QUEUE_ARN"}},
        {"kind": "ConfigMap", "name": "settings", "keys": {"url": "QUEUE_URL"}}]}});
    queues.patch("app", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(secret_data(&secrets.get("creds").await.unwrap())["PASSWORD"], "hunter2");

    // Once the name is free, the export is written and the Queue is Ready.
    cms.delete("settings", &DeleteParams::default()).await.unwrap();
    let q = wait_ready(&queues, "app", ConditionStatus::True, "Available", TIMEOUT).await;
    assert!(controlled_by(&cms.get("settings").await.unwrap(), &q));

    // The Queue goes: the user's Secret stays.
    queues.delete("app", &DeleteParams::default()).await.unwrap();
    wait_gone(&queues, "app", TIMEOUT).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(secret_data(&secrets.get("creds").await.unwrap())["PASSWORD"], "hunter2", "still there");
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn bad_exports_are_refused_at_admission() {
    let ns = TestNs::new("exp-admit").await;
    let queues: Api<Queue> = ns.api();
    let refused = |exports: serde_json::Value, needle: &'static str| {
        let queues = queues.clone();
        async move {
            let err = queues
                .create(&PostParams::default(), &queue("q", json!({"exports": exports})))
                .await
                .expect_err("refused at admission");
            let kube::Error::Api(e) = err else { panic!("unexpected error {err}") };
            assert_eq!(e.code, 422, "{}", e.message);
            assert!(e.message.contains(needle), "expected {needle:?} in {}", e.message);
        }
    };
    let keys = json!({"url": "U"});
    refused(json!([{"kind": "Secret", "name": "a", "keys": {}}]), "at least one of url, arn and name").await;
    refused(json!([{"kind": "Secret", "name": "a", "keys": {"url": "K", "arn": "K"}}]), "different").await;
    refused(json!([{"kind": "Secret", "name": "a", "keys": {"url": "NOT=VALID"}}]), "keys.url").await;
    refused(json!([{"kind": "Secret", "name": "Not_A_Name", "keys": keys}]), "name").await;
    let twice = json!([{"kind": "Secret", "name": "a", "keys": keys}, {"kind": "Secret", "name": "a", "keys": keys}]);
    refused(twice, "its own kind and name").await;
    refused(json!([{"kind": "ConfigMap", "name": "q-sqs", "keys": keys}]), "<name>-sqs").await;
    let many: Vec<_> = (0..9).map(|i| json!({"kind": "Secret", "name": format!("s{i}"), "keys": keys})).collect();
    refused(json!(many), "must have at most 8 items").await;
    // The same name as a Secret and as a ConfigMap are two targets.
    let both = json!([{"kind": "Secret", "name": "a", "keys": keys}, {"kind": "ConfigMap", "name": "a", "keys": keys}]);
    queues.create(&PostParams::default(), &queue("q", json!({"exports": both}))).await.expect("accepted");
    queues.delete("q", &DeleteParams::default()).await.unwrap();
    ns.cleanup().await;
}

/// Runs last in spirit: every log line of this process so far (both export tests above when run
/// together) must be free of Secret content. A marker in a Secret export's value proves the
/// check would see a leak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn secret_exports_never_appear_in_logs_events_or_status() {
    capture_logs();
    let ns = TestNs::new("exp-logs").await;
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    let key = format!("MARKER_KEY_{}", &ns.name[ns.name.len() - 6..]).to_uppercase().replace('-', "_");
    let exports = json!([{"kind": "Secret", "name": "logged", "keys": {"url": key, "arn": "A"}}]);
    queues.create(&PostParams::default(), &queue("q", json!({"exports": exports}))).await.unwrap();
    let q = wait_ready(&queues, "q", ConditionStatus::True, "Available", TIMEOUT).await;
    let secret = ns.api::<Secret>().get("logged").await.unwrap();
    let encoded: Vec<String> = secret
        .data
        .clone()
        .unwrap()
        .values()
        .map(|v| serde_json::to_value(v).unwrap().as_str().unwrap().to_string())
        .collect();
    // Edit and drop it too, so updates and deletes are logged as well.
    patch_exports(&queues, "q", json!([{"kind": "Secret", "name": "logged", "keys": {"url": key}}])).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    patch_exports(&queues, "q", json!([])).await;
    eventually("Secret export deleted", TIMEOUT, || async {
        ns.api::<Secret>().get("logged").await.is_err().then_some(())
    })
    .await;

    let logs = String::from_utf8_lossy(&LOGS.lock().unwrap()).into_owned();
    assert!(logs.contains("created export Secret"), "the capture sees the controller's logs");
    let events = serde_json::to_string(&ns.api::<Event>().list(&ListParams::default()).await.unwrap().items).unwrap();
    let status = serde_json::to_string(&queues.get("q").await.unwrap().status).unwrap();
    for (what, text) in [("logs", &logs), ("Events", &events), ("status", &status)] {
        for value in &encoded {
            assert!(!text.contains(value.as_str()), "{what} contain a Secret value (base64)");
        }
        assert!(!text.contains(&key), "{what} contain the Secret's key");
    }
    assert!(q.status.is_some());
    finish(op, ns).await;
}
