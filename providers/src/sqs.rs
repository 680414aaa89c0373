//! The SQS adapter: the few control-plane calls the Queue controller needs, each rate limited,
//! counted and mapped to [`QueueError`].

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::QueueAttributeName;

use crate::error::QueueError;
use crate::limiter::{Limiter, SUCCESS};

/// Attribute name → value, as SQS spells them (`VisibilityTimeout`, `RedrivePolicy`, ...).
pub type Attributes = BTreeMap<String, String>;
/// Tag key → value.
pub type Tags = BTreeMap<String, String>;

/// The queue operations skyport relies on. Implementations must be idempotent where SQS is:
/// creating an existing queue with the same attributes returns its URL, deleting a missing
/// queue is success.
#[async_trait]
pub trait QueueBackend: Send + Sync {
    /// URL of the queue called `name`, or `None` when there is none.
    async fn queue_url(&self, name: &str) -> Result<Option<String>, QueueError>;
    /// Creates the queue (or returns the URL of an identical existing one).
    async fn create_queue(&self, name: &str, attributes: &Attributes, tags: &Tags) -> Result<String, QueueError>;
    /// All attributes of the queue at `url`, or `None` when it no longer exists.
    async fn attributes(&self, url: &str) -> Result<Option<Attributes>, QueueError>;
    async fn set_attributes(&self, url: &str, attributes: &Attributes) -> Result<(), QueueError>;
    async fn tags(&self, url: &str) -> Result<Tags, QueueError>;
    async fn tag(&self, url: &str, tags: &Tags) -> Result<(), QueueError>;
    async fn untag(&self, url: &str, keys: &[String]) -> Result<(), QueueError>;
    /// Deletes the queue; a queue that is already gone counts as deleted.
    async fn delete_queue(&self, url: &str) -> Result<(), QueueError>;
    /// The limiter every call of this backend goes through.
    fn limiter(&self) -> &Limiter;
    /// The region calls go to, when known: with the account in a queue's URL it names the
    /// queue's ARN without another call. No default: a wrapper that forgot to forward it would
    /// silently read every new queue's ARN back and report no region.
    fn region(&self) -> Option<String>;
}

/// How to reach SQS. Endpoint and credentials come from the standard AWS chain
/// (`AWS_ENDPOINT_URL[_SQS]`, env keys, profiles, web identity / IRSA, Pod Identity).
#[derive(Debug, Clone)]
pub struct SqsSettings {
    /// Overrides the region from the standard chain.
    pub region: Option<String>,
    /// Sustained SQS control-plane calls per second.
    pub rate_per_second: NonZeroU32,
    /// Calls allowed at once above the sustained rate.
    pub burst: NonZeroU32,
    /// Sustained tagging calls per second ([`TAGGING`]), within `rate_per_second`; also their
    /// burst.
    pub tag_rate_per_second: NonZeroU32,
    /// Upper bound for one call including the SDK's own retries.
    pub operation_timeout: Duration,
    /// Overrides the endpoint from the standard chain (tests point single controllers at a
    /// proxy this way; operators normally use `AWS_ENDPOINT_URL_SQS`).
    pub endpoint_url: Option<String>,
    /// Overrides the STS endpoint of [`SqsProvider::assuming`] (tests put a stand-in that
    /// enforces trust policies in front of one controller this way; operators normally use
    /// `AWS_ENDPOINT_URL_STS`).
    pub sts_endpoint_url: Option<String>,
    /// Whether an assumed role's own SQS endpoint may be plain `http://` (test servers). Off by
    /// default: requests signed with the role's session token would cross the network in clear.
    pub allow_http_endpoints: bool,
}

impl Default for SqsSettings {
    fn default() -> Self {
        SqsSettings {
            region: None,
            rate_per_second: DEFAULT_RATE,
            burst: DEFAULT_RATE,
            tag_rate_per_second: DEFAULT_TAG_RATE,
            operation_timeout: Duration::from_secs(20),
            endpoint_url: None,
            sts_endpoint_url: None,
            allow_http_endpoints: false,
        }
    }
}

/// SQS's tagging actions: they share a quota of their own, [`TAGGING_QUOTA_PER_SECOND`].
pub const TAGGING: &[&str] = &["ListQueueTags", "TagQueue", "UntagQueue"];

/// Tagging actions per second per AWS account ("Quotas related to queues", Amazon SQS Developer
/// Guide).
pub const TAGGING_QUOTA_PER_SECOND: u32 = 30;

/// 80 % of the tagging quota, as the DigitalOcean and Hetzner budgets are sized: 24/s.
pub const DEFAULT_TAG_RATE: NonZeroU32 = nonzero(TAGGING_QUOTA_PER_SECOND * 4 / 5);

