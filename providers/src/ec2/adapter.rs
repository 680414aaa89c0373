//! The [`HostProvider`] operations of EC2, in terms of the helpers of the other modules.

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, InstanceStateName, InstanceType, ResourceType, Tag, TagSpecification};
use base64::Engine as _;
use tracing::warn;

use super::convert::{host_in, map_err};
use super::groups::tags;
use super::secondary::primary_interface;
use super::{Ec2Provider, MAX_USER_DATA, PROVIDER, TAG_INSTANCE_ID, invalid, metadata_options, unavailable};
use crate::error::HostError;
use crate::exit::userdata::{ExitServer, render_server_toml};
use crate::hosts::{
    Address, AddressRequest, Capabilities, Host, HostProvider, HostRequest, MovedAddress, PoolAddresses, Spread,
    TAG_MOVED_ADDRESS,
};
use crate::limiter::Limiter;

/// Why a pair's two instances may share a zone, where fewer than two subnets are configured.
const SPREAD_NEEDS_SUBNETS: &str = "both instances may run in one availability zone: give --ec2-subnet-ids (Helm \
     tunnel.ec2SubnetIds) subnets in two or more zones, and a pair's instances go to different ones";
/// Why a pair's two instances may share a zone outside the region the subnets are in.
const SPREAD_DEFAULT_REGION_ONLY: &str = "both instances may run in one availability zone: the subnets of \
     --ec2-subnet-ids are in the operator's default region, not this Tunnel's, so EC2 picks the zones here";

impl Ec2Provider {
    async fn console(
        &self,
        r: &super::Regional,
        instance_id: &str,
        latest: bool,
    ) -> Result<aws_sdk_ec2::operation::get_console_output::GetConsoleOutputOutput, HostError> {
        self.call(r, "GetConsoleOutput", async {
            r.client.get_console_output().instance_id(instance_id).latest(latest).send().await.map_err(map_err)
        })
        .await
    }
}

#[async_trait]
impl HostProvider for Ec2Provider {
    async fn create(&self, request: &HostRequest) -> Result<Host, HostError> {
        if request.user_data.len() > MAX_USER_DATA {
            return Err(invalid(format!(
                "user data is {} bytes; EC2 accepts at most {MAX_USER_DATA}",
                request.user_data.len()
            )));
        }
        let r = self.regional(request.region.as_deref())?;
        let image = self.image_for(&r)?.to_string();
        self.retry_pending().await;
        let group_id = self.create_group(&r, request).await?;
        let instance_tags =
            TagSpecification::builder().resource_type(ResourceType::Instance).set_tags(Some(tags(request))).build();
        let volume_tags =
            TagSpecification::builder().resource_type(ResourceType::Volume).set_tags(Some(tags(request))).build();
        let instance_type = request.size.clone().unwrap_or_else(|| self.settings.default_instance_type.clone());
        let user_data = base64::engine::general_purpose::STANDARD.encode(&request.user_data);
        let token = format!("skyport-{:016x}", rand::random::<u64>());
        let subnet = self.network(&r).await?.subnet_for(request.failure_domain);
        let launched = self
            .call(&r, "RunInstances", async {
                r.client
                    .run_instances()
                    .image_id(&image)
                    .instance_type(InstanceType::from(instance_type.as_str()))
                    .min_count(1)
                    .max_count(1)
                    .user_data(user_data)
                    .metadata_options(metadata_options())
                    .security_group_ids(&group_id)
                    .set_subnet_id(subnet)
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
                // No instance uses the group: delete it now, or on a later call if that fails.
                self.delete_group_or_defer(&r, &group_id).await;
                return Err(e);
            }
        };
        let instance = out.instances().first().ok_or_else(|| unavailable("RunInstances returned no instance"))?;
        let created = host_in(&r, instance)
            .ok_or_else(|| unavailable("RunInstances returned an instance without id or already terminated"))?;
        let instance_id = instance.instance_id().unwrap_or_default().to_string();
        // Without this tag `delete` still finds the group through the instance while EC2 shows
        // it (about an hour after termination).
        let tagged = self
            .call(&r, "CreateTags", async {
                r.client
                    .create_tags()
                    .resources(&group_id)
                    .tags(Tag::builder().key(TAG_INSTANCE_ID).value(&instance_id).build())
                    .send()
                    .await
                    .map_err(map_err)
            })
            .await;
        if let Err(e) = tagged {
            warn!(provider = PROVIDER, group = %group_id, error = %e, "could not tag the security group with its instance");
        }
        if request.tags.contains_key(TAG_MOVED_ADDRESS) {
            // A pair's server: the moved Elastic IP goes onto a secondary private IPv4 that its
            // user data reads at boot. Without one it could not take the address, so it goes
            // again (or, if that fails too, gets one at the first move: see `secondary`).
            let interface = primary_interface(instance).and_then(|n| n.network_interface_id()).unwrap_or_default();
            if let Err(e) = self.assign_secondary(&r, &instance_id, interface).await {
                if let Err(cleanup) = self.delete(&created.id).await {
                    warn!(provider = PROVIDER, host = %created.id, error = %cleanup, "could not delete the exit server again");
                }
                return Err(e);
            }
        }
        Ok(created)
    }

