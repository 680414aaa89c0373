//! The EC2 exit-server adapter: one instance per host, with its own security group that opens
//! only the tunnel's control port and the Service's ports.
//!
//! - create: CreateSecurityGroup (tagged like the instance) + AuthorizeSecurityGroupIngress, then
//!   RunInstances with the user data and the owner tags on the instance and its volume, then the
//!   instance id as a tag on the group. If the launch fails, the group is deleted again, so
//!   nothing leaks.
//! - get: DescribeInstances; `pending` → Provisioning, `running` → Running (PublicIpAddress),
//!   `stopping`/`stopped` → Stopped, `shutting-down` → Deleting, `terminated` or
//!   `InvalidInstanceID.NotFound` → gone.
//! - delete: TerminateInstances, then DeleteSecurityGroup for the instance's skyport-made groups.
//!   AWS refuses to delete a group while the instance is still shutting down
//!   (`DependencyViolation`, typically for a minute or two). `delete` does not wait for that: it
//!   returns a transient [`HostError::Unavailable`] so the Tunnel's finalizer retries with its
//!   backoff, without holding a reconcile worker. A retry finds the groups by their
//!   [`TAG_INSTANCE_ID`] tag (written right after launch) even once the instance itself has
//!   vanished from DescribeInstances. A group or instance already gone counts as deleted.
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

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_ec2::Client;
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::{
    Filter, Instance, InstanceStateName, InstanceType, IpPermission, IpRange, ResourceType, Tag, TagSpecification,
};
use base64::Engine as _;

use crate::error::HostError;
use crate::hosts::{Host, HostProvider, HostRequest, HostState, TAG_MANAGED_BY};
use crate::limiter::{Limiter, SUCCESS};
use crate::rest::Budget;
use crate::userdata::Protocol;

const PROVIDER: &str = "ec2";
/// EC2's user data limit (16 KB before base64).
pub const MAX_USER_DATA: usize = 16 * 1024;
/// EC2 security group names are at most 255 characters.
const MAX_GROUP_NAME: usize = 255;
/// Tag on a security group naming the instance it was made for, so `delete` finds the group even
/// when DescribeInstances no longer shows the instance or its groups (about an hour after
/// termination), and never takes the group of a replacement host with the same name.
pub const TAG_INSTANCE_ID: &str = "skyport.dev/instance-id";

/// One call per 200 ms sustained (EC2's refill rate for mutating actions, see the module docs)
/// with bursts of 10: a create costs three calls, a converged host one Describe per resync.
pub fn default_budget() -> Budget {
    Budget { period: Duration::from_millis(200), burst: NonZeroU32::new(10).expect("non-zero") }
}

/// How to reach EC2 and what to launch. Credentials and the endpoint come from the standard AWS
/// chain (`AWS_ENDPOINT_URL[_EC2]`, env keys, profiles, IRSA, Pod Identity).
#[derive(Debug, Clone)]
pub struct Ec2Settings {
    /// Overrides the region from the standard chain.
    pub region: Option<String>,
    /// Overrides the endpoint (LocalStack in tests).
    pub endpoint_url: Option<String>,
    /// The AMI: a Debian or Ubuntu image with cloud-init. Required.
    pub image_id: String,
    /// Instance type when the Tunnel names none.
    pub default_instance_type: String,
    /// Subnet to launch in (default: the default VPC's default subnet for the AZ AWS picks).
    pub subnet_id: Option<String>,
    /// VPC of the security groups (default: the default VPC). Must match `subnet_id`.
    pub vpc_id: Option<String>,
    /// Rate limit of every EC2 call ([`default_budget`]).
    pub budget: Budget,
    /// Upper bound for one call including the SDK's retries.
    pub operation_timeout: Duration,
}

impl Ec2Settings {
    /// Defaults for everything but the AMI, which has no sensible default across regions.
    pub fn new(image_id: impl Into<String>) -> Self {
        Ec2Settings {
            region: None,
            endpoint_url: None,
            image_id: image_id.into(),
            default_instance_type: "t3.nano".into(),
            subnet_id: None,
            vpc_id: None,
            budget: default_budget(),
            operation_timeout: Duration::from_secs(30),
        }
    }
}

