//! Command line and environment configuration.
//!
//! The subcommand tree and the top of `skyport run` live here; each flag group `RunArgs` flattens
//! in has its own module, re-exported so callers keep naming `config::QueueArgs` and the rest.

use std::net::SocketAddr;

use clap::{Args, Parser, Subcommand};

use crate::telemetry::LogFormat;

mod aws;
mod leader;
mod queue;
mod tunnel;

pub use aws::AwsArgs;
pub use leader::LeaderArgs;
pub use queue::{NameGrant, OwnershipKey, QueueArgs};
pub use tunnel::{DEFAULT_EXIT_SERVER_URL, OWN_IMAGE, TunnelArgs};

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
    /// Run one end of a tunnel (rathole 0.5.0 built in): `server` on an exit server, `client` in
    /// the cluster's tunnel client Deployment.
    Tunnel {
        #[command(subcommand)]
        role: TunnelRole,
    },
    /// Print the CustomResourceDefinitions as YAML (what `crds/` holds).
    Crds {
        /// Write one file per CRD (`<singular>.yaml`) into this directory instead of printing.
        #[arg(long, conflicts_with = "write_all")]
        dir: Option<std::path::PathBuf>,
        /// Write one file per CRD into every directory of the repository that holds them
        /// (`crds/`, `deploy/crds/` for kustomize, `deploy/helm/skyport/crds/` for Helm), relative
        /// to the current directory: kustomize and Helm cannot read files outside their roots.
        #[arg(long)]
        write_all: bool,
    },
}

/// The two ends of a tunnel.
#[derive(Debug, Subcommand)]
pub enum TunnelRole {
    /// The exit server: publishes the ports its configuration lists and forwards them to the
    /// connected client (the configuration is reloaded when the file changes).
    Server {
        /// rathole server configuration (`[server]`), as the operator renders it.
        #[arg(long)]
        config: std::path::PathBuf,
        /// TCP port, on the control channel's address, where the operator pushes new
        /// configurations (sealed with a key derived from the server's Noise key); 0 turns
        /// pushes off.
        #[arg(long, default_value_t = providers::exit::push::PUSH_PORT)]
        push_port: u16,
        /// A file naming a reserved IPv4 address to forward, on every service port, to this
        /// server's own listeners (the local provider's moving address), after the request's
        /// generation; the server repeats the request in `<file>.bound` once it listens there.
        /// Not set on cloud VMs, where the cloud routes the reserved address.
        #[arg(long)]
        forward_file: Option<std::path::PathBuf>,
    },
    /// Renders the exit server's nftables ruleset from the ports of a server configuration
    /// (run as root by the VM's firewall unit after each config push).
    Firewall {
        /// rathole server configuration to read the ports from.
        #[arg(long)]
        config: std::path::PathBuf,
        /// Where to write the ruleset (replaced through a rename).
        #[arg(long)]
        output: std::path::PathBuf,
        /// The push port to keep open; 0 for none.
        #[arg(long, default_value_t = providers::exit::push::PUSH_PORT)]
        push_port: u16,
    },
    /// Puts the IPv4 addresses a server configuration's services are bound to on the interface
    /// of the default route, and removes those it put there that are no longer bound (run as
    /// root by the VM's firewall unit at boot and after each config push).
    Addresses {
        /// rathole server configuration to read the bound addresses from.
        #[arg(long)]
        config: std::path::PathBuf,
        /// Where the addresses it put on the interface are recorded; only those are ever removed.
        #[arg(long, default_value = crate::tunnel::addresses::STATE_PATH)]
        state: std::path::PathBuf,
    },
    /// The in-cluster client: dials the exit server and forwards each service to its
    /// `local_addr`; also answers the operator's health check on the `skyport-health` service.
    Client {
        /// rathole client configuration (`[client]`), as the operator renders it.
        #[arg(long)]
        config: std::path::PathBuf,
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

    /// Start even when no ValidatingAdmissionPolicy covers this operator's identity (checked at
    /// start with a dry-run probe). Unsafe: only for clusters that cannot have the policies; a
    /// stolen token then writes every Secret, ConfigMap, Queue, Tunnel and AwsAccount its RBAC
    /// reaches (docs/security.md).
    #[arg(long = "allow-without-admission-policies", env = "SKYPORT_ALLOW_WITHOUT_ADMISSION_POLICIES")]
    pub allow_without_admission_policies: bool,
}

impl RunArgs {
    /// Where the admission probe asks to create a Secret: the tunnel clients' namespace (RBAC
    /// lets skyport create Secrets there in every install, so only a policy can refuse it), else
    /// its Pod's, else the client configuration's default.
    pub fn probe_namespace(&self, client: &kube::Client) -> String {
        self.tunnel
            .client_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| client.default_namespace().to_string())
    }
}

#[cfg(test)]
mod docs_tests;

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
    fn the_tunnel_subcommands_take_a_config_file() {
        let cli = Cli::try_parse_from(["skyport", "tunnel", "client", "--config", "/etc/skyport/client.toml"]).unwrap();
        let Command::Tunnel { role: TunnelRole::Client { config } } = cli.command else { panic!("expected client") };
        assert_eq!(config, std::path::Path::new("/etc/skyport/client.toml"));
        assert!(Cli::try_parse_from(["skyport", "tunnel", "server"]).is_err(), "--config is required");
        let cli =
            Cli::try_parse_from(["skyport", "tunnel", "addresses", "--config", "/etc/skyport/server.toml"]).unwrap();
        let Command::Tunnel { role: TunnelRole::Addresses { state, .. } } = cli.command else { panic!("addresses") };
        assert_eq!(state, std::path::Path::new("/run/skyport/bound-addresses"), "on a tmpfs, like the addresses");
        let cli = Cli::try_parse_from(["skyport", "run", "--exit-server-sha256", "aarch64=ab,riscv64=cd"]).unwrap();
        let Command::Run(run) = cli.command else { panic!("expected run") };
        assert_eq!(run.tunnel.exit_server_sha256, ["aarch64=ab", "riscv64=cd"]);
        assert_eq!(run.tunnel.self_exe, std::path::Path::new("/proc/self/exe"));
        assert_eq!(run.tunnel.client_image, OWN_IMAGE);
    }
}