    /// Makes the host's security groups open exactly the new ports, then pushes the config to
    /// the exit server ([`crate::exit::push`]). The group goes first so a new port is reachable the
    /// moment the server binds it; a removed port is closed a moment early, which is harmless
    /// (the Service no longer has it). A host that takes no push is replaced by the controller.
    async fn reconfigure(&self, id: &str, server: &ExitServer) -> Result<bool, HostError> {
        let (r, instance_id) = self.resolve(id)?;
        self.retry_pending().await;
        // A terminated instance reads as gone, as in `get`.
        let gone = || HostError::NotFound { provider: PROVIDER, message: format!("instance {id}") };
        let instance = self.describe(&r, instance_id).await?.ok_or_else(gone)?;
        let host = host_in(&r, &instance).ok_or_else(gone)?;
        let ip = host.public_ipv4.ok_or_else(|| unavailable(&format!("instance {id} has no public address yet")))?;
        // The group enforces the ranges ([`Self::host_enforces_source_ranges`]), but for services
        // bound to addresses of their own ([`ExitServer::for_cloud_firewall`]).
        let config = render_server_toml(&server.for_cloud_firewall()).map_err(|e| invalid(e.to_string()))?;
        for group in self.groups_of(&r, instance_id, Some(&instance)).await? {
            // Never change a group the user attached by hand.
            if self.is_ours(&r, &group).await? {
                self.sync_ingress(&r, &group, server).await?;
            }
        }
        crate::exit::push::reconfigure_host(PROVIDER, &ip, server, &config).await
    }

    /// The host's security groups made by skyport take exactly the new rules ([`Self::reconfigure`]
    /// without the push: the exit server itself does not know the ranges).
    async fn sync_source_ranges(&self, id: &str, server: &ExitServer) -> Result<bool, HostError> {
        let (r, instance_id) = self.resolve(id)?;
        self.retry_pending().await;
        // A terminated instance reads as gone, as in `get`.
        let gone = || HostError::NotFound { provider: PROVIDER, message: format!("instance {id}") };
        let instance = self.describe(&r, instance_id).await?.ok_or_else(gone)?;
        host_in(&r, &instance).ok_or_else(gone)?;
        for group in self.groups_of(&r, instance_id, Some(&instance)).await? {
            if self.is_ours(&r, &group).await? {
                self.sync_ingress(&r, &group, server).await?;
            }
        }
        Ok(true)
    }

    async fn get(&self, id: &str) -> Result<Option<Host>, HostError> {
        let (r, instance) = self.resolve(id)?;
        self.retry_pending().await;
        Ok(self.describe(&r, instance).await?.as_ref().and_then(|i| host_in(&r, i)))
    }

