//! Watching several `skyport run --sharding` replicas from outside: who holds which shard (from
//! the shard Leases, polled), the SQS writes each replica logged, and the audit of those writes
//! against the holders: a steal is a write by a replica that did not hold the Queue's shard then.
//! Shared by tests/shards.rs and benches/replicas.rs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams};
use serde_json::Value;

/// Shard → live holder, as the shard Leases say at one moment.
pub type Holders = BTreeMap<String, String>;
/// Who held which shard, as polled over time (in time order).
pub type History = Arc<Mutex<Vec<(Timestamp, Holders)>>>;

/// The live holders of the shard Leases of group `group` (`--lease-name`).
pub async fn holders(leases: &Api<Lease>, group: &str) -> Option<Holders> {
    let selector = format!("skyport.dev/lease-group={group},skyport.dev/lease-role=shard");
    let listed = leases.list(&ListParams::default().labels(&selector)).await.ok()?;
    let now = Timestamp::now();
    let live = |l: &Lease| {
        let spec = l.spec.as_ref()?;
        let renewed = spec.renew_time.as_ref()?.0;
        let until = renewed.checked_add(SignedDuration::from_secs(spec.lease_duration_seconds?.into())).ok()?;
        (now < until).then(|| spec.holder_identity.clone()).flatten()
    };
    Some(
        listed
            .items
            .iter()
            .filter_map(|l| Some((l.metadata.annotations.as_ref()?.get("skyport.dev/shard")?.clone(), live(l)?)))
            .collect(),
    )
}

/// Records the holders every 100 ms until the task is aborted.
pub fn watch_holders(leases: Api<Lease>, group: &str) -> (History, tokio::task::JoinHandle<()>) {
    let history: History = Arc::default();
    let (sink, group) = (history.clone(), group.to_string());
    let task = tokio::spawn(async move {
        loop {
            let before = Timestamp::now();
            if let Some(h) = holders(&leases, &group).await {
                sink.lock().unwrap().push((before, h));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (history, task)
}

/// Whether `who` held `shard` around `at`: per the last look before it or the first after it.
pub fn held_at(history: &[(Timestamp, Holders)], shard: &str, who: &str, at: Timestamp) -> bool {
    let first_after = history.partition_point(|(t, _)| *t < at);
    let before = first_after.checked_sub(1).and_then(|i| history.get(i));
    let after = history.get(first_after);
    [before, after].into_iter().flatten().any(|(_, h)| h.get(shard).map(String::as_str) == Some(who))
}

/// The replica's identity, once its log says it holds shard Leases.
pub fn identity(logs: &[Value]) -> Option<String> {
    logs.iter().find_map(|l| {
        (l["message"] == "sharding: holding shard Leases").then(|| l["identity"].as_str().unwrap().to_string())
    })
}

/// One SQS write a replica logged.
#[derive(Debug, Clone)]
pub struct Write {
    pub at: Timestamp,
    /// The Queue's name.
    pub queue: String,
    /// The log message: created, updated or deleted SQS queue.
    pub what: String,
}

/// The SQS writes in a replica's JSON log lines.
pub fn writes(logs: &[Value]) -> Vec<Write> {
    let kinds = ["created SQS queue", "updated SQS queue", "deleted SQS queue"];
    logs.iter()
        .filter(|l| l["message"].as_str().is_some_and(|m| kinds.contains(&m)))
        .map(|l| Write {
            at: l["timestamp"].as_str().unwrap().parse().unwrap(),
            queue: l["name"].as_str().unwrap().to_string(),
            what: l["message"].as_str().unwrap().to_string(),
        })
        .collect()
}

/// Every replica's writes held against the shard holders.
#[derive(Debug, Default)]
pub struct Audit {
    /// Writes by a replica not holding the Queue's shard then.
    pub steals: Vec<String>,
    /// How often each (Queue, kind of write) happened, over all replicas.
    pub per_queue: BTreeMap<(String, String), usize>,
    pub written: usize,
}

/// `by`: (replica identity, its writes); `shard_of`: the shard of a Queue, by name.
pub fn audit(
    history: &[(Timestamp, Holders)],
    by: &[(String, Vec<Write>)],
    shard_of: impl Fn(&str) -> String,
) -> Audit {
    let mut a = Audit::default();
    for (who, writes) in by {
        for w in writes {
            if !held_at(history, &shard_of(&w.queue), who, w.at) {
                a.steals.push(format!("{who} {} {} at {}", w.what, w.queue, w.at));
            }
            *a.per_queue.entry((w.queue.clone(), w.what.clone())).or_default() += 1;
            a.written += 1;
        }
    }
    a
}

impl Audit {
    /// (Queue, kind) written more often than `expected` says.
    pub fn doubles(&self, expected: impl Fn(&str, &str) -> usize) -> Vec<(&(String, String), &usize)> {
        self.per_queue.iter().filter(|((q, what), n)| **n > expected(q, what)).collect()
    }
}
