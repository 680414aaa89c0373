//! The EC2 adapter as the LocalStack tests build it.

use providers::ec2::{Ec2Provider, Ec2Settings};

/// Any id works on LocalStack; this one has the shape of a real AMI id.
pub const AMI: &str = "ami-0123456789abcdef0";

/// The adapter against the endpoint tests/env.sh exports, with default settings.
pub async fn provider() -> Ec2Provider {
    // Never let a test run against a real AWS account by accident.
    let endpoint = std::env::var("AWS_ENDPOINT_URL")
        .expect("AWS_ENDPOINT_URL is not set: run `eval \"$(tests/env.sh up)\"` or tests/run.sh");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut settings = Ec2Settings::new(AMI);
    settings.endpoint_url = Some(endpoint);
    Ec2Provider::from_env(settings).await.expect("provider")
}
