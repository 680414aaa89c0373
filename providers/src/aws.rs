//! The AWS SDK configuration every AWS adapter (SQS, EC2) shares: the standard credential and
//! endpoint chain, one TLS stack, and bounded timeouts.

use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig, retry::RetryConfig, timeout::TimeoutConfig};
// The SDK crates share these types (re-exported from the smithy runtime); SQS's path is used.
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_smithy_http_client::tls;

/// Loads the SDK configuration from the standard chain (env keys, profiles, IRSA, Pod Identity,
/// `AWS_ENDPOINT_URL[_<SERVICE>]`), with `region` and `endpoint_url` overriding it when given.
pub async fn sdk_config(region: Option<&str>, endpoint_url: Option<&str>, operation_timeout: Duration) -> SdkConfig {
    // One TLS stack (rustls + ring) for the whole binary: the SDK's default client would pull in
    // aws-lc as a second crypto provider.
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https();
    // One attempt per call: the SDK's own retries (3 attempts by default) would send requests
    // the rate limiter never admitted, exceeding the budget exactly when the cloud throttles,
    // and retry sooner than the controller's per-object backoff. Failed calls are retried by
    // the controllers' error policy instead (tests/cloud_faults.rs).
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(http)
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(3))
                .operation_attempt_timeout(operation_timeout / 2)
                .operation_timeout(operation_timeout)
                .build(),
        );
    if let Some(endpoint) = endpoint_url {
        loader = loader.endpoint_url(endpoint);
    }
    if let Some(region) = region {
        loader = loader.region(Region::new(region.to_string()));
    }
    loader.load().await
}

/// What an AWS SDK call failure amounts to, before each adapter maps it to its own error type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The service answered with an error code and message (from AWS; no credentials in it).
    Service { code: String, message: String },
    /// No usable answer: network, timeout, malformed response. The text says which.
    Transport(String),
}

/// Sorts an SDK error into [`Failure`]; both adapters classify transport problems the same way.
pub fn failure<E, R>(err: SdkError<E, R>) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match err {
        SdkError::ServiceError(service) => {
            let e = service.err();
            Failure::Service {
                code: e.code().unwrap_or("Unknown").to_string(),
                message: e.message().unwrap_or_default().to_string(),
            }
        }
        SdkError::TimeoutError(_) => Failure::Transport("request timed out".into()),
        SdkError::DispatchFailure(d) if d.is_io() => Failure::Transport("connection failed".into()),
        SdkError::DispatchFailure(d) if d.is_timeout() => Failure::Transport("request timed out".into()),
        SdkError::DispatchFailure(_) => Failure::Transport("request could not be sent".into()),
        SdkError::ResponseError(_) => Failure::Transport("malformed response".into()),
        other => Failure::Transport(format!("{}", DisplayErrorContext(&other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_sdk_call_is_one_attempt_so_the_rate_limiter_sees_every_request() {
        let config = sdk_config(Some("us-east-1"), Some("http://127.0.0.1:1"), Duration::from_secs(4)).await;
        assert_eq!(config.retry_config().map(|r| r.max_attempts()), Some(1));
    }
}
