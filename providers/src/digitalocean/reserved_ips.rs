//! DigitalOcean reserved IPs as a Tunnel's reserved address.
//!
//! Follows the API reference's "Reserved IPs" and "Reserved IP Actions" (read 2026-11-23):
//! `POST /v2/reserved_ips` with `droplet_id` (assigned at once) or `region` (202,
//! `{"reserved_ip": {"ip", "region", "droplet", "locked", "project_id"}, "links"}`),
//! `GET /v2/reserved_ips/{ip}`, `GET /v2/reserved_ips?page=&per_page=` (`{"reserved_ips",
//! "links", "meta"}`), `DELETE /v2/reserved_ips/{ip}` (204) and
//! `POST /v2/reserved_ips/{ip}/actions` with `{"type": "assign", "droplet_id"}` or
//! `{"type": "unassign"}` (201, `{"action"}`).
//!
//! Reserved IPs carry no tags. So skyport only ever reserves one already assigned to a tagged
//! droplet ([`AddressBinding::WithHost`]): its tags are those of the droplet it points at, which
//! is how a restarted operator finds it by the owner's UID. The Tunnel's status records it before
//! a replacement droplet is made, so an address between two droplets is never lost track of
//! while its Tunnel exists. Before the reservation the Tunnel's status records the intent, with
//! the reserved IPs the account had ([`HostProvider::list_untagged_addresses`]): one made by a
//! reservation the operator did not see answered is then the new unassigned one (see the
//! controller's `plan::address::reserved_meanwhile`). One that is unassigned and recorded
//! nowhere cannot be proven skyport's and is left alone.
//!
//! [`AddressBinding::WithHost`]: crate::AddressBinding::WithHost

use std::net::Ipv4Addr;

use reqwest::Method;
use serde::Deserialize;
use serde_json::json;

use super::{Droplet, MAX_PAGE_SIZE, MAX_PAGES, PROVIDER, droplet_id};
use crate::error::HostError;
#[cfg(doc)]
use crate::hosts::HostProvider;
use crate::hosts::{Address, AddressRequest, TagSyntax};

#[derive(Debug, Deserialize)]
pub(super) struct ReservedIp {
    ip: String,
    #[serde(default)]
    droplet: Option<Droplet>,
    #[serde(default)]
    region: Option<Region>,
}

#[derive(Debug, Deserialize)]
struct Region {
    slug: String,
}

#[derive(Debug, Deserialize)]
struct ReservedIpBody {
    reserved_ip: ReservedIp,
}

#[derive(Debug, Deserialize)]
struct ReservedIpPage {
    reserved_ips: Vec<ReservedIp>,
    #[serde(default)]
    links: Option<super::Links>,
}

impl From<ReservedIp> for Address {
    fn from(r: ReservedIp) -> Address {
        let (host_id, tags) = match r.droplet {
            Some(d) => (Some(d.id.to_string()), d.tags.iter().map(|t| TagSyntax::DigitalOcean.decode(t, "")).collect()),
            None => (None, Default::default()),
        };
        Address { private_ip: None, id: r.ip.clone(), ip: r.ip, host_id, tags }
    }
}

/// A reserved IP's id is the address; anything else must not be spliced into a path.
fn ip(id: &str) -> Result<Ipv4Addr, HostError> {
    id.parse().map_err(|_| HostError::Invalid { provider: PROVIDER, message: format!("{id:?} is not a reserved IP") })
}

impl super::DigitalOceanProvider {
    pub(super) async fn reserve(&self, request: &AddressRequest) -> Result<Address, HostError> {
        let Some(host) = &request.host_id else {
            return Err(HostError::Invalid {
                provider: PROVIDER,
                message: "a reserved IP is made assigned to its first droplet (reserved IPs carry no tags)".into(),
            });
        };
        let body = json!({ "droplet_id": droplet_id(host)? });
        let response = self.rest.send("CreateReservedIp", Method::POST, "/v2/reserved_ips", &[], Some(&body)).await?;
        let created: ReservedIpBody = self.rest.decode("CreateReservedIp", &response)?;
        let mut address = Address::from(created.reserved_ip);
        // The assignment is an action that may still run; the request said where it goes.
        address.host_id = Some(host.clone());
        if address.tags.is_empty() {
            address.tags = request.tags.clone();
        }
        Ok(address)
    }

