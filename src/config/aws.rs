//! AWS flags: the region and the SQS call budgets, with the SQS quotas their defaults are sized
//! against.

use std::num::NonZeroU32;

use clap::Args;

/// AWS settings. Credentials and endpoints come from the standard AWS chain: AWS_ACCESS_KEY_ID /
/// AWS_SECRET_ACCESS_KEY, AWS_PROFILE, web identity (IRSA), EKS Pod Identity; AWS_ENDPOINT_URL or
/// AWS_ENDPOINT_URL_SQS point at an emulator such as LocalStack.
#[derive(Debug, Clone, Args)]
pub struct AwsArgs {
    /// AWS region (default: AWS_REGION / AWS_DEFAULT_REGION / profile).
    #[arg(long = "aws-region", env = "SKYPORT_AWS_REGION")]
    pub region: Option<String>,

    /// Sustained SQS control-plane calls per second, for all Queues of one AWS account and
    /// region together. SQS publishes no rate quota for the queue-management actions skyport
    /// makes (CreateQueue, Get/SetQueueAttributes, DeleteQueue); the budget keeps a restart or a
    /// storm of new Queues from flooding an account other workloads share. The default is twice
    /// the default --sqs-tag-rate: a new Queue costs one CreateQueue and one ListQueueTags, so a
    /// storm goes at the pace of SQS's tagging quota, not of this budget.
    #[arg(long = "sqs-rate", env = "SKYPORT_SQS_RATE", default_value_t = providers::sqs::DEFAULT_RATE, verbatim_doc_comment)]
    pub sqs_rate: NonZeroU32,

    /// Sustained tagging calls per second (ListQueueTags, TagQueue, UntagQueue) within
    /// --sqs-rate, and their burst. SQS limits tagging actions to 30 per second per account
    /// (Amazon SQS Developer Guide, "Quotas related to queues"); the default is 80 % of that, as
    /// the DigitalOcean and Hetzner budgets are sized. Every new Queue costs one ListQueueTags
    /// (the proof that the queue is its own), so this also paces a storm of new Queues. Raise
    /// it once AWS has raised the account's quota.
    #[arg(long = "sqs-tag-rate", env = "SKYPORT_SQS_TAG_RATE", default_value_t = providers::sqs::DEFAULT_TAG_RATE, verbatim_doc_comment)]
    pub sqs_tag_rate: NonZeroU32,

    /// SQS calls allowed in a burst above the sustained rate (one second of the default rate).
    #[arg(long = "sqs-burst", env = "SKYPORT_SQS_BURST", default_value_t = providers::sqs::DEFAULT_RATE)]
    pub sqs_burst: NonZeroU32,

    /// Let AwsAccounts name a plain `http://` SQS endpoint (`spec.endpointUrl`), e.g. an emulator
    /// in a test cluster. Off: such an AwsAccount is refused (Queues report `InsecureEndpoint`),
    /// since requests signed with the assumed role's session token would cross the network in
    /// clear, to wherever the AwsAccount's author points them.
    #[arg(long = "allow-http-account-endpoints", env = "SKYPORT_ALLOW_HTTP_ACCOUNT_ENDPOINTS")]
    pub allow_http_account_endpoints: bool,
}

impl AwsArgs {
    pub fn sqs_settings(&self) -> providers::SqsSettings {
        providers::SqsSettings {
            region: self.region.clone(),
            rate_per_second: self.sqs_rate,
            burst: self.sqs_burst,
            tag_rate_per_second: self.sqs_tag_rate,
            allow_http_endpoints: self.allow_http_account_endpoints,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::config::{Cli, Command};

    #[test]
    fn the_sqs_budget_defaults_stay_under_sqs_tagging_quota() {
        let Command::Run(run) = Cli::try_parse_from(["skyport", "run"]).unwrap().command else { panic!("run") };
        let settings = run.aws.sqs_settings();
        let quota = providers::sqs::TAGGING_QUOTA_PER_SECOND;
        assert_eq!(settings.tag_rate_per_second.get(), quota * 4 / 5, "80 % of the tagging quota");
        // A storm of new Queues (CreateQueue + ListQueueTags each) is paced by tagging alone.
        assert!(settings.rate_per_second.get() >= 2 * settings.tag_rate_per_second.get());
        assert_eq!(settings.burst, settings.rate_per_second);
    }

    #[test]
    fn http_account_endpoints_are_refused_unless_the_platform_allows_them() {
        let parse = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Run(run) => run.aws.sqs_settings().allow_http_endpoints,
            _ => panic!("run"),
        };
        assert!(!parse(&["skyport", "run"]));
        assert!(parse(&["skyport", "run", "--allow-http-account-endpoints"]));
    }

    #[test]
    fn a_zero_rate_is_refused() {
        assert!(Cli::try_parse_from(["skyport", "run", "--sqs-rate", "0"]).is_err());
    }
}
