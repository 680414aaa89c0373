//! Tunnel and LoadBalancer Service controller flags: which Services get a Tunnel, which exit
//! servers a Tunnel may order, and where those servers get the binary they run.

use std::time::Duration;

use clap::{ArgAction, Args};

use super::QueueArgs;

/// The operator's own image: the default for the tunnel client, which runs `skyport tunnel client`.
pub const OWN_IMAGE: &str = concat!("ghcr.io/skyport-dev/skyport:", env!("CARGO_PKG_VERSION"));
/// Where exit servers download the skyport binary by default: the project's release artifacts.
pub const DEFAULT_EXIT_SERVER_URL: &str =
    "https://github.com/skyport-dev/skyport/releases/download/v{version}/skyport-{arch}";

/// Tunnel settings: which LoadBalancer Services get a Tunnel, and where exit servers run.
#[derive(Debug, Clone, Args)]
pub struct TunnelArgs {
    /// Default provider for exit servers (`local`, `guest`, `ec2`, `digitalocean`, `hetzner`); a Tunnel's
    /// spec.provider overrides it. Without it, and with no cloud token or --ec2-image-id, the
    /// Tunnel controllers do not run. Credentials come from the provider's standard environment:
    /// the AWS chain for ec2, DIGITALOCEAN_TOKEN, HCLOUD_TOKEN; providers whose credentials are
    /// present are configured too (without --provider, a single configured one is the default).
    #[arg(long, env = "SKYPORT_PROVIDER", value_parser = clap::builder::PossibleValuesParser::new(crate::clouds::NAMES))]
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

    /// First retry delay of a Tunnel after a transient error; doubles per consecutive failure
    /// (default: --error-backoff-min, as for Queues).
    #[arg(id = "tunnel_backoff_min", long = "tunnel-error-backoff-min", env = "SKYPORT_TUNNEL_ERROR_BACKOFF_MIN", value_parser = humantime::parse_duration)]
    pub backoff_min: Option<Duration>,

    /// Longest retry delay of a Tunnel after repeated transient errors (default:
    /// --error-backoff-max, as for Queues).
    #[arg(id = "tunnel_backoff_max", long = "tunnel-error-backoff-max", env = "SKYPORT_TUNNEL_ERROR_BACKOFF_MAX", value_parser = humantime::parse_duration)]
    pub backoff_max: Option<Duration>,

    /// Exit-server sizes a Tunnel may ask for (spec.size, from a Service's `skyport.dev/size`),
    /// comma separated; `*` allows any. Empty (the default): a Tunnel may name no size and gets
    /// the provider's default, so whoever can create a LoadBalancer Service cannot order a
    /// larger, costlier server. Checked before an exit server is created.
    #[arg(long = "tunnel-allowed-sizes", env = "SKYPORT_TUNNEL_ALLOWED_SIZES", value_delimiter = ',')]
    pub allowed_sizes: Vec<String>,

    /// Regions a Tunnel may ask for (spec.region, from a Service's `skyport.dev/region`), comma
    /// separated; `*` allows any. Empty (the default): only the provider's default region.
    #[arg(long = "tunnel-allowed-regions", env = "SKYPORT_TUNNEL_ALLOWED_REGIONS", value_delimiter = ',')]
    pub allowed_regions: Vec<String>,

    /// LoadBalancer Services reconciled in parallel.
    #[arg(long = "service-concurrency", env = "SKYPORT_SERVICE_CONCURRENCY", default_value_t = 4)]
    pub service_concurrency: u16,

    /// First retry delay of a Service after a transient error; doubles per consecutive failure
    /// up to --service-error-backoff-max (equal bounds: a fixed delay).
    #[arg(long = "service-error-backoff-min", env = "SKYPORT_SERVICE_ERROR_BACKOFF_MIN", default_value = "5s", value_parser = humantime::parse_duration)]
    pub service_backoff_min: Duration,

    /// Longest retry delay of a Service after repeated transient errors.
    #[arg(long = "service-error-backoff-max", env = "SKYPORT_SERVICE_ERROR_BACKOFF_MAX", default_value = "5s", value_parser = humantime::parse_duration)]
    pub service_backoff_max: Duration,

