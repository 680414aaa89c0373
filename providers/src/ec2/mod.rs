//! The EC2 exit-server adapter: one instance per host, with its own security group that opens
//! only the tunnel's control port and the Service's ports.
//!
//! - create: CreateSecurityGroup (tagged like the instance, and with its creation time) +
//!   AuthorizeSecurityGroupIngress, then
//!   RunInstances with the user data and the owner tags on the instance and its volume, then the
//!   instance id as a tag on the group. Instances require IMDSv2 with a hop limit of 1
//!   ([`metadata_options`]). A highly available Tunnel's instance that takes the moved address (tagged so) then
//!   gets a secondary private IPv4 (AssignPrivateIpAddresses, see `secondary`); if that fails it
//!   is deleted again and the create fails. If the launch fails, the group is deleted again (or left for a
//!   later call when that fails too, see `groups`), so nothing leaks.
//! - get: DescribeInstances; `pending` → Provisioning, `running` → Running (PublicIpAddress),
//!   `stopping`/`stopped` → Stopped, `shutting-down` → Deleting, `terminated` or
//!   `InvalidInstanceID.NotFound` → gone.
//! - delete: TerminateInstances, then DeleteSecurityGroup for the instance's skyport-made groups.
//!   AWS refuses to delete a group while the instance is still shutting down
//!   (`DependencyViolation`, typically for a minute or two). `delete` does not wait for that: it
//!   returns a transient [`HostError::Unavailable`] so the Tunnel's finalizer retries with its
//!   backoff, without holding a reconcile worker. A retry finds the groups by their
//!   [`TAG_INSTANCE_ID`] tag (written right after launch) even once the instance itself has
//!   vanished from DescribeInstances. A group or instance already gone counts as deleted. A
//!   group that could not be deleted is not forgotten: every later call retries it, and
//!   `list_by_tag` finds left-over groups by tag after a restart (see `groups`).
//! - Regions: a request's `region` picks the region (one client and one rate-limit budget per
//!   region); host ids outside the default region read `<region>/<instance id>`.
//! - Reserved addresses: Elastic IPs (see `addresses`); a highly available Tunnel's moves between
//!   secondary private IPv4s of its two servers, which get one right after launch (see `secondary`).
//! - list_by_tag: DescribeInstances filtered by `tag:<key>` and by every state but `terminated`,
//!   every page.
//!
//! Rate limit: EC2 throttles per account and region with token buckets per API action
//! ("Request throttling for the Amazon EC2 API", docs.aws.amazon.com/ec2/latest/devguide/
//! ec2-api-throttling.html). Non-mutating actions such as the Describe calls refill at 20 tokens
//! a second (bucket 100); mutating actions refill at 5 a second (bucket 50); RunInstances also
//! draws on a resource bucket of 1,000 instances refilled at 2 a second. Every call here passes
//! one limiter sized to the mutating refill rate ([`default_budget`]), so skyport alone never
//! drains a bucket that other tools in the account share; `RequestLimitExceeded` maps to
//! [`HostError::RateLimited`].

mod adapter;
mod addresses;
mod convert;
mod groups;
mod members;
mod network;
mod secondary;

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use aws_config::{Region, SdkConfig};
use aws_sdk_ec2::Client;
use aws_sdk_ec2::types::{
    Filter, HttpTokensState, Instance, InstanceMetadataEndpointState, InstanceMetadataOptionsRequest,
};

pub use self::convert::error_from_code;
use self::convert::map_err;
use self::groups::Pending;
pub use self::groups::{TAG_CREATED_AT, TAG_DELETE_PENDING};
use crate::error::HostError;
use crate::hosts::TAG_MANAGED_BY;
use crate::limiter::{Limiter, SUCCESS};
use crate::rest::Budget;
#[cfg(test)]
use {
    self::convert::host,
    self::groups::{MAX_GROUP_NAME, group_in_use, group_name, ingress, tags},
    crate::exit::userdata::Protocol,
    crate::hosts::{HostRequest, HostState},
    aws_sdk_ec2::types::InstanceStateName,
};

