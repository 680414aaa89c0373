//! Hetzner floating IPs as the reserved address of a highly available Tunnel.
//!
//! A primary IP goes onto a server only while it is powered off, so it cannot move to a running
//! standby; a floating IP can ("You can reassign it to a different Server at any time"). So a
//! reservation that must move ([`AddressRequest::movable`]) is a floating IP; every other one
//! stays a primary IP (`primary_ips.rs`), which the server answers on without any setup.
//!
//! Follows the API reference's "Floating IPs" and "Floating IP Actions" (read 2026-11-27 through
//! the text copy in github.com/smrezvani/Hetzner-Cloud-API-Document `llm.txt` @7a118fe7, and the
//! operation-specific errors of docs.hetzner.cloud): `POST /floating_ips` (`type` `ipv4`,
//! `home_location` or `server` — "mutually exclusive" — `name` "unique per Project",
//! `description`, `labels`; 201, `{"floating_ip", "action"}`), `GET /floating_ips` with
//! `label_selector`, `GET /floating_ips/{id}` (`{"floating_ip": {"id", "ip", "server",
//! "home_location", "labels", …}}`), `DELETE /floating_ips/{id}` (204; "If the IP is assigned to
//! a resource it will be unassigned"), `POST /floating_ips/{id}/actions/assign` `{"server"}`
//! (201, `{"action"}`; 422 `floating_ip_assigned` "The Floating IP is already assigned"), and
//! `GET /floating_ips/{id}/actions/{action_id}` (`status` ∈ running, success, error). While an
//! action runs the IP is `locked` ("there is already an Action running"), so an assign waits
//! for its action before it returns: the next move, a moment later, must not find it locked.
//!
//! "For Floating IPs to work with your Server, you must configure them inside your operation
//! system": [`super::HetznerProvider`] says so ([`crate::MovedAddress::OnInterface`] in its [`crate::Capabilities`]), and
//! a pair's exit servers are created with it on their interface.
//!
//! Their ids are `floating-<number>`: floating and primary IPs are numbered separately, and
//! every existing Tunnel's status holds a primary IP as a bare number.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;
use serde_json::json;

use super::{PROVIDER, server_id, unique_name};
use crate::error::HostError;
use crate::hosts::{Address, AddressRequest, TAG_TUNNEL_NAME, TAG_TUNNEL_NAMESPACE, TAG_TUNNEL_UID, TagSyntax};

/// How a floating IP's id starts.
const PREFIX: &str = "floating-";
/// How often a running action is read again (the `hcloud` CLI polls every 500 ms; a failover
/// waits on this one).
const ACTION_POLL: Duration = Duration::from_millis(250);
/// How long an assign waits for its action before reporting it still running.
const ACTION_WAIT: Duration = Duration::from_secs(20);

/// A reserved address's id at Hetzner: a primary IP's number, or `floating-<number>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AddressId {
    Primary(u64),
    Floating(u64),
}

impl AddressId {
    pub(super) fn parse(id: &str) -> Result<Self, HostError> {
        let number = |s: &str| s.parse::<u64>().ok().filter(|n| *n > 0);
        match id.strip_prefix(PREFIX) {
            Some(rest) => number(rest).map(AddressId::Floating),
            None => number(id).map(AddressId::Primary),
        }
        .ok_or_else(|| HostError::Invalid {
            provider: PROVIDER,
            message: format!("{id:?} is not a reserved address id"),
        })
    }
}

#[derive(Debug, Deserialize)]
struct FloatingIp {
    id: u64,
    ip: String,
    #[serde(default)]
    server: Option<u64>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct FloatingIpBody {
    floating_ip: FloatingIp,
    #[serde(default)]
    action: Option<Action>,
}

#[derive(Debug, Deserialize)]
struct Action {
    id: u64,
    status: String,
    #[serde(default)]
    error: Option<ActionError>,
}

#[derive(Debug, Deserialize)]
struct ActionError {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

#[derive(Debug, Deserialize)]
struct ActionBody {
    action: Action,
}

impl From<FloatingIp> for Address {
    fn from(f: FloatingIp) -> Address {
        Address {
            private_ip: None,
            id: format!("{PREFIX}{}", f.id),
            ip: f.ip,
            host_id: f.server.map(|s| s.to_string()),
            tags: f.labels.iter().map(|(k, v)| TagSyntax::Hetzner.decode(k, v)).collect(),
        }
    }
}

impl super::HetznerProvider {
    /// Reserves a floating IP in the request's location (or onto its host), labelled like the
    /// Tunnel's servers. Its name is unique per project, like a server's.
    pub(super) async fn reserve_floating(&self, request: &AddressRequest) -> Result<Address, HostError> {
        let labels: BTreeMap<String, String> =
            request.tags.iter().map(|(k, v)| TagSyntax::Hetzner.encode(k, v)).collect();
        let tag = |k: &str| request.tags.get(k).map(String::as_str).unwrap_or_default();
        let description = format!(
            "skyport: the moving address of highly available Tunnel {}/{}",
            tag(TAG_TUNNEL_NAMESPACE),
            tag(TAG_TUNNEL_NAME)
        );
        let mut body = json!({
            "type": "ipv4",
            "name": unique_name(&request.name, request.tags.get(TAG_TUNNEL_UID).map(String::as_str)),
            "description": description,
            "labels": labels,
        });
        match (&request.host_id, request.region.as_ref().or(self.settings.default_location.as_ref())) {
            (Some(host), _) => body["server"] = json!(server_id(host)?),
            (None, Some(location)) => body["home_location"] = json!(location),
            (None, None) => {
                return Err(HostError::Invalid {
                    provider: PROVIDER,
                    message: "a floating IP needs a home location: set the Tunnel's region or the provider's default \
                              location"
                        .into(),
                });
            }
        }
        let response = self.rest.send("CreateFloatingIp", Method::POST, "/floating_ips", &[], Some(&body)).await?;
        let created: FloatingIpBody = self.rest.decode("CreateFloatingIp", &response)?;
        let id = created.floating_ip.id;
        if let Some(action) = created.action {
            self.wait_action(id, action).await?;
        }
        let mut address = Address::from(created.floating_ip);
        address.host_id = request.host_id.clone().or(address.host_id);
        Ok(address)
    }

