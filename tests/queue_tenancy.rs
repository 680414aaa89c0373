//! The namespace is the tenant boundary, against a real kube-apiserver and real LocalStack: a
//! Queue never takes, writes or names another namespace's (or cluster's) queue, adopts queues made
//! outside skyport only where the platform granted them, and an interrupted adoption stays gentle.
//!
//! Run with `tests/run.sh`, or `eval "$(tests/env.sh up)" && cargo test --test integration queue_tenancy:: -- --include-ignored`.

use crate::common;

mod namespace_reuse;
mod redrive;

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue};

const TIMEOUT: Duration = Duration::from_secs(30);
const OWNER_UID: &str = "skyport.dev/owner-uid";

fn message(q: &Queue) -> String {
    let ready = q.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    ready.map(|c| c.message.to_string()).unwrap_or_default()
}

async fn tags(url: &str) -> HashMap<String, String> {
    sqs().await.list_queue_tags().queue_url(url).send().await.expect("ListQueueTags").tags.unwrap_or_default()
}

/// A queue made as someone other than this cluster's skyport would.
async fn create_outside(name: &str, attributes: &[(QueueAttributeName, &str)], tags: &[(&str, &str)]) -> String {
    let mut req = sqs().await.create_queue().queue_name(name);
    for (k, v) in attributes {
        req = req.attributes(k.clone(), *v);
    }
    for (k, v) in tags {
        req = req.tags(*k, *v);
    }
    req.send().await.expect("CreateQueue").queue_url.expect("url")
}

async fn delete_sqs_queue(name: &str) {
    let sqs = sqs().await;
    if let Ok(out) = sqs.get_queue_url().queue_name(name).send().await {
        let _ = sqs.delete_queue().queue_url(out.queue_url.unwrap()).send().await;
    }
}

/// SQS calls of one kind the operator has made so far.
fn calls(op: &Operator, operation: &str) -> u64 {
    op.sqs_calls().get(operation).copied().unwrap_or(0)
}

