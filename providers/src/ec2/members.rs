//! The Elastic IPs of an ExitServerPool's members (`addressing: PerService`), each on a private
//! IPv4 of its own on the shared server ([`crate::hosts::PoolAddresses::Translated`]).
//!
//! An Elastic IP reaches an instance translated to the private IPv4 it is associated with, and
//! one private IPv4 takes one Elastic IP; associating one with the primary private IPv4 would also
//! replace the instance's own public IPv4, which the members' clients dial. So each member's
//! address goes onto a secondary private IPv4 of the instance's primary interface that no other
//! Elastic IP holds: one left free by a departed member, else one assigned for it now
//! (AssignPrivateIpAddresses). DescribeAddresses reports the private IPv4 of each association
//! ([`crate::Address::private_ip`]); the member's services bind it, and the server puts it on its
//! interface (`skyport tunnel addresses`). A released member's secondary private IPv4 stays on the
//! interface for the next member: a departed member never costs one.
//!
//! How many an instance holds is its type's IPv4 addresses per interface, less the primary
//! (DescribeInstanceTypes: t3.nano and t3.micro two, so one member; c5.large ten). The pool admits
//! no more members than that ([`Ec2Provider::member_limit`]), so a member past the
//! limit is refused with that reason instead of failing every pass of the shared server.

use std::collections::BTreeMap;
use std::sync::Mutex;

use aws_sdk_ec2::types::{Filter, Instance, InstanceType};
use tracing::info;

use super::secondary::primary_interface;
use super::{Ec2Provider, Regional, map_err, unavailable};
use crate::error::HostError;
use crate::hosts::TAG_POOL_MEMBER;

/// Private IPv4s per interface by (region key, instance type), read once each: a type's limit
/// does not change.
#[derive(Default)]
pub(super) struct IpLimits(Mutex<BTreeMap<(String, String), usize>>);

/// The secondary private IPv4s of `instance`'s primary interface, in the order EC2 lists them.
pub(super) fn secondary_ips(instance: &Instance) -> Vec<String> {
    let Some(interface) = primary_interface(instance) else { return Vec::new() };
    let primary = interface.private_ip_address();
    let listed = interface.private_ip_addresses().iter().filter(|p| p.primary() != Some(true));
    listed.filter_map(|p| p.private_ip_address()).filter(|ip| Some(*ip) != primary).map(str::to_string).collect()
}

/// Where member address `allocation` goes on an instance whose secondary private IPv4s are
/// `secondaries` and whose Elastic IPs sit at `held` (private IPv4 → allocation id): where it is
/// already, else the first secondary no other Elastic IP holds; `None`: one must be assigned.
pub(super) fn free_secondary(
    secondaries: &[String],
    held: &BTreeMap<String, String>,
    allocation: &str,
) -> Option<String> {
    if let Some((ip, _)) = held.iter().find(|(ip, a)| a.as_str() == allocation && secondaries.contains(ip)) {
        return Some(ip.clone());
    }
    secondaries.iter().find(|ip| !held.contains_key(*ip)).cloned()
}

impl Ec2Provider {
    /// The private IPv4 of instance `instance_id` that member address `allocation` is to be
    /// associated with ([`free_secondary`]); one is assigned to the primary interface when none
    /// is free.
    pub(super) async fn member_ip(
        &self,
        r: &Regional,
        instance_id: &str,
        allocation: &str,
    ) -> Result<String, HostError> {
        let gone = || HostError::NotFound { provider: super::PROVIDER, message: format!("instance {instance_id}") };
        let held = self.held_private_ips(r, instance_id).await?;
        let instance = self.describe(r, instance_id).await?.ok_or_else(gone)?;
        if let Some(ip) = free_secondary(&secondary_ips(&instance), &held, allocation) {
            return Ok(ip);
        }
        let interface = primary_interface(&instance)
            .and_then(|n| n.network_interface_id())
            .ok_or_else(|| unavailable(&format!("instance {instance_id} has no network interface yet")))?
            .to_string();
        self.assign_secondary(r, instance_id, &interface).await?;
        info!(instance = %instance_id, "gave the pool's server a private IPv4 for a member's address");
        let instance = self.describe(r, instance_id).await?.ok_or_else(gone)?;
        free_secondary(&secondary_ips(&instance), &held, allocation)
            .ok_or_else(|| unavailable(&format!("instance {instance_id} shows no free secondary private address yet")))
    }