    /// How often to look for exit servers tagged by skyport whose Tunnel no longer exists and
    /// delete them; 0 turns the sweep off.
    #[arg(long = "orphan-sweep-interval", env = "SKYPORT_ORPHAN_SWEEP_INTERVAL", default_value = "10m", value_parser = humantime::parse_duration)]
    pub orphan_sweep_interval: Duration,

    /// Image of the in-cluster tunnel client, which runs `/skyport tunnel client`: this operator's
    /// own image (the Helm chart and manifests pass the operator's image), so client and exit
    /// server are the same version.
    #[arg(long = "tunnel-client-image", env = "SKYPORT_TUNNEL_CLIENT_IMAGE", default_value = OWN_IMAGE)]
    pub client_image: String,

    /// Namespace of every Tunnel's client Deployment and credentials Secret, and nothing else
    /// (the manifests pass `skyport-tunnels`), so skyport writes no Deployment, and keeps no
    /// Tunnel's keys, in any other namespace. skyport may patch Secrets there, and a patch is a
    /// read: the operator's own namespace (`POD_NAMESPACE`), `default` and `kube-*` are refused.
    /// Unset: beside each Tunnel, in its namespace.
    #[arg(long = "tunnel-client-namespace", env = "SKYPORT_TUNNEL_CLIENT_NAMESPACE", value_parser = client_namespace)]
    pub client_namespace: Option<String>,

    /// Namespace of the Tunnels that run ExitServerPools' shared exit servers (one per pool,
    /// named `pool-<pool>`): skyport's own. Unset: the Pod's namespace (`POD_NAMESPACE`). Only
    /// there does skyport serve a Tunnel without `serviceRef`, and only one its pool controls.
    #[arg(long = "tunnel-pool-namespace", env = "SKYPORT_TUNNEL_POOL_NAMESPACE")]
    pub pool_namespace: Option<String>,

    /// Where exit servers download the skyport binary they run (`skyport tunnel server`).
    /// `{version}` and `{arch}` (`uname -m` of the VM: x86_64, aarch64) are replaced; point it at
    /// a mirror for air-gapped installs. The VM checks the file against the SHA-256 of this
    /// operator's own executable, so the file must be the very binary the operator runs (same
    /// version, same architecture).
    #[arg(long = "exit-server-url", env = "SKYPORT_EXIT_SERVER_URL", default_value = DEFAULT_EXIT_SERVER_URL)]
    pub exit_server_url: String,

    /// Do not check, before buying an exit server, that --exit-server-url serves a file with the
    /// expected SHA-256 (for setups where the VMs reach a mirror the operator cannot). With the
    /// check, a Tunnel whose exit server could only fail reports `ArtifactUnavailable` or
    /// `ArtifactDigestMismatch` instead of creating it.
    #[arg(long = "skip-exit-server-check", env = "SKYPORT_SKIP_EXIT_SERVER_CHECK", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub skip_exit_server_check: bool,

    /// PEM file of CA certificates the operator's exit-server binary check trusts besides the
    /// system's: a `--exit-server-url` mirror with a private CA (the VMs' image must trust it
    /// too).
    #[arg(long = "exit-server-ca-file", env = "SKYPORT_EXIT_SERVER_CA_FILE")]
    pub exit_server_ca_file: Option<std::path::PathBuf>,

    /// `NAME=ADDRESS`: the exit-server binary check reaches host NAME of `--exit-server-url` at
    /// ADDRESS instead of resolving it, for a mirror the VMs know by a name the operator's DNS
    /// does not (the port stays the URL's). Repeatable, or comma-separated.
    #[arg(long = "exit-server-resolve", env = "SKYPORT_EXIT_SERVER_RESOLVE", value_delimiter = ',')]
    pub exit_server_resolve: Vec<String>,

