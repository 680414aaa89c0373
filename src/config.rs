//! Command line and environment configuration.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand};

use crate::telemetry::LogFormat;

/// skyport: provisions cloud resources declared as Kubernetes objects.
#[derive(Debug, Parser)]
#[command(name = "skyport", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controllers against the current kubeconfig or the in-cluster config.
    // A flag given twice takes the last value, so manifests can append overrides.
    #[command(args_override_self = true)]
    Run(Box<RunArgs>),
    /// Print the CustomResourceDefinitions as YAML (what `crds/` holds).
    Crds {
        /// Write one file per CRD (`<singular>.yaml`) into this directory instead of printing.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
}

/// Settings of `skyport run`. Every flag can also be set through the environment variable shown.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "SKYPORT_NAMESPACE")]
    pub namespace: Option<String>,

    /// Log format.
    #[arg(long, env = "SKYPORT_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Address of the HTTP server for /healthz, /readyz and /metrics (port 0 picks a free port;
    /// the address is logged). Loopback by default; in a Pod the manifests pass 0.0.0.0:8080 so
    /// the kubelet's probes and Prometheus reach it.
    #[arg(long, env = "SKYPORT_LISTEN_ADDRESS", default_value = "127.0.0.1:8080")]
    pub listen_address: SocketAddr,

    #[command(flatten)]
    pub leader: LeaderArgs,

    #[command(flatten)]
    pub queue: QueueArgs,

    #[command(flatten)]
    pub aws: AwsArgs,

    #[command(flatten)]
    pub tunnel: TunnelArgs,
}

/// Leader election: with several replicas, only the holder of a coordination.k8s.io Lease runs
/// the controllers; the others wait and take over when the lease expires.
#[derive(Debug, Clone, Args)]
pub struct LeaderArgs {
    /// Run the controllers only while holding the Lease (needed with more than one replica).
    #[arg(long = "leader-elect", env = "SKYPORT_LEADER_ELECT", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enabled: bool,

    /// Name of the Lease.
    #[arg(long = "lease-name", env = "SKYPORT_LEASE_NAME", default_value = "skyport")]
    pub lease_name: String,

    /// Namespace of the Lease (default: POD_NAMESPACE, else the kubeconfig's namespace).
    #[arg(long = "lease-namespace", env = "SKYPORT_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// How long the Lease stays valid without renewal: a standby takes over within this long
    /// after the leader's last renewal (plus up to a second). The leader renews half of it
    /// before expiry.
    #[arg(long = "lease-duration", env = "SKYPORT_LEASE_DURATION", default_value = "15s", value_parser = parse_lease_duration)]
    pub lease_duration: Duration,
}

fn parse_lease_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_secs(3) || d.subsec_nanos() != 0 {
        return Err("must be whole seconds, at least 3s".into());
    }
    Ok(d)
}

/// Queue controller settings.
#[derive(Debug, Clone, Args)]
pub struct QueueArgs {
    /// How often a Ready Queue is compared with SQS to catch changes made outside skyport
    /// (each period is shortened by up to 10% at random so reconciles do not bunch up).
    #[arg(long = "queue-resync", env = "SKYPORT_QUEUE_RESYNC", default_value = "60s", value_parser = humantime::parse_duration)]
    pub resync: Duration,

    /// How often, at most, a converged queue's tags are re-read (attributes are read every
    /// resync; tags also whenever the spec changes).
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

/// AWS settings. Credentials and endpoints come from the standard AWS chain: AWS_ACCESS_KEY_ID /
/// AWS_SECRET_ACCESS_KEY, AWS_PROFILE, web identity (IRSA), EKS Pod Identity; AWS_ENDPOINT_URL or
/// AWS_ENDPOINT_URL_SQS point at an emulator such as LocalStack.
#[derive(Debug, Clone, Args)]
pub struct AwsArgs {
    /// AWS region (default: AWS_REGION / AWS_DEFAULT_REGION / profile).
    #[arg(long = "aws-region", env = "SKYPORT_AWS_REGION")]
    pub region: Option<String>,

    /// Sustained SQS control-plane calls per second, for all Queues together.
    #[arg(long = "sqs-rate", env = "SKYPORT_SQS_RATE", default_value = "20")]
    pub sqs_rate: NonZeroU32,

    /// SQS calls allowed in a burst above the sustained rate.
    #[arg(long = "sqs-burst", env = "SKYPORT_SQS_BURST", default_value = "40")]
    pub sqs_burst: NonZeroU32,
}

/// Tunnel settings: which LoadBalancer Services get a Tunnel, and where exit servers run.
#[derive(Debug, Clone, Args)]
pub struct TunnelArgs {
    /// Default provider for exit servers (`local`, `ec2`, `digitalocean`, `hetzner`); a Tunnel's
    /// spec.provider overrides it. Without it the Tunnel controllers do not run. Credentials come
    /// from the provider's standard environment: the AWS chain for ec2, DIGITALOCEAN_TOKEN,
    /// HCLOUD_TOKEN; providers whose credentials are present are configured too.
    #[arg(long, env = "SKYPORT_PROVIDER", value_parser = ["local", "ec2", "digitalocean", "hetzner"])]
    pub provider: Option<String>,

    /// Also serve LoadBalancer Services without a loadBalancerClass, as a cluster's default load
    /// balancer does. Without it only class `skyport.dev/tunnel` is served.
    #[arg(long = "default-load-balancer", env = "SKYPORT_DEFAULT_LOAD_BALANCER", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub default_load_balancer: bool,

    /// Serve only Services annotated `skyport.dev/tunnel: "true"` (instead of every eligible one
    /// not annotated "false").
    #[arg(long = "annotated-only", env = "SKYPORT_ANNOTATED_ONLY", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub annotated_only: bool,

