//! Leader-election flags of `skyport run`; `crate::leader` holds the Lease they configure.

use std::time::Duration;

use clap::{ArgAction, Args};

/// Leader election: with several replicas, only the holder of a coordination.k8s.io Lease runs
/// the controllers; the others wait and take over when the lease expires.
#[derive(Debug, Clone, Args)]
pub struct LeaderArgs {
    /// Run the controllers only while holding the Lease (needed with more than one replica).
    #[arg(long = "leader-elect", env = "SKYPORT_LEADER_ELECT", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enabled: bool,

    /// Several active replicas: each holds the Leases of some shards (Queues by AwsAccount,
    /// Tunnels as one shard) and acts on their objects only; replaces --leader-elect.
    #[arg(long = "sharding", env = "SKYPORT_SHARDING", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", conflicts_with = "enabled")]
    pub sharding: bool,

    /// Name of the Lease (with --sharding: the prefix of the shard and replica Leases).
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::{Cli, Command};

    #[test]
    fn leader_election_is_off_by_default_and_takes_a_lease_duration() {
        let cli = Cli::try_parse_from(["skyport", "run"]).unwrap();
        let Command::Run(run) = cli.command else { panic!("expected run") };
        assert!(!run.leader.enabled && !run.leader.sharding);
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
        let sharded = Cli::try_parse_from(["skyport", "run", "--sharding"]).unwrap();
        let Command::Run(run) = sharded.command else { panic!("expected run") };
        assert!(run.leader.sharding && !run.leader.enabled);
        assert!(Cli::try_parse_from(["skyport", "run", "--sharding", "--leader-elect"]).is_err(), "one or the other");
        let twice = Cli::try_parse_from(["skyport", "run", "--queue-resync=60s", "--queue-resync=30s"]).unwrap();
        let Command::Run(run) = twice.command else { panic!("expected run") };
        assert_eq!(run.queue.resync, Duration::from_secs(30), "the last occurrence wins");
    }
}
