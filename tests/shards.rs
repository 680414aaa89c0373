//! Several active replicas (`skyport run --sharding`): three processes share Queues of three
//! AwsAccounts and of the default account (four shards, LocalStack assuming the roles). Every
//! Queue gets Ready; each shard is held by one replica; one replica is killed (-9) while every
//! Queue's spec is edited and more are created; its shards move to the others within a Lease
//! duration (plus a round); and no SQS write was made by a replica that did not hold the shard
//! then (a steal), nor was any queue created or updated twice (a double write). The figures are
//! printed.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::process::{Lines, spawn_operator};
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use skyport::crd::{AwsAccount, ConditionStatus, Queue};
use tokio::process::Child;

const LEASE_DURATION: Duration = Duration::from_secs(6);
const TIMEOUT: Duration = Duration::from_secs(120);
const ACCOUNTS: [(&str, &str); 3] = [
    ("alpha", "arn:aws:iam::000000000031:role/shards"),
    ("beta", "arn:aws:iam::000000000032:role/shards"),
    ("gamma", "arn:aws:iam::000000000033:role/shards"),
];
const PER_SHARD: usize = 4;

/// One `skyport run --sharding` process.
struct Replica {
    child: Child,
    lines: Lines,
    identity: String,
}

/// When the test fails: what each replica said about its shards, and its warnings.
impl Drop for Replica {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for l in self.logs() {
            let message = l["message"].as_str().unwrap_or_default();
            if l["level"] != "INFO" || message.contains("shard") || message.contains("exiting") {
                eprintln!("{}: {l}", self.identity);
            }
        }
    }
}

impl Replica {
    async fn start(ns: &str) -> Replica {
        let duration = format!("--lease-duration={}s", LEASE_DURATION.as_secs());
        let args = [
            "--namespace",
            ns,
            "--log-format",
            "json",
            "--listen-address",
            "127.0.0.1:0",
            "--sharding",
            "--lease-namespace",
            ns,
            "--lease-name",
            "shards",
            &duration,
            "--queue-resync",
            "2s",
            "--error-backoff-min",
            "200ms",
            "--error-backoff-max",
            "2s",
        ];
        let lines = Lines::default();
        let child = spawn_operator(&args, &[("RUST_LOG", "info")], &lines);
        let mut replica = Replica { child, lines, identity: String::new() };
        replica.identity = eventually("the replica's identity", TIMEOUT, || async {
            replica.logs().iter().find_map(|l| {
                (l["message"] == "sharding: holding shard Leases").then(|| l["identity"].as_str().unwrap().to_string())
            })
        })
        .await;
        replica
    }