    /// How long a passed exit-server binary check is trusted before the file is downloaded and
    /// checked again (a failed one is retried after at most 30s).
    #[arg(long = "exit-server-check-ttl", env = "SKYPORT_EXIT_SERVER_CHECK_TTL", default_value = "1h", value_parser = humantime::parse_duration)]
    pub exit_server_check_ttl: Duration,

    /// Digest for exit servers of another architecture than the operator's, as ARCH=SHA256
    /// (repeatable, e.g. aarch64=<64 hex digits> for an arm64 VM size under an x86_64 operator).
    /// The operator's own architecture always uses the digest of its own executable.
    #[arg(long = "exit-server-sha256", env = "SKYPORT_EXIT_SERVER_SHA256", value_delimiter = ',')]
    pub exit_server_sha256: Vec<String>,

    /// The executable exit servers of this architecture must match, and the local provider runs:
    /// always the running binary; tests point it at the skyport binary they built.
    #[arg(skip = std::path::PathBuf::from("/proc/self/exe"))]
    pub self_exe: std::path::PathBuf,

    /// TCP port of the tunnel's control channel on the exit server; a Service may not use it.
    #[arg(long = "tunnel-control-port", env = "SKYPORT_TUNNEL_CONTROL_PORT", default_value_t = 2333, value_parser = clap::value_parser!(u16).range(1..))]
    pub control_port: u16,

    /// TCP port of the tunnel's health check on the exit server: the operator sends a nonce there
    /// and only this tunnel's connected client can answer it. A Service may not use it.
    #[arg(long = "tunnel-health-port", env = "SKYPORT_TUNNEL_HEALTH_PORT", default_value_t = 2334, value_parser = clap::value_parser!(u16).range(1..))]
    pub health_port: u16,

    /// How long a new exit server may take until its tunnel passes the health check; after it the
    /// Tunnel reports `TunnelNotEstablished` with a Warning Event.
    #[arg(long = "tunnel-boot-timeout", env = "SKYPORT_TUNNEL_BOOT_TIMEOUT", default_value = "10m", value_parser = humantime::parse_duration)]
    pub boot_timeout: Duration,

    /// How long an exit server may fail the health check (since it was first seen running, or
    /// last passed) before it is replaced by a new one; the clock restarts with the new host.
    #[arg(long = "tunnel-replace-after", env = "SKYPORT_TUNNEL_REPLACE_AFTER", default_value = "15m", value_parser = humantime::parse_duration)]
    pub replace_after: Duration,

    /// How many exit servers in a row skyport replaces because their tunnel does not come up
    /// (each after twice the wait of the one before, starting at --tunnel-replace-after), before
    /// it stops and leaves the Tunnel Ready=False with the cause; an Active tunnel resets the count.
    /// In a highly available pair, the same limit holds per slot for a server failing while the
    /// other serves. A client Deployment that is not available is never a reason to replace the
    /// exit server.
    #[arg(long = "tunnel-max-replacements", env = "SKYPORT_TUNNEL_MAX_REPLACEMENTS", default_value_t = 3)]
    pub max_replacements: u32,

    /// The most exit servers one Tunnel may create per slot (one server, or each of a highly
    /// available pair's two) in any 24 hours, whatever the cause: the first one, replacements of
    /// failing, stopped or lost servers, retries of failed creates. Past it the Tunnel reports
    /// `HostBudgetSpent` and creates nothing until the oldest creation is a day old, so no
    /// failure buys VMs without bound.
    #[arg(long = "tunnel-max-hosts-per-day", env = "SKYPORT_TUNNEL_MAX_HOSTS_PER_DAY", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_hosts_per_day: u32,

    /// The most exit servers this operator process creates in any hour, for all Tunnels
    /// together, whatever the cause. The daily budget above is kept in each Tunnel's status; this
    /// one is kept in the process, where no Kubernetes token reaches, so that erasing that status
    /// or deleting Tunnels that skyport makes again for their Services cannot buy VMs without
    /// bound. Past it a Tunnel that needs a server reports `HostBudgetSpent` until one is free.
    #[arg(long = "tunnel-max-hosts-per-hour", env = "SKYPORT_TUNNEL_MAX_HOSTS_PER_HOUR", default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_hosts_per_hour: u32,