/// SQS publishes no rate quota for the other actions skyport makes. A new Queue costs one
/// CreateQueue and one ListQueueTags, so twice the tagging budget lets a storm of new Queues go
/// at the pace of the tagging quota instead of this budget's: 48/s.
pub const DEFAULT_RATE: NonZeroU32 = nonzero(2 * DEFAULT_TAG_RATE.get());

const fn nonzero(n: u32) -> NonZeroU32 {
    match NonZeroU32::new(n) {
        Some(n) => n,
        None => panic!("a budget of zero"),
    }
}

impl SqsSettings {
    /// A budget for one account and region: the shared rate, and the tagging rate within it.
    pub fn limiter(&self) -> Limiter {
        Limiter::new(self.rate_per_second, self.burst).with_sub_budget(
            TAGGING,
            self.tag_rate_per_second,
            self.tag_rate_per_second,
        )
    }
}

/// An IAM role to reach SQS with, see [`SqsProvider::assuming`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssumeRole {
    pub role_arn: String,
    /// Sent with every AssumeRole (`sts:ExternalId` in the role's trust policy).
    pub external_id: String,
    /// Shows in the role's CloudTrail entries (2-64 characters of `[\w+=,.@-]`).
    pub session_name: String,
    pub region: String,
    pub endpoint_url: Option<String>,
}

/// SQS through the AWS SDK.
#[derive(Debug, Clone)]
pub struct SqsProvider {
    client: Client,
    limiter: Arc<Limiter>,
}

impl SqsProvider {
    /// Builds the client from the standard AWS configuration chain plus `settings`.
    pub async fn from_env(settings: &SqsSettings) -> Self {
        let config = crate::aws::sdk_config(
            settings.region.as_deref(),
            settings.endpoint_url.as_deref(),
            settings.operation_timeout,
        )
        .await;
        SqsProvider { client: Client::new(&config), limiter: Arc::new(settings.limiter()) }
    }

    /// SQS as the IAM role `role` (STS AssumeRole with the identity of the standard chain), in
    /// the role's region, calls counted and budgeted by `limiter` (one per account and region,
    /// shared by every role there: SQS quotas are per account).
    pub async fn assuming(settings: &SqsSettings, role: &AssumeRole, limiter: Arc<Limiter>) -> Self {
        let region = aws_config::Region::new(role.region.clone());
        let timeout = settings.operation_timeout;
        let base = crate::aws::sdk_config(Some(&role.region), settings.endpoint_url.as_deref(), timeout).await;
        let sts = match &settings.sts_endpoint_url {
            Some(endpoint) => crate::aws::sdk_config(Some(&role.region), Some(endpoint), timeout).await,
            None => base.clone(),
        };
        let assume = aws_config::sts::AssumeRoleProvider::builder(role.role_arn.clone())
            .session_name(role.session_name.clone())
            .external_id(role.external_id.clone())
            .region(region.clone())
            .configure(&sts)
            .build()
            .await;
        let mut config = aws_sdk_sqs::config::Builder::from(&base).credentials_provider(assume).region(region);
        if let Some(endpoint) = &role.endpoint_url {
            config = config.endpoint_url(endpoint.clone());
        }
        SqsProvider { client: Client::from_conf(config.build()), limiter }
    }

    /// The region the client resolved (flag or standard chain), for building ARNs in messages.
    pub fn region(&self) -> Option<String> {
        self.client.config().region().map(|r| r.to_string())
    }
}

fn map_err<E, R>(err: SdkError<E, R>) -> QueueError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    if let Some(refusal) = assume_role_refusal(&err) {
        return refusal;
    }
    match crate::aws::failure(err) {
        crate::aws::Failure::Service { code, message } => QueueError::from_code(&code, message),
        crate::aws::Failure::Transport(message) => QueueError::Unavailable(message),
    }
}

/// STS's answer when the credentials of an assumed role could not be had: the SQS call then fails
/// before it is sent, with STS's error deep in its source chain.
fn assume_role_refusal(err: &(dyn std::error::Error + 'static)) -> Option<QueueError> {
    type StsError =
        SdkError<aws_sdk_sts::operation::assume_role::AssumeRoleError, aws_sdk_sts::config::http::HttpResponse>;
    let mut cause = Some(err);
    while let Some(e) = cause {
        if let Some(SdkError::ServiceError(service)) = e.downcast_ref::<StsError>() {
            let e = service.err();
            let (code, message) = (e.code().unwrap_or("Unknown"), e.message().unwrap_or_default());
            return Some(match QueueError::from_code(code, message.to_string()) {
                QueueError::AccessDenied { code, message } => QueueError::AssumeRoleRefused { code, message },
                other => other,
            });
        }
        cause = e.source();
    }
    None
}

fn to_sdk_attributes(attributes: &Attributes) -> std::collections::HashMap<QueueAttributeName, String> {
    attributes.iter().map(|(k, v)| (QueueAttributeName::from(k.as_str()), v.clone())).collect()
}

impl SqsProvider {
    /// Waits for the limiter, runs `call` and counts how it ended, so every operation is rate
    /// limited and shows up in the counters by outcome.
    async fn call<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, QueueError>>,
    ) -> Result<T, QueueError> {
        self.limiter.acquire(operation).await;
        let result = call.await;
        self.limiter.counters.record_outcome(operation, result.as_ref().map_or_else(QueueError::label, |_| SUCCESS));
        result
    }
}

