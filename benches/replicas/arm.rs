//! One arm: R replicas against a fresh [`World`]; the Queues created and timed until all are
//! Ready, the steady state counted at the proxies, K queues deleted out of band and timed until
//! recreated, one replica killed (-9) and timed until its shards are held and its Queues acted
//! on again, and every replica's SQS writes audited against the shard Leases.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams};
use skyport::crd::ConditionStatus;

use crate::common::shards::{self, holders, watch_holders};
use crate::options::Opts;
use crate::ready_watch::ReadyWatch;
use crate::replica::Replica;
use crate::stats;
use crate::world::{GROUP, World, queue_name};

#[derive(Debug, Default, Clone)]
pub(crate) struct Figures {
    pub(crate) replicas: usize,
    pub(crate) ready_s: f64,
    /// SQS calls through the proxies until all were Ready, per Queue.
    pub(crate) calls_per_queue: f64,
    /// Per account: steady-state SQS calls per second, and how many of them were throttled.
    pub(crate) steady: Vec<(f64, usize)>,
    pub(crate) peak_mib: Vec<f64>,
    /// Seconds from the out-of-band deletion until each queue existed again.
    pub(crate) drift: Vec<f64>,
    /// The killed replica's shards; seconds until held by the others; until a Queue created in
    /// each of them after the kill was Ready.
    pub(crate) lost: usize,
    pub(crate) takeover_s: Option<f64>,
    pub(crate) acted_s: Option<f64>,
    pub(crate) written: usize,
    pub(crate) steals: Vec<String>,
    pub(crate) doubles: Vec<String>,
    /// Events from an operator that refuses the proxies' `http://` endpoints: not a replica of
    /// this arm (a cluster-wide `skyport run` on the same environment), so the figures are off.
    pub(crate) foreign: usize,
}

/// Runs the arm with `n` replicas; cleans up whatever happens.
pub(crate) async fn run(driver: Client, o: &Opts, n: usize) -> anyhow::Result<Figures> {
    let world = World::new(driver, &format!("r{n}"), o.accounts).await?;
    let mut replicas = vec![];
    let mut f = Figures { replicas: n, ..Default::default() };
    let result = measure(&world, o, &mut replicas, &mut f).await;
    for r in &mut replicas {
        if let Err(e) = r.stop().await {
            progress!("{e:#}");
        }
        if r.panics() > 0 {
            progress!("replica {} panicked: {}", r.identity, r.tail(20));
        }
    }
    f.peak_mib = replicas.iter().map(|r| stats::mib(r.peak_kib)).collect();
    if let Err(e) = &result {
        let tails: Vec<String> = replicas.iter().map(|r| format!("{}:\n    {}", r.identity, r.tail(8))).collect();
        progress!("arm with {n} replicas failed: {e:#}; replicas' logs end:\n{}", tails.join("\n"));
    }
    let cleaned = world.cleanup().await;
    result?;
    cleaned?;
    Ok(f)
}

async fn measure(w: &World, o: &Opts, replicas: &mut Vec<Replica>, f: &mut Figures) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(w.driver.clone(), &w.ns);
    let (history, poller) = watch_holders(leases.clone(), GROUP);
    for _ in 0..f.replicas {
        replicas.push(Replica::start(&w.ns, &o.skyport_args).await?);
    }
    balanced(w, &leases, replicas).await?;
    let mut watch = ReadyWatch::start(w.queues()).await?;
    let calls0 = w.accounts.iter().map(|a| a.proxy.calls.lock().unwrap().len()).sum::<usize>();
    let t0 = Instant::now();
    w.create(0..o.queues).await?;
    let timeout = Duration::from_secs(600) + Duration::from_millis(100 * o.queues as u64);
    f.ready_s = (watch.all_ready(o.queues, timeout).await? - t0).as_secs_f64();
    let calls1 = w.accounts.iter().map(|a| a.proxy.calls.lock().unwrap().len()).sum::<usize>();
    f.calls_per_queue = (calls1 - calls0) as f64 / o.queues as f64;
    progress!("{} replica(s): {} Queues Ready after {:.1} s", f.replicas, o.queues, f.ready_s);

    steady(w, o, f).await;
    let drifted = drift(w, o, f).await?;
    let mut new = vec![];
    if replicas.len() > 1 {
        new = takeover(w, &leases, &watch, replicas, f).await?;
    }
    for r in replicas.iter_mut() {
        if !r.alive() && !r.killed {
            bail!("replica {} exited: {}", r.identity, r.tail(10));
        }
    }
    poller.abort();
    drop(watch);
    let events: Api<Event> = Api::namespaced(w.driver.clone(), &w.ns);
    let insecure = ListParams::default().fields("reason=InsecureEndpoint");
    f.foreign = events.list_metadata(&insecure).await?.items.len();

    // Steals and double writes, over every replica (the killed one too).
    let history = history.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let writes: Vec<_> = replicas.iter().map(|r| (r.identity.clone(), shards::writes(&r.logs()))).collect();
    let audit = shards::audit(&history, &writes, |q| w.shard_of(q));
    // A queue deleted out of band is created a second time (`recreated`); nothing else twice.
    let expected = |q: &str, what: &str| if what == "created SQS queue" && drifted.contains(q) { 2 } else { 1 };
    f.doubles = audit.doubles(expected).iter().map(|((q, what), n)| format!("{q}: {what} x{n}")).collect();
    (f.written, f.steals) = (audit.written, audit.steals.clone());
    let created = audit.per_queue.keys().filter(|(_, what)| what == "created SQS queue").count();
    if created != o.queues + new.len() {
        bail!("{created} queues created per the replicas' logs, for {} Queues", o.queues + new.len());
    }
    Ok(())
}