    /// The private IPv4s of instance `instance_id` that hold an Elastic IP, each with its
    /// allocation id.
    async fn held_private_ips(&self, r: &Regional, instance_id: &str) -> Result<BTreeMap<String, String>, HostError> {
        let on_instance = Filter::builder().name("instance-id").values(instance_id).build();
        let out = self
            .call(r, "DescribeAddresses", async {
                r.client.describe_addresses().filters(on_instance).send().await.map_err(map_err)
            })
            .await?;
        let held = out.addresses().iter().filter_map(|a| Some((a.private_ip_address()?, a.allocation_id()?)));
        Ok(held.map(|(ip, id)| (ip.to_string(), id.to_string())).collect())
    }

    /// Whether Elastic IP `allocation` is a pool member's (tagged [`TAG_POOL_MEMBER`]).
    pub(super) async fn is_member_address(&self, r: &Regional, allocation: &str) -> Result<bool, HostError> {
        let found = self.describe_one(r, allocation).await?;
        Ok(found.is_some_and(|a| a.tags().iter().any(|t| t.key() == Some(TAG_POOL_MEMBER))))
    }

    /// How many member addresses one instance of `size` (default: the configured type) holds in
    /// `region`: its type's private IPv4s per interface, less the primary.
    pub(super) async fn member_limit(&self, region: Option<&str>, size: Option<&str>) -> Result<usize, HostError> {
        let r = self.regional(region)?;
        let size = size.unwrap_or(&self.settings.default_instance_type).to_string();
        let key = (r.key(), size.clone());
        if let Some(known) = self.ip_limits.0.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(*known);
        }
        let out = self
            .call(&r, "DescribeInstanceTypes", async {
                r.client
                    .describe_instance_types()
                    .instance_types(InstanceType::from(size.as_str()))
                    .send()
                    .await
                    .map_err(map_err)
            })
            .await?;
        let per_interface = out.instance_types().first().and_then(|t| t.network_info()?.ipv4_addresses_per_interface());
        let per_interface = per_interface
            .ok_or_else(|| unavailable(&format!("DescribeInstanceTypes gave no IPv4 address limit for {size}")))?;
        let limit = usize::try_from(per_interface).unwrap_or(0).saturating_sub(1);
        self.ip_limits.0.lock().unwrap_or_else(|e| e.into_inner()).insert(key, limit);
        Ok(limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_keeps_its_private_ip_takes_a_free_one_or_needs_a_new_one() {
        let secondaries: Vec<String> = ["172.31.5.77", "172.31.5.78"].map(String::from).to_vec();
        let held = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(ip, a)| (ip.to_string(), a.to_string())).collect()
        };
        let on_primary = held(&[("172.31.5.10", "eipalloc-self")]);
        assert_eq!(free_secondary(&secondaries, &on_primary, "eipalloc-1").as_deref(), Some("172.31.5.77"));
        let first_taken = held(&[("172.31.5.77", "eipalloc-1")]);
        assert_eq!(free_secondary(&secondaries, &first_taken, "eipalloc-2").as_deref(), Some("172.31.5.78"));
        assert_eq!(
            free_secondary(&secondaries, &first_taken, "eipalloc-1").as_deref(),
            Some("172.31.5.77"),
            "where it is"
        );
        let both = held(&[("172.31.5.77", "eipalloc-1"), ("172.31.5.78", "eipalloc-2")]);
        assert_eq!(free_secondary(&secondaries, &both, "eipalloc-3"), None, "none free: assign one");
        assert_eq!(free_secondary(&[], &BTreeMap::new(), "eipalloc-1"), None);
        // On the primary private IPv4 (associated by hand or by an older skyport): moved to a secondary.
        assert_eq!(free_secondary(&secondaries, &on_primary, "eipalloc-self").as_deref(), Some("172.31.5.77"));
    }
}
