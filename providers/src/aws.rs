//! The AWS SDK configuration every AWS adapter (SQS, EC2) shares: the standard credential and
//! endpoint chain, one TLS stack, and bounded timeouts.

use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig, timeout::TimeoutConfig};
use aws_smithy_http_client::tls;

/// Loads the SDK configuration from the standard chain (env keys, profiles, IRSA, Pod Identity,
/// `AWS_ENDPOINT_URL[_<SERVICE>]`), with `region` and `endpoint_url` overriding it when given.
pub async fn sdk_config(region: Option<&str>, endpoint_url: Option<&str>, operation_timeout: Duration) -> SdkConfig {
    // One TLS stack (rustls + ring) for the whole binary: the SDK's default client would pull in
    // aws-lc as a second crypto provider.
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https();
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).http_client(http).timeout_config(
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
