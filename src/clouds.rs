//! The exit-server providers of this operator, built once at startup: the one `--provider` names
//! (the default for Tunnels without spec.provider) plus every cloud whose credentials are present
//! in its standard environment (EC2: when an AMI is configured; credentials from the AWS chain).
//! Tokens are read here and handed to the adapters, never logged.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use providers::HostProvider;
use providers::rest::ApiToken;
use tracing::info;

use crate::config::TunnelArgs;

/// The provider names `--provider` and `spec.provider` accept (each adapter's `name()`).
pub const LOCAL: &str = "local";
pub const GUEST: &str = "guest";
pub const EC2: &str = "ec2";
pub const DIGITALOCEAN: &str = "digitalocean";
pub const HETZNER: &str = "hetzner";
pub const NAMES: [&str; 5] = [LOCAL, GUEST, EC2, DIGITALOCEAN, HETZNER];

/// The configured host providers, by name, and the default for Tunnels that name none.
#[derive(Clone, Default)]
pub struct Providers {
    pub default: Option<String>,
    by_name: BTreeMap<&'static str, Arc<dyn HostProvider>>,
}

impl Providers {
    pub fn new(default: Option<String>, providers: Vec<Arc<dyn HostProvider>>) -> Self {
        Providers { default, by_name: providers.into_iter().map(|p| (p.name(), p)).collect() }
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn HostProvider>> {
        self.by_name.get(name).cloned()
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<dyn HostProvider>> {
        self.by_name.values()
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.by_name.keys().copied().collect()
    }
}

/// The configured providers; `Ok` with none when no `--provider` is given and no cloud has
/// credentials (the Tunnel controllers then do not run).
pub async fn configure(args: &TunnelArgs, aws_region: Option<&str>) -> anyhow::Result<Providers> {
    let default = args.provider.as_deref();
    let mut list: Vec<Arc<dyn HostProvider>> = Vec::new();
    if default == Some(LOCAL) {
        let mut settings = providers::local::LocalSettings::new(args.local_state_dir.clone(), args.self_exe.clone());
        (settings.first_address, settings.last_address) = args.local_addresses;
        list.push(Arc::new(providers::local::LocalProvider::new(settings).context("local provider")?));
    }
    if default == Some(GUEST) {
        list.push(Arc::new(guest_provider(args)?));
    }
    let token = |vars: &[&str]| vars.iter().find_map(|v| std::env::var(v).ok().filter(|t| !t.is_empty()));
    match token(&["DIGITALOCEAN_TOKEN", "DIGITALOCEAN_ACCESS_TOKEN"]) {
        Some(t) => {
            let settings = providers::DigitalOceanSettings::new(ApiToken::new(t));
            list.push(Arc::new(providers::DigitalOceanProvider::new(settings).context("digitalocean provider")?));
        }
        None if default == Some(DIGITALOCEAN) => bail!("--provider digitalocean needs DIGITALOCEAN_TOKEN"),
        None => {}
    }
    match token(&["HCLOUD_TOKEN"]) {
        Some(t) => {
            let mut settings = providers::HetznerSettings::new(ApiToken::new(t));
            settings.default_location = Some(args.hetzner_location.clone());
            list.push(Arc::new(providers::HetznerProvider::new(settings).context("hetzner provider")?));
        }
        None if default == Some(HETZNER) => bail!("--provider hetzner needs HCLOUD_TOKEN"),
        None => {}
    }
    match &args.ec2_image_id {
        Some(ami) => {
            let mut settings = providers::Ec2Settings::new(ami.clone());
            settings.region = aws_region.map(str::to_string);
            settings.region_images = args.ec2_region_images.iter().cloned().collect();
            settings.subnet_ids =
                args.ec2_subnet_ids.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
            list.push(Arc::new(providers::Ec2Provider::from_env(settings).await.context("ec2 provider")?));
        }
        None if default == Some(EC2) => {
            bail!("--provider ec2 needs --ec2-image-id (an AMI with cloud-init; credentials come from the AWS chain)")
        }
        None => {}
    }
    // With no --provider and exactly one cloud configured, that cloud is the default.
    let default = args.provider.clone().or_else(|| match list.as_slice() {
        [only] => Some(only.name().to_string()),
        _ => None,
    });
    let registry = Providers::new(default.clone(), list);
    info!(default = default.as_deref().unwrap_or("<none>"), configured = ?registry.names(), "exit-server providers");
    Ok(registry)
}

/// The guest provider of `--provider guest` (root only: it boots guests with systemd-nspawn).
fn guest_provider(args: &TunnelArgs) -> anyhow::Result<providers::guest::GuestProvider> {
    let Some(rootfs) = &args.guest_rootfs else {
        bail!("--provider guest needs --guest-rootfs (a root file system from tests/env/build-guest.sh)")
    };
    let mut settings = providers::guest::GuestSettings::new(args.guest_state_dir.clone(), rootfs.clone());
    settings.ca_file = args.guest_ca_file.clone();
    providers::guest::GuestProvider::new(settings).context("guest provider")
}

/// This cluster's identity for host tags: `--cluster-id`, else the kube-system namespace's UID
/// (stable for the cluster's life, distinct between clusters).
pub async fn cluster_id(client: &kube::Client, args: &TunnelArgs) -> anyhow::Result<String> {
    if let Some(id) = &args.cluster_id {
        return Ok(id.clone());
    }
    let ns = Api::<Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .context("reading the kube-system namespace's UID as the cluster id (or pass --cluster-id)")?;
    ns.metadata.uid.context("kube-system has no UID")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_guest_provider_says_what_it_lacks() {
        let args = TunnelArgs { provider: Some(GUEST.into()), ..Default::default() };
        let err = configure(&args, None).await.err().expect("no root file system").to_string();
        assert!(err.contains("--guest-rootfs") && err.contains("build-guest.sh"), "{err}");
        let args = TunnelArgs { guest_rootfs: Some("/nonexistent".into()), ..args };
        let err = format!("{:#}", configure(&args, None).await.err().expect("not a root file system"));
        // As root it names the missing root file system; elsewhere, root; on a machine without
        // systemd-nspawn (tests/env/build-guest.sh installs it), the package to install.
        let names = ["/nonexistent", "root", "apt-get install systemd-container"];
        assert!(err.contains("guest provider") && names.iter().any(|n| err.contains(n)), "{err}");
    }
}