/// Waits until the operator has looked at SQS `n` more times (each resync reads the attributes).
async fn resyncs(op: &Operator, n: u64) {
    let start = calls(op, "GetQueueAttributes");
    eventually(&format!("{n} more resyncs"), TIMEOUT, || async {
        (calls(op, "GetQueueAttributes") >= start + n).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn an_adoption_interrupted_before_its_status_keeps_the_queues_policy_and_the_queue() {
    let ns = TestNs::new("ten-migrate").await;
    let name = format!("legacy-{}", &ns.name[12..]);
    let policy = json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "sqs:SendMessage", "Resource": "*"}]}).to_string();
    let url = create_outside(&name, &[(QueueAttributeName::Policy, &policy)], &[("cost-center", "42")]).await;
    // A hand-made ConfigMap of the name skyport publishes to: the adoption claims the queue, then
    // stops short of Ready (ConfigMapConflict), and status never records the adoption.
    let handmade: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "orders-sqs"}, "data": {"QUEUE_URL": "by hand"}})).unwrap();
    ns.api::<ConfigMap>().create(&PostParams::default(), &handmade).await.unwrap();
    let op = Operator::start(&ns, granting(&ns.name, "legacy-*")).await;
    let queues: Api<Queue> = ns.api();
    let spec = json!({"queueName": name, "adopt": true, "visibilityTimeoutSeconds": 50});
    queues.create(&PostParams::default(), &queue("orders", spec)).await.unwrap();
    let q = wait_ready(&queues, "orders", ConditionStatus::False, "ConfigMapConflict", TIMEOUT).await;
    assert_eq!(tags(&url).await.get(OWNER_UID), q.metadata.uid.as_ref(), "claimed");
    assert!(!q.status.as_ref().is_some_and(|s| s.adopted), "the status never said adopted");

    // Several resyncs later the queue is still as its owners made it, but for the declared field.
    resyncs(&op, 3).await;
    let a = attributes(&sqs().await, &url).await;
    assert_eq!(a["VisibilityTimeout"], "50");
    assert!(a.get("Policy").is_some_and(|p| p.contains("sqs:SendMessage")), "access policy kept: {a:?}");
    let t = tags(&url).await;
    assert_eq!(t.get("cost-center").map(String::as_str), Some("42"), "foreign tag kept: {t:?}");
    assert_eq!(t.get("skyport.dev/adopted").map(String::as_str), Some("true"));

    // Deleting the Queue keeps an adopted queue unless deletionPolicy says Delete.
    queues.delete("orders", &DeleteParams::default()).await.unwrap();
    wait_gone(&queues, "orders", TIMEOUT).await;
    assert!(queue_exists(&sqs().await, &name).await, "the adopted queue is kept");
    delete_sqs_queue(&name).await;
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn another_namespaces_retained_queue_is_never_taken_and_its_own_namespace_takes_it_back() {
    let (a, b) = (TestNs::new("ten-take-a").await, TestNs::new("ten-take-b").await);
    let name = format!("shared-{}", &a.name[11..]);
    let (opa, opb) = (Operator::start(&a, fast_settings()).await, Operator::start(&b, fast_settings()).await);
    let (qa, qb): (Api<Queue>, Api<Queue>) = (a.api(), b.api());
    let retained = json!({"queueName": name, "deletionPolicy": "Retain", "visibilityTimeoutSeconds": 40});
    qb.create(&PostParams::default(), &queue("payments", retained)).await.unwrap();
    let theirs = wait_ready(&qb, "payments", ConditionStatus::True, "Available", TIMEOUT).await;
    let url = theirs.status.as_ref().and_then(|s| s.queue_url.clone()).unwrap();
    qb.delete("payments", &DeleteParams::default()).await.unwrap();
    wait_gone(&qb, "payments", TIMEOUT).await;

    let grab = json!({"queueName": name, "adopt": true, "deletionPolicy": "Delete", "policy": {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "sqs:*", "Resource": "*"}]}});
    qa.create(&PostParams::default(), &queue("grab", grab)).await.unwrap();
    let refused = wait_ready(&qa, "grab", ConditionStatus::False, "OwnedByAnotherNamespace", TIMEOUT).await;
    let text = message(&refused);
    assert!(!text.contains(&b.name) && !text.contains("payments"), "names nothing of theirs: {text}");
    resyncs(&opa, 2).await;
    let attrs = attributes(&sqs().await, &url).await;
    assert!(!attrs.contains_key("Policy"), "policy untouched: {attrs:?}");
    assert_eq!(tags(&url).await.get(OWNER_UID), theirs.metadata.uid.as_ref(), "still B's");
    qa.delete("grab", &DeleteParams::default()).await.unwrap();
    wait_gone(&qa, "grab", TIMEOUT).await;
    assert!(queue_exists(&sqs().await, &name).await, "deleting A's Queue never deletes B's queue");
    // Nor does observing publish B's queue in A's namespace.
    let peek = json!({"queueName": name, "managementPolicy": "Observe"});
    qa.create(&PostParams::default(), &queue("peek", peek)).await.unwrap();
    let peek = wait_ready(&qa, "peek", ConditionStatus::False, "OwnedByAnotherNamespace", TIMEOUT).await;
    assert!(peek.status.as_ref().is_some_and(|s| s.queue_url.is_none()), "no URL of theirs in A's status");

    let back = json!({"queueName": name, "adopt": true, "visibilityTimeoutSeconds": 41});
    qb.create(&PostParams::default(), &queue("payments", back)).await.unwrap();
    let mine = wait_ready(&qb, "payments", ConditionStatus::True, "Available", TIMEOUT).await;
    assert!(mine.status.as_ref().is_some_and(|s| s.adopted));
    assert_eq!(tags(&url).await.get(OWNER_UID), mine.metadata.uid.as_ref());
    assert_eq!(attributes(&sqs().await, &url).await["VisibilityTimeout"], "41");
    finish(opa, a).await;
    finish(opb, b).await;
    delete_sqs_queue(&name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn queues_of_other_clusters_and_ungranted_queues_are_not_adopted() {
    let ns = TestNs::new("ten-foreign").await;
    let suffix = &ns.name[12..];
    let elsewhere = format!("elsewhere-{suffix}");
    let other_cluster = [
        (OWNER_UID, "3f1c-other"),
        ("skyport.dev/owner-namespace", ns.name.as_str()),
        ("skyport.dev/owner-name", "orders"),
        ("skyport.dev/cluster", "another-cluster"),
    ];
    let url = create_outside(&elsewhere, &[], &other_cluster).await;
    let ungranted = format!("legacy-{suffix}");
    let legacy_url = create_outside(&ungranted, &[], &[("team", "old")]).await;
    let op = Operator::start(&ns, granting(&ns.name, "granted-*")).await;
    let queues: Api<Queue> = ns.api();
    queues
        .create(&PostParams::default(), &queue("orders", json!({"queueName": elsewhere, "adopt": true})))
        .await
        .unwrap();
    queues
        .create(&PostParams::default(), &queue("legacy", json!({"queueName": ungranted, "adopt": true})))
        .await
        .unwrap();
    wait_ready(&queues, "orders", ConditionStatus::False, "OwnedByAnotherCluster", TIMEOUT).await;
    let refused = wait_ready(&queues, "legacy", ConditionStatus::False, "AdoptionNotAllowed", TIMEOUT).await;
    assert!(message(&refused).contains("--queue-name-grant"), "says what the platform team can do");
    assert_eq!(tags(&url).await.get(OWNER_UID).map(String::as_str), Some("3f1c-other"));
    assert_eq!(tags(&legacy_url).await.get(OWNER_UID), None);
    for n in [&elsewhere, &ungranted] {
        delete_sqs_queue(n).await;
    }
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn another_namespaces_names_are_refused_at_admission_and_by_the_operator() {
    let (a, b) = (TestNs::new("ten-name-a").await, TestNs::new("ten-name-b").await);
    let out = Command::new("kubectl")
        .args(["apply", "-f", "deploy/queue-names.yaml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run kubectl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let qa: Api<Queue> = a.api();
    // B's default name form: refused at admission (the policy may take a moment to be served).
    let squat = queue("squat", json!({"queueName": format!("{}_payments", b.name)}));
    let refusal = eventually("the queue-name policy refusing", TIMEOUT, || async {
        match qa.create(&PostParams::default(), &squat).await {
            Err(kube::Error::Api(e)) => Some(e.message),
            Ok(_) => {
                let _ = qa.delete("squat", &DeleteParams::default()).await;
                None
            }
            Err(_) => None,
        }
    })
    .await;
    assert!(refusal.contains("reserved for the Queues of"), "{refusal}");
    let own = queue("own", json!({"queueName": format!("{}_own", a.name)}));
    qa.create(&PostParams::default(), &own).await.expect("its own namespace's form is fine");

    // A name the platform reserved for B: the operator refuses it.
    let mut settings = granting(&b.name, "billing-*");
    settings.name_grants.push(skyport::config::NameGrant { namespace: a.name.clone(), pattern: "shop-*".into() });
    let op = Operator::start(&a, settings).await;
    let reserved = format!("billing-{}", &a.name[11..]);
    qa.create(&PostParams::default(), &queue("billing", json!({"queueName": reserved}))).await.unwrap();
    let refused = wait_ready(&qa, "billing", ConditionStatus::False, "QueueNameReserved", TIMEOUT).await;
    assert!(!message(&refused).contains(&b.name), "does not name the other namespace: {}", message(&refused));
    assert!(!queue_exists(&sqs().await, &reserved).await, "never created");
    wait_ready(&qa, "own", ConditionStatus::True, "Available", TIMEOUT).await;
    finish(op, a).await;
    b.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn dead_letters_never_go_to_another_namespaces_queue() {
    let (a, b) = (TestNs::new("ten-dlq-a").await, TestNs::new("ten-dlq-b").await);
    let (opa, opb) = (Operator::start(&a, fast_settings()).await, Operator::start(&b, fast_settings()).await);
    let (qa, qb): (Api<Queue>, Api<Queue>) = (a.api(), b.api());
    qb.create(&PostParams::default(), &queue("inbox", json!({}))).await.unwrap();
    let theirs = wait_ready(&qb, "inbox", ConditionStatus::True, "Available", TIMEOUT).await;
    let their_arn = theirs.status.as_ref().and_then(|s| s.queue_arn.clone()).unwrap();
    qa.create(&PostParams::default(), &queue("dlq", json!({}))).await.unwrap();
    let mine = wait_ready(&qa, "dlq", ConditionStatus::True, "Available", TIMEOUT).await;
    let my_arn = mine.status.as_ref().and_then(|s| s.queue_arn.clone()).unwrap();

    let to_theirs = json!({"deadLetter": {"targetArn": their_arn, "maxReceiveCount": 1}});
    qa.create(&PostParams::default(), &queue("orders", to_theirs)).await.unwrap();
    let refused = wait_ready(&qa, "orders", ConditionStatus::False, "DeadLetterNotAllowed", TIMEOUT).await;
    assert!(!message(&refused).contains(&b.name), "{}", message(&refused));
    let to_mine = json!({"deadLetter": {"targetArn": my_arn, "maxReceiveCount": 1}});
    qa.create(&PostParams::default(), &queue("jobs", to_mine)).await.unwrap();
    let jobs = wait_ready(&qa, "jobs", ConditionStatus::True, "Available", TIMEOUT).await;
    let url = jobs.status.as_ref().and_then(|s| s.queue_url.clone()).unwrap();
    let redrive = attributes(&sqs().await, &url).await.get("RedrivePolicy").cloned().unwrap_or_default();
    assert!(redrive.contains(&my_arn), "{redrive}");
    finish(opa, a).await;
    finish(opb, b).await;
}