    /// A file where this process appends the time of each exit server it creates, and reads at
    /// start, so that a restarted process (one that lost its Lease, say) resumes the hourly
    /// budget above instead of starting a fresh hour. Keep it on a volume no Kubernetes API
    /// reaches (the manifests use an emptyDir, which outlives the container); unset, the hourly
    /// budget lives in the process only.
    #[arg(long = "tunnel-creations-file", env = "SKYPORT_TUNNEL_CREATIONS_FILE", value_name = "PATH")]
    pub creations_file: Option<std::path::PathBuf>,

    /// How long an exit server must fail the health check before its address is taken off the
    /// Service, so that a single failed probe does not flap the address (and DNS built on it);
    /// 0 withdraws it at the first failure. A replaced host's address always goes first.
    #[arg(long = "tunnel-withdraw-after", env = "SKYPORT_TUNNEL_WITHDRAW_AFTER", default_value = "30s", value_parser = humantime::parse_duration)]
    pub withdraw_after: Duration,

    /// highAvailability Tunnels: how many health checks in a row the active exit server must
    /// fail before its address moves to the standby (together with `--tunnel-failover-after`).
    #[arg(long = "tunnel-failover-after-failures", env = "SKYPORT_TUNNEL_FAILOVER_AFTER_FAILURES", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub failover_failures: u32,

    /// highAvailability Tunnels: how long the active exit server must have been failing the
    /// health check before its address moves to the standby; a shorter failure is a blip.
    #[arg(long = "tunnel-failover-after", env = "SKYPORT_TUNNEL_FAILOVER_AFTER", default_value = "2s", value_parser = humantime::parse_duration)]
    pub failover_after: Duration,

    /// highAvailability Tunnels: how often both exit servers are checked end to end.
    #[arg(long = "tunnel-failover-probe-interval", env = "SKYPORT_TUNNEL_FAILOVER_PROBE_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub failover_probe_interval: Duration,

    /// local provider: directory holding one folder per exit server process.
    #[arg(long = "local-state-dir", env = "SKYPORT_LOCAL_STATE_DIR", default_value = "/tmp/skyport-local-hosts")]
    pub local_state_dir: std::path::PathBuf,

    /// local provider: the addresses exit servers bind, as FIRST-LAST. The default, inside
    /// 127.0.0.0/8, is reachable only from this network namespace; a range the machine routes
    /// locally (`ip route add local 10.204.0.0/24 dev lo`) also serves Pods, when the operator
    /// runs with the host's network (Helm: tunnel.local.hostNetwork).
    #[arg(long = "local-addresses", env = "SKYPORT_LOCAL_ADDRESSES", default_value = "127.77.0.1-127.77.255.254", value_parser = address_range, value_name = "FIRST-LAST")]
    pub local_addresses: (std::net::Ipv4Addr, std::net::Ipv4Addr),

    /// guest provider: the root file system every guest boots an overlay of (Debian with
    /// cloud-init, from tests/env/build-guest.sh). Required by `--provider guest`.
    #[arg(long = "guest-rootfs", env = "SKYPORT_GUEST_ROOTFS")]
    pub guest_rootfs: Option<std::path::PathBuf>,

    /// guest provider: directory holding one folder per guest (its overlay, console log, tags).
    #[arg(long = "guest-state-dir", env = "SKYPORT_GUEST_STATE_DIR", default_value = "/var/lib/skyport-guests")]
    pub guest_state_dir: std::path::PathBuf,

    /// guest provider: PEM file of CA certificates the guests trust besides Debian's, for an
    /// `--exit-server-url` mirror with a private CA (guests reach this machine as
    /// `host.skyport.internal`).
    #[arg(long = "guest-ca-file", env = "SKYPORT_GUEST_CA_FILE")]
    pub guest_ca_file: Option<std::path::PathBuf>,

