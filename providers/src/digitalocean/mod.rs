//! DigitalOcean Droplets as exit-server hosts.
//!
//! Follows the published API reference (read 2026-11-22):
//! - API reference, <https://docs.digitalocean.com/reference/api/api-reference/> — sections
//!   "Rate Limit", "Links & Pagination", and the operations `droplets_create`
//!   (`POST /v2/droplets`, 202, body `{"droplet": …, "links": {"actions": …}}`), `droplets_get`
//!   (`GET /v2/droplets/{id}`, 200 / 404), `droplets_destroy` (`DELETE /v2/droplets/{id}`, 204 /
//!   404) and `droplets_list` (`GET /v2/droplets?tag_name=&page=&per_page=`, 200,
//!   `{"droplets": […], "links": {"pages": {"next": …}}, "meta": {"total": …}}`).
//! - The same reference as OpenAPI, github.com/digitalocean/openapi @7c1300c4 (2026-08-07):
//!   `specification/description.yml` (rate limits, pagination), `resources/droplets/*`
//!   (`droplet.yml`: `status` ∈ new|active|off|archive, `networks.v4[].{ip_address,type}`,
//!   `tags`; `droplet_create.yml`: `user_data` ≤ 64 KiB, `tags` array of strings),
//!   `resources/tags/models/tags.yml` (tag names `^[a-zA-Z0-9_\-\:]+$`, ≤ 255 characters),
//!   `shared/models/error.yml` (`{"id", "message", "request_id"}`),
//!   `shared/responses/too_many_requests.yml` (429 `too_many_requests`) and
//!   `shared/headers.yml` (`ratelimit-limit`, `ratelimit-remaining`, `ratelimit-reset`).
//!
//! Rate limits (per token): 5,000 requests per hour and 250 per minute; each request counts for
//! one hour from when it was made, `ratelimit-reset` is when the oldest one expires, and a 429
//! caused by the per-minute burst limit carries `retry-after` in seconds.
//! [`default_budget`] stays under both with room for other clients of the same token.

mod reserved_ips;

use std::num::NonZeroU32;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use serde::Deserialize;
use serde_json::json;

use crate::error::HostError;
use crate::hosts::{
    Address, AddressBinding, AddressRequest, Capabilities, Host, HostProvider, HostRequest, HostState, PoolAddresses,
    Spread, TagSyntax,
};
use crate::limiter::Limiter;
use crate::rest::{ApiToken, Budget, RefillModel, RestClient, RestSettings};

const PROVIDER: &str = "digitalocean";
/// Production endpoint.
pub const API_URL: &str = "https://api.digitalocean.com";
/// Environment variables read for the token, in order (Terraform's and doctl's names).
pub const TOKEN_ENV: &[&str] = &["DIGITALOCEAN_TOKEN", "DIGITALOCEAN_ACCESS_TOKEN"];
/// `user_data` "may not exceed 64 KiB".
pub const MAX_USER_DATA: usize = 64 * 1024;
/// Largest `per_page` the API accepts.
pub const MAX_PAGE_SIZE: u32 = 200;

/// One call per 900 ms sustained (4,000 an hour, 80 % of the 5,000 quota) with bursts of 60.
/// Worst cases: 60 + 67 = 127 calls in any minute (limit 250) and 4,060 in any hour (limit
/// 5,000), leaving a fifth of the quota to people and tools sharing the token.
pub fn default_budget() -> Budget {
    Budget { period: Duration::from_millis(900), burst: NonZeroU32::new(60).expect("non-zero") }
}

/// How to reach DigitalOcean and what to create.
#[derive(Debug, Clone)]
pub struct DigitalOceanSettings {
    pub rest: RestSettings,
    /// Image slug of every exit server.
    pub image: String,
    /// Region slug used when a request names none; `None` lets DigitalOcean choose.
    pub default_region: Option<String>,
    /// Size slug used when a request names none.
    pub default_size: String,
    /// `per_page` for listing (1–200).
    pub page_size: u32,
}

impl DigitalOceanSettings {
    pub fn new(token: ApiToken) -> Self {
        DigitalOceanSettings {
            rest: RestSettings {
                base_url: API_URL.into(),
                token,
                budget: default_budget(),
                timeout: Duration::from_secs(30),
            },
            image: "ubuntu-24-04-x64".into(),
            default_region: None,
            default_size: "s-1vcpu-1gb".into(),
            page_size: MAX_PAGE_SIZE,
        }
    }
}

