//! Hetzner Cloud Servers as exit-server hosts.
//!
//! Follows the published API reference, <https://docs.hetzner.cloud/> (read 2026-11-22 through
//! the text copy in github.com/smrezvani/Hetzner-Cloud-API-Document `llm.txt` @7a118fe7):
//! - "Authentication" (`Authorization: Bearer`), "Errors" (`{"error": {"code", "message",
//!   "details"}}` with codes such as `invalid_input`, `unauthorized`, `forbidden`, `not_found`,
//!   `uniqueness_error`, `resource_limit_exceeded`, `rate_limit_exceeded`, `locked`),
//!   "Labels" (keys: optional DNS-subdomain prefix + `/` + name ≤ 63; values ≤ 63 characters,
//!   alphanumeric at both ends, `-_.` inside), "Label Selector" (`k==v`), "Pagination"
//!   (`page`, `per_page` default 25 max 50, `meta.pagination.next_page` null on the last page)
//!   and "Rate Limiting".
//! - Servers: "Create a Server" (`POST /servers`, 201, `{"server", "action", "next_actions",
//!   "root_password"}`; `name`, `server_type`, `image`, `location`, `user_data` ≤ 32 KiB,
//!   `labels`, `start_after_create`), "Get a Server" (`GET /servers/{id}`), "Delete a Server"
//!   (`DELETE /servers/{id}`, 200 with an action) and "Get all Servers" (`GET /servers` with
//!   `label_selector`, `page`, `per_page`). `status` ∈ running, initializing, starting,
//!   stopping, off, deleting, migrating, rebuilding, unknown; `public_net.ipv4.ip`.
//!
//! Rate limits: "The default limit is 3600 requests per hour and per Project. The number of
//! remaining requests increases gradually", by one per second at that limit; responses carry
//! `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` (the UNIX time at which the
//! full limit is available again), and exceeding the limit gives `429` `rate_limit_exceeded`.
//! [`default_budget`] stays under it with room for other clients of the same project.

mod floating_ips;
mod placement;
mod primary_ips;

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::error::HostError;
use crate::hosts::{
    Address, AddressBinding, AddressRequest, Capabilities, Host, HostProvider, HostRequest, HostState, MovedAddress,
    PoolAddresses, Spread, TAG_TUNNEL_UID, TagSyntax, fnv1a32,
};
use crate::limiter::Limiter;
use crate::rest::{ApiToken, Budget, RefillModel, RestClient, RestSettings};
use floating_ips::AddressId;

const PROVIDER: &str = "hetzner";
/// Production endpoint (paths below are relative to it).
pub const API_URL: &str = "https://api.hetzner.cloud/v1";
/// Environment variable read for the token (the `hcloud` CLI's name).
pub const TOKEN_ENV: &[&str] = &["HCLOUD_TOKEN"];
/// `user_data` "is limited to 32KiB".
pub const MAX_USER_DATA: usize = 32 * 1024;
/// Largest `per_page` the API accepts.
pub const MAX_PAGE_SIZE: u32 = 50;

/// One call per 1.25 s sustained (2,880 an hour, 80 % of the 3,600 quota) with bursts of 60:
/// at most 2,940 calls in any hour, leaving a fifth of the project's quota to people and tools
/// sharing it. Hetzner refills one request per second, so a burst of 60 is back within a minute.
pub fn default_budget() -> Budget {
    Budget { period: Duration::from_millis(1250), burst: NonZeroU32::new(60).expect("non-zero") }
}

/// Location of exit servers and primary IPs when neither the Tunnel nor the operator names one.
/// Creating an unassigned primary IP needs a location (API reference, "Create a Primary IP":
/// "If not assigned to a resource the location key needs to be provided"), and a primary IP
/// "can only be assigned to resource in the same Location" — so one fixed default serves both.
pub const DEFAULT_LOCATION: &str = "fsn1";

/// How to reach Hetzner Cloud and what to create.
#[derive(Debug, Clone)]
pub struct HetznerSettings {
    pub rest: RestSettings,
    /// Image name of every exit server.
    pub image: String,
    /// Location used when a request names none ([`DEFAULT_LOCATION`]); `None` lets Hetzner
    /// choose servers' locations, and then a primary IP needs the Tunnel's region.
    pub default_location: Option<String>,
    /// Server type used when a request names none: the smallest shared x86 type. `cx23`
    /// replaced `cx22` (inlets-operator's choice); current tooling uses it, e.g. Pulumi's hcloud
    /// v1.32.1 docs (2026-02). Check `GET /server_types` for what your project can order.
    pub default_server_type: String,
    /// `per_page` for listing (1–50).
    pub page_size: u32,
}

