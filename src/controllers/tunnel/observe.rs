//! Reads what exists: the exit server at the provider, the credentials Secret in the cluster.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use providers::hosts::TAG_TUNNEL_UID;
use providers::userdata::NoiseKeypair;
use providers::{Host, HostProvider};
use tracing::{info, warn};

use super::desired::Credentials;
use crate::crd::tunnel::TunnelStatus;
use crate::error::{Error, Result};

/// Secret keys.
pub const KEY_PRIVATE: &str = "noise-private-key";
pub const KEY_PUBLIC: &str = "noise-public-key";
pub const KEY_TOKEN: &str = "token";
pub const KEY_CLIENT: &str = "client.toml";

/// The Tunnel's exit server: the one recorded in status if the provider still has it, else one
/// carrying the Tunnel's UID tag (created by an earlier run that crashed before recording it).
/// Extra hosts with the same tag (which only a crash between create and record could leave)
/// are deleted, so none leaks.
pub async fn find_host(provider: &dyn HostProvider, status: &TunnelStatus, uid: &str) -> Result<Option<Host>> {
    let recorded = status.host_id.clone().filter(|_| status.provider.as_deref() == Some(provider.name()));
    if let Some(id) = recorded
        && let Some(host) = provider.get(&id).await?
    {
        return Ok(Some(host));
    }
    let mut tagged = provider.list_by_tag(TAG_TUNNEL_UID, uid).await?;
    tagged.sort_by(|a, b| a.id.cmp(&b.id));
    let mut hosts = tagged.into_iter().filter(|h| h.state != providers::HostState::Deleting);
    let keep = hosts.next();
    for extra in hosts {
        warn!(host = %extra.id, "deleting a second exit server carrying this Tunnel's UID");
        provider.delete(&extra.id).await?;
    }
    if let Some(h) = &keep {
        info!(host = %h.id, "found the exit server by its owner tag");
    }
    Ok(keep)
}

/// What the Tunnel's Secret holds.
pub struct Stored {
    pub credentials: Credentials,
    /// The client config last written, if any.
    pub client_toml: Option<String>,
}

/// The credentials stored in the Tunnel's Secret, `None` when the Secret does not exist.
pub async fn credentials(secrets: &Api<Secret>, name: &str) -> Result<Option<Stored>> {
    let Some(secret) = secrets.get_opt(name).await? else { return Ok(None) };
    let data = secret.data.unwrap_or_default();
    let read = |key: &str| data.get(key).and_then(|v| String::from_utf8(v.0.clone()).ok());
    match (read(KEY_PRIVATE), read(KEY_TOKEN)) {
        (Some(private), Some(token)) if !token.is_empty() => {
            let keypair = NoiseKeypair::from_private(&private).map_err(|_| {
                Error::InvalidSpec(format!(
                    "Secret {name} holds an unusable {KEY_PRIVATE}; delete the Secret and the Tunnel to start over"
                ))
            })?;
            Ok(Some(Stored { credentials: Credentials { keypair, token }, client_toml: read(KEY_CLIENT) }))
        }
        _ => Err(Error::InvalidSpec(format!(
            "Secret {name} lacks {KEY_PRIVATE} or {KEY_TOKEN}; delete the Secret and the Tunnel to start over"
        ))),
    }
}
