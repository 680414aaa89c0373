//! Queues a tenant must never take, for the fault suite: one that a Queue of another namespace
//! retained, one of another cluster sharing the account (same namespace name), and one made
//! outside skyport that the platform did not grant. The workloads point adoptions and dead-letter
//! links at them; a steal is any change to one of them (owner tag, any other tag, any attribute
//! but the message counters) or its deletion.
#![allow(dead_code)]

use std::collections::BTreeMap;

use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::{Value, json};

use crate::common::{attributes, sqs};

/// What a Queue aimed at a bait queue tries, and the reason it must be refused with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    Adopt,
    DeadLetter,
}

/// One bait queue: its name, URL, ARN and the Ready reason a Queue of the workload gets for it.
#[derive(Debug, Clone)]
pub struct BaitQueue {
    pub name: String,
    pub url: String,
    pub arn: String,
    adopt_reason: &'static str,
}

/// A queue's tags and its attributes but the message counters (they move by themselves).
type Snapshot = (BTreeMap<String, String>, BTreeMap<String, String>);

/// The bait queues of one workload namespace, with what each held when laid.
pub struct Bait {
    pub queues: Vec<BaitQueue>,
    before: BTreeMap<String, Snapshot>,
}

/// What a steal would change.
async fn snapshot(url: &str) -> Option<Snapshot> {
    let sqs = sqs().await;
    let tags = sqs.list_queue_tags().queue_url(url).send().await.ok()?.tags.unwrap_or_default();
    let attrs = attributes(&sqs, url).await;
    let attrs = attrs.into_iter().filter(|(k, _)| !k.starts_with("Approximate")).collect();
    Some((tags.into_iter().collect(), attrs))
}

impl Bait {
    /// Lays the three queues for namespace `ns` of cluster `cluster`, named `<prefix>-…`.
    pub async fn lay(prefix: &str, ns: &str, cluster: &str) -> Self {
        let owner = |ns: &str, cluster: &str| {
            vec![
                ("skyport.dev/managed-by", "skyport".to_string()),
                ("skyport.dev/owner-uid", format!("uid-of-{prefix}")),
                ("skyport.dev/owner-namespace", ns.to_string()),
                ("skyport.dev/owner-name", "payments".to_string()),
                ("skyport.dev/cluster", cluster.to_string()),
            ]
        };
        let kinds = [
            ("retained", owner(&format!("{ns}-neighbour"), cluster), "OwnedByAnotherNamespace"),
            ("elsewhere", owner(ns, &format!("{cluster}-elsewhere")), "OwnedByAnotherCluster"),
            ("legacy", vec![("team", "legacy".to_string())], "AdoptionNotAllowed"),
        ];
        let policy = json!({"Version": "2012-10-17", "Statement": [{"Effect": "Deny", "Principal": "*", "Action": "sqs:*", "Resource": "*"}]});
        let sqs = sqs().await;
        let mut queues = Vec::new();
        let mut before = BTreeMap::new();
        for (kind, tags, adopt_reason) in kinds {
            let name = format!("{prefix}-{kind}");
            let mut req = sqs
                .create_queue()
                .queue_name(&name)
                .attributes(QueueAttributeName::VisibilityTimeout, "7")
                .attributes(QueueAttributeName::Policy, policy.to_string());
            for (k, v) in tags {
                req = req.tags(k, v);
            }
            let url = req.send().await.expect("CreateQueue (bait)").queue_url.expect("url");
            let arn = attributes(&sqs, &url).await["QueueArn"].clone();
            before.insert(url.clone(), snapshot(&url).await.expect("bait readable"));
            queues.push(BaitQueue { name, url, arn, adopt_reason });
        }
        Bait { queues, before }
    }

    /// A Queue spec aimed at bait queue `i` (modulo their number), and the Ready reason it must
    /// end with.
    pub fn spec(&self, i: usize, attempt: Attempt) -> (Value, &'static str) {
        let b = &self.queues[i % self.queues.len()];
        match attempt {
            Attempt::Adopt => (
                json!({"queueName": b.name, "adopt": true, "deletionPolicy": "Delete", "visibilityTimeoutSeconds": 99,
                       "policy": {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "sqs:*", "Resource": "*"}]}}),
                b.adopt_reason,
            ),
            Attempt::DeadLetter => {
                (json!({"deadLetter": {"targetArn": b.arn, "maxReceiveCount": 1}}), "DeadLetterNotAllowed")
            }
        }
    }

    /// Bait queues changed or deleted since they were laid.
    pub async fn steals(&self) -> usize {
        let mut steals = 0;
        for (url, was) in &self.before {
            if snapshot(url).await.as_ref() != Some(was) {
                steals += 1;
            }
        }
        steals
    }

    pub async fn remove(&self) {
        let sqs = sqs().await;
        for b in &self.queues {
            let _ = sqs.delete_queue().queue_url(&b.url).send().await;
        }
    }
}