impl HetznerSettings {
    pub fn new(token: ApiToken) -> Self {
        HetznerSettings {
            rest: RestSettings {
                base_url: API_URL.into(),
                token,
                budget: default_budget(),
                timeout: Duration::from_secs(30),
            },
            image: "ubuntu-24.04".into(),
            default_location: Some(DEFAULT_LOCATION.into()),
            default_server_type: "cx23".into(),
            page_size: MAX_PAGE_SIZE,
        }
    }
}

/// Servers through the Hetzner Cloud REST API.
#[derive(Debug)]
pub struct HetznerProvider {
    rest: RestClient,
    settings: HetznerSettings,
}

impl HetznerProvider {
    pub fn new(settings: HetznerSettings) -> Result<Self, HostError> {
        let rest = RestClient::new(PROVIDER, &settings.rest, RefillModel::GradualPerHour)?;
        Ok(HetznerProvider { rest, settings })
    }

    /// The shared REST client (rate-limit state for metrics).
    pub fn rest(&self) -> &RestClient {
        &self.rest
    }

    /// Every entry of the list `items` that `GET path` answers with, labelled with the canonical
    /// tag `key=value`, across every page (servers, primary IPs and floating IPs page alike).
    async fn labelled<T: DeserializeOwned>(
        &self,
        operation: &'static str,
        path: &str,
        items: &str,
        (key, value): (&str, &str),
    ) -> Result<Vec<T>, HostError> {
        let (key, value) = TagSyntax::Hetzner.encode(key, value);
        let selector = format!("{key}=={value}");
        let per_page = self.settings.page_size.clamp(1, MAX_PAGE_SIZE).to_string();
        let malformed = |e: serde_json::Error| HostError::Unavailable {
            provider: PROVIDER,
            message: format!("malformed {operation} response: {e}"),
        };
        let mut found = Vec::new();
        let mut page = 1u64;
        for _ in 0..MAX_PAGES {
            let page_str = page.to_string();
            let query = [("label_selector", selector.as_str()), ("per_page", per_page.as_str()), ("page", &page_str)];
            let response = self.rest.send(operation, Method::GET, path, &query, None).await?;
            let mut body: serde_json::Value = self.rest.decode(operation, &response)?;
            let list: Vec<T> = serde_json::from_value(body[items].take()).map_err(malformed)?;
            let meta: Option<Meta> = serde_json::from_value(body["meta"].take()).map_err(malformed)?;
            let next = meta.and_then(|m| m.pagination).and_then(|p| p.next_page);
            let empty = list.is_empty();
            found.extend(list);
            match next {
                Some(n) if !empty && n > page => page = n,
                _ => return Ok(found),
            }
        }
        Err(HostError::Unavailable { provider: PROVIDER, message: format!("more than {MAX_PAGES} pages of {items}") })
    }
}

#[derive(Debug, Deserialize)]
struct Server {
    id: u64,
    name: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    public_net: PublicNet,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    placement_group: Option<GroupRef>,
}

/// A server's spread placement group ([`placement`]).
#[derive(Debug, Deserialize)]
struct GroupRef {
    id: u64,
}

#[derive(Debug, Default, Deserialize)]
struct PublicNet {
    #[serde(default)]
    ipv4: Option<Ipv4>,
}

#[derive(Debug, Deserialize)]
struct Ipv4 {
    ip: String,
}

#[derive(Debug, Deserialize)]
struct ServerBody {
    server: Server,
}

#[derive(Debug, Deserialize)]
struct Meta {
    #[serde(default)]
    pagination: Option<Pagination>,
}

#[derive(Debug, Deserialize)]
struct Pagination {
    #[serde(default)]
    next_page: Option<u64>,
}

