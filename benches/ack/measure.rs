//! One arm at one N: start the operator in a fresh namespace, create the Queues, wait until all
//! are Ready, idle, delete them, and collect the [`Figures`]; clean up whatever a failed arm left.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::objects::{ReadyWatch, object, resource};
use crate::operators::{Ack, Arm, OperatorProcess};
use crate::options::Opts;
use crate::request_log::{RequestLog, total};
use crate::{progress, sqs_faults};

const CREATE_CONCURRENCY: usize = 32;

/// User + system CPU seconds of a process (USER_HZ = 100).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    Some((f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?) as f64 / 100.0)
}

/// A `Vm*` line of `/proc/<pid>/status`, in MiB.
fn vm_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    kib as f64 / 1024.0
}

#[derive(Debug, Default, Clone)]
pub(crate) struct Figures {
    pub(crate) ready_s: f64,
    pub(crate) create_calls: BTreeMap<String, u64>,
    pub(crate) rss: f64,
    pub(crate) peak: f64,
    pub(crate) idle_cpu_per_min: f64,
    pub(crate) idle_calls: BTreeMap<String, u64>,
    pub(crate) delete_s: f64,
    pub(crate) delete_calls: BTreeMap<String, u64>,
    pub(crate) left_behind: usize,
    /// Requests through the quota proxy until all were Ready, and those it answered
    /// `RequestThrottled`.
    pub(crate) proxied: usize,
    pub(crate) throttled: usize,
}

pub(crate) struct Bench {
    pub(crate) driver: Client,
    pub(crate) oob: aws_sdk_sqs::Client,
    pub(crate) log: RequestLog,
    pub(crate) ack: Option<Ack>,
    pub(crate) quota: Option<sqs_faults::FaultProxy>,
    pub(crate) failures: Mutex<Vec<String>>,
}

