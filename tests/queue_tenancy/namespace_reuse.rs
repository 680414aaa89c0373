//! A namespace's name is its identity (docs/security.md, *A namespace's name is its identity*): a
//! namespace created again under a deleted one's name may adopt the queues the old one retained,
//! unless the platform took skyport's tags off them first, as the documented step does.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue};

use super::{delete_sqs_queue, tags};
use crate::common::*;

const TIMEOUT: Duration = Duration::from_secs(30);

/// The platform step: skyport's tags off every queue the namespace `ns` retained.
async fn untag_retained(ns: &str, urls: &[String]) {
    let sqs = sqs().await;
    for url in urls {
        if tags(url).await.get("skyport.dev/owner-namespace").map(String::as_str) == Some(ns) {
            let keys = ["owner-uid", "owner-namespace", "owner-name", "cluster", "managed-by", "adopted"];
            let mut req = sqs.untag_queue().queue_url(url);
            for key in keys {
                req = req.tag_keys(format!("skyport.dev/{key}"));
            }
            req.send().await.expect("UntagQueue");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_namespace_created_again_inherits_retained_queues_unless_the_platform_step_ran() {
    let name = format!("reuse-{:08x}", rand::random::<u32>());
    let ns = TestNs::named(name.clone()).await;
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    let mut urls = Vec::new();
    for q in ["kept", "cleared"] {
        let spec = json!({"queueName": format!("{q}-{}", &name[6..]), "deletionPolicy": "Retain"});
        queues.create(&PostParams::default(), &queue(q, spec)).await.unwrap();
        let ready = wait_ready(&queues, q, ConditionStatus::True, "Available", TIMEOUT).await;
        urls.push(ready.status.and_then(|s| s.queue_url).unwrap());
    }
    let namespaces: Api<Namespace> = Api::all(ns.client.clone());
    namespaces.delete(&name, &DeleteParams::default()).await.unwrap();
    eventually("the namespace deleted", Duration::from_secs(120), || async {
        matches!(namespaces.get(&name).await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
    })
    .await;
    op.stop().await;
    untag_retained(&name, &urls[1..]).await;

    // Another team gets the name.
    let ns = TestNs::named(name.clone()).await;
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    for q in ["kept", "cleared"] {
        let spec = json!({"queueName": format!("{q}-{}", &name[6..]), "adopt": true});
        queues.create(&PostParams::default(), &queue(q, spec)).await.unwrap();
    }
    let taken = wait_ready(&queues, "kept", ConditionStatus::True, "Available", TIMEOUT).await;
    assert!(taken.status.is_some_and(|s| s.adopted), "the name alone proves it: the residue the step is for");
    wait_ready(&queues, "cleared", ConditionStatus::False, "AdoptionNotAllowed", TIMEOUT).await;
    assert_eq!(tags(&urls[1]).await.get("skyport.dev/owner-uid"), None, "after the step, never taken");
    finish(op, ns).await;
    for q in ["kept", "cleared"] {
        delete_sqs_queue(&format!("{q}-{}", &name[6..])).await;
    }
}