/// Droplets through the DigitalOcean REST API.
#[derive(Debug)]
pub struct DigitalOceanProvider {
    rest: RestClient,
    settings: DigitalOceanSettings,
}

impl DigitalOceanProvider {
    pub fn new(settings: DigitalOceanSettings) -> Result<Self, HostError> {
        let rest = RestClient::new(PROVIDER, &settings.rest, RefillModel::SlidingHour)?;
        Ok(DigitalOceanProvider { rest, settings })
    }

    /// The shared REST client (rate-limit state for metrics).
    pub fn rest(&self) -> &RestClient {
        &self.rest
    }
}

#[derive(Debug, Deserialize)]
struct Droplet {
    id: u64,
    name: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    networks: Networks,
    #[serde(default)]
    tags: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Networks {
    #[serde(default)]
    v4: Vec<NetworkV4>,
}

#[derive(Debug, Deserialize)]
struct NetworkV4 {
    ip_address: String,
    #[serde(rename = "type", default)]
    kind: String,
}

#[derive(Debug, Deserialize)]
struct DropletBody {
    droplet: Droplet,
}

#[derive(Debug, Deserialize)]
struct DropletPage {
    droplets: Vec<Droplet>,
    #[serde(default)]
    links: Option<Links>,
}

#[derive(Debug, Deserialize)]
struct Links {
    #[serde(default)]
    pages: Option<PageLinks>,
}

#[derive(Debug, Deserialize)]
struct PageLinks {
    #[serde(default)]
    next: Option<String>,
}

impl From<Droplet> for Host {
    fn from(d: Droplet) -> Host {
        let state = match d.status.as_str() {
            "active" => HostState::Running,
            "off" | "archive" => HostState::Stopped,
            // "new", and anything added later, is still on its way.
            _ => HostState::Provisioning,
        };
        let public_ipv4 = d.networks.v4.into_iter().find(|n| n.kind == "public").map(|n| n.ip_address);
        let tags = d.tags.iter().map(|t| TagSyntax::DigitalOcean.decode(t, "")).collect();
        Host { id: d.id.to_string(), name: d.name, public_ipv4, state, tags, placement: None }
    }
}

/// DigitalOcean answers a create beyond the account's droplet limit with 422
/// `unprocessable_entity` ("creating this/these droplet(s) will exceed your droplet limit"),
/// which the shared mapping reads as a bad request. It is a quota: raising the limit or deleting
/// droplets makes the same request succeed, so it is retried with backoff, not failed for good.
fn droplet_limit(e: HostError) -> HostError {
    match e {
        HostError::Invalid { provider, message } | HostError::Unauthorized { provider, message }
            if message.to_ascii_lowercase().contains("droplet limit") =>
        {
            HostError::Quota { provider, message }
        }
        e => e,
    }
}

/// Droplet ids are positive integers; anything else cannot name a droplet and must not be
/// spliced into a path.
fn droplet_id(id: &str) -> Result<u64, HostError> {
    id.parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| HostError::Invalid { provider: PROVIDER, message: format!("{id:?} is not a droplet id") })
}

#[async_trait]
impl HostProvider for DigitalOceanProvider {
    async fn create(&self, request: &HostRequest) -> Result<Host, HostError> {
        if request.user_data.len() > MAX_USER_DATA {
            return Err(HostError::Invalid {
                provider: PROVIDER,
                message: format!(
                    "user data is {} bytes; DigitalOcean accepts at most {MAX_USER_DATA}",
                    request.user_data.len()
                ),
            });
        }
        let tags: Vec<String> = request.tags.iter().map(|(k, v)| TagSyntax::DigitalOcean.encode(k, v).0).collect();
        let mut body = json!({
            "name": request.name,
            "size": request.size.as_deref().unwrap_or(&self.settings.default_size),
            "image": self.settings.image,
            "user_data": request.user_data,
            "tags": tags,
        });
        if let Some(region) = request.region.as_ref().or(self.settings.default_region.as_ref()) {
            body["region"] = json!(region);
        }
        let response = self
            .rest
            .send("CreateDroplet", Method::POST, "/v2/droplets", &[], Some(&body))
            .await
            .map_err(droplet_limit)?;
        let created: DropletBody = self.rest.decode("CreateDroplet", &response)?;
        Ok(created.droplet.into())
    }