    /// The latest console output where the instance type offers it (Nitro), else what EC2
    /// buffered at the instance's last state change.
    async fn console_output(&self, id: &str) -> Result<Option<String>, HostError> {
        let (r, instance_id) = self.resolve(id)?;
        let out = match self.console(&r, instance_id, true).await {
            Ok(out) => out,
            Err(HostError::NotFound { .. }) => return Ok(None),
            // Not allowed (no ec2:GetConsoleOutput) or throttled: the buffered one fares no better.
            Err(e @ (HostError::Unauthorized { .. } | HostError::RateLimited { .. })) => return Err(e),
            Err(e) => {
                warn!(host = %id, error = %e, "no latest console output; reading the buffered one");
                match self.console(&r, instance_id, false).await {
                    Ok(out) => out,
                    Err(HostError::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(e),
                }
            }
        };
        // Base64 on the wire; kept as is if an endpoint sends it plain.
        Ok(out.output().map(|text| {
            base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                .unwrap_or_else(|_| text.to_string())
        }))
    }

    async fn delete(&self, id: &str) -> Result<(), HostError> {
        let (r, instance_id) = self.resolve(id)?;
        self.retry_pending().await;
        let instance = self.describe(&r, instance_id).await?;
        let groups = self.groups_of(&r, instance_id, instance.as_ref()).await?;
        let alive =
            instance.as_ref().is_some_and(|i| i.state().and_then(|s| s.name()) != Some(&InstanceStateName::Terminated));
        if alive {
            let result = self
                .call(&r, "TerminateInstances", async {
                    r.client.terminate_instances().instance_ids(instance_id).send().await.map_err(map_err)
                })
                .await;
            match result {
                Ok(_) | Err(HostError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        // Groups tagged with the instance id are ours; an attached one only if tagged managed-by.
        let mut first_error = None;
        for group in groups {
            if instance.is_some() && !self.is_ours(&r, &group).await? {
                continue;
            }
            if let Some(e) = self.delete_group_or_defer(&r, &group).await {
                first_error.get_or_insert(e);
            }
        }
        // The instance is on its way out; a group still in use is deleted by a later call, and
        // the error makes a finalizer wait for it.
        first_error.map_or(Ok(()), Err)
    }

    async fn list_by_tag(&self, key: &str, value: &str) -> Result<Vec<Host>, HostError> {
        self.retry_pending().await;
        let mut hosts = Vec::new();
        for r in self.all_regions()? {
            if let Err(e) = self.reap_groups(&r, key, value).await {
                warn!(provider = PROVIDER, error = %e, "could not look for left-over security groups");
            }
            let mut next: Option<String> = None;
            loop {
                let page = self
                    .call(&r, "DescribeInstances", async {
                        r.client
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
                hosts.extend(page.reservations().iter().flat_map(|res| res.instances()).filter_map(|i| host_in(&r, i)));
                next = page.next_token().map(str::to_string).filter(|t| !t.is_empty());
                if next.is_none() {
                    break;
                }
            }
        }
        hosts.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(hosts)
    }

    async fn reserve_address(&self, request: &AddressRequest) -> Result<Address, HostError> {
        self.allocate_address(request).await
    }

    async fn get_address(&self, id: &str) -> Result<Option<Address>, HostError> {
        self.describe_address(id).await
    }

    async fn assign_address(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        self.associate_address(id, host_id).await
    }

    async fn release_address(&self, id: &str) -> Result<(), HostError> {
        self.free_address(id).await
    }

    async fn member_addresses_limit(
        &self,
        region: Option<&str>,
        size: Option<&str>,
    ) -> Result<Option<usize>, HostError> {
        self.member_limit(region, size).await.map(Some)
    }

    async fn list_addresses_by_tag(&self, key: &str, value: &str) -> Result<Vec<Address>, HostError> {
        self.addresses_by_tag(key, value).await
    }

    /// AssociateAddress re-points an Elastic IP at another running instance; a pair's servers
    /// take it on a secondary private IPv4, so each keeps the public IPv4 its client dials (see
    /// `secondary`).
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            moves_addresses: true,
            moved_address: MovedAddress::SecondaryIp,
            // The host's security group enforces the source ranges, in front of the VM (the
            // server's own firewall only for services bound to an address of their own).
            host_enforces_source_ranges: false,
            // An Elastic IP per pool member, each on a private IPv4 of its own (see `members`).
            pool_addresses: PoolAddresses::Translated,
            spread: match self.settings.subnet_ids.len() {
                0 | 1 => Spread::No(SPREAD_NEEDS_SUBNETS),
                _ => Spread::Zones,
            },
            ..Capabilities::default()
        }
    }

    /// The subnets of `--ec2-subnet-ids` are the default region's: elsewhere EC2 picks the zones.
    fn spread_in(&self, region: Option<&str>) -> Spread {
        match self.capabilities().spread {
            Spread::Zones if !self.is_default_region(region) => Spread::No(SPREAD_DEFAULT_REGION_ONLY),
            spread => spread,
        }
    }

    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}
