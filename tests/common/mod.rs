//! Harness for integration tests against the real environment of `tests/env.sh up`: a real
//! kube-apiserver (+ etcd, kube-controller-manager) and real LocalStack.
//!
//! Each test gets its own namespace and its own in-process Queue controller watching only that
//! namespace, so tests run in parallel without seeing each other's objects, and each can read its
//! controller's call counters.

#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::Client as SqsClient;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use skyport::config::QueueArgs;
use skyport::controllers::queue::{Context, controller};
use skyport::crd::{ConditionStatus, Queue};
use tokio::sync::{OnceCell, oneshot};

pub mod bait;
pub mod crash;
pub mod guest;
pub mod guest_pair;
pub mod kubelet;
pub mod mirror;
pub mod private_env;
pub mod process;
pub mod proxy;
pub mod requests;
pub mod shards;
pub mod sqs_faults;
pub mod standby;
pub mod sts;
pub mod tunnels;

static SETUP: OnceCell<()> = OnceCell::const_new();

fn require_env() {
    for var in ["KUBECONFIG", "AWS_ENDPOINT_URL"] {
        if std::env::var_os(var).is_none() {
            panic!(
                "{var} is not set: start the test environment with `eval \"$(tests/env.sh up)\"` (or run tests/run.sh)"
            );
        }
    }
}

/// A kube client for the test API server, with skyport's CRDs installed from `crds/` (the
/// checked-in files, so they are what gets tested).
pub async fn client() -> Client {
    require_env();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = Client::try_default().await.expect("kube client from KUBECONFIG");
    SETUP.get_or_init(|| install_crds(client.clone())).await;
    client
}

pub async fn install_crds(client: Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/crds");
    for entry in std::fs::read_dir(dir).expect("crds/ exists") {
        let path = entry.expect("dir entry").path();
        let text = std::fs::read_to_string(&path).expect("read CRD");
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let name = crd.name_any();
        api.patch(&name, &PatchParams::apply("skyport-tests").force(), &Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| panic!("applying {path:?}: {e}"));
        eventually(&format!("CRD {name} Established"), Duration::from_secs(30), || async {
            let crd = api.get(&name).await.ok()?;
            crd.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
        })
        .await;
    }
}

/// Polls `f` every 200 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Failed reconciles per reason, less those where the test environment itself did not answer for
/// a moment (LocalStack or a provider fake, under the whole suite's load on two cores), which the
/// controllers retry with backoff by design. What is left is skyport's own failure or a refusal (a
/// permission, a bad request), which a test that expects no failure must not see.
pub fn failures_beyond_the_environment(
    metrics: &skyport::metrics::ReconcileMetrics,
) -> std::collections::BTreeMap<&'static str, u64> {
    use skyport::reasons::Reason;
    let mut errors = metrics.errors();
    for retried in [Reason::SqsUnavailable, Reason::Throttled, Reason::ProviderUnavailable, Reason::ProviderRateLimited]
    {
        errors.remove(retried.as_str());
    }
    errors
}

/// Asserts that no reconcile of `metrics`' controller failed beyond the environment
/// ([`failures_beyond_the_environment`]); `what` opens the message that lists them.
pub fn assert_no_failures(metrics: &skyport::metrics::ReconcileMetrics, what: &str) {
    let failures = failures_beyond_the_environment(metrics);
    assert!(failures.is_empty(), "{what}: {failures:?}");
}

/// The Events in `ns` once one of them has reason `reason`: an Event is published after the change
/// it reports, so a test that has just seen the change may list the Events before it is there.
pub async fn events_with_reason(client: &Client, ns: &str, reason: &str) -> Vec<k8s_openapi::api::core::v1::Event> {
    let api: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), ns);
    eventually(&format!("a {reason} Event"), Duration::from_secs(30), || async {
        let all = api.list(&Default::default()).await.ok()?.items;
        all.iter().any(|e| e.reason.as_deref() == Some(reason)).then_some(all)
    })
    .await
}

