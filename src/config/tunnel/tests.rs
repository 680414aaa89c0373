use clap::Parser;

use super::*;
use crate::config::{Cli, Command};

#[test]
fn ec2_region_images_are_region_ami_pairs_repeated_or_comma_separated() {
    let cli = Cli::try_parse_from([
        "skyport",
        "run",
        "--ec2-region-image",
        "eu-west-1=ami-0a, us-east-2=ami-0b",
        "--ec2-region-image=ap-south-1=ami-0c",
    ])
    .unwrap();
    let Command::Run(run) = cli.command else { panic!("expected run") };
    let pairs: Vec<(&str, &str)> = run.tunnel.ec2_region_images.iter().map(|(r, a)| (r.as_str(), a.as_str())).collect();
    assert_eq!(pairs, [("eu-west-1", "ami-0a"), ("us-east-2", "ami-0b"), ("ap-south-1", "ami-0c")]);
    for bad in ["eu-west-1", "eu-west-1=", "EU=ami-1", "eu-west-1=img-1"] {
        let err = Cli::try_parse_from(["skyport", "run", "--ec2-region-image", bad]).unwrap_err().to_string();
        assert!(err.contains("REGION=AMI") || err.contains("region") || err.contains("AMI"), "{bad}: {err}");
    }
}

#[test]
fn local_addresses_are_an_ascending_range() {
    let cli = Cli::try_parse_from(["skyport", "run", "--local-addresses", "10.204.0.1-10.204.0.254"]).unwrap();
    let Command::Run(run) = cli.command else { panic!("expected run") };
    assert_eq!(run.tunnel.local_addresses, ("10.204.0.1".parse().unwrap(), "10.204.0.254".parse().unwrap()));
    for bad in ["10.204.0.1", "10.204.0.9-10.204.0.1", "10.204.0.1-x"] {
        assert!(Cli::try_parse_from(["skyport", "run", "--local-addresses", bad]).is_err(), "{bad}");
    }
}

#[test]
fn tunnel_backoff_defaults_to_the_shared_flags_and_service_keeps_its_fixed_retry() {
    let cli = Cli::try_parse_from(["skyport", "run", "--error-backoff-min", "2s"]).unwrap();
    let Command::Run(run) = cli.command else { panic!("expected run") };
    let backoff = run.tunnel.backoff(&run.queue);
    assert!(backoff.delay_for(0) <= Duration::from_secs(2) && backoff.delay_for(0) >= Duration::from_millis(1500));
    assert_eq!(run.tunnel.service_concurrency, 4);
    assert_eq!(
        (run.tunnel.service_backoff_min, run.tunnel.service_backoff_max),
        (Duration::from_secs(5), Duration::from_secs(5))
    );
    let cli = Cli::try_parse_from([
        "skyport",
        "run",
        "--error-backoff-min",
        "2s",
        "--tunnel-error-backoff-min",
        "10s",
        "--tunnel-error-backoff-max",
        "10s",
    ])
    .unwrap();
    let Command::Run(run) = cli.command else { panic!("expected run") };
    assert_eq!(run.tunnel.backoff(&run.queue).delay_for(3), Duration::from_secs(10));
    assert!(Cli::try_parse_from(["skyport", "run", "--provider", "nowhere"]).is_err());
}

#[test]
fn the_exit_server_check_is_on_by_default_and_the_subnet_unset() {
    let cli = Cli::try_parse_from(["skyport", "run"]).unwrap();
    let Command::Run(run) = cli.command else { panic!("expected run") };
    assert!(!run.tunnel.skip_exit_server_check && run.tunnel.ec2_subnet_ids.is_empty());
    assert_eq!(run.tunnel.exit_server_check_ttl, Duration::from_secs(3600));
    let cli = Cli::try_parse_from([
        "skyport",
        "run",
        "--skip-exit-server-check",
        "--exit-server-check-ttl=5m",
        "--ec2-subnet-ids=subnet-0a,subnet-0b",
    ])
    .unwrap();
    let Command::Run(run) = cli.command else { panic!("expected run") };
    assert!(run.tunnel.skip_exit_server_check);
    assert_eq!(run.tunnel.exit_server_check_ttl, Duration::from_secs(300));
    assert_eq!(run.tunnel.ec2_subnet_ids, ["subnet-0a", "subnet-0b"]);
}

#[test]
fn allowed_sizes_and_regions_are_comma_lists_empty_by_default() {
    let cli = Cli::try_parse_from(["skyport", "run"]).unwrap();
    let Command::Run(run) = cli.command else { panic!("expected run") };
    assert!(run.tunnel.allowed_sizes.is_empty() && run.tunnel.allowed_regions.is_empty());
    let cli = Cli::try_parse_from([
        "skyport",
        "run",
        "--tunnel-allowed-sizes",
        "t3.nano,t3.micro",
        "--tunnel-allowed-regions=fra1",
    ])
    .unwrap();
    let Command::Run(run) = cli.command else { panic!("expected run") };
    assert_eq!(run.tunnel.allowed_sizes, ["t3.nano", "t3.micro"]);
    assert_eq!(run.tunnel.allowed_regions, ["fra1"]);
}

#[test]
fn an_empty_cluster_id_is_refused_rather_than_turning_cluster_separation_off() {
    for empty in ["", "  "] {
        let err = Cli::try_parse_from(["skyport", "run", "--cluster-id", empty]).expect_err("an empty cluster id");
        assert!(err.to_string().contains("must not be empty"), "{err}");
    }
    let cli = Cli::try_parse_from(["skyport", "run", "--cluster-id", "prod-eu"]).unwrap();
    let Command::Run(run) = cli.command else { panic!("expected run") };
    assert_eq!(run.tunnel.cluster_id.as_deref(), Some("prod-eu"));
    let cli = Cli::try_parse_from(["skyport", "run"]).unwrap();
    let Command::Run(run) = cli.command else { panic!("expected run") };
    assert_eq!(run.tunnel.cluster_id, None, "left out: the kube-system namespace's UID");
}

#[test]
fn the_tunnel_clients_never_share_a_namespace_whose_secrets_a_patch_would_read() {
    for shared in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let err = Cli::try_parse_from(["skyport", "run", "--tunnel-client-namespace", shared]).expect_err(shared);
        assert!(err.to_string().contains("a patch is a read"), "{err}");
    }
    let own = super::shared_client_namespace("skyport-system", Some("skyport-system")).expect_err("its own");
    assert!(own.contains("skyport-tunnels"), "{own}");
    assert_eq!(super::shared_client_namespace("skyport-tunnels", Some("skyport-system")), Ok(()));
    let cli = Cli::try_parse_from(["skyport", "run", "--tunnel-client-namespace", "skyport-tunnels"]).unwrap();
    let Command::Run(run) = cli.command else { panic!("expected run") };
    assert_eq!(run.tunnel.client_namespace.as_deref(), Some("skyport-tunnels"));
}
