//! Scenario 2, steady state: API-server writes and SQS calls of Ready Queues over several
//! resyncs, then an operator restart under the default governor; drift (scenario 3) runs in
//! between, on the same Queues.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use providers::sqs::{Attributes, Tags};
use providers::{Limiter, QueueBackend, QueueError, SqsProvider};
use skyport::config::QueueArgs;
use skyport::crd::Queue;

use crate::budget::{Sampler, budget};
use crate::harness::{Bench, Operator, provider, sqs_settings};
use crate::options::{Governor, Opts};
use crate::ready_watch::ReadyWatch;
use crate::stats::{median, percentile, secs};
use crate::time_to_ready::ready_timeout;

/// Delegates to the real provider (same limiter, same counters) and counts calls per queue
/// (URL, or name for the calls that take one), to show the distribution over Queues.
struct PerQueue {
    inner: Arc<SqsProvider>,
    calls: Mutex<HashMap<String, u64>>,
}

impl PerQueue {
    fn count(&self, key: &str) {
        let key = key.rsplit('/').next().unwrap_or(key).to_string();
        *self.calls.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_default() += 1;
    }
    fn snapshot(&self) -> HashMap<String, u64> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl QueueBackend for PerQueue {
    async fn queue_url(&self, name: &str) -> Result<Option<String>, QueueError> {
        self.count(name);
        self.inner.queue_url(name).await
    }
    async fn create_queue(&self, name: &str, attributes: &Attributes, tags: &Tags) -> Result<String, QueueError> {
        self.count(name);
        self.inner.create_queue(name, attributes, tags).await
    }
    async fn attributes(&self, url: &str) -> Result<Option<Attributes>, QueueError> {
        self.count(url);
        self.inner.attributes(url).await
    }
    async fn set_attributes(&self, url: &str, attributes: &Attributes) -> Result<(), QueueError> {
        self.count(url);
        self.inner.set_attributes(url, attributes).await
    }
    async fn tags(&self, url: &str) -> Result<Tags, QueueError> {
        self.count(url);
        self.inner.tags(url).await
    }
    async fn tag(&self, url: &str, tags: &Tags) -> Result<(), QueueError> {
        self.count(url);
        self.inner.tag(url, tags).await
    }
    async fn untag(&self, url: &str, keys: &[String]) -> Result<(), QueueError> {
        self.count(url);
        self.inner.untag(url, keys).await
    }
    async fn delete_queue(&self, url: &str) -> Result<(), QueueError> {
        self.count(url);
        self.inner.delete_queue(url).await
    }
    fn limiter(&self) -> &Limiter {
        self.inner.limiter()
    }
    fn region(&self) -> Option<String> {
        self.inner.region()
    }
}

type Versions = HashMap<String, Option<String>>;

async fn versions_of<K>(api: Api<K>) -> anyhow::Result<Versions>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api.list(&ListParams::default()).await?;
    Ok(list.items.iter().map(|o| (o.name_any(), o.resource_version())).collect())
}

/// How many objects of `after` are new or have another resourceVersion than in `before`.
fn changed(before: &Versions, after: &Versions) -> usize {
    after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).count()
}

