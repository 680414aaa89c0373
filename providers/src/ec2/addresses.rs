//! Elastic IPs as a Tunnel's reserved address: AllocateAddress (tagged like hosts, so a restart
//! finds it by the owner's UID), AssociateAddress to each new instance (a highly available
//! Tunnel's servers: to their secondary private IPv4, see `secondary`), DisassociateAddress and
//! ReleaseAddress when the Tunnel goes. Ids are allocation ids, region-qualified like host ids.

use aws_sdk_ec2::types::{Address as ElasticIp, DomainType, Filter, ResourceType, Tag, TagSpecification};

use super::secondary::associate;
use super::{Ec2Provider, Regional, invalid, map_err, unavailable};
use crate::error::HostError;
use crate::hosts::{Address, AddressRequest};

impl Ec2Provider {
    pub(super) async fn allocate_address(&self, request: &AddressRequest) -> Result<Address, HostError> {
        let r = self.regional(request.region.as_deref())?;
        let mut tags: Vec<Tag> = request.tags.iter().map(|(k, v)| Tag::builder().key(k).value(v).build()).collect();
        tags.push(Tag::builder().key("Name").value(&request.name).build());
        let spec = TagSpecification::builder().resource_type(ResourceType::ElasticIp).set_tags(Some(tags)).build();
        let out = self
            .call(&r, "AllocateAddress", async {
                r.client
                    .allocate_address()
                    .domain(DomainType::Vpc)
                    .tag_specifications(spec)
                    .send()
                    .await
                    .map_err(map_err)
            })
            .await?;
        let (Some(allocation), Some(ip)) = (out.allocation_id(), out.public_ip()) else {
            return Err(unavailable("AllocateAddress returned no allocation id or address"));
        };
        let address = Address {
            private_ip: None,
            id: r.qualify(allocation),
            ip: ip.to_string(),
            host_id: None,
            tags: request.tags.clone(),
        };
        match &request.host_id {
            Some(host) => {
                self.associate_address(&address.id, host).await?;
                Ok(Address { host_id: Some(host.clone()), ..address })
            }
            None => Ok(address),
        }
    }

    pub(super) async fn describe_one(&self, r: &Regional, allocation: &str) -> Result<Option<ElasticIp>, HostError> {
        let result = self
            .call(r, "DescribeAddresses", async {
                r.client.describe_addresses().allocation_ids(allocation).send().await.map_err(map_err)
            })
            .await;
        match result {
            Ok(out) => Ok(out.addresses().first().cloned()),
            Err(HostError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn describe_address(&self, id: &str) -> Result<Option<Address>, HostError> {
        let (r, allocation) = self.resolve(id)?;
        Ok(self.describe_one(&r, allocation).await?.as_ref().and_then(|a| address(&r, a)))
    }

    pub(super) async fn associate_address(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        let (r, allocation) = self.resolve(id)?;
        let (host_region, instance) = self.resolve(host_id)?;
        if host_region.name != r.name {
            return Err(invalid(format!("address {id} and host {host_id} are in different regions")));
        }
        // A pool member's goes on a private IPv4 of its own (see `members`); a pair's server
        // takes it on its secondary private IPv4 (see `secondary`).
        let private_ip = match self.is_member_address(&r, allocation).await? {
            true => Some(self.member_ip(&r, instance, allocation).await?),
            false => self.association_ip(&r, instance).await?,
        };
        // Moving it away from an earlier (replaced) instance is part of the job.
        self.call(&r, "AssociateAddress", async {
            associate(r.client.associate_address(), allocation, instance, private_ip).send().await.map_err(map_err)
        })
        .await?;
        Ok(())
    }

    pub(super) async fn free_address(&self, id: &str) -> Result<(), HostError> {
        let (r, allocation) = self.resolve(id)?;
        let Some(found) = self.describe_one(&r, allocation).await? else { return Ok(()) };
        if let Some(association) = found.association_id() {
            let result = self
                .call(&r, "DisassociateAddress", async {
                    r.client.disassociate_address().association_id(association).send().await.map_err(map_err)
                })
                .await;
            match result {
                Ok(_) | Err(HostError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let result = self
            .call(&r, "ReleaseAddress", async {
                r.client.release_address().allocation_id(allocation).send().await.map_err(map_err)
            })
            .await;
        match result {
            Ok(_) | Err(HostError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn addresses_by_tag(&self, key: &str, value: &str) -> Result<Vec<Address>, HostError> {
        let mut all = Vec::new();
        for r in self.all_regions()? {
            // DescribeAddresses has no pagination: it returns every address of the region.
            let out = self
                .call(&r, "DescribeAddresses", async {
                    r.client
                        .describe_addresses()
                        .filters(Filter::builder().name(format!("tag:{key}")).values(value).build())
                        .send()
                        .await
                        .map_err(map_err)
                })
                .await?;
            all.extend(out.addresses().iter().filter_map(|a| address(&r, a)));
        }
        all.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(all)
    }
}

fn address(r: &Regional, a: &ElasticIp) -> Option<Address> {
    Some(Address {
        id: r.qualify(a.allocation_id()?),
        ip: a.public_ip()?.to_string(),
        host_id: a.instance_id().filter(|i| !i.is_empty()).map(|i| r.qualify(i)),
        private_ip: a.private_ip_address().filter(|ip| !ip.is_empty()).map(str::to_string),
        tags: a
            .tags()
            .iter()
            .filter(|t| t.key() != Some("Name"))
            .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or_default().to_string())))
            .collect(),
    })
}
