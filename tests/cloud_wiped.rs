//! Fault suite, cloud state wiped: with Queues Ready (a third of them dead-letter queues of the
//! others, by reference), LocalStack is restarted in a private environment and comes back empty.
//! Every Queue's SQS queue must be back within one resync (plus the error backoff and the rate
//! budget the recreation costs), with its attributes, its owner tag and its RedrivePolicy
//! pointing at its dead-letter queue's ARN again; no duplicates, and nothing left once the
//! Queues are deleted. Time to recover is printed per restart.
//!
//! CI: 6 Queues, 1 restart. Full run (figures in RELIABILITY.md):
//! `SKYPORT_WIPE_QUEUES=150 SKYPORT_WIPE_RESTARTS=3 cargo test --test integration cloud_wiped:: -- --include-ignored --nocapture`

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::private_env::{PrivateEnv, Server, Skyport, audit, setting};
use common::*;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue};

const RESYNC: Duration = Duration::from_secs(5);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
const SQS_RATE: u64 = 50;

/// What a Queue's SQS queue must look like: visibility timeout, and the dead-letter Queue's name.
struct Expected {
    timeout: i32,
    dead_letter: Option<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment (it starts a private one with tests/env.sh)"]
async fn every_queue_and_dead_letter_link_is_back_within_a_resync_after_localstack_loses_its_state() {
    let count = setting("SKYPORT_WIPE_QUEUES", 6) as usize;
    let restarts = setting("SKYPORT_WIPE_RESTARTS", 1);
    let env = PrivateEnv::up("wipe").await;
    let ns = TestNs::in_cluster(env.client().await, format!("wipe-{:08x}", rand::random::<u32>())).await;
    let queues: Api<Queue> = ns.api();
    let sqs = env.sqs().await;
    let args: Vec<String> = [
        "--namespace",
        &ns.name,
        "--queue-resync",
        &format!("{}s", RESYNC.as_secs()),
        "--error-backoff-min",
        "200ms",
        "--error-backoff-max",
        &format!("{}s", BACKOFF_MAX.as_secs()),
        "--sqs-rate",
        &SQS_RATE.to_string(),
        "--sqs-burst",
        &SQS_RATE.to_string(),
        "--sqs-tag-rate",
        &SQS_RATE.to_string(),
    ]
    .map(String::from)
    .to_vec();
    let skyport = Skyport::start(&env, &args);

    // Every third Queue is the dead-letter queue of the two after it.
    let mut expected = BTreeMap::new();
    for i in 0..count {
        let timeout = 30 + i as i32 % 50;
        let (name, dead_letter) =
            if i % 3 == 0 { (format!("dlq{i}"), None) } else { (format!("q{i}"), Some(format!("dlq{}", i - i % 3))) };
        let mut spec = json!({"visibilityTimeoutSeconds": timeout});
        if let Some(dlq) = &dead_letter {
            spec["deadLetter"] = json!({"queueRef": {"name": dlq}, "maxReceiveCount": 3});
        }
        queues.create(&PostParams::default(), &queue(&name, spec)).await.unwrap();
        expected.insert(name, Expected { timeout, dead_letter });
    }
    for name in expected.keys() {
        wait_ready(&queues, name, ConditionStatus::True, "Available", Duration::from_secs(120)).await;
    }
    let with_dlq = expected.values().filter(|e| e.dead_letter.is_some()).count();
    assert!(restored(&sqs, &queues, &expected).await.is_empty(), "all queues in place before the wipe");

    // A queue skyport does not own: it must not come back, which proves the state was wiped.
    let sentinel = format!("{}_sentinel", ns.name);
    let budget = Duration::from_secs_f64((count * 4) as f64 / SQS_RATE as f64);
    let limit = RESYNC + BACKOFF_MAX + budget + Duration::from_secs(10);
    let mut recoveries = Vec::new();
    for _ in 0..restarts {
        sqs.create_queue().queue_name(&sentinel).send().await.unwrap();
        let wiped = Instant::now();
        env.stop(Server::LocalStack, false).await;
        // Back = SQS answers again (tests/env.sh returns later, once its checks are done).
        let answers = eventually("LocalStack answers", Duration::from_secs(180), || async {
            sqs.list_queues().send().await.ok().map(|_| Instant::now())
        });
        let ((), back) = tokio::join!(env.start(), answers);
        assert!(!queue_exists(&sqs, &sentinel).await, "LocalStack came back with its old state");
        let (recovered, missing) = loop {
            let missing = restored(&sqs, &queues, &expected).await;
            if missing.is_empty() || back.elapsed() > limit + Duration::from_secs(60) {
                break (back.elapsed(), missing);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        println!(
            "cloud wiped: LocalStack down for {:?}, every queue back {recovered:?} after it returned",
            back - wiped
        );
        assert!(missing.is_empty(), "not restored after {recovered:?}: {missing:?}");
        recoveries.push(recovered);
    }
    let max = recoveries.iter().max().copied().unwrap_or_default();
    for name in expected.keys() {
        let q = queues.get(name).await.unwrap();
        assert_eq!(ready(&q), Some((ConditionStatus::True, "Available".into())), "{name}");
    }
    let (_, duplicates, _) = audit(&sqs, &queues, &ns.name).await;

    let _ = queues.delete_collection(&DeleteParams::default(), &ListParams::default()).await;
    eventually("all Queues deleted", Duration::from_secs(120), || async {
        queues.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    let (leaks, _, stuck) = audit(&sqs, &queues, &ns.name).await;
    let panics = skyport.panics();
    skyport.stop().await;
    println!(
        "cloud wiped: LocalStack restarts survived {restarts}, Queues created {count} ({with_dlq} with a dead-letter queue) \
         / deleted {count}, max time to recover {max:?} (limit {limit:?}: resync {RESYNC:?}), leaks {leaks}, \
         duplicates {duplicates}, stuck finalizers {stuck}, panics {panics}"
    );
    assert_eq!((leaks, duplicates, stuck, panics), (0, 0, 0, 0));
    assert!(max <= limit, "recovery took {max:?}, more than {limit:?}");
    env.down().await;
}

/// Names of the Queues whose SQS queue is not (yet) as expected: missing, another visibility
/// timeout, no owner tag of the Queue, or a RedrivePolicy not naming its dead-letter queue's ARN.
async fn restored(
    sqs: &aws_sdk_sqs::Client,
    queues: &Api<Queue>,
    expected: &BTreeMap<String, Expected>,
) -> BTreeSet<String> {
    let Ok(list) = queues.list(&ListParams::default()).await else { return expected.keys().cloned().collect() };
    let by_name: BTreeMap<String, Queue> =
        list.items.into_iter().map(|q| (q.metadata.name.clone().unwrap_or_default(), q)).collect();
    let arn = |name: &str| by_name.get(name).and_then(|q| q.status.as_ref()?.queue_arn.clone());
    let mut missing = BTreeSet::new();
    for (name, want) in expected {
        let q = &by_name[name];
        let ok = async {
            let url = q.status.as_ref()?.queue_url.clone()?;
            let attrs = sqs
                .get_queue_attributes()
                .queue_url(&url)
                .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
                .send()
                .await
                .ok()?
                .attributes?;
            let get = |k: &str| attrs.iter().find(|(n, _)| n.as_str() == k).map(|(_, v)| v.clone());
            let redrive = get("RedrivePolicy")
                .and_then(|p| serde_json::from_str::<serde_json::Value>(&p).ok())
                .and_then(|p| p["deadLetterTargetArn"].as_str().map(String::from));
            let tags = sqs.list_queue_tags().queue_url(&url).send().await.ok()?.tags.unwrap_or_default();
            (get("VisibilityTimeout") == Some(want.timeout.to_string())
                && redrive.is_some() == want.dead_letter.is_some()
                && redrive == want.dead_letter.as_deref().and_then(arn)
                && tags.get("skyport.dev/owner-uid") == q.metadata.uid.as_ref())
            .then_some(())
        };
        if ok.await.is_none() {
            missing.insert(name.clone());
        }
    }
    missing
}