    async fn get(&self, id: &str) -> Result<Option<Host>, HostError> {
        let id = droplet_id(id)?;
        match self.rest.send("GetDroplet", Method::GET, &format!("/v2/droplets/{id}"), &[], None).await {
            Ok(response) => Ok(Some(self.rest.decode::<DropletBody>("GetDroplet", &response)?.droplet.into())),
            Err(HostError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn delete(&self, id: &str) -> Result<(), HostError> {
        let id = droplet_id(id)?;
        match self.rest.send("DeleteDroplet", Method::DELETE, &format!("/v2/droplets/{id}"), &[], None).await {
            Ok(_) | Err(HostError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn list_by_tag(&self, key: &str, value: &str) -> Result<Vec<Host>, HostError> {
        let (tag, _) = TagSyntax::DigitalOcean.encode(key, value);
        let per_page = self.settings.page_size.clamp(1, MAX_PAGE_SIZE).to_string();
        let mut hosts = Vec::new();
        // Page numbers rather than the absolute `next` URL, so a base-URL override holds.
        for page in 1..=MAX_PAGES {
            let page = page.to_string();
            let query = [("tag_name", tag.as_str()), ("per_page", per_page.as_str()), ("page", page.as_str())];
            let response = self.rest.send("ListDroplets", Method::GET, "/v2/droplets", &query, None).await?;
            let body: DropletPage = self.rest.decode("ListDroplets", &response)?;
            let last = body.droplets.is_empty()
                || body.links.and_then(|l| l.pages).and_then(|p| p.next).is_none_or(|n| n.is_empty());
            hosts.extend(body.droplets.into_iter().map(Host::from));
            if last {
                return Ok(hosts);
            }
        }
        Err(HostError::Unavailable { provider: PROVIDER, message: format!("more than {MAX_PAGES} pages of droplets") })
    }

    /// A reserved IP is made assigned to its first droplet (it carries no tags of its own); an
    /// assign action re-points it at another running droplet in its region, and each droplet
    /// keeps its own public address, which its tunnel client dials.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            address_binding: AddressBinding::WithHost,
            moves_addresses: true,
            spread: Spread::No("DigitalOcean places droplets itself, so both exit servers may share a hypervisor"),
            pool_addresses: PoolAddresses::One("a Droplet takes one reserved IP at a time"),
            ..Capabilities::default()
        }
    }

    async fn reserve_address(&self, request: &AddressRequest) -> Result<Address, HostError> {
        self.reserve(request).await
    }

    async fn get_address(&self, id: &str) -> Result<Option<Address>, HostError> {
        self.reserved_ip(id).await
    }

    async fn assign_address(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        self.assign(id, host_id).await
    }

    async fn release_address(&self, id: &str) -> Result<(), HostError> {
        self.release(id).await
    }

    async fn address_region(&self, id: &str) -> Result<Option<String>, HostError> {
        self.reserved_ip_region(id).await
    }

    async fn list_addresses_by_tag(&self, key: &str, value: &str) -> Result<Vec<Address>, HostError> {
        self.reserved_ips_by_tag(key, value).await
    }

    async fn list_untagged_addresses(&self) -> Result<Option<Vec<Address>>, HostError> {
        self.all_reserved_ips().await.map(Some)
    }

    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn limiter(&self) -> &Limiter {
        self.rest.limiter()
    }
}

/// A runaway `next` link must not loop forever (200 per page × 500 pages = 100,000 droplets).
const MAX_PAGES: u32 = 500;

#[cfg(test)]
mod tests {
    use super::*;

    /// A powered-off droplet (an account policy, an image that shuts down) reads as stopped: the
    /// controller replaces it, and each replacement draws from the Tunnel's daily budget.
    #[test]
    fn a_droplet_that_is_off_reads_as_stopped() {
        for (status, state) in
            [("off", HostState::Stopped), ("archive", HostState::Stopped), ("active", HostState::Running)]
        {
            let droplet: Droplet =
                serde_json::from_value(serde_json::json!({"id": 42, "name": "d", "status": status})).unwrap();
            assert_eq!(Host::from(droplet).state, state, "{status}");
        }
    }
}