    /// ec2 provider: AMI of the exit servers in the default region (a Debian or Ubuntu image with
    /// cloud-init).
    #[arg(long = "ec2-image-id", env = "SKYPORT_EC2_IMAGE_ID")]
    pub ec2_image_id: Option<String>,

    /// ec2 provider: subnets of the exit servers in the default region, comma-separated, one per
    /// availability zone and all of one VPC (needed where the region has no default VPC); their
    /// security groups go to that VPC. A single exit server takes the first; a highly available
    /// Tunnel's two take different ones, so two or more put them in different zones. Each must
    /// give instances a public IPv4 address and route to an internet gateway. Default: the
    /// default VPC.
    #[arg(long = "ec2-subnet-ids", env = "SKYPORT_EC2_SUBNET_IDS", value_delimiter = ',')]
    pub ec2_subnet_ids: Vec<String>,

    /// ec2 provider: another region a Tunnel may name in `spec.region`, with its AMI (AMI ids
    /// are regional), as REGION=AMI; repeat the flag or separate with commas. A region not listed
    /// (nor the default one) is refused with a message naming the configured ones; these regions
    /// are also swept for orphans.
    #[arg(long = "ec2-region-image", env = "SKYPORT_EC2_REGION_IMAGES", value_delimiter = ',', value_parser = region_image, value_name = "REGION=AMI")]
    pub ec2_region_images: Vec<(String, String)>,

    /// hetzner provider: location of exit servers, primary IPs and floating IPs (their home
    /// location) when a Tunnel names no region (an unassigned primary IP must have one, and is
    /// assigned only within it).
    #[arg(long = "hetzner-location", env = "SKYPORT_HETZNER_LOCATION", default_value = providers::hetzner::DEFAULT_LOCATION)]
    pub hetzner_location: String,

    /// Identity of this cluster, tagged on every exit server so that orphan sweeps of clusters
    /// sharing a cloud account leave each other's hosts alone (default: the UID of the
    /// kube-system namespace).
    /// Empty is refused: every cluster with an empty id would sweep the others' hosts and share
    /// their external ids.
    #[arg(long = "cluster-id", env = "SKYPORT_CLUSTER_ID", value_parser = cluster_id)]
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
            backoff_min: None,
            backoff_max: None,
            allowed_sizes: Vec::new(),
            allowed_regions: Vec::new(),
            service_concurrency: 4,
            service_backoff_min: Duration::from_secs(5),
            service_backoff_max: Duration::from_secs(5),
            orphan_sweep_interval: Duration::from_secs(600),
            client_image: OWN_IMAGE.into(),
            client_namespace: None,
            pool_namespace: None,
            exit_server_url: DEFAULT_EXIT_SERVER_URL.into(),
            exit_server_sha256: Vec::new(),
            skip_exit_server_check: false,
            exit_server_ca_file: None,
            exit_server_resolve: Vec::new(),
            exit_server_check_ttl: Duration::from_secs(3600),
            self_exe: "/proc/self/exe".into(),
            control_port: 2333,
            health_port: 2334,
            boot_timeout: Duration::from_secs(600),
            replace_after: Duration::from_secs(900),
            withdraw_after: Duration::from_secs(30),
            failover_failures: 3,
            failover_after: Duration::from_secs(2),
            failover_probe_interval: Duration::from_secs(1),
            max_replacements: 3,
            max_hosts_per_day: 10,
            max_hosts_per_hour: 60,
            creations_file: None,
            local_state_dir: "/tmp/skyport-local-hosts".into(),
            local_addresses: (std::net::Ipv4Addr::new(127, 77, 0, 1), std::net::Ipv4Addr::new(127, 77, 255, 254)),
            guest_rootfs: None,
            guest_state_dir: "/var/lib/skyport-guests".into(),
            guest_ca_file: None,
            ec2_image_id: None,
            ec2_subnet_ids: Vec::new(),
            ec2_region_images: Vec::new(),
            hetzner_location: providers::hetzner::DEFAULT_LOCATION.into(),
            cluster_id: None,
        }
    }
}

