//! Scenario 1, time to Ready: N Queues created at once, skyport against a baseline that makes
//! only the minimal calls per Queue with the same clients, governor and concurrency.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::channel::mpsc;
use kube::ResourceExt;
use kube::api::Api;
use providers::{QueueBackend, SqsProvider, SqsSettings};
use skyport::config::QueueArgs;
use skyport::crd::Queue;

use crate::harness::{Bench, CREATE_CONCURRENCY, Operator, provider, sqs_settings};
use crate::minimal::make_ready;
use crate::options::Opts;
use crate::profile;
use crate::ready_watch::ReadyWatch;
use crate::stats::{median, secs};

struct Arm {
    wall: Duration,
    sqs_calls: u64,
    api_writes: u64,
    cpu: String,
    profile: BTreeMap<String, (u64, Duration)>,
}

pub(crate) fn ready_timeout(n: usize, rate: u32) -> Duration {
    // Generous: only a stuck controller takes this long (3 SQS calls per new Queue).
    Duration::from_secs(180)
        + Duration::from_secs_f64(6.0 * n as f64 / rate as f64)
        + Duration::from_millis(200) * n as u32
}

impl Bench {
    async fn arm_skyport(
        &self,
        n: usize,
        concurrency: u16,
        sqs: Arc<SqsProvider>,
        aws: SqsSettings,
    ) -> anyhow::Result<Arm> {
        let rate = aws.rate_per_second.get();
        let ns = self.namespace("ready-skyport").await?;
        progress!("skyport arm, N = {n}, namespace {ns}: starting the controller");
        let settings = QueueArgs { concurrency, ..Default::default() };
        let op = Operator::start(self.kube.clone(), sqs.clone(), aws, settings, &ns).await;
        progress!("controller started");
        let mut watch = ReadyWatch::start(Api::namespaced(self.driver.clone(), &ns)).await?;
        progress!("watch synced; creating {n} Queues");
        let (calls0, writes0, cpu0) = (sqs.limiter().counters.total(), op.ctx.api_writes.get(), self.procs.snapshot());
        profile::take();
        let t0 = Instant::now();
        self.create_queues(&ns, 0..n, None).await?;
        let done = watch.all_ready(n, ready_timeout(n, rate)).await;
        let (calls, writes, cpu) = (sqs.limiter().counters.total(), op.ctx.api_writes.get(), self.procs.snapshot());
        let profile = profile::take();
        drop(watch);
        op.stop().await;
        self.cleanup(&ns).await?;
        let wall = done? - t0;
        Ok(Arm {
            wall,
            sqs_calls: calls - calls0,
            api_writes: writes - writes0,
            cpu: self.procs.describe(&cpu0, &cpu, wall),
            profile,
        })
    }

    /// The minimal work per Queue, with the operator's kube client and SQS provider: finalizer
    /// patch, CreateQueue, status patch; `concurrency` Queues at a time, fed as they are created.
    async fn arm_baseline(&self, n: usize, concurrency: u16, sqs: Arc<SqsProvider>, rate: u32) -> anyhow::Result<Arm> {
        let ns = self.namespace("ready-baseline").await?;
        progress!("baseline arm, N = {n}, namespace {ns}");
        let mut watch = ReadyWatch::start(Api::namespaced(self.driver.clone(), &ns)).await?;
        let api: Api<Queue> = Api::namespaced(self.kube.clone(), &ns);
        let writes = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::unbounded::<Queue>();
        let worker = {
            let (sqs, writes, errors) = (sqs.clone(), writes.clone(), errors.clone());
            tokio::spawn(rx.for_each_concurrent(concurrency as usize, move |q| {
                let (api, sqs, writes, errors) = (api.clone(), sqs.clone(), writes.clone(), errors.clone());
                async move {
                    // Retried like a controller would, so a hiccup costs time instead of the run.
                    for attempt in 0..5 {
                        match make_ready(&api, sqs.as_ref(), &q, &writes).await {
                            Ok(()) => return,
                            Err(e) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                if attempt == 4 {
                                    println!("  baseline: giving up on {}: {e:#}", q.name_any());
                                }
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                        }
                    }
                }
            }))
        };
        let (calls0, cpu0) = (sqs.limiter().counters.total(), self.procs.snapshot());
        profile::take();
        let t0 = Instant::now();
        self.create_queues(&ns, 0..n, Some(tx)).await?;
        let done = watch.all_ready(n, ready_timeout(n, rate)).await;
        let (calls, cpu) = (sqs.limiter().counters.total(), self.procs.snapshot());
        let profile = profile::take();
        drop(watch);
        let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
        let errors = errors.load(Ordering::Relaxed);
        if errors > 0 {
            println!("  baseline: {errors} failed attempts (retried)");
        }
        self.cleanup(&ns).await?;
        let wall = done? - t0;
        Ok(Arm {
            wall,
            sqs_calls: calls - calls0,
            api_writes: writes.load(Ordering::Relaxed),
            cpu: self.procs.describe(&cpu0, &cpu, wall),
            profile,
        })
    }