    pub(super) async fn reserved_ip(&self, id: &str) -> Result<Option<Address>, HostError> {
        let path = format!("/v2/reserved_ips/{}", ip(id)?);
        match self.rest.send("GetReservedIp", Method::GET, &path, &[], None).await {
            Ok(response) => {
                Ok(Some(self.rest.decode::<ReservedIpBody>("GetReservedIp", &response)?.reserved_ip.into()))
            }
            Err(HostError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reserved IPs "are region-specific resources and can only be assigned to Droplets within
    /// the same datacenter" (product docs, "Reserved IP Availability"), and a droplet created
    /// without `region` lands wherever DigitalOcean chooses: a replacement is made in this one.
    pub(super) async fn reserved_ip_region(&self, id: &str) -> Result<Option<String>, HostError> {
        let path = format!("/v2/reserved_ips/{}", ip(id)?);
        match self.rest.send("GetReservedIp", Method::GET, &path, &[], None).await {
            Ok(response) => {
                let body: ReservedIpBody = self.rest.decode("GetReservedIp", &response)?;
                Ok(body.reserved_ip.region.map(|r| r.slug))
            }
            Err(HostError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn action(&self, id: &str, body: serde_json::Value) -> Result<(), HostError> {
        let path = format!("/v2/reserved_ips/{}/actions", ip(id)?);
        self.rest.send("ReservedIpAction", Method::POST, &path, &[], Some(&body)).await.map(|_| ())
    }

    pub(super) async fn assign(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        let droplet = droplet_id(host_id)?;
        let Some(current) = self.reserved_ip(id).await? else {
            return Err(HostError::NotFound {
                provider: PROVIDER,
                message: format!("reserved IP {id} does not exist"),
            });
        };
        if current.host_id.as_deref() == Some(host_id) {
            return Ok(());
        }
        self.action(id, json!({"type": "assign", "droplet_id": droplet})).await
    }

    pub(super) async fn release(&self, id: &str) -> Result<(), HostError> {
        let Some(current) = self.reserved_ip(id).await? else { return Ok(()) };
        if current.host_id.is_some() {
            match self.action(id, json!({"type": "unassign"})).await {
                Ok(()) | Err(HostError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let path = format!("/v2/reserved_ips/{}", ip(id)?);
        match self.rest.send("DeleteReservedIp", Method::DELETE, &path, &[], None).await {
            Ok(_) | Err(HostError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every reserved IP assigned to a droplet tagged `key=value` (the only ones provably ours).
    pub(super) async fn reserved_ips_by_tag(&self, key: &str, value: &str) -> Result<Vec<Address>, HostError> {
        let (tag, _) = TagSyntax::DigitalOcean.encode(key, value);
        let all = self.reserved_ips().await?;
        let ours = all.into_iter().filter(|r| r.droplet.as_ref().is_some_and(|d| d.tags.contains(&tag)));
        Ok(ours.map(Address::from).collect())
    }

    /// Every reserved IP of the account, whoever made it (those assigned carry their droplet's
    /// tags): what a Tunnel that was reserving one when the operator stopped looks through.
    pub(super) async fn all_reserved_ips(&self) -> Result<Vec<Address>, HostError> {
        Ok(self.reserved_ips().await?.into_iter().map(Address::from).collect())
    }

    async fn reserved_ips(&self) -> Result<Vec<ReservedIp>, HostError> {
        let per_page = self.settings.page_size.clamp(1, MAX_PAGE_SIZE).to_string();
        let mut found = Vec::new();
        for page in 1..=MAX_PAGES {
            let page = page.to_string();
            let query = [("per_page", per_page.as_str()), ("page", page.as_str())];
            let response = self.rest.send("ListReservedIps", Method::GET, "/v2/reserved_ips", &query, None).await?;
            let body: ReservedIpPage = self.rest.decode("ListReservedIps", &response)?;
            let last = body.reserved_ips.is_empty()
                || body.links.and_then(|l| l.pages).and_then(|p| p.next).is_none_or(|n| n.is_empty());
            found.extend(body.reserved_ips);
            if last {
                return Ok(found);
            }
        }
        Err(HostError::Unavailable {
            provider: PROVIDER,
            message: format!("more than {MAX_PAGES} pages of reserved IPs"),
        })
    }
}