impl Bench {
    pub(crate) async fn steady_and_drift(&self, o: &Opts, drift: bool) -> anyhow::Result<()> {
        let m = o.steady_n;
        // A governor that does not bind: the steady state needs m / resync calls per second.
        let rate = ((3.0 * m as f64 / secs(o.resync)).ceil() as u32).max(50);
        println!("\n== 2. steady state: {m} Ready Queues, resync {:?}, {} periods", o.resync, o.periods);
        println!("   governor {rate}/s, burst {rate} (3x the expected need); concurrency {}", o.concurrency);
        let ns = self.namespace("steady").await?;
        let real = provider(rate, rate, rate).await;
        let per_queue = Arc::new(PerQueue { inner: real.clone(), calls: Mutex::default() });
        let settings = QueueArgs { resync: o.resync, concurrency: o.concurrency, ..Default::default() };
        let op = Operator::start(
            self.kube.clone(),
            per_queue.clone(),
            sqs_settings(rate, rate, rate),
            settings.clone(),
            &ns,
        )
        .await;
        let mut watch = ReadyWatch::start(Api::namespaced(self.driver.clone(), &ns)).await?;
        let t0 = Instant::now();
        self.create_queues(&ns, 0..m, None).await?;
        let all = watch.all_ready(m, ready_timeout(m, rate)).await?;
        println!("   {m} Queues Ready after {:.1} s; settling for 2 resyncs", secs(all - t0));
        tokio::time::sleep(o.resync * 2).await;

        let (q_rv0, cm_rv0) = self.versions(&ns).await?;
        let (writes0, ops0, per0) = (op.ctx.api_writes.get(), real.limiter().counters.snapshot(), per_queue.snapshot());
        let reconciles0 = op.ctx.metrics.reconciles();
        let sampler = Sampler::start(per_queue.clone());
        let window = o.resync * o.periods;
        tokio::time::sleep(window).await;
        let samples = sampler.finish().await;
        let (writes1, ops1, per1) = (op.ctx.api_writes.get(), real.limiter().counters.snapshot(), per_queue.snapshot());
        let reconciles = op.ctx.metrics.reconciles() - reconciles0;
        let (q_rv1, cm_rv1) = self.versions(&ns).await?;

        let writes = writes1 - writes0;
        let delta: BTreeMap<&str, u64> =
            ops1.iter().map(|(k, v)| (*k, v - ops0.get(k).copied().unwrap_or(0))).filter(|(_, v)| *v > 0).collect();
        let total: u64 = delta.values().sum();
        let per_resync = total as f64 / (m as f64 * o.periods as f64);
        let per_q: Vec<f64> = per1
            .iter()
            .filter(|(k, _)| k.starts_with(&ns))
            .map(|(k, v)| (v - per0.get(k).copied().unwrap_or(0)) as f64 / o.periods as f64)
            .collect();
        println!("   over {:.0} s ({} resyncs):", secs(window), o.periods);
        println!(
            "   API-server writes: {writes} (counter); objects whose resourceVersion changed: {} Queues, {} ConfigMaps -> target 0: {}",
            changed(&q_rv0, &q_rv1),
            changed(&cm_rv0, &cm_rv1),
            if writes == 0 { "met" } else { "MISSED" }
        );
        println!("   SQS calls: {total} {delta:?}");
        let per_reconcile = total as f64 / reconciles.max(1) as f64;
        println!(
            "   SQS calls per reconcile: {per_reconcile:.3} ({reconciles} reconciles) -> target <= 1: {}",
            if per_reconcile <= 1.0 { "met" } else { "MISSED" }
        );
        println!(
            "   SQS calls per Queue per nominal resync period: {per_resync:.3} (per Queue: min {:.2}, median {:.2}, max {:.2})",
            percentile(&per_q, 0.0),
            median(&per_q),
            percentile(&per_q, 1.0),
        );
        println!(
            "   (each resync is shortened by up to 10% at random, so about 1/0.95 = 1.05 reads per nominal period is one per resync)"
        );
        let b = budget(&samples, rate as f64, rate as f64);
        self.print_budget(&b, rate, rate);

        if drift {
            self.drift(o, &ns, &watch).await?;
        }

        // Restart under skyport's default governor: every Queue is reconciled at once (its tags
        // are due after a restart), which is what the governor is for.
        let (d_rate, d_burst, d_tags) = Governor::Default.settings();
        println!(
            "\n-- operator restart with the {m} Ready Queues, under the {}: {:.0} s window",
            Governor::Default.describe(),
            secs(o.budget_window)
        );
        op.stop().await;
        let ((q_rv0, cm_rv0), events0) = (self.versions(&ns).await?, self.events(&ns).await?);
        let limited = provider(d_rate, d_burst, d_tags).await;
        let sampler = Sampler::start(limited.clone());
        let op =
            Operator::start(self.kube.clone(), limited.clone(), sqs_settings(d_rate, d_burst, d_tags), settings, &ns)
                .await;
        tokio::time::sleep(o.budget_window).await;
        let samples = sampler.finish().await;
        let b = budget(&samples, d_rate as f64, d_burst as f64);
        let ((q_rv1, cm_rv1), events1) = (self.versions(&ns).await?, self.events(&ns).await?);
        let events: BTreeMap<&String, u64> = events1
            .iter()
            .map(|(reason, n)| (reason, n - events0.get(reason).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect();
        let writes = op.ctx.api_writes.get();
        println!(
            "   API-server writes during the restart: {writes} (counter; objects whose resourceVersion changed: {} Queues, {} ConfigMaps; Events {events:?}) -> target 0: {}",
            changed(&q_rv0, &q_rv1),
            changed(&cm_rv0, &cm_rv1),
            if writes == 0 { "met" } else { "MISSED" }
        );
        println!("   SQS calls {:?}", limited.limiter().counters.snapshot());
        self.print_budget(&b, d_rate, d_burst);
        let (waits, waited) = limited.limiter().counters.waits();
        println!("   governor waits: {waits} calls waited, {:.1} s in total", secs(waited));
        op.stop().await;
        drop(watch);
        self.cleanup(&ns).await
    }

    /// resourceVersion per Queue and per ConfigMap in `ns`.
    async fn versions(&self, ns: &str) -> anyhow::Result<(Versions, Versions)> {
        let queues = versions_of(Api::<Queue>::namespaced(self.driver.clone(), ns)).await?;
        Ok((queues, versions_of(Api::<ConfigMap>::namespaced(self.driver.clone(), ns)).await?))
    }

    /// Events in `ns` by reason, a series counted as its repeats.
    async fn events(&self, ns: &str) -> anyhow::Result<BTreeMap<String, u64>> {
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(self.driver.clone(), ns);
        let mut by_reason = BTreeMap::new();
        for e in api.list(&ListParams::default()).await?.items {
            let n = e.series.as_ref().map_or(1, |s| u64::try_from(s.count).unwrap_or(1));
            *by_reason.entry(e.reason.unwrap_or_default()).or_insert(0) += n;
        }
        Ok(by_reason)
    }
}