    /// How often an Active Tunnel re-reads its exit server, to replace one deleted or stopped
    /// outside skyport (shortened by up to 10% at random).
    #[arg(id = "tunnel_resync", value_name = "TUNNEL_RESYNC", long = "tunnel-resync", env = "SKYPORT_TUNNEL_RESYNC", default_value = "60s", value_parser = humantime::parse_duration)]
    pub resync: Duration,

    /// Tunnels reconciled in parallel.
    #[arg(
        id = "tunnel_concurrency",
        value_name = "TUNNEL_CONCURRENCY",
        long = "tunnel-concurrency",
        env = "SKYPORT_TUNNEL_CONCURRENCY",
        default_value_t = 4
    )]
    pub concurrency: u16,

    /// How often to look for exit servers tagged by skyport whose Tunnel no longer exists and
    /// delete them; 0 turns the sweep off.
    #[arg(long = "orphan-sweep-interval", env = "SKYPORT_ORPHAN_SWEEP_INTERVAL", default_value = "10m", value_parser = humantime::parse_duration)]
    pub orphan_sweep_interval: Duration,

    /// Image of the in-cluster tunnel client (rathole; must match the exit server's version).
    #[arg(
        long = "tunnel-client-image",
        env = "SKYPORT_TUNNEL_CLIENT_IMAGE",
        default_value = "docker.io/rapiz1/rathole:v0.5.0"
    )]
    pub client_image: String,

    /// TCP port of the tunnel's control channel on the exit server; a Service may not use it.
    #[arg(long = "tunnel-control-port", env = "SKYPORT_TUNNEL_CONTROL_PORT", default_value_t = 2333, value_parser = clap::value_parser!(u16).range(1..))]
    pub control_port: u16,

    /// local provider: directory holding one folder per exit server process.
    #[arg(long = "local-state-dir", env = "SKYPORT_LOCAL_STATE_DIR", default_value = "/tmp/skyport-local-hosts")]
    pub local_state_dir: std::path::PathBuf,

    /// local provider: the rathole binary the exit servers run.
    #[arg(long = "local-rathole", env = "SKYPORT_RATHOLE", default_value = "rathole")]
    pub local_rathole: std::path::PathBuf,

    /// ec2 provider: AMI of the exit servers (a Debian or Ubuntu image with cloud-init).
    #[arg(long = "ec2-image-id", env = "SKYPORT_EC2_IMAGE_ID")]
    pub ec2_image_id: Option<String>,

    /// Identity of this cluster, tagged on every exit server so that orphan sweeps of clusters
    /// sharing a cloud account leave each other's hosts alone (default: the UID of the
    /// kube-system namespace).
    #[arg(long = "cluster-id", env = "SKYPORT_CLUSTER_ID")]
    pub cluster_id: Option<String>,
}

impl Default for TunnelArgs {
    fn default() -> Self {
        TunnelArgs {
            provider: None,
            default_load_balancer: false,
            annotated_only: false,
            resync: Duration::from_secs(60),
            concurrency: 4,
            orphan_sweep_interval: Duration::from_secs(600),
            client_image: "docker.io/rapiz1/rathole:v0.5.0".into(),
            control_port: 2333,
            local_state_dir: "/tmp/skyport-local-hosts".into(),
            local_rathole: "rathole".into(),
            ec2_image_id: None,
            cluster_id: None,
        }
    }
}

impl AwsArgs {
    pub fn sqs_settings(&self) -> providers::SqsSettings {
        providers::SqsSettings {
            region: self.region.clone(),
            rate_per_second: self.sqs_rate,
            burst: self.sqs_burst,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_durations_and_limits() {
        let cli =
            Cli::try_parse_from(["skyport", "run", "--queue-resync", "5s", "--sqs-rate", "3", "--namespace", "team-a"])
                .unwrap();
        let Command::Run(run) = cli.command else { panic!("expected run") };
        assert_eq!(run.queue.resync, Duration::from_secs(5));
        assert_eq!(run.aws.sqs_rate.get(), 3);
        assert_eq!(run.namespace.as_deref(), Some("team-a"));
    }

    #[test]
    fn leader_election_is_off_by_default_and_takes_a_lease_duration() {
        let cli = Cli::try_parse_from(["skyport", "run"]).unwrap();
        let Command::Run(run) = cli.command else { panic!("expected run") };
        assert!(!run.leader.enabled);
        assert_eq!(run.leader.lease_name, "skyport");
        assert_eq!(run.listen_address.to_string(), "127.0.0.1:8080");
        let cli = Cli::try_parse_from([
            "skyport",
            "run",
            "--leader-elect",
            "--lease-duration",
            "5s",
            "--listen-address",
            "127.0.0.1:0",
        ])
        .unwrap();
        let Command::Run(run) = cli.command else { panic!("expected run") };
        assert!(run.leader.enabled);
        assert_eq!(run.leader.lease_duration, Duration::from_secs(5));
        let off = Cli::try_parse_from(["skyport", "run", "--leader-elect=false"]).unwrap();
        let Command::Run(run) = off.command else { panic!("expected run") };
        assert!(!run.leader.enabled);
        assert!(Cli::try_parse_from(["skyport", "run", "--lease-duration", "1500ms"]).is_err());
        let twice = Cli::try_parse_from(["skyport", "run", "--queue-resync=60s", "--queue-resync=30s"]).unwrap();
        let Command::Run(run) = twice.command else { panic!("expected run") };
        assert_eq!(run.queue.resync, Duration::from_secs(30), "the last occurrence wins");
    }

    #[test]
    fn a_zero_rate_is_refused() {
        assert!(Cli::try_parse_from(["skyport", "run", "--sqs-rate", "0"]).is_err());
    }
}
