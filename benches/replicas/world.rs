//! What one arm runs against: a fresh namespace with A AwsAccounts (LocalStack accounts through
//! assumed roles), each reaching SQS through a proxy of its own that enforces SQS's tagging quota
//! per account and counts that account's calls; the N Queues spread over them; and the clean-up.

use std::time::{Duration, Instant};

use anyhow::bail;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use skyport::crd::{AwsAccount, Queue};

use crate::common::{self, sqs_faults::FaultProxy};

/// Queue objects created in parallel (the "kubectl apply" side, the same for every arm).
const CREATE_CONCURRENCY: usize = 32;
/// Parallel requests of the clean-up (not measured).
const CLEANUP_CONCURRENCY: usize = 32;
/// SQS's tagging quota per account (calls per second), which each account's proxy enforces.
pub(crate) const TAGGING_QUOTA: u32 = providers::sqs::TAGGING_QUOTA_PER_SECOND;
/// `--lease-name` of the replicas: the group of the shard Leases.
pub(crate) const GROUP: &str = "replicas";

/// One AwsAccount: its proxy, and SQS as its role, behind skyport's back (drift, clean-up).
pub(crate) struct Account {
    pub(crate) name: String,
    pub(crate) proxy: FaultProxy,
    pub(crate) oob: aws_sdk_sqs::Client,
}

pub(crate) struct World {
    pub(crate) driver: Client,
    pub(crate) ns: String,
    pub(crate) accounts: Vec<Account>,
}

/// The Queue named `name` belongs to the account of its prefix (`a<j>-q<i>`).
pub(crate) fn account_of(name: &str) -> usize {
    name.trim_start_matches('a').split('-').next().and_then(|j| j.parse().ok()).unwrap_or(usize::MAX)
}

pub(crate) fn queue_name(i: usize, accounts: usize) -> String {
    format!("a{}-q{i:06}", i % accounts)
}

impl World {
    /// A namespace `bench-replicas-<arm>-<random>` with `n` AwsAccounts and their proxies.
    pub(crate) async fn new(driver: Client, arm: &str, n: usize) -> anyhow::Result<Self> {
        let ns = format!("bench-replicas-{arm}-{:08x}", rand::random::<u32>());
        let object = json!({"metadata": {"name": ns, "labels": {"skyport.dev/bench": "true"}}});
        let namespace: Namespace = serde_json::from_value(object)?;
        Api::<Namespace>::all(driver.clone()).create(&PostParams::default(), &namespace).await?;
        let endpoint = std::env::var("AWS_ENDPOINT_URL")?;
        let upstream = endpoint.trim_start_matches("http://").trim_end_matches('/').to_string();
        let api: Api<AwsAccount> = Api::namespaced(driver.clone(), &ns);
        let mut accounts = vec![];
        for j in 0..n {
            let (name, role) = (format!("a{j}"), format!("arn:aws:iam::0000000007{j:02}:role/bench"));
            let proxy = FaultProxy::start(&upstream).await;
            proxy.set_tagging_quota(Some(TAGGING_QUOTA));
            let spec = json!({"roleArn": role, "region": "us-east-1", "endpointUrl": proxy.url()});
            let object = json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "AwsAccount",
                                "metadata": {"name": name}, "spec": spec});
            api.create(&PostParams::default(), &serde_json::from_value(object)?).await?;
            accounts.push(Account { oob: common::sts::sqs_as(&role, "us-east-1").await, name, proxy });
        }
        Ok(World { driver, ns, accounts })
    }

    pub(crate) fn queues(&self) -> Api<Queue> {
        Api::namespaced(self.driver.clone(), &self.ns)
    }

    /// The shard of a Queue of this world, by its name.
    pub(crate) fn shard_of(&self, queue: &str) -> String {
        match self.accounts.get(account_of(queue)) {
            Some(a) => format!("account.{}.{}", self.ns, a.name),
            None => "default".to_string(),
        }
    }

    /// Creates Queues `range`, each in account `i % A`, CREATE_CONCURRENCY at a time.
    pub(crate) async fn create(&self, range: std::ops::Range<usize>) -> anyhow::Result<()> {
        let (api, a) = (self.queues(), self.accounts.len());
        futures::stream::iter(range)
            .map(|i| {
                let name = queue_name(i, a);
                let spec = json!({"accountRef": {"name": format!("a{}", i % a)}, "visibilityTimeoutSeconds": 45,
                                  "tags": {"bench": "replicas"}});
                let api = api.clone();
                async move { api.create(&PostParams::default(), &common::queue(&name, spec)).await }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .map_err(anyhow::Error::from)
            .try_for_each(|_| futures::future::ready(Ok(())))
            .await
    }

    /// With no replica running: deletes the namespace's SQS queues in every account directly,
    /// drops the Queues' finalizers, and deletes the namespace.
    pub(crate) async fn cleanup(self) -> anyhow::Result<()> {
        progress!("cleaning up {}", self.ns);
        let prefix = format!("{}_", self.ns);
        for a in &self.accounts {
            let mut urls = vec![];
            let mut pages = a.oob.list_queues().queue_name_prefix(&prefix).max_results(1000).into_paginator().send();
            while let Some(page) = pages.next().await {
                urls.extend(page?.queue_urls.unwrap_or_default());
            }
            futures::stream::iter(urls)
                .for_each_concurrent(CLEANUP_CONCURRENCY, |url| async move {
                    let _ = a.oob.delete_queue().queue_url(url).send().await;
                })
                .await;
        }
        let api = self.queues();
        api.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
        let deadline = Instant::now() + Duration::from_secs(900);
        loop {
            let left = api.list_metadata(&ListParams::default()).await?.items;
            if left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                bail!("{} Queues still in {} after 15 minutes of clean-up", left.len(), self.ns);
            }
            let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
            futures::stream::iter(left)
                .for_each_concurrent(CLEANUP_CONCURRENCY, |q| {
                    let (api, unfinalize) = (api.clone(), &unfinalize);
                    async move {
                        let _ = api.patch(&q.name_any(), &PatchParams::default(), unfinalize).await;
                    }
                })
                .await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let accounts: Api<AwsAccount> = Api::namespaced(self.driver.clone(), &self.ns);
        for a in accounts.list_metadata(&ListParams::default()).await?.items {
            let _ = accounts
                .patch(&a.name_any(), &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
                .await;
        }
        Api::<Namespace>::all(self.driver.clone()).delete(&self.ns, &DeleteParams::default()).await?;
        Ok(())
    }
}