impl Bench {
    pub(crate) fn fail(&self, what: String) {
        println!("  BROKEN: {what}");
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).push(what);
    }

    async fn namespace(&self, arm: &str) -> anyhow::Result<String> {
        let name = format!("bench-{arm}-{:08x}", rand::random::<u32>());
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"skyport.dev/bench": "true"}}}))?;
        Api::<Namespace>::all(self.driver.clone()).create(&PostParams::default(), &ns).await?;
        Ok(name)
    }

    /// SQS queue URLs whose name starts with `prefix`. Retried: after minutes of idling, the
    /// first request can meet a pooled connection LocalStack has already closed.
    async fn sqs_queues(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        let mut last = None;
        for _ in 0..3 {
            let mut urls = vec![];
            let mut pages = self.oob.list_queues().queue_name_prefix(prefix).max_results(1000).into_paginator().send();
            let mut failed = None;
            while let Some(page) = pages.next().await {
                match page {
                    Ok(p) => urls.extend(p.queue_urls.unwrap_or_default()),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            match failed {
                None => return Ok(urls),
                Some(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(last.map(anyhow::Error::from).unwrap_or_else(|| anyhow!("ListQueues failed")))
    }

    pub(crate) async fn run_arm(&self, arm: &Arm, n: usize, o: &Opts) -> anyhow::Result<Figures> {
        let ns = self.namespace(arm.key).await?;
        let ar = resource(arm.kind);
        let api: Api<DynamicObject> = Api::namespaced_with(self.driver.clone(), &ns, &ar);
        let proxy = self.quota.as_ref().map(|p| p.url());
        let mut op = OperatorProcess::spawn(arm, &ns, self.ack.as_ref(), &o.skyport_args, proxy.as_deref())?;
        let result = self.measure(arm, n, o, &ns, &ar, &api, &mut op).await;
        op.stop().await;
        if let Err(e) = &result {
            let tail: String = std::fs::read_to_string(&op.log)
                .unwrap_or_default()
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join("\n    ");
            self.fail(format!("{} at N = {n}: {e:#}; operator log {} ends:\n    {tail}", arm.label, op.log.display()));
        }
        self.cleanup(&ns, &api).await;
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn measure(
        &self,
        arm: &Arm,
        n: usize,
        o: &Opts,
        ns: &str,
        ar: &ApiResource,
        api: &Api<DynamicObject>,
        op: &mut OperatorProcess,
    ) -> anyhow::Result<Figures> {
        let mut f = Figures::default();
        // Let the operator start (ACK asks STS who it is, both list their caches) before the clock.
        tokio::time::sleep(Duration::from_secs(if o.quick { 3 } else { 5 })).await;
        if !op.alive() {
            bail!("the operator exited at start");
        }
        let mut watch = ReadyWatch::start(api.clone(), arm.kind).await?;
        let off = self.log.offset();
        let proxied = || {
            self.quota.as_ref().map_or((0, 0), |p| {
                let calls = p.calls();
                (calls.len(), calls.iter().filter(|c| c.fault.is_some()).count())
            })
        };
        let proxied0 = proxied();
        let t0 = Instant::now();
        futures::stream::iter((0..n).map(|i| format!("q-{i:05}")))
            .map(|name| {
                let (api, obj) = (api.clone(), object(arm.kind, ar, ns, &name));
                async move { api.create(&PostParams::default(), &obj).await }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .map_err(anyhow::Error::from)
            .try_for_each(|_| futures::future::ready(Ok(())))
            .await?;
        let timeout = Duration::from_secs(120) + Duration::from_millis(500 * n as u64);
        let done = watch.all_ready(n, timeout).await?;
        f.ready_s = (done - t0).as_secs_f64();
        f.create_calls = self.log.sqs_calls_since(off);
        let proxied1 = proxied();
        (f.proxied, f.throttled) = (proxied1.0 - proxied0.0, proxied1.1 - proxied0.1);
        if total(&f.create_calls) == 0 {
            bail!("LocalStack's log ({}) shows no SQS request: cannot count calls", self.log.0.display());
        }
        progress(&format!("{}: {n} Ready after {:.1} s", arm.label, f.ready_s));

        tokio::time::sleep(Duration::from_secs(5)).await;
        f.rss = vm_mib(op.pid, "VmRSS");
        let off = self.log.offset();
        let cpu0 = cpu_seconds(op.pid).unwrap_or(f64::NAN);
        tokio::time::sleep(o.idle).await;
        let cpu1 = cpu_seconds(op.pid).unwrap_or(f64::NAN);
        f.idle_calls = self.log.sqs_calls_since(off);
        f.idle_cpu_per_min = (cpu1 - cpu0) * 60.0 / o.idle.as_secs_f64();
        f.peak = vm_mib(op.pid, "VmHWM");
        if !op.alive() {
            bail!("the operator exited while idle");
        }
        drop(watch);

        let off = self.log.offset();
        let t1 = Instant::now();
        let deadline = t1 + Duration::from_secs(300) + Duration::from_millis(500 * n as u64);
        // The API server may close a connection while it deletes 10,000 objects: a failed call
        // is made again (the delete is idempotent) until the deadline, not the end of the arm.
        let mut deleting = api.delete_collection(&DeleteParams::default(), &ListParams::default()).await.map(drop);
        loop {
            let left = match std::mem::replace(&mut deleting, Ok(())) {
                Ok(()) => api.list_metadata(&ListParams::default()).await.map(|l| l.items.len()),
                Err(e) => Err(e),
            };
            match left {
                Ok(0) => break,
                _ if Instant::now() > deadline => {
                    bail!("Queue objects still there {:?} after the delete: {left:?}", deadline - t1)
                }
                Ok(_) => {}
                Err(e) => {
                    progress(&format!("{}: {e}; asking again", arm.label));
                    deleting = api.delete_collection(&DeleteParams::default(), &ListParams::default()).await.map(drop);
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        f.delete_s = t1.elapsed().as_secs_f64();
        f.delete_calls = self.log.sqs_calls_since(off);
        f.left_behind = self.sqs_queues(&format!("{ns}_")).await?.len();
        if f.left_behind > 0 {
            self.fail(format!("{} left {} of {n} SQS queues behind", arm.label, f.left_behind));
        }
        Ok(f)
    }

    /// Whatever a failed arm left: finalizers dropped, SQS queues deleted, namespace deleted.
    async fn cleanup(&self, ns: &str, api: &Api<DynamicObject>) {
        if let Ok(list) = api.list_metadata(&ListParams::default()).await {
            for o in list.items {
                let _ = api
                    .patch(
                        &o.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
                let _ = api.delete(&o.name_any(), &DeleteParams::default()).await;
            }
        }
        if let Ok(urls) = self.sqs_queues(&format!("{ns}_")).await {
            for url in urls {
                let _ = self.oob.delete_queue().queue_url(url).send().await;
            }
        }
        let _ = Api::<Namespace>::all(self.driver.clone()).delete(ns, &DeleteParams::default()).await;
    }
}