const PROVIDER: &str = "ec2";
/// EC2's user data limit (16 KB before base64).
pub const MAX_USER_DATA: usize = 16 * 1024;
/// Tag on a security group naming the instance it was made for, so `delete` finds the group even
/// when DescribeInstances no longer shows the instance or its groups (about an hour after
/// termination), and never takes the group of a replacement host with the same name.
pub const TAG_INSTANCE_ID: &str = "skyport.dev/instance-id";

/// One call per 200 ms sustained (EC2's refill rate for mutating actions, see the module docs)
/// with bursts of 10: a create costs three calls, a converged host one Describe per resync.
/// EC2 throttles per account and region, so each region gets a budget of this size.
pub fn default_budget() -> Budget {
    Budget { period: Duration::from_millis(200), burst: NonZeroU32::new(10).expect("non-zero") }
}

/// How to reach EC2 and what to launch. Credentials and the endpoint come from the standard AWS
/// chain (`AWS_ENDPOINT_URL[_EC2]`, env keys, profiles, IRSA, Pod Identity).
#[derive(Debug, Clone)]
pub struct Ec2Settings {
    /// Overrides the region from the standard chain: where hosts go when a Tunnel names none.
    pub region: Option<String>,
    /// Overrides the endpoint (LocalStack in tests).
    pub endpoint_url: Option<String>,
    /// The AMI of the default region: a Debian or Ubuntu image with cloud-init. Required.
    pub image_id: String,
    /// The other regions a Tunnel may name in `spec.region`, each with its AMI (AMI ids are
    /// regional). A region missing here is refused with a message naming it. These regions are
    /// also where `list_by_tag` (and so the orphan sweep) looks, besides the default one.
    pub region_images: BTreeMap<String, String>,
    /// Instance type when the Tunnel names none.
    pub default_instance_type: String,
    /// Subnets to launch in, in the default region, one per availability zone, all of one VPC
    /// (default: the default VPC's default subnet for the AZ AWS picks); the security groups go
    /// to their VPC. A single exit server takes the first; a pair's two take different ones, so
    /// two subnets put them in two zones. Other regions always use their default VPC. See
    /// `network`.
    pub subnet_ids: Vec<String>,
    /// Rate limit of the EC2 calls in each region ([`default_budget`]).
    pub budget: Budget,
    /// Upper bound for one call including the SDK's retries.
    pub operation_timeout: Duration,
    /// How long a security group that could not be deleted waits before a later call tries
    /// again (each try is one DeleteSecurityGroup).
    pub retry_groups_every: Duration,
    /// How long after its creation a security group may go without an instance before it
    /// counts as left by a launch that never happened (the operator died between
    /// CreateSecurityGroup and RunInstances) and is deleted. A launch takes seconds.
    pub launch_grace: Duration,
}

impl Ec2Settings {
    /// Defaults for everything but the AMI, which has no sensible default across regions.
    pub fn new(image_id: impl Into<String>) -> Self {
        Ec2Settings {
            region: None,
            endpoint_url: None,
            image_id: image_id.into(),
            region_images: BTreeMap::new(),
            default_instance_type: "t3.nano".into(),
            subnet_ids: Vec::new(),
            budget: default_budget(),
            operation_timeout: Duration::from_secs(30),
            retry_groups_every: Duration::from_secs(15),
            launch_grace: Duration::from_secs(600),
        }
    }
}

/// One region's client and budget.
struct Regional {
    /// `None` for the default region, whose host ids carry no region prefix.
    name: Option<String>,
    client: Client,
    /// The region's own token bucket; the default region uses the provider's limiter.
    bucket: Option<Limiter>,
    /// Where instances and groups go here, once looked up.
    network: tokio::sync::OnceCell<network::Network>,
}

impl Regional {
    /// Key of this region in maps (the default region is the empty string).
    fn key(&self) -> String {
        self.name.clone().unwrap_or_default()
    }

    /// A host id as the controller stores it: `<region>/<instance id>` outside the default
    /// region, so `get` and `delete` know where to look from the id alone.
    fn qualify(&self, instance_id: &str) -> String {
        match &self.name {
            Some(region) => format!("{region}/{instance_id}"),
            None => instance_id.to_string(),
        }
    }
}

