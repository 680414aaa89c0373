//! Security groups: one per instance, made before it and deleted after it.
//!
//! AWS refuses to delete a group while an instance (or any network interface) still uses it,
//! which lasts as long as the instance shuts down. A group that could not be deleted is
//! remembered (in memory, and as the [`TAG_DELETE_PENDING`] tag on the group) and deleted by a
//! later call of this provider, whatever that call is for. After a restart, when memory is gone,
//! `list_by_tag` finds such groups by the same tags as the hosts it lists: a group carrying
//! skyport's tags whose instance ([`TAG_INSTANCE_ID`]) no longer runs, or that carries
//! [`TAG_DELETE_PENDING`], is deleted. A group made by a launch that never happened (the
//! operator died between CreateSecurityGroup and RunInstances) has neither tag: it carries its
//! creation time ([`TAG_CREATED_AT`]), and once older than `launch_grace` with no instance using
//! it, it is deleted too. So every group skyport makes is eventually deleted, by the finalizer,
//! the next reconcile, or the orphan sweep.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    Filter, InstanceStateName, IpPermission, IpRange, Ipv6Range, ResourceType, Tag, TagSpecification,
};
use tracing::{debug, info, warn};

use super::{Ec2Provider, PROVIDER, Regional, TAG_INSTANCE_ID, map_err, unavailable};
use crate::error::HostError;
use crate::exit::push::PUSH_PORT;
use crate::exit::userdata::{ExitServer, Protocol};
use crate::hosts::{HostRequest, TAG_MANAGED_BY};

/// Marks a group whose deletion failed, so a restarted operator still deletes it.
pub const TAG_DELETE_PENDING: &str = "skyport.dev/delete-pending";
/// When the group was made (Unix seconds): EC2 records no creation time for a group, and one
/// whose launch never happened is told from one whose launch is under way only by its age.
pub const TAG_CREATED_AT: &str = "skyport.dev/created-at";
/// EC2 security group names are at most 255 characters.
pub(super) const MAX_GROUP_NAME: usize = 255;

/// Groups whose deletion failed, by (region, group id), with the earliest time to try again.
#[derive(Debug, Default)]
pub(super) struct Pending(std::sync::Mutex<BTreeMap<(String, String), Instant>>);

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), Instant>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The groups due for another try.
    fn due(&self) -> Vec<(String, String)> {
        let now = Instant::now();
        self.lock().iter().filter(|(_, at)| **at <= now).map(|(k, _)| k.clone()).collect()
    }

    /// How many groups wait for deletion (for tests and diagnostics).
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }
}