/// A fresh namespace, deleted by [`TestNs::cleanup`] (left in place when a test fails, for
/// inspection, unless the whole environment is torn down).
pub struct TestNs {
    pub client: Client,
    pub name: String,
}

impl TestNs {
    pub async fn new(prefix: &str) -> Self {
        Self::named(format!("{prefix}-{:08x}", rand::random::<u32>())).await
    }

    /// A namespace with exactly this name (tests of names derived from namespaces need it).
    pub async fn named(name: String) -> Self {
        Self::in_cluster(client().await, name).await
    }

    /// A namespace in the cluster `client` talks to (a private environment's).
    pub async fn in_cluster(client: Client, name: String) -> Self {
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"skyport.dev/test": "true"}}
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.expect("create namespace");
        TestNs { client, name }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    pub async fn cleanup(self) {
        let _ = Api::<Namespace>::all(self.client.clone()).delete(&self.name, &DeleteParams::default()).await;
    }
}

/// A Queue controller running in-process for one namespace.
pub struct Operator {
    pub ctx: Arc<Context>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

/// The cluster id in-process operators tag their queues with.
pub const TEST_CLUSTER: &str = "skyport-test-cluster";

/// Settings for fast tests: short resync and backoff.
pub fn fast_settings() -> QueueArgs {
    QueueArgs {
        resync: Duration::from_secs(2),
        tag_resync: Duration::from_secs(600),
        concurrency: 4,
        backoff_min: Duration::from_millis(200),
        backoff_max: Duration::from_secs(2),
        recently_deleted_retry: Duration::from_secs(5),
        name_grants: Vec::new(),
        ownership_key_file: None,
        ownership_key: None,
        cluster_id: TEST_CLUSTER.into(),
    }
}

/// [`fast_settings`] with the platform granting namespace `namespace` the queues made outside
/// skyport whose names match `pattern` (`--queue-name-grant`).
pub fn granting(namespace: &str, pattern: &str) -> QueueArgs {
    let grant = skyport::config::NameGrant { namespace: namespace.into(), pattern: pattern.into() };
    QueueArgs { name_grants: vec![grant], ..fast_settings() }
}

impl Operator {
    pub async fn start(ns: &TestNs, settings: QueueArgs) -> Self {
        Self::start_with_endpoint(ns, settings, None).await
    }

    /// Like [`Operator::start`], talking to SQS at `endpoint` instead of `AWS_ENDPOINT_URL`.
    pub async fn start_with_endpoint(ns: &TestNs, settings: QueueArgs, endpoint: Option<String>) -> Self {
        Self::watching(ns.client.clone(), Some(ns.name.clone()), settings, endpoint).await
    }

    /// A Queue controller for every namespace of the cluster `client` talks to, with SQS at
    /// `endpoint`: only for a private environment (`private_env`), whose Queues are all the test's.
    pub async fn everywhere(client: Client, settings: QueueArgs, endpoint: String) -> Self {
        Self::watching(client, None, settings, Some(endpoint)).await
    }

    async fn watching(
        client: Client,
        namespace: Option<String>,
        settings: QueueArgs,
        endpoint: Option<String>,
    ) -> Self {
        // One set of settings for the client and the controller, as `skyport run` has: the
        // controller builds AwsAccounts' clients from them.
        let aws = providers::SqsSettings {
            endpoint_url: endpoint,
            operation_timeout: Duration::from_secs(5),
            // Tests make Queues faster than SQS's tagging quota allows (tagging is not budgeted
            // by LocalStack); the sub-budget itself has unit tests.
            tag_rate_per_second: std::num::NonZeroU32::new(40).expect("non-zero"),
            ..Default::default()
        };
        let sqs = providers::SqsProvider::from_env(&aws).await;
        let (tx, rx) = oneshot::channel::<()>();
        let (ctx, run) = controller(
            client,
            Arc::new(sqs),
            aws,
            settings,
            namespace,
            skyport::controllers::Acting::always(),
            async {
                let _ = rx.await;
            },
        );
        let task = tokio::spawn(run);
        Operator { ctx, stop: Some(tx), task }
    }