/// Exit servers as EC2 instances.
pub struct Ec2Provider {
    base: SdkConfig,
    default: Arc<Regional>,
    default_region: Option<String>,
    others: std::sync::Mutex<BTreeMap<String, Arc<Regional>>>,
    settings: Ec2Settings,
    limiter: Limiter,
    pending: Pending,
    ip_limits: members::IpLimits,
}

impl Ec2Provider {
    /// Builds the client from the standard AWS chain plus `settings`, as
    /// [`crate::SqsProvider::from_env`] does. Fails only on incomplete settings (no AMI, a region
    /// name that cannot be one); the subnet is looked up at the first launch.
    pub async fn from_env(settings: Ec2Settings) -> Result<Self, HostError> {
        if settings.image_id.trim().is_empty() {
            return Err(invalid(
                "no AMI configured: set --ec2-image-id / SKYPORT_EC2_IMAGE_ID (a Debian or Ubuntu image with \
                 cloud-init)"
                    .into(),
            ));
        }
        for region in settings.region_images.keys() {
            check_region(region)?;
        }
        let base = crate::aws::sdk_config(
            settings.region.as_deref(),
            settings.endpoint_url.as_deref(),
            settings.operation_timeout,
        )
        .await;
        let default_region = base.region().map(|r| r.to_string());
        let default =
            Arc::new(Regional { name: None, client: Client::new(&base), bucket: None, network: Default::default() });
        let limiter = Limiter::from_quota(settings.budget.quota());
        Ok(Ec2Provider {
            base,
            default,
            default_region,
            others: Default::default(),
            settings,
            limiter,
            pending: Pending::default(),
            ip_limits: Default::default(),
        })
    }

    /// The SDK client of the default region, for tests and diagnostics that inspect what the
    /// adapter made. Calls made through it bypass the limiter.
    pub fn client(&self) -> &Client {
        &self.default.client
    }

    /// The region calls go to when a Tunnel names none.
    pub fn default_region(&self) -> Option<&str> {
        self.default_region.as_deref()
    }

    /// How many security groups wait to be deleted by a later call.
    pub fn groups_pending_deletion(&self) -> usize {
        self.pending.len()
    }

    /// The client and budget of `region` (`None` or the default region's name: the default).
    fn regional(&self, region: Option<&str>) -> Result<Arc<Regional>, HostError> {
        let Some(region) = region.filter(|r| !self.is_default_region(Some(r))) else {
            return Ok(self.default.clone());
        };
        check_region(region)?;
        let mut others = self.others.lock().unwrap_or_else(|p| p.into_inner());
        let regional = others.entry(region.to_string()).or_insert_with(|| {
            let config = aws_sdk_ec2::config::Builder::from(&self.base).region(Region::new(region.to_string())).build();
            Arc::new(Regional {
                name: Some(region.to_string()),
                client: Client::from_conf(config),
                bucket: Some(Limiter::from_quota(self.settings.budget.quota())),
                network: Default::default(),
            })
        });
        Ok(regional.clone())
    }

    /// Whether `region` names the default one: none, empty, or the default's name.
    pub(super) fn is_default_region(&self, region: Option<&str>) -> bool {
        region.is_none_or(|r| r.is_empty() || Some(r) == self.default_region.as_deref())
    }