impl Ec2Provider {
    /// Creates the host's group with its ingress rules; a group that was made but could not be
    /// completed is deleted again (or left for a later call, never forgotten).
    pub(super) async fn create_group(&self, r: &Regional, request: &HostRequest) -> Result<String, HostError> {
        let vpc = self.network(r).await?.vpc;
        let name = group_name(&request.name);
        let mut tags = tags(request);
        tags.push(Tag::builder().key(TAG_CREATED_AT).value(unix_now().to_string()).build());
        let spec = TagSpecification::builder().resource_type(ResourceType::SecurityGroup).set_tags(Some(tags)).build();
        let group_id = self
            .call(r, "CreateSecurityGroup", async {
                let mut create = r
                    .client
                    .create_security_group()
                    .group_name(&name)
                    .description(format!("skyport exit server {}: tunnel control port and Service ports", request.name))
                    .tag_specifications(spec);
                if let Some(vpc) = &vpc {
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
            .call(r, "AuthorizeSecurityGroupIngress", async {
                r.client
                    .authorize_security_group_ingress()
                    .group_id(&group_id)
                    .set_ip_permissions(Some(permissions))
                    .send()
                    .await
                    .map_err(map_err)
            })
            .await;
        if let Err(e) = authorized {
            self.delete_group_or_defer(r, &group_id).await;
            return Err(e);
        }
        Ok(group_id)
    }

    /// One DeleteSecurityGroup; a group already gone counts as deleted.
    pub(super) async fn delete_group(&self, r: &Regional, group_id: &str) -> Result<(), HostError> {
        let result = self
            .call(r, "DeleteSecurityGroup", async {
                r.client.delete_security_group().group_id(group_id).send().await.map_err(|e| {
                    if e.code() == Some("DependencyViolation") { group_in_use(group_id) } else { map_err(e) }
                })
            })
            .await;
        match result {
            Ok(_) | Err(HostError::NotFound { .. }) => {
                self.pending.lock().remove(&(r.key(), group_id.to_string()));
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes the group, or remembers it (and tags it) for a later call when that fails.
    pub(super) async fn delete_group_or_defer(&self, r: &Regional, group_id: &str) -> Option<HostError> {
        let e = self.delete_group(r, group_id).await.err()?;
        self.defer(r, group_id).await;
        Some(e)
    }

    /// Remembers a group to delete later, in memory and as a tag that survives a restart.
    pub(super) async fn defer(&self, r: &Regional, group_id: &str) {
        let first = self
            .pending
            .lock()
            .insert((r.key(), group_id.to_string()), Instant::now() + self.settings.retry_groups_every)
            .is_none();
        if !first {
            return;
        }
        info!(provider = PROVIDER, group = group_id, "security group still in use; deleting it on a later call");
        let tagged = self
            .call(r, "CreateTags", async {
                r.client
                    .create_tags()
                    .resources(group_id)
                    .tags(Tag::builder().key(TAG_DELETE_PENDING).value("true").build())
                    .send()
                    .await
                    .map_err(map_err)
            })
            .await;
        if let Err(e) = tagged {
            debug!(provider = PROVIDER, group = group_id, error = %e, "could not mark the group for deletion");
        }
    }

    /// Tries every remembered group that is due again. Errors only postpone it.
    pub(super) async fn retry_pending(&self) {
        for (region, group) in self.pending.due() {
            let Ok(r) = self.regional(Some(&region)) else { continue };
            match self.delete_group(&r, &group).await {
                Ok(()) => {
                    info!(provider = PROVIDER, group = %group, "deleted a security group left by an earlier host")
                }
                Err(e) => {
                    debug!(provider = PROVIDER, group = %group, error = %e, "security group not deletable yet");
                    if let Some(at) = self.pending.lock().get_mut(&(region, group)) {
                        *at = Instant::now() + self.settings.retry_groups_every;
                    }
                }
            }
        }
    }

    /// Deletes skyport's groups tagged `key=value` that no running instance needs any more:
    /// those marked [`TAG_DELETE_PENDING`], those whose [`TAG_INSTANCE_ID`] is terminated or
    /// unknown, and those without either made more than `launch_grace` ago ([`TAG_CREATED_AT`])
    /// that no instance uses (their launch never happened). A younger one may belong to a launch
    /// under way and is left alone, and so is one without a creation time.
    pub(super) async fn reap_groups(&self, r: &Regional, key: &str, value: &str) -> Result<usize, HostError> {
        let out = self
            .call(r, "DescribeSecurityGroups", async {
                r.client
                    .describe_security_groups()
                    .filters(Filter::builder().name(format!("tag:{key}")).values(value).build())
                    .filters(Filter::builder().name("tag-key").values(TAG_MANAGED_BY).build())
                    .send()
                    .await
                    .map_err(map_err)
            })
            .await?;
        let mut marked = Vec::new();
        let mut by_instance: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut unlaunched = Vec::new();
        let made_before = unix_now().saturating_sub(self.settings.launch_grace.as_secs());
        for group in out.security_groups() {
            let Some(id) = group.group_id() else { continue };
            let tag = |k: &str| group.tags().iter().find(|t| t.key() == Some(k)).and_then(|t| t.value());
            if tag(TAG_DELETE_PENDING).is_some() {
                marked.push(id.to_string());
            } else if let Some(instance) = tag(TAG_INSTANCE_ID) {
                by_instance.entry(instance.to_string()).or_default().push(id.to_string());
            } else if tag(TAG_CREATED_AT).and_then(|t| t.parse::<u64>().ok()).is_some_and(|at| at <= made_before) {
                unlaunched.push(id.to_string());
            }
        }
        if !by_instance.is_empty() {
            let live = self.live_instances(r, by_instance.keys().cloned().collect()).await?;
            marked.extend(by_instance.into_iter().filter(|(i, _)| !live.contains(i)).flat_map(|(_, g)| g));
        }
        if !unlaunched.is_empty() {
            // The launch happened after all when an instance uses the group (tagging the group
            // with it failed): that group goes with its instance.
            let used = self.groups_in_use(r, &unlaunched).await?;
            marked.extend(unlaunched.into_iter().filter(|g| !used.contains(g)));
        }
        let mut deleted = 0;
        for group in marked {
            if self.delete_group_or_defer(r, &group).await.is_none() {
                warn!(provider = PROVIDER, group = %group, "deleted a security group its instance no longer needs");
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Which of `groups` an instance that is not terminated uses.
    async fn groups_in_use(&self, r: &Regional, groups: &[String]) -> Result<BTreeSet<String>, HostError> {
        let mut used = BTreeSet::new();
        for chunk in groups.chunks(150) {
            let out = self
                .call(r, "DescribeInstances", async {
                    r.client
                        .describe_instances()
                        .filters(Filter::builder().name("instance.group-id").set_values(Some(chunk.to_vec())).build())
                        .send()
                        .await
                        .map_err(map_err)
                })
                .await?;
            let instances = out.reservations().iter().flat_map(|res| res.instances());
            let alive = instances.filter(|i| i.state().and_then(|s| s.name()) != Some(&InstanceStateName::Terminated));
            used.extend(alive.flat_map(|i| i.security_groups()).filter_map(|g| g.group_id().map(str::to_string)));
        }
        Ok(used)
    }

    /// Which of `ids` exist and are not terminated (a filter, so unknown ids are no error).
    async fn live_instances(&self, r: &Regional, ids: Vec<String>) -> Result<BTreeSet<String>, HostError> {
        let mut live = BTreeSet::new();
        for chunk in ids.chunks(150) {
            let out = self
                .call(r, "DescribeInstances", async {
                    r.client
                        .describe_instances()
                        .filters(Filter::builder().name("instance-id").set_values(Some(chunk.to_vec())).build())
                        .send()
                        .await
                        .map_err(map_err)
                })
                .await?;
            let instances = out.reservations().iter().flat_map(|res| res.instances());
            let running =
                instances.filter(|i| i.state().and_then(|s| s.name()) != Some(&InstanceStateName::Terminated));
            live.extend(running.filter_map(|i| i.instance_id().map(str::to_string)));
        }
        Ok(live)
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `skyport-<host name>` plus a random suffix. The suffix matters when a host is replaced (its
/// ports changed): the new group is created while the old one may still wait for its instance
/// to finish terminating, under the same host name.
pub(super) fn group_name(host: &str) -> String {
    let base = if host.starts_with("skyport-") { host.to_string() } else { format!("skyport-{host}") };
    let base: String = base.chars().take(MAX_GROUP_NAME - 9).collect();
    format!("{base}-{:08x}", rand::random::<u32>())
}

/// The canonical tags plus `Name`, as EC2 tags (EC2 accepts keys like `skyport.dev/tunnel-uid`
/// as they are).
pub(super) fn tags(request: &HostRequest) -> Vec<Tag> {
    let mut tags: Vec<Tag> = request.tags.iter().map(|(k, v)| Tag::builder().key(k).value(v).build()).collect();
    tags.push(Tag::builder().key("Name").value(&request.name).build());
    tags
}

/// One rule per port and source: the control and push ports over TCP from anywhere (the operator
/// pushes and clients connect from addresses nobody configures), each service port with its
/// protocol from its `source_ranges` (the Service's `loadBalancerSourceRanges`), or from anywhere
/// when it has none. The health port is a service without ranges: the operator probes it.
pub(super) fn ingress(request: &HostRequest) -> Vec<IpPermission> {
    ingress_keys(&request.server).into_iter().map(rule).collect()
}

/// A rule as (protocol, port, source CIDR): what [`ingress`] makes and what a reconfigure
/// compares.
type RuleKey = (String, i32, String);

const ANYWHERE: &str = "0.0.0.0/0";

fn ingress_keys(server: &ExitServer) -> BTreeSet<RuleKey> {
    let tcp = |port: u16| ("tcp".to_string(), i32::from(port), ANYWHERE.to_string());
    let mut keys = BTreeSet::from([tcp(server.control_port), tcp(PUSH_PORT)]);
    for s in &server.services {
        let protocol = if s.protocol == Protocol::Udp { "udp" } else { "tcp" };
        // Host bits set (10.0.0.1/8) are cleared, as EC2 stores the rule; the operator checked
        // the ranges already, anything unparsable is passed on for EC2 to refuse.
        let sources: Vec<String> = match s.source_ranges.as_slice() {
            [] => vec![ANYWHERE.to_string()],
            ranges => ranges.iter().map(|r| crate::cidr::canonical(r).unwrap_or_else(|_| r.clone())).collect(),
        };
        keys.extend(sources.into_iter().map(|cidr| (protocol.to_string(), i32::from(s.port), cidr)));
    }
    keys
}

fn rule((protocol, port, cidr): RuleKey) -> IpPermission {
    let permission = IpPermission::builder().ip_protocol(protocol).from_port(port).to_port(port);
    if cidr.contains(':') {
        permission.ipv6_ranges(Ipv6Range::builder().cidr_ipv6(cidr).build()).build()
    } else {
        permission.ip_ranges(IpRange::builder().cidr_ip(cidr).build()).build()
    }
}

/// The single-port rules among `permissions`, one key per source (the shape [`ingress`] makes).
fn current_rules(permissions: &[IpPermission]) -> BTreeSet<RuleKey> {
    let mut keys = BTreeSet::new();
    for p in permissions.iter().filter(|p| p.from_port() == p.to_port()) {
        let (Some(protocol), Some(port)) = (p.ip_protocol(), p.from_port()) else { continue };
        let v4 = p.ip_ranges().iter().filter_map(|r| r.cidr_ip());
        let v6 = p.ipv6_ranges().iter().filter_map(|r| r.cidr_ipv6());
        keys.extend(v4.chain(v6).map(|cidr| (protocol.to_string(), port, cidr.to_string())));
    }
    keys
}

impl Ec2Provider {
    /// Makes `group_id` open exactly the ports of `server` to their sources (a Service's port or
    /// source range change): the missing rules are authorized, the single-port rules no port or
    /// source needs any more revoked. Port ranges (never made by skyport) are left alone.
    pub(super) async fn sync_ingress(
        &self,
        r: &Regional,
        group_id: &str,
        server: &ExitServer,
    ) -> Result<(), HostError> {
        let out = self
            .call(r, "DescribeSecurityGroups", async {
                r.client.describe_security_groups().group_ids(group_id).send().await.map_err(map_err)
            })
            .await?;
        let current = current_rules(out.security_groups().first().map(|g| g.ip_permissions()).unwrap_or_default());
        let wanted = ingress_keys(server);
        let missing: Vec<IpPermission> = wanted.difference(&current).cloned().map(rule).collect();
        if !missing.is_empty() {
            self.call(r, "AuthorizeSecurityGroupIngress", async {
                r.client
                    .authorize_security_group_ingress()
                    .group_id(group_id)
                    .set_ip_permissions(Some(missing))
                    .send()
                    .await
                    .map_err(map_err)
            })
            .await?;
        }
        let stale: Vec<IpPermission> = current.difference(&wanted).cloned().map(rule).collect();
        if !stale.is_empty() {
            self.call(r, "RevokeSecurityGroupIngress", async {
                r.client
                    .revoke_security_group_ingress()
                    .group_id(group_id)
                    .set_ip_permissions(Some(stale))
                    .send()
                    .await
                    .map_err(map_err)
            })
            .await?;
        }
        Ok(())
    }
}

/// AWS refuses to delete a group while an instance still uses it, which lasts as long as the
/// instance is shutting down (a minute or two). Transient, so the caller's retry deletes it later.
pub(super) fn group_in_use(group_id: &str) -> HostError {
    HostError::Unavailable {
        provider: PROVIDER,
        message: format!("security group {group_id} is still in use by its terminating instance; retrying"),
    }
}