/// Waits until every account's shard is held and no replica holds more than its fair share of
/// the shards there are (the accounts', the default one, Tunnels').
async fn balanced(w: &World, leases: &Api<Lease>, replicas: &[Replica]) -> anyhow::Result<()> {
    for _ in 0..1200 {
        if let Some(h) = holders(leases, GROUP).await {
            let share = h.len().div_ceil(replicas.len());
            let most = replicas.iter().map(|r| h.values().filter(|who| **who == r.identity).count()).max();
            let every = w.accounts.iter().all(|a| h.contains_key(&w.shard_of(&format!("{}-", a.name))));
            if every && most.is_some_and(|m| m <= share) {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the shards were not spread over {} replicas within 120 s", replicas.len())
}

/// SQS calls per second per account over `o.steady`, after everything was Ready.
async fn steady(w: &World, o: &Opts, f: &mut Figures) {
    tokio::time::sleep(Duration::from_secs(10)).await;
    let from = Instant::now();
    tokio::time::sleep(o.steady).await;
    let to = Instant::now();
    for a in &w.accounts {
        let calls = a.proxy.calls.lock().unwrap();
        let window: Vec<_> = calls.iter().filter(|c| c.at >= from && c.at < to).collect();
        let throttled = window.iter().filter(|c| c.fault.is_some()).count();
        f.steady.push((window.len() as f64 / (to - from).as_secs_f64(), throttled));
    }
}

/// Deletes `drift_k` queues (spread over the accounts) behind skyport's back and waits until each
/// exists again; returns their Queue names.
async fn drift(w: &World, o: &Opts, f: &mut Figures) -> anyhow::Result<BTreeSet<String>> {
    let (api, a) = (w.queues(), w.accounts.len());
    let step = (o.queues / o.drift_k.max(1)).max(1);
    let mut victims = vec![];
    for i in (0..o.queues).step_by(step).take(o.drift_k) {
        let name = queue_name(i, a);
        let q = api.get(&name).await?;
        let url = q.status.and_then(|s| s.queue_url).with_context(|| format!("{name} has no queue URL"))?;
        victims.push((name, i % a, url));
    }
    progress!("{} replica(s): deleting {} queues out of band", f.replicas, victims.len());
    let t = Instant::now();
    for (_, j, url) in &victims {
        w.accounts[*j].oob.delete_queue().queue_url(url).send().await?;
    }
    let deadline = t + Duration::from_secs(1800);
    let back = futures::future::join_all(victims.iter().map(|(name, j, url)| async move {
        let sqs_name = url.rsplit('/').next().unwrap_or_default();
        let oob = &w.accounts[*j].oob;
        while Instant::now() < deadline {
            if oob.get_queue_url().queue_name(sqs_name).send().await.is_ok() {
                return Ok(t.elapsed().as_secs_f64());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        bail!("{name}'s queue, deleted out of band, not recreated within 30 minutes")
    }))
    .await;
    f.drift = back.into_iter().collect::<anyhow::Result<_>>()?;
    Ok(victims.into_iter().map(|(name, _, _)| name).collect())
}

/// Kills (-9) the replica holding the most shards; times until its shards are held by the others
/// and until a Queue created in each of them after the kill is Ready. Returns those Queues.
async fn takeover(
    w: &World,
    leases: &Api<Lease>,
    watch: &ReadyWatch,
    replicas: &mut [Replica],
    f: &mut Figures,
) -> anyhow::Result<Vec<String>> {
    let held = holders(leases, GROUP).await.context("listing the shard Leases")?;
    let count = |r: &Replica| held.values().filter(|who| **who == r.identity).count();
    let victim = (0..replicas.len()).max_by_key(|i| count(&replicas[*i])).context("no replica")?;
    let lost: Vec<String> =
        held.iter().filter(|(_, who)| **who == replicas[victim].identity).map(|(s, _)| s.clone()).collect();
    f.lost = lost.len();
    progress!("{} replicas: killing {} (-9), holding {lost:?}", f.replicas, replicas[victim].identity);
    let killed = Instant::now();
    replicas[victim].kill().await?;
    // A Queue in each of its accounts' shards (the default shard has none of the benchmark's).
    let new: Vec<String> = lost
        .iter()
        .filter(|s| s.starts_with("account."))
        .map(|s| format!("{}-new", s.rsplit('.').next().unwrap_or_default()))
        .collect();
    let api = w.queues();
    for name in &new {
        let spec =
            serde_json::json!({"accountRef": {"name": name.trim_end_matches("-new")}, "visibilityTimeoutSeconds": 45});
        api.create(&Default::default(), &crate::common::queue(name, spec)).await?;
    }
    let others: Vec<String> =
        replicas.iter().enumerate().filter(|(i, _)| *i != victim).map(|(_, r)| r.identity.clone()).collect();
    let deadline = killed + Duration::from_secs(300);
    while f.takeover_s.is_none() || f.acted_s.is_none() {
        if Instant::now() > deadline {
            bail!("the killed replica's shards not taken over within 300 s ({f:?})");
        }
        if f.takeover_s.is_none()
            && let Some(h) = holders(leases, GROUP).await
            && lost.iter().all(|s| h.get(s).is_some_and(|who| others.contains(who)))
        {
            f.takeover_s = Some(killed.elapsed().as_secs_f64());
        }
        let ready = |n: &String| watch.history(n).iter().any(|(_, s, _)| *s == ConditionStatus::True);
        if f.acted_s.is_none() && new.iter().all(ready) {
            f.acted_s = Some(killed.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(new)
}
