//! The benchmark environment every scenario uses: the clients, an in-process Queue controller
//! per namespace, and making, then cleaning up, a namespace of benchmark Queues.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use futures::channel::mpsc;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use providers::{QueueBackend, SqsProvider, SqsSettings};
use serde_json::json;
use skyport::config::QueueArgs;
use skyport::controllers::queue::desired::queue_name;
use skyport::controllers::queue::{Context, FINALIZER, controller};
use skyport::controllers::remove_finalizer;
use skyport::crd::Queue;
use tokio::sync::oneshot;

use crate::common;
use crate::stats::EnvProcs;

/// Queue objects created in parallel by the benchmark (the "kubectl apply" side, same for both
/// arms of the time-to-Ready comparison).
pub(crate) const CREATE_CONCURRENCY: usize = 32;
/// Parallel requests of the clean-up (not measured).
const CLEANUP_CONCURRENCY: usize = 32;
/// The spec of every benchmark Queue: a few managed attributes and a user tag.
pub(crate) fn spec() -> serde_json::Value {
    json!({"visibilityTimeoutSeconds": 45, "messageRetentionSeconds": 3600, "tags": {"bench": "queues"}})
}
pub(crate) const SPEC_VISIBILITY: &str = "45";

fn queue_names(range: std::ops::Range<usize>) -> impl Iterator<Item = String> {
    range.map(|i| format!("q-{i:05}"))
}

pub(crate) struct Bench {
    /// The client the operator (and the baseline) use.
    pub(crate) kube: Client,
    /// The benchmark's own client: creating Queues, watching, cleaning up.
    pub(crate) driver: Client,
    /// SQS behind skyport's back (drift), independent of its adapter.
    pub(crate) oob: aws_sdk_sqs::Client,
    /// Deletes SQS queues during clean-up, without touching the measured limiters.
    pub(crate) janitor: Arc<SqsProvider>,
    pub(crate) procs: EnvProcs,
    /// Things that are broken (not missed targets): make the exit status non-zero.
    pub(crate) failures: Mutex<Vec<String>>,
}

pub(crate) fn sqs_settings(rate: u32, burst: u32, tags: u32) -> SqsSettings {
    SqsSettings {
        rate_per_second: NonZeroU32::new(rate).expect("rate > 0"),
        burst: NonZeroU32::new(burst).expect("burst > 0"),
        tag_rate_per_second: NonZeroU32::new(tags).expect("tagging rate > 0"),
        ..Default::default()
    }
}

pub(crate) async fn provider(rate: u32, burst: u32, tags: u32) -> Arc<SqsProvider> {
    Arc::new(SqsProvider::from_env(&sqs_settings(rate, burst, tags)).await)
}

/// An in-process Queue controller for one namespace.
pub(crate) struct Operator {
    pub(crate) ctx: Arc<Context>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Operator {
    /// `aws`: the settings `sqs` was built with, as `skyport run` has them (the controller builds
    /// AwsAccounts' clients from them).
    pub(crate) async fn start(
        client: Client,
        sqs: Arc<dyn QueueBackend>,
        aws: SqsSettings,
        settings: QueueArgs,
        ns: &str,
    ) -> Self {
        let (stop, rx) = oneshot::channel::<()>();
        let (ctx, run) = controller(
            client,
            sqs,
            aws,
            settings,
            Some(ns.to_string()),
            skyport::controllers::Acting::always(),
            async {
                let _ = rx.await;
            },
        );
        let task = tokio::spawn(run);
        // Not Store::wait_until_ready: it wakes only one of several waiters (see store_synced).
        skyport::controllers::store_synced(&ctx.queues).await;
        skyport::controllers::store_synced(&ctx.configmaps).await;
        Operator { ctx, stop, task }
    }

    pub(crate) async fn stop(mut self) {
        let _ = self.stop.send(());
        if tokio::time::timeout(Duration::from_secs(30), &mut self.task).await.is_err() {
            self.task.abort();
        }
    }
}

impl Bench {
    pub(crate) fn fail(&self, what: String) {
        println!("  BROKEN: {what}");
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).push(what);
    }

    pub(crate) async fn namespace(&self, prefix: &str) -> anyhow::Result<String> {
        let name = format!("bench-{prefix}-{:08x}", rand::random::<u32>());
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"skyport.dev/bench": "true"}}
        }))?;
        Api::<Namespace>::all(self.driver.clone()).create(&PostParams::default(), &ns).await?;
        Ok(name)
    }

    /// Creates Queues `range` in `ns`, CREATE_CONCURRENCY at a time, handing each created object
    /// to `created` (the baseline's work queue).
    pub(crate) async fn create_queues(
        &self,
        ns: &str,
        range: std::ops::Range<usize>,
        created: Option<mpsc::UnboundedSender<Queue>>,
    ) -> anyhow::Result<()> {
        self.create_queues_with(ns, range, created, spec()).await
    }

    /// [`Self::create_queues`] with `spec` for every Queue.
    pub(crate) async fn create_queues_with(
        &self,
        ns: &str,
        range: std::ops::Range<usize>,
        created: Option<mpsc::UnboundedSender<Queue>>,
        spec: serde_json::Value,
    ) -> anyhow::Result<()> {
        let api: Api<Queue> = Api::namespaced(self.driver.clone(), ns);
        futures::stream::iter(queue_names(range))
            .map(|name| {
                let (api, spec) = (api.clone(), spec.clone());
                async move { api.create(&PostParams::default(), &common::queue(&name, spec)).await }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .map_err(anyhow::Error::from)
            .try_for_each(|q| {
                if let Some(tx) = &created {
                    let _ = tx.unbounded_send(q);
                }
                futures::future::ready(Ok(()))
            })
            .await
    }

    /// Deletes every Queue of `ns` and its SQS queue (directly, with no controller running),
    /// waits until the Queue objects are gone, then deletes the namespace.
    pub(crate) async fn cleanup(&self, ns: &str) -> anyhow::Result<()> {
        progress!("cleaning up {ns}");
        let api: Api<Queue> = Api::namespaced(self.driver.clone(), ns);
        api.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let left = api.list(&ListParams::default()).await?.items;
            if left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                bail!("{} Queues still in {ns} after 10 minutes of clean-up", left.len());
            }
            futures::stream::iter(left)
                .for_each_concurrent(CLEANUP_CONCURRENCY, |q| {
                    let api = api.clone();
                    async move {
                        let url = match q.status.as_ref().and_then(|s| s.queue_url.clone()) {
                            Some(url) => Some(url),
                            None => self
                                .janitor
                                .queue_url(&queue_name(ns, &q.name_any(), &q.spec, None))
                                .await
                                .ok()
                                .flatten(),
                        };
                        if let Some(url) = url {
                            let _ = self.janitor.delete_queue(&url).await;
                        }
                        let _ = remove_finalizer(&api, &q, FINALIZER).await;
                    }
                })
                .await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let _ = Api::<Namespace>::all(self.driver.clone()).delete(ns, &DeleteParams::default()).await;
        Ok(())
    }
}