/// Exit servers as EC2 instances.
pub struct Ec2Provider {
    client: Client,
    settings: Ec2Settings,
    limiter: Limiter,
}

impl Ec2Provider {
    /// Builds the client from the standard AWS chain plus `settings`, as
    /// [`crate::SqsProvider::from_env`] does. Fails only on incomplete settings (no AMI, a subnet
    /// without its VPC).
    pub async fn from_env(settings: Ec2Settings) -> Result<Self, HostError> {
        if settings.image_id.trim().is_empty() {
            return Err(HostError::Invalid {
                provider: PROVIDER,
                message: "no AMI configured: set --ec2-image-id / SKYPORT_EC2_IMAGE_ID (a Debian or Ubuntu image \
                          with cloud-init)"
                    .into(),
            });
        }
        if settings.subnet_id.is_some() && settings.vpc_id.is_none() {
            // The group would land in the default VPC and RunInstances would refuse it.
            return Err(HostError::Invalid {
                provider: PROVIDER,
                message: "a subnet is configured without its VPC: set the VPC id of that subnet too".into(),
            });
        }
        let config = crate::aws::sdk_config(
            settings.region.as_deref(),
            settings.endpoint_url.as_deref(),
            settings.operation_timeout,
        )
        .await;
        let limiter = Limiter::from_quota(settings.budget.quota());
        Ok(Ec2Provider { client: Client::new(&config), settings, limiter })
    }

    /// The SDK client, for tests and diagnostics that inspect what the adapter made. Calls made
    /// through it bypass the limiter.
    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn call<T>(
        &self,
        operation: &'static str,
        f: impl std::future::Future<Output = Result<T, HostError>>,
    ) -> Result<T, HostError> {
        self.limiter.acquire(operation).await;
        let result = f.await;
        let outcome = match &result {
            Ok(_) => SUCCESS,
            Err(e) => e.label(),
        };
        self.limiter.counters.record_outcome(operation, outcome);
        result
    }