    pub(super) async fn floating_ip(&self, id: u64) -> Result<Option<Address>, HostError> {
        let path = format!("/floating_ips/{id}");
        match self.rest.send("GetFloatingIp", Method::GET, &path, &[], None).await {
            Ok(response) => {
                Ok(Some(self.rest.decode::<FloatingIpBody>("GetFloatingIp", &response)?.floating_ip.into()))
            }
            Err(HostError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Moves the floating IP onto running server `host_id` and waits until it is there. A refused
    /// assign is read back: one that reports the IP already on that server (a retry after a lost
    /// answer) is success.
    pub(super) async fn assign_floating(&self, id: u64, host_id: &str) -> Result<(), HostError> {
        let server = server_id(host_id)?;
        let Some(current) = self.floating_ip(id).await? else {
            return Err(HostError::NotFound {
                provider: PROVIDER,
                message: format!("floating IP {id} does not exist"),
            });
        };
        if current.host_id.as_deref() == Some(host_id) {
            return Ok(());
        }
        let path = format!("/floating_ips/{id}/actions/assign");
        let body = json!({ "server": server });
        match self.rest.send("AssignFloatingIp", Method::POST, &path, &[], Some(&body)).await {
            Ok(response) => {
                let started: ActionBody = self.rest.decode("AssignFloatingIp", &response)?;
                self.wait_action(id, started.action).await
            }
            Err(e) => match self.floating_ip(id).await? {
                Some(now) if now.host_id.as_deref() == Some(host_id) => Ok(()),
                _ => Err(e),
            },
        }
    }

    /// Deletes the floating IP, which unassigns it; one already gone counts as released.
    pub(super) async fn release_floating(&self, id: u64) -> Result<(), HostError> {
        let path = format!("/floating_ips/{id}");
        match self.rest.send("DeleteFloatingIp", Method::DELETE, &path, &[], None).await {
            Ok(_) | Err(HostError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Reads the action until it finished: `Ok` on `success`; its error (transient: the caller
    /// retries) on `error`, or when it still runs after [`ACTION_WAIT`].
    async fn wait_action(&self, floating: u64, mut action: Action) -> Result<(), HostError> {
        let deadline = tokio::time::Instant::now() + ACTION_WAIT;
        loop {
            match action.status.as_str() {
                "success" => return Ok(()),
                "error" => {
                    let e = action.error.unwrap_or(ActionError { code: String::new(), message: String::new() });
                    return Err(HostError::Unavailable {
                        provider: PROVIDER,
                        message: format!(
                            "action {} on floating IP {floating} failed: {} ({})",
                            action.id, e.message, e.code
                        ),
                    });
                }
                _ if tokio::time::Instant::now() >= deadline => {
                    return Err(HostError::Unavailable {
                        provider: PROVIDER,
                        message: format!(
                            "action {} on floating IP {floating} still runs after {ACTION_WAIT:?}",
                            action.id
                        ),
                    });
                }
                _ => {}
            }
            tokio::time::sleep(ACTION_POLL).await;
            let path = format!("/floating_ips/{floating}/actions/{}", action.id);
            let response = self.rest.send("GetFloatingIpAction", Method::GET, &path, &[], None).await?;
            action = self.rest.decode::<ActionBody>("GetFloatingIpAction", &response)?.action;
        }
    }

    /// Every floating IP labelled `key=value`, across every page.
    pub(super) async fn floating_ips_by_tag(&self, key: &str, value: &str) -> Result<Vec<Address>, HostError> {
        let found: Vec<FloatingIp> =
            self.labelled("ListFloatingIps", "/floating_ips", "floating_ips", (key, value)).await?;
        Ok(found.into_iter().map(Address::from).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floating_and_primary_ids_never_mix() {
        assert_eq!(AddressId::parse("4711").unwrap(), AddressId::Primary(4711));
        assert_eq!(AddressId::parse("floating-4711").unwrap(), AddressId::Floating(4711));
        for bad in ["", "0", "floating-", "floating-0", "floating-4711/../x", "-1", "primary-3", "203.0.113.7"] {
            assert!(AddressId::parse(bad).is_err(), "{bad:?}");
        }
    }
}