#[async_trait]
impl QueueBackend for SqsProvider {
    async fn queue_url(&self, name: &str) -> Result<Option<String>, QueueError> {
        let call = async { self.client.get_queue_url().queue_name(name).send().await.map_err(map_err) };
        match self.call("GetQueueUrl", call).await {
            Ok(out) => Ok(out.queue_url),
            Err(QueueError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn create_queue(&self, name: &str, attributes: &Attributes, tags: &Tags) -> Result<String, QueueError> {
        let call = async {
            self.client
                .create_queue()
                .queue_name(name)
                .set_attributes(Some(to_sdk_attributes(attributes)))
                .set_tags((!tags.is_empty()).then(|| tags.clone().into_iter().collect()))
                .send()
                .await
                .map_err(map_err)
        };
        let out = self.call("CreateQueue", call).await?;
        out.queue_url.ok_or_else(|| QueueError::Unavailable("CreateQueue returned no QueueUrl".into()))
    }

    async fn attributes(&self, url: &str) -> Result<Option<Attributes>, QueueError> {
        let call = async {
            self.client
                .get_queue_attributes()
                .queue_url(url)
                .attribute_names(QueueAttributeName::All)
                .send()
                .await
                .map_err(map_err)
        };
        match self.call("GetQueueAttributes", call).await {
            Ok(out) => Ok(Some(
                out.attributes.unwrap_or_default().into_iter().map(|(k, v)| (k.as_str().to_string(), v)).collect(),
            )),
            Err(QueueError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn set_attributes(&self, url: &str, attributes: &Attributes) -> Result<(), QueueError> {
        let call = async {
            self.client
                .set_queue_attributes()
                .queue_url(url)
                .set_attributes(Some(to_sdk_attributes(attributes)))
                .send()
                .await
                .map_err(map_err)
        };
        self.call("SetQueueAttributes", call).await?;
        Ok(())
    }

    async fn tags(&self, url: &str) -> Result<Tags, QueueError> {
        let call = async { self.client.list_queue_tags().queue_url(url).send().await.map_err(map_err) };
        let out = self.call("ListQueueTags", call).await?;
        Ok(out.tags.unwrap_or_default().into_iter().collect())
    }

    async fn tag(&self, url: &str, tags: &Tags) -> Result<(), QueueError> {
        let call = async {
            self.client
                .tag_queue()
                .queue_url(url)
                .set_tags(Some(tags.clone().into_iter().collect()))
                .send()
                .await
                .map_err(map_err)
        };
        self.call("TagQueue", call).await?;
        Ok(())
    }

    async fn untag(&self, url: &str, keys: &[String]) -> Result<(), QueueError> {
        let call = async {
            self.client.untag_queue().queue_url(url).set_tag_keys(Some(keys.to_vec())).send().await.map_err(map_err)
        };
        self.call("UntagQueue", call).await?;
        Ok(())
    }

    async fn delete_queue(&self, url: &str) -> Result<(), QueueError> {
        let call = async { self.client.delete_queue().queue_url(url).send().await.map_err(map_err) };
        match self.call("DeleteQueue", call).await {
            Ok(_) | Err(QueueError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn region(&self) -> Option<String> {
        SqsProvider::region(self)
    }

    fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_default_budget_holds_tagging_under_sqs_quota_and_leaves_the_rest_alone() {
        let limiter = SqsSettings::default().limiter();
        let tagging = DEFAULT_TAG_RATE.get();
        assert_eq!(tagging, 24, "80 % of SQS's 30/s");
        for _ in 0..tagging {
            limiter.acquire("ListQueueTags").await;
        }
        assert_eq!(limiter.counters.waits().0, 0, "the tagging burst is one second of the budget");
        limiter.acquire("TagQueue").await;
        assert_eq!(limiter.counters.waits().0, 1, "the next tagging call in a row waited");
        for _ in 0..(DEFAULT_RATE.get() - tagging - 1) {
            limiter.acquire("GetQueueAttributes").await;
        }
        assert_eq!(limiter.counters.waits().0, 1, "other calls are not held by the tagging budget");
    }
}