impl TunnelArgs {
    /// The Tunnel controller's error backoff: its own flags, else the Queue controller's.
    pub fn backoff(&self, queue: &QueueArgs) -> crate::controllers::Backoff {
        crate::controllers::Backoff::new(
            self.backoff_min.unwrap_or(queue.backoff_min),
            self.backoff_max.unwrap_or(queue.backoff_max),
        )
    }

    /// Where pools' shared servers live: `--tunnel-pool-namespace`, else the Pod's namespace.
    pub fn pools_namespace(&self) -> Option<String> {
        self.pool_namespace.clone().or_else(|| std::env::var("POD_NAMESPACE").ok()).filter(|ns| !ns.is_empty())
    }

    /// Where exit servers get their binary and the digests they check, derived from
    /// [`TunnelArgs::self_exe`] (the digest is cached after the first read).
    pub fn exit_server_artifacts(&self) -> Result<Vec<providers::Artifact>, crate::tunnel::ArtifactError> {
        crate::tunnel::exit_server_artifacts(&self.artifact_settings()?)
    }

    pub fn artifact_settings(&self) -> Result<crate::tunnel::ArtifactSettings, crate::tunnel::ArtifactError> {
        Ok(crate::tunnel::ArtifactSettings {
            url_template: self.exit_server_url.clone(),
            self_exe: self.self_exe.clone(),
            other_arches: crate::tunnel::parse_digests(&self.exit_server_sha256)?,
        })
    }
}

/// `REGION=AMI` of `--ec2-region-image`.
fn address_range(text: &str) -> Result<(std::net::Ipv4Addr, std::net::Ipv4Addr), String> {
    let (first, last) = text.split_once('-').ok_or_else(|| format!("{text:?} is not FIRST-LAST"))?;
    let parse = |a: &str| a.trim().parse::<std::net::Ipv4Addr>().map_err(|e| format!("{a:?}: {e}"));
    let (first, last) = (parse(first)?, parse(last)?);
    if u32::from(first) > u32::from(last) {
        return Err(format!("{first} comes after {last}"));
    }
    Ok((first, last))
}

/// `--tunnel-client-namespace`, checked against the Pod's own namespace.
fn client_namespace(text: &str) -> Result<String, String> {
    shared_client_namespace(text, std::env::var("POD_NAMESPACE").ok().as_deref())?;
    Ok(text.to_string())
}

/// Why `namespace` cannot hold the tunnel clients when the operator runs in `own`: a namespace
/// whose other Secrets a patch of skyport's would read (its own cloud credentials, the
/// cluster's service-account tokens, whatever users keep in `default`).
pub fn shared_client_namespace(namespace: &str, own: Option<&str>) -> Result<(), String> {
    let system = ["default", "kube-system", "kube-public", "kube-node-lease"];
    if own == Some(namespace) || system.contains(&namespace) {
        return Err(format!(
            "the tunnel clients cannot live in {namespace:?}: skyport may patch Secrets in their namespace, and a \
             patch is a read of every Secret there; give them a namespace of their own (the manifests use skyport-tunnels)"
        ));
    }
    Ok(())
}

/// `--cluster-id`: anything but empty or blank.
fn cluster_id(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err(
            "the cluster id must not be empty: it is what keeps the orphan sweeps and external ids of clusters \
                    sharing a cloud account apart; pass an id unique among them, or leave the flag out to use the \
                    kube-system namespace's UID"
                .into(),
        );
    }
    Ok(text.to_string())
}

fn region_image(text: &str) -> Result<(String, String), String> {
    let (region, ami) = text.split_once('=').ok_or_else(|| format!("{text:?} is not REGION=AMI"))?;
    let (region, ami) = (region.trim(), ami.trim());
    let region_ok =
        !region.is_empty() && region.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !region_ok {
        return Err(format!("{region:?} is not an AWS region name (like eu-west-1)"));
    }
    if !ami.starts_with("ami-") || ami.len() < 5 {
        return Err(format!("{ami:?} is not an AMI id (ami-...)"));
    }
    Ok((region.to_string(), ami.to_string()))
}

#[cfg(test)]
mod tests;