    async fn describe(&self, id: &str) -> Result<Option<Instance>, HostError> {
        let result = self
            .call("DescribeInstances", async {
                self.client.describe_instances().instance_ids(id).send().await.map_err(map_err)
            })
            .await;
        match result {
            Ok(out) => Ok(out.reservations().iter().flat_map(|r| r.instances()).next().cloned()),
            Err(HostError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn delete_group(&self, group_id: &str) -> Result<(), HostError> {
        let result = self
            .call("DeleteSecurityGroup", async {
                self.client.delete_security_group().group_id(group_id).send().await.map_err(|e| {
                    if e.code() == Some("DependencyViolation") { group_in_use(group_id) } else { map_err(e) }
                })
            })
            .await;
        match result {
            Ok(_) | Err(HostError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn create_group(&self, request: &HostRequest) -> Result<String, HostError> {
        let name = group_name(&request.name);
        let spec = TagSpecification::builder()
            .resource_type(ResourceType::SecurityGroup)
            .set_tags(Some(tags(request)))
            .build();
        let group_id = self
            .call("CreateSecurityGroup", async {
                let mut create = self
                    .client
                    .create_security_group()
                    .group_name(&name)
                    .description(format!("skyport exit server {}: tunnel control port and Service ports", request.name))
                    .tag_specifications(spec);
                if let Some(vpc) = &self.settings.vpc_id {
                    create = create.vpc_id(vpc);
                }
                create.send().await.map_err(map_err)
            })
            .await?
            .group_id()
            .map(str::to_string)
            .ok_or_else(|| unavailable("CreateSecurityGroup returned no group id"))?;
        let permissions = ingress(request);
        let authorized = self
            .call("AuthorizeSecurityGroupIngress", async {
                self.client
                    .authorize_security_group_ingress()
                    .group_id(&group_id)
                    .set_ip_permissions(Some(permissions))
                    .send()
                    .await
                    .map_err(map_err)
            })
            .await;
        if let Err(e) = authorized {
            let _ = self.delete_group(&group_id).await;
            return Err(e);
        }
        Ok(group_id)
    }
}

/// `skyport-<host name>` plus a random suffix. The suffix matters when a host is replaced (its
/// ports changed): the new group is created while the old one may still wait for its instance
/// to finish terminating, under the same host name.
fn group_name(host: &str) -> String {
    let base = if host.starts_with("skyport-") { host.to_string() } else { format!("skyport-{host}") };
    let base: String = base.chars().take(MAX_GROUP_NAME - 9).collect();
    format!("{base}-{:08x}", rand::random::<u32>())
}

/// The canonical tags plus `Name`, as EC2 tags (EC2 accepts keys like `skyport.dev/tunnel-uid`
/// as they are).
fn tags(request: &HostRequest) -> Vec<Tag> {
    let mut tags: Vec<Tag> = request.tags.iter().map(|(k, v)| Tag::builder().key(k).value(v).build()).collect();
    tags.push(Tag::builder().key("Name").value(&request.name).build());
    tags
}

/// One rule per port: the control port over TCP and each service port with its protocol, from
/// anywhere (these are public exit servers).
fn ingress(request: &HostRequest) -> Vec<IpPermission> {
    let anywhere = IpRange::builder().cidr_ip("0.0.0.0/0").build();
    let rule = |protocol: &str, port: u16| {
        IpPermission::builder()
            .ip_protocol(protocol)
            .from_port(i32::from(port))
            .to_port(i32::from(port))
            .ip_ranges(anywhere.clone())
            .build()
    };
    let mut rules = vec![rule("tcp", request.server.control_port)];
    for s in &request.server.services {
        rules.push(rule(if s.protocol == Protocol::Udp { "udp" } else { "tcp" }, s.port));
    }
    rules
}

/// AWS refuses to delete a group while an instance still uses it, which lasts as long as the
/// instance is shutting down (a minute or two). Transient, so the caller's retry deletes it later.
fn group_in_use(group_id: &str) -> HostError {
    HostError::Unavailable {
        provider: PROVIDER,
        message: format!("security group {group_id} is still in use by its terminating instance; retrying"),
    }
}

fn unavailable(message: &str) -> HostError {
    HostError::Unavailable { provider: PROVIDER, message: message.into() }
}

fn host(instance: &Instance) -> Option<Host> {
    let state = match instance.state().and_then(|s| s.name()) {
        Some(InstanceStateName::Pending) => HostState::Provisioning,
        Some(InstanceStateName::Running) => HostState::Running,
        Some(InstanceStateName::Stopping | InstanceStateName::Stopped) => HostState::Stopped,
        Some(InstanceStateName::ShuttingDown) => HostState::Deleting,
        Some(InstanceStateName::Terminated) => return None,
        _ => HostState::Provisioning,
    };
    let tags: BTreeMap<String, String> = instance
        .tags()
        .iter()
        .filter(|t| t.key() != Some("Name"))
        .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or_default().to_string())))
        .collect();
    let name = instance.tags().iter().find(|t| t.key() == Some("Name")).and_then(|t| t.value()).unwrap_or_default();
    Some(Host {
        id: instance.instance_id()?.to_string(),
        name: name.to_string(),
        public_ipv4: instance.public_ip_address().map(str::to_string),
        state,
        tags,
    })
}

/// Maps an EC2 error code (and message) to a [`HostError`]; messages come from AWS and hold no
/// credentials.
pub fn error_from_code(code: &str, message: String) -> HostError {
    let p = PROVIDER;
    let message = if message.is_empty() { code.to_string() } else { format!("{code}: {message}") };
    match code {
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" => {
            HostError::RateLimited { provider: p, retry_after: None }
        }
        "AuthFailure"
        | "UnauthorizedOperation"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "OptInRequired"
        | "Blocked"
        | "PendingVerification" => HostError::Unauthorized { provider: p, message },
        "InvalidInstanceID.NotFound" | "InvalidGroup.NotFound" | "InvalidGroupId.NotFound" => {
            HostError::NotFound { provider: p, message }
        }
        "InvalidGroup.Duplicate" => HostError::AlreadyExists { provider: p, message },
        "InsufficientInstanceCapacity"
        | "DependencyViolation"
        | "InternalError"
        | "Unavailable"
        | "ServiceUnavailable" => HostError::Unavailable { provider: p, message },
        c if c.ends_with("LimitExceeded") || c == "MaxSpotInstanceCountExceeded" => {
            HostError::Quota { provider: p, message }
        }
        c if c.starts_with("Invalid") || c.starts_with("Missing") || c.starts_with("Unsupported") => {
            HostError::Invalid { provider: p, message }
        }
        _ => HostError::Unavailable { provider: p, message },
    }
}

fn map_err<E, R>(err: SdkError<E, R>) -> HostError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match crate::aws::failure(err) {
        crate::aws::Failure::Service { code, message } => error_from_code(&code, message),
        crate::aws::Failure::Transport(message) => HostError::Unavailable { provider: PROVIDER, message },
    }
}

#[async_trait]
impl HostProvider for Ec2Provider {
    async fn create(&self, request: &HostRequest) -> Result<Host, HostError> {
        if request.user_data.len() > MAX_USER_DATA {
            return Err(HostError::Invalid {
                provider: PROVIDER,
                message: format!("user data is {} bytes; EC2 accepts at most {MAX_USER_DATA}", request.user_data.len()),
            });
        }
        let group_id = self.create_group(request).await?;
        let instance_tags =
            TagSpecification::builder().resource_type(ResourceType::Instance).set_tags(Some(tags(request))).build();
        let volume_tags =
            TagSpecification::builder().resource_type(ResourceType::Volume).set_tags(Some(tags(request))).build();
        let instance_type = request.size.clone().unwrap_or_else(|| self.settings.default_instance_type.clone());
        let user_data = base64::engine::general_purpose::STANDARD.encode(&request.user_data);
        let token = format!("skyport-{:016x}", rand::random::<u64>());
        let launched = self
            .call("RunInstances", async {
                self.client
                    .run_instances()
                    .image_id(&self.settings.image_id)
                    .instance_type(InstanceType::from(instance_type.as_str()))
                    .min_count(1)
                    .max_count(1)
                    .user_data(user_data)
                    .security_group_ids(&group_id)
                    .set_subnet_id(self.settings.subnet_id.clone())
                    .tag_specifications(instance_tags)
                    .tag_specifications(volume_tags)
                    .client_token(token)
                    .send()
                    .await
                    .map_err(map_err)
            })
            .await;
        let out = match launched {
            Ok(out) => out,
            Err(e) => {
                // No instance uses the group: delete it now rather than leak it.
                let _ = self.delete_group(&group_id).await;
                return Err(e);
            }
        };
        let instance = out.instances().first().ok_or_else(|| unavailable("RunInstances returned no instance"))?;
        let created = host(instance)
            .ok_or_else(|| unavailable("RunInstances returned an instance without id or already terminated"))?;
        // Best effort: without this tag `delete` still finds the group through the instance.
        let _ = self
            .call("CreateTags", async {
                self.client
                    .create_tags()
                    .resources(&group_id)
                    .tags(Tag::builder().key(TAG_INSTANCE_ID).value(&created.id).build())
                    .send()
                    .await
                    .map_err(map_err)
            })
            .await;
        Ok(created)
    }

