//! Hetzner primary IPs as a Tunnel's reserved address.
//!
//! Follows the API reference's "Primary IPs" and "Primary IP Actions" (read 2026-11-23):
//! `POST /primary_ips` (`name`, `type` `ipv4`, `assignee_type` `server`, `auto_delete`,
//! `labels`, and `location` — which replaces the deprecated `datacenter` — or `assignee_id`;
//! 201, `{"primary_ip", "action"}`), `GET /primary_ips/{id}`, `GET /primary_ips` with
//! `label_selector`, `DELETE /primary_ips/{id}` (204), and
//! `POST /primary_ips/{id}/actions/assign` / `…/unassign` (201, `{"action"}`), which need the
//! server powered off. A server is created with one through `public_net.ipv4`; deleting the
//! server leaves a primary IP with `auto_delete: false` unassigned, for the next server.
//!
//! Because assigning needs a powered-off server, the binding is [`AddressBinding::AtCreate`]:
//! `create` gives a new server the Tunnel's unassigned primary IP, found by the UID label.
//!
//! [`AddressBinding::AtCreate`]: crate::AddressBinding::AtCreate

use std::collections::BTreeMap;

use reqwest::Method;
use serde::Deserialize;
use serde_json::json;

use super::{PROVIDER, server_id, unique_name};
use crate::error::HostError;
use crate::hosts::{Address, AddressRequest, TAG_TUNNEL_UID, TagSyntax};

#[derive(Debug, Deserialize)]
pub(super) struct PrimaryIp {
    pub(super) id: u64,
    ip: String,
    #[serde(default)]
    pub(super) assignee_id: Option<u64>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) location: Option<Location>,
}

#[derive(Debug, Deserialize)]
pub(super) struct Location {
    pub(super) name: String,
}

#[derive(Debug, Deserialize)]
struct PrimaryIpBody {
    primary_ip: PrimaryIp,
}

impl From<PrimaryIp> for Address {
    fn from(p: PrimaryIp) -> Address {
        Address {
            private_ip: None,
            id: p.id.to_string(),
            ip: p.ip,
            host_id: p.assignee_id.map(|i| i.to_string()),
            tags: p.labels.iter().map(|(k, v)| TagSyntax::Hetzner.decode(k, v)).collect(),
        }
    }
}

/// Primary IP ids are positive integers, like server ids.
fn primary_ip_id(id: &str) -> Result<u64, HostError> {
    server_id(id)
        .map_err(|_| HostError::Invalid { provider: PROVIDER, message: format!("{id:?} is not a primary IP id") })
}

impl super::HetznerProvider {
    pub(super) async fn reserve(&self, request: &AddressRequest) -> Result<Address, HostError> {
        let labels: BTreeMap<String, String> =
            request.tags.iter().map(|(k, v)| TagSyntax::Hetzner.encode(k, v)).collect();
        let mut body = json!({
            // Unique per project, like a server's name: another cluster's Tunnel of the same
            // namespace and name must not make this one's reservation fail.
            "name": unique_name(&request.name, request.tags.get(TAG_TUNNEL_UID).map(String::as_str)),
            "type": "ipv4",
            "assignee_type": "server",
            "auto_delete": false,
            "labels": labels,
        });
        match (&request.host_id, request.region.as_ref().or(self.settings.default_location.as_ref())) {
            (Some(host), _) => body["assignee_id"] = json!(server_id(host)?),
            (None, Some(location)) => body["location"] = json!(location),
            (None, None) => {
                return Err(HostError::Invalid {
                    provider: PROVIDER,
                    message: "a primary IP needs a location: set the Tunnel's region or the provider's default \
                              location"
                        .into(),
                });
            }
        }
        let response = self.rest.send("CreatePrimaryIp", Method::POST, "/primary_ips", &[], Some(&body)).await?;
        Ok(self.rest.decode::<PrimaryIpBody>("CreatePrimaryIp", &response)?.primary_ip.into())
    }

    pub(super) async fn primary_ip(&self, id: &str) -> Result<Option<PrimaryIp>, HostError> {
        let path = format!("/primary_ips/{}", primary_ip_id(id)?);
        match self.rest.send("GetPrimaryIp", Method::GET, &path, &[], None).await {
            Ok(response) => Ok(Some(self.rest.decode::<PrimaryIpBody>("GetPrimaryIp", &response)?.primary_ip)),
            Err(HostError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn assign(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        let server = server_id(host_id)?;
        let Some(current) = self.primary_ip(id).await? else {
            return Err(HostError::NotFound { provider: PROVIDER, message: format!("primary IP {id} does not exist") });
        };
        if current.assignee_id == Some(server) {
            return Ok(());
        }
        let path = format!("/primary_ips/{}/actions/assign", current.id);
        let body = json!({"assignee_id": server, "assignee_type": "server"});
        self.rest.send("AssignPrimaryIp", Method::POST, &path, &[], Some(&body)).await.map(|_| ())
    }

    pub(super) async fn release(&self, id: &str) -> Result<(), HostError> {
        let Some(current) = self.primary_ip(id).await? else { return Ok(()) };
        if current.assignee_id.is_some() {
            let path = format!("/primary_ips/{}/actions/unassign", current.id);
            match self.rest.send("UnassignPrimaryIp", Method::POST, &path, &[], None).await {
                Ok(_) | Err(HostError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let path = format!("/primary_ips/{}", current.id);
        match self.rest.send("DeletePrimaryIp", Method::DELETE, &path, &[], None).await {
            Ok(_) | Err(HostError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every primary IP labelled `key=value`, across every page.
    pub(super) async fn primary_ips_by_tag(&self, key: &str, value: &str) -> Result<Vec<PrimaryIp>, HostError> {
        self.labelled("ListPrimaryIps", "/primary_ips", "primary_ips", (key, value)).await
    }
}
