//! Queue controller against a real kube-apiserver and real LocalStack (`tests/env.sh up`).
//!
//! Run with `tests/run.sh`, or `eval "$(tests/env.sh up)" && cargo test --test integration queue:: -- --include-ignored`.

use crate::common;

mod dead_letter;
mod events;
mod lifecycle;
mod refusals;
mod resilience;

use std::time::Duration;

use common::sqs;
use skyport::crd::Queue;

const READY_TIMEOUT: Duration = Duration::from_secs(30);

fn url_of(q: &Queue) -> String {
    q.status.as_ref().and_then(|s| s.queue_url.clone()).expect("status.queueUrl")
}

async fn tags(url: &str) -> std::collections::HashMap<String, String> {
    sqs().await.list_queue_tags().queue_url(url).send().await.expect("ListQueueTags").tags.unwrap_or_default()
}
