//! Secret exports against a real kube-apiserver, written without reading any Secret: created,
//! then replaced whole with the UID recorded at creation. These tests check the API server
//! behaviour that design rests on (an update carrying another UID is refused), and the export's
//! life: drift repaired, recreated when deleted, and a Secret put in its place by someone else
//! never overwritten nor deleted.
//!
//! Run with `eval "$(tests/env.sh up)" && cargo test --test integration queue_secret_exports:: -- --include-ignored`.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;
use skyport::controllers::status::ObjectStatus;
use skyport::crd::export::ExportKind;
use skyport::crd::{ConditionStatus, Queue};

const TIMEOUT: Duration = Duration::from_secs(30);

fn secret(name: &str, data: serde_json::Value) -> Secret {
    serde_json::from_value(json!({"metadata": {"name": name}, "stringData": data})).unwrap()
}

fn values(s: &Secret) -> BTreeMap<String, String> {
    s.data.clone().unwrap_or_default().into_iter().map(|(k, v)| (k, String::from_utf8(v.0).unwrap())).collect()
}

/// The UID `status.exports` records for the Secret export `name`.
fn recorded_uid(q: &Queue, name: &str) -> Option<String> {
    let exports = &q.status.as_ref()?.exports;
    exports.iter().find(|r| r.kind == ExportKind::Secret && r.name == name)?.uid.clone()
}

fn code<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> u16 {
    match result {
        Err(kube::Error::Api(e)) => e.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn the_api_server_refuses_an_update_that_carries_another_uid() {
    let ns = TestNs::new("uid-put").await;
    let secrets: Api<Secret> = ns.api();
    let first = secrets.create(&PostParams::default(), &secret("s", json!({"k": "first"}))).await.unwrap();
    secrets.delete("s", &DeleteParams::default()).await.unwrap();
    let mut second = secret("s", json!({"k": "second"}));
    second = secrets.create(&PostParams::default(), &second).await.unwrap();
    assert_ne!(first.uid(), second.uid());

    // A whole-object update (PUT, no resourceVersion) carrying the first object's UID.
    let mut stale = secret("s", json!({"k": "overwritten"}));
    stale.meta_mut().uid = first.uid();
    assert_eq!(code(secrets.replace("s", &PostParams::default(), &stale).await), 409, "refused: another UID");
    assert_eq!(values(&secrets.get("s").await.unwrap())["k"], "second", "the stored object is untouched");

    // With the stored object's UID it goes through, and answers the object as written.
    stale.meta_mut().uid = second.uid();
    let written = secrets.replace("s", &PostParams::default(), &stale).await.expect("update with the right UID");
    assert_eq!(values(&written)["k"], "overwritten");
    // Nothing of that name: 404, never a create.
    secrets.delete("s", &DeleteParams::default()).await.unwrap();
    assert_eq!(code(secrets.replace("s", &PostParams::default(), &stale).await), 404);
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_secret_export_is_repaired_recreated_and_never_takes_over_a_replacement() {
    let ns = TestNs::new("exp-uid").await;
    // Rewritten once per tag resync: short here, so drift is repaired within the test.
    let settings = skyport::config::QueueArgs { tag_resync: Duration::from_secs(3), ..fast_settings() };
    let op = Operator::start(&ns, settings).await;
    let queues: Api<Queue> = ns.api();
    let secrets: Api<Secret> = ns.api();
    let exports = json!([{"kind": "Secret", "name": "env", "keys": {"url": "QUEUE_URL"}}]);
    queues.create(&PostParams::default(), &queue("orders", json!({"exports": exports}))).await.unwrap();
    let q = wait_ready(&queues, "orders", ConditionStatus::True, "Available", TIMEOUT).await;
    let url = q.status.as_ref().and_then(|s| s.queue_url.clone()).unwrap();
    let made = secrets.get("env").await.expect("the export");
    let want = BTreeMap::from([("QUEUE_URL".to_string(), url.clone())]);
    assert_eq!(values(&made), want);
    eventually("status.exports records the Secret's UID", TIMEOUT, || async {
        (recorded_uid(&queues.get("orders").await.ok()?, "env") == made.uid()).then_some(())
    })
    .await;

    // Drift: an edit of the export's data is undone, on the same object.
    let tamper = json!({"data": {"QUEUE_URL": null, "EXTRA": "eA=="}, "stringData": {"QUEUE_URL": "http://attacker"}});
    secrets.patch("env", &PatchParams::default(), &Patch::Merge(&tamper)).await.unwrap();
    eventually("the tampered export repaired", TIMEOUT, || async {
        let s = secrets.get("env").await.ok()?;
        (values(&s) == want && s.uid() == made.uid()).then_some(())
    })
    .await;

    // Deleted: made again, and the new UID recorded.
    secrets.delete("env", &DeleteParams::default()).await.unwrap();
    let again = eventually("the deleted export made again", TIMEOUT, || async {
        let s = secrets.get("env").await.ok()?;
        (s.uid() != made.uid()).then_some(s)
    })
    .await;
    assert_eq!(values(&again), want);
    eventually("status.exports records the new UID", TIMEOUT, || async {
        (recorded_uid(&queues.get("orders").await.ok()?, "env") == again.uid()).then_some(())
    })
    .await;

    // Replaced by someone else's Secret under the same name: never written, never deleted.
    let theirs = eventually("someone else's Secret in the export's place", TIMEOUT, || async {
        let _ = secrets.delete("env", &DeleteParams::default()).await;
        secrets.create(&PostParams::default(), &secret("env", json!({"PASSWORD": "hunter2"}))).await.ok()
    })
    .await;
    let q = wait_ready(&queues, "orders", ConditionStatus::False, "ExportConflict", TIMEOUT).await;
    let message = q.status.as_ref().and_then(|s| s.ready()).map(|c| c.message.clone()).unwrap();
    assert!(message.contains("Secret env") && !message.contains(&ns.name), "names only the Secret: {message}");
    assert_eq!(recorded_uid(&q, "env"), None, "no longer recorded as the Queue's");
    let events = ns.api::<Event>().list(&ListParams::default()).await.unwrap().items;
    assert!(events.iter().any(|e| e.reason.as_deref() == Some("ExportConflict")), "a Warning Event");
    tokio::time::sleep(Duration::from_secs(7)).await;
    let kept = secrets.get("env").await.unwrap();
    assert_eq!((kept.uid(), values(&kept)), (theirs.uid(), BTreeMap::from([("PASSWORD".into(), "hunter2".into())])));
    assert!(kept.owner_references().is_empty(), "never made the Queue's");

    // The export dropped: their Secret stays.
    queues.patch("orders", &PatchParams::default(), &Patch::Merge(json!({"spec": {"exports": []}}))).await.unwrap();
    wait_ready(&queues, "orders", ConditionStatus::True, "Available", TIMEOUT).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(secrets.get("env").await.unwrap().uid(), theirs.uid(), "someone else's Secret is not deleted");
    assert_no_failures(&op.ctx.metrics, "reconciles failed");
    finish(op, ns).await;
}