    pub(crate) async fn time_to_ready(&self, o: &Opts) -> anyhow::Result<()> {
        println!("\n== 1. time to Ready: N Queues created at once, skyport vs minimal baseline");
        println!(
            "   both arms: same kube Client, same SqsProvider (same governor), concurrency {}; Queues created {} at a time",
            o.concurrency, CREATE_CONCURRENCY
        );
        for &governor in &o.governors {
            let (rate, burst, tags) = governor.settings();
            let sqs = provider(rate, burst, tags).await;
            for &n in &o.ready_n {
                println!("\n-- N = {n}, {}, {} run(s)", governor.describe(), o.runs);
                let (mut s_wall, mut b_wall, mut ratios) = (vec![], vec![], vec![]);
                for run in 0..o.runs {
                    // Alternate which arm goes first, so slow drift of the machine cancels out.
                    let refill = Duration::from_secs_f64(burst as f64 / rate as f64 + 1.0).min(Duration::from_secs(5));
                    let (s, b) = if run % 2 == 0 {
                        let b = self.arm_baseline(n, o.concurrency, sqs.clone(), rate).await?;
                        tokio::time::sleep(refill).await;
                        (self.arm_skyport(n, o.concurrency, sqs.clone(), sqs_settings(rate, burst, tags)).await?, b)
                    } else {
                        let s =
                            self.arm_skyport(n, o.concurrency, sqs.clone(), sqs_settings(rate, burst, tags)).await?;
                        tokio::time::sleep(refill).await;
                        (s, self.arm_baseline(n, o.concurrency, sqs.clone(), rate).await?)
                    };
                    tokio::time::sleep(refill).await;
                    let ratio = secs(s.wall) / secs(b.wall);
                    println!(
                        "   run {}: skyport {:7.2} s, baseline {:7.2} s, ratio {:.2}",
                        run + 1,
                        secs(s.wall),
                        secs(b.wall),
                        ratio
                    );
                    for (name, arm) in [("skyport", &s), ("baseline", &b)] {
                        println!(
                            "     {name:<8} per Queue until all Ready: {:.2} SQS calls, {:.2} API writes; CPU: {}",
                            arm.sqs_calls as f64 / n as f64,
                            arm.api_writes as f64 / n as f64,
                            arm.cpu
                        );
                    }
                    if o.profile {
                        profile::print("skyport", n, &s.profile);
                        profile::print("baseline", n, &b.profile);
                    }
                    s_wall.push(secs(s.wall));
                    b_wall.push(secs(b.wall));
                    ratios.push(ratio);
                }
                let r = median(&ratios);
                println!(
                    "   median: skyport {:.2} s, baseline {:.2} s, ratio {:.2} (runs: {}) -> target <= 1.25: {}",
                    median(&s_wall),
                    median(&b_wall),
                    r,
                    ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(" "),
                    if r <= 1.25 { "met" } else { "MISSED" }
                );
                println!(
                    "   throughput: skyport {:.1} Queues/s, baseline {:.1} Queues/s",
                    n as f64 / median(&s_wall),
                    n as f64 / median(&b_wall)
                );
            }
        }
        Ok(())
    }
}