    async fn get(&self, id: &str) -> Result<Option<Host>, HostError> {
        Ok(self.describe(id).await?.as_ref().and_then(host))
    }

    async fn delete(&self, id: &str) -> Result<(), HostError> {
        let instance = self.describe(id).await?;
        let attached = instance.iter().flat_map(|i| i.security_groups()).filter_map(|g| g.group_id());
        let mut groups: Vec<String> = attached.map(str::to_string).collect();
        let tagged = self
            .call("DescribeSecurityGroups", async {
                self.client
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
        let Some(instance) = instance else {
            // The instance is long gone; only its groups may be left.
            for group in groups {
                self.delete_group(&group).await?;
            }
            return Ok(());
        };
        if instance.state().and_then(|s| s.name()) != Some(&InstanceStateName::Terminated) {
            let result = self
                .call("TerminateInstances", async {
                    self.client.terminate_instances().instance_ids(id).send().await.map_err(map_err)
                })
                .await;
            match result {
                Ok(_) | Err(HostError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        // Only groups skyport made (tagged managed-by), never a group the user attached by hand.
        for group in groups {
            let described = self
                .call("DescribeSecurityGroups", async {
                    self.client.describe_security_groups().group_ids(&group).send().await.map_err(map_err)
                })
                .await;
            let ours = match described {
                Ok(out) => {
                    out.security_groups().iter().any(|g| g.tags().iter().any(|t| t.key() == Some(TAG_MANAGED_BY)))
                }
                Err(HostError::NotFound { .. }) => false,
                Err(e) => return Err(e),
            };
            if !ours {
                continue;
            }
            self.delete_group(&group).await?;
        }
        Ok(())
    }

    async fn list_by_tag(&self, key: &str, value: &str) -> Result<Vec<Host>, HostError> {
        let mut hosts = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let page = self
                .call("DescribeInstances", async {
                    self.client
                        .describe_instances()
                        .filters(Filter::builder().name(format!("tag:{key}")).values(value).build())
                        .filters(
                            Filter::builder()
                                .name("instance-state-name")
                                .values("pending")
                                .values("running")
                                .values("shutting-down")
                                .values("stopping")
                                .values("stopped")
                                .build(),
                        )
                        .set_next_token(next.clone())
                        .max_results(100)
                        .send()
                        .await
                        .map_err(map_err)
                })
                .await?;
            hosts.extend(page.reservations().iter().flat_map(|r| r.instances()).filter_map(host));
            next = page.next_token().map(str::to_string).filter(|t| !t.is_empty());
            if next.is_none() {
                break;
            }
        }
        hosts.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(hosts)
    }

    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorClass;

    #[test]
    fn ec2_error_codes_map_to_the_shared_classes() {
        let class = |code: &str| error_from_code(code, "m".into());
        assert!(matches!(class("RequestLimitExceeded"), HostError::RateLimited { .. }));
        assert!(matches!(class("UnauthorizedOperation"), HostError::Unauthorized { .. }));
        assert!(matches!(class("AuthFailure"), HostError::Unauthorized { .. }));
        assert!(matches!(class("InvalidInstanceID.NotFound"), HostError::NotFound { .. }));
        assert!(matches!(class("InvalidGroup.NotFound"), HostError::NotFound { .. }));
        assert!(matches!(class("InvalidGroup.Duplicate"), HostError::AlreadyExists { .. }));
        assert!(matches!(class("InvalidAMIID.Malformed"), HostError::Invalid { .. }));
        assert!(matches!(class("InvalidParameterValue"), HostError::Invalid { .. }));
        assert!(matches!(class("InstanceLimitExceeded"), HostError::Quota { .. }));
        assert!(matches!(class("VcpuLimitExceeded"), HostError::Quota { .. }));
        assert!(matches!(class("DependencyViolation"), HostError::Unavailable { .. }));
        assert!(matches!(class("InsufficientInstanceCapacity"), HostError::Unavailable { .. }));
        assert!(matches!(class("SomethingNew"), HostError::Unavailable { .. }));
        assert_eq!(class("InvalidAMIID.NotFound").class(), ErrorClass::Permanent);
        assert_eq!(class("DependencyViolation").class(), ErrorClass::Transient);
        assert_eq!(
            error_from_code("InvalidAMIID.Malformed", "Invalid id: \"ami-x\"".into()).to_string(),
            "ec2 rejected the request: InvalidAMIID.Malformed: Invalid id: \"ami-x\""
        );
    }

    fn request() -> HostRequest {
        use crate::userdata::{ExitServer, TunnelService};
        let service = |port, protocol| TunnelService { name: format!("s{port}"), protocol, port, token: "t".into() };
        HostRequest {
            name: "skyport-team-a-web".into(),
            region: None,
            size: None,
            user_data: "secret".into(),
            server: ExitServer {
                control_port: 2333,
                noise_private_key: "k".into(),
                services: vec![service(80, Protocol::Tcp), service(53, Protocol::Udp)],
            },
            tags: crate::hosts::owner_tags("uid", "team-a", "web"),
        }
    }

    #[test]
    fn ingress_opens_the_control_port_over_tcp_and_each_service_with_its_protocol() {
        let rules: Vec<_> = ingress(&request())
            .iter()
            .map(|r| {
                let cidrs: Vec<_> = r.ip_ranges().iter().filter_map(|c| c.cidr_ip()).collect();
                assert_eq!(cidrs, ["0.0.0.0/0"]);
                (r.ip_protocol().unwrap_or_default().to_string(), r.from_port(), r.to_port())
            })
            .collect();
        let rule = |p: &str, port| (p.to_string(), Some(port), Some(port));
        assert_eq!(rules, [rule("tcp", 2333), rule("tcp", 80), rule("udp", 53)]);
    }

    #[test]
    fn groups_are_named_after_the_host_and_never_collide() {
        let a = group_name("skyport-team-a-web");
        assert!(a.starts_with("skyport-team-a-web-") && a.len() == "skyport-team-a-web-".len() + 8, "{a}");
        assert_ne!(a, group_name("skyport-team-a-web"), "a replacement host gets its own group");
        assert!(group_name("web").starts_with("skyport-web-"));
        assert!(group_name(&"x".repeat(300)).len() <= MAX_GROUP_NAME);
    }

    #[test]
    fn instance_states_map_to_host_states_and_terminated_is_gone() {
        use aws_sdk_ec2::types::InstanceState;
        let instance = |state: InstanceStateName| {
            Instance::builder()
                .instance_id("i-1")
                .public_ip_address("54.214.1.2")
                .state(InstanceState::builder().name(state).build())
                .set_tags(Some(tags(&request())))
                .build()
        };
        let state = |s| host(&instance(s)).map(|h| h.state);
        assert_eq!(state(InstanceStateName::Pending), Some(HostState::Provisioning));
        assert_eq!(state(InstanceStateName::Running), Some(HostState::Running));
        assert_eq!(state(InstanceStateName::Stopping), Some(HostState::Stopped));
        assert_eq!(state(InstanceStateName::Stopped), Some(HostState::Stopped));
        assert_eq!(state(InstanceStateName::ShuttingDown), Some(HostState::Deleting));
        assert_eq!(state(InstanceStateName::Terminated), None);
        let running = host(&instance(InstanceStateName::Running)).unwrap();
        assert_eq!(running.name, "skyport-team-a-web");
        assert_eq!(running.public_ipv4.as_deref(), Some("54.214.1.2"));
        assert_eq!(running.tags, request().tags, "Name is not an owner tag");
    }

    #[test]
    fn throttling_auth_and_quota_codes_from_the_issue() {
        let class = |code: &str| error_from_code(code, String::new());
        assert!(matches!(class("Throttling"), HostError::RateLimited { .. }));
        assert!(matches!(class("InvalidClientTokenId"), HostError::Unauthorized { .. }));
        assert!(matches!(class("InvalidSubnetID.NotFound"), HostError::Invalid { .. }));
        assert!(matches!(class("InvalidParameterCombination"), HostError::Invalid { .. }));
        assert!(matches!(class("VolumeLimitExceeded"), HostError::Quota { .. }));
        assert!(matches!(class("InternalError"), HostError::Unavailable { .. }));
        assert_eq!(class("Unsupported").class(), ErrorClass::Permanent);
        // delete's answer while the instance shuts down: retried, and says why.
        let in_use = group_in_use("sg-1");
        assert_eq!(in_use.class(), ErrorClass::Transient);
        assert!(in_use.to_string().contains("sg-1 is still in use"), "{in_use}");
    }
}