    /// The region and instance id a host id names.
    fn resolve<'a>(&self, id: &'a str) -> Result<(Arc<Regional>, &'a str), HostError> {
        match id.split_once('/') {
            Some((region, instance)) => Ok((self.regional(Some(region))?, instance)),
            None => Ok((self.default.clone(), id)),
        }
    }

    /// Every region hosts may be in: the default one and each configured one.
    fn all_regions(&self) -> Result<Vec<Arc<Regional>>, HostError> {
        let mut all = vec![self.default.clone()];
        for region in self.settings.region_images.keys() {
            let r = self.regional(Some(region))?;
            if r.name.is_some() {
                all.push(r);
            }
        }
        Ok(all)
    }

    /// The AMI of a region.
    fn image_for(&self, r: &Regional) -> Result<&str, HostError> {
        match &r.name {
            None => Ok(&self.settings.image_id),
            Some(region) => self.settings.region_images.get(region).map(String::as_str).ok_or_else(|| {
                let known: Vec<&str> = self.settings.region_images.keys().map(String::as_str).collect();
                invalid(format!(
                    "region {region} has no AMI configured (AMI ids are regional); this operator launches in \
                     its default region {} and in [{}] only",
                    self.default_region.as_deref().unwrap_or("(from the AWS chain)"),
                    known.join(", ")
                ))
            }),
        }
    }

    async fn call<T>(
        &self,
        r: &Regional,
        operation: &'static str,
        f: impl std::future::Future<Output = Result<T, HostError>>,
    ) -> Result<T, HostError> {
        self.limiter.acquire_from(r.bucket.as_ref().unwrap_or(&self.limiter), operation).await;
        let result = f.await;
        let outcome = match &result {
            Ok(_) => SUCCESS,
            Err(e) => e.label(),
        };
        self.limiter.counters.record_outcome(operation, outcome);
        result
    }

    async fn describe(&self, r: &Regional, id: &str) -> Result<Option<Instance>, HostError> {
        let result = self
            .call(r, "DescribeInstances", async {
                r.client.describe_instances().instance_ids(id).send().await.map_err(map_err)
            })
            .await;
        match result {
            Ok(out) => Ok(out.reservations().iter().flat_map(|r| r.instances()).next().cloned()),
            Err(HostError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The groups made for instance `id`: those attached to it and those tagged with its id.
    async fn groups_of(&self, r: &Regional, id: &str, instance: Option<&Instance>) -> Result<Vec<String>, HostError> {
        let mut groups: Vec<String> = instance
            .iter()
            .flat_map(|i| i.security_groups())
            .filter_map(|g| g.group_id())
            .map(str::to_string)
            .collect();
        let tagged = self
            .call(r, "DescribeSecurityGroups", async {
                r.client
                    .describe_security_groups()
                    .filters(Filter::builder().name(format!("tag:{TAG_INSTANCE_ID}")).values(id).build())
                    .send()
                    .await
                    .map_err(map_err)
            })
            .await?;
        groups.extend(tagged.security_groups().iter().filter_map(|g| g.group_id().map(str::to_string)));
        groups.sort();
        groups.dedup();
        Ok(groups)
    }

    /// Whether group `id` carries skyport's managed-by tag (never delete a group the user
    /// attached by hand). A group already gone is not ours to delete.
    async fn is_ours(&self, r: &Regional, group: &str) -> Result<bool, HostError> {
        let described = self
            .call(r, "DescribeSecurityGroups", async {
                r.client.describe_security_groups().group_ids(group).send().await.map_err(map_err)
            })
            .await;
        match described {
            Ok(out) => {
                Ok(out.security_groups().iter().any(|g| g.tags().iter().any(|t| t.key() == Some(TAG_MANAGED_BY))))
            }
            Err(HostError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// IMDSv2 only, with a hop limit of 1: the user data (readable through the metadata service)
/// holds the tunnel's secrets, so only the instance itself, not a container on it or anything a
/// request-forging bug could reach, may read it.
pub fn metadata_options() -> InstanceMetadataOptionsRequest {
    InstanceMetadataOptionsRequest::builder()
        .http_endpoint(InstanceMetadataEndpointState::Enabled)
        .http_tokens(HttpTokensState::Required)
        .http_put_response_hop_limit(1)
        .build()
}

/// Region names look like `eu-west-1`: lower-case letters, digits and dashes. Anything else is
/// refused before it reaches a client or a host id.
fn check_region(region: &str) -> Result<(), HostError> {
    let ok = !region.is_empty()
        && region.len() <= 32
        && region.starts_with(|c: char| c.is_ascii_lowercase())
        && region.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok { Ok(()) } else { Err(invalid(format!("{region:?} is not an AWS region name"))) }
}

fn invalid(message: String) -> HostError {
    HostError::Invalid { provider: PROVIDER, message }
}

fn unavailable(message: &str) -> HostError {
    HostError::Unavailable { provider: PROVIDER, message: message.into() }
}

#[cfg(test)]
mod tests;
