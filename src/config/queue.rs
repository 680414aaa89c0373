//! Queue controller flags; the Tunnel controller falls back to their error backoff.

use std::time::Duration;

use clap::Args;

/// Queue controller settings.
#[derive(Debug, Clone, Args)]
pub struct QueueArgs {
    /// How often a Ready Queue is compared with SQS to catch changes made outside skyport
    /// (each period is shortened by up to 10% at random so reconciles do not bunch up). With
    /// more Queues than half of --sqs-rate can check in this period, the period stretches to
    /// Queues / (--sqs-rate / 2), so new and changed Queues keep the other half.
    #[arg(long = "queue-resync", env = "SKYPORT_QUEUE_RESYNC", default_value = "60s", value_parser = humantime::parse_duration)]
    pub resync: Duration,

    /// How often, at most, a converged queue's tags are re-read (attributes are read every
    /// resync; tags also whenever the spec changes). Stretches like --queue-resync, against
    /// half of --sqs-tag-rate.
    #[arg(long = "queue-tag-resync", env = "SKYPORT_QUEUE_TAG_RESYNC", default_value = "10m", value_parser = humantime::parse_duration)]
    pub tag_resync: Duration,

    /// Queues reconciled in parallel.
    #[arg(long = "queue-concurrency", env = "SKYPORT_QUEUE_CONCURRENCY", default_value_t = 8)]
    pub concurrency: u16,

    /// First retry delay after a transient error; doubles per consecutive failure.
    #[arg(long = "error-backoff-min", env = "SKYPORT_ERROR_BACKOFF_MIN", default_value = "1s", value_parser = humantime::parse_duration)]
    pub backoff_min: Duration,

    /// Longest retry delay after repeated transient errors.
    #[arg(long = "error-backoff-max", env = "SKYPORT_ERROR_BACKOFF_MAX", default_value = "5m", value_parser = humantime::parse_duration)]
    pub backoff_max: Duration,

    /// Retry delay while SQS refuses to reuse a recently deleted queue name (the refusal lasts
    /// 60 s after the deletion).
    #[arg(long = "recently-deleted-retry", env = "SKYPORT_RECENTLY_DELETED_RETRY", default_value = "15s", value_parser = humantime::parse_duration)]
    pub recently_deleted_retry: Duration,
}

impl Default for QueueArgs {
    fn default() -> Self {
        QueueArgs {
            resync: Duration::from_secs(60),
            tag_resync: Duration::from_secs(600),
            concurrency: 8,
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            recently_deleted_retry: Duration::from_secs(15),
        }
    }
}