    /// SQS calls made so far, per operation.
    pub fn sqs_calls(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.ctx.sqs.limiter().counters.snapshot()
    }

    /// SQS calls that succeeded so far, per operation: what a test may count exactly, since an
    /// attempt that failed (a timeout on a loaded machine) is retried and counted again.
    pub fn sqs_succeeded(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.ctx.sqs.limiter().counters.succeeded()
    }

    /// Stops the controller, letting reconciles in flight finish.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), &mut self.task).await;
    }
}

/// A bound token (TokenRequest API, one hour) for the ServiceAccount `namespace/name`.
pub async fn service_account_token(admin: &Client, namespace: &str, name: &str) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec { audiences: vec![], expiration_seconds: Some(3600), ..Default::default() },
        ..Default::default()
    };
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {namespace}/{name}: {e}"))
        .status
        .expect("token in status")
        .token
}

/// An SQS client independent of skyport's adapter, to check and disturb SQS behind its back.
pub async fn sqs() -> SqsClient {
    require_env();
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http).load().await;
    SqsClient::new(&config)
}

/// Builds a Queue from a JSON spec.
pub fn queue(name: &str, spec: serde_json::Value) -> Queue {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "skyport.dev/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("valid Queue JSON")
}

/// The Ready condition's (status, reason), if any.
pub fn ready(q: &Queue) -> Option<(ConditionStatus, String)> {
    let c = q.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((c.status, c.reason.to_string()))
}

/// Waits until the Queue's Ready condition has `status` and `reason`, returning the object.
pub async fn wait_ready(
    api: &Api<Queue>,
    name: &str,
    status: ConditionStatus,
    reason: &str,
    timeout: Duration,
) -> Queue {
    let mut last = None;
    let what = format!("Queue {name} Ready={status:?} reason {reason}");
    let result = tokio::time::timeout(timeout, async {
        loop {
            if let Ok(q) = api.get(name).await {
                if ready(&q).as_ref().is_some_and(|(s, r)| *s == status && r == reason) {
                    return q;
                }
                last = q.status.clone();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    result.unwrap_or_else(|_| panic!("timed out waiting for {what}; last status: {last:#?}"))
}

/// All attributes of the queue at `url` (via the independent client).
pub async fn attributes(sqs: &SqsClient, url: &str) -> std::collections::HashMap<String, String> {
    sqs.get_queue_attributes()
        .queue_url(url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
        .send()
        .await
        .expect("GetQueueAttributes")
        .attributes
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k.as_str().to_string(), v))
        .collect()
}

/// Whether a queue of that name exists.
pub async fn queue_exists(sqs: &SqsClient, name: &str) -> bool {
    sqs.get_queue_url().queue_name(name).send().await.is_ok()
}

/// Waits until the Queue `name` is gone from the API (finalizer released).
pub async fn wait_gone(api: &Api<Queue>, name: &str, timeout: Duration) {
    eventually(&format!("Queue {name} deleted"), timeout, || async {
        matches!(api.get(name).await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
    })
    .await;
}

/// Ends a test: deletes every Queue left in the namespace while the controller still runs (so
/// their SQS queues go too and no finalizer is left behind), then stops the controller and
/// deletes the namespace.
pub async fn finish(op: Operator, ns: TestNs) {
    let api: Api<Queue> = ns.api();
    let _ = api.delete_collection(&DeleteParams::default(), &Default::default()).await;
    eventually("all Queues of the test deleted", Duration::from_secs(60), || async {
        api.list(&Default::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    op.stop().await;
    ns.cleanup().await;
}