impl From<Server> for Host {
    fn from(s: Server) -> Host {
        let state = match s.status.as_str() {
            "running" => HostState::Running,
            "stopping" | "off" => HostState::Stopped,
            "deleting" => HostState::Deleting,
            // initializing, starting, migrating, rebuilding, unknown, and anything added later.
            _ => HostState::Provisioning,
        };
        let tags = s.labels.iter().map(|(k, v)| TagSyntax::Hetzner.decode(k, v)).collect();
        Host {
            id: s.id.to_string(),
            name: s.name,
            public_ipv4: s.public_net.ipv4.map(|v| v.ip),
            state,
            tags,
            placement: s.placement_group.map(|g| placement::describe(g.id)),
        }
    }
}

/// Server names are unique per Hetzner project, and several clusters (or a Tunnel deleted and
/// made again while its old server is still being deleted) may want the same
/// `skyport-<namespace>-<name>`. A suffix from the owner's UID makes the name unique per Tunnel;
/// the whole stays a hostname of at most 63 characters.
pub fn unique_name(name: &str, uid: Option<&str>) -> String {
    let Some(uid) = uid else { return name.to_string() };
    let suffix = format!("-{:08x}", fnv1a32(uid.as_bytes()));
    let head: String = name.chars().take(63 - suffix.len()).collect();
    format!("{}{suffix}", head.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()))
}

/// Server ids are positive integers; anything else cannot name a server and must not be
/// spliced into a path.
fn server_id(id: &str) -> Result<u64, HostError> {
    id.parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| HostError::Invalid { provider: PROVIDER, message: format!("{id:?} is not a server id") })
}

#[async_trait]
impl HostProvider for HetznerProvider {
    async fn create(&self, request: &HostRequest) -> Result<Host, HostError> {
        if request.user_data.len() > MAX_USER_DATA {
            return Err(HostError::Invalid {
                provider: PROVIDER,
                message: format!(
                    "user data is {} bytes; Hetzner accepts at most {MAX_USER_DATA}",
                    request.user_data.len()
                ),
            });
        }
        let labels: BTreeMap<String, String> =
            request.tags.iter().map(|(k, v)| TagSyntax::Hetzner.encode(k, v)).collect();
        let mut body = json!({
            "name": unique_name(&request.name, request.tags.get(TAG_TUNNEL_UID).map(String::as_str)),
            "server_type": request.size.as_deref().unwrap_or(&self.settings.default_server_type),
            "image": self.settings.image,
            "user_data": request.user_data,
            "labels": labels,
            "start_after_create": true,
        });
        let mut location = request.region.as_ref().or(self.settings.default_location.as_ref()).cloned();
        // The Tunnel's reserved address, if it has one and no server holds it: the new server
        // gets it, in its location (a primary IP is bound to one). Not a pair's server (one asked
        // for in a failure domain, as for the placement group below): it keeps its own address,
        // and the pair's floating IP is moved onto it while it runs.
        let single = request.failure_domain.is_none();
        if let Some(id) = request.address.as_deref().filter(|_| single) {
            let not_found = || HostError::NotFound { provider: PROVIDER, message: format!("primary IP {id}") };
            let ip = self.primary_ip(id).await?.ok_or_else(not_found)?;
            if let Some(server) = ip.assignee_id {
                let message = format!("primary IP {id} is assigned to server {server}");
                return Err(HostError::Unavailable { provider: PROVIDER, message });
            }
            body["public_net"] = json!({"enable_ipv4": true, "enable_ipv6": true, "ipv4": ip.id});
            location = ip.location.map(|l| l.name).or(location);
        }
        if let Some(location) = location {
            body["location"] = json!(location);
        }
        // A pair's servers share their Tunnel's spread placement group: different physical hosts.
        if let Some(group) = self.group_for(request).await? {
            body["placement_group"] = json!(group);
        }
        let response = self.rest.send("CreateServer", Method::POST, "/servers", &[], Some(&body)).await?;
        let created: ServerBody = self.rest.decode("CreateServer", &response)?;
        Ok(created.server.into())
    }