    fn logs(&self) -> Vec<Value> {
        let lines = self.lines.lock().unwrap();
        lines.iter().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// SQS writes it logged: (time, Queue name, what).
    fn writes(&self) -> Vec<(Timestamp, String, String)> {
        let writes = ["created SQS queue", "updated SQS queue", "deleted SQS queue"];
        self.logs()
            .into_iter()
            .filter(|l| l["message"].as_str().is_some_and(|m| writes.contains(&m)))
            .map(|l| {
                let at = l["timestamp"].as_str().unwrap().parse().unwrap();
                (at, l["name"].as_str().unwrap().to_string(), l["message"].as_str().unwrap().to_string())
            })
            .collect()
    }
}

/// Shard → live holder, as the shard Leases say at one moment.
type Holders = BTreeMap<String, String>;
/// Who held which shard, as polled over time.
type History = Arc<Mutex<Vec<(Timestamp, Holders)>>>;

async fn holders(leases: &Api<Lease>) -> Option<Holders> {
    let selector = "skyport.dev/lease-group=shards,skyport.dev/lease-role=shard";
    let listed = leases.list(&ListParams::default().labels(selector)).await.ok()?;
    let now = Timestamp::now();
    let live = |l: &Lease| {
        let spec = l.spec.as_ref()?;
        let renewed = spec.renew_time.as_ref()?.0;
        let until = renewed
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(spec.lease_duration_seconds?.into()))
            .ok()?;
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

/// Records the shard holders every 100 ms until dropped.
fn watch_holders(leases: Api<Lease>) -> (History, tokio::task::JoinHandle<()>) {
    let history: History = Arc::default();
    let sink = history.clone();
    let task = tokio::spawn(async move {
        loop {
            let before = Timestamp::now();
            if let Some(h) = holders(&leases).await {
                sink.lock().unwrap().push((before, h));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (history, task)
}

/// Whether `who` held `shard` around `at`: per the last look before it or the first after it.
fn held_at(history: &[(Timestamp, Holders)], shard: &str, who: &str, at: Timestamp) -> bool {
    let before = history.iter().rev().find(|(t, _)| *t <= at);
    let after = history.iter().find(|(t, _)| *t >= at);
    [before, after].into_iter().flatten().any(|(_, h)| h.get(shard).map(String::as_str) == Some(who))
}

/// The shard of a Queue of this test, by its name's prefix.
fn shard_of(ns: &str, queue: &str) -> String {
    match queue.split('-').next().unwrap() {
        "default" => "default".to_string(),
        account => format!("account.{ns}.{account}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn three_replicas_share_the_accounts_and_a_killed_ones_shards_move_without_double_writes() {
    let ns = TestNs::new("shards").await;
    let accounts: Api<AwsAccount> = ns.api();
    for (name, role) in ACCOUNTS {
        let account = json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "AwsAccount", "metadata": {"name": name},
                             "spec": {"roleArn": role, "region": "us-east-1"}});
        accounts.create(&PostParams::default(), &serde_json::from_value(account).unwrap()).await.unwrap();
    }
    let leases: Api<Lease> = ns.api();
    let (history, poller) = watch_holders(leases.clone());
    let mut replicas =
        vec![Replica::start(&ns.name).await, Replica::start(&ns.name).await, Replica::start(&ns.name).await];

    let queues: Api<Queue> = ns.api();
    let prefixes: Vec<&str> = ACCOUNTS.iter().map(|(a, _)| *a).chain(["default"]).collect();
    let spec = |prefix: &str, delay: u32| match prefix {
        "default" => json!({"delaySeconds": delay}),
        account => json!({"accountRef": {"name": account}, "delaySeconds": delay}),
    };
    let mut names = Vec::new();
    for prefix in &prefixes {
        for i in 0..PER_SHARD {
            let name = format!("{prefix}-{i}");
            queues.create(&PostParams::default(), &queue(&name, spec(prefix, 1))).await.unwrap();
            names.push(name);
        }
    }
    for name in &names {
        wait_ready(&queues, name, ConditionStatus::True, "Available", TIMEOUT).await;
    }
    // Each of the four shards held by one replica; three replicas: at most two each.
    let held = eventually("every shard held", TIMEOUT, || async {
        let h = holders(&leases).await?;
        (h.len() == prefixes.len()).then_some(h)
    })
    .await;
    let mut per_replica: BTreeMap<&str, usize> = BTreeMap::new();
    for holder in held.values() {
        *per_replica.entry(holder.as_str()).or_default() += 1;
    }
    assert!(per_replica.values().all(|n| *n <= 2), "fair share of 4 shards over 3 replicas: {held:?}");

    // Churn: every spec edited and new Queues made; the replica holding most shards killed.
    let victim =
        replicas.iter().position(|r| per_replica.get(r.identity.as_str()) == per_replica.values().max()).unwrap();
    let lost: Vec<String> =
        held.iter().filter(|(_, h)| **h == replicas[victim].identity).map(|(s, _)| s.clone()).collect();
    for name in &names {
        let patch = json!({"spec": {"delaySeconds": 2}});
        queues.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    }
    let mut dead = replicas.remove(victim);
    dead.child.start_kill().unwrap();
    let killed = Instant::now();
    dead.child.wait().await.unwrap();
    for prefix in &prefixes {
        let name = format!("{prefix}-new");
        queues.create(&PostParams::default(), &queue(&name, spec(prefix, 2))).await.unwrap();
        names.push(name);
    }
    eventually("the killed replica's shards held by the others", TIMEOUT, || async {
        let h = holders(&leases).await?;
        lost.iter().all(|s| h.get(s).is_some_and(|who| replicas.iter().any(|r| r.identity == *who))).then_some(())
    })
    .await;
    let takeover = killed.elapsed();
    for name in &names {
        let q = wait_ready(&queues, name, ConditionStatus::True, "Available", TIMEOUT).await;
        let url = q.status.as_ref().and_then(|s| s.queue_url.clone()).expect("queue URL");
        let sqs = match ACCOUNTS.iter().find(|(a, _)| name.starts_with(a)) {
            Some((_, role)) => common::sts::sqs_as(role, "us-east-1").await,
            None => sqs().await,
        };
        eventually(&format!("{name} delayed 2 s in SQS"), TIMEOUT, || async {
            (attributes(&sqs, &url).await.get("DelaySeconds").map(String::as_str) == Some("2")).then_some(())
        })
        .await;
    }
    poller.abort();

    // Steals: an SQS write by a replica that did not hold the Queue's shard then. Double writes:
    // a queue created, or updated for the one edit, more than once.
    let history = history.lock().unwrap().clone();
    let mut all = vec![(dead.identity.clone(), dead.writes())];
    all.extend(replicas.iter().map(|r| (r.identity.clone(), r.writes())));
    let (mut steals, mut per_queue) = (Vec::new(), BTreeMap::<(String, String), usize>::new());
    for (who, writes) in &all {
        for (at, name, what) in writes {
            let shard = shard_of(&ns.name, name);
            if !held_at(&history, &shard, who, *at) {
                steals.push(format!("{who} {what} {name} at {at}"));
            }
            *per_queue.entry((name.clone(), what.clone())).or_default() += 1;
        }
    }
    let doubles: Vec<_> = per_queue.iter().filter(|(_, n)| **n > 1).collect();
    let written: usize = all.iter().map(|(_, w)| w.len()).sum();
    println!(
        "shards: {} Queues in {} shards over 3 replicas, one killed during churn; its {} shards moved in {takeover:?} \
         (lease {LEASE_DURATION:?}); {written} SQS writes, {} steals, {} double writes",
        names.len(),
        prefixes.len(),
        lost.len(),
        steals.len(),
        doubles.len()
    );
    assert!(takeover <= LEASE_DURATION + Duration::from_secs(5), "shards moved after {takeover:?}");
    assert!(steals.is_empty(), "writes by a replica not holding the shard: {steals:#?}");
    assert!(doubles.is_empty(), "queues written twice: {doubles:?}");
    assert_eq!(per_queue.keys().filter(|(_, w)| w == "created SQS queue").count(), names.len(), "{per_queue:?}");

    for name in &names {
        queues.delete(name, &Default::default()).await.unwrap();
    }
    for name in &names {
        wait_gone(&queues, name, TIMEOUT).await;
    }
    for r in &replicas {
        assert_eq!(common::process::panics(&r.lines), 0);
        let pid = r.child.id().expect("running").to_string();
        let _ = tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await;
    }
    for r in &mut replicas {
        let status = tokio::time::timeout(Duration::from_secs(20), r.child.wait()).await.expect("exit").unwrap();
        assert!(status.success(), "{status:?}");
    }
    let left = holders(&leases).await.unwrap_or_default();
    assert!(left.is_empty(), "a stopped replica releases its shards: {left:?}");
    ns.cleanup().await;
}