    async fn get(&self, id: &str) -> Result<Option<Host>, HostError> {
        let id = server_id(id)?;
        match self.rest.send("GetServer", Method::GET, &format!("/servers/{id}"), &[], None).await {
            Ok(response) => Ok(Some(self.rest.decode::<ServerBody>("GetServer", &response)?.server.into())),
            Err(HostError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn delete(&self, id: &str) -> Result<(), HostError> {
        let id = server_id(id)?;
        match self.rest.send("DeleteServer", Method::DELETE, &format!("/servers/{id}"), &[], None).await {
            Ok(_) | Err(HostError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn list_by_tag(&self, key: &str, value: &str) -> Result<Vec<Host>, HostError> {
        let servers: Vec<Server> = self.labelled("ListServers", "/servers", "servers", (key, value)).await?;
        Ok(servers.into_iter().map(Host::from).collect())
    }

    /// A primary IP goes only onto a powered-off server, so at creation. A highly available
    /// Tunnel reserves a movable address ([`AddressRequest::movable`]) instead: a floating IP,
    /// which an assign action moves onto a running server while each server keeps its primary IP
    /// for its own client, and which reaches a server only once its OS has it on an interface.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            address_binding: AddressBinding::AtCreate,
            moves_addresses: true,
            moved_address: MovedAddress::OnInterface,
            pool_addresses: PoolAddresses::Assigned,
            spread: Spread::Group,
            ..Capabilities::default()
        }
    }

    async fn delete_placement(&self, uid: &str) -> Result<(), HostError> {
        self.delete_groups(uid).await
    }

    async fn list_placements_by_tag(&self, key: &str, value: &str) -> Result<Vec<BTreeMap<String, String>>, HostError> {
        self.group_tags(key, value).await
    }

    async fn reserve_address(&self, request: &AddressRequest) -> Result<Address, HostError> {
        if request.movable { self.reserve_floating(request).await } else { self.reserve(request).await }
    }

    async fn get_address(&self, id: &str) -> Result<Option<Address>, HostError> {
        match AddressId::parse(id)? {
            AddressId::Primary(_) => Ok(self.primary_ip(id).await?.map(Address::from)),
            AddressId::Floating(n) => self.floating_ip(n).await,
        }
    }

    async fn assign_address(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        match AddressId::parse(id)? {
            AddressId::Primary(_) => self.assign(id, host_id).await,
            AddressId::Floating(n) => self.assign_floating(n, host_id).await,
        }
    }

    async fn release_address(&self, id: &str) -> Result<(), HostError> {
        match AddressId::parse(id)? {
            AddressId::Primary(_) => self.release(id).await,
            AddressId::Floating(n) => self.release_floating(n).await,
        }
    }

    /// Primary and floating IPs alike, so the Tunnel's lookups and the orphan sweep see both.
    async fn list_addresses_by_tag(&self, key: &str, value: &str) -> Result<Vec<Address>, HostError> {
        let mut found: Vec<Address> =
            self.primary_ips_by_tag(key, value).await?.into_iter().map(Address::from).collect();
        found.extend(self.floating_ips_by_tag(key, value).await?);
        Ok(found)
    }

    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn limiter(&self) -> &Limiter {
        self.rest.limiter()
    }
}

/// A runaway `next_page` must not loop forever (50 per page × 2,000 pages = 100,000 servers).
const MAX_PAGES: u32 = 2000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_get_a_suffix_from_the_owner_and_stay_hostnames() {
        let uid = "0b6e3c57-4d0e-4b52-9a43-3f4f7e7d2a10";
        let a = unique_name("skyport-team-a-web", Some(uid));
        assert!(a.starts_with("skyport-team-a-web-") && a.len() == "skyport-team-a-web-".len() + 8, "{a}");
        assert_eq!(a, unique_name("skyport-team-a-web", Some(uid)), "the same Tunnel, the same name");
        assert_ne!(a, unique_name("skyport-team-a-web", Some("11111111-2222-3333-4444-555555555555")));
        assert_eq!(unique_name("plain", None), "plain");
        let long = unique_name(&format!("skyport-{}-x", "n".repeat(60)), Some(uid));
        assert!(long.len() <= 63 && !long.contains("--"), "{long}");
    }

    /// A powered-off server (an account policy, an image that shuts down) reads as stopped: the
    /// controller replaces it, and each replacement draws from the Tunnel's daily budget.
    #[test]
    fn a_server_that_is_off_or_stopping_reads_as_stopped() {
        for (status, state) in
            [("off", HostState::Stopped), ("stopping", HostState::Stopped), ("running", HostState::Running)]
        {
            let server: Server =
                serde_json::from_value(serde_json::json!({"id": 42, "name": "s", "status": status})).unwrap();
            assert_eq!(Host::from(server).state, state, "{status}");
        }
    }
}
